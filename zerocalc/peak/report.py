"""The typed result of ``zerocalc memory``: model states per strategy and, with an architecture, the peak
of one training step (:mod:`zerocalc.peak.evaluate`).

Per strategy: the framework's accounting of model states (:class:`StateLine`), the step's timeline and the
phase and event where the allocated total peaks, what is alive there by kind of tensor
(:class:`PeakTerm`), and the device footprint: ``allocated_peak_bytes`` (what
``torch.cuda.max_memory_allocated`` reports) + the caching allocator's reserve (``reserved_bytes``, what
``max_memory_reserved`` reports) + what the process holds outside the allocator (CUDA context, NCCL
communicators) = ``peak_bytes`` (what ``cudaMemGetInfo`` shows used).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.units import gib
from zerocalc.model.activations import Recompute
from zerocalc.model.code import AttentionKernel, ModelImplName
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.framework_records.record import ModelInit, Wrap
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.optimizers import OptimizerImpl
from zerocalc.parallel.strategies import StrategyName, row_named
from zerocalc.peak.kinds import StepPhase, TensorKind
from zerocalc.request.runtime_names import RuntimeNames
from zerocalc.states.memory import MemoryEstimate


class Verdict(StrEnum):
    FITS = "fits"
    TIGHT = "tight"
    """Below the GPU's memory, but within the model's margin of it: not promised to fit."""
    DOES_NOT_FIT = "does not fit"


class StateLine(BaseModel):
    """One line of a framework's accounting of model states (or of a buffer it keeps resident)."""

    kind: TensorKind
    name: str
    bytes: int
    source: str
    in_framework_estimate: bool = True
    """False for lines the framework's own estimator leaves out (DeepSpeed's ZeRO-2 buckets)."""


class PeakTerm(BaseModel):
    """The bytes of one kind of tensor alive at the peak."""

    kind: TensorKind
    bytes: int
    source: str


class PhasePeak(BaseModel):
    phase: StepPhase
    allocated_bytes: int = Field(description="max_memory_allocated over the phase")
    event: str = Field(description="where in the phase it is reached")


class TimelineEvent(BaseModel):
    phase: StepPhase
    event: str
    allocated_bytes: int
    reserved_bytes: int | None = Field(
        default=None, description="what the caching allocator has reserved there (memory_reserved)"
    )


class PeakOptions(BaseModel):
    """The options the peak was computed with (echoed in the JSON)."""

    framework: Framework
    model_impl: ModelImplName
    optimizer_impl: OptimizerImpl
    optimizer_step: str = Field(
        description="the optimizer step as the framework runs it: its implementation on the GPU, or the "
        "host's optimizer where the optimizer is offloaded"
    )
    seq_len: int
    micro_batch: int
    grad_accum: int
    grad_sync: GradSync | None = Field(description="as asked; None: each framework's default")
    recompute: Recompute
    flash_attention: bool = Field(description="as used: asked, else the model code's (attention_source)")
    attention_kernel: AttentionKernel = Field(description="the attention kernel assumed: flash or eager")
    attention_source: str = Field(
        description="--flash-attention/--no-flash-attention, or the model code that sets the default"
    )
    init: ModelInit = Field(description="how the model is created (--init; else the framework's default)")
    init_given: bool = Field(description="init was asked for (else the framework's documented path)")
    init_source: str = Field(description="where the framework's default comes from")
    prefetch: int
    wrap: Wrap
    ddp_bucket_bytes: int
    reduce_bucket_elements: int
    allgather_bucket_elements: int
    reduce_dtype: DType | None = Field(description="None: the gradient dtype")
    expandable_segments: bool
    runtime_gpu: str = Field(description="the GPU preset whose runtime figures are used")
    context_bytes: int = Field(description="outside the caching allocator at world size 1 (--reserve)")
    context_given: bool = Field(description="context_bytes is --reserve (else the runtime GPU preset's)")
    context_measured: bool = Field(description="the runtime GPU preset's context was measured on that GPU")
    runtime_names: RuntimeNames = Field(description="what the runtime GPU's vendor software is called")
    nccl_communicator_bytes: int = Field(description="added per NCCL communicator of more than one rank")
    cublas_workspace_bytes: int
    gpu_memory_bytes: int | None = Field(description="what PyTorch sees of one GPU (None: no fits)")


class StagePeak(BaseModel):
    """One pipeline rank's step: what it holds, how many micro-batches it holds in flight, its peak."""

    stage: int = Field(description="the pipeline rank, 0 … p − 1")
    layers: list[list[int]] = Field(description="per model chunk, its first and last layer (whole model's)")
    holds_embedding: bool
    holds_head: bool = Field(description="the final norm, the LM head and the loss")
    params: int = Field(description="parameters the rank holds (of one tensor-parallel rank's share)")
    in_flight: float = Field(
        description="micro-batches' worth of the stage's activations held at its peak: forward passes in "
        "flight over v (parallel.pipeline.in_flight)"
    )
    micro_batches_simulated: int = Field(description="the last micro-batches of the step its timeline runs")
    peak_phase: StepPhase
    peak_event: str
    allocated_peak_bytes: int
    reserved_bytes: int
    peak_bytes: int = Field(description="reserved + context + NCCL: the device footprint")
    terms: list[PeakTerm] = Field(description="alive at the stage's peak, by kind")
    verdict: Verdict | None = None
    headroom_bytes: int | None = None

    def term(self, kind: TensorKind) -> int:
        return sum(t.bytes for t in self.terms if t.kind is kind)


