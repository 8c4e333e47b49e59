"""The data-parallel collectives of a step, each run once: the rules of a strategy's schedule under a
framework that move data over a group (:mod:`zerocalc.comm.calls` turns each into its calls), what each run
moves and its time, how many times each runs per step, and the tensor- and context-parallel collectives'
request.

* bytes each GPU sends per call: the nccl-tests bus factors of :mod:`zerocalc.network.collectives` (ring
  algorithm): all_reduce 2(n-1)/n·S, reduce_scatter, all_gather and all_to_all (n-1)/n·S, broadcast S;
* how many times a rule runs per step (A micro-batches): once, A times, or once per micro-batch that
  synchronises gradients (A under ``every``, 1 under ``last``; fixed by DeepSpeed's stages and by the
  paper's accounting, chosen by the training loop under PyTorch, whose default is ``every``): every
  :class:`~zerocalc.network.schedule.Repeat` is affine in A, so a schedule's runs at A = 2 and 3 give every
  A (:class:`CommLine`);
* time = α per call + bytes / β, with β the bus bandwidth of the rule's process group (a group with
  ranks on more than one node runs at the inter-node figure).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.comm.calls import CallContext, Layout, RuleCalls, rule_calls
from zerocalc.comm.finetune import TRAINED, moved_tensors, moves_trained_only, rule_note
from zerocalc.comm.fp8 import (
    FP8_GATHER,
    amax_layout,
    amax_line,
    fp8_wire_layout,
    gathers_fp8,
    stacked_amax_line,
)
from zerocalc.comm.mesh import (
    MeshRequest,
    MeshShape,
    mesh_problem,
    replicated_gradients,
)
from zerocalc.network.calibration import Calibration, CollectiveFit
from zerocalc.network.cluster import Cluster, RankGroup
from zerocalc.network.collectives import COLLECTIVES, Collective
from zerocalc.network.links import Bandwidths, BandwidthSource, LinkFigures
from zerocalc.network.schedule import Calls, GradSync, Phase, Repeat, ScheduledCollective, ZeroPP
from zerocalc.parallel.finetune import parameter_kinds
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.framework_records.megatron import bucket_elements
from zerocalc.parallel.frameworks import Framework, Fsdp1Sharding
from zerocalc.parallel.precision import ParamKind, PrecisionName
from zerocalc.parallel.strategies import StrategyName
from zerocalc.parallel.zeropp import active_features
from zerocalc.request.training import TrainingRequest
from zerocalc.states.framework import expert_shard_dim


def fit_for(op: Collective, spans_nodes: bool, calibration: Calibration) -> CollectiveFit | None:
    """The calibration's fit for this collective over this kind of group, if it has one."""
    if spans_nodes:
        kinds = (RankGroup.ACROSS_NODES, RankGroup.WORLD) if calibration.nodes > 1 else ()
    else:
        kinds = (RankGroup.NODE,) + ((RankGroup.WORLD,) if calibration.nodes == 1 else ())
    return next((fit for kind in kinds if (fit := calibration.fit_for(op, kind)) is not None), None)


def figures_for(
    op: Collective, spans_nodes: bool, bandwidths: Bandwidths, calibration: Calibration | None
) -> LinkFigures:
    """The calibration's fit for this collective and kind of group if it has one, else the link figures."""
    fit = fit_for(op, spans_nodes, calibration) if calibration is not None else None
    if fit is not None:
        return LinkFigures(
            latency_s=fit.latency_s,
            bus_bandwidth_Bps=fit.bus_bandwidth_Bps,
            source=BandwidthSource.CALIBRATION,
            detail=f"calibration fit of {op.value} over {fit.group_kind.value} groups of {fit.group_size}",
        )
    return bandwidths.inter_node if spans_nodes else bandwidths.intra_node


def times_per_step(repeat: Repeat, accum: int, sync: GradSync) -> int:
    """How many times a rule of this repeat runs in a step of ``accum`` micro-batches."""
    match repeat:
        case Repeat.PER_STEP:
            return 1
        case Repeat.PER_MICRO_BATCH:
            return accum
        case Repeat.PER_SYNC:
            return accum if sync is GradSync.EVERY else 1
        case Repeat.AFTER_FIRST_MICRO_BATCH:
            return accum - 1


class _Run(NamedTuple):
    """A rule that moves data: its dtype, whether it runs quantized, what sizes its calls, and whether its
    group spans nodes."""

    line: ScheduledCollective
    dtype: DType
    quantized: bool
    ctx: CallContext
    spans_nodes: bool


