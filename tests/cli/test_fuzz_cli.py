"""Random strings and numbers for every option of every command: exit 0 with output, or exit 2 with
exactly one line on stderr, never a traceback, and no file written when it fails (hypothesis)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import ROOT, one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerocalc.cli import app, load_commands

runner = CliRunner()

NUMBERS = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        ["0", "-1", "1e400", "1e-400", "nan", "inf", "10**9", "7B", "1e30T", "80", "80GiB", "2.5"]
    ),
)
TEXT = st.one_of(st.text(max_size=12), NUMBERS, st.sampled_from(["", " ", "all", "all,zero1", "{gpus}", "é"]))


def _options(command_name: str) -> list[tuple[str, bool]]:
    """(flag, is_boolean_flag) of every option of a command (``validate fake``: a group's), from the
    command itself."""
    click_app = load_commands()
    from typer.main import get_command

    command = get_command(click_app)
    for word in command_name.split():
        command = command.commands[word]  # type: ignore[attr-defined]
    flags = []
    for param in command.params:
        if param.param_type_name != "option" or param.name in ("help", "json", "out", "html"):  # html: a file
            continue
        flags.append((param.opts[0], bool(getattr(param, "is_flag", False))))
    return flags


BASE = {
    "memory": ["memory", "--params", "1B", "--gpus", "8"],
    "comm": ["comm", "--params", "1B", "--gpus", "8"],
}


def _draw_args(
    data: st.DataObject, command: str, base: list[str], max_size: int = 4, skip: tuple[str, ...] = ()
) -> list[str]:
    """``base`` and 1 to ``max_size`` of the command's options (not those in ``skip``), each with a random
    value (a flag alone)."""
    options = [(flag, boolean) for flag, boolean in _options(command) if flag not in skip]
    chosen = data.draw(st.lists(st.sampled_from(options), min_size=1, max_size=max_size, unique=True))
    args = list(base)
    for flag, boolean in chosen:
        args += [flag] if boolean else [flag, data.draw(TEXT)]
    return args


def _run_and_check(args: list[str], tmp: Path) -> None:
    """Invoke ``args``: accepted (or, where the run is replaced, :class:`Reached`) or refused in one line,
    and nothing written in ``tmp`` unless it ran."""
    before = set(os.listdir(tmp))
    result = runner.invoke(app, args)
    if isinstance(result.exception, Reached):
        assert set(os.listdir(tmp)) == before
        return
    _check(result, tmp, before)


def _check(result, tmp: Path, before: set[str]) -> None:
    assert "Traceback" not in result.output, result.output
    if result.exit_code == 0:
        assert result.stdout.strip()
        return
    one_line_error(result)
    assert set(os.listdir(tmp)) == before  # nothing written on failure


@pytest.mark.parametrize("command", sorted(BASE))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_option_of_memory_and_comm(command: str, data: st.DataObject, tmp_path: Path) -> None:
    _run_and_check(_draw_args(data, command, BASE[command]), tmp_path)


PLAN_BASE = ["plan", "--model", "gpt2", "--gpu", "h100-80gb", "--gpus", "2", "--global-batch", "8seq",
             "--seq-len", "256", "--framework", "fsdp2"]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_option_of_plan(data: st.DataObject, tmp_path: Path) -> None:
    """Each option of plan fuzzed on a small space (a later flag overrides the base's)."""
    _run_and_check(_draw_args(data, "plan", PLAN_BASE, max_size=3), tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=TEXT, name=TEXT, gpus=TEXT)
def test_presets_and_check_arguments(kind: str, name: str, gpus: str, tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    for args in (
        ["presets", "list", kind],
        ["presets", "show", name, "--gpus", gpus],
        ["check", str(tmp_path / (name.replace("/", "") or "x"))],
    ):
        result = runner.invoke(app, args)
        if result.exit_code == 1 and args[0] == "check":  # a real folder with a changed scenario
            continue
        _check(result, tmp_path, before)


class Reached(Exception):
    """The options were all accepted: the command got as far as starting its ranks (not run here)."""


def _never_measure(*args: object, **kwargs: object) -> None:
    raise Reached


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_option_of_bench(data: st.DataObject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bench option, random values: refused in one line before any rank starts, or accepted (the
    measurement itself is replaced, so no process is spawned)."""
    import zerocalc.cli.bench as bench_cli

    monkeypatch.setattr(bench_cli, "_measure", _never_measure)
    _run_and_check(_draw_args(data, "bench", ["bench", "--out", str(tmp_path / "cal.json")]), tmp_path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_option_of_memory_with_a_model(data: st.DataObject, tmp_path: Path) -> None:
    """The peak path too: GPT-2 (a small timeline), random values for every option."""
    base = ["memory", "--model", "gpt2", "--gpus", "2"]
    _run_and_check(
        _draw_args(data, "memory", base, max_size=3, skip=("--params", "--model", "--gpus")), tmp_path
    )


VALIDATE_SUBCOMMANDS = st.sampled_from(
    [["frameworks"], ["tp"], ["activations"], ["cuda"], ["fake"], ["pipeline"], ["pipeline", "--fake"],
     ["expert"]]
)  # fmt: skip


@settings(max_examples=160, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), subcommand=VALIDATE_SUBCOMMANDS)
def test_every_option_of_each_validate_subcommand(
    data: st.DataObject, subcommand: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every option of each validate subcommand (and of pipeline's --fake run), random values: refused in
    one line before anything runs, or accepted (the runs themselves are replaced: no process is spawned
    and no model built)."""
    from zerocalc.validate import expert, fake_step, pipeline_run, run, saved_measure

    monkeypatch.setattr(run, "run_all", _never_measure)
    for module, name in (
        (saved_measure, "run_cases"),
        (fake_step, "run_cases"),
        (pipeline_run, "run_pipeline"),
        (pipeline_run, "run_fake_pipeline"),
        (expert, "run_expert"),
    ):
        monkeypatch.setattr(module, name, _never_measure)
    command = f"validate {subcommand[0]}"
    _run_and_check(_draw_args(data, command, ["validate", *subcommand]), tmp_path)


COLUMNS = st.one_of(st.integers(-5, 400).map(str), st.sampled_from(["", " ", "abc", "80x", "1e3"]))
ENVIRONMENT = st.fixed_dictionaries(
    {
        "COLUMNS": COLUMNS,
        "NO_COLOR": st.sampled_from(["", "1"]),
        "TERM": st.sampled_from(["", "dumb", "xterm-256color", "vt100", "linux"]),
    }
)


@pytest.mark.parametrize("command", sorted(BASE))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), environment=ENVIRONMENT)
def test_every_option_under_any_terminal_settings(
    command: str, data: st.DataObject, environment: dict[str, str], tmp_path: Path
) -> None:
    """COLUMNS (0, negative, huge, text), NO_COLOR and TERM with random options: the same contract, and an
    accepted run prints every number whole (no '…') in lines no wider than its width (80 below 60)."""
    args = _draw_args(data, command, BASE[command], max_size=2)
    before = set(os.listdir(tmp_path))
    result = runner.invoke(app, args, env=environment)
    _check(result, tmp_path, before)
    if result.exit_code == 0:
        columns = environment["COLUMNS"].strip()
        width = int(columns) if columns.isdigit() and int(columns) >= 60 else 80
        assert "…" not in result.stdout, result.stdout
        assert max(len(line) for line in result.stdout.splitlines()) <= width, result.stdout


RUNS = st.sampled_from(
    [
        ["memory", "--params", "7B", "--gpus", "8"],
        ["memory", "--params", "7B", "--gpus", "8", "--json"],
        ["memory", "--model", "gpt2", "--gpus", "2"],
        ["comm", "--params", "7B", "--gpus", "16", "--gpu", "h100-80gb"],
        ["comm", "--params", "7B", "--gpus", "16", "--json"],
        ["presets", "list"],
        ["memory", "--help"],
        ["memory", "--params", "nonsense"],
    ]
)
SINKS = st.sampled_from(["pipe", "/dev/full", "closed"])
ENCODINGS = st.sampled_from(["utf-8", "ascii", "latin-1", "cp1252"])


@settings(max_examples=20, deadline=None)
@given(args=RUNS, sink=SINKS, encoding=ENCODINGS, environment=ENVIRONMENT)
def test_output_errors_and_encodings(
    args: list[str], sink: str, encoding: str, environment: dict[str, str]
) -> None:
    """A real process (its own standard streams): any PYTHONIOENCODING, stdout a pipe, a full disk or
    closed. Written: exit 0 (2 for bad input); a full disk: exit 1 and one line; closed: exit 1 and one
    line; never a traceback."""
    import subprocess
    import sys

    env = {**os.environ, **environment, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": encoding}
    bad_input = args[-1] == "nonsense"
    with open(os.devnull if sink != "/dev/full" else "/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "zerocalc", *args],
            stdout=subprocess.PIPE if sink == "pipe" else full,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
            preexec_fn=(lambda: os.close(1)) if sink == "closed" else None,
        )
    stderr = result.stderr.decode(encoding, errors="replace")
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    if sink == "closed":
        assert result.returncode == 1 and lines == [
            "zerocalc: error: standard output is closed; accepted: a terminal, file or pipe to write to"
        ]
    elif bad_input:
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("zerocalc: error: ")
    elif sink == "/dev/full":
        assert result.returncode == 1
        assert lines == ["zerocalc: error: cannot write the output (No space left on device)"]
    else:
        assert result.returncode == 0 and stderr == "", stderr
        text = result.stdout.decode(encoding)  # what was written is in the encoding asked for
        if "--json" in args:
            import json

            json.loads(text)
