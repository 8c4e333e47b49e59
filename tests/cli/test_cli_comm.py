"""`zerocalc comm` through Typer's test runner."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def test_table_and_summary() -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "64", "--gpus-per-node", "8"])
    assert result.exit_code == 0, result.output
    for text in (
        "AR bwd",
        "RS bwd",
        "AG fwd",
        "AG step",
        "AG all_gather, RS reduce_scatter",  # the legend
        "HYBRID_SHARD",
        "1.50×",
        "world 64*",  # a group spanning nodes
        "across 8*",
        "default",
        "ZeRO paper §7",
    ):
        assert text in result.stdout


def _rendered(args: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``zerocalc comm ARGS`` as an 80-column terminal shows it."""
    from rich.console import Console

    import zerocalc.cli.comm as comm_cli

    narrow = Console(width=80, record=True, highlight=False)
    monkeypatch.setattr(comm_cli, "console", lambda: narrow)
    result = runner.invoke(app, ["comm", *args])
    assert result.exit_code == 0, result.output
    return narrow.export_text().splitlines()


@pytest.mark.parametrize(
    "args",
    [
        ["--params", "405B", "--gpus", "1048576", "-u", "B", "--tokens-per-step", "4M", "--tflops", "400"],
        ["--model", "llama-2-7b", "--gpus", "32", "-g", "8", "--framework", "deepspeed", "--zeropp", "all"],
        ["--model", "gpt2-xl", "--gpus", "4", "--framework", "torch-zero1", "--per-unit", "-u", "B"],
        ["--model", "llama-3-8b", "--gpus", "16", "--framework", "fsdp2", "-A", "4", "--grad-sync", "last"],
    ],
)
def test_tables_fit_80_columns_and_never_cut_a_number(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _rendered(args, monkeypatch)
    assert any(line.startswith("collective") for line in lines)
    for line in lines:
        assert len(line) <= 80 and "…" not in line, line
    if "B" in args:  # every byte count whole, even 16 digits of them
        words = {word for line in lines for word in line.split()}
        estimate = json.loads(runner.invoke(app, ["comm", *args, "--json"]).stdout)
        for row in estimate["strategies"]:
            assert f"{row['total_bytes_per_gpu']:,}" in words


def test_per_unit_rows_name_fsdp_units_and_ddp_buckets() -> None:
    result = runner.invoke(
        app,
        ["comm", "--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp", "-s", "zero3", "--per-unit"],
    )
    assert result.exit_code == 0, result.output
    for unit in ("layers.0", "layers.31", "root"):
        assert unit in result.stdout
    result = runner.invoke(
        app, ["comm", "--params", "1231053", "--gpus", "2", "--framework", "ddp", "--per-unit"]
    )
    assert "bucket 1" in result.stdout and "bucket 2" in result.stdout


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
        (
            ["--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2", "--offload-optimizer", "cpu"],
            "--framework fsdp2 does not model offload",
        ),
        (
            ["--params", "7B", "--gpus", "8", "--strategy", "zero1", "--offload-params", "cpu"],
            "--offload-params cpu",
        ),
    ],
)
def test_bad_input_is_one_line(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["comm", *args]), fragment)


def test_an_offloaded_optimizer_is_paid_in_the_step_and_not_on_the_gpu() -> None:
    """ZeRO-2 under DeepSpeed with the optimizer on the host: the step adds the offload (ZeRO-Offload: 2 + 2
    bytes per owned parameter over PCIe at 25 GB/s, CPU Adam's 30 bytes per owned parameter of the node's
    8 GPUs over 100 GB/s of host memory) and runs no optimizer step on the GPU; the collectives are the
    same as without offload."""
    args = ["comm", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--framework", "deepspeed",
            "--strategy", "zero2", "--json"]  # fmt: skip
    plain = json.loads(runner.invoke(app, args).stdout)["strategies"][0]
    offloaded = json.loads(runner.invoke(app, [*args, "--offload-optimizer", "cpu"]).stdout)["strategies"][0]
    owned = 8_030_261_248 / 8
    by_hand = owned * (2 + 2) / 25e9 + owned * 8 * 30 / 100e9
    assert offloaded["step"]["offload_s"] == pytest.approx(by_hand) and plain["step"]["offload_s"] == 0
    assert offloaded["step"]["optimizer_s"] == 0 < plain["step"]["optimizer_s"]
    assert offloaded["collectives"] == plain["collectives"]
    assert offloaded["step"]["step_s"] == pytest.approx(
        plain["step"]["step_s"] - plain["step"]["optimizer_s"] + by_hand
    )


def test_an_exposed_time_of_nothing_is_printed_with_its_unit() -> None:
    """7B over 8 GPUs with 55 s of compute a step hides every collective: the exposed column says ``0 s``,
    a time like the column beside it, not a bare ``0``."""
    args = ["comm", "--params", "7B", "--gpus", "8", "--tokens-per-step", "4M", "--tflops", "400"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("ddp ")]
    assert row.split()[-3:] == ["ms", "0", "s"]
