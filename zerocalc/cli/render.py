"""The CLI's console and JSON output; the table building it shares with the library's display lives in
:mod:`zerocalc.render.tables` (re-exported here for the commands)."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING

from zerocalc.render.tables import (
    COLLECTIVE_LEGEND,
    Column,
    byte_cell,
    collective_label,
    compact_table,
    unit_label,
)
from zerocalc.render.tables import print_fitted as print_fitted_on
from zerocalc.render.tables import print_phrases as print_phrases_on

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console

__all__ = [
    "COLLECTIVE_LEGEND",
    "Column",
    "byte_cell",
    "collective_label",
    "compact_table",
    "console",
    "print_fitted",
    "print_json",
    "print_phrases",
    "unit_label",
]


def console() -> Console:
    """The console commands print on: COLUMNS wide, else the terminal's width, else 80 columns (Rich's
    rule); a width below ``MIN_COLUMNS``, where no table of numbers fits whole, is taken as 80, the width
    the tables are designed for. Text is printed as written: no ``:name:`` emoji codes (a model called
    ``:fire:`` stays so), which also spares loading Rich's emoji table."""
    return _console(os.environ.get("COLUMNS"))


@lru_cache(maxsize=4)
def _console(columns: str | None) -> Console:
    from rich.console import Console

    from zerocalc.cli.base import DEFAULT_COLUMNS, MIN_COLUMNS
    from zerocalc.render.tables import TrimLineEnds

    out = Console(highlight=False, emoji=False)
    if out.width < MIN_COLUMNS:
        out = Console(highlight=False, emoji=False, width=DEFAULT_COLUMNS)
    out.push_render_hook(TrimLineEnds())
    return out


def print_json(model: BaseModel) -> None:
    """Write a pydantic result as JSON on stdout (no Rich markup, so programs can parse it); where the
    output's encoding lacks a character, as a ``\\u`` escape (the same JSON value)."""
    text = model.model_dump_json(indent=2)
    try:
        text.encode(sys.stdout.encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        import json

        text = json.dumps(json.loads(text), indent=2, ensure_ascii=True)
    sys.stdout.write(text + "\n")


def print_phrases(*phrases: str) -> None:
    """:func:`zerocalc.render.tables.print_phrases` on the console."""
    print_phrases_on(console(), *phrases)


def print_fitted(
    key_header: str, keys: list[str], columns: list[Column], *, key_width: int = 14, title: str | None = None
) -> None:
    """:func:`zerocalc.render.tables.print_fitted` on the console."""
    print_fitted_on(console(), key_header, keys, columns, key_width=key_width, title=title)
