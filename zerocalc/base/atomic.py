"""Atomic file writes: a file zerocalc writes is either the old one or the complete new one."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, parents: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"), parents)


def write_bytes_atomic(path: str | Path, data: bytes, parents: bool = False) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same directory, fsync and rename.

    A new file gets mode 0666 less the umask (0644 with the usual umask 022), like any file a command
    creates; a file replaced keeps its mode. A failure at any point leaves the previous file untouched
    and no temporary file behind. Missing folders are created only with ``parents`` (a folder zerocalc
    chose, such as its cache): a path the user typed names a folder that exists.
    """
    target = Path(path)
    if parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return target


def _umask() -> int:
    current = os.umask(0o022)  # the only portable way to read it is to set it
    os.umask(current)
    return current


def unwritable(path: str | Path, parents: bool = False) -> str | None:
    """Why :func:`write_text_atomic` could not write ``path``, or None: checked before any work, by
    creating and removing an empty temporary file where the write would create its own (permissions,
    read-only mounts and pseudo file systems such as /proc all answer).

    The path must not be a directory or another file that is not a regular one (a device, a pipe: the
    atomic rename would replace it); its folder must exist, or with ``parents`` its nearest existing
    ancestor (the folders below it are created by the write).
    """
    target = Path(path)
    if str(path) == "":
        return "is empty"
    if "\x00" in str(path):
        return "contains a NUL byte"
    if target.is_dir():
        return "is a directory"
    if target.exists() and not target.is_file():
        return "is not a regular file (a device, a pipe or a socket)"
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot be created: {str(folder)!r} is not a directory"
    if folder != target.parent and not parents:
        return f"cannot be created: {str(target.parent)!r} does not exist"
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        return f"cannot be created in {str(folder)!r} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None
