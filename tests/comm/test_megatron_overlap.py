"""Megatron-LM's overlap options (``--overlap-grad-reduce``, ``--overlap-param-gather``,
``--tp-comm-overlap``): the buckets they cut, the schedule each follows (drawn by hand), and the options'
checks (Megatron-LM ``megatron/training/arguments.py``)."""

from __future__ import annotations

import pytest
from helpers import DATA, one_line_error
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerocalc.api import estimate_comm
from zerocalc.cli import app
from zerocalc.comm.overlap import (
    TeGemms,
    Unit,
    bulk_exposed,
    pipeline_exposed,
    ring_exchange_exposed,
    sm_slowdown,
    two_streams,
    userbuffers_exposed,
)
from zerocalc.comm.step import PhaseComm, after_step_exposed, exposed_time
from zerocalc.network.collectives import Collective
from zerocalc.parallel.framework_records.megatron import bucket_elements

runner = CliRunner()
GPT3_7B = str(DATA / "megatron-ci" / "gpt3-7b.toml")


def test_bucket_size_is_megatrons_default_and_one_bucket_without_overlap() -> None:
    """``distributed_data_parallel.py``: ``max(40000000, 1000000 * dp_group.size())`` with
    ``overlap_grad_reduce``, else ``None`` (one bucket)."""
    assert bucket_elements(True, 8) == 40_000_000
    assert bucket_elements(True, 64) == 64_000_000
    assert bucket_elements(False, 8) == 0


def test_a_flat_buffer_is_cut_into_buckets_of_the_default_size() -> None:
    """400M parameters known only by Ψ on 8 GPUs: 400M / 40M = 10 reduce-scatter calls (and 10
    all-gathers, the same buckets) with ``--overlap-grad-reduce``, one of each without; the bytes are the
    buffer's either way, each bucket ending at a multiple of lcm(8, 128) = 128 elements (40M is one)."""

    def calls(**options: object) -> dict[Collective, tuple[int, int]]:
        row = estimate_comm(400_000_000, 8, framework="megatron", strategies="zero1", **options).row("zero1")
        return {c.op: (c.calls_per_step, c.total_bytes_per_gpu) for c in row.collectives}

    bucketed, whole = calls(overlap_grad_reduce=True), calls()
    assert bucketed[Collective.REDUCE_SCATTER][0] == 10 and whole[Collective.REDUCE_SCATTER][0] == 1
    assert bucketed[Collective.ALL_GATHER][0] == 10 and whole[Collective.ALL_GATHER][0] == 1
    assert bucketed[Collective.REDUCE_SCATTER][1] == whole[Collective.REDUCE_SCATTER][1]


def test_bucketed_reductions_hide_behind_the_last_micro_batchs_backward() -> None:
    """A = 2, each micro-batch's backward 4 s; on the last one, 4 buckets of 0.25 s each, issued as their
    gradients are ready (``register_grad_ready`` → ``start_grad_sync``):

        micro-batch 1:  B 0-4                  (no_sync: nothing reduced)
        micro-batch 2:  B0 4-5 | B1 5-6 | B2 6-7 | B3 7-8
        comm:                  R0 5-5.25 | R1 6-6.25 | R2 7-7.25 | R3 8-8.25

    exposed 0.25: the last bucket's. One bucket (no ``--overlap-grad-reduce``): its 1 s after backward."""
    bucketed = PhaseComm(spread=0.0, once=1.0, call_spread=0.0, call_once=0.25)
    assert exposed_time(bucketed, compute=8.0, accum=2, hides=True) == pytest.approx(0.25)
    timeline = two_streams([Unit(1.0, issued=0.25)] * 4, prefetch=0)
    assert timeline.end == pytest.approx(8.25 - 4.0) and timeline.exposed == pytest.approx(0.25)
    one_bucket = PhaseComm(spread=0.0, once=1.0, call_spread=0.0, call_once=1.0)
    assert exposed_time(one_bucket, compute=8.0, accum=2, hides=True) == pytest.approx(1.0)


