"""Peak memory: lines by hand, framework profiles, monotonicity, and the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zerocalc.api import estimate_peak
from zerocalc.cli import app
from zerocalc.errors import InputError
from zerocalc.peak.report import LineKind

runner = CliRunner()
PSI = 6_738_415_616  # Llama-2-7B
BLOCK = 202_383_360  # one Llama-2-7B layer: 4·4096² + 3·4096·11008 + 2·4096
ROOT = 2 * 32000 * 4096 + 4096  # embedding + LM head + final norm


def _line(row, name_start: str) -> int:
    return next(line.bytes for line in row.lines if line.name.startswith(name_start))


def test_zero3_buffers_by_hand() -> None:
    (row,) = estimate_peak("llama-2-7b", 8, strategies="zero3", prefetch=1).peak.strategies
    assert _line(row, "gathered blocks") == 2 * BLOCK * 2
    assert _line(row, "gathered root unit") == ROOT * 2
    assert _line(row, "unsharded gradients") == max(BLOCK, ROOT) * 2


def test_wrap_model_gathers_everything() -> None:
    peak = estimate_peak("llama-2-7b", 8, strategies="zero3", wrap="model").peak
    (row,) = peak.strategies
    assert row.total(LineKind.BUFFERS) == PSI * 4
    assert any("saves nothing" in note for note in peak.notes)


def test_peak_is_the_sum_of_its_lines_and_states_match_the_memory_model() -> None:
    report = estimate_peak("llama-3-8b", 16, 8, seq_len=4096, fragmentation=0.1, reserve="1GiB")
    memory, peak = report, report.peak
    for row in peak.strategies:
        assert row.peak_bytes == sum(line.bytes for line in row.lines)
        assert row.total(LineKind.STATES) == memory.row(row.strategy).gpu_bytes
        assert row.total(LineKind.OVERHEAD) == 2**30
        allocated = row.peak_bytes - row.total(LineKind.OVERHEAD) - row.total(LineKind.FRAGMENTATION)
        assert row.total(LineKind.FRAGMENTATION) == round(0.1 * allocated)
        assert row.total(LineKind.ACTIVATIONS) == peak.activations.total_bytes  # never sharded


def test_zero_ordering_of_peaks() -> None:
    peak = estimate_peak(
        "llama-2-7b", 64, 8, strategies="ddp,zero1,zero2,zero3", reduce_bucket=0, allgather_bucket=0
    ).peak
    by = {row.strategy.value: row.peak_bytes for row in peak.strategies}
    assert by["zero3"] < by["zero2"] < by["zero1"] < by["ddp"]


@pytest.mark.parametrize("field", ["seq_len", "micro_batch"])
def test_peak_grows_with_micro_batch_and_sequence(field: str) -> None:
    small = estimate_peak("mistral-7b", 8, **{field: 1024 if field == "seq_len" else 1}).peak
    large = estimate_peak("mistral-7b", 8, **{field: 4096 if field == "seq_len" else 4}).peak
    for a, b in zip(small.strategies, large.strategies, strict=True):
        assert b.peak_bytes > a.peak_bytes


def test_recompute_lowers_the_peak() -> None:
    peaks = [
        estimate_peak("gpt2-xl", 8, recompute=r, seq_len=1024).peak.strategies[0].peak_bytes
        for r in ("full", "selective", "none")
    ]
    assert peaks[0] < peaks[1] < peaks[2]


def test_deepspeed_profile_reproduces_its_estimators_and_marks_what_they_leave_out() -> None:
    """Llama-2-7B on 2 nodes × 8 GPUs, by hand from DeepSpeed 0.19.8's formulas (stage_1_and_2.py,
    stage3.py): ZeRO-2 2Ψ + int(18Ψ/16); ZeRO-3 int(18Ψ/16) + 4 × largest layer (the 32000 × 4096
    embedding), host 4 × largest layer × 8 GPUs per node × 1.5 (zero_init)."""
    peak = estimate_peak("llama-2-7b", 16, 8, framework="deepspeed", strategies="zero2,zero3").peak
    z2, z3 = peak.strategies
    assert z2.framework_estimate_bytes == 21_057_548_800  # 13,476,831,232 + 7,580,717,568
    assert z3.framework_estimate_bytes == 8_105_005_568  # 7,580,717,568 + 524,288,000
    assert z3.host_bytes_per_node == 6_291_456_000
    outside = {line.kind for line in z3.lines if not line.in_framework_estimate}
    assert outside == {LineKind.ACTIVATIONS, LineKind.OVERHEAD, LineKind.FRAGMENTATION}


def test_megatron_distributed_optimizer_is_6_plus_12_over_d() -> None:
    peak = estimate_peak("llama-2-7b", 8, framework="megatron", strategies="ddp,zero1").peak
    ddp, distopt = peak.strategies
    assert ddp.total(LineKind.STATES) == 18 * PSI
    assert distopt.total(LineKind.STATES) == 6 * PSI + 12 * PSI // 8


def test_gpu_preset_fits_against_the_whole_gpu_with_the_reserve_as_a_line() -> None:
    peak = estimate_peak("llama-2-7b", 8, gpu="h100-80gb", strategies="zero3").peak
    (row,) = peak.strategies
    assert peak.options.gpu_memory_bytes == 81559 * 2**20
    assert row.total(LineKind.OVERHEAD) == 2 * 2**30
    assert row.headroom_bytes == 81559 * 2**20 - row.peak_bytes


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"recompute": "sometimes"}, "recompute 'sometimes'"),
        ({"wrap": "layer"}, "wrap 'layer'"),
        ({"framework": "colossal"}, "framework 'colossal'"),
        ({"seq_len": 0}, "seq_len 0"),
        ({"fragmentation": 2.0}, "fragmentation 2.0"),
        ({"framework": "megatron", "strategies": "zero3"}, "zero3 is not one of them"),
        ({"framework": "deepspeed", "precision": "fp32"}, "mixed-precision Adam"),
    ],
)
def test_bad_peak_input(kwargs: dict, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        estimate_peak("llama-2-7b", 8, **kwargs)
    assert fragment in str(info.value)


def test_cli_peak_table_and_json() -> None:
    args = ["memory", "--model", "llama-3-8b", "--gpus", "8", "--micro-batch", "2", "--seq-len", "8192"]
    table = runner.invoke(app, [*args, "--recompute", "selective", "--gpu", "h100-80gb"])
    assert table.exit_code == 0, table.output
    for text in ("Activations", "Buffers", "CUDA+NCCL", "Fragmentation", "Peak", "Fits:", "Korthikanti"):
        assert text in table.stdout
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert data["peak"]["strategies"][0]["peak_bytes"] > data["strategies"][0]["gpu_bytes"]
    assert data["peak"]["flash_attention"] is True  # Llama family default


def test_cli_params_only_says_activations_need_a_model() -> None:
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "8"])
    assert result.exit_code == 0 and "need --model" in result.stdout


def test_cli_bad_peak_option_is_one_line() -> None:
    result = runner.invoke(app, ["memory", "--model", "gpt2", "--recompute", "half"])
    assert (
        result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1 and "'half'" in result.stderr
    )
