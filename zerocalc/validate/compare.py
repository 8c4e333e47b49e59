"""Prediction vs measurement, line by line and rank by rank (pure, no torch)."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from zerocalc.architecture import Architecture
from zerocalc.dtypes import DType
from zerocalc.framework_states import LINES, STATE_LINES, RankStates, predict_all_ranks, reducer_buckets
from zerocalc.optimizers import OptimizerName
from zerocalc.precision import PrecisionName
from zerocalc.validate.config import PERTURB_ENV, STRATEGIES, Measured

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


class ConfigResult(BaseModel):
    strategy: str
    precision: PrecisionName
    status: str = Field(description="match, mismatch or failed")
    error: str | None = None
    seconds: float | None = None
    ranks: list[RankResult] = []


class ValidationReport(BaseModel):
    model: str
    architecture: Architecture
    parameters: int
    world_size: int
    optimizer: OptimizerName
    backend: str
    peak: str = Field(description="how the peak was handled")
    configs: list[ConfigResult]
    all_match: bool


def predictions(
    arch: Architecture, strategy: str, world_size: int, precision: PrecisionName, optimizer: OptimizerName
) -> list[RankStates]:
    _, _, setup = STRATEGIES[strategy]
    return predict_all_ranks(arch, setup, world_size, precision, optimizer)


def _perturbed(line: str, value: int) -> int:
    """Test hook (``ZEROCALC_VALIDATE_PERTURB=LINE``): one fp32 element more on that line."""
    return value + DType.FP32.bytes if os.environ.get(PERTURB_ENV) == line else value


def compare(
    strategy: str,
    precision: PrecisionName,
    preds: list[RankStates],
    measured: list[Measured],
    seconds: float | None,
) -> ConfigResult:
    ranks: list[RankResult] = []
    all_ok = True
    for pred, meas in zip(preds, sorted(measured, key=lambda m: m.rank), strict=True):
        lines: list[LineResult] = []
        for name in LINES:
            predicted = _perturbed(name, pred.line(name).bytes)
            value = getattr(meas, name)
            ok = None if value is None else value == predicted
            if name in STATE_LINES and ok is False:
                all_ok = False
            lines.append(
                LineResult(
                    line=name,
                    predicted=predicted,
                    measured=value,
                    difference=None if value is None else value - predicted,
                    ok=ok,
                    model_state=name in STATE_LINES,
                    explanation=pred.line(name).explanation,
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
    return ConfigResult(
        strategy=strategy,
        precision=precision,
        status="match" if all_ok else "mismatch",
        seconds=seconds,
        ranks=ranks,
    )
