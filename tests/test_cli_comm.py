"""`zerocalc comm` through Typer's test runner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def test_table_and_summary() -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "64", "--gpus-per-node", "8"])
    assert result.exit_code == 0, result.output
    for text in (
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "HYBRID_SHARD",
        "1.50×",
        "spans nodes",
        "default",
    ):
        assert text in result.stdout


def test_single_gpu_says_there_is_no_communication() -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "1"])
    assert result.exit_code == 0 and "No communication" in result.stdout


def test_json_has_exact_bytes_per_collective() -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "8", "-s", "zero3", "--json"])
    data = json.loads(result.stdout)
    row = data["strategies"][0]
    assert [c["op"] for c in row["collectives"]] == ["all_gather", "all_gather", "reduce_scatter"]
    assert row["total_bytes_per_gpu"] == 3 * 7 * 14 * 10**9 // 8
    assert row["ratio_to_ddp"] == 1.5


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7B", "--gpus", "8", "--grad-accum", "0"], "--grad-accum '0'"),
        (["--params", "7B", "--gpus", "8", "--inter-node-bw", "fast"], "'fast'"),
        (["--params", "7B", "--gpus", "8", "--calibration", "/no/such/file.json"], "/no/such/file.json"),
        (["--params", "7B", "--gpus", "8", "--tflops", "400"], "--tokens-per-step"),
        (["--params", "7Q"], "'7Q'"),
    ],
)
def test_bad_input_is_one_line(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["comm", *args])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]
