"""`zerocalc memory` through Typer's test runner."""

from __future__ import annotations

import json

import pytest
from helpers import SMALL_PLAN, one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def test_table_shows_every_strategy_and_the_assumptions() -> None:
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "4"])
    assert result.exit_code == 0, result.output
    for label in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "HYBRID_SHARD"):
        assert label in result.stdout
    assert "Ψ = 7,000,000,000" in result.stdout
    assert "K = 12" in result.stdout
    assert "GiB" in result.stdout
    # DDP total: 16 bytes x 7e9 = 104.31 GiB; ZeRO-3 over 4 GPUs: 26.08 GiB
    assert "104.31" in result.stdout and "26.08" in result.stdout


def test_units_and_fits_column() -> None:
    result = runner.invoke(
        app,
        [
            "memory",
            "--params",
            "7B",
            "--gpus",
            "4",
            "--units",
            "GB",
            "--gpu-memory",
            "80GB",
            "-s",
            "ddp,zero3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "112.00" in result.stdout  # DDP: 16 x 7e9 bytes = 112 GB
    # the H100's measured 1,395,458,048 bytes outside the allocator come off the 80 GB: 78.60 GB for
    # states; ZeRO-3's 28 GB leave 50.60 GB, DDP's 112 GB are 33.40 GB over
    assert "28.00" in result.stdout and "Free of" in result.stdout and "78.60" in result.stdout
    assert "50.60" in result.stdout and "-33.40" in result.stdout
    exact = runner.invoke(
        app,
        [
            "memory",
            "-p",
            "7B",
            "-n",
            "4",
            "-u",
            "GB",
            "--gpu-memory",
            "80GB",
            "--reserve",
            "0",
            "-s",
            "zero3",
        ],
    )
    assert "52.00" in exact.stdout  # nothing held outside the allocator: 80 - 28


def test_json_is_the_pydantic_result_with_exact_bytes() -> None:
    result = runner.invoke(
        app, ["memory", "--params", "6_738_415_616", "--gpus", "8", "--json", "-s", "zero3"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema_version"] == 2
    row = data["strategies"][0]
    assert row["strategy"] == "zero3"
    psi = 6_738_415_616
    assert row["gpu_bytes"] == 16 * psi // 8
    assert data["bytes_per_parameter"] == {"b_p": 2, "b_g": 2, "k": 12.0, "grad_accum": 0}


def test_fsdp_names_are_aliases() -> None:
    result = runner.invoke(
        app, ["memory", "--params", "1B", "--gpus", "8", "--json", "-s", "full_shard,no_shard"]
    )
    assert [r["strategy"] for r in json.loads(result.stdout)["strategies"]] == ["zero3", "ddp"]


def test_offload_adds_host_columns() -> None:
    result = runner.invoke(
        app, ["memory", "--params", "7B", "--gpus", "8", "--offload-optimizer", "cpu", "-s", "zero3"]
    )
    assert result.exit_code == 0, result.output
    assert "CPU" in result.stdout and "/ node" in result.stdout and "→ cpu" in result.stdout
    # ZeRO-Offload: 12Ψ/N of optimizer states + 2Ψ/N fp16 gradients per GPU on the host = 11.41 GiB
    assert "11.41" in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7X"], "'7X'"),
        (["--params", "-1"], "'-1'"),
        (["--params", "7B", "--gpus", "0"], "--gpus '0'"),
        (["--params", "7B", "--gpus", "many"], "--gpus 'many'"),
        (["--params", "7B", "--strategy", "zero9"], "'zero9'"),
        (["--params", "7B", "--precision", "int4"], "'int4'"),
        (["--params", "7B", "--optimizer", "lion"], "'lion'"),
        (["--params", "7B", "--units", "parsecs"], "'parsecs'"),
        (["--params", "7B", "--offload-params", "cpu", "-s", "zero2"], "--offload-params cpu"),
        (["--params", "7B", "--offload-optimizer", "cpu", "-s", "ddp"], "--offload-optimizer cpu"),
        (["--params", "7B", "--gpus", "12", "--gpus-per-node", "8", "-s", "hybrid_shard"], "--gpus 12"),
        (["--params", "7B", "--no-such-option"], "--no-such-option"),
        (["--params", "7B", "--reduce-dtype", "fp8"], "--reduce-dtype 'fp8'"),
        (["--model", "gpt2", "--reduce-dtype", "fp16"], "accepted: fp32, bf16"),
        ([], "give --params or --model"),
    ],
)
def test_bad_input_is_one_line_on_stderr_with_exit_2(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["memory", *args]), fragment)


def test_deepspeed_and_megatron_account_for_params_alone() -> None:
    """Issue #15: DeepSpeed's ZeRO-2 estimator needs only Ψ: 2Ψ + 18Ψ/N = 14e9 + 31.5e9 = 45.5e9 bytes for
    7e9 on 4 GPUs, host 4Ψ × 4 GPUs × 1.5; ZeRO-3 needs the largest layer (an architecture); Megatron's
    distributed optimizer 6Ψ + 12Ψ/d."""
    result = runner.invoke(app, ["memory", "-p", "7B", "-n", "4", "--framework", "deepspeed", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    zero1, zero2 = data["framework_states"]  # stage 1 in the ZeRO-2 estimator's terms: 2Ψ + 2Ψ + 16Ψ/N
    terms = [line["bytes"] for line in zero1["lines"] if line["kind"] != "communication buffers"]
    assert terms == [14_000_000_000, 14_000_000_000, 28_000_000_000]
    assert zero1["framework_estimate_bytes"] is None  # DeepSpeed has no stage-1 estimator
    assert zero2["framework_estimate_bytes"] == 45_500_000_000
    assert zero2["host_bytes_per_node"] == 168_000_000_000
    assert any("ZeRO-3 / FULL_SHARD left out" in note and "largest layer" in note for note in data["notes"])
    zero3 = runner.invoke(app, ["memory", "-p", "7B", "-n", "4", "--framework", "deepspeed", "-s", "zero3"])
    assert zero3.exit_code == 2 and "needs the architecture" in zero3.stderr
    megatron = runner.invoke(app, ["memory", "-p", "7B", "-n", "8", "--framework", "megatron", "--json"])
    ddp, distopt = json.loads(megatron.stdout)["framework_states"]
    assert (ddp["gpu_bytes"], distopt["gpu_bytes"]) == (18 * 7 * 10**9, 6 * 7 * 10**9 + 12 * 7 * 10**9 // 8)
    fsdp2 = runner.invoke(app, ["memory", "-p", "7B", "--framework", "fsdp2"])
    assert fsdp2.exit_code == 2 and "--model NAME" in fsdp2.stderr


@pytest.mark.parametrize(
    ("args", "step"),
    [(["--framework", "deepspeed", "--strategy", "zero3", "--offload-optimizer", "cpu"],
      "CPU Adam (DeepSpeedCPUAdam)"),
     (["--framework", "deepspeed", "--strategy", "zero3"], "fused Adam"),
     (["--framework", "fsdp2"], "foreach Adam")],
)  # fmt: skip
def test_the_peak_heading_names_the_optimizer_step_that_runs(args: list[str], step: str) -> None:
    """DeepSpeed with its optimizer offloaded steps DeepSpeedCPUAdam on the host (runtime/engine.py
    _configure_basic_optimizer), not a fused GPU Adam."""
    base = ["memory", "--model", "llama-3-8b", "--gpus", "8", *args]
    result = runner.invoke(app, [*base, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["peak"]["options"]["optimizer_step"] == step
    text = runner.invoke(app, base, env={"COLUMNS": "200"}).stdout
    assert f"{step};" in text


@pytest.mark.parametrize(
    "args",
    [
        [
            "memory",
            "--model",
            "llama-3-8b",
            "--gpus",
            "8",
            "--framework",
            "deepspeed",
            "--strategy",
            "zero2,zero3",
        ],
        ["memory", "--params", "7B", "--gpus", "8"],
        ["comm", "--params", "7B", "--gpus", "16", "--tokens-per-step", "4M", "--tflops", "400"],
        SMALL_PLAN,
    ],
)
def test_no_printed_line_ends_in_spaces(args: list[str]) -> None:
    """Rich keeps the space where it wraps a footnote and pads cells it does not need to; the console
    trims every line's end, tables and footnotes alike (text otherwise unchanged)."""
    from zerocalc.render.display import result_html

    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    ending = [line for line in result.stdout.splitlines() if line != line.rstrip()]
    assert ending == []
    if args[0] == "memory" and "--params" in args:
        from zerocalc import estimate_memory

        html = result_html(estimate_memory("7B", gpus=8))
        assert " \n" not in html.replace("</span>", "")
