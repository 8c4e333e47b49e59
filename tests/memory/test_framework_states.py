"""The exact per-rank predictions of the real frameworks (pure: no torch)."""

from __future__ import annotations

import pytest
from helpers import shrunk
from hypothesis import given
from hypothesis import strategies as st

from zerocalc.base.errors import InputError
from zerocalc.model.architecture import ParamTensor, count_parameters, parameter_tensors
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchSetup, TorchWrapper
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.request.presets import load_model
from zerocalc.states.framework import (
    dim0_rows,
    fsdp1_shard_numel,
    fsdp_units,
    predict_all_ranks,
    predict_rank_states,
    zero1_partition,
)

DDP = TorchSetup(wrapper=TorchWrapper.DDP, shard_group=None)
ZERO1 = TorchSetup(wrapper=TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER)
FSDP2 = TorchSetup(wrapper=TorchWrapper.FSDP2)
FSDP2_KEEP = TorchSetup(wrapper=TorchWrapper.FSDP2, reshard_after_forward=False)


def fsdp1(sharding: Fsdp1Sharding) -> TorchSetup:
    return TorchSetup(wrapper=TorchWrapper.FSDP1, sharding=sharding)


FP32, BF16 = PrecisionName.FP32, PrecisionName.BF16_MIXED


ODD = dict(num_layers=2, hidden_size=63, num_heads=3, intermediate_size=252, vocab_size=1001)


def test_units_are_one_per_block_plus_the_root() -> None:
    arch = shrunk("gpt2", ODD)
    units = fsdp_units(arch)
    assert [name for name, _ in units] == ["layers.0", "layers.1", "root"]
    assert [t.module for t in units[-1][1]] == ["embed_tokens", "embed_positions", "final_norm", "final_norm"]
    assert sum(t.numel for _, u in units for t in u) == count_parameters(arch).total


def test_zero1_partition_is_the_greedy_largest_first_one() -> None:
    tensors = [ParamTensor(module=f"m{i}", name="w", shape=(n,)) for i, n in enumerate([5, 9, 9, 3, 1])]
    ranks = zero1_partition(tensors, 2)
    # sorted: 9 (m1), 9 (m2), 5, 3, 1 → r0 9, r1 9, r0 +5 = 14, r1 +3 = 12, r1 +1 = 13
    assert [[t.module for t in r] for r in ranks] == [["m1", "m0"], ["m2", "m3", "m4"]]


@given(rows=st.integers(1, 5000), world=st.integers(1, 16))
def test_dim0_rows_are_torch_chunk(rows: int, world: int) -> None:
    got = [dim0_rows(rows, world, r) for r in range(world)]
    chunk = -(-rows // world)
    assert sum(got) == rows
    assert all(0 <= g <= chunk for g in got)
    assert got == sorted(got, reverse=True)


def test_fsdp1_pads_each_flat_parameter_to_a_multiple_of_the_world() -> None:
    assert fsdp1_shard_numel(10, 4, Fsdp1Sharding.FULL_SHARD) == 3
    assert fsdp1_shard_numel(10, 4, Fsdp1Sharding.NO_SHARD) == 10


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("precision", [FP32, BF16])
def test_totals_over_ranks(world: int, precision: PrecisionName) -> None:
    arch = shrunk("llama-2-7b", ODD, num_kv_heads=1)
    total = count_parameters(arch).total
    n_tensors = len(parameter_tensors(arch))
    ddp = predict_all_ranks(arch, DDP, world, precision)
    assert all(r.params.bytes == 4 * total and r.optimizer_states.bytes == 8 * total for r in ddp)
    zero1 = predict_all_ranks(arch, ZERO1, world, precision)
    assert sum(r.optimizer_states.bytes for r in zero1) == 8 * total
    assert sum(r.step.bytes for r in zero1) == 4 * n_tensors
    fsdp2 = predict_all_ranks(arch, FSDP2, world, precision)
    assert sum(r.params.bytes for r in fsdp2) == 4 * total
    assert sum(r.grads.bytes for r in fsdp2) == 4 * total
    full = predict_all_ranks(arch, fsdp1(Fsdp1Sharding.FULL_SHARD), world, precision)
    padded = sum(-(-sum(t.numel for t in u) // world) * world for _, u in fsdp_units(arch))
    assert sum(r.params.bytes for r in full) == 4 * padded
    assert 0 <= padded - total < world * len(fsdp_units(arch))


def test_what_stays_unsharded_after_forward() -> None:
    arch = shrunk("gpt2", ODD)
    units = fsdp_units(arch)
    per = [-(-sum(t.numel for t in u) // 2) * 2 for _, u in units]
    fs = predict_rank_states(arch, fsdp1(Fsdp1Sharding.FULL_SHARD), 2, 0, BF16)
    sgo = predict_rank_states(arch, fsdp1(Fsdp1Sharding.SHARD_GRAD_OP), 2, 0, BF16)
    ns = predict_rank_states(arch, fsdp1(Fsdp1Sharding.NO_SHARD), 2, 0, BF16)
    assert fs.unsharded_after_forward.bytes == 2 * per[-1]
    assert sgo.unsharded_after_forward.bytes == 2 * sum(per)
    assert ns.unsharded_after_forward.bytes == 0
    f2 = predict_rank_states(arch, FSDP2, 2, 1, FP32)
    f2_keep = predict_rank_states(arch, FSDP2_KEEP, 2, 1, FP32)
    assert 0 < f2.unsharded_after_forward.bytes < f2_keep.unsharded_after_forward.bytes


def test_fp16_mixed_gathers_fp16_copies_as_big_as_bf16_ones() -> None:
    arch = shrunk("gpt2", ODD)
    bf16 = predict_rank_states(arch, FSDP2, 2, 0, BF16)
    fp16 = predict_rank_states(arch, FSDP2, 2, 0, PrecisionName.FP16_MIXED)
    assert fp16.unsharded_after_forward.bytes == bf16.unsharded_after_forward.bytes
    assert "fp16" in fp16.unsharded_after_forward.explanation


def test_bad_inputs_are_input_errors() -> None:
    arch = shrunk("gpt2", ODD)
    with pytest.raises(InputError):
        predict_rank_states(arch, DDP, 2, 2)
    with pytest.raises(InputError, match="bf16-pure"):
        predict_rank_states(arch, DDP, 2, 0, PrecisionName.BF16_PURE)
    with pytest.raises(InputError, match="sgd"):
        predict_rank_states(arch, DDP, 2, 0, FP32, OptimizerName.SGD)


def test_mixture_of_experts_is_counted_like_any_model() -> None:
    """Mixtral-8x7B (46,702,792,704 parameters) under DDP: every rank holds the whole model in fp32."""
    states = predict_rank_states(load_model("mixtral-8x7b")[0], DDP, 2, 0)
    assert states.params.bytes == 4 * 46_702_792_704
