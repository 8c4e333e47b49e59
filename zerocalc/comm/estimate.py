"""Communication per optimizer step: the collectives each strategy issues, bytes per GPU, and time.

Schedules come from the Strategy records (:mod:`zerocalc.parallel.strategies`): the ZeRO paper's (§7) for
``--framework paper`` (and megatron), and each framework's own otherwise, every rule citing the source it
follows. :mod:`zerocalc.comm.calls` turns each rule into its calls (one per FSDP unit, DDP bucket, parameter
...); this module costs them:

* bytes each GPU sends per call: the nccl-tests bus factors of :mod:`zerocalc.network.collectives` (ring
  algorithm): all_reduce 2(n-1)/n·S, reduce_scatter, all_gather and all_to_all (n-1)/n·S, broadcast S;
* how many times a rule runs per step (A micro-batches): once, A times, or once per micro-batch that
  synchronises gradients (A under ``every``, 1 under ``last``; fixed by DeepSpeed's stages and by the
  paper's accounting, chosen by the training loop under PyTorch, whose default is ``every``);
* time = α per call + bytes / β, with β the bus bandwidth of the rule's process group (a group with
  ranks on more than one node runs at the inter-node figure).

At A = 1 the paper's ZeRO-1/2 move exactly DDP's 2Ψ and ZeRO-3 3Ψ (1.5×), as the ZeRO paper's section 7
states.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from zerocalc.base.display import TableDisplay
from zerocalc.base.dtypes import DType
from zerocalc.base.errors import literal
from zerocalc.base.units import format_count, format_seconds, format_size, gib, plural, summary_repr
from zerocalc.comm.calls import Call, Layout
from zerocalc.comm.collectives import (
    CollectiveRun,
    DataPart,
    bytes_sent,
    collective_runs,
    data_parts,
    fit_for,
    mesh_request,
    times_per_step,
)
from zerocalc.comm.mesh import (
    Dimension,
    MeshCollectiveCost,
    MeshRequest,
    mesh_costs,
    mesh_fit,
)
from zerocalc.comm.pipeline import PipelineComm, pipeline_comm
from zerocalc.comm.step import StepEstimate, step_estimate
from zerocalc.compute.fp8 import fp8_rate_note
from zerocalc.compute.table import ComputeTable
from zerocalc.model.activations import Recompute
from zerocalc.model.code import Compiled
from zerocalc.network.calibration import Calibration
from zerocalc.network.cluster import Cluster, RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.links import Bandwidths, BandwidthSource
from zerocalc.network.schedule import GradSync, Phase, Tensor, ZeroPP
from zerocalc.parallel.framework_records import FRAMEWORKS, effective_grad_sync
from zerocalc.parallel.frameworks import TORCH_NO_SYNC, Framework
from zerocalc.parallel.mesh import Mesh
from zerocalc.parallel.precision import PrecisionName
from zerocalc.parallel.strategies import StrategyName, row_named
from zerocalc.parallel.zeropp import active_features
from zerocalc.request.echo import RequestEcho
from zerocalc.request.options import OptionsEcho
from zerocalc.request.training import TrainingRequest
from zerocalc.states.memory import routing_assumption

SCHEMA_VERSION = 2


class CommRequest(RequestEcho):
    """The request as the communication estimate echoes it in its JSON."""

    SOURCES: ClassVar[dict[str, str]] = {
        "params": "model.params",
        "model": "model.name",
        "micro_batch": "activations.micro_batch",
        "seq_len": "activations.seq_len",
        "recompute": "activations.recompute",
        "ddp_bucket_bytes": "buffers.ddp_bucket_bytes",
        "ddp_first_bucket_bytes": "buffers.ddp_first_bucket_bytes",
        "reduce_bucket_elements": "buffers.reduce_bucket_elements",
        "bandwidths": "links",
    }

    params: int = Field(gt=0, description="Ψ")
    model: str | None = Field(
        default=None, description="the architecture's name (--model), None with --params"
    )
    cluster: Cluster
    mesh: Mesh
    precision: PrecisionName
    framework: Framework
    grad_accum: int = Field(ge=1, description="A: micro-batches per optimizer step")
    micro_batch: int = Field(ge=1, description="b: sequences per micro-batch per GPU")
    seq_len: int = Field(ge=1, description="s: tokens per sequence")
    recompute: Recompute = Field(description="activation recomputation (re-runs forward collectives)")
    grad_sync: GradSync | None = Field(description="as asked; None: each framework's default")
    reduce_dtype: DType | None = Field(description="None: the gradient dtype")
    zeropp: tuple[ZeroPP, ...] = ()
    ddp_bucket_bytes: int
    ddp_first_bucket_bytes: int
    reduce_bucket_elements: int = Field(description="DeepSpeed reduce_bucket_size")
    strategies: tuple[StrategyName, ...]
    bandwidths: Bandwidths
    tokens_per_step: int | None = Field(default=None, gt=0)
    tflops: float | None = Field(default=None, gt=0, description="achieved TFLOP/s per GPU")


class UnitCalls(BaseModel):
    """The calls of one collective that move one FSDP unit, DDP or DeepSpeed bucket, or one rank's
    parameters (a broadcast's source), each time the collective runs (frozen: costs that make the same calls
    share them)."""

    model_config = ConfigDict(frozen=True)

    unit: str
    elements: list[int] = Field(description="S of each call, in elements")
    source_rank: int | None = Field(default=None, description="the broadcasting rank")
    message_bytes: int = Field(description="Σ S")
    bytes_sent_per_gpu: int = Field(description="Σ over the calls of factor(n)·S")


class CollectiveCost(BaseModel):
    op: Collective
    phase: Phase
    tensor: Tensor
    scales: bool = Field(default=False, description="the fp32 scales of a quantized collective (ZeRO++)")
    dtype: DType
    group: RankGroup
    group_size: int
    spans_nodes: bool
    times_per_step: int = Field(description="how many times the collective runs per optimizer step")
    calls_per_step: int = Field(description="times × calls each time (one per unit, bucket, parameter ...)")
    message_bytes: int = Field(description="Σ S of the calls each time it runs (S: nccl-tests' whole array)")
    bytes_sent_per_gpu: int = Field(description="each time it runs: Σ factor(n)·S over its calls")
    total_bytes_per_gpu: int = Field(description="per step: times × bytes each time")
    latency_s: float
    bus_bandwidth_Bps: float
    time_s: float = Field(description="per step: calls × α + bytes / β")
    bandwidth_source: BandwidthSource
    behaviour: str
    units: list[UnitCalls]


class DimensionComm(BaseModel):
    """What one dimension of the mesh sends per GPU per step, over its groups."""

    dimension: Dimension
    group_size: int = Field(description="ranks of one group (dp: the dp × cp ranks of one TP index)")
    stride: int = Field(
        description="the distance between consecutive ranks of a group: 1 (tp), t (cp, dp, ep)"
    )
    spans_nodes: bool = Field(description="a group has ranks on more than one node")
    calls_per_step: int = Field(description="Σ over the dimension's collectives")
    total_bytes_per_gpu: int = Field(description="Σ over the dimension's collectives")
    time_s: float = Field(description="Σ over the dimension's collectives")


class StrategyComm(BaseModel):
    strategy: StrategyName
    title: str
    schedule_source: str = Field(description="whose schedule the collectives follow")
    grad_sync: GradSync = Field(description="when gradients are reduced, as assumed")
    grad_sync_reason: str
    collectives: list[CollectiveCost] = Field(description="the data-parallel collectives")
    mesh_collectives: list[MeshCollectiveCost] = Field(
        default_factory=list,
        description="the tensor-, context- and expert-parallel collectives (none at tp = cp = ep = 1)",
    )
    dimensions: list[DimensionComm] = Field(
        default_factory=list,
        description="per dimension of the mesh: dp, then tp, cp, pp and ep where above 1",
    )
    calls_per_step: int = Field(description="every dimension's")
    total_bytes_per_gpu: int = Field(description="every dimension's")
    intra_node_bytes_per_gpu: int
    inter_node_bytes_per_gpu: int
    time_s: float = Field(description="every dimension's")
    ratio_to_ddp: float | None = Field(
        description="data-parallel bytes / DDP's under the same framework (PyTorch's DDP for FSDP2, the "
        "paper's for DeepSpeed); None without data-parallel communication"
    )
    exposed_time_s: float | None = Field(default=None, description="max(0, comm − compute)")
    hidden_time_s: float | None = Field(default=None, description="min(comm, compute): could overlap compute")
    step: StepEstimate | None = Field(
        default=None,
        description="the step time of this configuration on one GPU (with {model} and a compute table: "
        "{gpu}'s preset or {compute_calibration})",
    )


class ComputeTime(BaseModel):
    flops_per_step: float = Field(description="6·Ψ·T (Kaplan et al. 2020)")
    seconds: float = Field(description="6·Ψ·T / (N·F)")


class CommEstimate(TableDisplay, BaseModel):
    schema_version: int = SCHEMA_VERSION
    request: CommRequest
    options: OptionsEcho = None
    calibration_used: str | None = None
    notes: list[str] = Field(default=[])
    compute: ComputeTime | None = None
    strategies: list[StrategyComm]
    pipeline: PipelineComm | None = Field(
        default=None, description="pipeline parallelism: the sends between stages and the bubble"
    )

    def row(self, name: StrategyName | str) -> StrategyComm:
        """The row of a strategy, by any of its names (``fsdp``, ``full_shard``, ``zero3``)."""
        return row_named(self.strategies, name)

    def summary(self) -> list[tuple[str, object]]:
        """What a one-line repr shows: Ψ, N, the framework and each strategy's bytes and time per step."""
        request = self.request
        head = [
            ("params", format_count(request.params)),
            ("gpus", request.mesh.world),
            ("framework", request.framework.value),
        ]
        return head + [
            (row.strategy.value, f"{gib(row.total_bytes_per_gpu)} in {format_seconds(row.time_s)}")
            for row in self.strategies
        ]

    def __repr__(self) -> str:
        return summary_repr(type(self).__name__, self.summary())

    def __rich_repr__(self) -> Iterator[tuple[str, object]]:
        yield from self.summary()


