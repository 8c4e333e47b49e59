"""Prediction vs measurement, line by line, collective by collective and rank by rank (pure, no torch).

Model states: :mod:`zerocalc.states.framework`, exact per rank. Collectives: ``zerocalc comm``'s estimate
of the same configuration (:func:`zerocalc.comm.estimate.evaluate_comm` under the framework the configuration
is
in the Strategy records), expanded into its calls and compared with the calls each rank recorded in the
measured step as multisets of (operation, phase, dtype, process group, S, broadcast source). Calls over a
group of one rank move nothing and are left out of both sides. On a ``dp × tp`` mesh the states and the
calls are :mod:`zerocalc.validate.tp`'s, each call's group is ``dp`` or ``tp``, and each rank's calls are
compared in the order it issued them as well.
"""

from __future__ import annotations

import os
from collections import Counter

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.comm.estimate import StrategyComm, evaluate_comm
from zerocalc.model.architecture import Architecture
from zerocalc.network.cluster import Cluster, RankGroup
from zerocalc.network.collectives import COLLECTIVES, Collective
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.finetune import FineTuning
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.frameworks import Estimate, Framework, TorchWrapper
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.parallel.strategies import StrategyName
from zerocalc.request.training import parse_options
from zerocalc.states.framework import (
    LINES,
    STATE_LINES,
    RankStates,
    predict_rank_states,
    reducer_buckets,
    shard_ranks,
)
from zerocalc.validate.config import PERTURB_ENV, STRATEGIES, Job, Measured, RecordedCall, TpPlan
from zerocalc.validate.tp import TpCall

PEAK_TOLERANCE = 0.25
"""GPU only: the measured ``max_memory_allocated`` may exceed the model states + unsharded parameters by
this fraction (activations, autograd temporaries, allocator rounding) before the peak line is marked."""
PEAK_SLACK_BYTES = 64 * 2**20
"""GPU only: plus this many bytes (the CUDA caching allocator's blocks, small buffers)."""


class LineResult(BaseModel):
    line: str
    predicted: int
    measured: int | None
    difference: int | None = Field(description="measured - predicted")
    ok: bool | None = Field(description="None: not measured / not compared")
    model_state: bool = Field(description="an exact match is required (exit 1 otherwise)")
    explanation: str


class RankResult(BaseModel):
    rank: int
    lines: list[LineResult]
    loss: float | None = None


class CollectiveResult(BaseModel):
    """One kind of collective (operation, phase, dtype, process group) of the measured step, per rank."""

    op: str
    phase: str
    dtype: str
    group: str = Field(description="world, node, across_nodes, or other")
    group_size: int
    predicted_calls: int
    measured_calls: list[int] = Field(description="per rank")
    predicted_bytes: list[int] = Field(
        description="per rank, the bytes it sends: Σ factor(n)·S (zerocalc.network.collectives)"
    )
    measured_bytes: list[int] = Field(description="per rank")
    ok: bool = Field(description="every rank made exactly the predicted calls (S, source) of this kind")
    explanation: str


class ConfigResult(BaseModel):
    strategy: str
    precision: PrecisionName
    grad_accum: int = 1
    grad_sync: GradSync = GradSync.EVERY
    status: str = Field(description="match, mismatch or failed")
    error: str | None = None
    seconds: float | None = None
    ranks: list[RankResult] = []
    collectives: list[CollectiveResult] = []
    call_order_ok: bool | None = Field(
        default=None,
        description="dp × tp runs: every rank issued the predicted calls in the predicted order "
        "(None: not compared)",
    )
    call_order_note: str | None = Field(default=None, description="the first call out of order, per rank")


class ValidationReport(BaseModel):
    model: str
    architecture: Architecture
    parameters: int
    world_size: int
    optimizer: OptimizerName
    backend: str
    peak: str = Field(description="how the peak was handled")
    tp_plan: TpPlan | None = Field(
        default=None, description="the dp × tp mesh (TP innermost: ranks r … r+tp−1 share a TP group)"
    )
    configs: list[ConfigResult]
    all_match: bool


def predictions(
    arch: Architecture,
    strategy: str,
    world_size: int,
    precision: PrecisionName,
    optimizer: OptimizerName,
    gpus_per_node: int | None = None,
    finetune: FineTuning | None = None,
) -> list[RankStates]:
    """Each rank's model states; a hybrid configuration shards over the ``gpus_per_node`` ranks of a node,
    rank r holding shard r mod g. ``finetune``: a LoRA run's (:mod:`zerocalc.states.finetune_ranks`)."""
    _, _, setup = STRATEGIES[strategy]
    shard = shard_ranks(Cluster.of(world_size, gpus_per_node or world_size), setup)
    if finetune is not None:
        from zerocalc.states.finetune_ranks import finetune_rank_states

        request = parse_options(
            model=arch,
            gpus=world_size,
            gpus_per_node=gpus_per_node or world_size,
            optimizer=optimizer.value,
            **_request_keywords(strategy, precision, tuned=True),
            **finetune_keywords(finetune),
        )
        return [finetune_rank_states(request, setup, shard, r % shard) for r in range(world_size)]
    return [
        predict_rank_states(arch, setup, shard, r % shard, precision, optimizer) for r in range(world_size)
    ]


