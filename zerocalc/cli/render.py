"""Rendering helpers shared by commands: the console, JSON output and byte cells."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import TYPE_CHECKING

from zerocalc.units import ByteUnit, format_bytes

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console


@lru_cache(maxsize=1)
def console() -> Console:
    from rich.console import Console

    probe = Console()
    # Piped output (CI logs, files) gets room for the widest tables instead of Rich's 80 columns.
    return Console(highlight=False, width=None if probe.is_terminal else 140)


def print_json(model: BaseModel) -> None:
    """Write a pydantic result as JSON on stdout (no Rich markup, so programs can parse it)."""
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def unit_label(unit: ByteUnit) -> str:
    if unit is ByteUnit.B:
        return "bytes"
    power = {"Ki": "2^10", "Mi": "2^20", "Gi": "2^30", "Ti": "2^40"}.get(unit.value[:2])
    decimal = {"K": "10^3", "M": "10^6", "G": "10^9", "T": "10^12"}.get(unit.value[0])
    return f"{unit.value} (1 {unit.value} = {power if power else decimal} bytes)"


def byte_cell(n_bytes: int, unit: ByteUnit) -> str:
    return format_bytes(n_bytes, unit)
