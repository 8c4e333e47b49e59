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
  ranking is the one a brute-force exact evaluation of every candidate gives (tests/plan/test_plan.py).
  Candidates never reached keep their lower bound (``peak_exact`` false in JSON).
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.display import FigureDisplay
from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.base.parts import UNCACHED, PartCache
from zerocalc.comm.mesh import mesh_problem
from zerocalc.comm.step import (
    CPU_ADAM_BYTES_PER_PARAM,
    HOST_MEMORY_BPS,
    NVME_BPS,
    PCIE_BPS,
    StepTime,
    compute_bound_s,
    step_time,
)
from zerocalc.compute.ops import MFU_FORMULA
from zerocalc.model.activations import Recompute
from zerocalc.model.code import LossImpl
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, StrategyName
from zerocalc.peak.evaluate import FIT_MARGIN, OUTSIDE_BYTES, pipeline_peak, strategy_peak
from zerocalc.peak.report import StrategyPeak, Verdict
from zerocalc.peak.simulate import (
    FIRST_STAGE_SAVED,
    first_stage_in_flight,
    flash_attention_used,
    keeps_in_flight,
    runtime_for,
    simulate,
)
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.plan.allocated import MODEL_STEP_PARTS
from zerocalc.plan.candidates import AtBatch, Bases, CandidateRequests, group_requests, printed_options
from zerocalc.plan.space import Group, Objective, PlanRequest, enumerate_groups, plain_savers, saver_twins
from zerocalc.request.options import Command, OptionsEcho
from zerocalc.request.training import TrainingRequest
from zerocalc.states.memory import STATES_BYTES, strategy_row

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
    sequence_parallel: bool = Field(default=False, description="sequence parallelism over the TP group")
    fp8: Fp8RecipeName = Field(default=Fp8RecipeName.NONE, description="the FP8 recipe (none: 16-bit GEMMs)")
    fp8_all_gather: bool = Field(default=False, description="the FP8 weights all-gathered in FP8")
    loss: LossImpl = Field(default=LossImpl.FULL, description="the cross-entropy (memory's --loss)")
    optimizer_in_backward: bool = Field(default=False, description="the optimizer stepped in backward")
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
    mfu: float = Field(description=MFU_FORMULA)
    memory_options: dict[str, str] = Field(description="zerocalc memory's options (concept → value)")
    comm_options: dict[str, str] = Field(description="zerocalc comm's options (concept → value)")


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    candidates: int


class PlanEcho(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    method: str | None = Field(
        default=None, description="the fine-tuning method every candidate runs (None: full training)"
    )
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


class PlanResult(FigureDisplay, BaseModel):
    """The search's result; in a notebook, ``plan --html``'s figure and tables (plotly installed)."""

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
        description="every candidate's peak (its lower bound), the communication and step time of each "
        "the walk reaches (all of them with --all-candidates), and the ranking"
    )
    exact_seconds: float = Field(description="the walk's exact peaks (memory's model, allocator replay)")
    candidates_per_second: float = Field(description="candidates_evaluated / search_seconds")
    assumptions: list[str]
    candidates: list[PlanRow] | None = Field(
        default=None, description="every candidate (--json --all-candidates)"
    )


