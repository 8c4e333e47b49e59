"""The search of ``zerocalc plan`` (pure): every candidate's peak, communication and step time, ranked.

Every candidate gets all three. The communication and the step time are exact (comm's schedule costed
once per key, every accumulation derived). The peak is ``memory``'s model in two stages:

* **every candidate**: the steady step's allocated peak from the framework's part of the step (one run
  per configuration) and the model's part (one run per micro-batch and recompute), combined slot by slot
  (:mod:`zerocalc.plan.allocated`; the same number as the full timeline, to the byte). Plus the CUDA
  context and the NCCL communicators this is a **lower bound** of the device peak (the caching allocator's
  reserve is ≥ 0): a candidate whose bound is above the fit limit does not fit;
* **the rows printed**: the candidates are walked in the objective's order and evaluated exactly (the
  full model, the allocator replay included: ``zerocalc memory``'s own peak) until ``top`` fit. The
  ranking is the one a brute-force exact evaluation of every candidate gives (tests/test_plan.py).
  Candidates never reached keep their lower bound (``peak_exact`` false in JSON).
"""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.comm.calls import Layout
from zerocalc.comm.collectives import CollectiveRun, collective_runs, data_parts, mesh_request
from zerocalc.comm.mesh import MeshRequest, MeshTime, mesh_problem, mesh_times
from zerocalc.comm.pipeline import PipelineComm, pipeline_comm
from zerocalc.comm.step import (
    StageCompute,
    StepFactors,
    fsdp2_traffic,
    kernels,
    optimizer_traffic,
    request_offload_seconds,
    slowest_stage,
    stage_computes,
    stage_micro_batches,
    step_factors,
    step_of,
    with_framework_traffic,
)
from zerocalc.compute.ops import Kernels, MicroBatchOps, micro_batch_ops, model_flops_per_token
from zerocalc.compute.time import ComputeTime, MicroBatchTime, micro_batch_time, step_compute
from zerocalc.model.activations import Recompute
from zerocalc.model.model_impl import Shape
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.framework_records import FRAMEWORKS, effective_grad_sync
from zerocalc.parallel.frameworks import Estimate, Framework
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, StrategyName
from zerocalc.peak.evaluate import (
    FIT_MARGIN,
    nccl_communicators,
    outside_allocator_bytes,
    pipeline_peak,
    strategy_peak,
)
from zerocalc.peak.report import StrategyPeak, Verdict
from zerocalc.peak.simulate import (
    first_stage_in_flight,
    flash_attention_used,
    micro_batch_saved_bytes,
    runtime_for,
    simulate,
)
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.plan.allocated import StepParts, with_batch, with_recompute
from zerocalc.plan.space import (
    Group,
    Objective,
    PlanRequest,
    comm_options,
    derived_request,
    enumerate_groups,
    memory_options,
)
from zerocalc.plan.timing import (
    CPU_ADAM_BYTES_PER_PARAM,
    HOST_MEMORY_BPS,
    NVME_BPS,
    PCIE_BPS,
    CommLine,
    CommTime,
    StepTime,
    comm_lines,
    comm_of_lines,
    comm_time,
    step_times,
)
from zerocalc.request.model_spec import ModelSpec
from zerocalc.request.options import OptionsEcho
from zerocalc.request.training import TrainingRequest
from zerocalc.states.memory import strategy_row

SCHEMA_VERSION = 2


class Status(StrEnum):
    RANKED = "ranked"
    FITS = "fits"
    """Exactly evaluated and fits, ranked below the top rows."""
    NOT_RANKED = "not ranked"
    """Its lower bound fits; never reached by the walk, so not evaluated exactly."""
    TIGHT = "tight"
    DOES_NOT_FIT = "does not fit"


class PlanRow(BaseModel):
    """One candidate: its options and numbers."""

    model_config = ConfigDict(frozen=True)

    rank: int | None = Field(default=None, description="1 = best, among the top rows")
    status: Status
    framework: Framework
    strategy: StrategyName
    title: str
    gpus: int
    gpus_per_node: int = Field(description="as passed to memory/comm (HYBRID_SHARD: its shard group)")
    micro_batch: int
    grad_accum: int
    recompute: Recompute
    offload_optimizer: OffloadTarget
    offload_params: OffloadTarget
    reduce_dtype: DType | None
    prefetch: int | None
    grad_sync: GradSync | None
    tp: int = Field(default=1, description="t: tensor-parallel ranks")
    cp: int = Field(default=1, description="c: context-parallel ranks")
    pp: int = Field(default=1, description="p: pipeline stages")
    vpp: int = Field(default=1, description="v: virtual stages per pipeline rank")
    ep: int = Field(default=1, description="e: expert-parallel ranks")
    peak_exact: bool = Field(description="the peak is memory's own (else only the lower bound)")
    peak_bytes: int | None = Field(description="memory's peak_bytes, when evaluated exactly")
    peak_lower_bound_bytes: int | None = Field(
        description="the exact allocated peak + context + NCCL (None: never needed)"
    )
    verdict: Verdict | None = None
    headroom_bytes: int | None = None
    host_bytes_per_node: int | None = Field(default=None, description="offloaded states on the host")
    compute_s: float = Field(description="matmul + attention + elementwise + optimizer (recompute included)")
    matmul_s: float
    attention_s: float
    elementwise_s: float = Field(description="norms, activations, residuals, rotary, dropout, the loss")
    optimizer_s: float
    recompute_s: float = Field(description="of compute_s: what activation recomputation re-runs")
    comm_s: float = Field(description="comm's time_s for this strategy")
    exposed_comm_s: float = Field(description="exposed communication: data-parallel, TP, CP, EP and PP")
    bubble_s: float = Field(description="the pipeline bubble (0 without pipeline stages)")
    offload_s: float
    step_s: float = Field(description="compute_s + exposed_comm_s + bubble_s + offload_s")
    tokens_per_s_per_gpu: float
    mfu: float = Field(description="PaLM's model FLOPs per second over the GPU's dense bf16 peak")
    memory_options: dict[str, str] = Field(description="zerocalc memory's options (concept → value)")
    comm_options: dict[str, str] = Field(description="zerocalc comm's options (concept → value)")


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    candidates: int


