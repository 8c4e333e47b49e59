"""A series of jobs, each run in a world of ranks and compared with its prediction (standard library only).

validate's modes share one shape: a list of jobs (pydantic models, each sent to the ranks as its JSON), run
one after the other in as few worlds as failures allow (:func:`zerocalc.harness.procs.spawn_series`), and
each job's outcome turned into a result: a failed world into the job's failed result (its one line), a
measurement into the comparison with the prediction. :class:`Results` does the second half, as the
outcomes come in (reporting each one); :func:`run_series` both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from zerocalc.harness import procs


class _Job(Protocol):
    def model_dump_json(self) -> str: ...


J = TypeVar("J", bound=_Job)
M = TypeVar("M")
R = TypeVar("R")

Failed = Callable[[J, str, float], R]
"""The job's result when its world failed: ``failed(job, the failure's one line, seconds)``."""
Compared = Callable[[int, M, float], R]
"""The job's result from what its ranks measured: ``compared(index, measured, seconds)``."""
OnResult = Callable[[R, int, int], None]
"""Called with each result as it comes in, its number (from 1) and the number of jobs."""


class Results(Generic[J, M, R]):
    """The results of a series of jobs, in order, each made from its outcome by :meth:`done`."""

    def __init__(
        self,
        jobs: Sequence[J],
        failed: Failed[J, R],
        compared: Compared[M, R],
        on_result: OnResult[R] | None = None,
    ):
        self.jobs, self.failed, self.compared, self.on_result = jobs, failed, compared, on_result
        self.results: list[R] = []

    def done(self, index: int, outcome: M | procs.RanksFailed, seconds: float) -> None:
        """Job ``index``'s result (seconds rounded to hundredths), appended and reported."""
        seconds = round(seconds, 2)
        if isinstance(outcome, procs.RanksFailed):
            result = self.failed(self.jobs[index], str(outcome), seconds)
        else:
            result = self.compared(index, outcome, seconds)
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result, len(self.results), len(self.jobs))


def run_series(
    module: str,
    jobs: Sequence[J],
    nproc: int,
    timeout_s: float,
    collect: Callable[[str], M],
    failed: Failed[J, R],
    compared: Compared[M, R],
    on_result: OnResult[R] | None = None,
) -> list[R]:
    """Every job in turn in worlds of ``nproc`` spawned ranks running ``python -m MODULE`` (a fresh world
    after a failure, :func:`~zerocalc.harness.procs.spawn_series`; ``collect`` reads rank 0's result), each
    outcome made a result (:class:`Results`); the results in the jobs' order."""
    results: Results[J, M, R] = Results(jobs, failed, compared, on_result)
    payloads = [job.model_dump_json() for job in jobs]
    procs.spawn_series(module, payloads, nproc, timeout_s, collect, results.done)
    return results.results
