"""bench --out is checked before any rank starts; the default folder is created."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), stderr
    return lines[0]


# ------------------------------------------------ bench --out checked before the run, no new folders
@pytest.mark.parametrize(
    ("out", "fragment"),
    [
        ("/proc/version", "cannot be created in '/proc'"),
        ("/dev/null", "is not a regular file"),
        ("MISSING/dir/cal.json", "MISSING/dir' does not exist"),
    ],
)
def test_bench_out_is_checked_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, fragment: str
) -> None:
    import zerocalc.cli.bench as bench_cli

    started: list[object] = []
    monkeypatch.setattr(bench_cli, "_measure", lambda *args: started.append(args))
    out = out.replace("MISSING", str(tmp_path / "missing"))
    result = runner.invoke(app, ["bench", "--backend", "gloo", "--out", out])
    assert result.exit_code == 2, result.output
    assert fragment.replace("MISSING", str(tmp_path / "missing")) in _one_line(result.stderr)
    assert started == [] and not (tmp_path / "missing").exists()


def test_bench_default_out_folder_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache folder zerocalc chose is created (the user named none)."""
    from zerocalc.cli.bench_files import check_out, default_out_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    check_out(default_out_folder() / "calibration.json", parents=True)  # accepted, nothing created yet
    assert not (tmp_path / "cache").exists()