def finetune_keywords(finetune: FineTuning) -> dict[str, object]:
    """The request options that describe ``finetune`` (LoRA), as ``parse_options`` takes them."""
    lora = finetune.lora
    assert lora is not None and finetune.quant is None and not finetune.freeze
    targets = lora.targets
    return {
        "lora_rank": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_targets": None
        if targets is None
        else targets
        if isinstance(targets, str)
        else ",".join(targets),
        "lora_dropout": lora.dropout,
        "dora": lora.dora,
        "autocast_adapter_dtype": lora.autocast_adapter_dtype,
        "modules_to_save": ",".join(lora.modules_to_save) or None,
    }


def _request_keywords(strategy: str, precision: PrecisionName, tuned: bool = False) -> dict[str, object]:
    """The framework, strategy, precision and reduce dtype of a configuration, as ``parse_options`` takes
    them (``MixedPrecision``'s fp32 reduction under bf16-mixed). ``tuned``: a fine-tuning run, whose plain
    DDP is the ddp framework's (the same ``TorchSetup``; torch-zero1's record, which validate's ddp is
    listed in, models full training only)."""
    framework, name, setup = STRATEGIES[strategy]
    if tuned and setup.wrapper is TorchWrapper.DDP:
        framework, name = Framework.DDP, StrategyName.DDP
        assert FRAMEWORKS[framework].torch_setup(name) is not None
    fsdp = setup.wrapper in (TorchWrapper.FSDP1, TorchWrapper.FSDP2)
    return {
        "framework": framework.value,
        "strategies": name.value,
        "precision": precision.value,
        "reduce_dtype": "fp32" if fsdp and precision is not PrecisionName.FP32 else None,
    }


def predicted_comm(job: Job, world_size: int) -> StrategyComm:
    """``zerocalc comm``'s estimate of the configuration ``job`` runs: its framework's schedule, with the
    real units, buckets and calls of ``job.arch`` (``MixedPrecision``'s fp32 reduction under bf16-mixed;
    a LoRA run's trained gradients only and every parameter gathered: :mod:`zerocalc.comm.finetune`)."""
    request = parse_options(
        estimate=Estimate.COMM,
        model=job.arch,
        gpus=world_size,
        gpus_per_node=job.gpus_per_node,
        grad_accum=job.grad_accum,
        grad_sync=job.grad_sync.value,
        **_request_keywords(job.strategy, job.precision, tuned=job.finetune is not None),
        **(finetune_keywords(job.finetune) if job.finetune is not None else {}),
    )
    return evaluate_comm(request).strategies[0]


_Key = tuple[str, str, str, str, int, int, int | None]
"""(op, phase, dtype, group kind, group size, S in elements, broadcast source)."""


def _group_kind(ranks: list[int], cluster: Cluster, plan: TpPlan | None = None) -> str:
    if plan is not None:
        if ranks == plan.tp_group(ranks[0]):
            return "tp"
        if ranks == plan.dp_group(ranks[0]):
            return "dp"
    n, g = cluster.world_size, cluster.ranks_per_node
    if sorted(ranks) == list(range(n)):
        return RankGroup.WORLD.value
    if len(ranks) == g and ranks == list(range(ranks[0], ranks[0] + g)) and ranks[0] % g == 0:
        return RankGroup.NODE.value
    if len(ranks) == cluster.nodes and ranks == list(range(ranks[0], n, g)):
        return RankGroup.ACROSS_NODES.value
    return "other"


def _predicted_calls(row: StrategyComm) -> Counter[_Key]:
    calls: Counter[_Key] = Counter()
    for c in row.collectives:
        root_matters = c.op is Collective.BROADCAST
        for unit in c.units:
            for elements in unit.elements:
                key = (c.op.value, c.phase.value, c.dtype.value, c.group.value, c.group_size, elements)
                calls[(*key, unit.source_rank if root_matters else None)] += c.times_per_step
    return calls


def _recorded_keys(calls: list[RecordedCall], cluster: Cluster, plan: TpPlan | None = None) -> list[_Key]:
    """The calls over groups of two ranks or more, in the order they were issued."""
    return [
        (
            c.op,
            c.phase,
            c.dtype,
            _group_kind(c.group_ranks, cluster, plan),
            len(c.group_ranks),
            c.elements,
            c.root if c.op == "broadcast" else None,
        )
        for c in calls
        if len(c.group_ranks) > 1
    ]


