"""How long one rank's compute takes: each operation of :mod:`zerocalc.compute.ops` at the rate its
shape achieves on the GPU (:class:`~zerocalc.compute.table.ComputeTable`), summed by class and pass
(pure).

* a GEMM: its FLOPs at the table's rate for its (m, n, k) and dtype; backward, its input- and
  weight-gradient products at theirs;
* fused attention: its executed FLOPs at the table's forward and backward rates for its shape; eager
  attention: its two batched products as GEMMs (backward: two each) and its element-wise kernels;
* an element-wise kernel: its bytes at the table's bandwidth for its size (backward:
  :attr:`~zerocalc.compute.ops.Traffic.backward` bytes);
* recomputation re-runs, in backward, what it re-runs: ``full`` every layer's forward (Korthikanti et
  al. 2022 §5: the whole transformer layer), or every N-th layer's under ``checkpoint_every`` N
  (torchtitan's ``selective_ac_option`` N: n // N of a rank's n layers of one kind), ``selective``
  eager attention's core (Q·Kᵀ, scale, mask, softmax, dropout, P·V: Korthikanti §5, Megatron-LM
  ``--recompute-granularity selective``); a flash
  kernel keeps no s² tensor, so selective recomputes nothing there; ``op`` (torchtitan's op-level
  selective checkpointing, :func:`~zerocalc.model.code.op_sac_layer`) every second GEMM of the
  layer in the order its code calls them (k, o and up projections: :func:`~zerocalc.model.code.
  op_sac_recomputes`) and every element-wise kernel of the layer; the flash kernel's output and the other
  GEMMs' are saved;
* the optimizer step, once per step: its bytes per owned parameter at the bandwidth of one parameter
  tensor's traffic (the foreach kernels walk the tensors in turn).

Kernels run one after another on the compute stream; nothing here overlaps (communication overlap is
the step's, :mod:`zerocalc.comm.step`).
"""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.memo import IdentityCache
from zerocalc.compute.ops import (
    FLASH_BACKWARD_FLOPS,
    Attention,
    Gemm,
    LayerOps,
    MicroBatchOps,
    OpClass,
    Traffic,
)
from zerocalc.compute.table import ComputeTable
from zerocalc.model.activations import Recompute
from zerocalc.model.code import op_sac_recomputes


class PassTime(NamedTuple):
    """One pass's seconds by class (element-wise includes eager attention's kernels over the scores)."""

    matmul: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.elementwise

    def __add__(self, other: object) -> PassTime:  # type: ignore[override]
        assert isinstance(other, PassTime)
        return PassTime(*(a + b for a, b in zip(self, other, strict=True)))

    def times(self, factor: float) -> PassTime:
        return PassTime(*(v * factor for v in self))


class MicroBatchTime(NamedTuple):
    """One micro-batch on one rank."""

    forward: PassTime
    backward: PassTime
    """Without recomputation."""
    recompute: PassTime
    flops: float
    """Executed FLOPs: forward, backward and recomputation."""


class ComputeTime(NamedTuple):
    """One rank's compute in one optimizer step of A micro-batches."""

    forward_s: float
    backward_s: float
    """Recomputation included (it runs in backward)."""
    recompute_s: float
    optimizer_s: float
    by_class: dict[OpClass, float]
    flops: float
    """Executed FLOPs per step."""

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


def _gemm_s(table: ComputeTable, gemm: Gemm, dtype: DType) -> float:
    """A product's seconds; ``count`` products of one shape (a batched product, the experts' grouped
    products) run at the rate of one product of their stacked rows, (count·m) × k · k × n; an FP8 product
    (:mod:`zerocalc.compute.fp8`) at the table's FP8 rate, another in its own dtype where it has one (PEFT's
    fp32 adapters), else ``dtype``."""
    if not gemm.flops:
        return 0.0
    dtype = DType.FP8 if gemm.fp8.forward else (gemm.dtype or dtype)
    return gemm.flops / table.gemm_rate(gemm.m * gemm.count, gemm.n, gemm.k, dtype)


def _traffic_s(table: ComputeTable, traffic: Traffic, backward: bool = False) -> float:
    nbytes = traffic.backward if backward else traffic.nbytes
    return traffic.count * nbytes / table.bandwidth(nbytes) if nbytes else 0.0


