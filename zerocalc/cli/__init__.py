"""The ``zerocalc`` command line: thin Typer commands over the core (parse, call, render).

One module per command registers itself on the application of :mod:`zerocalc.cli.base`. The console
script imports only the module of the command it runs (start-up stays at the import floor); ``--help``
and ``zerocalc.cli.app`` (tests, embedding) load them all.
"""

from __future__ import annotations

import gc
import importlib
import sys
from typing import Any

COMMANDS: dict[str, str] = {
    "memory": "zerocalc.cli.memory",
    "comm": "zerocalc.cli.comm",
    "plan": "zerocalc.cli.plan",
    "bench": "zerocalc.cli.bench",
    "validate": "zerocalc.cli.validate",
    "presets": "zerocalc.cli.presets",
    "check": "zerocalc.cli.check",
}
"""Command name → the module that registers it, in ``--help`` order."""


GC_THRESHOLD = 50_000
"""Allocations between two young-generation collections in a command (CPython's default: 700)."""


def load_commands(names: list[str] | None = None) -> Any:
    """Import the modules registering ``names`` (all when None) and return the Typer app."""
    from zerocalc.cli.base import app

    for name in names if names is not None else list(COMMANDS):
        importlib.import_module(COMMANDS[name])
    return app


def _invoked(argv: list[str]) -> list[str] | None:
    """The one command ``argv`` runs, if it names a known command first; None loads every command."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return [first] if first in COMMANDS and argv and argv[0] == first else None


def main() -> None:
    """Console-script entry point.

    What loading the command created (modules, classes, tables) lives as long as the process: it is moved
    out of the garbage collector's generations (``gc.freeze``), so that no collection traverses it again.
    When the command is done, so is everything still alive, which the process's exit tears down: the
    interpreter's last collection pass, which would traverse all of it to find cycles to finalise (a
    finalisation Python does not promise at exit), is skipped the same way.

    The young generation is collected every ``GC_THRESHOLD`` allocations instead of CPython's 700: most
    of what a command allocates is what it imports (modules, classes, pydantic schemas), which is not
    garbage, and the default's hundreds of collections traverse it for nothing; cycles are still found."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    app = load_commands(_invoked(sys.argv[1:]))
    gc.freeze()
    try:
        app()
    finally:
        gc.freeze()


def __getattr__(name: str) -> Any:
    if name == "app":
        return load_commands()
    if name == "fail":
        from zerocalc.cli.base import fail

        return fail
    raise AttributeError(f"module 'zerocalc.cli' has no attribute {name!r}")