class StrategyPeak(BaseModel):
    strategy: StrategyName
    title: str
    states: list[StateLine] = Field(description="the framework's accounting of model states")
    peak_phase: StepPhase
    peak_event: str
    allocated_peak_bytes: int = Field(description="torch.cuda.max_memory_allocated over the step")
    terms: list[PeakTerm] = Field(description="alive at the peak, by kind; they sum to allocated_peak_bytes")
    phases: list[PhasePeak]
    start_bytes: int = Field(description="allocated at the step's start (a step after the first)")
    after_forward_bytes: int
    after_backward_bytes: int
    reserved_bytes: int = Field(description="torch.cuda.max_memory_reserved over model creation and 3 steps")
    allocator_reserve_bytes: int = Field(description="reserved_bytes − allocated_peak_bytes")
    allocator_retried: bool = Field(
        default=False,
        description="the replay ran out of the device's free memory and the caching allocator freed its "
        "unused cached segments and retried (release_cached_blocks): reserved_bytes is after that",
    )
    context_bytes: int = Field(description="CUDA context, kernels and NCCL at world size 1")
    nccl_communicators: int = Field(description="communicators of more than one rank the strategy creates")
    nccl_bytes: int = Field(description="what those communicators add")
    peak_bytes: int = Field(
        description="reserved + context + NCCL: the device footprint cudaMemGetInfo shows"
    )
    framework_estimate_bytes: int | None = Field(
        default=None, description="deepspeed: what its own estimator prints (its lines only)"
    )
    host_bytes_per_node: int | None = Field(default=None, description="deepspeed: its estimator's CPU memory")
    fits: bool | None = Field(default=None, description="verdict is fits (None: no GPU memory given)")
    verdict: Verdict | None = None
    headroom_bytes: int | None = Field(default=None, description="gpu_memory_bytes − peak_bytes")
    timeline: list[TimelineEvent] = Field(
        description="the step's events (the middle layers' only where a phase peaks)"
    )
    stage: int | None = Field(
        default=None, description="pipeline parallelism: the stage this row is, the one with the largest peak"
    )
    stages: list[StagePeak] = Field(
        default_factory=list, description="pipeline parallelism: every stage's step, rank 0 first"
    )

    def term(self, kind: TensorKind) -> int:
        return sum(t.bytes for t in self.terms if t.kind is kind)

    def phase(self, phase: StepPhase) -> PhasePeak:
        return next(p for p in self.phases if p.phase is phase)


class PeakEstimate(BaseModel):
    options: PeakOptions
    model_impl_source: str
    notes: list[str] = Field(default=[])
    strategies: list[StrategyPeak]
    init_host_bytes_per_node: int | None = Field(
        default=None,
        description="--init cpu: the copies of the whole model the node's host memory holds at creation",
    )
    init_host_model: str | None = Field(
        default=None, description="--init cpu: the model those copies hold (its dtypes)"
    )
    offloaded_activations_host_bytes: int | None = Field(
        default=None,
        description="--offload-activations: pinned host bytes per GPU of one micro-batch's offloaded saved "
        "tensors (torchtune's OffloadActivations: a copy per pack of at least 1024 B)",
    )

    def row(self, name: StrategyName | str) -> StrategyPeak:
        """The row of a strategy, by any of its names (``fsdp``, ``full_shard``, ``zero3``)."""
        return row_named(self.strategies, name)


class FrameworkStates(BaseModel):
    """A framework's own accounting of one strategy's model states, when only Ψ is known (DeepSpeed's
    estimators, Megatron's distributed optimizer)."""

    strategy: StrategyName
    title: str
    lines: list[StateLine]
    gpu_bytes: int = Field(description="the lines' sum, per GPU")
    framework_estimate_bytes: int | None = Field(
        default=None, description="deepspeed: what its own estimator prints (its lines only)"
    )
    host_bytes_per_node: int | None = Field(default=None, description="deepspeed: its estimator's CPU memory")
    source: str


class MemoryReport(MemoryEstimate):
    """Model states per strategy and, when an architecture is known, the peak of one training step; with
    only Ψ and a framework other than the paper, that framework's own accounting."""

    framework_states: list[FrameworkStates] | None = None
    peak: PeakEstimate | None = None

    def summary(self) -> list[tuple[str, object]]:
        """What a one-line repr shows: the model, N and each strategy's peak per GPU (with its verdict
        where a GPU was given), else its model states."""
        if self.peak is None:
            return super().summary()
        head = [("model", self.model.name if self.model else None), ("gpus", self.request.cluster.world_size)]
        return head + [
            (row.strategy.value, gib(row.peak_bytes) + (f" ({row.verdict.value})" if row.verdict else ""))
            for row in self.peak.strategies
        ]

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON of ``zerocalc memory --json`` (no ``peak`` key without an architecture, no
        ``framework_states`` key without a framework accounting of Ψ alone, no ``stage`` and ``stages``
        without pipeline parallelism, no ``offloaded_activations_host_bytes`` without offloading)."""
        exclude: dict[str, Any] = {k: True for k in ("peak", "framework_states") if getattr(self, k) is None}
        if self.peak is not None and self.request.mesh.pp == 1:  # no pipeline: no stages
            exclude["peak"] = {"strategies": {"__all__": {"stage", "stages"}}}
        if self.peak is not None and self.peak.offloaded_activations_host_bytes is None:
            # only where --offload-activations is set: a run without it prints what it did before
            exclude.setdefault("peak", {})["offloaded_activations_host_bytes"] = True
        return self.model_dump(mode="json", exclude=exclude or None)
