"""``zerocalc validate fake``: FSDP2 at any world size under fake tensors, against the timeline (pure).

The torch side (:mod:`zerocalc.validate.fake_step`) runs the real Hugging Face model and the real FSDP2 on
the CPU under ``FakeTensorMode`` and a fake process group of N ranks, and PyTorch's own
``FSDPMemTracker`` gives each phase's allocated bytes (:class:`~zerocalc.validate.phases.AllocatedPhases`,
every storage rounded to 512 B as the CUDA caching allocator rounds it). This module predicts the same
figures from the step timeline of ``zerocalc memory --framework fsdp2 --model-impl hf`` (the same request:
bf16 parameters, fp32 reduce, AdamW foreach, flash attention) and compares them line by line, exactly
(:func:`~zerocalc.validate.phases.allocated_lines` with tolerance 0).

What a CUDA step allocates and a CPU run cannot (:class:`~zerocalc.peak.timeline.Runtime`: the cuBLAS
workspaces, SDPA's philox seed and offset per layer, the extras measured on the H100) is left out of the
prediction compared here and named apart (:func:`cuda_extras`), with what it adds to each line.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.units import ceil_div
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import Architecture, parameter_tensors
from zerocalc.model.code import HF, Device, OutputKept, Shape
from zerocalc.model.traits import traits
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.parallel.strategies import StrategyName
from zerocalc.peak.kinds import StepPhase
from zerocalc.peak.layer_nodes import experts_traced
from zerocalc.peak.ledger import CUDA_BLOCK
from zerocalc.peak.simulate import StepResult, runtime_for, simulate
from zerocalc.request.training import TrainingRequest, parse_options
from zerocalc.states.framework import ADAM_STATES, fsdp_units
from zerocalc.validate.config import TpPlan
from zerocalc.validate.phases import ALLOCATED_LINES, AllocatedPhases, PhaseLine, allocated_lines
from zerocalc.validate.tp import REDUCE_DTYPE, local_numel

FP8_SKIPPED = {"fp8_skip": "lm_head"}
"""The modules the fake run leaves in high precision (the LM head, as torchtitan's llama3 jobs do with
``filter_fqns = ["output"]``)."""
RECOMPUTES = (Recompute.NONE, Recompute.FULL)
"""``--recompute`` values the fake run builds: none, or ``gradient_checkpointing_enable(use_reentrant=
False)``."""
GPU = "h100-80gb"
"""The GPU preset whose runtime figures the CUDA extras are (the prediction compared leaves them out)."""


class FakeCase(BaseModel):
    """One configuration: the model, the world size and micro-batch, activation checkpointing, and
    ``reshard_after_forward`` (of every block and the root)."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="the model's name (a preset's, or the config.json's folder)")
    world: int
    micro_batch: int
    seq_len: int
    recompute: Recompute
    reshard: bool
    tp: int = Field(default=1, description="tensor-parallel ranks: a dp × tp mesh when ≥ 2")
    sequence_parallel: bool = True
    loss_parallel: bool = True
    fp8: Fp8RecipeName = Fp8RecipeName.NONE
    """torchao's float8 recipe of every nn.Linear but the LM head (``--fp8-skip lm_head``)."""
    fp8_all_gather: bool = False
    lora_rank: int = Field(default=0, description="PEFT LoRA's r on the default targets (0: full training)")
    keep_output: OutputKept = Field(
        default=OutputKept.NONE, description="how long the loop holds the model's output (--keep-output)"
    )

    @property
    def tp_plan(self) -> TpPlan | None:
        if self.tp < 2:
            return None
        return TpPlan(
            dp=self.world // self.tp,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            loss_parallel=self.loss_parallel,
        )

    @property
    def strategy(self) -> StrategyName:
        """FSDP2 ``reshard_after_forward=True`` is zero3, ``False`` shard_grad_op."""
        return StrategyName.ZERO3 if self.reshard else StrategyName.SHARD_GRAD_OP

    @property
    def title(self) -> str:
        reshard = "reshard" if self.reshard else "no reshard"
        plan = self.tp_plan
        mesh = f"world {self.world}" if plan is None else f"world {self.world} = {plan.title}"
        fp8 = "" if self.fp8 is Fp8RecipeName.NONE else f", fp8 {self.fp8.value}"
        fp8 += " all-gather" if self.fp8_all_gather else ""
        fp8 += f", LoRA r {self.lora_rank}" if self.lora_rank else ""
        fp8 += f", output kept {self.keep_output.value}" if self.keep_output is not OutputKept.NONE else ""
        return (
            f"{self.model}: FSDP2 {mesh}, b={self.micro_batch} s={self.seq_len}, "
            f"recompute {self.recompute.value}, {reshard}{fp8}"
        )


