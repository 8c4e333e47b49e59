"""The series runner validate's modes share: each job's outcome made its result, in order, and reported."""

from __future__ import annotations

from dataclasses import dataclass

from zerocalc.harness.procs import RanksFailed
from zerocalc.harness.series import Results


@dataclass
class _Job:
    name: str

    def model_dump_json(self) -> str:
        return self.name


def test_a_failed_world_is_the_jobs_failed_result_and_a_measurement_is_compared() -> None:
    jobs = [_Job("a"), _Job("b"), _Job("c")]
    reported: list[tuple[str, int, int]] = []
    results: Results[_Job, int, str] = Results(
        jobs,
        failed=lambda job, error, seconds: f"{job.name} failed: {error} in {seconds}",
        compared=lambda index, measured, seconds: f"{jobs[index].name} measured {measured} in {seconds}",
        on_result=lambda result, number, total: reported.append((result, number, total)),
    )
    results.done(0, 7, 1.234)
    results.done(1, RanksFailed("rank 1 exited with code 1"), 0.456)
    results.done(2, 9, 2.0)
    assert results.results == [
        "a measured 7 in 1.23",
        "b failed: rank 1 exited with code 1 in 0.46",
        "c measured 9 in 2.0",
    ]
    assert reported == [(r, i + 1, 3) for i, r in enumerate(results.results)]
