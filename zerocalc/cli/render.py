"""Rendering helpers shared by commands: the console, JSON output and byte cells."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import TYPE_CHECKING

from zerocalc.units import ByteUnit, format_bytes

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console
    from rich.table import Table


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


OP_SHORT = {
    "all_gather": "AG",
    "reduce_scatter": "RS",
    "all_reduce": "AR",
    "broadcast": "BC",
    "all_to_all": "A2A",
}
PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "after_step": "step"}
COLLECTIVE_LEGEND = (
    "AG all_gather, RS reduce_scatter, AR all_reduce, BC broadcast, A2A all_to_all; fwd forward, "
    "bwd backward, step after optimizer.step"
)


def collective_label(op: str, phase: str) -> str:
    """``AG fwd``: a collective and its phase, short (:data:`COLLECTIVE_LEGEND` spells them out)."""
    return f"{OP_SHORT.get(op, op)} {PHASE_SHORT.get(phase, phase)}"


def compact_table(*columns: tuple[str, bool, str]) -> Table:
    """A table without vertical rules, so that it fits 80 columns: (header, numeric, footer) per column;
    numbers are right-aligned and never wrapped, text wraps."""
    from rich import box
    from rich.table import Table

    table = Table(
        box=box.SIMPLE,
        header_style="bold",
        footer_style="bold",
        padding=(0, 1),
        pad_edge=False,
        show_edge=False,
        show_footer=any(footer for _, _, footer in columns),
    )
    for header, numeric, footer in columns:
        table.add_column(
            header,
            footer,
            justify="right" if numeric else "left",
            no_wrap=numeric,
            overflow="ellipsis" if numeric else "fold",
        )
    return table