def _calibration_notes(calibration: Calibration, name: str, rows: list[StrategyComm]) -> list[str]:
    """Where a calibration is used beyond what it measured: calls larger or smaller than its sweep's sizes
    (its fit extrapolated), and a table mixing a calibration of another backend than NCCL with the
    NCCL-class link figures."""
    notes = []
    sizes: dict[tuple[Collective, bool], list[int]] = {}
    mixed = False
    for row in rows:
        for cost in row.collectives:
            if cost.bandwidth_source is not BandwidthSource.CALIBRATION:
                mixed = True
                continue
            calls = [s * cost.dtype.bytes for unit in cost.units for s in unit.elements]
            sizes.setdefault((cost.op, cost.spans_nodes), []).extend(calls)
    for (op, spans_nodes), calls in sizes.items():
        fit = fit_for(op, spans_nodes, calibration)
        measured = calibration.measured_range(op, fit.group_kind) if fit is not None else None
        if fit is None or measured is None or not calls:
            continue
        low, high = measured
        if min(calls) < low or max(calls) > high:
            notes.append(
                f"calibration {literal(name)} measured {op.value} over {fit.group_kind.value} groups of "
                f"{fit.group_size} from {format_size(low)} to {format_size(high)} per call; these calls move "
                f"{format_size(min(calls))} to {format_size(max(calls))}: its fit is extrapolated"
            )
    if sizes and mixed and calibration.backend != "nccl":
        notes.append(
            f"calibration {literal(name)} was measured with {calibration.backend} on "
            f"{literal(calibration.device_name)}; the collectives it has no fit for use NCCL-class link "
            "figures: times in one table mix the two (β from, per collective)"
        )
    return notes


