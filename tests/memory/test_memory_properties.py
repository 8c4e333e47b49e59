"""Invariants of the memory model over Ψ, N and recipes (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zerocalc.api import estimate_memory
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.request.finetune import PAGED_OPTIMIZERS

params = st.integers(min_value=1, max_value=2 * 10**12)
world = st.integers(min_value=1, max_value=4096)
precisions = st.sampled_from([p.value for p in PrecisionName])
optimizers = st.sampled_from([o.value for o in OptimizerName if o not in PAGED_OPTIMIZERS])  # from Ψ alone
ORDER = "ddp,zero1,zero2,zero3"


@settings(max_examples=200, deadline=None)
@given(params, world, precisions, optimizers, st.booleans())
def test_more_sharding_never_costs_more(
    psi: int, n: int, precision: str, optimizer: str, accum: bool
) -> None:
    if precision == "fp32":
        accum = False
    est = estimate_memory(
        psi, n, precision=precision, optimizer=optimizer, fp32_grad_accum=accum, strategies=ORDER
    )
    ddp, z1, z2, z3 = (est.row(s).gpu_bytes for s in ORDER.split(","))
    assert z3 <= z2 <= z1 <= ddp


@settings(max_examples=100, deadline=None)
@given(params, precisions, optimizers)
def test_all_strategies_equal_on_one_gpu(psi: int, precision: str, optimizer: str) -> None:
    est = estimate_memory(psi, 1, precision=precision, optimizer=optimizer)
    assert len({row.gpu_bytes for row in est.strategies}) == 1


@settings(max_examples=200, deadline=None)
@given(params, world, precisions, optimizers)
def test_total_is_the_sum_of_its_parts(psi: int, n: int, precision: str, optimizer: str) -> None:
    est = estimate_memory(psi, n, precision=precision, optimizer=optimizer)
    for row in est.strategies:
        assert row.gpu_bytes == sum(s.bytes for s in row.states)
        for state in row.states:
            assert state.bytes == sum(state.parts.values())
            assert state.elements * state.shard_ranks - state.padding_elements == psi
            assert 0 <= state.padding_elements < state.shard_ranks


@settings(max_examples=200, deadline=None)
@given(params, world, world, precisions)
def test_per_gpu_bytes_never_grow_with_n(psi: int, n1: int, n2: int, precision: str) -> None:
    small, large = sorted((n1, n2))
    a = estimate_memory(psi, small, 1, precision=precision, strategies=ORDER)
    b = estimate_memory(psi, large, 1, precision=precision, strategies=ORDER)
    for s in ORDER.split(","):
        assert b.row(s).gpu_bytes <= a.row(s).gpu_bytes
