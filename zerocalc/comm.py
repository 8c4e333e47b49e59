"""Communication per optimizer step: the collectives each strategy issues, bytes per GPU, and time.

Schedules (each Strategy record's ``schedule``, :mod:`zerocalc.strategies`):

========================  ==========================================================  ===============
strategy                  collectives (A = micro-batches per step)                    source
========================  ==========================================================  ===============
DDP / NO_SHARD            all_reduce(grads) once per step (``no_sync`` on the         ZeRO paper §7.1;
                          first A-1 micro-batches)                                    PyTorch DDP docs
ZeRO-1                    reduce_scatter(grads) once per step + all_gather(params)    ZeRO paper §7.2.1
                          after the step
ZeRO-2                    reduce_scatter(grads) every micro-batch (its gradients are  ZeRO paper §7.2.1;
                          partitioned, so they cannot wait) + all_gather(params)      DeepSpeed stage 2
                          after the step
FSDP SHARD_GRAD_OP        all_gather(params) in forward + reduce_scatter(grads),      PyTorch FSDP docs
                          every micro-batch (params stay gathered into backward)
ZeRO-3 / FULL_SHARD       all_gather(params) in forward and again in backward +       ZeRO paper §7.2.2;
                          reduce_scatter(grads), every micro-batch                    FSDP paper
HYBRID_SHARD              ZeRO-3 inside each node (g ranks) + all_reduce of each      PyTorch FSDP docs
                          rank's gradient shard across nodes (N/g ranks), per
                          micro-batch
========================  ==========================================================  ===============

Volumes use the nccl-tests bus factors of :mod:`zerocalc.collectives` (ring algorithm): all_reduce sends
2(n-1)/n·S per rank, reduce_scatter and all_gather (n-1)/n·S. So at A = 1 ZeRO-1/2 move exactly DDP's
2Ψ and ZeRO-3 3Ψ (1.5×), as the ZeRO paper's section 7 states. Sharded collectives carry the padded
array, ceil(Ψ/n)·n elements, as FSDP pads its flat parameters. Gradients travel in the gradient dtype
(or fp32 with ``--reduce-dtype fp32``); parameters in the compute dtype.

Time of a collective = α + bytes sent per rank / β, with β the bus bandwidth of its process group (a
group with ranks on more than one node runs at the inter-node figure) and α its latency.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.calibration import Calibration
from zerocalc.cluster import Cluster, RankGroup
from zerocalc.collectives import COLLECTIVES, Collective
from zerocalc.dtypes import DType
from zerocalc.links import Bandwidths, BandwidthSource, LinkFigures
from zerocalc.precision import RECIPES, PrecisionName
from zerocalc.request import TrainingRequest
from zerocalc.schedule import Phase, Repeat, ScheduledCollective, Tensor
from zerocalc.strategies import STRATEGIES, StrategyName
from zerocalc.units import ceil_div, plural

SCHEMA_VERSION = 1


class CommRequest(BaseModel):
    """The request as the communication estimate echoes it in its JSON."""

    model_config = ConfigDict(frozen=True)

    params: int = Field(gt=0, description="Ψ")
    cluster: Cluster
    precision: PrecisionName
    grad_accum: int = Field(ge=1, description="A: micro-batches per optimizer step")
    reduce_dtype: DType | None = Field(description="None: the gradient dtype")
    strategies: tuple[StrategyName, ...]
    bandwidths: Bandwidths
    tokens_per_step: int | None = Field(default=None, gt=0)
    tflops: float | None = Field(default=None, gt=0, description="achieved TFLOP/s per GPU")

    @classmethod
    def of(cls, request: TrainingRequest) -> CommRequest:
        return cls(
            params=request.model.params,
            cluster=request.cluster,
            precision=request.precision,
            grad_accum=request.grad_accum,
            reduce_dtype=request.reduce_dtype,
            strategies=request.strategies,
            bandwidths=request.links,
            tokens_per_step=request.tokens_per_step,
            tflops=request.tflops,
        )


class CollectiveCost(BaseModel):
    op: Collective
    phase: Phase
    tensor: Tensor
    dtype: DType
    message_bytes: int = Field(description="S: bytes of the whole array (nccl-tests)")
    group: RankGroup
    group_size: int
    spans_nodes: bool
    count_per_step: int
    bytes_sent_per_gpu: int = Field(description="per call: factor(n)·S")
    total_bytes_per_gpu: int = Field(description="per step: count × per call")
    latency_s: float
    bus_bandwidth_Bps: float
    time_s: float = Field(description="per step: count × (α + bytes / β)")
    bandwidth_source: BandwidthSource
    behaviour: str


class StrategyComm(BaseModel):
    strategy: StrategyName
    title: str
    collectives: list[CollectiveCost]
    total_bytes_per_gpu: int
    intra_node_bytes_per_gpu: int
    inter_node_bytes_per_gpu: int
    time_s: float
    ratio_to_ddp: float | None = Field(description="bytes / DDP's bytes; None when DDP sends nothing (N = 1)")
    exposed_time_s: float | None = Field(default=None, description="max(0, comm − compute)")
    hidden_time_s: float | None = Field(default=None, description="min(comm, compute): could overlap compute")


class ComputeTime(BaseModel):
    flops_per_step: float = Field(description="6·Ψ·T (Kaplan et al. 2020)")
    seconds: float = Field(description="6·Ψ·T / (N·F)")


class CommEstimate(BaseModel):
    schema_version: int = SCHEMA_VERSION
    request: CommRequest
    calibration_used: str | None = None
    notes: list[str] = Field(default_factory=list)
    compute: ComputeTime | None = None
    strategies: list[StrategyComm]

    def row(self, name: StrategyName | str) -> StrategyComm:
        key = StrategyName(name)
        return next(r for r in self.strategies if r.strategy is key)


def _message_bytes(line: ScheduledCollective, n: int, psi: int, dtype: DType, cluster: Cluster) -> int:
    """S for one call: whole array, padded to n equal shards for sharded collectives."""
    elements = psi
    if line.shard_of is not None:
        elements = ceil_div(psi, cluster.group_size(line.shard_of))
    if line.op in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        elements = ceil_div(elements, n) * n
    return elements * dtype.bytes


def _figures_for(
    op: Collective, spans_nodes: bool, bandwidths: Bandwidths, calibration: Calibration | None
) -> LinkFigures:
    """The calibration's fit for this collective and kind of group if it has one, else the link figures."""
    if calibration is not None:
        if spans_nodes:
            kinds = (RankGroup.ACROSS_NODES, RankGroup.WORLD) if calibration.nodes > 1 else ()
        else:
            kinds = (RankGroup.NODE,) + ((RankGroup.WORLD,) if calibration.nodes == 1 else ())
        for kind in kinds:
            fit = calibration.fit_for(op, kind)
            if fit is not None:
                return LinkFigures(
                    latency_s=fit.latency_s,
                    bus_bandwidth_Bps=fit.bus_bandwidth_Bps,
                    source=BandwidthSource.CALIBRATION,
                    detail=f"calibration fit of {op.value} over {kind.value} groups of {fit.group_size}",
                )
    return bandwidths.inter_node if spans_nodes else bandwidths.intra_node


