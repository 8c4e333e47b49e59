"""The CLI's console and JSON output; the table building it shares with the library's display lives in
:mod:`zerocalc.render.tables` (re-exported here for the commands)."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import TYPE_CHECKING

from zerocalc.render.tables import (
    COLLECTIVE_LEGEND,
    OP_SHORT,
    PHASE_SHORT,
    Column,
    byte_cell,
    byte_text,
    collective_label,
    compact_table,
    unit_label,
)
from zerocalc.render.tables import print_fitted as print_fitted_on

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console

__all__ = [
    "COLLECTIVE_LEGEND",
    "OP_SHORT",
    "PHASE_SHORT",
    "Column",
    "byte_cell",
    "byte_text",
    "collective_label",
    "compact_table",
    "console",
    "print_fitted",
    "print_json",
    "unit_label",
]


@lru_cache(maxsize=1)
def console() -> Console:
    from rich.console import Console

    # A terminal's width, else COLUMNS, else 80 columns (Rich's rule): tables are designed for 80.
    return Console(highlight=False)


def print_json(model: BaseModel) -> None:
    """Write a pydantic result as JSON on stdout (no Rich markup, so programs can parse it)."""
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def print_fitted(
    key_header: str, keys: list[str], columns: list[Column], *, key_width: int = 14, title: str | None = None
) -> None:
    """:func:`zerocalc.render.tables.print_fitted` on the console."""
    print_fitted_on(console(), key_header, keys, columns, key_width=key_width, title=title)
