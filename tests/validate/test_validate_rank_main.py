"""The rank harness every validate worker runs in (zerocalc/validate/rank_main.py), with a tiny worker that
declares only its job record and its measurement: the jobs run one after the other in one gloo world, rank
0 hands back every rank's figures per job, a failing job is one line naming its rank and exit 1 (the jobs
after it run in a fresh world), a refused input is exit 2, and the hook runs before each job."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from zerocalc.harness import procs

pytestmark = pytest.mark.slow

WORKER = """
import os
from zerocalc.harness import procs

if __name__ == "__main__":
    procs.exit_quietly_on_ctrl_c()

import torch
import torch.distributed as dist
from pydantic import BaseModel

from zerocalc.base.errors import InputError
from zerocalc.validate.rank_main import rank_main


class ToyJob(BaseModel):
    backend: str = "gloo"
    timeout_s: float = 60.0
    value: int
    fails: str = ""  # "error": rank 1 raises; "input": rank 1 refuses the input


class ToyFigures(BaseModel):
    rank: int
    total: int  # the all-reduce of value × (rank + 1) over the world
    world: int
    pid: int
    before: int


BEFORE = []


def measure(job, placement, device):
    if job.fails and placement.rank == 1:
        if job.fails == "input":
            raise InputError(f"--value {job.value} is not accepted; accepted: a toy")
        raise RuntimeError(f"job {job.value} broke")
    t = torch.tensor([job.value * (placement.rank + 1)], device=device)
    dist.all_reduce(t)
    return ToyFigures(
        rank=placement.rank, total=int(t.item()), world=dist.get_world_size(), pid=os.getpid(),
        before=len(BEFORE),
    )


def count(job, placement):
    BEFORE.append(job.value)


if __name__ == "__main__":
    procs.exit_now(rank_main(ToyJob, measure, before=count))
"""


@pytest.fixture()
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "zc_toy_worker.py").write_text(textwrap.dedent(WORKER), encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return "zc_toy_worker"


def _run(module: str, jobs: list[dict[str, Any]]) -> list[Any]:
    outcomes: list[tuple[int, Any]] = []
    payloads = [json.dumps(job) for job in jobs]
    procs.spawn_series(
        module, payloads, 2, 60, json.loads, lambda i, outcome, _: outcomes.append((i, outcome))
    )
    assert [i for i, _ in outcomes] == list(range(len(jobs)))
    return [outcome for _, outcome in outcomes]


def test_every_job_runs_in_one_world_and_rank_0_hands_back_every_rank_s_figures(worker: str) -> None:
    first, second = _run(worker, [{"value": 3}, {"value": 5}])
    # all_reduce of v·1 + v·2 over the two ranks: 3v
    assert [(f["rank"], f["total"], f["world"]) for f in first] == [(0, 9, 2), (1, 9, 2)]
    assert [f["total"] for f in second] == [15, 15]
    assert {f["pid"] for f in first} == {f["pid"] for f in second}  # the same processes: one world
    assert [f["before"] for f in first + second] == [1, 1, 2, 2]  # the hook ran before each job


def test_a_failing_job_is_one_line_naming_its_rank_and_the_rest_run_in_a_fresh_world(worker: str) -> None:
    ok, failed, after = _run(worker, [{"value": 1}, {"value": 2, "fails": "error"}, {"value": 4}])
    assert isinstance(failed, procs.RanksFailed) and failed.exit_code == procs.EXIT_FAILED
    assert str(failed) == "rank 1: RuntimeError: job 2 broke; the other ranks were stopped"
    assert [f["total"] for f in after] == [12, 12]
    assert {f["pid"] for f in ok}.isdisjoint(f["pid"] for f in after)
    assert [f["before"] for f in after] == [1, 1]  # a fresh world: its first job


def test_a_refused_input_in_a_rank_is_exit_2_with_its_line(worker: str) -> None:
    (refused,) = _run(worker, [{"value": 7, "fails": "input"}])
    assert isinstance(refused, procs.RanksFailed) and refused.exit_code == procs.EXIT_BAD_INPUT
    assert str(refused) == "--value 7 is not accepted; accepted: a toy"
