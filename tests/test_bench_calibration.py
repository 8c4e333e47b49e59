"""build_calibration: algbw/busbw through zerocalc.collectives, one fit per (collective, group kind)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from zerocalc.bench.config import BenchConfig
from zerocalc.bench.sweep import sweep_points
from zerocalc.bench.worker import build_calibration
from zerocalc.calibration import GroupKind, load_calibration, save_calibration
from zerocalc.cli.bench import default_out_path
from zerocalc.collectives import COLLECTIVES, Collective
from zerocalc.dtypes import DType


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
    for kind, n in ((GroupKind.WORLD, 4), (GroupKind.INTRA_NODE, 2), (GroupKind.INTER_NODE, 2)):
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
    assert cal.fit_for(Collective.ALL_GATHER, GroupKind.INTER_NODE) is not None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_out_path(cal)
    assert path.parent == tmp_path / "zerocalc" and path.name.startswith("calibration-gloo-4xtest-cpu-")
    save_calibration(cal, path)
    assert load_calibration(path) == cal
