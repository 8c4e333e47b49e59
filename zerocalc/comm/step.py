"""The step time of one configuration (pure): compute from the hardware, communication with the overlap
each framework achieves, the pipeline bubble and offload.

**Compute** is :mod:`zerocalc.compute`'s: every operation one rank runs, at its per-rank shape, at the
rate the GPU's compute table gives that shape (a ``zerocalc bench --compute`` table, else the GPU
preset's), by class (matmul, attention, element-wise, optimizer), recomputation included.

**Data-parallel communication**: each collective's time is ``comm``'s (α per call + bytes / β, the
calibration's fit or the preset's bandwidths). Overlap, per phase and micro-batch, is the two-stream
schedule of :mod:`zerocalc.comm.overlap`: the phase's units (one per call of its collectives) on the
compute stream, their collectives on one communication stream, all-gathers needed before their unit
and prefetched one unit ahead, reductions issued after theirs; exposed is what the compute does not
cover (the first all-gather, the last reduction, each unit's collective beyond its compute; a single
bucket, Megatron-LM's without ``--overlap-grad-reduce``, wholly exposed). Which phases overlap:

* forward all-gathers hide behind forward compute when the next unit is prefetched (FSDP's all-gather
  stream, Zhao et al. 2023 §3.3 / §5.1 "implicit prefetching"; DeepSpeed ZeRO-3's prefetch; the paper's
  ``--prefetch`` ≥ 1, ZeRO paper §7.2.2); with ``--prefetch 0`` they are exposed;
* backward all-gathers, reduce-scatters and DDP's bucketed all-reduces hide behind backward compute
  (Zhao et al. 2023 §3.3; Li et al. 2020, PyTorch DDP, §3.2.3) — except DeepSpeed ZeRO-1/2, whose
  ``overlap_comm`` defaults to false (DeepSpeed config docs): their reductions are exposed;
* collectives after ``optimizer.step()`` (ZeRO-1/2 parameter all-gathers, ZeroRedundancyOptimizer's
  broadcasts) are exposed, but for Megatron-LM's ``--overlap-param-gather``, which runs them bucket by
  bucket in the next forward (:func:`after_step_exposed`); Megatron-LM's single gradient bucket is
  exposed after backward, its ``--overlap-grad-reduce`` buckets hide behind it.

A collective that runs once per step when A > 1 (gradients reduced on the last micro-batch) joins that
micro-batch's units and hides only behind its compute.

**Tensor- and context-parallel communication**: tensor-parallel collectives sit on the critical path
between a layer's GEMMs (Megatron-LM without its ``tp_comm_overlap`` option, DTensor plans without async TP:
Narayanan et al. 2021 §3.3, Korthikanti et al. 2022 §4.2.2), exposed; with ``--tp-comm-overlap`` each
layer's collective runs beside the GEMM Transformer Engine's userbuffers pair it with
(:func:`~zerocalc.comm.overlap.userbuffers_exposed`), the GEMMs beside its SM-taking kernels slower;
with ``--async-tp`` (torchtitan's, torch's micro-pipelined TP) each all-gather and reduce-scatter runs in
t pieces beside the matmul it feeds or follows (:func:`~zerocalc.comm.overlap.async_tp_exposed`);
a context-parallel ring's point-to-point exchanges run beside the attention blocks they feed
(Transformer Engine ``AttnFuncWithCPAndKVP2P``; torch ``context_parallel``'s ring), hidden behind that
phase's attention compute; its all-gathers and all-to-alls precede the attention that waits for them, exposed.

**Expert parallelism**: the dispatch and combine all-to-alls of each MoE layer sit between the router
and the experts and between the experts and the layer's output, exposed (Megatron-LM's
``MoEAlltoAllTokenDispatcher`` without ``overlap_moe_expert_parallel_comm``, its default; torchtitan's
all-to-all dispatch).

**Pipeline**: the busiest pipeline rank's sends, exposed (Megatron-LM overlaps them with compute only under
interleaving, ``overlap_p2p_comm``); the bubble, the schedule's fraction of the slowest stage's compute
(:func:`~zerocalc.parallel.pipeline.bubble_fraction`: Narayanan et al. 2021 §2.2, Qi et al. 2023 §3.1),
which is the stage the step waits for.

**Offload** (DeepSpeed ZeRO-Offload / ZeRO-Infinity; Megatron-Core's optimizer CPU offload), not
overlapped (an upper bound; both overlap part): gradients to the host (Megatron-Core copies its fp32 main
gradients, ``HybridDeviceOptimizer._set_sub_optimizer_grads``) and updated 16-bit parameters back over
PCIe (a cross-device ``copy_`` casts on the host first), the CPU Adam step bound by
host memory bandwidth (in place of the GPU's optimizer step, which does not run), NVMe reads and writes
of the optimizer states, and offloaded parameters fetched twice per micro-batch (forward and backward).
The constants below are stated assumptions, not measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.memo import IdentityCache
from zerocalc.base.parts import UNCACHED, Part, Parts
from zerocalc.comm.collectives import (
    CollectiveRun,
    CommLine,
    collective_runs,
    comm_lines,
    comm_of_lines,
    data_parts,
    mesh_request,
)
from zerocalc.comm.mesh import Dimension, MeshCollectiveCost, MeshRequest, MeshTime, Scope, mesh_times
from zerocalc.comm.overlap import TeGemms, async_tp_exposed, calls_in, uniform_exposed, userbuffers_exposed
from zerocalc.comm.pipeline import PipelineComm, pipeline_comm
from zerocalc.compute.finetune import FineTuneOps, finetune_ops, matmul_split
from zerocalc.compute.ops import (
    MFU_FORMULA,
    Kernels,
    MicroBatchOps,
    OpClass,
    micro_batch_ops,
    model_flops_per_token,
    optimizer_bytes_per_param,
)
from zerocalc.compute.table import ComputeTable
from zerocalc.compute.time import (
    ComputeTime,
    MicroBatchTime,
    layer_gemm_times,
    micro_batch_time,
    step_compute,
)
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import Architecture, PipelineStage, stage_kind
from zerocalc.model.code import MODEL_CODES, ModelImplName, Shape
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import GradSync, Phase
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.framework_records import FRAMEWORKS, effective_grad_sync
from zerocalc.parallel.framework_records.deepspeed import OVERLAP_COMM_STRATEGIES
from zerocalc.parallel.frameworks import Framework, TorchWrapper
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, StrategyName
from zerocalc.request.checks import flash_attention_used
from zerocalc.request.model_spec import ModelSpec
from zerocalc.request.training import TrainingRequest

PCIE_BPS = 25e9
"""Host ↔ GPU bytes/s per GPU: PCIe 4.0 ×16 achieves about 25 GB/s of its 32 GB/s (an assumption; PCIe 5.0
hosts reach about twice that)."""
NVME_BPS = 3.5e9
"""NVMe bytes/s per GPU: one PCIe 4.0 NVMe drive per GPU (ZeRO-Infinity, Rajbhandari et al. 2021, assumes
tens of GB/s per node from several drives); an assumption."""
HOST_MEMORY_BPS = 100e9
"""Host DRAM bytes/s per node available to the CPU optimizer (an assumption: two sockets of DDR4/DDR5)."""
CPU_ADAM_BYTES_PER_PARAM = 30
"""CPU Adam is memory-bound (ZeRO-Offload, Ren et al. 2021, §4.2 CPU-Adam): it reads the fp32 parameter,
gradient and two moments (16 B) and writes the parameter, the moments (12 B) and the 16-bit copy (2 B)."""


def overlaps_backward(framework: Framework, strategy: StrategyName) -> bool:
    """Whether the strategy's backward collectives run beside backward's compute (its set-up says)."""
    return FRAMEWORKS[framework].setup(strategy).overlaps_backward


class PhaseComm(NamedTuple):
    """One phase's communication at one A, as its exposed time reads it."""

    spread: float
    """Comm of the collectives that run on every micro-batch, spread evenly over the A micro-batches."""
    once: float
    """Comm of the collectives that run on the last micro-batch only."""
    call_spread: float
    """One call of each spread collective."""
    call_once: float
    """One call of each last-only collective."""


