"""Where ``zerocalc bench`` writes: the default folder in zerocalc's cache, the default file names of a
calibration and of a compute table, and the check that ``--out`` can be written (before any rank starts).

Shared by the collectives run (:mod:`zerocalc.cli.bench`) and ``--compute``
(:mod:`zerocalc.cli.bench_compute`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from zerocalc.base.errors import InputError

if TYPE_CHECKING:
    from zerocalc.compute.table import ComputeTable
    from zerocalc.network.calibration import Calibration


def default_out_folder() -> Path:
    """``$XDG_CACHE_HOME/zerocalc`` (``~/.cache/zerocalc``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "zerocalc"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:40] or "device"


def _stamp(created_at: str | None) -> str:
    return re.sub(r"[^0-9T]", "", (created_at or "").split("+")[0])


def default_out_path(calibration: Calibration) -> Path:
    """``calibration-BACKEND-WORLDxDEVICE-TIME.json`` in :func:`default_out_folder`."""
    name = (
        f"calibration-{calibration.backend}-{calibration.world_size}x{_slug(calibration.device_name)}-"
        f"{_stamp(calibration.created_at)}.json"
    )
    return default_out_folder() / name


def compute_out_path(out: str | None, table: ComputeTable) -> Path:
    """``--out``, else ``compute-BACKEND-DEVICE-TIME.json`` in :func:`default_out_folder`."""
    if out is not None:
        return Path(out)
    name = f"compute-{table.backend}-{_slug(table.device_name)}-{_stamp(table.created_at)}.json"
    return default_out_folder() / name


def check_out(path: Path, parents: bool) -> None:
    """``--out`` (or, ``parents``, the default file in zerocalc's cache folder, created if missing) can be
    written: checked before any rank starts."""
    from zerocalc.base.atomic import unwritable

    problem = unwritable(path, parents)
    if problem:
        raise InputError(f"--out {str(path)!r} {problem}; accepted: a file path in a writable folder")
