"""Atomic writes: complete or untouched, readable by others (0644 under umask 022), checked up front."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from zerocalc.base.atomic import unwritable, write_text_atomic


@pytest.fixture()
def umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_0644_under_umask_022_in_new_folders(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "a" / "b" / "cal.json"
    assert write_text_atomic(target, "{}\n", parents=True) == target
    assert target.read_text(encoding="utf-8") == "{}\n"
    assert _mode(target) == 0o644


def test_the_umask_is_respected(tmp_path: Path, umask: None) -> None:
    os.umask(0o077)
    write_text_atomic(tmp_path / "private.json", "{}")
    assert _mode(tmp_path / "private.json") == 0o600


def test_a_replaced_file_keeps_its_mode(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "cal.json"
    target.write_text("old", encoding="utf-8")
    target.chmod(0o640)
    write_text_atomic(target, "new")
    assert target.read_text(encoding="utf-8") == "new" and _mode(target) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "cal.json"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "half \ud800 written")  # a lone surrogate cannot be encoded
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"]


def test_writable_paths(tmp_path: Path) -> None:
    assert unwritable(tmp_path / "cal.json") is None
    assert unwritable(tmp_path / "new" / "deeper" / "cal.json", parents=True) is None  # folders are created
    (tmp_path / "cal.json").write_text("old", encoding="utf-8")
    assert unwritable(tmp_path / "cal.json") is None  # replaced


def test_unwritable_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert unwritable("") == "is empty"
    assert unwritable(tmp_path) == "is a directory"
    assert (
        unwritable(tmp_path / "file" / "cal.json")
        == f"cannot be created: {str(tmp_path / 'file')!r} is not a directory"
    )
    assert unwritable(
        tmp_path / "file" / "x" / "cal.json",
    ) == (f"cannot be created: {str(tmp_path / 'file')!r} is not a directory")
    assert (
        unwritable(tmp_path / "new" / "cal.json")
        == f"cannot be created: {str(tmp_path / 'new')!r} does not exist"
    )
    assert not (tmp_path / "new").exists()
    assert unwritable("/proc/version").startswith("cannot be created in '/proc'")  # even for root
    assert unwritable("/dev/null") == "is not a regular file (a device, a pipe or a socket)"
    # root may write anywhere, so a refusal is simulated
    import tempfile

    def refused(**kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    assert unwritable(tmp_path / "cal.json") == f"cannot be created in {str(tmp_path)!r} (Permission denied)"
