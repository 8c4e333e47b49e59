"""Timing real training steps against the predicted step time (``validate cuda --time-steps N``):
the loop (any device: the caller passes its synchronisation) and the comparison (pure)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

WARMUP_STEPS = 3
"""Untimed steps first: the caching allocator's blocks, cuBLAS's and the attention kernels' first calls."""
MAX_TIMED_STEPS = 1000


class StepTiming(BaseModel):
    """The measured steps and the prediction for the same configuration."""

    model_config = {"frozen": True}

    warmup_steps: int
    step_seconds: list[float] = Field(description="each timed step, in order")
    measured_s: float = Field(description="the median of the timed steps")
    predicted_s: float = Field(description="the step time `zerocalc comm` predicts for this configuration")
    compute_table: str = Field(description="what the prediction's compute was priced with")

    @property
    def relative(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s


def time_steps(
    step: Callable[[], None],
    synchronize: Callable[[], None],
    steps: int,
    warmup: int = WARMUP_STEPS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of each of ``steps`` calls of ``step`` after ``warmup`` untimed ones, each timed from a
    synchronised device to a synchronised device (so that queued kernels are counted in their step)."""
    for _ in range(warmup):
        step()
    synchronize()
    seconds = []
    for _ in range(steps):
        start = clock()
        step()
        synchronize()
        seconds.append(clock() - start)
    return seconds


def step_timing(seconds: list[float], warmup: int, predicted_s: float, compute_table: str) -> StepTiming:
    return StepTiming(
        warmup_steps=warmup,
        step_seconds=seconds,
        measured_s=statistics.median(seconds),
        predicted_s=predicted_s,
        compute_table=compute_table,
    )