def _mesh_calibration_notes(calibration: Calibration, name: str, rows: list[StrategyComm]) -> list[str]:
    """Tensor- and context-parallel calls larger or smaller than the sweep behind the fit that priced them
    (its fit extrapolated)."""
    sizes: dict[tuple[Collective, bool, int], list[int]] = {}
    for row in rows:
        for cost in row.mesh_collectives:
            if cost.bandwidth_source is BandwidthSource.CALIBRATION:
                key = (cost.op, cost.spans_nodes, cost.group_size)
                sizes.setdefault(key, []).extend(s * cost.dtype.bytes for s in cost.elements)
    notes = []
    for (op, spans_nodes, group_size), calls in sizes.items():
        fit = mesh_fit(op, spans_nodes, group_size, calibration)
        measured = calibration.measured_range(op, fit.group_kind) if fit is not None else None
        if fit is None or measured is None:
            continue
        low, high = measured
        if min(calls) < low or max(calls) > high:
            notes.append(
                f"calibration {literal(name)} measured {op.value} over {fit.group_kind.value} groups of "
                f"{fit.group_size} from {format_size(low)} to {format_size(high)} per call; the tensor- and "
                f"context-parallel calls move {format_size(min(calls))} to {format_size(max(calls))}: "
                "its fit is extrapolated"
            )
    return notes


