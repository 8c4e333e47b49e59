"""The overlap schedule of a phase: a compute stream and a communication stream, unit by unit (pure).

A phase (one micro-batch's forward or backward) runs its units (FSDP units, DDP / Megatron-LM gradient
buckets, DeepSpeed ZeRO-3 sub-modules) one after another on the compute stream. Its collectives run one
after another on one communication stream, in the order they are issued: the collectives of one process
group share one NCCL stream (torch ``ProcessGroupNCCL``: one stream per device and group), so an
all-gather and a reduce-scatter of one data-parallel group never run at once. A unit's collective is
one of two kinds:

* **needed before** the unit's compute (an all-gather of its parameters), issued ``prefetch`` units
  ahead: at the start of unit i − prefetch's compute (FSDP2's implicit forward prefetch and
  ``_backward_prefetch``, one unit ahead: torch ``distributed/fsdp/_fully_shard/_fsdp_state.py``
  ``_pre_forward`` / ``_fsdp_param_group.py`` ``pre_backward``; DeepSpeed ZeRO-3's
  ``stage3_prefetch_bucket_size``, ``PartitionedParameterCoordinator.fetch_sub_module``); the first
  ``prefetch`` units' at the phase's start; with ``prefetch`` 0 each just before its own compute;
* **issued after** the unit's compute (a reduce-scatter or all-reduce of its gradients: FSDP2's
  ``post_backward`` ``foreach_reduce``, DDP's bucket hooks, Li et al. 2020 §3.2.3), waited for at the
  phase's end (FSDP2 ``_root_post_backward_final_callback``, DDP's ``finalize_backward``).

A unit's compute starts when the previous unit's has ended and its needed collective has arrived; a
collective starts when it is issued and the stream is free. The phase ends when both streams are
done; what it takes beyond its compute is its **exposed** communication: the first unit's all-gather
before any compute, the last unit's reduction after it, and whatever of the rest the compute cannot
cover (Zhao et al. 2023, PyTorch FSDP, §3.3 and Fig. 5).

Overlapped communication is not assumed to slow the compute beside it: NCCL's kernels take SMs (one
thread block per channel) and HBM bandwidth, but no per-GPU slowdown is measured or published in a
form the model can name, so none is applied (docs/model.md, Step time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class Unit(NamedTuple):
    """One unit of a phase: its compute and its collectives' seconds."""

    compute: float
    needed: float = 0.0
    """A collective its compute waits for (its parameters' all-gather)."""
    issued: float = 0.0
    """A collective issued once its compute ends (its gradients' reduction)."""


class Timeline(NamedTuple):
    """A phase as the two streams run it."""

    compute_starts: tuple[float, ...]
    end: float
    """When both streams are done."""
    compute: float
    """The compute stream's busy seconds."""

    @property
    def exposed(self) -> float:
        return self.end - self.compute


def two_streams(units: Sequence[Unit], prefetch: int) -> Timeline:
    """The phase's timeline (see the module's doc): ``prefetch`` the units each all-gather is issued
    ahead of its own."""
    n = len(units)
    stream_free = 0.0
    needed_done = [0.0] * n

    def enqueue(issue: float, seconds: float) -> float:
        nonlocal stream_free
        if seconds <= 0:
            return issue
        start = max(issue, stream_free)
        stream_free = start + seconds
        return stream_free

    for i in range(min(prefetch, n)):
        needed_done[i] = enqueue(0.0, units[i].needed)
    starts: list[float] = []
    end = 0.0
    for i, unit in enumerate(units):
        if prefetch == 0:
            needed_done[i] = enqueue(end, unit.needed)
        start = max(end, needed_done[i])
        starts.append(start)
        ahead = i + prefetch
        if prefetch and ahead < n:
            needed_done[ahead] = enqueue(start, units[ahead].needed)
        end = start + unit.compute
        enqueue(end, unit.issued)
    return Timeline(tuple(starts), max(end, stream_free), sum(u.compute for u in units))


