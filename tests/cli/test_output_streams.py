"""Output that cannot be written (a full disk, a closed pipe, a narrow encoding): one line, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m zerocalc ARGS`` in a process of its own (real standard streams), this checkout first."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "zerocalc", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), stderr
    return lines[0]


# --------------------------------------------------------------------- output errors, encodings
MEMORY_7B = ["memory", "--params", "7B", "--gpus", "8"]


@pytest.mark.parametrize(
    "args", [MEMORY_7B, [*MEMORY_7B, "--json"], ["comm", "--params", "7B", "--gpus", "8"]]
)
def test_full_disk_is_one_line_and_exit_1(args: list[str]) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "zerocalc", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    assert result.returncode == 1
    assert "cannot write the output (No space left on device)" in _one_line(result.stderr)


@pytest.mark.parametrize(
    "args", [MEMORY_7B, ["memory", "--model", "gpt2"], ["comm", "--params", "7B", "-n", "8"]]
)
def test_closed_stdout_is_one_line_and_exit_1(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "zerocalc", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        pass_fds=(),
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 1
    assert "standard output is closed" in _one_line(result.stderr)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_json_in_a_narrow_encoding_is_escaped_not_a_traceback(encoding: str) -> None:
    result = _run([*MEMORY_7B, "--json"], PYTHONIOENCODING=encoding)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["assumptions"][0].startswith("Ψ = 7,000,000,000")  # the value itself, escaped as \u03a8


@pytest.mark.parametrize(
    ("args", "fallback"),
    [(MEMORY_7B, "Psi = 7,000,000,000"), (["comm", "--params", "7B", "-n", "8"], "alpha = 20.0 us")],
)
def test_tables_in_ascii_write_symbols_in_ascii(args: list[str], fallback: str) -> None:
    result = _run(args, PYTHONIOENCODING="ascii", COLUMNS="200")
    assert result.returncode == 0, result.stderr
    assert fallback in result.stdout and "Traceback" not in result.stderr