_UNIT_CALLS = TypeAdapter(tuple[UnitCalls, ...])
"""Validates a collective's units in one call (a model's collectives have thousands)."""


@lru_cache(maxsize=256)
def _unit_calls(calls: tuple[Call, ...], op: Collective, n: int, element_bytes: int) -> tuple[UnitCalls, ...]:
    """The calls grouped by what they move, in order (once per value: rules of one schedule often make the
    same calls)."""
    grouped: dict[tuple[str, int | None], list[int]] = {}
    for unit, elements, root in calls:
        grouped.setdefault((unit, root), []).append(elements)
    sent = bytes_sent({s for _, s, _ in calls}, op, n, element_bytes)
    return _UNIT_CALLS.validate_python(
        [
            {
                "unit": unit,
                "elements": elements,
                "source_rank": root,
                "message_bytes": sum(elements) * element_bytes,
                "bytes_sent_per_gpu": sum(map(sent.__getitem__, elements)),
            }
            for (unit, root), elements in grouped.items()
        ]
    )


def _cost(collective: CollectiveRun, times: int) -> CollectiveCost:
    run, traffic, link = collective.run, collective.traffic, collective.link
    line, n = run.line, run.ctx.group_size
    per_run = traffic.bytes_sent_per_gpu
    return CollectiveCost(
        op=line.op,
        phase=line.phase,
        tensor=line.tensor,
        scales=collective.scales,
        dtype=collective.dtype,
        group=line.group,
        group_size=n,
        spans_nodes=run.spans_nodes,
        times_per_step=times,
        calls_per_step=times * traffic.calls.count,
        message_bytes=traffic.message_bytes,
        bytes_sent_per_gpu=per_run,
        total_bytes_per_gpu=times * per_run,
        latency_s=link.latency_s,
        bus_bandwidth_Bps=link.bus_bandwidth_Bps,
        time_s=times * collective.seconds,
        bandwidth_source=link.source,
        behaviour=line.behaviour,
        units=list(_unit_calls(traffic.calls.each(), line.op, n, collective.dtype.bytes)),
    )


def grad_sync_reason(
    framework: Framework, name: StrategyName, asked: GradSync | None, pipelined: bool = False
) -> str:
    """Why gradients are reduced when they are, for the output."""
    record = FRAMEWORKS[framework]
    setup = record.setup(name)
    if setup.grad_sync is not None:
        return "fixed by this schedule"
    if pipelined and record.pipeline_grad_sync is not None:
        return "fixed by the pipeline schedule (torch.distributed.pipelining)"
    hook = TORCH_NO_SYNC[setup.torch.wrapper] if setup.torch is not None else "no_sync()"
    if asked is GradSync.LAST:
        return f"asked: the first A-1 micro-batches run under {hook}"
    if asked is GradSync.EVERY:
        return "asked: every backward reduces"
    return f"PyTorch's default, every backward reduces; grad-sync last if the loop uses {hook}"


