"""The fsdp, fsdp2 and torch-zero1 profiles of the peak: exact states by hand, buffers, ordering, CLI."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zerocalc.api import estimate_peak
from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.peak.kinds import TensorKind

runner = CliRunner()
PSI = 6_738_415_616  # Llama-2-7B
BLOCK = 202_383_360  # one Llama-2-7B layer: 4·4096² + 3·4096·11008 + 2·4096
ROOT = 2 * 32000 * 4096 + 4096  # embedding + LM head + final norm
GPT2_BLOCK = 7_087_872  # 768·2304+2304 + 768·768+768 + 2·(2·768) + 768·3072+3072 + 3072·768+768
GPT2_ROOT = 50257 * 768 + 1024 * 768 + 2 * 768  # wte (tied head) + wpe + ln_f


def _line(row, name_start: str) -> int:
    return next(line.bytes for line in row.states if line.name.startswith(name_start))


def _rows(model: str, gpus: int, framework: str, **kwargs):
    peak = estimate_peak(model, gpus, framework=framework, **kwargs).peak
    return {row.strategy.value: row for row in peak.strategies}


def test_fsdp_full_shard_llama2_7b_by_hand() -> None:
    row = _rows("llama-2-7b", 8, "fsdp", strategies="zero3")["zero3"]
    assert row.title == "FSDP FULL_SHARD"
    local = (32 * BLOCK + ROOT) // 8  # both divide by 8: no padding
    assert local == PSI // 8
    assert _line(row, "parameters (fp32 master)") == 4 * local
    assert _line(row, "gradients (fp32)") == 4 * local
    assert _line(row, "optimizer states") == 8 * local
    fused = _rows("llama-2-7b", 8, "fsdp", strategies="zero3", optimizer_impl="fused")["zero3"]
    assert _line(fused, "Adam step counters") == 33 * 4  # one per flat parameter: 32 blocks + root
    # at layer 31's reduction: the root (kept unsharded after forward) and layers 31 and 30 (prefetched)
    # gathered in bf16, and layer 31's flat gradient cast to the fp32 reduce dtype
    fp32_reduce = _rows("llama-2-7b", 8, "fsdp", strategies="zero3", reduce_dtype="fp32")["zero3"]
    assert fp32_reduce.peak_event == "reduce 31 (cast)"
    assert fp32_reduce.term(TensorKind.GATHERED) == 2 * ROOT + 2 * 2 * BLOCK


def test_fsdp_flat_parameters_are_padded_to_the_world_size() -> None:
    """GPT-2 on 5 ranks: 7,087,872 / 5 and 39,385,344 / 5 both leave a remainder."""
    row = _rows("gpt2", 5, "fsdp", strategies="zero3", precision="fp32")["zero3"]
    local = 12 * -(-GPT2_BLOCK // 5) + -(-GPT2_ROOT // 5)
    assert local == 24_887_969  # vs Ψ/5 = 24,887,961.6
    assert _line(row, "parameters (fp32 master)") == 4 * local


def test_fsdp_shard_grad_op_keeps_every_unit_after_forward() -> None:
    """SHARD_GRAD_OP at the loss's backward: every unit still unsharded in bf16 (2Ψ, divisible by 8)."""
    row = _rows("llama-2-7b", 8, "fsdp", strategies="shard_grad_op")["shard_grad_op"]
    assert row.peak_event == "loss backward (log_softmax_backward)"
    assert row.term(TensorKind.GATHERED) == PSI * 2


def test_fsdp_no_shard_in_fp32_has_no_copies() -> None:
    """NO_SHARD in fp32 uses the flat parameters in place: nothing gathered at any point."""
    row = _rows("llama-2-7b", 8, "fsdp", strategies="ddp", precision="fp32")["ddp"]
    assert row.term(TensorKind.GATHERED) == 0
    assert sum(line.bytes for line in row.states) == 16 * PSI


def test_fsdp2_uses_the_largest_rank_and_padded_dim0_units() -> None:
    """GPT-2 on 5 ranks: rank 0 holds ceil(d0/5) rows of every tensor. wte 10052 × 768 = 7,719,936,
    wpe 205 × 768 = 157,440, final norm 2 × 154; per block ln 2 × 154 twice, q/k/v/o 154 × 768 + 154 each,
    fc_in 615 × 768 + 615, fc_out 154 × 3072 + 154: 1,420,497, × 12 = 17,045,964. The root gathered: rows
    padded to 5·ceil(d0/5): (50260 + 1025) × 768 + 2 × 770 = 39,388,420 bf16 elements."""
    row = _rows("gpt2", 5, "fsdp2", strategies="zero3")["zero3"]
    assert _line(row, "parameters (fp32 master)") == 4 * 24_923_648  # 7,719,936 + 157,440 + 308 + 17,045,964
    # at the loss's backward only the root is unsharded: wte 50260 × 768 and wpe 1025 × 768 in bf16
    # (multiples of 512 B), ln_f's weight and bias (770 × 2 B, each rounded up to 2048 B)
    assert row.peak_event == "loss backward (log_softmax_backward)"
    assert row.term(TensorKind.GATHERED) == 2 * 50260 * 768 + 2 * 1025 * 768 + 2 * 2048 == 78_777_856


