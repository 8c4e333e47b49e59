"""A calibration says where it applies and where it extrapolates."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


# ---------------------------------- a calibration says where it applies, and where it extrapolates
def _gloo_all_gather_calibration(path: Path) -> Path:
    """A gloo sweep of all_gather over 2 ranks from 1 KiB to 1 MiB (×4), its fit at 1 GB/s."""
    from zerocalc.network.calibration import Calibration, CollectiveFit, Measurement, save_calibration
    from zerocalc.network.cluster import RankGroup
    from zerocalc.network.collectives import Collective

    sizes = [2**10 * 4**i for i in range(6)]  # 1 KiB … 1 MiB
    rows = [
        Measurement(collective=Collective.ALL_GATHER, group_kind=RankGroup.WORLD, group_size=2, size_bytes=s,
                    count=s // 2, dtype="bf16", time_s=1e-4 + s / 2e9, algbw_Bps=1.0, busbw_Bps=1.0)
        for s in sizes
    ]  # fmt: skip
    fit = CollectiveFit(collective=Collective.ALL_GATHER, group_kind=RankGroup.WORLD, group_size=2,
                        latency_s=1e-4, bus_bandwidth_Bps=1e9, peak_busbw_Bps=1e9,
                        points=len(sizes))  # fmt: skip
    calibration = Calibration(
        created_at="2026-11-26T00:00:00+00:00", backend="gloo", device_name="Test CPU",
        torch_version="2.13.0", world_size=2, nodes=1, gpus_per_node=2, dtype="bf16", measurements=rows,
        fits=[fit],
    )  # fmt: skip
    return save_calibration(calibration, path)


@pytest.mark.parametrize("strategy", ["zero3", "zero1"])
def test_a_calibration_beyond_its_sweep_says_so(tmp_path: Path, strategy: str) -> None:
    """7B at N = 2: zero3's all_gathers move Ψ bf16 = 14e9 B = 13.0 GiB each call, the sweep stopped at
    1 MiB; its reduce_scatter has no fit and runs at the stated NVLink default."""
    path = _gloo_all_gather_calibration(tmp_path / "cal.json")
    args = ["comm", "--params", "7B", "--gpus", "2", "-s", strategy, "--calibration", str(path)]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert (
        f"calibration {path} measured all_gather over world groups of 2 from 1.0 KiB to 1.0 MiB per call; "
        "these calls move 13.0 GiB to 13.0 GiB: its fit is extrapolated"
    ) in out
    assert "was measured with gloo on Test CPU; the collectives it has no fit for use NCCL-class" in out
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[-1] for line in out.splitlines()
            if line.startswith(("AG ", "RS "))}  # fmt: skip
    assert set(rows.values()) == {"fit", "default"}


def test_a_calibration_within_its_sweep_adds_no_warning(tmp_path: Path) -> None:
    """Ψ = 500K at N = 2: each all_gather moves 500,000 bf16 = 1,000,000 B, inside the 1 KiB – 1 MiB sweep."""
    from zerocalc import estimate_comm

    path = _gloo_all_gather_calibration(tmp_path / "cal.json")
    estimate = estimate_comm("500K", 2, strategies="zero3", calibration=str(path))
    assert not any("extrapolated" in note for note in estimate.notes), estimate.notes