def _dimensions(
    request: TrainingRequest,
    costs: list[CollectiveCost],
    mesh_collectives: list[MeshCollectiveCost],
    pipeline: PipelineComm | None = None,
) -> list[DimensionComm]:
    """The data-parallel dimension (the routed experts' collectives over their expert-data-parallel groups
    included), then each model-parallel one above 1, with their totals (the pipeline's: its busiest rank's
    sends)."""
    mesh, cluster = request.mesh, request.cluster
    dimensions = [
        DimensionComm(
            dimension=Dimension.DP,
            group_size=cluster.world_size,
            stride=mesh.tp,
            spans_nodes=cluster.nodes > 1,
            calls_per_step=sum(c.calls_per_step for c in costs),
            total_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in costs),
            time_s=sum(c.time_s for c in costs),
        )
    ]
    for dimension, size, apart, spans in (
        (Dimension.TP, mesh.tp, 1, mesh.tp_spans_nodes),
        (Dimension.CP, mesh.cp, mesh.tp, mesh.cp_spans_nodes),
        (Dimension.EP, mesh.ep, mesh.etp, mesh.ep_spans_nodes),
        (Dimension.ETP, mesh.etp, 1, mesh.etp_spans_nodes),
    ):
        mine = [c for c in mesh_collectives if c.dimension is dimension]
        if size == 1 or (dimension is Dimension.ETP and not mine):
            continue
        dimensions.append(
            DimensionComm(
                dimension=dimension,
                group_size=size,
                stride=apart,
                spans_nodes=spans,
                calls_per_step=sum(c.calls_per_step for c in mine),
                total_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in mine),
                time_s=sum(c.time_s for c in mine),
            )
        )
    if pipeline is not None:
        dimensions.append(
            DimensionComm(
                dimension=Dimension.PP,
                group_size=mesh.pp,
                stride=mesh.tp * mesh.cp * mesh.dp,
                spans_nodes=any(link.spans_nodes for link in pipeline.links),
                calls_per_step=pipeline.busiest_rank_calls,
                total_bytes_per_gpu=pipeline.busiest_rank_bytes,
                time_s=pipeline.busiest_rank_time_s,
            )
        )
    return dimensions


def _data_parallel_costs(name: StrategyName, parts: tuple[DataPart, ...]) -> list[CollectiveCost]:
    """Every data-parallel collective of one strategy's schedule that runs in a step, for each part of the
    parameters over its group (the routed experts' said so in their behaviour)."""
    costs: list[CollectiveCost] = []
    for request, layout, experts, cluster in parts:
        sync = effective_grad_sync(request.framework, name, request.grad_sync, pipelined=request.mesh.pp > 1)
        for collective in collective_runs(name, request, layout, cluster):
            times = times_per_step(collective.run.line.repeat, request.grad_accum, sync)
            if times <= 0:
                continue
            cost = _cost(collective, times)
            if experts:
                where = f"routed experts, over the {cost.group_size:,} expert-data-parallel ranks: "
                cost = cost.model_copy(update={"behaviour": where + cost.behaviour})
            costs.append(cost)
    return costs


def strategy_comm(
    name: StrategyName,
    request: TrainingRequest,
    ddp_bytes: int | None,
    parts: tuple[DataPart, ...] | None = None,
    mesh: MeshRequest | None = None,
    pipeline: PipelineComm | None = None,
) -> StrategyComm:
    """Cost every collective of one strategy's schedule under the request's framework over each part of the
    parameters (:func:`data_parts`), and the tensor-, context- and expert-parallel collectives of ``mesh``
    (:func:`mesh_request`) and the pipeline's sends (:func:`~zerocalc.comm.pipeline.pipeline_comm`) beside
    it (pure)."""
    framework = request.framework
    sync = effective_grad_sync(framework, name, request.grad_sync, pipelined=request.mesh.pp > 1)
    costs = _data_parallel_costs(name, parts or data_parts(request))
    mesh_collectives = mesh_costs(mesh, sync) if mesh is not None else []
    every = [*costs, *mesh_collectives]
    data_parallel = sum(c.total_bytes_per_gpu for c in costs)
    sent = pipeline.busiest_rank_bytes if pipeline else 0
    inter_node = (
        sum(c.total_bytes_per_gpu for c in costs if c.spans_nodes)
        + sum(c.inter_node_bytes_per_gpu for c in mesh_collectives)
        + (pipeline.busiest_rank_inter_node_bytes if pipeline else 0)
    )
    record = FRAMEWORKS[framework]
    setup = record.setup(name)
    return StrategyComm(
        strategy=name,
        title=record.title_of(name),
        schedule_source=setup.schedule_source,
        grad_sync=sync,
        grad_sync_reason=grad_sync_reason(framework, name, request.grad_sync, request.mesh.pp > 1),
        collectives=costs,
        mesh_collectives=mesh_collectives,
        dimensions=_dimensions(request, costs, mesh_collectives, pipeline),
        calls_per_step=sum(c.calls_per_step for c in every)
        + (pipeline.busiest_rank_calls if pipeline else 0),
        total_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in every) + sent,
        intra_node_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in every) + sent - inter_node,
        inter_node_bytes_per_gpu=inter_node,
        time_s=sum(c.time_s for c in every) + (pipeline.busiest_rank_time_s if pipeline else 0.0),
        ratio_to_ddp=(data_parallel / ddp_bytes) if ddp_bytes else None,
    )


