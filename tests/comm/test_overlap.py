"""The overlap schedule (zerocalc/comm/overlap.py) against hand-drawn two-stream schedules, and each
framework's overlap rule as the step applies it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zerocalc.api import estimate_comm
from zerocalc.comm.overlap import Unit, two_streams, uniform_exposed


def test_prefetched_all_gathers_hide_behind_the_previous_units_compute() -> None:
    """Compute 3, all-gather 2, three units, prefetch 1 (FSDP2's forward):

        comm:    G0 0-2 | G1 2-4 | G2 5-7
        compute:        | C0 2-5 | C1 5-8 | C2 8-11

    only the first all-gather is exposed: 11 − 9 = 2."""
    timeline = two_streams([Unit(3, needed=2)] * 3, prefetch=1)
    assert timeline.compute_starts == (2, 5, 8)
    assert timeline.end == 11 and timeline.exposed == 2


def test_all_gathers_longer_than_the_compute_expose_their_excess() -> None:
    """Compute 1, all-gather 2, three units, prefetch 1:

        comm:    G0 0-2 | G1 2-4 | G2 4-6
        compute:        | C0 2-3 |  C1 4-5 | C2 6-7

    exposed 7 − 3 = 4: the first all-gather, then 1 per later unit, and the last unit's compute that
    nothing follows."""
    timeline = two_streams([Unit(1, needed=2)] * 3, prefetch=1)
    assert timeline.compute_starts == (2, 4, 6)
    assert timeline.exposed == 4


def test_without_prefetch_every_all_gather_waits_for_the_compute_before_it() -> None:
    """Prefetch 0 (``--prefetch 0``): G0 0-2, C0 2-5, G1 5-7, C1 7-10, G2 10-12, C2 12-15: exposed 6."""
    timeline = two_streams([Unit(3, needed=2)] * 3, prefetch=0)
    assert timeline.compute_starts == (2, 7, 12)
    assert timeline.exposed == 6


def test_fsdp2_backward_exposes_the_first_all_gather_and_the_last_reduce_scatter() -> None:
    """FSDP2's backward with resharded parameters: compute 4, all-gather 1, reduce-scatter 2, two units:

        comm:    G0 0-1 | G1 1-2 |        | R0 5-7 |        | R1 9-11
        compute:        | C0 1-5          | C1 5-9

    exposed 11 − 8 = 3: G0 before any compute, R1 after it."""
    timeline = two_streams([Unit(4, needed=1, issued=2)] * 2, prefetch=1)
    assert timeline.compute_starts == (1, 5)
    assert timeline.exposed == 3


def test_bucket_reductions_queue_on_one_stream() -> None:
    """DDP-style reductions issued after each unit, compute 1, all-reduce 3: R0 1-4, R1 4-7 (issued at
    2), R2 7-10 (issued at 3): exposed 10 − 3 = 7."""
    timeline = two_streams([Unit(1, issued=3)] * 3, prefetch=1)
    assert timeline.end == 10 and timeline.exposed == 7


def test_an_all_gather_waits_behind_a_reduction_of_its_group() -> None:
    """One NCCL stream per group: unit 2's all-gather (issued at 2) starts only when unit 0's reduction
    (issued at 2, before it) ends at 5; compute 2 each, all-gathers 0, 1, 1, reduction 3 after unit 0:

        comm:    G1 0-1 | R0 2-5 | G2 5-6
        compute: C0 0-2 | C1 2-4 |       | C2 6-8

    exposed 8 − 6 = 2."""
    units = [Unit(2, needed=0, issued=3), Unit(2, needed=1), Unit(2, needed=1)]
    timeline = two_streams(units, prefetch=1)
    assert timeline.compute_starts == (0, 2, 6)
    assert timeline.exposed == 2


@given(
    st.floats(0.01, 10),
    st.floats(0.01, 10),
    st.integers(1, 40),
    st.booleans(),
)
def test_the_closed_form_is_the_two_stream_schedule_of_equal_units(
    compute: float, comm: float, units: int, needed: bool
) -> None:
    c, u = compute / units, comm / units
    unit = Unit(c, needed=u) if needed else Unit(c, issued=u)
    expected = two_streams([unit] * units, prefetch=1).exposed
    assert uniform_exposed(compute, comm, units, needed) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def _step(framework: str, strategy: str, **options: object):
    """Llama 3 8B on one node of 8 H100, b 1, s 4096, A 4."""
    row = estimate_comm(
        model="llama-3-8b", gpu="h100-80gb", gpus=8, framework=framework, strategies=strategy,
        micro_batch=1, seq_len=4096, grad_accum=4, **options,
    ).strategies[0]  # fmt: skip
    assert row.step is not None
    return row


def test_megatron_without_overlap_grad_reduce_exposes_its_reductions_and_gathers() -> None:
    """Megatron-LM's defaults (``overlap_grad_reduce`` and ``overlap_param_gather`` off:
    ``param_and_grad_buffer.py`` ``finish_grad_sync`` starts the reduce-scatter after the backward,
    ``start_param_sync`` after the step), one bucket per buffer (the record's schedule): the one
    reduce-scatter issued after the last unit, the all-gather after the step, every data-parallel
    second exposed."""
    row = _step("megatron", "zero1")
    assert row.step.exposed_dp_s == pytest.approx(row.time_s, rel=1e-9)


def test_deepspeed_zero2_exposes_its_reductions_and_fsdp2_hides_most() -> None:
    """DeepSpeed ZeRO-1/2's ``overlap_comm`` off by default: exposed; FSDP2's prefetched all-gathers and
    reduce-scatters beside backward: the first all-gather and the last reduction of each micro-batch
    (and what exceeds the compute)."""
    zero2 = _step("deepspeed", "zero2")
    assert zero2.step.exposed_dp_s == pytest.approx(zero2.time_s, rel=1e-9)
    fsdp2 = _step("fsdp2", "zero3")
    assert 0 < fsdp2.step.exposed_dp_s < 0.5 * fsdp2.time_s