def strategy_comm(name: StrategyName, request: TrainingRequest, ddp_bytes: int | None) -> StrategyComm:
    """Cost every collective of one strategy's schedule: a pure function of the request."""
    recipe = RECIPES[request.precision]
    cluster = request.cluster
    grad_dtype = request.reduce_dtype or recipe.grad_dtype
    strategy = STRATEGIES[name]
    costs: list[CollectiveCost] = []
    for line in strategy.schedule:
        n = cluster.group_size(line.group)
        if n == 1:
            continue  # a group of one rank communicates nothing
        spans = cluster.spans_nodes(line.group)
        dtype = grad_dtype if line.tensor is Tensor.GRADIENTS else recipe.param_dtype
        message = _message_bytes(line, n, request.model.params, dtype, cluster)
        per_call = COLLECTIVES[line.op].bytes_sent_per_rank(message, n)
        count = request.grad_accum if line.repeat is Repeat.PER_MICRO_BATCH else 1
        link = _figures_for(line.op, spans, request.links, request.calibration)
        costs.append(
            CollectiveCost(
                op=line.op,
                phase=line.phase,
                tensor=line.tensor,
                dtype=dtype,
                message_bytes=message,
                group=line.group,
                group_size=n,
                spans_nodes=spans,
                count_per_step=count,
                bytes_sent_per_gpu=per_call,
                total_bytes_per_gpu=count * per_call,
                latency_s=link.latency_s,
                bus_bandwidth_Bps=link.bus_bandwidth_Bps,
                time_s=count * (link.latency_s + per_call / link.bus_bandwidth_Bps),
                bandwidth_source=link.source,
                behaviour=line.behaviour,
            )
        )
    total = sum(c.total_bytes_per_gpu for c in costs)
    return StrategyComm(
        strategy=name,
        title=strategy.title,
        collectives=costs,
        total_bytes_per_gpu=total,
        intra_node_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in costs if not c.spans_nodes),
        inter_node_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in costs if c.spans_nodes),
        time_s=sum(c.time_s for c in costs),
        ratio_to_ddp=(total / ddp_bytes) if ddp_bytes else None,
    )


def evaluate_comm(request: TrainingRequest) -> CommEstimate:
    """The communication of every requested strategy, with times and the optional compute comparison."""
    ddp = strategy_comm(StrategyName.DDP, request, None)
    rows = [strategy_comm(name, request, ddp.total_bytes_per_gpu) for name in request.strategies]
    notes = []
    if request.cluster.world_size == 1:
        notes.append("no communication: a single GPU has nothing to reduce or gather")
    calibration = request.calibration
    used = any(c.bandwidth_source is BandwidthSource.CALIBRATION for row in rows for c in row.collectives)
    if calibration is not None and not used and request.cluster.world_size > 1:
        notes.append(
            f"calibration {request.calibration_name} ({plural(calibration.nodes, 'node')} × "
            f"{plural(calibration.gpus_per_node, 'rank')}) covers none of these collectives and groups: "
            "every time uses the link figures below"
        )
    compute = None
    if request.tokens_per_step is not None and request.tflops is not None:
        flops = 6 * request.model.params * request.tokens_per_step
        seconds = flops / (request.cluster.world_size * request.tflops * 1e12)
        compute = ComputeTime(flops_per_step=flops, seconds=seconds)
        for row in rows:
            row.hidden_time_s = min(row.time_s, seconds)
            row.exposed_time_s = max(0.0, row.time_s - seconds)
    return CommEstimate(
        request=CommRequest.of(request),
        calibration_used=request.calibration_name if request.calibration is not None else None,
        notes=notes,
        compute=compute,
        strategies=rows,
    )