def _ddp_reference(parts: tuple[DataPart, ...]) -> int | None:
    """The data-parallel bytes the ratio is taken to: DDP under the same framework (FSDP's is NO_SHARD),
    PyTorch's DDP for FSDP2, else the paper's DDP (DeepSpeed's stage 0 is not modelled)."""
    framework = parts[0].request.framework
    if not FRAMEWORKS[framework].runs(StrategyName.DDP):
        framework = Framework.DDP if FRAMEWORKS[framework].is_torch else Framework.PAPER
    reference = tuple(
        part._replace(request=part.request.model_copy(update={"framework": framework})) for part in parts
    )
    return sum(c.total_bytes_per_gpu for c in _data_parallel_costs(StrategyName.DDP, reference)) or None


def finetune_note(request: TrainingRequest) -> str:
    """What a fine-tuning run's collectives and step count (:mod:`zerocalc.comm.finetune`)."""
    from zerocalc.compute.ops import MFU_FINETUNE
    from zerocalc.parallel.finetune import finetune_counts

    assert request.finetune is not None
    counts = finetune_counts(request.architecture, request.finetune)
    every = counts.trainable + counts.frozen
    return (
        f"fine-tuning: {counts.trainable:,} trained parameters' gradients reduced, all {every:,} "
        f"parameters gathered where the strategy gathers them (frozen and quantised ones "
        f"at their stored dtype); the step runs no weight gradient of a frozen weight; MFU {MFU_FINETUNE}"
    )


def _notes(request: TrainingRequest, layout: Layout, rows: list[StrategyComm]) -> list[str]:
    notes = []
    cluster = request.cluster
    if request.finetune is not None and request.model.architecture is not None:
        notes.append(finetune_note(request))
    if request.mesh.world == 1:
        notes.append("no communication: a single GPU has nothing to reduce or gather")
    if request.mesh.pp > 1:
        largest = request.stages.index(request.rank_model)
        notes.append(
            f"data-parallel collectives of pipeline stage {largest}, the largest (Ψ_s = "
            f"{request.rank_model.params:,}): each stage reduces its own layers over its dp × cp ranks; the "
            "pipeline's sends are its busiest rank's"
        )
    calibration = request.calibration
    used = any(
        c.bandwidth_source is BandwidthSource.CALIBRATION
        for row in rows
        for c in (*row.collectives, *row.mesh_collectives)
    )
    if calibration is not None and not used and request.mesh.world > 1:
        notes.append(
            f"calibration {literal(str(request.calibration_name))} ({plural(calibration.nodes, 'node')} × "
            f"{plural(calibration.gpus_per_node, 'rank')}) covers none of these collectives and groups: "
            "every time uses the link figures below"
        )
    if calibration is not None and used:
        notes += _calibration_notes(calibration, request.calibration_name or "calibration", rows)
        notes += _mesh_calibration_notes(calibration, request.calibration_name or "calibration", rows)
    if request.framework_record.has_own_schedules and not layout.from_architecture:
        notes.append(
            "without {model} the model is one flat array of Ψ elements: bytes that depend on Ψ alone are "
            "exact; call counts (units, buckets, parameters), the root unit's rule, per-unit and "
            "per-parameter padding and DeepSpeed's persistent parameters need {model}"
        )
    if request.grad_sync is not None:
        for row in rows:
            if row.grad_sync is not request.grad_sync:
                notes.append(
                    f"{row.title}: {{grad_sync}} {request.grad_sync.value} does not apply "
                    f"({row.grad_sync_reason})"
                )
    _, zeropp_notes = active_features(frozenset(request.zeropp), cluster)
    notes += zeropp_notes
    if request.mesh.ep > 1:
        notes.append(routing_assumption(request))
    activations = request.activations
    if (
        not request.mesh.model_parallel
        and (activations.recompute is not Recompute.NONE or activations.micro_batch > 1)
        and not any(row.step is not None for row in rows)
    ):
        notes.append(
            "{micro_batch}, {seq_len} and {recompute} size the tensor- and context-parallel collectives; "
            "with {tp} 1 and {cp} 1 there are none: they change nothing here"
        )
    return notes


