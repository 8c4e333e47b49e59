"""Invariants of the communication model (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zerocalc.api import estimate_comm

world = st.integers(min_value=2, max_value=2048)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), world)
def test_zero1_zero2_equal_ddp_and_zero3_is_one_and_a_half_when_shards_are_even(k: int, n: int) -> None:
    psi = k * n  # whole shards: no padding
    est = estimate_comm(psi, n, strategies="ddp,zero1,zero2,zero3")
    ddp = est.row("ddp").total_bytes_per_gpu
    assert est.row("zero1").total_bytes_per_gpu == ddp == est.row("zero2").total_bytes_per_gpu
    assert 2 * est.row("zero3").total_bytes_per_gpu == 3 * ddp


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**12), world)
def test_padding_adds_less_than_one_element_per_rank_and_collective(psi: int, n: int) -> None:
    est = estimate_comm(psi, n, strategies="ddp,zero1,zero3")
    ddp = est.row("ddp").total_bytes_per_gpu
    slack = 2 * (n - 1) + 2  # bf16: < one element per shard, per collective
    assert 0 <= est.row("zero1").total_bytes_per_gpu - ddp <= 2 * slack
    assert 0 <= 2 * est.row("zero3").total_bytes_per_gpu - 3 * ddp <= 6 * slack


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10**11), world, st.integers(1, 16))
def test_more_micro_batches_never_send_less(psi: int, n: int, a: int) -> None:
    one = estimate_comm(psi, n, strategies="ddp,zero1,zero2,zero3")
    many = estimate_comm(psi, n, strategies="ddp,zero1,zero2,zero3", grad_accum=a)
    for row in one.strategies:
        assert many.row(row.strategy).total_bytes_per_gpu >= row.total_bytes_per_gpu
    assert many.row("ddp").total_bytes_per_gpu == one.row("ddp").total_bytes_per_gpu
