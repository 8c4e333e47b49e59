"""Shared test helpers."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zerocalc.network.calibration import Calibration, CollectiveFit
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.request.presets import presets_root
from zerocalc.validate.compare import predicted_comm, predictions
from zerocalc.validate.config import Job, Measured, RecordedCall


def _group_ranks(group: str, rank: int, world: int, per_node: int) -> list[int]:
    if group == "node":
        first = rank - rank % per_node
        return list(range(first, first + per_node))
    if group == "across_nodes":
        return list(range(rank % per_node, world, per_node))
    return list(range(world))


def perfect_tp_run(job: Job) -> list[Measured]:
    """:func:`perfect_run` of a ``dp × tp`` job: the states and the calls, in order, of
    ``zerocalc.validate.tp``."""
    from zerocalc.validate.tp import tp_predictions

    plan = job.tp_plan
    assert plan is not None
    states, calls = tp_predictions(job)
    measured = []
    for rank, p in enumerate(states):
        recorded = [
            RecordedCall(
                op=c.op,
                phase=c.phase,
                dtype=c.dtype,
                elements=c.elements,
                group_ranks=plan.tp_group(rank) if c.group == "tp" else plan.dp_group(rank),
            )
            for c in calls[rank]
        ]
        measured.append(
            Measured(
                rank=rank,
                params=p.params.bytes,
                grads=p.grads.bytes,
                optimizer=p.optimizer_states.bytes,
                step=p.step.bytes,
                unsharded_after_forward=p.unsharded_after_forward.bytes,
                loss=6.9,
                collectives=recorded,
            )
        )
    return measured


def perfect_run(job: Job, world: int) -> list[Measured]:
    """What every rank of ``job`` measures when the prediction is exactly right: its model states and the
    calls of ``zerocalc comm``'s schedule (the figures a faked spawned world hands back)."""
    if job.tp_plan is not None:
        return perfect_tp_run(job)
    comm = predicted_comm(job, world)
    states = predictions(
        job.arch, job.strategy, world, job.precision, job.optimizer, job.gpus_per_node, job.finetune
    )
    measured = []
    for rank, p in enumerate(states):
        calls = [
            RecordedCall(
                op=c.op.value,
                phase=c.phase.value,
                dtype=c.dtype.value,
                elements=elements,
                group_ranks=_group_ranks(c.group.value, rank, world, job.gpus_per_node),
                root=unit.source_rank,
            )
            for c in comm.collectives
            for unit in c.units
            for elements in unit.elements
            for _ in range(c.times_per_step)
        ]
        measured.append(
            Measured(
                rank=rank,
                params=p.params.bytes,
                grads=p.grads.bytes,
                optimizer=p.optimizer_states.bytes,
                step=p.step.bytes,
                unsharded_after_forward=None
                if p.setup.shard_group is None or job.strategy == "zero1"
                else p.unsharded_after_forward.bytes,
                frozen=None if p.frozen is None else p.frozen.bytes,
                loss=6.9,
                collectives=calls,
            )
        )
    return measured


@pytest.fixture()
def perfect() -> Callable[[Job, int], list[Measured]]:
    return perfect_run


def one_fit_calibration(collective: Collective) -> Calibration:
    """An NCCL calibration of one node of 8 GPUs with one fit: ``collective`` over the world at
    α = 50 µs and a bus bandwidth of 120 GB/s."""
    fit = CollectiveFit(
        collective=collective, group_kind=RankGroup.WORLD, group_size=8,
        latency_s=5e-5, bus_bandwidth_Bps=120e9, peak_busbw_Bps=118e9, points=10,
    )  # fmt: skip
    return Calibration(
        created_at="2026-11-22T00:00:00Z", backend="nccl", device_name="test", torch_version="2.13.0",
        world_size=8, nodes=1, gpus_per_node=8, dtype="bf16", measurements=[], fits=[fit],
    )  # fmt: skip


@pytest.fixture()
def calibration_of() -> Callable[[Collective], Calibration]:
    """:func:`one_fit_calibration`."""
    return one_fit_calibration


def keywords_in_notes(data: Any) -> Any:
    """A result's JSON with each flag its notes name written as the library's keyword: the CLI's notes
    name flags, the library's keywords (a note names an option as its caller spells it)."""
    import re

    from zerocalc.request.options import FLAGS

    by_flag = {flag: name for name, flag in FLAGS.items()}

    def as_keywords(note: str) -> str:
        return re.sub(r"--[a-z0-9-]+", lambda m: by_flag.get(m.group(0), m.group(0)), note)

    if isinstance(data, dict):
        return {
            key: [as_keywords(n) for n in value] if key == "notes" else keywords_in_notes(value)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [keywords_in_notes(item) for item in data]
    return data


@pytest.fixture()
def presets_copy(tmp_path: Path) -> Path:
    """A copy of the shipped presets folder, to change."""
    root = tmp_path / "presets"
    shutil.copytree(presets_root(), root)
    return root


@pytest.fixture()
def torch_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """``importlib.util.find_spec("torch")`` finds nothing, as where PyTorch is not installed."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a)
    )