def _kernel_notes(request: TrainingRequest) -> list[str]:
    """What ``--compile`` and ``--async-tp`` change of a priced step (:mod:`zerocalc.compute.ops`,
    :func:`~zerocalc.comm.overlap.async_tp_exposed`)."""
    notes = []
    compiled = request.activations.compile
    if compiled is not Compiled.NONE:
        notes.append(
            f"{{compile}} {compiled.value}: the compiled part's element-wise work as Inductor's fused "
            "kernels, each priced by the bytes it reads and writes once (docs/model.md, torch.compile); "
            "kernel launches are not modelled"
        )
    if request.overlap.async_tp:
        notes.append(
            "{async_tp}: each layer's TP all-gather and reduce-scatter in t pieces beside the matmul it "
            "feeds or follows (torch's micro-pipelined TP), copied by the copy engines: no SMs taken"
        )
    return notes


def _with_step(
    row: StrategyComm, request: TrainingRequest, compute: ComputeTable, compute_name: str
) -> StrategyComm:
    """The row with its step time (:func:`zerocalc.comm.step.step_estimate`: the step's parts, plan's)."""
    return row.model_copy(update={"step": step_estimate(request, compute, compute_name, row.strategy)})


def evaluate_comm(
    request: TrainingRequest, compute: ComputeTable | None = None, compute_name: str = "compute table"
) -> CommEstimate:
    """The communication of every requested strategy (data parallelism, and tensor and context parallelism
    where the mesh has them), with times, each strategy's step time where the model has an architecture
    and ``compute`` (the GPU's compute table) is given, and the optional compute comparison."""
    mesh = mesh_request(request)
    pipeline = pipeline_comm(request)
    parts = data_parts(request)
    layout = parts[0].layout
    ddp = _ddp_reference(parts)
    rows = [strategy_comm(name, request, ddp, parts, mesh, pipeline) for name in request.strategies]
    if compute is not None and request.model.architecture is not None:
        rows = [_with_step(row, request, compute, compute_name) for row in rows]
    compared = None
    if request.tokens_per_step is not None and request.tflops is not None:
        flops = 6 * request.model.params * request.tokens_per_step
        seconds = flops / (request.mesh.world * request.tflops * 1e12)
        compared = ComputeTime(flops_per_step=flops, seconds=seconds)
        for row in rows:
            row.hidden_time_s = min(row.time_s, seconds)
            row.exposed_time_s = max(0.0, row.time_s - seconds)
    notes = _notes(request, layout, rows)
    if compute is not None and request.fp8.on and any(row.step is not None for row in rows):
        notes.append(fp8_rate_note(request.fp8, compute, request.activations.compile.model))
    if compute is not None and any(row.step is not None for row in rows):
        notes += _kernel_notes(request)
    return CommEstimate(
        request=CommRequest.of(request),
        calibration_used=request.calibration_name if request.calibration is not None else None,
        notes=notes,
        compute=compared,
        strategies=rows,
        pipeline=pipeline,
    )
