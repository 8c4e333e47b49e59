"""The compute table a step time is priced with: ``--compute-calibration`` (a file ``zerocalc bench
--compute`` wrote), else the GPU preset's (``presets/compute/<gpu>.json``). Read once per file and
process; imported only by the commands that print step times."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from zerocalc.compute.table import ComputeTable, load_compute_table, parse_compute_table
from zerocalc.request.presets import presets_root


class NamedTable:
    """A compute table and how outputs name it."""

    __slots__ = ("name", "table")

    def __init__(self, table: ComputeTable, name: str):
        self.table, self.name = table, name


def preset_compute_path(gpu: str) -> Path:
    return presets_root() / "compute" / f"{gpu}.json"


@lru_cache(maxsize=16)
def _preset(path: Path, mtime_ns: int) -> ComputeTable:
    return parse_compute_table(path.read_text(encoding="utf-8"), str(path), "the GPU preset's compute table")


@lru_cache(maxsize=16)
def _file(path: str) -> ComputeTable:
    return load_compute_table(path)


def compute_table(path: str | None, gpu: str | None) -> NamedTable | None:
    """The table of ``path`` (``--compute-calibration``), else the preset of GPU ``gpu`` when it ships
    one; None without either."""
    if path is not None:
        return NamedTable(_file(path), path)
    if gpu is None:
        return None
    preset = preset_compute_path(gpu)
    if not preset.is_file():
        return None
    return NamedTable(_preset(preset, preset.stat().st_mtime_ns), f"the {gpu} preset's")