def _gemms(table: ComputeTable, gemms: tuple[Gemm, ...], dtype: DType) -> tuple[float, float, float, float]:
    """Seconds of the products forward and backward, and their executed FLOPs forward and backward (the
    backward products that run: no weight gradient of a frozen weight)."""
    forward = sum(_gemm_s(table, g, dtype) for g in gemms)
    backward = sum(_gemm_s(table, b, dtype) for g in gemms for b in g.backward())
    return forward, backward, sum(g.flops for g in gemms), sum(g.backward_flops for g in gemms)


def _attention(table: ComputeTable, a: Attention, dtype: DType) -> tuple[float, float, float, float]:
    """Forward and backward seconds of the attention core's products (fused: the kernel), its forward's
    executed FLOPs and its backward's."""
    if a.fused:
        forward_rate, backward_rate = table.attention_rates(
            a.batch, a.heads, a.seq_q, a.seq_kv, max(a.qk_dim, a.v_dim), a.causal, dtype
        )
        flops = a.forward_flops
        return (
            flops / forward_rate,
            FLASH_BACKWARD_FLOPS * flops / backward_rate,
            flops,
            FLASH_BACKWARD_FLOPS * flops,
        )
    return _gemms(table, a.products(), dtype)


class _Layer(NamedTuple):
    forward: PassTime
    backward: PassTime
    core: PassTime
    """The attention core's forward: what selective recomputation re-runs."""
    op_rerun: PassTime
    """What op-level selective checkpointing re-runs: the GEMMs it does not save, the element-wise work."""
    forward_flops: float
    backward_flops: float
    core_flops: float
    op_rerun_flops: float


_LAYERS: IdentityCache[_Layer] = IdentityCache()


def _layer(table: ComputeTable, layer: LayerOps, dtype: DType) -> _Layer:
    """One layer's times at the table's rates, once per (table, the layer's operations, dtype): a plan's
    stages, micro-batches and recomputes run the same layers (the table, a frozen model holding lists,
    keyed by identity)."""
    key = (layer.gemms, layer.attention, layer.traffic, layer.core_traffic, layer.backward_runs, dtype)
    cached = _LAYERS.get(table, key)
    if cached is None:
        cached = _LAYERS.put(table, key, _layer_times(table, layer, dtype))
    return cached


def _layer_times(table: ComputeTable, layer: LayerOps, dtype: DType) -> _Layer:
    matmul_f, matmul_b, matmul_flops_f, matmul_flops_b = _gemms(table, layer.gemms, dtype)
    attention_f, attention_b, core_f, core_b = _attention(table, layer.attention, dtype)
    elementwise_f = sum(_traffic_s(table, t) for t in layer.traffic)
    elementwise_b = sum(_traffic_s(table, t, backward=True) for t in layer.traffic)
    scores_f = sum(_traffic_s(table, t) for t in layer.core_traffic)
    scores_b = sum(_traffic_s(table, t, backward=True) for t in layer.core_traffic)
    rerun = tuple(g for g in layer.gemms if op_sac_recomputes(g.name))
    forward = PassTime(matmul_f, attention_f, elementwise_f + scores_f)
    forward_flops = matmul_flops_f + core_f
    if not layer.backward_runs:  # no backward, nothing recomputed for it
        return _Layer(forward, PassTime(), PassTime(), PassTime(), forward_flops, 0.0, 0.0, 0.0)
    return _Layer(
        forward=forward,
        backward=PassTime(matmul_b, attention_b, elementwise_b + scores_b),
        core=PassTime(0.0, attention_f, scores_f),
        op_rerun=PassTime(sum(_gemm_s(table, g, dtype) for g in rerun), 0.0, elementwise_f + scores_f),
        forward_flops=forward_flops,
        backward_flops=matmul_flops_b + core_b,
        core_flops=core_f,
        op_rerun_flops=sum(g.flops for g in rerun),
    )