ASSUMPTIONS = [
    "b·A·d equals the global batch exactly (in sequences; d = N/(t·c·p) data-parallel replicas); N: --gpus "
    "and every smaller number of whole nodes",
    "compute: each layer's GEMMs, attention and element-wise kernels at their shapes, at the rates of the "
    "GPU's compute table (measured by zerocalc bench --compute, or the preset's); recompute full re-runs the "
    "layers' forward, selective eager attention's core (Korthikanti et al. 2022); " + MFU_FORMULA,
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
    __slots__ = (
        "accum",
        "b",
        "bound_s",
        "exact",
        "group",
        "lower",
        "requests",
        "stage_over",
        "status",
        "time",
    )

    def __init__(
        self, group: Group, requests: CandidateRequests, t: StepTime | None, lower: int, bound_s: float | None
    ):
        self.group, self.time = group, t
        self.bound_s = bound_s
        """Where it is not priced yet but can be ranked: its step's lower bound (its slowest stage's
        micro-batches, :func:`~zerocalc.comm.step.compute_bound_s`); the walk prices it when it reaches the
        bound."""
        self.b, self.accum = requests.b, requests.accum
        self.requests = requests
        """Its memory and comm requests (:mod:`zerocalc.plan.candidates`)."""
        self.lower = lower
        """The allocated peak (exact) + the CUDA context + the NCCL communicators: the device peak's lower
        bound."""
        self.exact: StrategyPeak | None = None
        self.stage_over = False
        """A pipeline stage's exact peak is above the GPU's memory: the candidate does not fit (its worst
        stage, :attr:`exact`, not computed)."""
        self.status: Status = Status.NOT_RANKED

    @property
    def request(self) -> TrainingRequest:
        """Its memory request."""
        return self.requests.memory

    @property
    def comm(self) -> TrainingRequest:
        """Its comm request."""
        return self.requests.comm


def _timeline_peak(request: TrainingRequest) -> int:
    """The steady step's allocated peak from the request's whole timeline, where the step's two parts do
    not split it: under FSDP2's float8 all-gather each block's new FP8 scales are the framework's
    (``fsdp_post_all_gather``), and the forward's saved copies of them are freed with the block's saved
    tensors, by the model's backward (:mod:`zerocalc.peak.mechanics`, :mod:`zerocalc.peak.timeline`)."""
    name = request.strategies[0]
    states, _ = STATE_BUILDERS[request.framework_record.states](request, STRATEGIES[name])
    steady = simulate(request, name, runtime_for(request), states, reserve=False)
    return max(allocated for _, _, allocated in steady.events)


def _end_stages(request: TrainingRequest) -> dict[int, StrategyPeak]:
    """The peaks of the first and the last pipeline stage (which hold the embedding and the most
    micro-batches in flight, or the head and the loss): where one alone exceeds the GPU's memory the worst
    stage does, and the candidate does not fit without its other stages evaluated."""
    runtime, record, name = runtime_for(request), request.framework_record, request.strategies[0]
    return {
        stage: strategy_peak(request.with_(stage=stage), record, name, runtime)
        for stage in (0, request.mesh.pp - 1)
    }


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
        if allocated + OUTSIDE_BYTES.run(staged, UNCACHED, name) > capacity:
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
    flash: bool

    @classmethod
    def of(cls, plan: PlanRequest) -> _Setting:
        base = plan.base
        assert base.gpu_memory_bytes is not None
        return cls(
            limit=base.gpu_memory_bytes - FIT_MARGIN * base.gpu_memory_bytes, flash=flash_attention_used(base)
        )


class _Resolver:
    """Each group's candidates, every one given its step time and its peak's lower bound, each from the parts
    of comm's step (:data:`~zerocalc.comm.step.STEP`) and the peak's (:data:`~zerocalc.plan.allocated.
    FRAMEWORK_PART`, :data:`~zerocalc.plan.allocated.MODEL_PART`, :data:`~zerocalc.states.memory.
    STATES_BYTES`, :data:`~zerocalc.peak.evaluate.OUTSIDE_BYTES`, :data:`~zerocalc.peak.simulate.
    FIRST_STAGE_SAVED`), shared among the search's candidates by the keys their declarations give."""

    def __init__(self, plan: PlanRequest, setting: _Setting, price_all: bool = True):
        self.plan, self.setting = plan, setting
        self.price_all = price_all
        """False: a candidate whose bound is above the fit limit gets no step time (it cannot be ranked);
        True: every candidate gets one (the JSON's list of them)."""
        self.bases = Bases.of(plan)
        self.parts = PartCache()

    def outside(self, request: TrainingRequest) -> int:
        """The CUDA context and the NCCL communicators of the request's strategy."""
        return self.parts.get(OUTSIDE_BYTES, request, request.strategies[0])

    def candidates(self, group: Group) -> list[_Cand] | InputError:
        """The group's candidates, or why the parser refuses the group."""
        try:
            requests = group_requests(self.plan, group, self.bases)
        except InputError as exc:
            return exc
        if group.model_parallel:
            return self._mesh_candidates(group, requests)
        outside = self.outside(requests[0].memory)
        peaks = self._allocated(requests, outside)
        return [self._candidate(group, r, peaks[r.b] + outside) for r in requests]

    def _candidate(self, group: Group, requests: CandidateRequests, lower: int) -> _Cand:
        """The candidate of its lower bound: priced where every candidate is listed (``price_all``), else
        given its step's lower bound where it can fit (the walk prices it when it reaches it,
        :func:`_in_order`): one whose peak's bound is above the fit limit cannot be ranked."""
        if self.price_all:
            return _Cand(group, requests, self._step(requests), lower, None)
        if lower > self.setting.limit:
            return _Cand(group, requests, None, lower, None)
        bound = compute_bound_s(requests.comm, self.plan.compute, self.parts)
        return _Cand(group, requests, None, lower, bound)

    def _step(self, requests: CandidateRequests) -> StepTime:
        comm = requests.comm
        return step_time(comm, self.plan.compute, comm.strategies[0], self.parts)

    def price(self, cand: _Cand) -> None:
        """The candidate's step time, from its bound's parts and the rest of the step's."""
        cand.time = self._step(cand.requests)
        assert cand.bound_s is not None and cand.time.step_s >= cand.bound_s, "a step below its bound"
        cand.bound_s = None

    def _allocated(self, requests: list[CandidateRequests], outside: int, states: int = 0) -> dict[int, int]:
        """Each candidate's allocated peak, exact, from the step's parts (:class:`~zerocalc.plan.allocated.
        StepParts` of its model); where not every candidate is listed, a lower bound above the fit limit
        instead for each micro-batch beyond the first whose peak is above it (:meth:`~zerocalc.plan.
        allocated.StepParts.peaks_up_to`: the model's part's floor or that first one's exact peak, no part
        run for them; the framework's part none where none can fit by the model's part and the bytes the
        framework holds): it cannot be
        ranked; where the states alone are above, 0 (no part run; ``outside`` + ``states`` bounds it). The
        candidates' lower bounds are printed only in the list of every candidate, where they are exact."""
        first = requests[0].memory
        if first.fp8.all_gather and first.framework_record.is_torch:
            return {r.b: _timeline_peak(r.memory) for r in requests}
        room = self.setting.limit - outside
        """Allocated bytes above which a candidate cannot fit."""
        if not self.price_all and states > room:
            return {r.b: 0 for r in requests}
        parts = self.parts.get(MODEL_STEP_PARTS, first)
        # the model's part of a candidate's step reads what its memory and comm requests agree on
        at_b = AtBatch(requests)
        if not self.price_all:
            peaks = parts.peaks_up_to(at_b, above=room, framework_of=first)
            if peaks is not None:
                return peaks
        return parts.allocated_peaks(at_b, framework_of=first)

    def _mesh_candidates(self, group: Group, requests: list[CandidateRequests]) -> list[_Cand] | InputError:
        """A model-parallel group's candidates: each one's step time and communication are ``comm``'s for
        its request; its peak's lower bound is the context, the NCCL communicators and the model states of
        the largest rank (:func:`~zerocalc.states.memory.strategy_row`: all resident between the last backward
        and the optimizer step), the exact peak left to the walk; with pipeline stages and no
        recomputation, at least the first stage's in-flight activations (:func:`~zerocalc.peak.simulate.
        in_flight_saved_bytes`) where they are more. Without pipeline stages the rank's steady step is one
        timeline, as a data-parallel candidate's: its allocated peak is exact from the step's parts
        (:class:`~zerocalc.plan.allocated.StepParts` of the rank's model), and the bound is that peak + the
        context and the communicators. A candidate whose bound is above the fit limit cannot be ranked: it is
        priced only where every candidate is listed (``price_all``)."""
        first = requests[0]
        states = self.parts.get(STATES_BYTES, first.memory)
        outside = self.outside(first.memory)
        problem = mesh_problem(first.comm.model.architecture, first.comm.mesh, first.comm.framework)
        if problem:  # what pricing would refuse, refused whether or not it is priced
            return InputError(problem)
        if group.pp == 1:
            allocated = self._allocated(requests, outside, states)
        else:
            keeps = keeps_in_flight(first.memory)  # else no micro-batch's saves are counted
            allocated = {r.b: self._in_flight(r.comm) if keeps else 0 for r in requests}  # both agree on it
        return [self._candidate(group, r, outside + max(states, allocated[r.b])) for r in requests]

    def _in_flight(self, request: TrainingRequest) -> int:
        """The first pipeline stage's in-flight activations (:func:`~zerocalc.peak.simulate.
        in_flight_saved_bytes`: one micro-batch's saves, :data:`~zerocalc.peak.simulate.FIRST_STAGE_SAVED`,
        times the micro-batches in flight)."""
        saved = self.parts.get(FIRST_STAGE_SAVED, request)
        if not saved:
            return 0
        mesh = request.mesh
        return first_stage_in_flight(mesh.pp_schedule, mesh.pp, request.grad_accum) * saved


def _resolve(
    plan: PlanRequest,
    setting: _Setting,
    groups: list[Group],
    rejected: Counter[str],
    on_progress: Callable[[int, int], None] | None,
    resolver: _Resolver,
) -> list[_Cand]:
    """Every candidate of the groups the parser accepts (the others counted in ``rejected``)."""
    cands: list[_Cand] = []
    step = max(1, len(groups) // 20)
    every = resolver.price_all or plan.objective is Objective.MEMORY
    for index, group in enumerate(groups):
        if on_progress is not None and index % step == 0:
            on_progress(index, len(groups))
        members = _members(resolver, group, rejected)
        cands += members
        over = tuple(c.b for c in members if every or c.lower > setting.limit)
        if over:
            cands += _twins(plan, resolver, group, over, rejected)
    if on_progress is not None:
        on_progress(len(groups), len(groups))
    return cands


def _members(resolver: _Resolver, group: Group, rejected: Counter[str]) -> list[_Cand]:
    """The group's candidates, none where the parser refuses it (its reason counted)."""
    members = resolver.candidates(group)
    if isinstance(members, InputError):
        rejected[_reason(members)] += len(group.micro_batches)
        return []
    return members


def _twins(
    plan: PlanRequest, resolver: _Resolver, group: Group, bs: tuple[int, ...], rejected: Counter[str]
) -> list[_Cand]:
    """The candidates of the group at ``bs`` with the other memory savers (:func:`~zerocalc.plan.space.
    saver_twins`)."""
    return [c for twin in saver_twins(plan, group, bs) for c in _members(resolver, twin, rejected)]


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
    resolver = _Resolver(plan, setting, price_all=keep_all)
    cands = _resolve(plan, setting, groups, rejected, on_progress, resolver)
    pricing = _Timed(resolver.price)
    searched = time.perf_counter()
    plain = plain_savers(plan)

    def more(cand: _Cand) -> list[_Cand]:
        """A plain candidate the walk found not to fit by its exact peak: its twins with the other savers
        (those whose bound did not fit have theirs already, and the memory objective every one)."""
        if keep_all or plan.objective is Objective.MEMORY:
            return []
        if (cand.group.loss, cand.group.optimizer_in_backward) != plain:
            return []
        return _twins(plan, resolver, cand.group, (cand.b,), rejected)

    ranked = _walk(plan, cands, setting.limit, pricing, more)
    walked = time.perf_counter()
    _settle(cands, setting.limit, rejected)
    exact_s = walked - searched - pricing.seconds  # the walk's exact peaks; its pricing is the search's
    seconds = time.perf_counter() - start - exact_s
    rows = [_row(plan, c, i + 1) for i, c in enumerate(ranked)]
    everything = None
    if keep_all:
        ranks = {id(c): i + 1 for i, c in enumerate(ranked)}
        everything = [_row(plan, c, ranks.get(id(c))) for c in cands]
    exact_count = sum(1 for c in cands if c.exact is not None or c.stage_over)
    base = plan.base
    assert base.gpu_memory_bytes is not None
    return PlanResult(
        request=PlanEcho(
            model=plan.model,
            method=plan.method,
            gpu=plan.gpu_label,
            max_gpus=plan.max_gpus,
            gpus_per_node=plan.gpus_per_node,
            global_batch_sequences=plan.global_batch_sequences,
            global_batch_tokens=plan.global_batch_tokens,
            seq_len=plan.seq_len,
            frameworks=plan.frameworks,
            objective=plan.objective,
            top=plan.top,
            compute_table=plan.compute_name,
            peak_tflops=base.runtime.bf16_dense_tflops,
            gpu_memory_bytes=base.gpu_memory_bytes,
            calibration=plan.calibration_path,
        ),
        top=rows,
        rejections=[Rejection(reason=r, candidates=n) for r, n in rejected.most_common()],
        candidates_evaluated=len(cands),
        exact_peaks=exact_count,
        lower_bound_peaks=len(cands) - exact_count,
        groups=len(groups),
        seconds=seconds + exact_s,
        search_seconds=seconds,
        exact_seconds=exact_s,
        candidates_per_second=len(cands) / seconds if seconds > 0 else 0.0,
        assumptions=ASSUMPTIONS + ([MESH_ASSUMPTION] if any(g.model_parallel for g in groups) else []),
        candidates=everything,
    )


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


class _Timed:
    """A candidate's pricing (:meth:`_Resolver.price`), its seconds summed."""

    def __init__(self, price: Callable[[_Cand], None]):
        self.price, self.seconds = price, 0.0

    def __call__(self, cand: _Cand) -> None:
        start = time.perf_counter()
        self.price(cand)
        self.seconds += time.perf_counter() - start


def _order(plan: PlanRequest, cand: _Cand) -> tuple:
    """The walk's order: the objective's key (time and GPUs are exact before any peak is known); a
    candidate not priced yet by its step's lower bound (:attr:`_Cand.bound_s`, :func:`_in_order`); one left
    unpriced (its peak's bound above the limit: never ranked) last of its kind."""
    step_s = (
        cand.time.step_s if cand.time is not None else cand.bound_s if cand.bound_s is not None else math.inf
    )
    if plan.objective is Objective.GPUS:
        return (cand.group.world, step_s)
    if plan.objective is Objective.MEMORY:
        return (cand.lower, step_s)
    return (step_s,)


def _in_order(plan: PlanRequest, cands: list[_Cand], price: Callable[[_Cand], None]) -> Iterator[_Cand]:
    """The candidates in the walk's order, the order of ``sorted(cands, key=_order)`` (ties by position),
    each one not priced yet priced (``price``) when its step's lower bound is the least key left: a step
    is at least its bound, so every candidate after it is after it by its priced key too, and the walk
    prices only the candidates it reaches. Candidates appended to ``cands`` while it walks (a saver's
    twins, :func:`_walk`) join the order."""
    heap = [(_order(plan, cand), index) for index, cand in enumerate(cands)]
    heapq.heapify(heap)
    known = len(cands)
    while heap or known < len(cands):
        for index in range(known, len(cands)):
            heapq.heappush(heap, (_order(plan, cands[index]), index))
        known = len(cands)
        _, index = heapq.heappop(heap)
        cand = cands[index]
        if cand.bound_s is not None:
            price(cand)
            heapq.heappush(heap, (_order(plan, cand), index))
        else:
            yield cand


def _walk(
    plan: PlanRequest,
    cands: list[_Cand],
    limit: float,
    price: Callable[[_Cand], None],
    more: Callable[[_Cand], list[_Cand]] = lambda _: [],
) -> list[_Cand]:
    """Exact evaluation in the objective's order until ``top`` fit (memory: until no lower bound can beat
    the top rows); returns them best first. A candidate that does not fit by its exact peak adds
    ``more(cand)`` to the walk (its memory savers' twins: the same step time, so next in the order)."""
    found: list[_Cand] = []
    for cand in _in_order(plan, cands, price):
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
            request = cand.request
            if request.mesh.pp > 1 and _allocated_over(request):
                cand.stage_over, cand.status = True, Status.DOES_NOT_FIT
                cands += more(cand)
                continue
            ends = _end_stages(request) if request.mesh.pp > 1 else {}
            if any(row.verdict is Verdict.DOES_NOT_FIT for row in ends.values()):
                cand.stage_over, cand.status = True, Status.DOES_NOT_FIT
                cands += more(cand)
                continue
            cand.exact = _exact(request, ends)
        cand.status = _status_of(cand.exact)
        if cand.status is Status.FITS:
            found.append(cand)
        else:
            cands += more(cand)
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
        sequence_parallel=g.sequence_parallel,
        fp8=g.fp8.recipe,
        fp8_all_gather=g.fp8.all_gather,
        loss=g.loss,
        optimizer_in_backward=g.optimizer_in_backward,
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
        memory_options=printed_options(plan, g, request, Command.MEMORY),
        comm_options=printed_options(plan, g, cand.comm, Command.COMM),
    )