def test_torch_zero1_greedy_partition_by_hand() -> None:
    """Llama-2-7B on 2 ranks: embed → rank 0, head → rank 1, then 96 MLP and 128 attention matrices
    alternate, and the 65 RMSNorm weights alternate starting with rank 0 (33 to rank 0)."""
    rows = _rows("llama-2-7b", 2, "torch-zero1")
    zero1 = rows["zero1"]
    owned = 131_072_000 + 48 * 4096 * 11008 + 64 * 4096 * 4096 + 33 * 4096
    assert owned == 3_369_209_856
    assert _line(zero1, "optimizer states") == 8 * owned
    assert _line(zero1, "parameters (fp32 master)") == 4 * PSI
    # gradient_as_bucket_view=False: DDP's buckets are a second copy of every fp32 gradient; the peak is
    # foreach's sqrt of the owned states
    assert zero1.peak_phase.value == "optimizer"
    assert zero1.term(TensorKind.REDUCTION) == 4 * PSI
    assert zero1.term(TensorKind.OPTIMIZER_TEMPORARIES) == 4 * owned
    assert _line(rows["ddp"], "optimizer states") == 8 * PSI
    fused = _rows("llama-2-7b", 2, "torch-zero1", strategies="zero1", optimizer_impl="fused")["zero1"]
    assert _line(fused, "Adam step counters") == (1 + 48 + 64 + 33) * 4


@pytest.mark.parametrize("model", ["gpt2", "llama-2-7b", "qwen2.5-7b", "mistral-7b"])
@pytest.mark.parametrize("gpus", [2, 8, 24])
def test_fsdp_ordering_full_shard_le_shard_grad_op_le_no_shard(model: str, gpus: int) -> None:
    """Resharding holds less: the allocated peaks are ordered (what the caching allocator reserves on top
    follows the order of the requests, and can invert a close pair: GPT-2 on 2 GPUs, FSDP1)."""
    rows = _rows(model, gpus, "fsdp", strategies="ddp,shard_grad_op,zero3")
    peak = {name: row.allocated_peak_bytes for name, row in rows.items()}
    assert peak["zero3"] <= peak["shard_grad_op"] <= peak["ddp"]
    fsdp2 = _rows(model, gpus, "fsdp2")
    assert fsdp2["zero3"].allocated_peak_bytes <= fsdp2["shard_grad_op"].allocated_peak_bytes


def test_default_strategies_are_the_profiles() -> None:
    assert list(_rows("gpt2", 16, "fsdp")) == [
        "ddp",
        "shard_grad_op",
        "zero3",
        "hybrid_shard",
    ]
    assert list(_rows("gpt2", 4, "torch-zero1")) == ["ddp", "zero1"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"framework": "fsdp", "strategies": "zero2"}, "accepted: strategies ddp, shard_grad_op"),
        ({"framework": "fsdp2", "offload_optimizer": "cpu", "strategies": "zero3"}, "does not model offload"),
        ({"framework": "fsdp", "optimizer": "sgd"}, "Adam/AdamW"),
        ({"framework": "torch-zero1", "precision": "bf16-pure"}, "accepted: precision fp32, bf16-mixed"),
        ({"framework": "fsdp2", "wrap": "model"}, "wrap model is not accepted"),
    ],
)
def test_bad_torch_profile_input(kwargs: dict, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        estimate_peak("gpt2", 8, **kwargs)
    assert fragment in str(info.value)


def test_moe_is_modelled_by_the_torch_profiles() -> None:
    """Mixtral-8x7B under FSDP1 FULL_SHARD on 8 GPUs: 46,702,792,704 parameters, every unit's flat
    parameter divisible by 8, so each rank holds Ψ/8 fp32 elements."""
    row = _rows("mixtral-8x7b", 8, "fsdp", strategies="zero3")["zero3"]
    assert _line(row, "parameters (fp32 master)") == 4 * 46_702_792_704 // 8


def test_cli_fsdp2_table() -> None:
    result = runner.invoke(
        app, ["memory", "--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2", "--gpu", "h100-80gb"]
    )
    assert result.exit_code == 0, result.output
    assert "FSDP2 reshard" in result.stdout and "reshard_after_forward=True" in result.stdout
    assert "torch 2.13 FSDP2" in result.stdout
    bad = runner.invoke(app, ["memory", "--model", "gpt2", "--framework", "fsdp", "-s", "zero1"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_reduce_dtype_fp32_adds_the_cast_copy_of_the_reduced_gradients() -> None:
    """FSDP MixedPrecision(reduce_dtype=fp32) and DeepSpeed communication_data_type fp32: the bf16
    gradients and their fp32 copy are both alive at the reduction."""
    fsdp = _rows("llama-2-7b", 8, "fsdp", strategies="zero3", reduce_dtype="fp32")["zero3"]
    # at layer 31's cast: its bf16 flat gradient and the fp32 copy (the block divides by 8: no padding)
    assert fsdp.peak_event == "reduce 31 (cast)"
    assert fsdp.term(TensorKind.REDUCTION) == 4 * BLOCK
    paper = _rows("llama-2-7b", 8, "paper", strategies="zero2", reduce_dtype="fp32")
    assert _line(paper["zero2"], "reduce bucket") == 500_000_000 * (2 + 4)
    with pytest.raises(InputError, match="reduce_dtype 'fp16'"):
        estimate_peak("gpt2", 8, reduce_dtype="fp16")