@lru_cache(maxsize=1024)
def _runs(
    name: StrategyName,
    framework: Framework,
    cluster: Cluster,
    precision: PrecisionName,
    reduce_dtype: DType | None,
    buckets: tuple[int, int, int, bool],
    zeropp: frozenset[ZeroPP],
) -> tuple[_Run, ...]:
    """The rules of ``name``'s schedule under ``framework`` that move data on ``cluster``."""
    runs = []
    record = FRAMEWORKS[framework]
    dtypes = record.dtypes(precision, reduce_dtype)
    for line in record.schedule_of(name):
        n = cluster.group_size(line.group)
        if n == 1 or not line.runs_with(zeropp):
            continue  # a group of one rank communicates nothing
        dtype = dtypes.of(line.dtype_role)
        assert dtype is not None  # a rule moves a tensor that exists
        ctx = CallContext(
            world_size=cluster.world_size,
            group_size=n,
            shard_size=cluster.group_size(line.shard_of),
            element_bytes=dtype.bytes,
            ddp_bucket_bytes=buckets[0],
            ddp_first_bucket_bytes=buckets[1],
            deepspeed_bucket_elements=buckets[2],
            megatron_bucket_elements=bucket_elements(buckets[3], n),
        )
        runs.append(_Run(line, dtype, line.quantized_with(zeropp), ctx, cluster.spans_nodes(line.group)))
    return tuple(runs)


class _Traffic(NamedTuple):
    """What one run of a collective moves: its calls and their sums."""

    calls: RuleCalls
    message_bytes: int
    bytes_sent_per_gpu: int


def bytes_sent(sizes: set[int], op: Collective, n: int, element_bytes: int) -> dict[int, int]:
    """Bytes each rank sends for a call of each of ``sizes`` elements (the collective's bus factor)."""
    spec = COLLECTIVES[op]
    return {s: spec.bytes_sent_per_rank(s * element_bytes, n) for s in sizes}


def _traffic(calls: RuleCalls, op: Collective, n: int, element_bytes: int) -> _Traffic:
    """The calls and their sums."""
    sent = bytes_sent(set(calls.sizes), op, n, element_bytes)
    message = sum(s * count for s, count in calls.by_size()) * element_bytes
    return _Traffic(calls, message, sum(sent[s] * count for s, count in calls.by_size()))


def _line_traffic(
    layout: Layout, line: ScheduledCollective, ctx: CallContext, quantized: bool
) -> tuple[_Traffic, _Traffic | None] | None:
    """What one run of ``line`` moves (int8 quantized, else in the context's dtype) and its fp32 scales (None
    unless quantized); None when it has no calls."""
    calls = rule_calls(line, layout, ctx, quantized)
    if calls is None:
        return None
    data, scales = calls
    moved = _traffic(data, line.op, ctx.group_size, DType.INT8.bytes if quantized else ctx.element_bytes)
    return moved, _traffic(scales, line.op, ctx.group_size, DType.FP32.bytes) if scales is not None else None


class CollectiveRun(NamedTuple):
    """One collective of a schedule, run once: its rule's run, the dtype it moves, whether it is a quantized
    rule's scales, its calls, the link it runs over and its time."""

    run: _Run
    dtype: DType
    scales: bool
    traffic: _Traffic
    link: LinkFigures
    seconds: float
    """α per call + bytes / β."""


def _collective_run(
    run: _Run, traffic: _Traffic, dtype: DType, request: TrainingRequest, scales: bool = False
) -> CollectiveRun:
    link = figures_for(run.line.op, run.spans_nodes, request.links, request.calibration)
    seconds = traffic.calls.count * link.latency_s + traffic.bytes_sent_per_gpu / link.bus_bandwidth_Bps
    return CollectiveRun(run, dtype, scales, traffic, link, seconds)


def _buckets(request: TrainingRequest) -> tuple[int, int, int, bool]:
    """DDP's bucket and first bucket (bytes), DeepSpeed's reduce bucket (elements) and whether Megatron-LM
    buckets its buffers (``--overlap-grad-reduce``): what sizes calls."""
    buffers = request.buffers
    return (
        buffers.ddp_bucket_bytes,
        buffers.ddp_first_bucket_bytes,
        buffers.reduce_bucket_elements,
        request.overlap.grad_reduce,
    )


def collective_runs(
    name: StrategyName, request: TrainingRequest, layout: Layout, cluster: Cluster | None = None
) -> list[CollectiveRun]:
    """Every collective of one strategy's schedule under the request's framework that moves data over
    ``cluster`` (the request's dp × cp ranks by default), each run once, in order (pure; how many times each
    runs per step is :func:`times_per_step`'s)."""
    cluster = request.cluster if cluster is None else cluster
    zeropp, _ = active_features(frozenset(request.zeropp), cluster)
    runs = _runs(
        name, request.framework, cluster, request.precision, request.reduce_dtype, _buckets(request), zeropp
    )
    collectives = []
    if request.finetune is not None and layout.from_architecture:
        moved = _finetune_runs(runs, request, name)
    else:
        moved = _fp8_runs(runs, request.fp8, layout)
    for run, run_layout in moved:
        traffic = run_layout.cached(_line_traffic, run.line, run.ctx, run.quantized)
        if traffic is None:
            continue
        data, scales = traffic
        collectives.append(_collective_run(run, data, DType.INT8 if run.quantized else run.dtype, request))
        if scales is not None:
            collectives.append(_collective_run(run, scales, DType.FP32, request, scales=True))
    return collectives