class PlanEcho(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    gpu: str
    max_gpus: int
    gpus_per_node: int
    global_batch_sequences: int
    global_batch_tokens: int
    seq_len: int
    frameworks: tuple[Framework, ...]
    objective: Objective
    top: int
    compute_table: str = Field(
        description="what compute is priced with: a bench --compute file or the preset's"
    )
    peak_tflops: float = Field(description="the GPU preset's dense bf16 TFLOP/s (for the MFU)")
    gpu_memory_bytes: int
    calibration: str | None


class PlanResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    request: PlanEcho
    options: OptionsEcho = None
    top: list[PlanRow]
    rejections: list[Rejection]
    candidates_evaluated: int = Field(
        description="candidates resolved: each given its communication, step time and peak (exact, or the "
        "lower bound)"
    )
    exact_peaks: int = Field(description="of them, peaks from the full memory model")
    lower_bound_peaks: int = Field(description="of them, only the lower bound (never reached by the walk)")
    groups: int = Field(description="groups of candidates differing only in b")
    seconds: float = Field(description="the whole search: search_seconds + exact_seconds")
    search_seconds: float = Field(
        description="every candidate's peak (its lower bound), communication and step time, and the ranking"
    )
    exact_seconds: float = Field(description="the walk's exact peaks (memory's model, allocator replay)")
    candidates_per_second: float = Field(description="candidates_evaluated / search_seconds")
    assumptions: list[str]
    candidates: list[PlanRow] | None = Field(default=None, description="every candidate (--json)")


ASSUMPTIONS = [
    "b·A·d equals the global batch exactly (in sequences; d = N/(t·c·p) data-parallel replicas); N: --gpus "
    "and every smaller number of whole nodes",
    "compute: each layer's GEMMs, attention and element-wise kernels at their shapes, at the rates of the "
    "GPU's compute table (measured by zerocalc bench --compute, or the preset's); recompute full re-runs the "
    "layers' forward, selective eager attention's core (Korthikanti et al. 2022); MFU counts PaLM's "
    "6·P + 12·L·H·Q·T FLOPs per token (Chowdhery et al. 2022, app. B)",
    "overlap: prefetched all-gathers behind forward, backward collectives behind backward (Zhao et al. 2023, "
    "PyTorch FSDP; Li et al. 2020, DDP); DeepSpeed ZeRO-1/2 overlap_comm off (its default); after-step "
    "collectives exposed",
    f"offload, not overlapped: PCIe {PCIE_BPS / 1e9:.0f} GB/s per GPU, NVMe {NVME_BPS / 1e9:.1f} GB/s per "
    f"GPU, CPU Adam memory-bound at {CPU_ADAM_BYTES_PER_PARAM} B/parameter over {HOST_MEMORY_BPS / 1e9:.0f} "
    "GB/s per node (ZeRO-Offload, Ren et al. 2021); assumptions, not measurements",
    "hybrid_shard with a shard group smaller than the node is run as --gpus-per-node k: its replica group "
    "is costed at the inter-node bandwidth",
]


MESH_ASSUMPTION = (
    "mesh: a model-parallel candidate's step is comm's for its b, recompute and A plus its offload (its "
    "rank's compute, the tensor-parallel collectives on the critical path, the context-parallel ring behind "
    "attention, the busiest pipeline rank's sends exposed, the bubble a fraction of the slowest stage's "
    "compute); its "
    "lower bound is the rank's allocated peak (exact, from the step's parts) + context + NCCL, with pipeline "
    "stages the largest rank's model states or, without recompute, the first stage's in-flight "
    "activations if more, + context + NCCL; its exact peak the worst stage's"
)


class _Cand:
    __slots__ = ("accum", "b", "exact", "group", "lower", "request", "stage_over", "status", "time")

    def __init__(
        self, group: Group, request: TrainingRequest, b: int, accum: int, t: StepTime | None, lower: int
    ):  # fmt: skip
        self.group, self.request, self.b, self.accum, self.time = group, request, b, accum, t
        self.lower = lower
        """The allocated peak (exact) + the CUDA context + the NCCL communicators: the device peak's lower
        bound."""
        self.exact: StrategyPeak | None = None
        self.stage_over = False
        """A pipeline stage's exact peak is above the GPU's memory: the candidate does not fit (its worst
        stage, :attr:`exact`, not computed)."""
        self.status: Status = Status.NOT_RANKED


def _end_stages(request: TrainingRequest) -> dict[int, StrategyPeak]:
    """The peaks of the first and the last pipeline stage (which hold the embedding and the most
    micro-batches in flight, or the head and the loss): where one alone exceeds the GPU's memory the worst
    stage does, and the candidate does not fit without its other stages evaluated."""
    runtime, record, name = runtime_for(request), request.framework_record, request.strategies[0]
    return {
        stage: strategy_peak(request.with_(stage=stage), record, name, runtime)
        for stage in (0, request.mesh.pp - 1)
    }


def _outside_bytes(request: TrainingRequest, name: StrategyName) -> int:
    """What a GPU holds outside the caching allocator under strategy ``name``, as ``memory`` counts it
    (:func:`~zerocalc.peak.evaluate.outside_allocator_bytes`)."""
    return outside_allocator_bytes(
        request, nccl_communicators(STRATEGIES[name], request.cluster, request.mesh)
    )


def _allocated_over(request: TrainingRequest) -> bool:
    """Whether the first or the last pipeline stage's allocated peak (one steady step, simulated without the
    caching allocator's replay), with the context and the NCCL communicators, is above the GPU's memory:
    its device peak, which adds what the allocator reserves beyond, is then too, and its exact row does
    not fit. Cheaper than :func:`_end_stages` (one step, no replay): where a stage is far over, as most fast
    pipelined candidates that do not fit are, it settles them."""
    record, name, runtime = request.framework_record, request.strategies[0], runtime_for(request)
    strategy = STRATEGIES[name]
    capacity = request.gpu_memory_bytes
    assert capacity is not None
    for stage in (0, request.mesh.pp - 1):
        staged = request.with_(stage=stage)
        states, _ = STATE_BUILDERS[record.states](staged, strategy)
        allocated = simulate(staged, name, runtime, states, reserve=False).peak.allocated
        if allocated + _outside_bytes(staged, name) > capacity:
            return True
    return False


def _exact(request: TrainingRequest, known: dict[int, StrategyPeak] | None = None) -> StrategyPeak:
    """``zerocalc memory``'s peak for the request's one strategy (the same functions, the same request;
    with pipeline stages the worst stage's, ``known`` the stages already evaluated)."""
    record, name, runtime = request.framework_record, request.strategies[0], runtime_for(request)
    if request.mesh.pp > 1:
        return pipeline_peak(request, record, name, runtime, known)
    return strategy_peak(request, record, name, runtime)


def _host_bytes(peak: StrategyPeak, request: TrainingRequest) -> int | None:
    if peak.host_bytes_per_node is not None:
        return peak.host_bytes_per_node
    if request.offload_optimizer is OffloadTarget.NONE and request.offload_params is OffloadTarget.NONE:
        return None
    return strategy_row(request).cpu_bytes_per_node


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off, then as it was: a search allocates a few hundred thousand
    short-lived objects, freed by reference counting (``gc.collect()`` after a search finds nothing
    unreachable), and each full collection they would trigger walks every object of the process (in
    ``zerocalc plan``, with the CLI's imports: ~14 ms each, measured)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def search(
    plan: PlanRequest,
    on_progress: Callable[[int, int], None] | None = None,
    keep_all: bool = False,
) -> PlanResult:
    """Every candidate of the plan's space (peak, communication, step time), the best ``plan.top`` by its
    objective evaluated exactly."""
    with _collector_paused():
        return _search(plan, on_progress, keep_all)


class _Setting(NamedTuple):
    """What every candidate of a plan shares: the base request's model and GPU."""

    limit: float
    """The fit limit: headroom ≥ FIT_MARGIN × the GPU's memory."""
    peak_flops: float
    flash: bool
    layout: Layout
    model_flops: float
    """PaLM's model FLOPs per token (the MFU's numerator)."""

    @classmethod
    def of(cls, plan: PlanRequest) -> _Setting:
        base = plan.base
        arch, count = base.architecture, base.model.parameter_count
        assert arch is not None and count is not None and base.gpu is not None
        assert base.gpu_memory_bytes is not None
        flash = flash_attention_used(base)
        return cls(
            limit=base.gpu_memory_bytes - FIT_MARGIN * base.gpu_memory_bytes,
            peak_flops=base.gpu.bf16_dense_tflops * 1e12,
            flash=flash,
            layout=Layout.of(base.model.params, arch),
            model_flops=model_flops_per_token(arch, count, plan.seq_len),
        )


class _Requests:
    """Each group's memory and comm requests (or the parser's errors), derived once per key: recompute
    reaches the memory request's activations only, and the comm request depends on the schedule's options
    and the grad sync (a model-parallel group's on its offload, pipeline split and recompute too: its step
    is priced from it)."""

    def __init__(self, plan: PlanRequest):
        self.plan = plan
        self._memory: dict[Hashable, TrainingRequest | InputError] = {}
        self._comm: dict[Hashable, TrainingRequest | InputError] = {}

    def memory(self, group: Group) -> TrainingRequest | InputError:
        key = group._replace(recompute=Recompute.NONE)
        request = _request_once(self._memory, key, self.plan, key, Estimate.MEMORY)
        return request if isinstance(request, InputError) else with_recompute(request, group.recompute)

    def comm(self, group: Group) -> TrainingRequest | InputError:
        """At the group's first micro-batch (a model-parallel group's mesh collectives read b and the
        recompute: :func:`with_batch` gives the others)."""
        key = _comm_key(group)
        if group.model_parallel:  # its compute reads where the optimizer runs
            key = (*key, *_offloads(group), group.end_stage_layers, group.recompute)
        return _request_once(self._comm, key, self.plan, group, Estimate.COMM)


def _schedule_key(group: Group) -> tuple:
    return (
        group.world, group.gpus_per_node, group.framework, group.strategy, group.reduce_dtype,
        group.tp, group.cp, group.pp, group.vpp, group.ep,
    )  # fmt: skip


def _offloads(group: Group) -> tuple[OffloadTarget, OffloadTarget]:
    return group.offload_optimizer, group.offload_params


def _comm_key(group: Group) -> tuple:
    return (*_schedule_key(group), group.grad_sync)


class _CommCosts:
    """Comm's costs: the collectives' runs once per schedule (the same under every grad sync), their lines
    once per grad sync, their time once per accumulation."""

    def __init__(self, layout: Layout):
        self.layout = layout
        """The whole model's (a data-parallel group's; a model-parallel group's collectives are its rank's,
        :class:`_MeshSteps`)."""
        self._runs: dict[tuple, list[CollectiveRun]] = {}
        self._lines: dict[tuple, tuple[CommLine, ...]] = {}
        self._times: dict[tuple, CommTime] = {}

    def time(self, group: Group, request: TrainingRequest, accum: int) -> CommTime:
        key = _comm_key(group)
        time = self._times.get((key, accum))
        if time is None:
            lines = self._lines.get(key)
            if lines is None:
                schedule = _schedule_key(group)
                runs = self._runs.get(schedule)
                if runs is None:
                    runs = self._runs[schedule] = collective_runs(group.strategy, request, self.layout)
                sync = effective_grad_sync(
                    group.framework, group.strategy, request.grad_sync, pipelined=group.pp > 1
                )
                lines = self._lines[key] = comm_lines(runs, sync)
            time = self._times[key, accum] = comm_time(comm_of_lines(lines, accum), accum)
        return time


class _MeshSteps:
    """A model-parallel candidate's step time and communication: ``comm``'s own for its request (the
    data-parallel collectives of its rank's layout, the tensor- and context-parallel collectives, the
    pipeline's sends and bubble: :func:`~zerocalc.comm.step.step_estimate`'s parts, assembled by the same
    :func:`~zerocalc.comm.step.step_of`), once per (comm's options, b, A). What does not change with an
    option is shared by the candidates that differ in it: the stages' compute over reduce dtypes and grad
    syncs, the data-parallel collectives' runs over micro-batches and accumulations
    (:class:`~zerocalc.plan.timing.CommLine`), the tensor- and context-parallel collectives over
    strategies and offloads, the pipeline's sends over strategies and recompute."""

    def __init__(self, plan: PlanRequest):
        self.plan = plan
        self._steps: dict[tuple, StepTime | InputError] = {}
        self._pipelines: dict[tuple, PipelineComm | None] = {}
        self._mesh_requests: dict[tuple, MeshRequest | None] = {}
        self._lines: dict[tuple, tuple[tuple[CommLine, ...], ...]] = {}
        self._computes: dict[tuple, list[StageCompute]] = {}
        self._micro_batches: dict[tuple, list[tuple[MicroBatchTime, ModelSpec | None]]] = {}
        self._mesh_times: dict[tuple, list[MeshTime]] = {}
        self._factors: dict[tuple, StepFactors] = {}

    def of(self, group: Group, comm_request: TrainingRequest, b: int, accum: int) -> StepTime | InputError:
        key = (*_comm_key(group), group.end_stage_layers, group.recompute, *_offloads(group), b, accum)
        step = self._steps.get(key)
        if step is None:
            try:
                step = self._steps[key] = self._priced(group, comm_request, b, accum)
            except InputError as exc:
                step = self._steps[key] = exc
        return step

    def _priced(self, group: Group, comm_request: TrainingRequest, b: int, accum: int) -> StepTime:
        """As :func:`~zerocalc.comm.estimate.evaluate_comm` prices the request's one strategy at b and A
        (``comm_request``: the group's, at its first b). The parts are keyed by the group's degrees (the
        search's one model, sequence, GPU and links): the request at b and A is derived only where a part
        is not yet known."""
        plan = self.plan
        strategy, framework = group.strategy, group.framework
        batched: list[TrainingRequest] = []

        def at_batch() -> TrainingRequest:
            if not batched:
                batched.append(with_batch(comm_request, b, accum))
            return batched[0]

        degrees = (group.tp, group.cp, group.pp, group.vpp, group.ep, group.end_stage_layers)
        mesh_key = (group.world, group.gpus_per_node, *degrees)
        shared = (mesh_key, framework, b, accum)
        sends = (*shared, group.reduce_dtype)  # a tied embedding's gradient sync moves the reduce dtype
        if sends not in self._pipelines:
            self._pipelines[sends] = pipeline_comm(at_batch())
        pipeline = self._pipelines[sends]
        sync = effective_grad_sync(framework, strategy, group.grad_sync, pipelined=group.pp > 1)
        collectives = (*shared, group.recompute, group.reduce_dtype)
        costs = self._mesh_times.get((collectives, sync))
        if costs is None:
            if collectives not in self._mesh_requests:
                self._mesh_requests[collectives] = mesh_request(at_batch())
            mesh_collectives = self._mesh_requests[collectives]
            costs = mesh_times(mesh_collectives, sync) if mesh_collectives is not None else []
            self._mesh_times[collectives, sync] = costs
        schedule = (*_comm_key(group), group.end_stage_layers)
        lines = self._lines.get(schedule)
        if lines is None:
            lines = self._lines[schedule] = tuple(
                comm_lines(collective_runs(strategy, part.request, part.layout, part.cluster), sync)
                for part in data_parts(comm_request)
            )
        dp = [entry for part in lines for entry in comm_of_lines(part, accum)]
        dp_times = [seconds for _, _, _, seconds in dp]
        dp_s = sum(dp_times)
        comm_s = sum([*dp_times, *(c.time_s for c in costs)])
        comm_s += pipeline.busiest_rank_time_s if pipeline is not None else 0.0
        compute_key = (*mesh_key, framework, strategy, group.recompute, group.offload_optimizer, b, accum)
        computes = self._computes.get(compute_key)
        if computes is None:
            micro_key = (*degrees, framework, group.recompute, b)  # not the world: a rank's
            micro_batches = self._micro_batches.get(micro_key)
            if micro_batches is None:
                micro_batches = self._micro_batches[micro_key] = stage_micro_batches(at_batch(), plan.compute)
            computes = self._computes[compute_key] = stage_computes(
                at_batch(), plan.compute, strategy, micro_batches
            )
        factors_key = (*shared, strategy)
        factors = self._factors.get(factors_key)
        if factors is None:
            factors = self._factors[factors_key] = step_factors(at_batch(), strategy, pipeline)
        step = step_of(
            slowest_stage(comm_request, plan.compute, strategy, computes, accum),
            comm_time(dp, accum, dp_s),
            costs,
            pipeline,
            request_offload_seconds(comm_request, strategy, *_offloads(group), accum),
            factors,
        )
        return step._replace(comm_s=comm_s)


class _OutsideBytes:
    """The CUDA context and the NCCL communicators: the same for every micro-batch and recompute, once per
    (strategy, world, GPUs per node)."""

    def __init__(self) -> None:
        self._bytes: dict[tuple, int] = {}

    def of(self, group: Group, request: TrainingRequest) -> int:
        key = (group.strategy, group.world, group.gpus_per_node, group.tp, group.cp, group.pp)
        outside = self._bytes.get(key)
        if outside is None:
            outside = self._bytes[key] = _outside_bytes(request, group.strategy)
        return outside


class _Compute:
    """Every candidate's compute (:mod:`zerocalc.compute`): one rank's operations once per (b, kernels),
    their times once per recompute, a step's once per (A, optimizer traffic). The plan's candidates are
    data-parallel: every rank runs the whole model."""

    def __init__(self, plan: PlanRequest):
        base = plan.base
        self.plan, self.table = plan, plan.compute
        self.dtype = base.dtypes.activation
        self._ops: dict[tuple[int, Kernels], MicroBatchOps] = {}
        self._micro: dict[tuple[int, Kernels, Recompute], MicroBatchTime] = {}
        self._steps: dict[tuple, ComputeTime] = {}
        self._kernels: dict[tuple, Kernels] = {}
        self._traffic: dict[tuple, tuple[float, float]] = {}

    def step(
        self,
        request: TrainingRequest,
        b: int,
        recompute: Recompute,
        accum: int,
        optimizer: tuple[int, int, int],
    ) -> ComputeTime:
        code_key = (request.framework, request.model_impl, request.activations.flash_attention)
        code = self._kernels.get(code_key)
        if code is None:
            code = self._kernels[code_key] = kernels(request)
        key = (b, code, recompute, accum, optimizer)
        compute = self._steps.get(key)
        if compute is None:
            micro = self._micro.get((b, code, recompute))
            if micro is None:
                ops = self._ops.get((b, code))
                if ops is None:
                    shape = Shape(b, self.plan.seq_len)
                    ops = self._ops[b, code] = micro_batch_ops(request.architecture, shape, code, self.dtype)
                micro = self._micro[b, code, recompute] = micro_batch_time(self.table, ops, recompute)
            compute = self._steps[key] = step_compute(self.table, micro, accum, *optimizer)
        strategy = request.strategies[0]
        traffic_key = (
            strategy,
            request.framework,
            request.reduce_dtype,
            request.grad_sync,
            request.cluster,
            accum,
        )
        traffic = self._traffic.get(traffic_key)
        if traffic is None:
            traffic = self._traffic[traffic_key] = fsdp2_traffic(
                request, strategy, self.table, grad_accum=accum
            )
        return with_framework_traffic(compute, traffic)


class _Resolver:
    """Each group's candidates, every one given its step time and its peak's lower bound; the caches are
    shared by the groups of one search."""

    def __init__(self, plan: PlanRequest, setting: _Setting, price_all: bool = True):
        self.plan, self.setting = plan, setting
        self.price_all = price_all
        """False: a model-parallel candidate whose bound is above the fit limit gets no step time (it cannot
        be ranked); True: every candidate gets one (the JSON's list of them)."""
        self.requests = _Requests(plan)
        self.comm = _CommCosts(setting.layout)
        self.outside = _OutsideBytes()
        self.parts: dict[Hashable, StepParts] = {}
        """A data-parallel candidate's step parts per model code and architecture (one StepParts per model
        its frameworks run: Megatron-LM runs its own layers and pads the vocabulary)."""
        self._parts_key: dict[Framework, Hashable] = {}
        self.compute = _Compute(plan)
        self.mesh_steps = _MeshSteps(plan)
        self.states: dict[Hashable, int] = {}
        """A model-parallel configuration's model-state bytes on its largest rank."""
        self.micro_batch_saves: dict[Hashable, int] = {}
        """A pipelined configuration's first stage's saved activations of one micro-batch, per b."""
        self.flights: dict[Hashable, int] = {}
        """The first pipeline stage's micro-batches in flight, per schedule and A."""
        self.mesh_parts: dict[Hashable, StepParts] = {}
        """The step's parts per framework and tensor-, context- and expert-parallel degrees (without
        pipeline stages): their requests are of one rank's model, as a data-parallel search's are of the
        whole model."""

    def candidates(self, group: Group) -> list[_Cand] | InputError:
        """The group's candidates, or why the parser refuses the group."""
        request = self.requests.memory(group)
        if isinstance(request, InputError):
            return request
        comm_request = self.requests.comm(group)
        if isinstance(comm_request, InputError):
            return comm_request
        if group.model_parallel:
            return self._mesh_candidates(group, request, comm_request)
        timed = self._timed(group, request, comm_request)
        configuration = group._replace(recompute=None, micro_batches=())
        peaks = self._parts(group.framework, request).allocated_peaks(
            request, {b: accum for b, accum, _ in timed}, configuration
        )
        outside = self.outside.of(group, request)
        return [_Cand(group, request, b, accum, t, peaks[b] + outside) for b, accum, t in timed]

    def _parts(self, framework: Framework, request: TrainingRequest) -> StepParts:
        """The step parts of a data-parallel request: shared by the frameworks that run the same model
        (the model's part is the model code's timeline of the architecture; its framework's own part is
        keyed by configuration inside)."""
        key = self._parts_key.get(framework)
        if key is None:
            key = self._parts_key[framework] = (request.model_code, request.architecture)
        parts = self.parts.get(key)
        if parts is None:
            parts = self.parts[key] = StepParts(runtime_for(self.plan.base))
        return parts

    def _mesh_candidates(
        self, group: Group, request: TrainingRequest, comm_request: TrainingRequest
    ) -> list[_Cand] | InputError:
        """A model-parallel group's candidates: each one's step time and communication are ``comm``'s for
        its b, recompute and A (:class:`_MeshSteps`); its peak's lower bound is the context, the NCCL
        communicators and the model states of the largest rank (:func:`~zerocalc.states.memory.
        strategy_row`: all resident between the last backward and the optimizer step), the exact peak left
        to the walk; with pipeline stages and no recomputation, at least the first stage's in-flight
        activations (:func:`~zerocalc.peak.simulate.in_flight_saved_bytes`) where they are more. Without
        pipeline stages the rank's steady step is one timeline, as a data-parallel candidate's: its
        allocated peak is exact from the step's parts (:class:`~zerocalc.plan.allocated.StepParts` of the
        rank's model), and the bound is that peak + the context and the communicators.
        A candidate whose bound is above the fit limit cannot be ranked: it is priced only where every
        candidate is listed (``price_all``)."""
        key = group._replace(recompute=None, micro_batches=(), accumulates=False)
        states = self.states.get(key)
        if states is None:
            states = self.states[key] = strategy_row(request).gpu_bytes
        outside = self.outside.of(group, request)
        batches = {b: group.accumulation(self.plan.global_batch_sequences, b) for b in group.micro_batches}
        allocated = dict.fromkeys(batches, 0)
        if group.pp == 1:
            parts_key = (group.framework, group.tp, group.cp, group.ep)
            parts = self.mesh_parts.get(parts_key)
            if parts is None:
                parts = self.mesh_parts[parts_key] = StepParts(runtime_for(self.plan.base))
            configuration = group._replace(recompute=None, micro_batches=())
            allocated = parts.allocated_peaks(request, batches, configuration)
        problem = mesh_problem(comm_request.model.architecture, comm_request.mesh)
        if problem:  # what pricing would refuse, refused whether or not it is priced
            return InputError(problem)
        if group.pp > 1:
            allocated = {b: self._in_flight(group, request, b, accum) for b, accum in batches.items()}
        cands = []
        for b, accum in batches.items():
            lower = outside + max(states, allocated[b])
            timed: StepTime | InputError | None = None
            if lower <= self.setting.limit or self.price_all:
                timed = self.mesh_steps.of(group, comm_request, b, accum)
                if isinstance(timed, InputError):
                    return timed
            cands.append(_Cand(group, request, b, accum, timed, lower))
        return cands

    def _in_flight(self, group: Group, request: TrainingRequest, b: int, accum: int) -> int:
        """The first pipeline stage's in-flight activations at b and A
        (:func:`~zerocalc.peak.simulate.in_flight_saved_bytes`): one micro-batch's once per mesh,
        recompute and b, the micro-batches in flight once per schedule and A."""
        key = (
            group.framework, group.tp, group.cp, group.pp, group.vpp, group.ep, group.end_stage_layers,
            group.recompute, b,
        )  # fmt: skip
        saved = self.micro_batch_saves.get(key)
        if saved is None:
            saved = self.micro_batch_saves[key] = micro_batch_saved_bytes(with_batch(request, b, accum))
        if not saved:
            return 0
        mesh = request.mesh
        flight = (mesh.pp_schedule, mesh.pp, accum)
        count = self.flights.get(flight)
        if count is None:
            count = self.flights[flight] = first_stage_in_flight(mesh.pp_schedule, mesh.pp, accum)
        return count * saved

    def _timed(
        self, group: Group, request: TrainingRequest, comm_request: TrainingRequest
    ) -> list[tuple[int, int, StepTime]]:
        """Each micro-batch of the group, its accumulation and its step time."""
        plan = self.plan
        optimizer = optimizer_traffic(request, group.strategy)
        steps = []
        for b in group.micro_batches:
            accum = group.accumulation(plan.global_batch_sequences, b)
            offload = request_offload_seconds(
                request, group.strategy, group.offload_optimizer, group.offload_params, accum
            )
            compute = self.compute.step(request, b, group.recompute, accum, optimizer)
            steps.append(
                (
                    b * accum * plan.seq_len,
                    accum,
                    self.comm.time(group, comm_request, accum),
                    offload,
                    compute,
                )
            )
        setting = self.setting
        timings = step_times(
            group.strategy, group.framework, group.prefetch, setting.model_flops, setting.peak_flops, steps
        )
        return [
            (b, accum, timing)
            for b, (_, accum, _, _, _), timing in zip(group.micro_batches, steps, timings, strict=True)
        ]


def _resolve(
    plan: PlanRequest,
    setting: _Setting,
    groups: list[Group],
    rejected: Counter[str],
    on_progress: Callable[[int, int], None] | None,
    price_all: bool = True,
) -> list[_Cand]:
    """Every candidate of the groups the parser accepts (the others counted in ``rejected``)."""
    resolver = _Resolver(plan, setting, price_all)
    cands: list[_Cand] = []
    step = max(1, len(groups) // 20)
    for index, group in enumerate(groups):
        if on_progress is not None and index % step == 0:
            on_progress(index, len(groups))
        members = resolver.candidates(group)
        if isinstance(members, InputError):
            rejected[_reason(members)] += len(group.micro_batches)
        else:
            cands += members
    if on_progress is not None:
        on_progress(len(groups), len(groups))
    return cands


def _settle(cands: list[_Cand], limit: float, rejected: Counter[str]) -> None:
    """The status of the candidates the walk left unranked, and the rejections it found."""
    for cand in cands:
        if cand.status is Status.NOT_RANKED and cand.exact is not None:
            cand.status = _status_of(cand.exact)
        if cand.status is Status.NOT_RANKED and cand.lower > limit:
            cand.status = Status.DOES_NOT_FIT
    above = {
        exact: f"does not fit: peak above {1 - FIT_MARGIN:.0%} of the GPU's memory ({how})"
        for exact, how in ((True, "exact peak"), (False, "lower bound"))
    }
    tight = f"tight: within {FIT_MARGIN:.0%} of the GPU's memory (exact peak)"
    for cand in cands:
        if cand.status is Status.DOES_NOT_FIT:
            rejected[above[cand.exact is not None or cand.stage_over]] += 1
        elif cand.status is Status.TIGHT:
            rejected[tight] += 1


def _search(plan: PlanRequest, on_progress: Callable[[int, int], None] | None, keep_all: bool) -> PlanResult:
    start = time.perf_counter()
    setting = _Setting.of(plan)
    groups, early = enumerate_groups(plan, setting.flash)
    rejected: Counter[str] = Counter()
    for item in early:
        rejected[item.reason] += item.count
    cands = _resolve(plan, setting, groups, rejected, on_progress, price_all=keep_all)
    searched = time.perf_counter()
    ranked = _walk(plan, cands, setting.limit)
    walked = time.perf_counter()
    _settle(cands, setting.limit, rejected)
    seconds = time.perf_counter() - start - (walked - searched)
    rows = [_row(plan, c, i + 1) for i, c in enumerate(ranked)]
    everything = None
    if keep_all:
        ranks = {id(c): i + 1 for i, c in enumerate(ranked)}
        everything = [_row(plan, c, ranks.get(id(c))) for c in cands]
    exact_count = sum(1 for c in cands if c.exact is not None or c.stage_over)
    base = plan.base
    assert base.gpu is not None and base.gpu_memory_bytes is not None
    return PlanResult(
        request=PlanEcho(
            model=plan.model,
            gpu=plan.gpu,
            max_gpus=plan.max_gpus,
            gpus_per_node=plan.gpus_per_node,
            global_batch_sequences=plan.global_batch_sequences,
            global_batch_tokens=plan.global_batch_tokens,
            seq_len=plan.seq_len,
            frameworks=plan.frameworks,
            objective=plan.objective,
            top=plan.top,
            compute_table=plan.compute_name,
            peak_tflops=base.gpu.bf16_dense_tflops,
            gpu_memory_bytes=base.gpu_memory_bytes,
            calibration=plan.calibration_path,
        ),
        top=rows,
        rejections=[Rejection(reason=r, candidates=n) for r, n in rejected.most_common()],
        candidates_evaluated=len(cands),
        exact_peaks=exact_count,
        lower_bound_peaks=len(cands) - exact_count,
        groups=len(groups),
        seconds=seconds + (walked - searched),
        search_seconds=seconds,
        exact_seconds=walked - searched,
        candidates_per_second=len(cands) / seconds if seconds > 0 else 0.0,
        assumptions=ASSUMPTIONS + ([MESH_ASSUMPTION] if any(g.model_parallel for g in groups) else []),
        candidates=everything,
    )


def _request_once(
    cache: dict[Hashable, TrainingRequest | InputError],
    key: Hashable,
    plan: PlanRequest,
    group: Group,
    estimate: Estimate,
) -> TrainingRequest | InputError:
    """The group's request, or the parser's error, derived once per ``key`` (as parsing gives it)."""
    if key not in cache:
        try:
            cache[key] = derived_request(plan, group, estimate)
        except InputError as exc:
            cache[key] = exc
    return cache[key]


def _reason(exc: InputError) -> str:
    """A rejection's reason: the parser's message up to its 'accepted' part, numbers and all."""
    text = str(exc).split("; accepted")[0]
    if "does not model offload" in text:
        return text.split(":")[0] if ":" in text else text
    return text


def _status_of(peak: StrategyPeak) -> Status:
    if peak.verdict is Verdict.FITS:
        return Status.FITS
    return Status.TIGHT if peak.verdict is Verdict.TIGHT else Status.DOES_NOT_FIT


def _order(plan: PlanRequest, cand: _Cand) -> tuple:
    """The walk's order: the objective's key (time and GPUs are exact before any peak is known); a
    candidate left unpriced (its bound above the limit: never ranked) last of its kind."""
    step_s = cand.time.step_s if cand.time is not None else math.inf
    if plan.objective is Objective.GPUS:
        return (cand.group.world, step_s)
    if plan.objective is Objective.MEMORY:
        return (cand.lower, step_s)
    return (step_s,)


def _walk(plan: PlanRequest, cands: list[_Cand], limit: float) -> list[_Cand]:
    """Exact evaluation in the objective's order until ``top`` fit (memory: until no lower bound can beat
    the top rows); returns them best first."""
    found: list[_Cand] = []
    for cand in sorted(cands, key=lambda c: _order(plan, c)):
        if plan.objective is Objective.MEMORY and len(found) >= plan.top:
            worst = max(f.exact.peak_bytes for f in found if f.exact is not None)
            if cand.lower > worst:
                break
        elif len(found) >= plan.top:
            break
        if cand.lower > limit:
            cand.status = Status.DOES_NOT_FIT
            continue
        if cand.exact is None:
            request = with_batch(cand.request, cand.b, cand.accum)
            if request.mesh.pp > 1 and _allocated_over(request):
                cand.stage_over, cand.status = True, Status.DOES_NOT_FIT
                continue
            ends = _end_stages(request) if request.mesh.pp > 1 else {}
            if any(row.verdict is Verdict.DOES_NOT_FIT for row in ends.values()):
                cand.stage_over, cand.status = True, Status.DOES_NOT_FIT
                continue
            cand.exact = _exact(request, ends)
        cand.status = _status_of(cand.exact)
        if cand.status is Status.FITS:
            found.append(cand)
    if plan.objective is Objective.MEMORY:
        found.sort(key=lambda c: (c.exact.peak_bytes if c.exact else 0, c.time.step_s))
        for extra in found[plan.top :]:
            extra.status = Status.FITS
        found = found[: plan.top]
    for cand in found:
        cand.status = Status.RANKED
    return found


def _row(plan: PlanRequest, cand: _Cand, rank: int | None) -> PlanRow:
    g, peak, t = cand.group, cand.exact, cand.time
    assert t is not None, "a row's candidate is priced (its bound is within the limit, or every one is)"
    request = cand.request
    return PlanRow(
        rank=rank,
        status=cand.status,
        framework=g.framework,
        strategy=g.strategy,
        title=FRAMEWORKS[g.framework].title_of(g.strategy),
        gpus=g.world,
        gpus_per_node=g.gpus_per_node,
        micro_batch=cand.b,
        grad_accum=cand.accum,
        recompute=g.recompute,
        offload_optimizer=g.offload_optimizer,
        offload_params=g.offload_params,
        reduce_dtype=g.reduce_dtype,
        prefetch=g.prefetch,
        grad_sync=g.grad_sync,
        tp=g.tp,
        cp=g.cp,
        pp=g.pp,
        vpp=g.vpp,
        ep=g.ep,
        peak_exact=peak is not None,
        peak_bytes=peak.peak_bytes if peak is not None else None,
        peak_lower_bound_bytes=cand.lower,
        verdict=peak.verdict if peak is not None else None,
        headroom_bytes=peak.headroom_bytes if peak is not None else None,
        host_bytes_per_node=_host_bytes(peak, request) if peak is not None else None,
        compute_s=t.compute_s,
        matmul_s=t.matmul_s,
        attention_s=t.attention_s,
        elementwise_s=t.elementwise_s,
        optimizer_s=t.optimizer_s,
        recompute_s=t.recompute_s,
        comm_s=t.comm_s,
        exposed_comm_s=t.exposed_comm_s,
        bubble_s=t.bubble_s,
        offload_s=t.offload_s,
        step_s=t.step_s,
        tokens_per_s_per_gpu=t.tokens_per_s_per_gpu,
        mfu=t.mfu,
        memory_options=memory_options(plan, g, cand.b),
        comm_options=comm_options(plan, g, cand.b),
    )