def test_deferred_parameter_gathers_hide_behind_the_bucket_before() -> None:
    """``--overlap-param-gather``: the first forward of 4 buckets of 1 s; each bucket's all-gather 0.5 s,
    the first dispatched by its module's pre-hook, each next one once the one before has arrived
    (``finish_param_sync``):

        comm:     G0 0-0.5 | G1 0.5-1 |          | G2 1.5-2 | ...
        compute:           | C0 0.5-1.5          | C1 1.5-2.5 | C2 2.5-3.5 | C3 3.5-4.5

    exposed 0.5 (the first bucket's gather); after the step instead (Megatron-LM's default), all 2 s.
    Gathers of 1.5 s each: G0 0-1.5, C0 1.5-2.5, G1 1.5-3, C1 3-4, G2 3-4.5, C2 4.5-5.5, G3 4.5-6, C3 6-7:
    exposed 7 − 4 = 3."""
    gathers = PhaseComm(spread=0.0, once=2.0, call_spread=0.0, call_once=0.5)
    assert after_step_exposed(gathers, first_forward=4.0, in_forward=True) == pytest.approx(0.5)
    assert after_step_exposed(gathers, first_forward=4.0, in_forward=False) == pytest.approx(2.0)
    slow = PhaseComm(spread=6.0, once=0.0, call_spread=1.5, call_once=0.0)
    assert after_step_exposed(slow, first_forward=4.0, in_forward=True) == pytest.approx(3.0)
    timeline = two_streams([Unit(1.0, needed=1.5)] * 4, prefetch=1)
    assert timeline.compute_starts == (1.5, 3.0, 4.5, 6.0) and timeline.exposed == pytest.approx(3.0)


def test_megatron_step_exposes_one_bucket_of_each_collective() -> None:
    """The 7B model on 8 GPUs (dp 8), b 1, s 2048, zero1: each bucket's collective is shorter than its
    share of the compute, so with both options the exposed data-parallel time is one reduce-scatter
    bucket and one all-gather bucket (each collective's time over its calls); without them, both whole."""

    def row(**options: object):  # type: ignore[no-untyped-def]
        return estimate_comm(
            None, 8, model=GPT3_7B, gpu="h100-80gb", framework="megatron", strategies="zero1",
            micro_batch=1, seq_len=2048, flash_attention=True, **options,
        ).row("zero1")  # fmt: skip

    overlapped = row(overlap_grad_reduce=True, overlap_param_gather=True)
    by_op = {c.op: c for c in overlapped.collectives}
    rs, ag = by_op[Collective.REDUCE_SCATTER], by_op[Collective.ALL_GATHER]
    assert rs.calls_per_step > 1 and ag.calls_per_step == rs.calls_per_step
    one_bucket_each = rs.time_s / rs.calls_per_step + ag.time_s / ag.calls_per_step
    assert overlapped.step is not None
    assert overlapped.step.exposed_dp_s == pytest.approx(one_bucket_each)
    default = row()
    assert default.step is not None
    assert default.step.exposed_dp_s == pytest.approx(sum(c.time_s for c in default.collectives))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7B", "--gpus", "8", "--framework", "fsdp2", "--overlap-grad-reduce"], "megatron"),
        (["--params", "7B", "--gpus", "8", "--framework", "megatron", "--overlap-param-gather"],
         "--overlap-grad-reduce"),
        (["--params", "7B", "--gpus", "8", "--framework", "megatron", "-s", "ddp", "--overlap-grad-reduce",
          "--overlap-param-gather"], "zero1"),
        (["--model", GPT3_7B, "--gpus", "8", "--tp", "2", "--framework", "megatron", "--tp-comm-overlap"],
         "--sequence-parallel"),
    ],
)  # fmt: skip
def test_overlap_options_megatron_refuses_are_refused(args: list[str], fragment: str) -> None:
    """Megatron-LM's own asserts (``arguments.py``), and the options under another framework."""
    one_line_error(runner.invoke(app, ["comm", *args]), fragment)


