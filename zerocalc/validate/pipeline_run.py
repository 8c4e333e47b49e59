"""Running ``zerocalc validate pipeline``: the configurations in a world of spawned ranks
(:mod:`zerocalc.validate.pipeline_worker`), or, with ``--fake``, each stage under fake tensors in this
process (:mod:`zerocalc.validate.pipeline_fake`, which imports torch only when called); each compared with
its prediction (:mod:`zerocalc.validate.pipeline`). No torch at import."""

from __future__ import annotations

import json
from collections.abc import Callable

from zerocalc.harness.series import run_series
from zerocalc.model.architecture import Architecture
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate.pipeline import (
    FakePipelineCase,
    FakePipelineReport,
    PipelineConfigResult,
    PipelineJob,
    PipelineReport,
    StageMeasured,
    check_pipeline,
    compare_pipeline,
)


def run_pipeline(
    arch: Architecture,
    pp: int,
    strategies: list[str],
    precisions: list[PrecisionName],
    optimizer: OptimizerName,
    microbatches: int,
    nproc: int,
    timeout_s: float,
    on_result: Callable[[PipelineConfigResult, int, int], None] | None = None,
    first: int | None = None,
    last: int | None = None,
) -> PipelineReport:
    """Every strategy × precision in one world of ``nproc`` spawned ranks (a fresh one after a failure),
    each compared with its prediction; ``first`` and ``last``: the end stages' blocks (None: L/p)."""
    from zerocalc.validate.run import choose_backend, visible_gpus

    check_pipeline(arch, pp, nproc, microbatches, first, last)
    backend = choose_backend(arch, nproc, visible_gpus())
    jobs = [
        PipelineJob(
            arch=arch,
            pp=pp,
            strategy=strategy,
            precision=precision,
            optimizer=optimizer,
            backend=backend,
            timeout_s=timeout_s,
            microbatches=microbatches,
            first_stage_layers=first,
            last_stage_layers=last,
        )
        for strategy in strategies
        for precision in precisions
    ]

    def failed(job: PipelineJob, error: str, seconds: float) -> PipelineConfigResult:
        return PipelineConfigResult(
            title=job.title,
            strategy=job.strategy,
            precision=job.precision,
            microbatches=job.microbatches,
            status="failed",
            error=error,
            seconds=seconds,
        )

    def compared(index: int, measured: list[StageMeasured], seconds: float) -> PipelineConfigResult:
        return compare_pipeline(jobs[index], nproc, measured, seconds)

    def collect(text: str) -> list[StageMeasured]:
        return [StageMeasured.model_validate(m) for m in json.loads(text)]

    module = "zerocalc.validate.pipeline_worker"
    results = run_series(module, jobs, nproc, timeout_s, collect, failed, compared, on_result)
    return PipelineReport(
        model=arch.name,
        architecture=arch,
        world_size=nproc,
        pp=pp,
        dp=nproc // pp,
        stage_blocks=list(jobs[0].stage_blocks),
        micro_batch=jobs[0].batch,
        seq_len=jobs[0].seq,
        backend=backend,
        configs=results,
        all_match=all(r.status == "match" for r in results),
    )


def run_fake_pipeline(
    arch: Architecture, cases: list[FakePipelineCase], optimizer: OptimizerName
) -> FakePipelineReport:
    """Every case run under fake tensors (:mod:`zerocalc.validate.pipeline_fake`, which imports torch)."""
    from zerocalc.validate import pipeline_fake

    return pipeline_fake.run_cases(arch, cases, optimizer)