class CudaExtra(BaseModel):
    """An allocation of a CUDA step that a CPU run does not make (the timeline's runtime figures)."""

    model_config = ConfigDict(frozen=True)

    name: str
    bytes: int = Field(description="each")
    count: int
    lifetime: str


RECOMPUTE_CLAIMED = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Families whose checkpointed steps are claimed exact: in the others (Gemma's norms, mixtures of experts)
the checkpointed forward frees a layer's intermediates as they drop and the timeline allocates the
layer's saved tensors at once, and their recomputed layer's backward is not traced op by op."""


SLIDING_WINDOW_DEFAULTS = {"mistral": 4096}
"""``sliding_window`` where a config.json leaves it out (``MistralConfig``; the others: None)."""
USE_SLIDING_WINDOW = frozenset({"qwen2", "qwen3", "qwen3_moe"})
"""Families whose sliding window applies only with ``use_sliding_window`` (``Qwen2Config`` …)."""


def not_claimed(config: dict[str, Any], arch: Architecture, case: FakeCase) -> str | None:
    """Why the case is measured and shown but not claimed exact (None: claimed). ``config`` is the
    config.json transformers builds (the sliding window is read there: the architecture has none)."""
    family = arch.family or "llama"
    if case.lora_rank:
        return (
            "a LoRA step's layers are the model code's fine-tuning saves (zerocalc/model/code/finetune.py), "
            "which count no in-layer transients; at the forward and backward peaks the tracker holds one "
            "block's all-gather output from the last forward all-gather until the next step, which FSDP2 "
            "releases at the root's post-forward (no tensor of it is alive then: not modelled), and under "
            "checkpointing the tracker holds tensors the timeline does not name: measured and shown, not "
            "claimed exact"
        )
    if case.fp8 is not Fp8RecipeName.NONE:
        return (
            "torchao's eager fp8 casts (9 bytes per element cast: an fp32 scaled and an fp32 clamped copy "
            "beside the fp8 result) are in the forward op by op, and in the backward at each Linear's "
            "start as the nodes before it leave it (the order of autograd's frees approximated: a "
            "backward peak inside a cast may be off by a few token-by-width tensors)"
        )
    if max(arch.residual_dropout, arch.embedding_dropout, arch.attention_dropout) > 0:
        return (
            "dropout on the CPU takes a slow path (bf16 noise tensors, SDPA's math kernel with the score "
            "matrices) where CUDA fuses it into the attention kernel"
        )
    window = config.get("sliding_window", SLIDING_WINDOW_DEFAULTS.get(family))
    applies = family not in USE_SLIDING_WINDOW or bool(config.get("use_sliding_window"))
    if window is not None and applies and not traits(arch).sliding_pattern:
        return (
            "a sliding-window KV cache (config.json sliding_window): each layer's 0-dim device tensor "
            "of DynamicSlidingWindowLayer is not in the timeline"
        )
    if case.recompute is Recompute.FULL and family not in RECOMPUTE_CLAIMED:
        return (
            f"{family} under activation checkpointing: the checkpointed forward frees a layer's "
            "intermediates as they drop, and the recomputed layer's backward is not traced op by op"
        )
    if arch.num_experts and not case.reshard and not _experts_traced(arch, case):
        return (
            "mixture of experts with every block unsharded through backward: the experts' backward "
            "transients are not traced op by op where the peak falls at a layer's gradients"
        )
    return None


def _experts_traced(arch: Architecture, case: FakeCase) -> bool:
    """Every mixture-of-experts layer's experts are traced node by node by the timeline
    (:func:`zerocalc.peak.layer_nodes.experts_traced`: Mixtral's and Qwen3-MoE's, not shared experts)."""
    shape = Shape(case.micro_batch, case.seq_len)
    return all(experts_traced(HF, arch, i, shape) for i in range(arch.num_layers) if arch.is_moe_layer(i))


class FakeCaseResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    case: FakeCase
    lines: tuple[PhaseLine, ...] = Field(description="the timeline without the CUDA extras vs the tracker")
    cuda_added: tuple[int, ...] = Field(description="per line, what the CUDA extras add to the timeline")
    cuda_extras: tuple[CudaExtra, ...]
    peak_events: dict[str, str] = Field(description="per phase, the timeline's event at the phase's peak")
    not_claimed: str | None = Field(description="why the case is not claimed exact (None: claimed)")
    seconds: float

    @property
    def exact(self) -> bool:
        return all(line.ok for line in self.lines)

    @property
    def ok(self) -> bool:
        """Exact, or not claimed exact."""
        return self.exact or self.not_claimed is not None


class TrackedStates(BaseModel):
    """Model states on rank 0 as the tracker files them (``_FSDPRefType``), every storage rounded to 512 B:
    sharded parameters and optimizer states at the measured step's start, sharded gradients after its
    backward."""

    model_config = ConfigDict(frozen=True)

    params: int
    optimizer: int
    grads: int


TRACKED_STATE_LINES = (
    ("sharded params", "params"),
    ("optimizer states", "optimizer"),
    ("sharded grads", "grads"),
)


class FakeTpCaseResult(BaseModel):
    """A dp × tp case: the model states against :mod:`zerocalc.validate.tp`, exactly; each phase's
    allocated bytes as the tracker gives them (the step timeline does not model TP activations)."""

    model_config = ConfigDict(frozen=True)

    case: FakeCase
    lines: tuple[PhaseLine, ...] = Field(description="the model states: predicted vs the tracker's")
    phases: AllocatedPhases = Field(description="the tracker's allocated bytes per phase, on rank 0")
    seconds: float

    @property
    def exact(self) -> bool:
        return all(line.ok for line in self.lines)


class FakeReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    torch: str
    transformers: str
    cases: tuple[FakeCaseResult, ...]
    tp_cases: tuple[FakeTpCaseResult, ...] = ()

    @property
    def all_match(self) -> bool:
        """Every claimed case exact."""
        return all(case.ok for case in self.cases) and all(case.exact for case in self.tp_cases)


def request_for(model: str, case: FakeCase) -> TrainingRequest:
    """``zerocalc memory --model MODEL --gpus N --framework fsdp2 --strategy zero3|shard_grad_op
    --reduce-dtype fp32 --model-impl hf --flash-attention --gpu h100-80gb`` with the case's b, s and
    recompute (and ``--lora-rank``): the recipe the fake run follows."""
    return parse_options(
        model=model,
        gpus=case.world,
        framework="fsdp2",
        strategies=case.strategy.value,
        micro_batch=case.micro_batch,
        seq_len=case.seq_len,
        recompute=case.recompute.value,
        reduce_dtype="fp32",
        model_impl="hf",
        flash_attention=True,
        gpu=GPU,
        precision="bf16-mixed",
        optimizer="adamw",
        optimizer_impl="foreach",
        **FP8_SKIPPED if case.fp8 is not Fp8RecipeName.NONE else {},
        fp8=case.fp8.value,
        fp8_all_gather=case.fp8_all_gather,
        lora_rank=case.lora_rank,
        keep_output=case.keep_output.value,
    )


def _phases(result: StepResult) -> AllocatedPhases:
    peaks = {p.phase: p.allocated for p in result.phases}
    return AllocatedPhases(
        start_allocated=result.start,
        forward_peak=peaks[StepPhase.FORWARD],
        after_forward=result.after_forward,
        backward_peak=peaks[StepPhase.BACKWARD],
        after_backward=result.after_backward,
        optimizer_peak=peaks[StepPhase.OPTIMIZER],
    )


def cuda_extras(request: TrainingRequest, case: FakeCase) -> tuple[CudaExtra, ...]:
    """The timeline's CUDA runtime allocations for this case (:mod:`zerocalc.peak.timeline`: ``Runtime``,
    ``steady_start``, ``_runtime_extras``, ``run_step``), named with their sizes."""
    runtime = runtime_for(request)
    layers = request.architecture.num_layers
    extras = [
        CudaExtra(
            name="cuBLAS workspace (forward thread, autograd thread; CublasHandlePool.cpp)",
            bytes=runtime.cublas_workspace,
            count=2,
            lifetime="the whole step",
        ),
        CudaExtra(name="unattributed at the step start", bytes=runtime.start_extra, count=1,
                  lifetime="the whole step"),
    ]  # fmt: skip
    if case.recompute is Recompute.FULL:
        extras.append(
            CudaExtra(name="activation checkpointing runtime extra", bytes=runtime.recompute_extra, count=1,
                      lifetime="the whole step")
        )  # fmt: skip
    else:
        extras.append(
            CudaExtra(name="SDPA philox seed and offset", bytes=runtime.per_layer_attention, count=layers,
                      lifetime="a layer's forward to its backward")
        )  # fmt: skip
    if not case.reshard:
        extras.append(
            CudaExtra(name="reshard_after_forward=False runtime extra", bytes=runtime.no_reshard_extra,
                      count=1, lifetime="forward to the end of backward")
        )  # fmt: skip
    return tuple(extras)


def predict(request: TrainingRequest, case: FakeCase) -> tuple[AllocatedPhases, AllocatedPhases, StepResult]:
    """The timeline's allocated lines without the CUDA runtime's allocations and with them (what
    ``zerocalc memory`` reports), and the bare step (its events)."""
    bare = simulate(request, case.strategy, None, device=Device.CUDA, reserve=False)
    cuda = simulate(request, case.strategy, runtime_for(request), device=Device.CUDA, reserve=False)
    return _phases(bare), _phases(cuda), bare


def compare(
    request: TrainingRequest,
    case: FakeCase,
    measured: AllocatedPhases,
    seconds: float,
    config: dict[str, Any],
) -> FakeCaseResult:
    """The tracker's figures against the timeline without the CUDA extras, exactly."""
    bare, cuda, step = predict(request, case)
    return FakeCaseResult(
        case=case,
        lines=tuple(allocated_lines(bare, measured, tolerance=0.0)),
        cuda_added=tuple(getattr(cuda, f) - getattr(bare, f) for _, f in ALLOCATED_LINES),
        cuda_extras=cuda_extras(request, case),
        peak_events={p.phase.value: p.event for p in step.phases if p.phase is not StepPhase.START},
        not_claimed=not_claimed(config, request.architecture, case),
        seconds=round(seconds, 2),
    )