def _recorded_calls(calls: list[RecordedCall], cluster: Cluster) -> Counter[_Key]:
    return Counter(_recorded_keys(calls, cluster))


def _bytes(key: _Key, count: int) -> int:
    op, _, dtype, _, group_size, elements, _ = key
    if op not in {c.value for c in Collective} or dtype not in {d.value for d in DType}:
        return 0  # a call zerocalc does not model: it shows as unpredicted calls
    return count * COLLECTIVES[Collective(op)].bytes_sent_per_rank(elements * DType(dtype).bytes, group_size)


def compare_collectives(
    job: Job, row: StrategyComm, measured: list[Measured], cluster: Cluster
) -> list[CollectiveResult]:
    """The predicted calls against each rank's recorded calls, by kind of collective.

    Exact per call, except DDP's all_reduce under autocast: the reducer's buckets follow the order
    gradients become ready, which autocast changes (the casts add nodes to the graph), so the boundaries
    move while the calls and the elements stay; there the calls and their total are compared.
    """
    predicted = _predicted_calls(row)
    ranks = [_recorded_calls(m.collectives, cluster) for m in sorted(measured, key=lambda m: m.rank)]
    phases = ["forward", "backward", "after_step"]
    kinds = sorted(
        {k[:5] for k in predicted} | {k[:5] for r in ranks for k in r},
        key=lambda k: (phases.index(k[1]) if k[1] in phases else len(phases), k),
    )
    _, _, setup = STRATEGIES[job.strategy]
    autocast = job.precision is not PrecisionName.FP32 and setup.wrapper in (
        TorchWrapper.DDP,
        TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER,
    )
    results = []
    for kind in kinds:
        mine = Counter({k: v for k, v in predicted.items() if k[:5] == kind})
        theirs = [Counter({k: v for k, v in r.items() if k[:5] == kind}) for r in ranks]
        loose = autocast and kind[0] == Collective.ALL_REDUCE.value
        if loose:
            ok = all(
                r.total() == mine.total()
                and sum(k[5] * v for k, v in r.items()) == sum(k[5] * v for k, v in mine.items())
                for r in theirs
            )
            explanation = (
                "under autocast DDP's buckets follow the order gradients become ready, which the casts "
                "change: calls and elements compared, not each bucket's boundary"
            )
        else:
            ok = all(r == mine for r in theirs)
            explanation = next(
                (
                    c.behaviour
                    for c in row.collectives
                    if (c.op.value, c.phase.value, c.dtype.value, c.group.value) == kind
                ),
                "not predicted: zerocalc comm's schedule has no such collective",
            )
        results.append(
            CollectiveResult(
                op=kind[0],
                phase=kind[1],
                dtype=kind[2],
                group=kind[3],
                group_size=kind[4],
                predicted_calls=mine.total(),
                measured_calls=[r.total() for r in theirs],
                predicted_bytes=[sum(_bytes(k, v) for k, v in mine.items())] * len(theirs),
                measured_bytes=[sum(_bytes(k, v) for k, v in r.items()) for r in theirs],
                ok=ok,
                explanation=explanation,
            )
        )
    return results


def _tp_key(call: TpCall) -> _Key:
    return (call.op, call.phase, call.dtype, call.group, call.group_size, call.elements, None)


def _first_out_of_order(rank: int, mine: list[_Key], theirs: list[_Key]) -> str | None:
    if mine == theirs:
        return None
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    if index is None:
        index = min(len(mine), len(theirs))

    def shown(keys: list[_Key]) -> str:
        if index >= len(keys):
            return "nothing"
        op, phase, dtype, group, _, elements, _ = keys[index]
        return f"{op} {phase} {dtype} over {group}, S {elements:,}"

    return f"rank {rank} call {index + 1}: predicted {shown(mine)}, measured {shown(theirs)}"