def test_a_ring_exchange_hides_each_shard_behind_the_piece_before() -> None:
    """TE ``ring_exchange`` all-gather beside its GEMM, t = 4 pieces of 1 s, the first on the rank's own
    shard; each of the 3 sends 1 s:

        comm:    R1 0-1 | R2 1-2 | R3 2-3
        compute: C0 0-1 | C1 1-2 | C2 2-3 | C3 3-4        exposed 0

    sends of 2 s: R1 0-2, C0 0-1, C1 2-3, R2 2-4, C2 4-5, R3 4-6, C3 6-7: exposed 7 − 4 = 3."""
    assert ring_exchange_exposed(gemm=4.0, comm=3.0, chunks=4) == pytest.approx(0.0)
    assert ring_exchange_exposed(gemm=4.0, comm=6.0, chunks=4) == pytest.approx(3.0)
    assert ring_exchange_exposed(gemm=4.0, comm=6.0, chunks=1) == 0.0  # no TP: nothing to exchange


def test_a_pipelined_reduce_scatter_exposes_its_last_split() -> None:
    """TE ``pipeline`` reduce-scatter of a GEMM's output in 4 splits of 1 s, each split's 0.5 s
    reduce-scatter issued when the split is done:

        compute: C0 0-1 | C1 1-2 | C2 2-3 | C3 3-4
        comm:           S0 1-1.5 | S1 2-2.5 | S2 3-3.5 | S3 4-4.5     exposed 0.5"""
    assert pipeline_exposed(gemm=4.0, comm=2.0) == pytest.approx(0.5)


def test_a_bulk_collective_exposes_what_exceeds_the_gemm_beside_it() -> None:
    assert bulk_exposed(gemm=2.0, comm=3.0) == pytest.approx(1.0)
    assert bulk_exposed(gemm=3.0, comm=2.0) == 0.0


def test_userbuffers_pair_each_collective_with_its_gemm() -> None:
    """One micro-batch, t 4, each collective 1 s; GEMMs qkv 4, proj 2, fc1 8, fc2 4 s in every pass.
    Forward: qkv and fc1 ring exchanges (pieces 1 and 2 s, sends 1/3 s) hide; proj's and fc2's pipelined
    reduce-scatters expose their last split, 0.25 each: 0.5. Backward: the proj and fc2 dgrad ring
    exchanges hide, the bulk collectives (1 s) beside GEMMs of 4 and 8 s hide: 0. On an H100 (132 SMs)
    the GEMMs beside pipeline and bulk collectives run on 116: 132/116 − 1 = 0.1379 more of proj + fc2
    forward (6 s) and of qkv's and fc1's dgrad and wgrad (24 s)."""
    layers = {"qkv": 4.0, "proj": 2.0, "fc1": 8.0, "fc2": 4.0}
    gemms = TeGemms(dict(layers), dict(layers), dict(layers))
    assert userbuffers_exposed(gemms, 1.0, 4, None) == pytest.approx((0.5, 0.0))
    slow = 132 / 116 - 1
    assert sm_slowdown(132) == pytest.approx(slow)
    assert userbuffers_exposed(gemms, 1.0, 4, 132) == pytest.approx((0.5 + 6 * slow, 24 * slow))


def test_tp_comm_overlap_hides_the_layers_tp_collectives_not_the_rest() -> None:
    """The 7B model at t 8 with sequence parallelism: the same collectives (comm's time) with and without
    ``--tp-comm-overlap``; exposed TP falls, but not below the collectives outside Transformer Engine's
    layers (the embedding's, the LM head's input, the loss's all-reduces), which stay exposed."""

    def row(**options: object):  # type: ignore[no-untyped-def]
        return estimate_comm(
            None, 8, model=GPT3_7B, gpu="h100-80gb", framework="megatron", strategies="zero1", tp=8,
            sequence_parallel=True, micro_batch=1, seq_len=4096, flash_attention=True, **options,
        ).row("zero1")  # fmt: skip

    plain, overlapped = row(), row(tp_comm_overlap=True)
    assert plain.step is not None and overlapped.step is not None
    assert overlapped.time_s == pytest.approx(plain.time_s)
    outside = sum(c.time_s for c in overlapped.mesh_collectives if c.dimension == "tp" and c.scope != "layer")
    assert outside > 0
    assert outside < overlapped.step.exposed_tp_s < 0.5 * plain.step.exposed_tp_s