def micro_batch_time(
    table: ComputeTable, ops: MicroBatchOps, recompute: Recompute, checkpoint_every: int = 1
) -> MicroBatchTime:
    """One micro-batch's forward, backward and recomputation on one rank (``checkpoint_every``: under full
    recompute, the layers N, 2N, … of the rank, counted in each group of alike layers: a dense model's
    one group)."""
    dtype = ops.dtype
    forward, backward, rerun = PassTime(), PassTime(), PassTime()
    flops = 0.0
    for layer in ops.layers:
        t, n = _layer(table, layer, dtype), layer.layers
        forward += t.forward.times(n)
        backward += t.backward.times(n)
        flops += (t.forward_flops + t.backward_flops) * n
        if not layer.backward_runs:
            continue
        if recompute is Recompute.FULL:
            checkpointed = n // checkpoint_every
            rerun += t.forward.times(checkpointed)
            flops += t.forward_flops * checkpointed
        elif recompute is Recompute.SELECTIVE and not layer.attention.fused:
            rerun += t.core.times(n)
            flops += t.core_flops * n
        elif recompute is Recompute.OP:
            rerun += t.op_rerun.times(n)
            flops += t.op_rerun_flops * n
    head_forward, head_backward, head_flops = _outside(table, ops, dtype)
    return MicroBatchTime(forward + head_forward, backward + head_backward, rerun, flops + head_flops)


_OUTSIDE: IdentityCache[tuple[PassTime, PassTime, float]] = IdentityCache()


def _outside(table: ComputeTable, ops: MicroBatchOps, dtype: DType) -> tuple[PassTime, PassTime, float]:
    """The forward and backward of what runs outside the layers (the embedding, the head, the loss) and
    their executed FLOPs, once per (table, those operations, dtype): the same under every recompute."""
    key = (ops.outside_gemms, ops.outside_traffic, dtype)
    cached = _OUTSIDE.get(table, key)
    if cached is None:
        head_f, head_b, head_flops_f, head_flops_b = _gemms(table, ops.outside_gemms, dtype)
        forward = PassTime(head_f, 0.0, sum(_traffic_s(table, t) for t in ops.outside_traffic))
        backward = PassTime(
            head_b, 0.0, sum(_traffic_s(table, t, backward=True) for t in ops.outside_traffic)
        )
        cached = _OUTSIDE.put(table, key, (forward, backward, head_flops_f + head_flops_b))
    return cached


def step_compute(
    table: ComputeTable,
    micro_batch: MicroBatchTime,
    grad_accum: int,
    optimizer_params: int,
    optimizer_bytes_per_param: int,
    largest_tensor_params: int,
) -> ComputeTime:
    """A step of ``grad_accum`` micro-batches and one optimizer step over ``optimizer_params`` parameters
    (at the bandwidth of one tensor of ``largest_tensor_params``' traffic)."""
    forward = micro_batch.forward.times(grad_accum)
    backward = micro_batch.backward.times(grad_accum)
    rerun = micro_batch.recompute.times(grad_accum)
    traffic = optimizer_params * optimizer_bytes_per_param
    size = max(1, largest_tensor_params * optimizer_bytes_per_param)
    optimizer = traffic / table.bandwidth(size) if traffic else 0.0
    every = forward + backward + rerun
    return ComputeTime(
        forward_s=forward.total,
        backward_s=backward.total + rerun.total,
        recompute_s=rerun.total,
        optimizer_s=optimizer,
        by_class={
            OpClass.MATMUL: every.matmul,
            OpClass.ATTENTION: every.attention,
            OpClass.ELEMENTWISE: every.elementwise,
            OpClass.OPTIMIZER: optimizer,
        },
        flops=micro_batch.flops * grad_accum,
    )


def layer_gemm_times(table: ComputeTable, ops: MicroBatchOps) -> dict[str, tuple[float, float, float]]:
    """Each layer GEMM's forward, input-gradient and weight-gradient seconds in one micro-batch, by the
    GEMM's name, summed over the rank's layers (what a schedule pairs a collective with: Transformer
    Engine's userbuffers overlap each of a layer's TP collectives with one of its GEMMs)."""
    times: dict[str, tuple[float, float, float]] = {}
    for layer in ops.layers:
        n = layer.layers
        for gemm in layer.gemms:
            dgrad, wgrad = gemm.backward()
            seconds = (_gemm_s(table, gemm, ops.dtype), _gemm_s(table, dgrad, ops.dtype),
                       _gemm_s(table, wgrad, ops.dtype))  # fmt: skip
            before = times.get(gemm.name, (0.0, 0.0, 0.0))
            times[gemm.name] = tuple(b + n * s for b, s in zip(before, seconds, strict=True))  # type: ignore[assignment]
    return times