def exposed_time(phase: PhaseComm, compute: float, accum: int, hides: bool, needed: bool = False) -> float:
    """Exposed time of one phase over A micro-batches: each micro-batch's collectives, one unit's per call,
    on the communication stream beside its compute (:func:`~zerocalc.comm.overlap.uniform_exposed`:
    ``needed`` before each unit, all-gathers, else issued after it, reductions); the last-only
    collectives join the last micro-batch's units. ``hides`` False: all of it exposed."""
    spread, once, call_spread, call_once = phase
    if not hides:
        return spread + once
    per, comm = compute / accum, spread / accum
    units = calls_in(comm, call_spread)
    each = uniform_exposed(per, comm, units, needed) if comm else 0.0
    last = uniform_exposed(per, comm + once, max(units, calls_in(once, call_once)), needed)
    return (accum - 1) * each + last


def after_step_exposed(phase: PhaseComm, first_forward: float, in_forward: bool) -> float:
    """Exposed seconds of the collectives after ``optimizer.step()``: all of them, or, when the framework
    defers them into the next step's first forward (Megatron-LM ``--overlap-param-gather``: each bucket's
    all-gather waited for by its first module's pre-hook, the next bucket's dispatched then), the
    buckets' all-gathers needed before the forward of ``first_forward`` seconds, each prefetched one
    bucket ahead (:func:`~zerocalc.comm.overlap.uniform_exposed`: the first bucket's exposed)."""
    comm = phase.spread + phase.once
    if not in_forward or not comm:
        return comm
    call = phase.call_once or phase.call_spread
    return uniform_exposed(first_forward, comm, calls_in(comm, call), needed=True)


