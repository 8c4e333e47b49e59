"""The step times of ``plan``'s candidates (pure): comm's schedule costed once per key and derived at
every accumulation A (:class:`CommLine`), compute from the hardware (:mod:`zerocalc.compute`), assembled
as :mod:`zerocalc.comm.step` assembles ``comm``'s step (its overlap rules, offload and bubble, in one
place).
"""

from __future__ import annotations

from zerocalc.comm.collectives import CommLine, comm_lines, comm_of_lines
from zerocalc.comm.estimate import StrategyComm
from zerocalc.comm.step import (
    CPU_ADAM_BYTES_PER_PARAM,
    HOST_MEMORY_BPS,
    MESH_DIMENSIONS,
    NVME_BPS,
    PCIE_BPS,
    CommTime,
    PhaseComm,
    StepTime,
    assemble,
    comm_time,
    offload_seconds,
    overlaps_backward,
)
from zerocalc.compute.time import ComputeTime
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.strategies import StrategyName

__all__ = [
    "CPU_ADAM_BYTES_PER_PARAM",
    "HOST_MEMORY_BPS",
    "NVME_BPS",
    "PCIE_BPS",
    "CommLine",
    "CommTime",
    "PhaseComm",
    "StepTime",
    "comm_lines",
    "comm_of_lines",
    "comm_time",
    "offload_seconds",
    "step_time",
    "step_times",
]

NO_MESH = dict.fromkeys(MESH_DIMENSIONS, 0.0)
"""The plan's candidates are data-parallel: no tensor- or context-parallel collectives."""


def step_time(
    compute: ComputeTime,
    tokens_per_gpu: int,
    grad_accum: int,
    comm: StrategyComm,
    framework: Framework,
    prefetch: int | None,
    offload_s: float,
    model_flops_per_token: float,
    peak_flops: float | None,
) -> StepTime:
    """Compute + exposed communication + offload, for one GPU's share of the step."""
    collectives = [(c.phase, c.times_per_step, c.calls_per_step, c.time_s) for c in comm.collectives]
    at = (tokens_per_gpu, grad_accum, comm_time(collectives, grad_accum, comm.time_s), offload_s, compute)
    return step_times(comm.strategy, framework, prefetch, model_flops_per_token, peak_flops, [at])[0]


def step_times(
    strategy: StrategyName,
    framework: Framework,
    prefetch: int | None,
    model_flops_per_token: float,
    peak_flops: float | None,
    steps: list[tuple[int, int, CommTime, float, ComputeTime]],
) -> list[StepTime]:
    """:func:`step_time` of one configuration at each of ``steps``: (tokens per GPU, A, the communication's
    sums at that A (:func:`comm_time`), offload seconds, the compute at that b and A)."""
    hides_forward, hides_backward = prefetch != 0, overlaps_backward(framework, strategy)
    return [
        assemble(
            compute,
            0.0,
            comm,
            NO_MESH,
            0.0,
            tokens,
            accum,
            hides_forward,
            hides_backward,
            offload_s,
            0.0,
            model_flops_per_token,
            peak_flops,
        )
        for tokens, accum, comm, offload_s, compute in steps
    ]
