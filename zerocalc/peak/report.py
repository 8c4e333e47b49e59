"""The typed result of ``zerocalc memory``: model states per strategy and, with an architecture, the peak."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from zerocalc.activations import ActivationEstimate, Recompute
from zerocalc.dtypes import DType
from zerocalc.frameworks import Framework
from zerocalc.memory import MemoryEstimate
from zerocalc.peak.profiles import Wrap
from zerocalc.strategies import StrategyName


class LineKind(StrEnum):
    STATES = "model_states"
    ACTIVATIONS = "activations"
    BUFFERS = "buffers"
    OVERHEAD = "overhead"
    FRAGMENTATION = "fragmentation"


class PeakLine(BaseModel):
    kind: LineKind
    name: str
    bytes: int
    source: str
    in_framework_estimate: bool = True
    """False for lines the framework's own estimator leaves out (deepspeed profile)."""


class PeakOptions(BaseModel):
    """The options the peak was computed with (echoed in the JSON)."""

    framework: Framework
    seq_len: int
    micro_batch: int
    recompute: Recompute
    flash_attention: bool | None = Field(description="as asked; None: on for the Llama family")
    prefetch: int
    wrap: Wrap
    ddp_bucket_bytes: int
    reduce_bucket_elements: int
    allgather_bucket_elements: int
    overhead_bytes: int
    fragmentation: float
    reduce_dtype: DType | None = Field(description="None: the gradient dtype")
    gpu_memory_bytes: int | None = Field(description="the whole GPU: the overhead is a line of its own")


class StrategyPeak(BaseModel):
    strategy: StrategyName
    title: str
    lines: list[PeakLine]
    peak_bytes: int
    framework_estimate_bytes: int = Field(description="the lines the framework's own accounting covers")
    host_bytes_per_node: int | None = Field(default=None, description="deepspeed: its estimator's CPU memory")
    fits: bool | None = None
    headroom_bytes: int | None = None

    def total(self, kind: LineKind) -> int:
        return sum(line.bytes for line in self.lines if line.kind is kind)


class PeakEstimate(BaseModel):
    options: PeakOptions
    flash_attention: bool
    activations: ActivationEstimate
    activation_note: str = "data parallelism never shards activations: each GPU holds its own micro-batch's"
    notes: list[str] = Field(default_factory=list)
    strategies: list[StrategyPeak]

    def row(self, name: StrategyName | str) -> StrategyPeak:
        key = StrategyName(name)
        return next(r for r in self.strategies if r.strategy is key)


class MemoryReport(MemoryEstimate):
    """Model states per strategy and, when an architecture is known, the peak of one training step."""

    peak: PeakEstimate | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON of ``zerocalc memory --json`` (no ``peak`` key without an architecture)."""
        return self.model_dump(mode="json", exclude={"peak"} if self.peak is None else None)