def _fp8_runs(runs: tuple[_Run, ...], fp8: Fp8Setting, layout: Layout) -> list[tuple[_Run, Layout]]:
    """Each run with the layout it moves: an FP8 all-gather's counts bytes, 1 B per element
    (:func:`~zerocalc.comm.fp8.fp8_wire_layout`), each followed by its amax all-reduces, or the first by
    the stacked one after the step with precomputed scales (:mod:`zerocalc.comm.fp8`); without FP8
    all-gathers, the runs as they are."""
    if not fp8.all_gather or not layout.from_architecture:
        return [(run, layout) for run in runs]
    amax = amax_layout(layout, fp8)
    out: list[tuple[_Run, Layout]] = []
    stacked: list[tuple[_Run, Layout]] = []
    for run in runs:
        if not gathers_fp8(run.line, fp8):
            out.append((run, layout))
            continue
        wire = fp8_wire_layout(layout, fp8, run.ctx.element_bytes)
        line = run.line._replace(behaviour=f"{run.line.behaviour}; {FP8_GATHER}")
        out.append((run._replace(line=line, dtype=DType.FP8, ctx=_bytes_of(run.ctx, DType.FP8)), wire))
        fp32 = run._replace(dtype=DType.FP32, ctx=_bytes_of(run.ctx, DType.FP32))
        line = amax_line(run.line, fp8)
        if line is not None:
            out.append((fp32._replace(line=line), amax))
        line = None if stacked else stacked_amax_line(run.line, fp8)
        if line is not None:
            stacked.append((fp32._replace(line=line), amax))
    return out + stacked


def _finetune_runs(
    runs: tuple[_Run, ...], request: TrainingRequest, name: StrategyName
) -> list[tuple[_Run, Layout]]:
    """Each run with the tensors it moves in a fine-tuning run (:mod:`zerocalc.comm.finetune`): the
    trained ones for gradients and updated parameters, every one (quantised weights packed) for the
    gathers of forward and backward, each kind in its dtype for the rule's role (the precision record's)."""
    from zerocalc.states.memory import finetune_dtypes

    finetune = request.finetune
    assert finetune is not None
    out = []
    present = dict.fromkeys(k.kind for k in parameter_kinds(request.architecture, finetune))
    peft_fsdp1 = request.framework is Framework.FSDP  # PEFT's fsdp_auto_wrap_policy (comm.finetune)
    setup = FRAMEWORKS[request.framework].torch_setup(name) if peft_fsdp1 else None
    # a unit resharded after its forward (FULL_SHARD, HYBRID_SHARD) is gathered again by a second call
    resharded = setup is not None and setup.sharding is Fsdp1Sharding.FULL_SHARD
    for run in runs:
        trained = moves_trained_only(run.line)
        role = run.line.dtype_role
        kinds = [kind for kind in present if not trained or kind in TRAINED]
        dtypes = tuple((kind, finetune_dtypes(request, kind).of(role)) for kind in kinds)
        forward = resharded and run.line.phase is Phase.FORWARD
        moved = moved_tensors(
            request.architecture, finetune, trained, dtypes, peft_fsdp1=peft_fsdp1, forward=forward
        )
        if moved.dtype is None and run.line.calls is Calls.DDP_BUCKET:  # a run of buckets per dtype
            apart = [
                moved_tensors(request.architecture, finetune, trained, dtypes, d) for d in _dtypes(dtypes)
            ]
        else:
            apart = [moved]
        for part in apart:
            dtype = part.dtype or DType.UINT8
            line = run.line._replace(behaviour=f"{run.line.behaviour}; {rule_note(run.line, part)}")
            out.append((run._replace(line=line, dtype=dtype, ctx=_bytes_of(run.ctx, dtype)), part.layout))
    return out


def _dtypes(dtypes: tuple[tuple[ParamKind, DType | None], ...]) -> list[DType]:
    """The distinct dtypes of the kinds, in their order."""
    return [d for d in dict.fromkeys(d for _, d in dtypes) if d is not None]


def _bytes_of(ctx: CallContext, dtype: DType) -> CallContext:
    return ctx.model_copy(update={"element_bytes": dtype.bytes})