def uniform_exposed(compute: float, comm: float, units: int, needed: bool) -> float:
    """Exposed seconds of a phase of ``units`` equal units sharing ``compute`` and ``comm`` seconds, the
    collectives needed before each unit (all-gathers, prefetched one unit ahead) or issued after it
    (reductions): :func:`two_streams`' timeline in closed form, u + (n − 1)·max(0, u − c) for a unit's
    collective u and compute c (the first all-gather before any compute, or the last reduction after it,
    and each unit's collective beyond the compute it runs beside). The same for both kinds: an all-gather
    issued at unit i − 1's start arrives u after it, a reduction issued at unit i's end leaves u after it."""
    n = max(1, units)
    c, u = compute / n, comm / n
    return u + (n - 1) * max(0.0, u - c)


def calls_in(seconds: float, one_call: float) -> int:
    """How many calls of ``one_call`` seconds ``seconds`` is (at least 1)."""
    return max(1, round(seconds / one_call)) if one_call > 0 else 1


# ----------------------------------------------------------------- Transformer Engine's userbuffers (TP)
TE_PIPELINE_SPLITS = 4
"""Transformer Engine ``transformer_engine/pytorch/module/base.py`` ``initialize_ub`` ``get_default_config``:
``num_splits`` 4 for the ``pipeline`` method (``tp_size`` for ``ring_exchange``)."""
TE_COMM_SMS = 16
"""The same defaults: ``num_sm`` 16 for ``pipeline`` and ``bulk`` with ``set_sm_margin`` (the GEMM beside
them runs on the other SMs); ``ring_exchange`` 1 SM, its copies on the copy engines (``use_ce``), no
margin."""
TE_LAYERS = {
    "qkv": ("q_proj", "k_proj", "v_proj", "qkv_proj"),
    "proj": ("o_proj",),
    "fc1": ("fc_in", "gate_proj", "up_proj", "gate_up_proj"),
    "fc2": ("fc_out", "down_proj"),
}
"""Transformer Engine's userbuffer layer names and the GEMMs (zerocalc's names) each is."""


def ring_exchange_exposed(gemm: float, comm: float, chunks: int) -> float:
    """An all-gather run as a ring exchange beside the GEMM that consumes it (TE ``CommOverlapP2P``): the
    GEMM in ``chunks`` (t) pieces, the first on the rank's own shard, piece i + 1's shard received while
    piece i multiplies (:func:`two_streams`, prefetch 1): exposed what the sends take beyond the pieces."""
    if chunks < 2 or comm <= 0:
        return 0.0
    piece, step = gemm / chunks, comm / (chunks - 1)
    units = [Unit(piece)] + [Unit(piece, needed=step)] * (chunks - 1)
    return two_streams(units, prefetch=1).exposed


def pipeline_exposed(gemm: float, comm: float, splits: int = TE_PIPELINE_SPLITS) -> float:
    """A reduce-scatter of a GEMM's output pipelined with it (TE ``CommOverlap`` ``pipeline``): the GEMM in
    ``splits`` pieces, each piece's reduce-scatter issued when it is done (:func:`two_streams`): the last
    piece's is exposed, and whatever the others take beyond the pieces after them."""
    return two_streams([Unit(gemm / splits, issued=comm / splits)] * splits, prefetch=0).exposed


def bulk_exposed(gemm: float, comm: float) -> float:
    """A collective launched beside an independent GEMM (TE ``bulk``: the wgrad's input all-gather beside
    the dgrad GEMM, the dgrad's reduce-scatter beside the wgrad GEMM): what it takes beyond the GEMM."""
    return max(0.0, comm - gemm)


def sm_slowdown(sms: int | None) -> float:
    """How much longer a GEMM takes beside a ``pipeline`` or ``bulk`` userbuffer collective: it runs on
    ``sms`` − :data:`TE_COMM_SMS` of the GPU's SMs (0 where the GPU's SM count is not known)."""
    return sms / (sms - TE_COMM_SMS) - 1.0 if sms and sms > TE_COMM_SMS else 0.0


class TeGemms(NamedTuple):
    """One pass's GEMM seconds of each userbuffer layer (forward, dgrad, wgrad), summed over the layers."""

    forward: dict[str, float]
    dgrad: dict[str, float]
    wgrad: dict[str, float]

    @classmethod
    def of(cls, times: dict[str, tuple[float, float, float]]) -> TeGemms:
        """From each GEMM's (forward, dgrad, wgrad) seconds by name."""
        parts = [
            {
                layer: sum(times.get(name, (0.0, 0.0, 0.0))[i] for name in names)
                for layer, names in TE_LAYERS.items()
            }
            for i in range(3)
        ]
        return cls(*parts)