def offload_seconds(
    params: int,
    world: int,
    gpus_per_node: int,
    optimizer_shards: int,
    offload_optimizer: OffloadTarget,
    offload_params: OffloadTarget,
    grad_accum: int,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> float:
    """Offload time per step per GPU (see the module's doc for what moves and the assumed rates): ``params``
    the GPU's (its rank's share under tensor and pipeline parallelism), sharded over ``optimizer_shards``
    ranks; every GPU of a node steps its shard on the node's host, whose memory bandwidth they share."""
    seconds = 0.0
    if offload_optimizer is not OffloadTarget.NONE:
        owned = params / optimizer_shards
        seconds += owned * (grad_bytes + param_bytes) / PCIE_BPS
        seconds += owned * gpus_per_node * CPU_ADAM_BYTES_PER_PARAM / HOST_MEMORY_BPS
        if offload_optimizer is OffloadTarget.NVME:
            seconds += 2 * owned * 12 / NVME_BPS  # fp32 parameter and moments read and written
    if offload_params is not OffloadTarget.NONE:
        rate = PCIE_BPS if offload_params is OffloadTarget.CPU else NVME_BPS
        seconds += grad_accum * 2 * (params / world) * param_bytes / rate
    return seconds


_PHASES = tuple(Phase)
"""The phases, in order (iterating the enum itself costs more than the sums)."""


class CommTime(NamedTuple):
    """A schedule's data-parallel communication at one A, as the step time reads it."""

    time_s: float
    """comm's ``time_s``: every collective's, summed in order."""
    forward: PhaseComm
    backward: PhaseComm
    after_step: PhaseComm


def comm_time(
    collectives: list[tuple[Phase, int, int, float]], accum: int, time_s: float | None = None
) -> CommTime:
    """The collectives' (phase, times per step, calls per step, time_s) summed per phase, and their total
    (``time_s``, when comm's is at hand)."""
    sums = {phase: [0.0, 0.0, 0.0, 0.0] for phase in _PHASES}
    total = 0  # as sum() starts
    for phase, times, calls, seconds in collectives:
        once = accum > 1 and times == 1
        phase_sums = sums[phase]
        phase_sums[1 if once else 0] += seconds
        phase_sums[3 if once else 2] += seconds / calls if calls else 0.0
        total += seconds
    return CommTime(
        total if time_s is None else time_s,
        PhaseComm(*sums[Phase.FORWARD]),
        PhaseComm(*sums[Phase.BACKWARD]),
        PhaseComm(*sums[Phase.AFTER_STEP]),
    )


class StepTime(NamedTuple):
    """One GPU's step: its compute by class, its exposed communication by dimension, the bubble and
    offload."""

    compute_s: float
    matmul_s: float
    attention_s: float
    elementwise_s: float
    optimizer_s: float
    recompute_s: float
    """Of compute_s: what recomputation re-runs."""
    comm_s: float
    """Every collective's time (comm's time_s), hidden or not."""
    exposed_comm_s: float
    exposed_dp_s: float
    exposed_tp_s: float
    exposed_cp_s: float
    exposed_ep_s: float
    exposed_pp_s: float
    bubble_s: float
    offload_s: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    """Model FLOPs per second over the GPU's dense peak (:data:`~zerocalc.compute.ops.MFU_FORMULA`)."""


MESH_DIMENSIONS = (Dimension.TP, Dimension.CP, Dimension.EP, Dimension.PP)
"""The model-parallel dimensions whose exposed communication a step adds to the data-parallel one."""


class Userbuffers(NamedTuple):
    """What Megatron-LM ``--tp-comm-overlap`` hides the layers' TP collectives behind."""

    gemms: TeGemms
    """One micro-batch's GEMMs of each userbuffer layer, summed over the rank's layers."""
    tp: int
    sms: int | None
    """The GPU's SMs (the userbuffer kernels take :data:`~zerocalc.comm.overlap.TE_COMM_SMS` of them)."""
    micro_batches: int
    async_tp: bool = False
    """torchtitan's async TP (:func:`~zerocalc.comm.overlap.async_tp_exposed`), not Megatron-LM's
    userbuffers."""


def mesh_exposed(
    costs: Sequence[MeshCollectiveCost | MeshTime],
    attention_forward: float,
    attention_backward: float,
    userbuffers: Userbuffers | None = None,
) -> dict[Dimension, float]:
    """Exposed seconds of the tensor- and context-parallel collectives (see the module's doc); with
    ``userbuffers``, each layer's TP collectives beside its GEMMs
    (:func:`~zerocalc.comm.overlap.userbuffers_exposed`)."""
    exposed = dict.fromkeys(MESH_DIMENSIONS, 0.0)
    ring = {Phase.FORWARD: 0.0, Phase.BACKWARD: 0.0}
    layer_tp = {Phase.FORWARD: 0.0, Phase.BACKWARD: 0.0}
    for cost in costs:
        if cost.dimension is Dimension.CP and cost.op is Collective.SEND_RECV and cost.phase in ring:
            ring[cost.phase] += cost.time_s
        elif (
            userbuffers is not None
            and cost.dimension is Dimension.TP
            and cost.scope is Scope.LAYER
            and cost.phase in layer_tp
        ):
            layer_tp[cost.phase] += cost.time_s
        else:  # the dispatcher's expert-tensor-parallel collectives count with its all-to-alls
            exposed[Dimension.EP if cost.dimension is Dimension.ETP else cost.dimension] += cost.time_s
    if userbuffers is not None and layer_tp[Phase.BACKWARD]:
        gemms, tp, sms, accum, asynchronous = userbuffers
        backward_calls = 4 if asynchronous else 6  # DTensor's plan: no re-gather for the weight gradient
        each = layer_tp[Phase.BACKWARD] / (backward_calls * accum)  # one collective, over the layers
        forward_runs = layer_tp[Phase.FORWARD] / (4 * each * accum)  # 1, more with recomputation
        if asynchronous:
            forward, backward = async_tp_exposed(gemms, each, tp)
        else:
            forward, backward = userbuffers_exposed(gemms, each, tp, sms)
        exposed[Dimension.TP] += accum * (forward_runs * forward + backward)
    exposed[Dimension.CP] += max(0.0, ring[Phase.FORWARD] - attention_forward)
    exposed[Dimension.CP] += max(0.0, ring[Phase.BACKWARD] - attention_backward)
    return exposed


def assemble(
    compute: ComputeTime,
    attention_forward: float,
    comm: CommTime,
    mesh: dict[Dimension, float],
    mesh_comm_s: float,
    tokens_per_gpu: int,
    grad_accum: int,
    hides_forward: bool,
    hides_backward: bool,
    offload_s: float,
    bubble_fraction: float,
    model_flops_per_token: float,
    peak_flops: float | None,
    gathers_in_forward: bool = False,
) -> StepTime:
    """Compute + exposed communication + bubble + offload, for one GPU's share of the step
    (``gathers_in_forward``: :func:`after_step_exposed`)."""
    forward, backward = compute.forward_s, compute.backward_s
    dp = exposed_time(comm.forward, forward, grad_accum, hides_forward, needed=True)
    dp += exposed_time(comm.backward, backward, grad_accum, hides_backward)
    dp += after_step_exposed(comm.after_step, forward / grad_accum, gathers_in_forward)
    bubble = bubble_fraction * (forward + backward)
    exposed = dp + sum(mesh[dimension] for dimension in MESH_DIMENSIONS)
    step = compute.total_s + exposed + bubble + offload_s
    by_class = compute.by_class
    flops = tokens_per_gpu * model_flops_per_token
    return StepTime(
        compute_s=compute.total_s,
        matmul_s=by_class[OpClass.MATMUL],
        attention_s=by_class[OpClass.ATTENTION],
        elementwise_s=by_class[OpClass.ELEMENTWISE],
        optimizer_s=by_class[OpClass.OPTIMIZER],
        recompute_s=compute.recompute_s,
        comm_s=comm.time_s + mesh_comm_s,
        exposed_comm_s=exposed,
        exposed_dp_s=dp,
        exposed_tp_s=mesh[Dimension.TP],
        exposed_cp_s=mesh[Dimension.CP],
        exposed_ep_s=mesh[Dimension.EP],
        exposed_pp_s=mesh[Dimension.PP],
        bubble_s=bubble,
        offload_s=offload_s,
        step_s=step,
        tokens_per_s_per_gpu=tokens_per_gpu / step,
        mfu=flops / (step * peak_flops) if peak_flops else None,
    )


# ------------------------------------------------------------------------------------ from a request
def kernels(request: TrainingRequest) -> Kernels:
    """Megatron-LM's fused kernels, else eager PyTorch ops (transformers, torchtitan), or Inductor's under
    ``--compile`` (:mod:`zerocalc.model.code.compiled`): torchtitan compiles each block (its rotary a
    complex product Inductor leaves eager) and, with ``loss``, the loss; transformers the whole forward,
    the final norm and the loss with it."""
    compiled = request.activations.compile
    whole = request.model_code is ModelImplName.HF and compiled.model
    return Kernels(
        fused=MODEL_CODES[request.model_code].fused_kernels,
        flash=flash_attention_used(request),
        compiled=compiled.model,
        compiled_head=whole,
        compiled_loss=compiled.loss or whole,
        complex_rotary=request.model_code is ModelImplName.TORCHTITAN,
    )


def request_ops(request: TrainingRequest, arch: Architecture | None = None) -> MicroBatchOps:
    """What one rank of the request's mesh runs for one micro-batch (``arch``: a pipeline stage's share;
    the rank's architecture by default)."""
    dtype = request.activation_dtype
    shape = request.rank_shape._replace(capacity_factor=request.activations.capacity_factor)
    arch = arch or request.architecture
    return _micro_batch_ops(
        arch,
        shape,
        kernels(request),
        dtype,
        request.mesh.ep,
        request_tuning(request, arch),
        request.fp8,
    )


def request_tuning(request: TrainingRequest, arch: Architecture) -> FineTuneOps | None:
    """The fine-tuning's changes to the operations (:mod:`zerocalc.compute.finetune`), in the precision
    record's dtypes (:attr:`~zerocalc.request.training.TrainingRequest.adapter_op_dtypes`: the adapters'
    GEMM input, and their weight as the forward sees it); None: full training."""
    finetune, dtypes = request.finetune, request.adapter_op_dtypes
    if finetune is None or dtypes is None:
        return None
    input_grad = finetune.kbit_prepared or request.activations.recompute is not Recompute.NONE
    return finetune_ops(
        arch,
        finetune,
        input_grad,
        dtypes.gemm_input,
        dtypes.weight_seen,
        request.activation_dtype,
        dtypes.base_compute,
    )


@lru_cache(maxsize=1024)
def _micro_batch_ops(
    arch: Architecture,
    shape: Shape,
    code: Kernels,
    dtype: DType,
    ep: int,
    tuning: FineTuneOps | None = None,
    fp8: Fp8Setting = NO_FP8,
) -> MicroBatchOps:
    """:func:`~zerocalc.compute.ops.micro_batch_ops`, once per (architecture, shape, kernels, dtype, ep,
    fine-tuning, FP8 recipe): a plan prices many candidates of one mesh and micro-batch (their strategies
    and accumulations differ)."""
    return micro_batch_ops(arch, shape, code, dtype, ep=ep, tuning=tuning, fp8=fp8)


_MICRO_TIMES: IdentityCache[MicroBatchTime] = IdentityCache()


def _micro_batch_time(
    table: ComputeTable, ops: MicroBatchOps, recompute: Recompute, checkpoint_every: int = 1
) -> MicroBatchTime:
    """:func:`~zerocalc.compute.time.micro_batch_time`, once per (table, operations, recompute, the layers
    it checkpoints); the table, a frozen model holding lists, keyed by identity."""
    key = (ops, recompute, checkpoint_every)
    time = _MICRO_TIMES.get(table, key)
    if time is None:
        time = _MICRO_TIMES.put(table, key, micro_batch_time(table, ops, recompute, checkpoint_every))
    return time


def optimizer_traffic(
    request: TrainingRequest, strategy: StrategyName, stage: ModelSpec | None = None
) -> tuple[int, int, int]:
    """(parameters the rank's optimizer updates on the GPU, bytes per parameter, parameters of its largest
    tensor), for the rank's model or a pipeline stage's. None on the GPU when the optimizer is offloaded:
    ZeRO-Offload's CPU Adam updates them on the host (:func:`offload_seconds` prices it)."""
    if request.finetune is not None:
        return finetune_optimizer_traffic(request, strategy)
    shards = request.cluster.group_size(STRATEGIES[strategy].optimizer)
    model = stage or request.rank_model
    count = model.parameter_count
    largest = count.largest_layer_params if count is not None else model.params
    dtypes = request.recipe_dtypes  # the optimizer's roles: not the reduction
    grad = dtypes.master or dtypes.main_gradient
    assert grad is not None  # trained parameters
    impl = request.framework_record.optimizer_impl(request.optimizer_impl)
    per = optimizer_bytes_per_param(request.optimizer, impl, dtypes, grad)
    on_gpu = 0 if request.offload_optimizer is not OffloadTarget.NONE else model.params // shards
    return on_gpu, per, max(1, largest // shards)


def fsdp2_traffic(
    request: TrainingRequest,
    strategy: StrategyName,
    table: ComputeTable,
    stage: ModelSpec | None = None,
    grad_accum: int | None = None,
) -> tuple[float, float]:
    """FSDP2's own element-wise kernels per step, forward and backward seconds (0 for other frameworks).
    Per all-gather (torch ``distributed/fsdp/_fully_shard/_fsdp_param.py`` ``all_gather_inputs``,
    ``_fsdp_collectives.py`` ``foreach_all_gather``, ``foreach_all_gather_copy_out``): the shard cast to the
    compute dtype and copied into the all-gather buffer, and the gathered parameters split back out
    (``split_with_sizes_copy``: read and written, P·2·b_p); per reduce-scatter (``foreach_reduce``): the
    unsharded gradients copied into the reduce buffer in the reduce dtype (``_chunk_cat``: P·(b_g + b_r))."""
    setup = request.framework_record.torch_setup(strategy)
    if setup is None or setup.wrapper is not TorchWrapper.FSDP2:
        return 0.0, 0.0
    gathers = 2 if setup.reshard_after_forward else 1  # forward, and backward after resharding
    dtypes = request.dtypes.trained
    model = stage or request.rank_model
    params = model.params
    shard = params / request.cluster.group_size(STRATEGIES[strategy].optimizer)
    p, master = dtypes.compute.bytes, dtypes.stored.bytes
    reduce = dtypes.reduce.bytes
    gather = shard * (master + 3 * p) + params * 2 * p
    reduced = params
    if request.finetune is not None:  # the trained tensors' gradients only (zerocalc.comm.finetune)
        from zerocalc.parallel.finetune import finetune_counts

        reduced = finetune_counts(request.architecture, request.finetune).trainable
    scatter = reduced * (dtypes.gradient.bytes + reduce)
    count = model.parameter_count
    unit = max(1, count.largest_block_params if count is not None else params)
    accum = grad_accum or request.grad_accum
    sync = effective_grad_sync(request.framework, strategy, request.grad_sync, pipelined=request.mesh.pp > 1)
    reductions = accum if sync is GradSync.EVERY else 1
    forward = accum * gather / table.bandwidth(unit * 2 * p)
    backward = ((gathers - 1) * accum * gather + reductions * scatter) / table.bandwidth(unit * 2 * p)
    return forward, backward


def request_compute(
    request: TrainingRequest, table: ComputeTable, strategy: StrategyName
) -> tuple[ComputeTime, float]:
    """One rank's compute in a step of the request (A micro-batches), and its attention's forward seconds:
    with pipeline stages, the slowest stage's (its layers, and the embedding or the head it holds)."""
    return slowest_stage(request, table, strategy, stage_computes(request, table, strategy))


class StageCompute(NamedTuple):
    """One pipeline stage's (or the rank's) compute in a step before the framework's own kernels."""

    compute: ComputeTime
    attention_forward_s: float
    """Its attention's forward seconds over the A micro-batches."""
    stage: ModelSpec | None
    """The stage's model; None: the rank's whole model (no pipeline)."""


def stage_micro_batches(
    request: TrainingRequest, table: ComputeTable
) -> list[tuple[MicroBatchTime, ModelSpec | None]]:
    """Each kind of stage's micro-batch (the rank's, without pipeline stages) and the stage's model (None:
    the rank's), the first stage of each kind (:func:`~zerocalc.model.architecture.stage_kind`: the others
    run the same): the same for every strategy, accumulation, reduce dtype and offload of a mesh."""
    kinds: dict[tuple, tuple[PipelineStage, ModelSpec]] = {}
    for stage in request.stages:
        assert isinstance(stage.architecture, PipelineStage)
        kinds.setdefault(stage_kind(stage.architecture), (stage.architecture, stage))
    stages: list[tuple[Architecture | None, ModelSpec | None]] = list(kinds.values()) or [(None, None)]
    activations = request.activations
    return [
        (
            _micro_batch_time(
                table, request_ops(request, arch), activations.recompute, activations.checkpoint_every
            ),
            stage,
        )
        for arch, stage in stages
    ]


def stage_computes(
    request: TrainingRequest,
    table: ComputeTable,
    strategy: StrategyName,
    micro_batches: list[tuple[MicroBatchTime, ModelSpec | None]] | None = None,
) -> list[StageCompute]:
    """Each stage's compute in a step (the rank's, without pipeline stages): its micro-batches
    (:func:`stage_micro_batches`, given or computed) and the optimizer step over the parameters the rank's
    optimizer updates on the GPU. The same for every reduce dtype and grad sync (only the framework's
    kernels, :func:`fsdp2_traffic`, read them)."""
    computes = []
    accum = request.grad_accum
    for micro, stage in micro_batches or stage_micro_batches(request, table):
        params, per, largest = optimizer_traffic(request, strategy, stage)
        compute = step_compute(table, micro, accum, params, per, largest)
        computes.append(StageCompute(compute, micro.forward.attention * accum, stage))
    return computes


def slowest_stage(
    request: TrainingRequest,
    table: ComputeTable,
    strategy: StrategyName,
    computes: list[StageCompute],
    grad_accum: int | None = None,
) -> tuple[ComputeTime, float]:
    """The stage the step waits for, the framework's own kernels (:func:`fsdp2_traffic`) added to each
    stage: its compute and its attention's forward seconds (``grad_accum``: A, else the request's)."""
    best: tuple[ComputeTime, float] | None = None
    for compute, attention_forward, stage in computes:
        compute = with_framework_traffic(compute, fsdp2_traffic(request, strategy, table, stage, grad_accum))
        if best is None or compute.total_s > best[0].total_s:
            best = (compute, attention_forward)
    assert best is not None
    return best


def with_framework_traffic(compute: ComputeTime, traffic: tuple[float, float]) -> ComputeTime:
    """The compute with the framework's own element-wise seconds (forward, backward) added."""
    forward, backward = traffic
    if not forward and not backward:
        return compute
    by_class = dict(compute.by_class)
    by_class[OpClass.ELEMENTWISE] += forward + backward
    return compute._replace(
        forward_s=compute.forward_s + forward, backward_s=compute.backward_s + backward, by_class=by_class
    )


def finetune_offload_seconds(request: TrainingRequest, strategy: StrategyName, grad_accum: int) -> float:
    """FSDP's CPU offload in a fine-tuning run (:func:`~zerocalc.comm.finetune.offload_copies`), not
    overlapped (as :func:`offload_seconds`): per micro-batch every unit's parameter shards copied to the GPU
    for each all-gather (forward, and backward's re-gather where the strategy reshards after forward) and
    the trained gradient shards back after each reduction, over PCIe (:data:`PCIE_BPS`); once per step the
    optimizer's step over the trained shards on the host, bound by host memory bandwidth shared by the
    node's GPUs (:data:`HOST_MEMORY_BPS`), at the bytes per parameter of the GPU's step
    (:func:`optimizer_traffic`, which then runs nothing on the GPU)."""
    from zerocalc.comm.finetune import offload_copies
    from zerocalc.parallel.finetune import parameter_kinds
    from zerocalc.states.memory import finetune_dtypes

    finetune = request.finetune
    assert finetune is not None
    arch = request.architecture
    kinds = dict.fromkeys(k.kind for k in parameter_kinds(arch, finetune))
    dtypes = {kind: finetune_dtypes(request, kind) for kind in kinds}
    shards = request.cluster.group_size(STRATEGIES[strategy].optimizer)
    copies = offload_copies(
        arch,
        finetune,
        shards,
        tuple((kind, d.stored) for kind, d in dtypes.items()),
        tuple((kind, d.reduce) for kind, d in dtypes.items()),
    )
    setup = request.framework_record.torch_setup(strategy)
    gathers = 2 if setup is None or setup.reshard_after_forward else 1
    sync = effective_grad_sync(request.framework, strategy, request.grad_sync, pipelined=False)
    reductions = grad_accum if sync is GradSync.EVERY else 1
    copied = grad_accum * gathers * copies.h2d_per_gather + reductions * copies.d2h_per_reduction
    trained, per, _ = finetune_optimizer_traffic(request, strategy, on_host=True)
    host = trained * per * request.mesh.gpus_per_node / HOST_MEMORY_BPS
    return copied / PCIE_BPS + host


def finetune_optimizer_traffic(
    request: TrainingRequest, strategy: StrategyName, on_host: bool = False
) -> tuple[int, int, int]:
    """:func:`optimizer_traffic` of a fine-tuning run: the optimizer steps the trained tensors only
    (adapters, copies, unfrozen parameters: :func:`~zerocalc.parallel.finetune.finetune_counts`), in their
    kind's dtypes (PEFT's adapters, else the trainable kind's); on the host under FSDP's CPU offload
    (``on_host``: the parameters it updates there; else 0 on the GPU)."""
    from zerocalc.parallel.finetune import TRAINED_KINDS, finetune_counts, parameter_kinds
    from zerocalc.parallel.precision import ParamKind
    from zerocalc.states.memory import finetune_dtypes

    finetune = request.finetune
    assert finetune is not None
    arch = request.architecture
    kinded = parameter_kinds(arch, finetune)
    kind = ParamKind.ADAPTER if any(k.kind is ParamKind.ADAPTER for k in kinded) else ParamKind.TRAINABLE
    dtypes = finetune_dtypes(request, kind).trained
    grad = dtypes.master or dtypes.main_gradient
    assert grad is not None
    impl = request.framework_record.optimizer_impl(request.optimizer_impl)
    per = optimizer_bytes_per_param(request.optimizer, impl, dtypes, grad)
    shards = request.cluster.group_size(STRATEGIES[strategy].optimizer)
    trained = finetune_counts(arch, finetune).trainable // shards
    largest = max(k.tensor.numel for k in kinded if k.kind in TRAINED_KINDS)
    fsdp_offload = request.offload_params is not OffloadTarget.NONE and request.framework_record.torch_setup(
        strategy
    )
    offloaded = bool(fsdp_offload) or request.offload_optimizer is not OffloadTarget.NONE
    on_gpu = trained if offloaded == on_host else 0
    return on_gpu, per, max(1, largest // shards)


def request_offload_seconds(
    request: TrainingRequest,
    strategy: StrategyName,
    optimizer: OffloadTarget,
    params: OffloadTarget,
    grad_accum: int,
) -> float:
    """:func:`offload_seconds` of one rank of the request's mesh (its share of the parameters, sharded
    over its dp × cp data-parallel ranks) with the offload targets and accumulation given."""
    fsdp_offload = request.framework_record.torch_setup(strategy) is not None
    if request.finetune is not None and params is not OffloadTarget.NONE and fsdp_offload:
        return finetune_offload_seconds(request, strategy, grad_accum)
    dtypes = request.dtypes.trained
    cluster = request.cluster

    def seconds(count: int, optimizer: OffloadTarget, params: OffloadTarget) -> float:
        return offload_seconds(
            count,
            cluster.world_size,
            request.mesh.gpus_per_node,
            cluster.group_size(STRATEGIES[strategy].optimizer),
            optimizer,
            params,
            grad_accum,
            dtypes.stored.bytes,
            dtypes.main_gradient.bytes,
        )

    if request.finetune is None:
        return seconds(request.rank_model.params, optimizer, params)
    # the paper's ZeRO-Offload of a fine-tuning run: the optimizer's traffic is the trained tensors', the
    # parameters' fetches every tensor's
    from zerocalc.parallel.finetune import finetune_counts

    trained = finetune_counts(request.architecture, request.finetune).trainable
    return seconds(trained, optimizer, OffloadTarget.NONE) + seconds(
        request.rank_model.params, OffloadTarget.NONE, params
    )


class StepEstimate(BaseModel):
    """One strategy's step on one GPU, as ``comm`` reports it."""

    compute_s: float = Field(description="matmul + attention + elementwise + optimizer (recompute included)")
    matmul_s: float
    attention_s: float
    elementwise_s: float = Field(description="norms, activations, residuals, rotary, dropout, the loss")
    optimizer_s: float
    recompute_s: float = Field(description="of compute_s: what activation recomputation re-runs")
    exposed_comm_s: float = Field(
        description="exposed_dp_s + exposed_tp_s + exposed_cp_s + exposed_ep_s + exposed_pp_s"
    )
    exposed_dp_s: float
    exposed_tp_s: float
    exposed_cp_s: float
    exposed_ep_s: float = Field(
        description="the MoE token dispatcher's collectives: the dispatch and combine all-to-alls and, "
        "with expert tensor parallelism, its all-gathers and reduce-scatters over the ETP group (not "
        "overlapped)"
    )
    exposed_pp_s: float = Field(description="the busiest pipeline rank's sends (not overlapped)")
    bubble_s: float = Field(description="the pipeline bubble: its fraction of the slowest stage's compute")
    offload_s: float
    step_s: float = Field(description="compute_s + exposed_comm_s + bubble_s + offload_s")
    tokens_per_s_per_gpu: float
    mfu: float | None = Field(description=MFU_FORMULA)
    compute_table: str = Field(description="the compute table's source: a file, or the GPU preset's")


class StepFactors(NamedTuple):
    """What a step's assembly reads of the request beside its compute and communication."""

    tokens_per_gpu: int
    """b·s·A / (t·c·p): the tokens one GPU's share of the step is."""
    grad_accum: int
    hides_forward: bool
    """Forward all-gathers are prefetched (``--prefetch`` ≠ 0)."""
    hides_backward: bool
    """:func:`overlaps_backward`."""
    bubble_fraction: float
    model_flops_per_token: float
    peak_flops: float | None
    gathers_in_forward: bool = False
    """The after-step all-gathers run in the next forward (Megatron-LM ``--overlap-param-gather``)."""


def step_factors(
    request: TrainingRequest, strategy: StrategyName, pipeline: PipelineComm | None
) -> StepFactors:
    """The request's :class:`StepFactors` under ``strategy``."""
    arch, count = request.model.architecture, request.model.parameter_count
    assert arch is not None and count is not None
    activations = request.activations
    mesh = request.mesh
    accum = request.grad_accum
    return StepFactors(
        tokens_per_gpu=activations.micro_batch * activations.seq_len * accum // (mesh.tp * mesh.cp * mesh.pp),
        grad_accum=accum,
        hides_forward=request.buffers.prefetch != 0,
        hides_backward=overlaps_backward(request.framework, strategy)
        or (request.overlap.deepspeed_comm and strategy in OVERLAP_COMM_STRATEGIES),
        bubble_fraction=pipeline.bubble_fraction if pipeline is not None else 0.0,
        model_flops_per_token=model_flops_per_token(
            arch,
            count,
            activations.seq_len,
            *(matmul_split(arch, request.finetune) if request.finetune else ()),
        ),
        peak_flops=request.gpu.bf16_dense_tflops * 1e12 if request.gpu is not None else None,
        gathers_in_forward=request.overlap.param_gather and strategy is StrategyName.ZERO1,
    )


def step_of(
    compute: tuple[ComputeTime, float],
    comm: CommTime,
    mesh_costs: Sequence[MeshCollectiveCost | MeshTime],
    pipeline: PipelineComm | None,
    offload_s: float,
    factors: StepFactors,
    userbuffers: Userbuffers | None = None,
) -> StepTime:
    """A step from its parts: the slowest stage's compute and attention forward seconds
    (:func:`request_compute`), the data-parallel communication (:func:`comm_time`), the tensor-, context-
    and expert-parallel collectives (``userbuffers``: Megatron-LM ``--tp-comm-overlap``'s), the pipeline's
    sends and bubble, and the offload."""
    compute_time, attention_forward = compute
    attention_backward = compute_time.by_class[OpClass.ATTENTION] - attention_forward
    mesh = mesh_exposed(mesh_costs, attention_forward, attention_backward, userbuffers)
    mesh[Dimension.PP] = pipeline.busiest_rank_time_s if pipeline is not None else 0.0
    return assemble(
        compute_time,
        attention_forward,
        comm,
        mesh,
        sum(c.time_s for c in mesh_costs) + mesh[Dimension.PP],
        factors.tokens_per_gpu,
        factors.grad_accum,
        factors.hides_forward,
        factors.hides_backward,
        offload_s,
        factors.bubble_fraction,
        factors.model_flops_per_token,
        factors.peak_flops,
        factors.gathers_in_forward,
    )


# ------------------------------------------------------------------------------------------ the parts
# A step is assembled from parts, each declared with the request fields it reads (base/parts.py): comm runs
# them once (UNCACHED); plan shares each among the candidates that agree on what it reads (a PartCache).

_MODEL = ("model", "mesh", "stage")
"""What the rank's model (``rank_model``, ``stages``, ``architecture``) is derived from."""
_DTYPES = ("framework", "precision", "reduce_dtype")
"""What the dtypes (``request.dtypes``) are derived from."""
_LINKS = ("links", "calibration")


def _pipeline_sends(request: TrainingRequest, parts: Parts) -> PipelineComm | None:
    return pipeline_comm(request)


PIPELINE_SENDS = Part(
    "pipeline sends",
    (*_MODEL, *_DTYPES, *_LINKS, "grad_accum", "activations.micro_batch", "activations.seq_len"),
    _pipeline_sends,
)
""":func:`~zerocalc.comm.pipeline.pipeline_comm`: the busiest pipeline rank's sends and the bubble."""


def _mesh_request(request: TrainingRequest, parts: Parts) -> MeshRequest | None:
    return mesh_request(request)


MESH_REQUEST = Part(
    "mesh collectives' request",
    (*_MODEL, *_DTYPES, *_LINKS, "grad_accum", "activations.micro_batch", "activations.seq_len",
     "activations.recompute", "activations.checkpoint_every", "activations.capacity_factor"),
    _mesh_request,
)  # fmt: skip
""":func:`~zerocalc.comm.collectives.mesh_request`: what sizes and prices the tensor-, context- and
expert-parallel collectives."""


def _mesh_times(request: TrainingRequest, parts: Parts, sync: GradSync) -> list[MeshTime]:
    collectives = parts.get(MESH_REQUEST, request)
    return mesh_times(collectives, sync) if collectives is not None else []


MESH_TIMES = Part("mesh collectives", MESH_REQUEST.reads, _mesh_times)
""":func:`~zerocalc.comm.mesh.mesh_times` under a grad sync (``sync``)."""


def _dp_runs(
    request: TrainingRequest, parts: Parts, strategy: StrategyName
) -> tuple[list[CollectiveRun], ...]:
    return tuple(
        collective_runs(strategy, part.request, part.layout, part.cluster) for part in data_parts(request)
    )


DP_RUNS = Part(
    "data-parallel collectives",
    (*_MODEL, *_DTYPES, *_LINKS, "zeropp", "buffers.ddp_bucket_bytes", "buffers.ddp_first_bucket_bytes",
     "buffers.reduce_bucket_elements", "overlap", "fp8", "finetune"),
    _dp_runs,
)  # fmt: skip
""":func:`~zerocalc.comm.collectives.collective_runs` of a strategy over each part of the rank's parameters
(:func:`~zerocalc.comm.collectives.data_parts`), each run once."""


def _dp_lines(
    request: TrainingRequest, parts: Parts, strategy: StrategyName, sync: GradSync
) -> tuple[tuple[CommLine, ...], ...]:
    return tuple(comm_lines(runs, sync) for runs in parts.get(DP_RUNS, request, strategy))


DP_LINES = Part("data-parallel lines", DP_RUNS.reads, _dp_lines)
""":class:`~zerocalc.comm.collectives.CommLine` of each data-parallel collective under a grad sync: its runs
at every A."""


def _stage_micro_batches(
    request: TrainingRequest, parts: Parts, table: ComputeTable
) -> list[tuple[MicroBatchTime, ModelSpec | None]]:
    return stage_micro_batches(request, table)


STAGE_MICRO_BATCHES = Part(
    "stages' micro-batches",
    ("rank_model", "stages", "rank_shape", "mesh.ep", "model_code", "activation_dtype", "fp8",
     "activations.recompute", "activations.checkpoint_every", "activations.flash_attention",
     "activations.compile", "activations.capacity_factor", "finetune", "adapter_op_dtypes"),
    _stage_micro_batches,
)  # fmt: skip
""":func:`stage_micro_batches`: each kind of stage's micro-batch at the compute table's rates."""


def _stage_computes(
    request: TrainingRequest, parts: Parts, table: ComputeTable, strategy: StrategyName
) -> list[StageCompute]:
    return stage_computes(request, table, strategy, parts.get(STAGE_MICRO_BATCHES, request, table))


STAGE_COMPUTES = Part(
    "stages' computes",
    (*STAGE_MICRO_BATCHES.reads, "cluster", "framework", "precision", "reduce_dtype", "strategies",
     "grad_accum", "optimizer", "optimizer_impl", "offload_optimizer", "offload_params", "finetune"),
    _stage_computes,
)  # fmt: skip
""":func:`stage_computes`: each stage's compute in a step, the optimizer's step included."""


_SLOWEST_STAGE_READS = (*STAGE_COMPUTES.reads, "grad_sync", "mesh.pp")
"""What :func:`slowest_stage` reads beside the stages' computes (the framework's own kernels)."""


_STEP_FACTORS_READS = (*_MODEL, "grad_accum", "activations.micro_batch", "activations.seq_len",
                       "buffers.prefetch", "framework", "gpu", "overlap", "finetune")  # fmt: skip
"""What :func:`step_factors` reads (beside the pipeline's bubble)."""
_OFFLOAD_READS = (*_MODEL, *_DTYPES, "offload_optimizer", "offload_params", "grad_accum", "finetune",
                  "cluster", "strategies", "optimizer", "optimizer_impl", "grad_sync")  # fmt: skip
"""What :func:`request_offload_seconds` reads of the request's offload."""


def _step(request: TrainingRequest, parts: Parts, table: ComputeTable, strategy: StrategyName) -> StepTime:
    accum, mesh = request.grad_accum, request.mesh
    sync = effective_grad_sync(request.framework, strategy, request.grad_sync, pipelined=mesh.pp > 1)
    pipeline = parts.get(PIPELINE_SENDS, request) if mesh.pp > 1 else None
    costs = parts.get(MESH_TIMES, request, sync) if mesh.model_parallel else []
    dp = [
        entry
        for lines in parts.get(DP_LINES, request, strategy, sync)
        for entry in comm_of_lines(lines, accum)
    ]
    dp_times = [seconds for _, _, _, seconds in dp]
    dp_s = sum(dp_times)
    comm_s = sum([*dp_times, *(c.time_s for c in costs)])  # comm's time_s: the row's collectives in order
    comm_s += pipeline.busiest_rank_time_s if pipeline is not None else 0.0
    offload = request_offload_seconds(
        request, strategy, request.offload_optimizer, request.offload_params, accum
    )
    computes = parts.get(STAGE_COMPUTES, request, table, strategy)
    step = step_of(
        slowest_stage(request, table, strategy, computes),
        comm_time(dp, accum, dp_s),
        costs,
        pipeline,
        offload,
        step_factors(request, strategy, pipeline),
        request_userbuffers(request, table),
    )
    return step._replace(comm_s=comm_s)


def request_userbuffers(request: TrainingRequest, table: ComputeTable) -> Userbuffers | None:
    """What ``--tp-comm-overlap`` or ``--async-tp`` hides the rank's layer TP collectives behind (None
    without either): the rank's layers' GEMMs at the table's rates."""
    if not (request.overlap.tp_comm or request.overlap.async_tp):
        return None
    gemms = TeGemms.of(layer_gemm_times(table, request_ops(request)))
    sms = request.gpu.sm_count if request.gpu is not None else None
    return Userbuffers(gemms, request.mesh.tp, sms, request.grad_accum, request.overlap.async_tp)


STEP = Part(
    "step",
    dict.fromkeys(
        (
            *_SLOWEST_STAGE_READS,
            *PIPELINE_SENDS.reads,
            *MESH_TIMES.reads,
            *DP_LINES.reads,
            *_STEP_FACTORS_READS,
            *_OFFLOAD_READS,
        )
    ),
    _step,
)
"""The step of the request under a strategy: :func:`step_of` of the parts above (the pipeline's and the
mesh's where the mesh has them), its factors (:func:`step_factors`) and offload
(:func:`request_offload_seconds`); comm_s is comm's time_s."""

STEP_PARTS = (
    PIPELINE_SENDS, MESH_REQUEST, MESH_TIMES, DP_RUNS, DP_LINES, STAGE_MICRO_BATCHES, STAGE_COMPUTES,
    STEP,
)  # fmt: skip
"""Every part of a step (tests/test_parts.py checks what each reads)."""


def step_time(
    request: TrainingRequest, table: ComputeTable, strategy: StrategyName, parts: Parts = UNCACHED
) -> StepTime:
    """The step of the request's one configuration under ``strategy``: compute, the data-parallel, tensor-,
    context-, expert- and pipeline-parallel communication, the bubble and offload (:data:`STEP`), each part
    from ``parts`` (run afresh, or a search's cache; the step itself is not kept: a search's candidates
    differ in it)."""
    return STEP.run(request, parts, table, strategy)


def compute_bound_s(request: TrainingRequest, table: ComputeTable, parts: Parts = UNCACHED) -> float:
    """A lower bound of :data:`STEP`'s ``step_s``: the A micro-batches' forward, backward and recompute
    seconds of the slowest kind of stage (:data:`STAGE_MICRO_BATCHES`), less a billionth for the rounding of
    summing them otherwise. The step adds to them the optimizer step, the framework's own kernels, the
    exposed communication, the bubble and the offload, none below zero (:func:`step_compute`,
    :func:`slowest_stage`, :func:`assemble`)."""
    accum = request.grad_accum
    micro_batches = parts.get(STAGE_MICRO_BATCHES, request, table)
    passes = max(m.forward.total + m.backward.total + m.recompute.total for m, _ in micro_batches)
    return accum * passes * (1 - 1e-9)


def step_estimate(
    request: TrainingRequest, table: ComputeTable, table_name: str, strategy: StrategyName
) -> StepEstimate:
    """The step time of the request's one configuration under ``strategy``, as ``comm`` reports it."""
    values = step_time(request, table, strategy)._asdict()
    values.pop("comm_s")
    return StepEstimate(**values, compute_table=table_name)
