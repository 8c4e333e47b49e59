"""Least-squares fit of nccl-tests' time model t = α + factor(n)·S / β (pure, no torch).

With x = factor(n)·S (bytes each rank puts on the wire), t = α + x/β is a straight line: ordinary least
squares of t on x gives the slope 1/β and the intercept α. α is clamped at 0 (a negative latency is noise
at small sizes). When the slope is not positive (a noisy sweep whose times do not grow with size, or a
single point), β falls back to the best measured x/t, i.e. the peak bus bandwidth, and α to the mean of
t − x/β (clamped at 0), so a fit always has a usable β > 0; :attr:`AlphaBeta.beta_from_peak` says so, and
``bench`` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AlphaBeta:
    latency_s: float
    """α, seconds."""
    bus_bandwidth_Bps: float
    """β, bytes per second."""
    beta_from_peak: bool = False
    """The slope was not positive: β is the peak measured bus bandwidth, not a fitted one."""


def fit_alpha_beta(wire_bytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Fit t = α + x/β over points (x = factor·S, t); needs at least one point with t > 0."""
    points = [(float(x), float(t)) for x, t in zip(wire_bytes, seconds, strict=True) if t > 0]
    if not points:
        raise ValueError("fit_alpha_beta needs at least one point with a positive time")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxt = sum((x - mean_x) * (t - mean_t) for x, t in points)
    slope = sxt / sxx if sxx > 0 else 0.0
    if slope > 0:
        return AlphaBeta(max(mean_t - slope * mean_x, 0.0), 1.0 / slope)
    beta = max(x / t for x, t in points)
    if beta <= 0:
        raise ValueError("fit_alpha_beta needs at least one point with bytes on the wire (x > 0)")
    return AlphaBeta(max(sum(t - x / beta for x, t in points) / n, 0.0), beta, beta_from_peak=True)