def test_deepspeed_overlap_comm_hides_zero2s_bucketed_reductions() -> None:
    """DeepSpeed ZeRO-2 with ``zero_optimization.overlap_comm`` (``stage_1_and_2.py``: ``average_tensor``
    on ``reduction_stream``): its reduce buckets hide behind backward, as DDP's do (:func:`exposed_time`:
    the last bucket's exposed); off, DeepSpeed's default below stage 3, every reduction exposed. Llama 3 8B
    on 8 GPUs, b 1, s 2048, A = 1; the one 500M-element reduce bucket's worth of calls each shorter than
    its share of backward, so exposed = the all-reduce's time over its calls, plus the all-gather after
    the step (exposed either way)."""

    def row(**options: object):  # type: ignore[no-untyped-def]
        return estimate_comm(
            None, 8, model="llama-3-8b", gpu="h100-80gb", framework="deepspeed", strategies="zero2",
            micro_batch=1, seq_len=2048, **options,
        ).row("zero2")  # fmt: skip

    plain, overlapped = row(), row(overlap_comm=True)
    by_op = {c.op: c for c in overlapped.collectives}
    reduce, gather = by_op[Collective.ALL_REDUCE], by_op[Collective.ALL_GATHER]
    assert reduce.calls_per_step > 1
    assert overlapped.step is not None and plain.step is not None
    assert plain.step.exposed_dp_s == pytest.approx(reduce.time_s + gather.time_s)
    last_bucket = reduce.time_s / reduce.calls_per_step
    assert overlapped.step.exposed_dp_s == pytest.approx(last_bucket + gather.time_s)


def test_a_ds_config_with_overlap_comm_on_below_stage_3_sets_overlap_comm() -> None:
    """``overlap_comm: true`` at stage 1 or 2 is modelled (``--overlap-comm``); at stage 3 it is the
    default and sets nothing; ``false`` at stage 3 stays refused (its collectives not overlapped)."""
    from zerocalc.request.launch import LaunchFormat, read_launch_config

    def values(text: str) -> dict[str, object]:
        return read_launch_config(LaunchFormat.DEEPSPEED, text, "{deepspeed} f").values

    assert values('{"zero_optimization": {"stage": "2", "overlap_comm": true}}')["overlap_comm"] is True
    assert values('{"zero_optimization": {"stage": 1, "overlap_comm": true}}')["overlap_comm"] is True
    assert "overlap_comm" not in values('{"zero_optimization": {"stage": 3, "overlap_comm": true}}')
    assert "overlap_comm" not in values('{"zero_optimization": {"stage": 2, "overlap_comm": false}}')


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7B", "--gpus", "8", "--framework", "megatron", "--overlap-comm"], "deepspeed"),
        (["--params", "7B", "--gpus", "8", "--framework", "deepspeed", "-s", "zero3", "--overlap-comm"],
         "changes nothing"),
    ],
)  # fmt: skip
def test_overlap_comm_outside_deepspeed_zero12_is_refused(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["comm", *args]), fragment)


_SECONDS = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@given(gemm=_SECONDS, comm=_SECONDS, chunks=st.integers(min_value=2, max_value=16))
def test_a_ring_exchange_exposes_between_nothing_and_its_excess_over_the_pieces(
    gemm: float, comm: float, chunks: int
) -> None:
    """The sends beside t − 1 of the t pieces: at least what they take beyond those pieces, at most all of
    them."""
    exposed = ring_exchange_exposed(gemm, comm, chunks)
    assert max(0.0, comm - gemm * (chunks - 1) / chunks) - 1e-9 <= exposed <= comm + 1e-9


@given(gemm=_SECONDS, comm=_SECONDS)
def test_a_pipelined_reduce_scatter_exposes_at_least_its_last_split(gemm: float, comm: float) -> None:
    exposed = pipeline_exposed(gemm, comm)
    assert comm / 4 - 1e-9 <= exposed <= comm + 1e-9
    assert exposed >= comm - gemm * 3 / 4 - 1e-9