def _rounded(n_bytes: int) -> int:
    return ceil_div(n_bytes, CUDA_BLOCK) * CUDA_BLOCK


def predicted_tracked_states(arch: Architecture, case: FakeCase) -> TrackedStates:
    """Rank 0's model states under the case's dp × tp mesh (:func:`zerocalc.validate.tp.local_numel`: the
    tp shard, then its dim-0 chunk over dp), as the tracker sees them: each FSDP2 sharded parameter its own
    storage (``FSDPParam._init_sharded_param``: padded to the chunk, which rank 0 fills), AdamW's
    ``exp_avg`` and ``exp_avg_sq`` one each (``zeros_like``), the gradients of a unit views into its one
    fp32 reduce-scatter output (``_fsdp_collectives.foreach_reduce``); every storage rounded to 512 B."""
    plan = case.tp_plan
    assert plan is not None
    param = DType.FP32.bytes
    per_tensor = [_rounded(local_numel(t, plan, 0, arch) * param) for t in parameter_tensors(arch)]
    per_unit = [sum(local_numel(t, plan, 0, arch) for t in unit) for _, unit in fsdp_units(arch)]
    return TrackedStates(
        params=sum(per_tensor),
        optimizer=ADAM_STATES * sum(per_tensor),
        grads=sum(_rounded(n * REDUCE_DTYPE.bytes) for n in per_unit),
    )


def compare_tp(
    arch: Architecture, case: FakeCase, phases: AllocatedPhases, states: TrackedStates, seconds: float
) -> FakeTpCaseResult:
    """The tracker's model states against the prediction, exactly; its phases recorded."""
    predicted = predicted_tracked_states(arch, case)
    lines = tuple(
        PhaseLine(line=label, predicted=getattr(predicted, f), measured=getattr(states, f), tolerance=0.0)
        for label, f in TRACKED_STATE_LINES
    )
    return FakeTpCaseResult(case=case, lines=lines, phases=phases, seconds=round(seconds, 2))
