"""Memory core against hand-computed values and the ZeRO paper's Table 1."""

from __future__ import annotations

import pytest

from zerocalc.api import estimate_memory
from zerocalc.base.errors import InputError
from zerocalc.states.memory import Location, StateKind

# ZeRO paper (Rajbhandari et al. 2020), Table 1: Ψ = 7.5B, K = 12, per-device GB (1e9 bytes) for
# P_os, P_os+g and P_os+g+p at each DP degree, as printed (three significant figures). Baseline DP is
# 120 GB throughout.
ZERO_PAPER_TABLE_1 = {
    1: ("120", "120", "120"),
    4: ("52.5", "41.3", "30"),
    16: ("35.6", "21.6", "7.5"),
    64: ("31.4", "16.6", "1.88"),
    256: ("30.4", "15.4", "0.47"),
    1024: ("30.1", "15.1", "0.12"),
}


def _half_unit_of_last_digit(printed: str) -> float:
    decimals = len(printed.partition(".")[2])
    return 0.5 * 10**-decimals


@pytest.mark.parametrize("dp", sorted(ZERO_PAPER_TABLE_1))
def test_reproduces_zero_paper_table_1(dp: int) -> None:
    est = estimate_memory("7.5B", dp, optimizer="adam", strategies="ddp,zero1,zero2,zero3")
    assert est.row("ddp").gpu_bytes == 120 * 10**9
    for strategy, printed in zip(("zero1", "zero2", "zero3"), ZERO_PAPER_TABLE_1[dp], strict=True):
        got_gb = est.row(strategy).gpu_bytes / 1e9
        # equal to the printed figure to within the rounding of its last digit
        assert abs(got_gb - float(printed)) <= _half_unit_of_last_digit(printed) + 1e-9, (strategy, got_gb)


def test_seven_b_on_four_gpus_by_hand() -> None:
    est = estimate_memory("7B", 4)
    psi = 7_000_000_000
    assert est.row("ddp").gpu_bytes == 16 * psi
    assert est.row("zero1").gpu_bytes == 2 * psi + 2 * psi + 12 * psi // 4
    assert est.row("zero2").gpu_bytes == 2 * psi + (2 + 12) * psi // 4
    assert est.row("zero3").gpu_bytes == 16 * psi // 4
    # one node of 4: hybrid shards over the node, i.e. the same as ZeRO-3
    assert est.row("hybrid_shard").gpu_bytes == 16 * psi // 4


def test_shards_are_whole_elements_of_the_largest_rank() -> None:
    est = estimate_memory(10, 3, strategies="zero3", precision="fp32", optimizer="sgd")
    params = next(s for s in est.row("zero3").states if s.kind is StateKind.PARAMS)
    assert params.elements == 4 and params.padding_elements == 2  # ceil(10/3) = 4, 3*4 - 10 = 2
    assert est.row("zero3").gpu_bytes == 4 * (4 + 4 + 4)  # fp32 params + grads + momentum


def test_hybrid_shards_within_a_node() -> None:
    est = estimate_memory("8B", 64, 8, strategies="hybrid")
    assert est.row("hybrid_shard").gpu_bytes == 16 * 8_000_000_000 // 8


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("bf16-mixed", "adamw", 16),
        ("fp16-mixed", "adam", 16),
        ("fp32", "adam", 16),  # 4 + 4 + 8
        ("bf16-pure", "adam", 8),  # 2 + 2 + 4
        ("bf16-mixed", "sgd", 12),  # 2 + 2 + 4 master + 4 momentum
        ("bf16-mixed", "sgd-no-momentum", 8),
        ("fp32", "sgd-no-momentum", 8),
        ("bf16-mixed", "adafactor", 8),
    ],
)
def test_bytes_per_parameter_of_recipes(precision: str, optimizer: str, per_param: int) -> None:
    est = estimate_memory(1024, 1, precision=precision, optimizer=optimizer, strategies="ddp")
    assert est.row("ddp").gpu_bytes == per_param * 1024


def test_adam_8bit_counts_block_scales() -> None:
    n = 1000  # 4 blocks of 256
    est = estimate_memory(n, 1, optimizer="adam-8bit", strategies="ddp")
    optimizer = next(s for s in est.row("ddp").states if s.kind is StateKind.OPTIMIZER)
    assert optimizer.parts == {
        "master_fp32": 4 * n,
        "state1_uint8": n,
        "state2_uint8": n,
        "absmax1": 4 * 4,
        "absmax2": 4 * 4,
    }
    assert est.bytes_per_parameter.k == 4 + 2 + 8 / 256


def test_fp32_grad_accum_is_sharded_like_gradients() -> None:
    est = estimate_memory("1B", 8, fp32_grad_accum=True, strategies="zero1,zero2")
    assert est.row("zero1").gpu_bytes == (2 + 2 + 4) * 10**9 + 12 * 10**9 // 8
    assert est.row("zero2").gpu_bytes == 2 * 10**9 + (2 + 4 + 12) * 10**9 // 8


def test_optimizer_offload_moves_states_and_partitioned_grads_to_host() -> None:
    est = estimate_memory("8B", 16, 8, offload_optimizer="cpu", strategies="zero2")
    row = est.row("zero2")
    assert row.gpu_bytes == 2 * 8 * 10**9
    assert row.cpu_bytes_per_gpu == (2 + 12) * 8 * 10**9 // 16
    assert row.cpu_bytes_per_node == 8 * row.cpu_bytes_per_gpu
    assert row.bytes_of(StateKind.GRADS) == 0


def test_param_offload_to_nvme_under_zero3() -> None:
    est = estimate_memory("405B", 64, offload_optimizer="nvme", offload_params="nvme", strategies="zero3")
    row = est.row("zero3")
    locations = {s.kind: s.location for s in row.states}
    assert locations[StateKind.PARAMS] is Location.NVME
    assert locations[StateKind.OPTIMIZER] is Location.NVME
    assert locations[StateKind.GRADS] is Location.CPU
    assert row.gpu_bytes == 0


def test_default_set_leaves_out_what_cannot_offload_with_a_note() -> None:
    est = estimate_memory("7B", 8, offload_optimizer="cpu")
    assert [r.strategy.value for r in est.strategies] == ["zero1", "zero2", "zero3"]
    assert any("DDP" in note for note in est.notes)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"params": "7X"}, "'7X'"),
        ({"params": "-1"}, "must be positive"),
        ({"params": "7B", "gpus": 0}, "gpus 0"),
        ({"params": "7B", "strategies": "zero4"}, "zero4"),
        ({"params": "7B", "precision": "int4"}, "int4"),
        ({"params": "7B", "offload_params": "cpu", "strategies": "zero2"}, "only zero3"),
        ({"params": "7B", "offload_optimizer": "nvme", "strategies": "zero2"}, "nvme"),
        ({"params": "7B", "gpus": 12, "gpus_per_node": 8, "strategies": "hybrid"}, "multiple"),
        ({"params": "7B", "precision": "fp32", "fp32_grad_accum": True}, "already fp32"),
    ],
)
def test_bad_input_names_the_value(kwargs: dict, fragment: str) -> None:
    with pytest.raises(InputError, match=None) as info:
        estimate_memory(**kwargs)
    assert fragment in str(info.value)
    assert "accepted" in str(info.value) or "only" in str(info.value) or "can offload" in str(info.value)
