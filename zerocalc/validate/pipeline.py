"""``zerocalc validate pipeline``: what each pipeline stage holds and sends, predicted and compared (pure,
no torch; :mod:`zerocalc.validate.pipeline_run` runs it).

The model of :mod:`zerocalc.validate.model` is cut into p stages as Megatron-LM cuts it
(``core/transformer/transformer_block.py`` ``get_num_layers_to_build``: L/p consecutive blocks per stage,
or the first and last stage's blocks given and the rest split evenly, ``--pp-first-stage-layers`` and
``--pp-last-stage-layers`` as in the analytic core; ``core/models/gpt/gpt_model.py``: the embedding where
``pre_process``, the final norm and the output layer where ``post_process``): stage i holds its
consecutive blocks (i·L/p … (i+1)·L/p − 1 when even), the first stage also the token (and
learned position) embeddings, the last the final norm and the LM head (untied: a tied head would need the
embedding on two stages). Each stage is one ``torch.distributed.pipelining.PipelineStage`` run by
``Schedule1F1B`` with m micro-batches; the d ranks of a stage hold it bare (``none``), under DDP or under
FSDP2 over their data-parallel group. Ranks are laid out pipeline-outermost
(:meth:`zerocalc.parallel.mesh.Mesh.rank_of`): rank = stage·d + dp index.

Two seams for the analytic model: :func:`predicted_stage_states` (a stage's model states per rank) and
:func:`predicted_p2p_bytes` (one point-to-point message); :func:`one_f_one_b_calls` is the order torch's
``Schedule1F1B`` sends and receives them in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.model.architecture import (
    Architecture,
    ParamTensor,
    parameter_tensors,
    pipeline_stage,
)
from zerocalc.model.code import INT64
from zerocalc.parallel.frameworks import TorchWrapper
from zerocalc.parallel.mesh import describe_layer_counts
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.pipeline import chunk_layers, split_problem, stage_layer_counts
from zerocalc.parallel.precision import PrecisionName
from zerocalc.request.values import MAX_GRAD_ACCUM
from zerocalc.states.framework import (
    STATE_LINES,
    Line,
    RankStates,
    fsdp_unit_positions,
    padded_unit_numel,
    predict_rank_states,
)
from zerocalc.validate.compare import LineResult
from zerocalc.validate.config import STRATEGIES, RecordedCall, check_buildable

PIPELINE_STRATEGIES = ("none", "ddp", "fsdp2")
"""What the data-parallel ranks of a stage run: the bare stage, DDP, or FSDP2 (``fully_shard`` per block,
then the stage's root) over the stage's data-parallel group (torchtitan's composition)."""
SCHEDULE = "Schedule1F1B"
"""The torch.distributed.pipelining schedule validate runs (``torch/distributed/pipelining/schedules.py``)."""
FORWARD, BACKWARD = "forward", "backward"


def check_pipeline(
    arch: Architecture,
    pp: int,
    world: int,
    microbatches: int,
    first: int | None = None,
    last: int | None = None,
) -> None:
    """One line (InputError) for a pipeline validate cannot build: p ≥ 2 dividing the ranks, the blocks
    split over the stages (evenly, or with ``first`` and ``last`` blocks on the end stages as Megatron-LM
    checks: :func:`~zerocalc.parallel.pipeline.split_problem`), m ≥ p micro-batches (``Schedule1F1B``
    refuses fewer), an untied head."""
    if pp < 2 or world % pp:
        raise InputError(
            f"--pp {pp} with {world} ranks is not accepted; accepted: 2 or more stages dividing the ranks"
        )
    for flag, n in (("--pp-first-stage-layers", first), ("--pp-last-stage-layers", last)):
        if n is not None and n < 1:
            raise InputError(f"{flag} {n} is not accepted; accepted: 1 or more blocks")
    problem = split_problem(arch.num_layers, pp, 1, first, last)
    if problem is not None and first is None and last is None:
        raise InputError(
            f"--pp {pp} does not divide the {arch.num_layers} blocks; accepted: --layers a multiple of {pp}, "
            "or --pp-first-stage-layers and --pp-last-stage-layers"
        )
    if problem is not None:
        given = " and ".join(
            f"{flag} {n}"
            for flag, n in (("--pp-first-stage-layers", first), ("--pp-last-stage-layers", last))
            if n is not None
        )
        middle = pp - (first is not None) - (last is not None)
        accepted = (
            "values that leave the middle stages an equal share"
            if middle
            else f"--pp-first-stage-layers + --pp-last-stage-layers = {arch.num_layers}"
        )
        raise InputError(
            f"{given} with --pp {pp}: of the {arch.num_layers} blocks, {problem}; accepted: {accepted}"
        )
    if microbatches > MAX_GRAD_ACCUM:
        raise InputError(
            f"--grad-accum {microbatches:,} is not accepted; accepted: {pp} to {MAX_GRAD_ACCUM:,} "
            "micro-batches"
        )
    if microbatches < pp:
        raise InputError(
            f"--grad-accum {microbatches} micro-batches with --pp {pp} is not accepted; accepted: at least "
            f"{pp} (Schedule1F1B needs a micro-batch per stage)"
        )
    if arch.tied_embeddings:
        raise InputError(
            f"{arch.name} ties its LM head to the embedding, which --pp would need on the first and the last "
            "stage; accepted: a model with an untied head (llama-3-8b, mistral-7b, qwen2.5-7b, ...)"
        )


def stage_layers(
    num_layers: int, pp: int, stage: int, first: int | None = None, last: int | None = None
) -> range:
    """The blocks of ``stage``: the analytic core's (:func:`~zerocalc.parallel.pipeline.chunk_layers`, one
    chunk per rank: L/p consecutive blocks, or ``first`` and ``last`` on the end stages and the rest split
    evenly, Megatron-LM ``get_num_layers_to_build``)."""
    (layers,) = chunk_layers(num_layers, pp, 1, stage, first, last)
    return layers


def stage_tensors(
    arch: Architecture, pp: int, stage: int, first: int | None = None, last: int | None = None
) -> list[ParamTensor]:
    """The parameter tensors ``stage`` holds, in registration order: the analytic core's pipeline stage
    (:func:`~zerocalc.model.architecture.pipeline_stage`): the embeddings on the first stage, its blocks,
    the final norm and the LM head on the last."""
    layers = tuple(stage_layers(arch.num_layers, pp, stage, first, last))
    return parameter_tensors(pipeline_stage(arch, pp, 1, stage, layers))


def predicted_stage_states(
    arch: Architecture,
    pp: int,
    stage: int,
    strategy: str,
    dp: int,
    dp_rank: int,
    precision: PrecisionName,
    optimizer: OptimizerName,
    first: int | None = None,
    last: int | None = None,
) -> RankStates:
    """The model states one rank of ``stage`` holds after a step (seam for the analytic pipeline model):
    :func:`~zerocalc.states.framework.predict_rank_states` over the stage's tensors and its d
    data-parallel ranks (``none`` and DDP: every tensor of the stage; FSDP2: each sharded on dim 0 over
    d)."""
    setup = STRATEGIES["fsdp2" if strategy == "fsdp2" else "ddp"][2]
    tensors = stage_tensors(arch, pp, stage, first, last)
    states = predict_rank_states(arch, setup, dp, dp_rank, precision, optimizer, tensors=tensors)
    if strategy != "none":
        return states
    whole = sum(t.numel for t in tensors)
    return states.model_copy(
        update={
            "params": Line(
                bytes=states.params.bytes, explanation=f"{whole:,} fp32 elements: the whole stage"
            ),
            "grads": Line(bytes=states.grads.bytes, explanation=f"{whole:,} fp32 elements, not reduced"),
        }
    )


def activation_dtype(strategy: str, precision: PrecisionName) -> DType:
    """The dtype of the hidden states a stage sends (and of their gradients): fp32; bf16 under FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bf16)`` (``output_dtype`` None leaves the blocks' bf16 output);
    fp32 under autocast (none, DDP): the embedding's output is fp32 and each block adds its bf16
    projections to that residual, which type promotion keeps fp32."""
    if precision is PrecisionName.BF16_MIXED and strategy == "fsdp2":
        return DType.BF16
    return DType.FP32


def activation_elements(arch: Architecture, micro_batch: int, seq_len: int) -> int:
    """b·s·h: the hidden states of one micro-batch, the one tensor a stage boundary carries."""
    return micro_batch * seq_len * arch.hidden_size


def predicted_p2p_bytes(arch: Architecture, micro_batch: int, seq_len: int, dtype: DType) -> int:
    """Bytes of one point-to-point message across a stage boundary (seam for the analytic pipeline model):
    a micro-batch's hidden states b·s·h forward, their gradient (the same shape and dtype) backward."""
    return activation_elements(arch, micro_batch, seq_len) * dtype.bytes


class P2PCall(BaseModel):
    """One send or receive of a stage, predicted or recorded."""

    model_config = ConfigDict(frozen=True)

    op: str = Field(description="send or recv")
    peer: int = Field(description="the other rank (global)")
    phase: str = Field(description="forward (activations) or backward (their gradients)")
    dtype: str
    elements: int
    micro_batch: int | None = Field(default=None, description="predicted calls only")

    def key(self) -> tuple[str, int, str, str, int]:
        return (self.op, self.peer, self.phase, self.dtype, self.elements)

    @property
    def bytes(self) -> int:
        known = {d.value: d for d in DType}
        return self.elements * known[self.dtype].bytes if self.dtype in known else 0


def one_f_one_b_calls(stage: int, pp: int, microbatches: int) -> list[tuple[str, int, int, str]]:
    """(op, peer stage, micro-batch, phase) of every send and receive of ``stage`` in one step, in the order
    torch 2.13's ``Schedule1F1B._step_microbatches`` issues them: min(m, p − i) warm-up forwards (each
    receives its input, then sends its output; the last warm-up send waits to go out with the first
    backward's receive), then one backward and one forward in turn (a backward's gradient send goes out
    with the next forward's receive), then the remaining backwards."""
    first, last = stage == 0, stage == pp - 1

    def fwd_recv(i: int) -> list[tuple[str, int, int, str]]:
        return [] if first else [("recv", stage - 1, i, FORWARD)]

    def fwd_send(i: int) -> list[tuple[str, int, int, str]]:
        return [] if last else [("send", stage + 1, i, FORWARD)]

    def bwd_recv(i: int) -> list[tuple[str, int, int, str]]:
        return [] if last else [("recv", stage + 1, i, BACKWARD)]

    def bwd_send(i: int) -> list[tuple[str, int, int, str]]:
        return [] if first else [("send", stage - 1, i, BACKWARD)]

    calls: list[tuple[str, int, int, str]] = []
    warmup = min(microbatches, pp - stage)
    forward = backward = 0
    pending: list[tuple[str, int, int, str]] = []
    for _ in range(warmup):
        calls += fwd_recv(forward)
        if forward != warmup - 1:
            calls += fwd_send(forward)
        else:
            pending = fwd_send(forward)
        forward += 1
    while True:
        calls += pending + bwd_recv(backward)
        grad_sends = bwd_send(backward)
        backward += 1
        if forward == microbatches:
            break
        calls += grad_sends + fwd_recv(forward)
        pending = fwd_send(forward)
        forward += 1
    calls += grad_sends
    while backward < microbatches:
        calls += bwd_recv(backward) + bwd_send(backward)
        backward += 1
    return calls


def predicted_p2p(
    arch: Architecture,
    pp: int,
    dp: int,
    rank: int,
    microbatches: int,
    micro_batch: int,
    seq_len: int,
    dtype: DType,
) -> list[P2PCall]:
    """Every send and receive of ``rank`` in one step, in order (:func:`one_f_one_b_calls`), each of one
    micro-batch's hidden states (:func:`activation_elements`); the peer is the rank of the same dp index
    on the neighbouring stage."""
    stage, dp_index = divmod(rank, dp)
    elements = activation_elements(arch, micro_batch, seq_len)
    return [
        P2PCall(
            op=op,
            peer=peer * dp + dp_index,
            phase=phase,
            dtype=dtype.value,
            elements=elements,
            micro_batch=mb,
        )
        for op, peer, mb, phase in one_f_one_b_calls(stage, pp, microbatches)
    ]


class PipelineJob(BaseModel):
    """One configuration of a pipeline run: p stages of the model, a data-parallel strategy, a precision."""

    arch: Architecture
    pp: int = Field(ge=2)
    strategy: str = Field(description="none, ddp or fsdp2")
    precision: PrecisionName
    optimizer: OptimizerName
    backend: str
    timeout_s: float = Field(gt=0)
    microbatches: int = Field(ge=1, description="m: micro-batches of one step")
    batch: int = Field(default=2, description="b: sequences per micro-batch")
    seq: int = 16
    seed: int = 0
    first_stage_layers: int | None = Field(default=None, description="the first stage's blocks (None: L/p)")
    last_stage_layers: int | None = Field(default=None, description="the last stage's blocks (None: L/p)")

    @property
    def stage_blocks(self) -> tuple[int, ...]:
        """Each stage's blocks, first to last."""
        return stage_layer_counts(
            self.arch.num_layers, self.pp, self.first_stage_layers, self.last_stage_layers
        )

    @property
    def title(self) -> str:
        uneven = self.first_stage_layers is not None or self.last_stage_layers is not None
        blocks = f" · blocks {describe_layer_counts(self.stage_blocks)}" if uneven else ""
        return f"pp {self.pp}{blocks} · {self.strategy} · {self.precision.value} · m={self.microbatches}"


class StageMeasured(BaseModel):
    """What one rank of a pipeline held after the measured step and what it sent and received in it."""

    rank: int
    stage: int
    params: int
    grads: int
    optimizer: int
    step: int
    loss: float | None = Field(default=None, description="the last stage's mean micro-batch loss")
    p2p: list[P2PCall] = Field(default_factory=list, description="in the order issued")
    collectives: list[RecordedCall] = Field(default_factory=list, description="the data-parallel ones")


class P2PSummary(BaseModel):
    """A rank's sends and receives of one kind (op, phase): calls and bytes, predicted and measured."""

    op: str
    phase: str
    peer: int
    predicted_calls: int
    measured_calls: int
    bytes_per_call: int = Field(description="predicted: one micro-batch's hidden states (or gradient)")
    predicted_bytes: int
    measured_bytes: int


class StageResult(BaseModel):
    rank: int
    stage: int
    dp_rank: int
    lines: list[LineResult]
    p2p: list[P2PSummary]
    p2p_in_order: bool = Field(description="every call equal to the predicted one at its position")
    p2p_difference: str | None = Field(default=None, description="the first call that differs")
    reduction: str = Field(
        description="the gradient reduction predicted over the stage's data-parallel group"
    )
    reduction_ok: bool | None = Field(description="None: a group of one rank reduces nothing")
    collectives: list[str] = Field(default_factory=list, description="the data-parallel collectives, as seen")
    loss: float | None = None


class PipelineConfigResult(BaseModel):
    title: str
    strategy: str
    precision: PrecisionName
    microbatches: int
    status: str = Field(description="match, mismatch or failed")
    error: str | None = None
    seconds: float | None = None
    stages: list[StageResult] = []


class PipelineReport(BaseModel):
    model: str
    architecture: Architecture
    world_size: int
    pp: int
    dp: int
    stage_blocks: list[int] = Field(description="each stage's blocks, first to last")
    schedule: str = SCHEDULE
    micro_batch: int
    seq_len: int
    backend: str
    configs: list[PipelineConfigResult]
    all_match: bool


def _summaries(predicted: list[P2PCall], measured: list[P2PCall]) -> list[P2PSummary]:
    kinds = dict.fromkeys((c.op, c.phase, c.peer) for c in [*predicted, *measured])
    rows = []
    for op, phase, peer in kinds:
        mine = [c for c in predicted if (c.op, c.phase, c.peer) == (op, phase, peer)]
        theirs = [c for c in measured if (c.op, c.phase, c.peer) == (op, phase, peer)]
        rows.append(
            P2PSummary(
                op=op,
                phase=phase,
                peer=peer,
                predicted_calls=len(mine),
                measured_calls=len(theirs),
                bytes_per_call=mine[0].bytes if mine else 0,
                predicted_bytes=sum(c.bytes for c in mine),
                measured_bytes=sum(c.bytes for c in theirs),
            )
        )
    return rows


def first_difference(predicted: list[P2PCall], measured: list[P2PCall]) -> str | None:
    """The first position where the recorded calls differ from the predicted ones (None: all equal)."""
    for index, (mine, theirs) in enumerate(zip(predicted, measured, strict=False)):
        if mine.key() != theirs.key():
            return (
                f"call {index + 1}: predicted {mine.op} {mine.phase} {mine.elements:,} {mine.dtype} "
                f"(micro-batch {mine.micro_batch}) with rank {mine.peer}, measured {theirs.op} "
                f"{theirs.phase} {theirs.elements:,} {theirs.dtype} with rank {theirs.peer}"
            )
    if len(predicted) != len(measured):
        return f"predicted {len(predicted)} calls, measured {len(measured)}"
    return None


def compare_pipeline(
    job: PipelineJob, world: int, measured: list[StageMeasured], seconds: float | None
) -> PipelineConfigResult:
    """Each rank's model states against :func:`predicted_stage_states`, exactly, and its sends and
    receives against :func:`predicted_p2p`, call by call and in order."""
    dp = world // job.pp
    dtype = activation_dtype(job.strategy, job.precision)
    stages = []
    ok = True
    for meas in sorted(measured, key=lambda m: m.rank):
        stage, dp_rank = divmod(meas.rank, dp)
        pred = predicted_stage_states(
            job.arch, job.pp, stage, job.strategy, dp, dp_rank, job.precision, job.optimizer,
            job.first_stage_layers, job.last_stage_layers,
        )  # fmt: skip
        lines = []
        for name in STATE_LINES:
            predicted, value = pred.line(name).bytes, getattr(meas, name)
            ok &= predicted == value
            lines.append(
                LineResult(
                    line=name,
                    predicted=predicted,
                    measured=value,
                    difference=value - predicted,
                    ok=predicted == value,
                    model_state=True,
                    explanation=pred.line(name).explanation,
                )
            )
        calls = predicted_p2p(job.arch, job.pp, dp, meas.rank, job.microbatches, job.batch, job.seq, dtype)
        difference = first_difference(calls, meas.p2p)
        ok &= difference is None
        reduction, reduction_ok = compare_reduction(job, dp, stage, meas.collectives)
        ok &= reduction_ok is not False
        stages.append(
            StageResult(
                rank=meas.rank,
                stage=stage,
                dp_rank=dp_rank,
                lines=lines,
                p2p=_summaries(calls, meas.p2p),
                p2p_in_order=difference is None,
                p2p_difference=difference,
                reduction=reduction,
                reduction_ok=reduction_ok,
                collectives=seen_collectives(meas.collectives),
                loss=meas.loss,
            )
        )
    return PipelineConfigResult(
        title=job.title,
        strategy=job.strategy,
        precision=job.precision,
        microbatches=job.microbatches,
        status="match" if ok else "mismatch",
        seconds=seconds,
        stages=stages,
    )


def predicted_reduction(job: PipelineJob, dp: int, stage: int) -> tuple[str, list[int]]:
    """The gradient reduction of one step over a stage's d ranks: (collective, S of each call). DDP: one
    all-reduce of every gradient element of the stage, in buckets whose boundaries are DDP's (only the sum
    is predicted: ``[total]``); FSDP2: one reduce-scatter per unit (each block, then the stage root) of
    its dim-0-padded elements. Once per step, in the last micro-batch's backward: ``PipelineStage`` runs
    the others under ``no_sync()`` / ``set_requires_gradient_sync(False)`` (torch 2.13
    ``pipelining/stage.py`` ``backward_maybe_with_nosync``, ``perform_reduce_grad``). ``none``: nothing."""
    tensors = stage_tensors(job.arch, job.pp, stage, job.first_stage_layers, job.last_stage_layers)
    if job.strategy == "ddp":
        return "all_reduce", [sum(t.numel for t in tensors)]
    if job.strategy == "fsdp2":
        units = [[tensors[i] for i in unit] for _, unit in fsdp_unit_positions(tensors)]
        return "reduce_scatter", sorted(padded_unit_numel(unit, dp, TorchWrapper.FSDP2) for unit in units)
    return "none", []


REDUCTIONS = ("all_reduce", "reduce_scatter")


def compare_reduction(
    job: PipelineJob, dp: int, stage: int, calls: list[RecordedCall]
) -> tuple[str, bool | None]:
    """The recorded gradient reductions (fp32, backward, over the stage's d ranks) against
    :func:`predicted_reduction`: the sum of S under DDP, every call's S under FSDP2, none otherwise."""
    op, sizes = predicted_reduction(job, dp, stage)
    text = "none" if op == "none" else f"{op} fp32 over {dp} ranks, S = {' + '.join(f'{n:,}' for n in sizes)}"
    if dp < 2:
        return "none: one rank per stage", None
    group = [stage * dp + i for i in range(dp)]
    measured = [c for c in calls if c.op in REDUCTIONS and len(c.group_ranks) > 1]
    if any(c.group_ranks != group or c.phase != BACKWARD or c.dtype != DType.FP32.value for c in measured):
        return text, False
    if op == "none":
        return text, not measured
    if any(c.op != op for c in measured):
        return text, False
    elements = sorted(c.elements for c in measured)
    return text, (sum(elements) == sizes[0]) if op == "all_reduce" else elements == sizes


def seen_collectives(calls: list[RecordedCall]) -> list[str]:
    """The data-parallel collectives of a rank, counted by (op, phase, dtype, group): shown, not compared."""
    counts: dict[tuple[str, str, str, str], list[int]] = {}
    for call in calls:
        if len(call.group_ranks) < 2:
            continue
        key = (call.op, call.phase, call.dtype, ",".join(map(str, call.group_ranks)))
        counts.setdefault(key, []).append(call.elements)
    return [
        f"{op} {phase} {dtype} ranks {group}: {len(sizes)} calls, {sum(sizes):,} elements"
        for (op, phase, dtype, group), sizes in counts.items()
    ]


def pipeline_architecture(model: str | None, overrides: dict[str, int], pp: int) -> Architecture:
    """The model to cut into stages: ``--model`` with its overrides, or validate's default model (GPT-2
    shrunk to odd sizes) with one block per stage and its head untied."""
    from zerocalc.validate.run import resolve_architecture

    if model is None:
        overrides = {"num_layers": pp, **overrides}
    arch = resolve_architecture(model, overrides)
    check_buildable(arch)
    if model is None and arch.tied_embeddings:
        data = arch.model_dump()
        data["tied_embeddings"] = False
        data["name"] = (
            arch.name[:-1] + ", untied head)" if arch.name.endswith(")") else arch.name + " (untied head)"
        )
        arch = Architecture.model_validate(data)
    return arch


CUDA_BLOCK = 512
"""``kMinBlockSize`` of ``c10/cuda/CUDACachingAllocator.cpp``: the fake run rounds every storage to it."""


def rounded(n_bytes: int) -> int:
    """One storage's bytes as the CUDA caching allocator rounds them."""
    return -(-n_bytes // CUDA_BLOCK) * CUDA_BLOCK


class FakePipelineCase(BaseModel):
    """One stage of a pipeline run under fake tensors: the fake world (p stages × d ranks), the stage, m
    micro-batches of b × s, the precision, FSDP2's ``reshard_after_forward``."""

    model_config = ConfigDict(frozen=True)

    world: int
    pp: int
    stage: int
    microbatches: int
    micro_batch: int
    seq_len: int
    precision: PrecisionName
    reshard: bool

    @property
    def dp(self) -> int:
        return self.world // self.pp

    @property
    def rank(self) -> int:
        """The rank the process plays: the stage's first data-parallel rank (the largest dim-0 shards)."""
        return self.stage * self.dp


class FakeStageFigures(BaseModel):
    """What the tracker saw on one stage's rank (bytes, every storage rounded to 512 B)."""

    start: int = Field(description="allocated at the step's start")
    at_start: dict[str, int] = Field(description="FSDPMemTracker's categories at the step's start")
    peak: int = Field(description="the step's high-water mark of every tracked storage")
    at_peak: dict[str, int] = Field(description="FSDPMemTracker's categories at that moment")
    params: int
    grads: int
    optimizer: int
    step: int
    after_schedule: int = Field(
        description="allocated when Schedule1F1B.step returns (before optimizer.step)"
    )
    peak_without_outputs: int | None = Field(
        default=None, description="last stage: the peak of the same step with return_outputs=False"
    )
    after_schedule_without_outputs: int | None = Field(
        default=None, description="last stage: after_schedule of the same step with return_outputs=False"
    )


class FakeStageResult(BaseModel):
    case: FakePipelineCase
    figures: FakeStageFigures
    lines: list[LineResult] = Field(
        description="model states against predicted_stage_states, and the buffers at the step's start "
        "against pipeline_buffers, exactly"
    )
    outputs_kept: LineResult | None = Field(
        default=None,
        description="last stage: what keeping the micro-batches' outputs adds when the step returns, "
        "against m logits of b × s × V",
    )
    seconds: float

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines) and (
            self.outputs_kept is None or bool(self.outputs_kept.ok)
        )


class FakePipelineReport(BaseModel):
    model: str
    architecture: Architecture
    torch: str
    schedule: str = SCHEDULE
    stages: list[FakeStageResult]

    @property
    def all_match(self) -> bool:
        return all(stage.ok for stage in self.stages)


def kept_outputs_bytes(arch: Architecture, case: FakePipelineCase) -> int:
    """What the last stage's kept outputs hold when ``Schedule1F1B.step(return_outputs=True)`` (the
    default) returns: every micro-batch's output appended to ``output_chunks`` (torch 2.13
    ``pipelining/stage.py`` ``forward_one_chunk``), m logits of b × s × V (fp32, or bf16 under FSDP2's
    bf16 parameters), alive until the next step clears them."""
    dtype = activation_dtype("fsdp2", case.precision)
    return case.microbatches * rounded(case.micro_batch * case.seq_len * arch.vocab_size * dtype.bytes)


def pipeline_buffers(arch: Architecture, case: FakePipelineCase) -> int:
    """What a stage holds at a step's start besides its model states (each storage rounded to 512 B):

    * a receive buffer per micro-batch for its input (every stage but the first) and one for its output's
      gradient (every stage but the last), b × s × h each, allocated once and kept (torch 2.13
      ``pipelining/stage.py`` ``_setup_forward_recv_info`` and ``_setup_backward_recv_info`` →
      ``_create_grad_recv_info``, one ``_make_tensor_from_meta`` per micro-batch);
    * the last stage: the previous step's m outputs (b × s × V logits), which ``output_chunks`` keeps
      until the next ``step`` clears it (``clear_runtime_states``) when ``return_outputs`` is true (the
      default);
    * the first stage's inputs and the last stage's targets: the step's m·b·s token ids, one tensor.
    """
    dtype = activation_dtype("fsdp2", case.precision)
    m, b, s = case.microbatches, case.micro_batch, case.seq_len
    first, last = case.stage == 0, case.stage == case.pp - 1
    hidden = rounded(b * s * arch.hidden_size * dtype.bytes)
    total = (int(not first) + int(not last)) * m * hidden
    if first or last:
        total += rounded(m * b * s * INT64)  # token ids: torch.randint's int64
    if last:
        total += m * rounded(b * s * arch.vocab_size * dtype.bytes)
    return total


def compare_fake_stage(
    arch: Architecture,
    case: FakePipelineCase,
    figures: FakeStageFigures,
    optimizer: OptimizerName,
    seconds: float,
) -> FakeStageResult:
    """The stage's model states against :func:`predicted_stage_states` (FSDP2 over d ranks), exactly, and
    the last stage's kept outputs against :func:`kept_outputs_bytes`."""
    pred = predicted_stage_states(arch, case.pp, case.stage, "fsdp2", case.dp, 0, case.precision, optimizer)
    lines = []
    for name in STATE_LINES:
        predicted, value = pred.line(name).bytes, getattr(figures, name)
        lines.append(
            LineResult(
                line=name,
                predicted=predicted,
                measured=value,
                difference=value - predicted,
                ok=value == predicted,
                model_state=True,
                explanation=pred.line(name).explanation,
            )
        )
    buffers = pipeline_buffers(arch, case)
    at_start = figures.at_start.get("Activation", 0)
    lines.append(
        LineResult(
            line="buffers_at_start",
            predicted=buffers,
            measured=at_start,
            difference=at_start - buffers,
            ok=at_start == buffers,
            model_state=False,
            explanation="m receive buffers per direction, the last stage's previous outputs, the token batch",
        )
    )
    kept = None
    if figures.after_schedule_without_outputs is not None:
        predicted = kept_outputs_bytes(arch, case)
        value = figures.after_schedule - figures.after_schedule_without_outputs
        kept = LineResult(
            line="outputs_kept",
            predicted=predicted,
            measured=value,
            difference=value - predicted,
            ok=value == predicted,
            model_state=False,
            explanation="m micro-batches' logits in output_chunks when step(return_outputs=True) returns",
        )
    return FakeStageResult(
        case=case, figures=figures, lines=lines, outputs_kept=kept, seconds=round(seconds, 2)
    )
