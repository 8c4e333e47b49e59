"""build_calibration: algbw/busbw through zerocalc.network.collectives, one fit per (collective, group
kind)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from zerocalc.base.dtypes import DType
from zerocalc.bench.config import BenchConfig
from zerocalc.bench.sweep import sweep_points
from zerocalc.bench.worker import build_calibration
from zerocalc.cli.bench_files import default_out_path
from zerocalc.network.calibration import load_calibration, save_calibration
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import COLLECTIVES, Collective


def test_calibration_from_hand_made_times_round_trips(tmp_path, monkeypatch) -> None:
    config = BenchConfig(
        collectives=[Collective.ALL_REDUCE, Collective.ALL_GATHER],
        dtype=DType.BF16,
        min_bytes=1024,
        max_bytes=2**20,
        step_factor=4,
        warmup=0,
        iters=1,
        backend="gloo",
        timeout_s=10,
    )
    alpha, beta = 10e-6, 5e9
    rows, times = [], []
    for kind, n in ((RankGroup.WORLD, 4), (RankGroup.NODE, 2), (RankGroup.ACROSS_NODES, 2)):
        for c in config.collectives:
            for p in sweep_points(c, n, 2, config.min_bytes, config.max_bytes, config.step_factor):
                rows.append((kind, n, c, p))
                times.append(alpha + float(COLLECTIVES[c].bus_factor(n)) * p.size_bytes / beta)
    cal = build_calibration(
        config,
        rows,
        times,
        [0.0] * len(rows),
        backend="gloo",
        device="Test CPU",
        world_size=4,
        nodes=2,
        ranks_per_node=2,
    )
    for m in cal.measurements:
        assert m.busbw_Bps / m.algbw_Bps == pytest.approx(
            float(COLLECTIVES[m.collective].bus_factor(m.group_size))
        )
        assert m.errors is None  # not checked
    assert len(cal.fits) == 6
    for fit in cal.fits:
        assert fit.latency_s == pytest.approx(alpha, rel=1e-6)
        assert fit.bus_bandwidth_Bps == pytest.approx(beta, rel=1e-6)
    assert cal.fit_for(Collective.ALL_GATHER, RankGroup.ACROSS_NODES) is not None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_out_path(cal)
    assert path.parent == tmp_path / "zerocalc" and path.name.startswith("calibration-gloo-4xtest-cpu-")
    save_calibration(cal, path, parents=True)  # the default cache folder is created, as bench does
    assert load_calibration(path) == cal


def test_a_schema_1_calibration_is_read_with_its_old_group_names(tmp_path: Path) -> None:
    """Schema 1 named one node's groups ``intra_node`` and one-rank-per-node groups ``inter_node``."""
    fit = {
        "collective": "all_reduce", "group_kind": "inter_node", "group_size": 2, "latency_s": 1e-5,
        "bus_bandwidth_Bps": 4e10, "peak_busbw_Bps": 3.9e10, "points": 3,
    }  # fmt: skip
    old = {
        "schema_version": 1, "created_at": "2026-11-01T00:00:00+00:00", "backend": "nccl",
        "device_name": "H100", "torch_version": "2.5", "world_size": 16, "nodes": 2, "gpus_per_node": 8,
        "dtype": "bf16", "measurements": [], "fits": [fit, {**fit, "group_kind": "intra_node"}],
    }  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    calibration = load_calibration(tmp_path / "old.json")
    assert [f.group_kind for f in calibration.fits] == [RankGroup.ACROSS_NODES, RankGroup.NODE]
