"""Communication per optimizer step: the collectives each strategy issues, bytes per GPU, and time.

Schedules (one declarative table per strategy, :data:`SCHEDULES`):

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

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.calibration import Calibration, GroupKind
from zerocalc.cluster import Cluster, make_cluster
from zerocalc.collectives import COLLECTIVES, Collective
from zerocalc.dtypes import DType
from zerocalc.errors import InputError
from zerocalc.precision import RECIPES, PrecisionName, parse_precision, parse_reduce_dtype
from zerocalc.strategies import DEFAULT_STRATEGIES, STRATEGIES, StrategyName, parse_strategies
from zerocalc.units import ceil_div, parse_bandwidth, parse_count, parse_duration

SCHEMA_VERSION = 1

# Stated defaults, used when neither a calibration nor explicit bandwidths are given.
DEFAULT_INTRA_NODE_BUSBW = 450e9
"""H100 SXM: NVLink 4 gives 450 GB/s per direction per GPU (NVIDIA H100 datasheet: 900 GB/s
bidirectional); nccl-tests all_reduce busbw on 8×H100 nodes measures about 450–480 GB/s."""
DEFAULT_INTER_NODE_BUSBW = 50e9
"""One 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100 design) = 50 GB/s per GPU."""
DEFAULT_LATENCY_S = 20e-6
"""Order of magnitude of an NCCL ring collective's base latency (nccl-tests small-message times)."""


_DEFAULT_DETAIL = {
    "intra-node": (
        "stated default: H100 SXM NVLink 4, 450 GB/s per direction; "
        "set --intra-node-bw, --gpu or --calibration"
    ),
    "inter-node": (
        "stated default: one 400 Gb/s NDR NIC per GPU = 50 GB/s; set --inter-node-bw, --gpu or --calibration"
    ),
}


