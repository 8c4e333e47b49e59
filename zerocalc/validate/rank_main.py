"""One rank of a ``zerocalc validate`` world: what every worker does around its measurement (imports torch).

A worker (:mod:`~zerocalc.validate.worker`, :mod:`~zerocalc.validate.pipeline_worker`,
:mod:`~zerocalc.validate.expert_worker`) declares only what is particular to it: its job record (a
pydantic model with ``backend`` and ``timeout_s``) and how one rank measures one job. Its ``main`` is
``rank_main(JobRecord, measure)``, which

* reads the jobs, one JSON per argument (:func:`zerocalc.harness.procs.spawn_series` passes them), and
  the rank's placement from the environment;
* starts the rank's :class:`~zerocalc.harness.procs.Watchdog` (each job gets its own ``timeout_s``);
* joins the process group once (:func:`init_world`: nccl on the rank's GPU, else gloo on the CPU) and
  runs the jobs one after the other in it: each rank measures, rank 0 gathers every rank's figures
  (``all_gather_object``) and hands them back before the next job starts;
* tears the world down (:func:`tear_down`): what the jobs allocated is collected (``gc.collect()``) before
  ``destroy_process_group``, since torch 2.13 sometimes aborts at exit otherwise;
* turns a failure into the rank's one line and exit code (:func:`zerocalc.harness.procs.fail_rank`): 1
  failed, 2 bad input, 3 timeout.

Under torchrun/srun (no spawned world) the framework run calls :func:`init_world`, :func:`gathered` and
:func:`tear_down` in-process (:func:`zerocalc.validate.worker.run_many`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from pydantic import BaseModel

from zerocalc.base.errors import InputError
from zerocalc.bench.topology import Placement, placement_from_env, rendezvous_env
from zerocalc.harness import procs


class RankJob(Protocol):
    """What the harness reads of a worker's job record."""

    backend: str
    timeout_s: float


J = TypeVar("J", bound=BaseModel)

Measure = Callable[[J, Placement, Any], BaseModel]
"""One rank's measurement of one job on its device: its figures (a pydantic model)."""
BeforeJob = Callable[[J, Placement], None]
"""Called on each rank before it measures a job (the tests' failure hook)."""


def init_world(job: RankJob, placement: Placement) -> Any:
    """Join the launched (or spawned) world: nccl on this rank's GPU, else gloo; returns the device."""
    os.environ.update(rendezvous_env())
    if job.backend == "nccl":
        device = torch.device("cuda", placement.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        job.backend,
        rank=placement.rank,
        world_size=placement.world_size,
        timeout=timedelta(seconds=job.timeout_s),
        **({"device_id": device} if device.type == "cuda" else {}),
    )
    return device


def tear_down() -> None:
    """Leave the world: everything a job allocated is collected first (torch 2.13 can abort at exit when
    a model or optimizer outlives ``destroy_process_group``)."""
    gc.collect()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def gathered(figures: BaseModel, placement: Placement) -> list[dict[str, Any]] | None:
    """Every rank's ``figures`` (as ``model_dump()``), in rank order, on rank 0; None on the others."""
    everyone: list[Any] = [None] * placement.world_size
    dist.all_gather_object(everyone, figures.model_dump())
    return everyone if placement.rank == 0 else None


def run_jobs(
    jobs: list[J],
    placement: Placement,
    watchdog: procs.Watchdog,
    measure: Measure[J],
    before: BeforeJob[J] | None = None,
) -> None:
    """Every job in the one world; rank 0 hands each one's gathered figures back
    (:func:`zerocalc.harness.procs.hand_back`) before the next starts. Any failure ends the world: the
    parent reports it as the job's and runs the rest in a fresh world."""
    device = init_world(jobs[0], placement)  # type: ignore[arg-type]  # every job record has both fields
    try:
        for index, job in enumerate(jobs):
            watchdog.restart()
            if before is not None:
                before(job, placement)
            everyone = gathered(measure(job, placement, device), placement)
            if everyone is not None:
                procs.hand_back(json.dumps(everyone), index)
            gc.collect()
            dist.barrier()
    finally:
        tear_down()


def rank_main(
    job_type: type[J],
    measure: Measure[J],
    argv: list[str] | None = None,
    before: BeforeJob[J] | None = None,
) -> int:
    """A spawned rank: every job given (one JSON ``job_type`` per argument) in one world; the exit code."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # e.g. FSDP1 NO_SHARD's deprecation notice
    argv = sys.argv[1:] if argv is None else argv
    jobs = [job_type.model_validate_json(text) for text in argv]
    placement = placement_from_env()
    timeout_s = jobs[0].timeout_s  # type: ignore[attr-defined]
    watchdog = procs.Watchdog(timeout_s, placement.rank)

    def body() -> None:
        try:
            run_jobs(jobs, placement, watchdog, measure, before)
        except InputError:
            raise
        except Exception as exc:
            procs.fail_rank(placement.rank, exc, timeout_s)
        watchdog.disarm()

    return procs.run_rank(body)