def compare_tp_collectives(
    job: Job, expected: list[list[TpCall]], measured: list[Measured]
) -> tuple[list[CollectiveResult], str | None]:
    """A ``dp × tp`` run: each rank's recorded calls against its predicted ones (:mod:`zerocalc.validate.tp`),
    in order, and by kind of collective (operation, phase, dtype, dp or tp); the first call out of order
    (None: every rank in order)."""
    plan = job.tp_plan
    assert plan is not None
    cluster = Cluster.of(plan.world, plan.world)
    ordered = sorted(measured, key=lambda m: m.rank)
    mine = [[_tp_key(c) for c in calls if c.group_size > 1] for calls in expected]
    theirs = [_recorded_keys(m.collectives, cluster, plan) for m in ordered]
    notes = [_first_out_of_order(m.rank, p, r) for m, p, r in zip(ordered, mine, theirs, strict=True)]
    out_of_order = "; ".join(n for n in notes if n) or None
    phases = ["forward", "backward", "after_step"]
    kinds = sorted(
        {k[:5] for keys in mine + theirs for k in keys},
        key=lambda k: (phases.index(k[1]) if k[1] in phases else len(phases), k),
    )
    results = []
    for kind in kinds:
        predicted = [Counter(k for k in keys if k[:5] == kind) for keys in mine]
        recorded = [Counter(k for k in keys if k[:5] == kind) for keys in theirs]
        behaviours = dict.fromkeys(c.behaviour for calls in expected for c in calls if _tp_key(c)[:5] == kind)
        results.append(
            CollectiveResult(
                op=kind[0],
                phase=kind[1],
                dtype=kind[2],
                group=kind[3],
                group_size=kind[4],
                predicted_calls=predicted[0].total(),
                measured_calls=[r.total() for r in recorded],
                predicted_bytes=[sum(_bytes(k, v) for k, v in p.items()) for p in predicted],
                measured_bytes=[sum(_bytes(k, v) for k, v in r.items()) for r in recorded],
                ok=predicted == recorded,
                explanation="; ".join(behaviours) or "not predicted: the TP plan issues no such collective",
            )
        )
    return results, out_of_order


def _perturbed(line: str, value: int) -> int:
    """Test hook (``ZEROCALC_VALIDATE_PERTURB=LINE``): one fp32 element more on that line."""
    return value + DType.FP32.bytes if os.environ.get(PERTURB_ENV) == line else value


def compare(
    job: Job,
    preds: list[RankStates],
    comm: StrategyComm | list[list[TpCall]],
    measured: list[Measured],
    seconds: float | None,
) -> ConfigResult:
    """Every rank's lines and collectives; ``comm``: ``zerocalc comm``'s estimate, or under a ``dp × tp``
    mesh each rank's predicted calls in order."""
    ranks: list[RankResult] = []
    all_ok = True
    for pred, meas in zip(preds, sorted(measured, key=lambda m: m.rank), strict=True):
        lines: list[LineResult] = []
        names = [
            *LINES[: len(STATE_LINES)],
            *(["frozen"] if pred.frozen is not None else []),
            *LINES[len(STATE_LINES) :],
        ]
        for name in names:
            line = pred.frozen if name == "frozen" else pred.line(name)
            assert line is not None
            predicted = _perturbed(name, line.bytes)
            value = getattr(meas, name)
            ok = None if value is None else value == predicted
            state = name in STATE_LINES or name == "frozen"
            if state and ok is False:
                all_ok = False
            lines.append(
                LineResult(
                    line=name,
                    predicted=predicted,
                    measured=value,
                    difference=None if value is None else value - predicted,
                    ok=ok,
                    model_state=state,
                    explanation=line.explanation,
                )
            )
        if meas.peak_allocated is not None:
            floor = pred.model_states + pred.unsharded_after_forward.bytes + reducer_buckets(pred).bytes
            ceiling = floor * (1 + PEAK_TOLERANCE) + PEAK_SLACK_BYTES
            lines.append(
                LineResult(
                    line="peak_allocated",
                    predicted=floor,
                    measured=meas.peak_allocated,
                    difference=meas.peak_allocated - floor,
                    ok=floor <= meas.peak_allocated <= ceiling,
                    model_state=False,
                    explanation=(
                        "torch.cuda.max_memory_allocated vs model states + unsharded parameters (+ DDP's "
                        "gradient buckets); the "
                        f"difference is activations and temporaries (tolerance +{PEAK_TOLERANCE:.0%} "
                        f"+ {PEAK_SLACK_BYTES // 2**20} MiB)"
                    ),
                )
            )
        ranks.append(RankResult(rank=meas.rank, lines=lines, loss=meas.loss))
    out_of_order: str | None = None
    if isinstance(comm, StrategyComm):
        cluster = Cluster(world_size=len(measured), gpus_per_node=job.gpus_per_node)
        collectives = compare_collectives(job, comm, measured, cluster)
    else:
        collectives, out_of_order = compare_tp_collectives(job, comm, measured)
    in_order = None if isinstance(comm, StrategyComm) else out_of_order is None
    return ConfigResult(
        strategy=job.strategy,
        precision=job.precision,
        grad_accum=job.grad_accum,
        grad_sync=job.grad_sync,
        status="match" if all_ok and all(c.ok for c in collectives) and in_order is not False else "mismatch",
        seconds=seconds,
        ranks=ranks,
        collectives=collectives,
        call_order_ok=in_order,
        call_order_note=out_of_order,
    )