class Phase(str, Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    AFTER_STEP = "after_step"


class Tensor(str, Enum):
    GRADIENTS = "gradients"
    PARAMETERS = "parameters"


class Scope(str, Enum):
    """Which ranks a collective runs over."""

    WORLD = "world"
    """All N ranks."""
    NODE = "node"
    """The g ranks of one node."""
    ACROSS_NODES = "across_nodes"
    """The N/g ranks of equal local rank, one per node."""


class Repeat(str, Enum):
    PER_STEP = "per_step"
    PER_MICRO_BATCH = "per_micro_batch"


class ScheduledCollective(BaseModel):
    """One line of a strategy's schedule."""

    model_config = ConfigDict(frozen=True)

    op: Collective
    phase: Phase
    tensor: Tensor
    scope: Scope
    repeat: Repeat
    shard_of: Scope | None = None
    """The message is one rank's shard of a tensor partitioned over this scope (HYBRID_SHARD)."""
    behaviour: str
    """Which framework behaviour the line follows."""


def _line(op, phase, tensor, scope, repeat, behaviour, shard_of=None) -> ScheduledCollective:
    return ScheduledCollective(
        op=op, phase=phase, tensor=tensor, scope=scope, repeat=repeat, behaviour=behaviour, shard_of=shard_of
    )


_AR, _RS, _AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
_FWD, _BWD, _STEP = Phase.FORWARD, Phase.BACKWARD, Phase.AFTER_STEP
_G, _P = Tensor.GRADIENTS, Tensor.PARAMETERS
_ONCE, _EACH = Repeat.PER_STEP, Repeat.PER_MICRO_BATCH

SCHEDULES: dict[StrategyName, tuple[ScheduledCollective, ...]] = {
    StrategyName.DDP: (
        _line(
            _AR,
            _BWD,
            _G,
            Scope.WORLD,
            _ONCE,
            "PyTorch DDP: bucketed all_reduce; no_sync() skips A-1 micro-batches",
        ),
    ),
    StrategyName.ZERO1: (
        _line(
            _RS,
            _BWD,
            _G,
            Scope.WORLD,
            _ONCE,
            "DeepSpeed ZeRO-1: gradients reduced once per step (ZeRO §7.2.1)",
        ),
        _line(
            _AG,
            _STEP,
            _P,
            Scope.WORLD,
            _ONCE,
            "updated parameter shards gathered after the step (ZeRO §7.2.1)",
        ),
    ),
    StrategyName.ZERO2: (
        _line(
            _RS,
            _BWD,
            _G,
            Scope.WORLD,
            _EACH,
            "DeepSpeed ZeRO-2: partitioned gradients reduced every micro-batch",
        ),
        _line(
            _AG,
            _STEP,
            _P,
            Scope.WORLD,
            _ONCE,
            "updated parameter shards gathered after the step (ZeRO §7.2.1)",
        ),
    ),
    StrategyName.SHARD_GRAD_OP: (
        _line(
            _AG,
            _FWD,
            _P,
            Scope.WORLD,
            _EACH,
            "FSDP SHARD_GRAD_OP: gathered in forward, kept through backward",
        ),
        _line(_RS, _BWD, _G, Scope.WORLD, _EACH, "FSDP: reduce_scatter of gradients every micro-batch"),
    ),
    StrategyName.ZERO3: (
        _line(_AG, _FWD, _P, Scope.WORLD, _EACH, "ZeRO-3 / FULL_SHARD: gathered in forward (ZeRO §7.2.2)"),
        _line(_AG, _BWD, _P, Scope.WORLD, _EACH, "re-gathered in backward after resharding (ZeRO §7.2.2)"),
        _line(_RS, _BWD, _G, Scope.WORLD, _EACH, "reduce_scatter of gradients every micro-batch"),
    ),
    StrategyName.HYBRID_SHARD: (
        _line(_AG, _FWD, _P, Scope.NODE, _EACH, "FSDP HYBRID_SHARD: FULL_SHARD within the node"),
        _line(_AG, _BWD, _P, Scope.NODE, _EACH, "re-gathered in backward within the node"),
        _line(_RS, _BWD, _G, Scope.NODE, _EACH, "reduce_scatter within the node"),
        _line(
            _AR,
            _BWD,
            _G,
            Scope.ACROSS_NODES,
            _EACH,
            "all_reduce of each gradient shard across nodes",
            Scope.NODE,
        ),
    ),
}


class BandwidthSource(str, Enum):
    CALIBRATION = "calibration"
    EXPLICIT = "explicit"
    GPU_PRESET = "gpu_preset"
    DEFAULT = "default"


class LinkFigures(BaseModel):
    """Latency α and bus bandwidth β for one kind of group, and where they came from."""

    latency_s: float = Field(ge=0)
    bus_bandwidth_Bps: float = Field(gt=0)
    source: BandwidthSource
    detail: str


class Bandwidths(BaseModel):
    """Intra-node and inter-node figures used when no calibration fit covers a collective."""

    intra_node: LinkFigures
    inter_node: LinkFigures


class CommRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    params: int = Field(gt=0, description="Ψ")
    cluster: Cluster
    precision: PrecisionName = PrecisionName.BF16_MIXED
    grad_accum: int = Field(default=1, ge=1, description="A: micro-batches per optimizer step")
    reduce_dtype: DType | None = Field(default=None, description="None: the gradient dtype")
    strategies: tuple[StrategyName, ...] = DEFAULT_STRATEGIES
    bandwidths: Bandwidths
    tokens_per_step: int | None = Field(default=None, gt=0)
    tflops: float | None = Field(default=None, gt=0, description="achieved TFLOP/s per GPU")


class CollectiveCost(BaseModel):
    op: Collective
    phase: Phase
    tensor: Tensor
    dtype: DType
    message_bytes: int = Field(description="S: bytes of the whole array (nccl-tests)")
    group: Scope
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


def _group(scope: Scope, cluster: Cluster) -> tuple[int, bool]:
    """Size of a group of this scope and whether its ranks span nodes."""
    g = cluster.ranks_per_node
    if scope is Scope.WORLD:
        return cluster.world_size, cluster.nodes > 1
    if scope is Scope.NODE:
        return g, False
    return cluster.nodes, cluster.nodes > 1


def _message_bytes(line: ScheduledCollective, n: int, psi: int, dtype: DType, cluster: Cluster) -> int:
    """S for one call: whole array, padded to n equal shards for sharded collectives."""
    elements = psi
    if line.shard_of is not None:
        elements = ceil_div(psi, _group(line.shard_of, cluster)[0])
    if line.op in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        elements = ceil_div(elements, n) * n
    return elements * dtype.bytes


def _figures_for(
    op: Collective,
    spans_nodes: bool,
    cluster: Cluster,
    bandwidths: Bandwidths,
    calibration: Calibration | None,
) -> LinkFigures:
    if calibration is not None:
        if spans_nodes:
            kinds = (GroupKind.INTER_NODE, GroupKind.WORLD) if calibration.nodes > 1 else ()
        else:
            kinds = (GroupKind.INTRA_NODE,) + ((GroupKind.WORLD,) if calibration.nodes == 1 else ())
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


def strategy_comm(
    name: StrategyName, request: CommRequest, calibration: Calibration | None, ddp_bytes: int | None
) -> StrategyComm:
    """Cost every collective of one strategy's schedule: a pure function of the request."""
    recipe = RECIPES[request.precision]
    cluster = request.cluster
    grad_dtype = request.reduce_dtype or recipe.grad_dtype
    costs: list[CollectiveCost] = []
    for line in SCHEDULES[name]:
        n, spans = _group(line.scope, cluster)
        if n == 1:
            continue  # a group of one rank communicates nothing
        dtype = grad_dtype if line.tensor is Tensor.GRADIENTS else recipe.param_dtype
        message = _message_bytes(line, n, request.params, dtype, cluster)
        per_call = COLLECTIVES[line.op].bytes_sent_per_rank(message, n)
        count = request.grad_accum if line.repeat is Repeat.PER_MICRO_BATCH else 1
        link = _figures_for(line.op, spans, cluster, request.bandwidths, calibration)
        costs.append(
            CollectiveCost(
                op=line.op,
                phase=line.phase,
                tensor=line.tensor,
                dtype=dtype,
                message_bytes=message,
                group=line.scope,
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
        title=STRATEGIES[name].title,
        collectives=costs,
        total_bytes_per_gpu=total,
        intra_node_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in costs if not c.spans_nodes),
        inter_node_bytes_per_gpu=sum(c.total_bytes_per_gpu for c in costs if c.spans_nodes),
        time_s=sum(c.time_s for c in costs),
        ratio_to_ddp=(total / ddp_bytes) if ddp_bytes else None,
    )


def evaluate_comm(request: CommRequest, calibration: Calibration | None = None) -> CommEstimate:
    """The communication of every requested strategy, with times and the optional compute comparison."""
    ddp = strategy_comm(StrategyName.DDP, request, calibration, None)
    rows = [strategy_comm(name, request, calibration, ddp.total_bytes_per_gpu) for name in request.strategies]
    notes = []
    if request.cluster.world_size == 1:
        notes.append("no communication: a single GPU has nothing to reduce or gather")
    compute = None
    if request.tokens_per_step is not None and request.tflops is not None:
        flops = 6 * request.params * request.tokens_per_step
        seconds = flops / (request.cluster.world_size * request.tflops * 1e12)
        compute = ComputeTime(flops_per_step=flops, seconds=seconds)
        for row in rows:
            row.hidden_time_s = min(row.time_s, seconds)
            row.exposed_time_s = max(0.0, row.time_s - seconds)
    return CommEstimate(
        request=request,
        calibration_used=None,
        notes=notes,
        compute=compute,
        strategies=rows,
    )


def resolve_bandwidths(
    intra_node_bw: str | float | None = None,
    inter_node_bw: str | float | None = None,
    latency_s: float | str | None = None,
    preset: tuple[float, float, str] | None = None,
) -> Bandwidths:
    """Intra/inter-node figures: explicit values, then a GPU preset's (intra, inter, name), then defaults."""
    alpha = DEFAULT_LATENCY_S if latency_s is None else parse_duration(latency_s, "--latency")

    def figure(
        text: str | float | None, which: str, preset_value: float | None, default: float
    ) -> LinkFigures:
        if text is not None:
            value = parse_bandwidth(text, f"--{which}-bw")
            return LinkFigures(
                latency_s=alpha,
                bus_bandwidth_Bps=value,
                source=BandwidthSource.EXPLICIT,
                detail=f"--{which}-bw",
            )
        if preset_value is not None and preset is not None:
            return LinkFigures(
                latency_s=alpha,
                bus_bandwidth_Bps=preset_value,
                source=BandwidthSource.GPU_PRESET,
                detail=f"GPU preset {preset[2]}",
            )
        return LinkFigures(
            latency_s=alpha,
            bus_bandwidth_Bps=default,
            source=BandwidthSource.DEFAULT,
            detail=_DEFAULT_DETAIL[which],
        )

    return Bandwidths(
        intra_node=figure(
            intra_node_bw, "intra-node", preset[0] if preset else None, DEFAULT_INTRA_NODE_BUSBW
        ),
        inter_node=figure(
            inter_node_bw, "inter-node", preset[1] if preset else None, DEFAULT_INTER_NODE_BUSBW
        ),
    )


def estimate_comm(
    params: int | str | None = None,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    *,
    model: str | None = None,
    gpu: str | None = None,
    strategies: str | list[str] | None = None,
    precision: str = "bf16-mixed",
    grad_accum: int = 1,
    reduce_dtype: str | None = None,
    calibration: Calibration | None = None,
    calibration_name: str | None = None,
    intra_node_bw: str | float | None = None,
    inter_node_bw: str | float | None = None,
    latency_s: float | str | None = None,
    tokens_per_step: int | str | None = None,
    tflops: float | None = None,
) -> CommEstimate:
    """Library entry point: per-GPU bytes and time of every collective of each strategy, per step.

    ``model`` (a preset or config.json) may replace ``params``; ``gpu`` (a GPU preset) supplies default
    bandwidths, which explicit ``intra_node_bw``/``inter_node_bw`` and a calibration override.
    """
    from zerocalc.memory import resolve_params

    psi, _ = resolve_params(params, model)
    preset = None
    if gpu is not None:
        from zerocalc.presets import load_gpu

        spec = load_gpu(gpu)
        preset = (spec.intra_node_Bps, spec.inter_node_Bps, spec.name)
    if isinstance(strategies, list):
        strategies = ",".join(strategies)
    chosen = parse_strategies(strategies)
    cluster = make_cluster(gpus, gpus_per_node)
    recipe = parse_precision(precision)
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise InputError(f"--grad-accum {grad_accum!r} is not accepted; accepted: a whole number, 1 or more")
    dtype = parse_reduce_dtype(reduce_dtype, recipe)
    if (tokens_per_step is None) != (tflops is None):
        raise InputError("--tokens-per-step and --tflops go together; accepted: both or neither")
    if tflops is not None and not tflops > 0:
        raise InputError(f"--tflops {tflops} must be positive; accepted: achieved TFLOP/s per GPU, e.g. 400")
    names = tuple(s.name for s in chosen) if chosen else DEFAULT_STRATEGIES
    problem = cluster.whole_nodes_problem()
    if StrategyName.HYBRID_SHARD in names and problem:
        if chosen:
            raise InputError(problem)
        names = tuple(n for n in names if n is not StrategyName.HYBRID_SHARD)
    request = CommRequest(
        params=psi,
        cluster=cluster,
        precision=recipe.name,
        grad_accum=grad_accum,
        reduce_dtype=dtype,
        strategies=names,
        bandwidths=resolve_bandwidths(intra_node_bw, inter_node_bw, latency_s, preset),
        tokens_per_step=None
        if tokens_per_step is None
        else parse_count(tokens_per_step, "--tokens-per-step"),
        tflops=tflops,
    )
    estimate = evaluate_comm(request, calibration)
    if calibration is not None:
        estimate.calibration_used = calibration_name or "calibration"
    return estimate