def userbuffers_exposed(gemms: TeGemms, each: float, tp: int, sms: int | None) -> tuple[float, float]:
    """Exposed seconds of one micro-batch's layer TP collectives under Megatron-LM ``--tp-comm-overlap``
    with sequence parallelism, forward and backward, with the slowdown of the GEMMs they run beside:
    ``each`` the seconds of one of them (every one moves the layer's b·s·h activation), the four forward
    ones (AG qkv input, RS proj output, AG fc1 input, RS fc2 output) and the six backward ones (AG fc2
    output gradient, AG fc1 input, RS its gradient, AG proj output gradient, AG qkv input, RS its
    gradient) each paired with its GEMM by TE ``initialize_ub``'s default methods: ring_exchange
    qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline proj_fprop, fc2_fprop; bulk qkv_dgrad,
    qkv_wgrad, fc1_dgrad, fc1_wgrad (``gemms``: summed over the layers, so is ``each``)."""
    f, d, w = gemms
    slow = sm_slowdown(sms)
    forward = ring_exchange_exposed(f["qkv"], each, tp) + ring_exchange_exposed(f["fc1"], each, tp)
    forward += pipeline_exposed(f["proj"], each) + pipeline_exposed(f["fc2"], each)
    forward += slow * (f["proj"] + f["fc2"])
    backward = ring_exchange_exposed(d["proj"], each, tp) + ring_exchange_exposed(d["fc2"], each, tp)
    for layer in ("qkv", "fc1"):
        backward += bulk_exposed(d[layer], each) + bulk_exposed(w[layer], each)
        backward += slow * (d[layer] + w[layer])
    return forward, backward


# ------------------------------------------------------------------ torch's micro-pipelined TP (async TP)
def async_tp_exposed(gemms: TeGemms, each: float, tp: int) -> tuple[float, float]:
    """Exposed seconds of one micro-batch's layer TP collectives under torchtitan's async TP
    (``parallelism.enable_async_tensor_parallel``: ``torch._inductor.config._micro_pipeline_tp``; torch
    ``_inductor/fx_passes/micro_pipeline_tp.py`` rewrites each sequence-parallel all-gather → matmul into
    ``fused_all_gather_matmul`` and each matmul → reduce-scatter into ``fused_matmul_reduce_scatter``,
    ``distributed/_symmetric_memory/__init__.py``), forward and backward (``gemms`` and ``each`` as
    :func:`userbuffers_exposed`'s: DTensor's four layer collectives a pass, every one the layer's b·s·h):

    * all-gather → matmul (``_pipelined_all_gather_and_consume``): the matmul in t pieces, the first on the
      rank's own shard, each next shard copied from its peer while the previous multiplies (the
      :func:`ring_exchange_exposed` schedule): forward the attention and MLP inputs before the q/k/v and
      gate/up GEMMs, backward the output gradients before the o and down projections' input gradients;
    * matmul → reduce-scatter (``_pipelined_produce_and_all2all``): the matmul in t pieces, each piece's
      rows copied to the rank that reduces them as the next multiplies, the last piece's copy after it
      (the :func:`pipeline_exposed` schedule at t splits): forward the o and down projections' outputs,
      backward the q/k/v and gate/up input gradients.

    The copies are ``copy_`` between symmetric-memory buffers (contiguous chunks: the copy engines), so no
    SMs are taken from the GEMMs (:func:`sm_slowdown` of none); the GEMM's pieces are priced as the whole
    GEMM's share, and the local copy of the rank's own shard into its buffer and the final sum of the t
    received pieces (r t w 1 of the output's shard) are not counted."""
    f, d, _ = gemms
    forward = ring_exchange_exposed(f["qkv"], each, tp) + ring_exchange_exposed(f["fc1"], each, tp)
    forward += pipeline_exposed(f["proj"], each, tp) + pipeline_exposed(f["fc2"], each, tp)
    backward = ring_exchange_exposed(d["proj"], each, tp) + ring_exchange_exposed(d["fc2"], each, tp)
    backward += pipeline_exposed(d["qkv"], each, tp) + pipeline_exposed(d["fc1"], each, tp)
    return forward, backward
