"""``zerocalc validate cuda``: each phase's measured peak against the step timeline (pure, no torch).

A real step (:mod:`zerocalc.validate.cuda_step`, the recipe of ``shared/measurements/h100-fsdp2-hf``:
FSDP2 at world 1, bf16 ``MixedPrecisionPolicy`` with fp32 reduce, ``AdamW(foreach=True)``, the model's own
loss, three steps, ``torch.cuda.reset_peak_memory_stats`` between phases) gives a
:class:`PhaseMeasurement`; :func:`compare_phases` sets it against the :class:`~zerocalc.peak.report.
StrategyPeak` that ``zerocalc memory --framework fsdp2 --model-impl hf`` computes for the same case:
allocated figures within :data:`ALLOCATED_TOLERANCE`, the device footprint within
:data:`DEVICE_TOLERANCE`, and the phase of the peak the same. ``zerocalc validate fake``
(:mod:`zerocalc.validate.fake`) compares the same allocated lines (:func:`allocated_lines`), exactly.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.peak.kinds import StepPhase
from zerocalc.peak.report import StrategyPeak

PRESET_MATCH = 0.02
"""A GPU preset describes the device in hand when its ``usable_memory`` is within 2% of the device's."""

ALLOCATED_TOLERANCE = 0.05
"""``torch.cuda.max_memory_allocated`` and the other allocated figures: within 5%."""
DEVICE_TOLERANCE = 0.10
"""``max_memory_reserved`` and the device footprint (``total − free`` of ``cudaMemGetInfo``): within 10%."""


class AllocatedPhases(BaseModel):
    """What one step allocates, phase by phase, in bytes: at its start, each phase's peak (reset to reset)
    and what is left after forward and after backward."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    start_allocated: int
    forward_peak: int
    after_forward: int
    backward_peak: int
    after_backward: int
    optimizer_peak: int


ALLOCATED_LINES = (
    ("start (allocated)", "start_allocated"),
    ("forward peak", "forward_peak"),
    ("after forward", "after_forward"),
    ("backward peak", "backward_peak"),
    ("after backward", "after_backward"),
    ("optimizer peak", "optimizer_peak"),
)
"""Each line's label and its :class:`AllocatedPhases` field, in step order."""


class PhaseMeasurement(AllocatedPhases):
    """One measured step, in bytes (the fields of ``tests/data/h100-fsdp2-hf/steps.jsonl``)."""

    max_allocated: int
    max_reserved: int
    device_used: int = Field(description="total − free (cudaMemGetInfo) after the step")


class PhaseLine(BaseModel):
    model_config = ConfigDict(frozen=True)

    line: str
    predicted: int
    measured: int
    tolerance: float

    @property
    def relative(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted - self.measured) / self.measured if self.measured else 0.0

    @property
    def ok(self) -> bool:
        return abs(self.relative) <= self.tolerance


class PhaseReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    lines: tuple[PhaseLine, ...]
    predicted_phase: StepPhase
    measured_phase: StepPhase

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines) and self.predicted_phase == self.measured_phase


def measured_peak_phase(m: PhaseMeasurement) -> StepPhase:
    """The phase whose reset-to-reset peak is the largest."""
    peaks = {
        StepPhase.FORWARD: m.forward_peak,
        StepPhase.BACKWARD: m.backward_peak,
        StepPhase.OPTIMIZER: m.optimizer_peak,
    }
    return max(peaks, key=peaks.__getitem__)


def predicted_phases(row: StrategyPeak) -> AllocatedPhases:
    """The allocated lines of a strategy's simulated step."""
    return AllocatedPhases(
        start_allocated=row.start_bytes,
        forward_peak=row.phase(StepPhase.FORWARD).allocated_bytes,
        after_forward=row.after_forward_bytes,
        backward_peak=row.phase(StepPhase.BACKWARD).allocated_bytes,
        after_backward=row.after_backward_bytes,
        optimizer_peak=row.phase(StepPhase.OPTIMIZER).allocated_bytes,
    )


def allocated_lines(
    predicted: AllocatedPhases, measured: AllocatedPhases, tolerance: float
) -> list[PhaseLine]:
    """Predicted vs measured, line by line in step order (:data:`ALLOCATED_LINES`)."""
    return [
        PhaseLine(
            line=label,
            predicted=getattr(predicted, field),
            measured=getattr(measured, field),
            tolerance=tolerance,
        )
        for label, field in ALLOCATED_LINES
    ]


def compare_phases(row: StrategyPeak, m: PhaseMeasurement) -> PhaseReport:
    """Predicted vs measured, phase by phase, then the maxima and the device footprint."""
    a, d = ALLOCATED_TOLERANCE, DEVICE_TOLERANCE
    line = PhaseLine
    lines = [
        *allocated_lines(predicted_phases(row), m, a),
        line(line="max allocated", predicted=row.allocated_peak_bytes, measured=m.max_allocated, tolerance=a),
        line(line="max reserved", predicted=row.reserved_bytes, measured=m.max_reserved, tolerance=d),
        line(line="device used", predicted=row.peak_bytes, measured=m.device_used, tolerance=d),
    ]  # fmt: skip
    measured = measured_peak_phase(m)
    return PhaseReport(lines=tuple(lines), predicted_phase=row.peak_phase, measured_phase=measured)


def matching_gpu_preset(total_bytes: int, usable: dict[str, int]) -> str | None:
    """The GPU preset (name → ``usable_memory`` in bytes) whose usable memory is nearest the device's
    ``torch.cuda.mem_get_info()`` total, if within :data:`PRESET_MATCH`; its context and NCCL sizes are
    the footprint's. None: no preset describes this device."""
    if not usable or total_bytes <= 0:
        return None
    name = min(usable, key=lambda n: abs(usable[n] - total_bytes))
    return name if abs(usable[name] - total_bytes) <= PRESET_MATCH * total_bytes else None