def mesh_request(request: TrainingRequest) -> MeshRequest | None:
    """What sizes and prices the request's tensor- and context-parallel collectives; None at tp = cp = 1.
    Raises :class:`InputError` for a model whose tensor-parallel communication is not modelled."""
    mesh = request.mesh
    arch = request.model.architecture
    if not mesh.model_parallel or arch is None:
        return None
    problem = mesh_problem(arch, mesh, request.framework)
    if problem:
        raise InputError(problem)
    activations = request.activations
    return MeshRequest(
        mesh=mesh,
        framework=request.framework,
        # a pipeline rank runs its stage's layers: the largest stage's (request.architecture)
        shape=MeshShape.of(
            request.architecture if mesh.pp > 1 else arch,
            mesh,
            activations.micro_batch,
            activations.seq_len,
            activations.capacity_factor,
        ),
        learned_positions=arch.learned_position_embeddings,
        replicated=replicated_gradients(request.architecture, mesh.tp_style, mesh.sequence_parallel)
        if mesh.tp > 1
        else (),
        recompute=activations.recompute,
        grad_accum=request.grad_accum,
        activation=request.dtypes.activation,
        checkpoint_every=activations.checkpoint_every,
        gradient=request.dtypes.trained.reduce,
        bandwidths=request.links,
        calibration=request.calibration,
    )


class DataPart(NamedTuple):
    """Parameters of a rank whose data-parallel collectives run over one group: the request, the tensors and
    the group (:func:`data_parts`)."""

    request: TrainingRequest
    layout: Layout
    experts: bool
    """The routed experts under expert parallelism, over the expert-data-parallel ranks."""
    cluster: Cluster
    """The ranks its collectives run over: the request's dp × cp ranks, or the routed experts'
    expert-data-parallel ranks (:meth:`~zerocalc.parallel.mesh.Mesh.expert_data_cluster`)."""


def data_parts(request: TrainingRequest, layout: Layout | None = None) -> tuple[DataPart, ...]:
    """The rank's parameters as the data-parallel collectives move them: all of them over the dp × cp ranks
    (``layout``, else the rank's); under expert parallelism, everything but the routed experts over those
    ranks and the routed experts over the dp·c/e expert-data-parallel ranks
    (:meth:`~zerocalc.comm.calls.Layout.expert_parallel_parts`), as the states are sharded
    (:func:`~zerocalc.states.memory.state_parts`)."""
    arch = request.rank_model.architecture
    mesh = request.mesh
    if mesh.ep == 1 or arch is None:
        return (
            DataPart(request, layout or Layout.of(request.rank_model.params, arch), False, request.cluster),
        )
    rest, experts = Layout.expert_parallel_parts(arch, expert_shard_dim(arch, mesh.dp * mesh.cp))
    return (
        DataPart(request, rest, False, request.cluster),
        DataPart(request, experts, True, mesh.expert_data_cluster()),
    )


class CommLine(NamedTuple):
    """One collective of ``comm``'s schedule for one key (world, group, framework, strategy, reduce dtype,
    grad sync), with how its runs per step depend on A: ``times(A) = times_at_2 + slope·(A − 2)`` — every
    :class:`~zerocalc.network.schedule.Repeat` is affine in A (once: 1; per micro-batch: A; per sync: A or 1;
    after
    the first micro-batch: A − 1), so its runs at A = 2 and A = 3 give it exactly."""

    phase: Phase
    times_at_2: int
    slope: int
    calls_per_run: int
    run_s: float
    """One run's time (:attr:`zerocalc.comm.estimate.CollectiveRun.seconds`): calls × α + bytes / β."""

    def times(self, accum: int) -> int:
        return self.times_at_2 + self.slope * (accum - 2)


def comm_lines(collectives: list[CollectiveRun], sync: GradSync) -> tuple[CommLine, ...]:
    """The schedule's collectives (:func:`collective_runs`), each with its runs per
    step at
    A = 2 and A = 3 (:func:`times_per_step`); every one runs at A = 2."""
    lines = []
    for c in collectives:
        line = c.run.line
        at_2 = times_per_step(line.repeat, 2, sync)
        slope = times_per_step(line.repeat, 3, sync) - at_2
        lines.append(CommLine(line.phase, at_2, slope, c.traffic.calls.count, c.seconds))
    return tuple(lines)


def comm_of_lines(lines: tuple[CommLine, ...], accum: int) -> list[tuple[Phase, int, int, float]]:
    """(phase, times per step, calls per step, time_s) of each collective that runs at this A — the same
    floats as ``comm`` computes (``times × (calls × α + bytes / β)``)."""
    out = []
    for line in lines:
        times = line.times(accum)
        if times > 0:
            out.append((line.phase, times, times * line.calls_per_run, times * line.run_s))
    return out
