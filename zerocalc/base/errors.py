"""The one exception type the core raises for bad input.

A message names the inputs it is about by their concept, written ``{name}`` in the template (``{gpus}``,
``{gpus_per_node}``, ``{framework}``: the keyword names of the library functions). ``str(error)`` shows
those names as they are (``{{`` and ``}}`` are literal braces; :func:`shown` quotes a user's value);
the CLI shows its own flag for each (``--gpus-per-node``), so only ``zerocalc.cli``
knows about flags. The CLI turns the error into one line on stderr and exit code 2; library callers get a
``ValueError`` subclass they can catch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([a-z][a-z0-9_]*)\}")


def literal(text: str) -> str:
    """Text for a message template, its braces escaped so they are never read as a name."""
    return text.replace("{", "{{").replace("}", "}}")


def shown(value: object) -> str:
    """A user's value for a message: its ``repr``, as a :func:`literal`."""
    return literal(repr(value))


def why_not(exc: Exception) -> str:
    """Why a file could not be read or written, for a message: the OS's reason (``No such file or
    directory``), else the error itself (a path with a NUL byte raises a ValueError with no errno)."""
    return getattr(exc, "strerror", None) or str(exc)


def render(template: str, name_of: Callable[[str], str]) -> str:
    """``template`` with each ``{concept}`` replaced by ``name_of(concept)`` and ``{{``/``}}`` unescaped."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return match.group(0)[0]  # an escaped brace
        return name_of(match.group(1))

    return _PLACEHOLDER.sub(replace, template)


def keyword(concept: str) -> str:
    """A concept as the library names it: its keyword (``gpus_per_node``); a switch's off (``no_`` + its
    concept) the keyword set false (``kbit_prepare=False``)."""
    if concept.startswith("no_"):
        return f"{concept[3:]}=False"
    return concept


ResultT = TypeVar("ResultT")


def with_names(result: ResultT, name_of: Callable[[str], str]) -> ResultT:
    """A result whose ``notes`` (templates naming inputs by concept, like an :class:`InputError`'s), its own
    and those of the results it holds, are rendered with ``name_of``: flags for the CLI, keywords for the
    library."""
    fields = getattr(type(result), "model_fields", None)
    if fields is None:
        return result
    changes: dict[str, Any] = {}
    for name in fields:
        value = getattr(result, name)
        if name == "notes" and isinstance(value, list):
            changes[name] = [render(note, name_of) for note in value]
        elif hasattr(type(value), "model_fields"):
            named = with_names(value, name_of)
            if named is not value:
                changes[name] = named
    return result.model_copy(update=changes) if changes else result  # type: ignore[attr-defined]


class InputError(ValueError):
    """A user-supplied value is not accepted. The message names the value and what is accepted."""

    def __init__(self, template: str) -> None:
        super().__init__(template)
        self.template = template

    def render(self, name_of: Callable[[str], str]) -> str:
        """The message with each ``{concept}`` replaced by ``name_of(concept)`` (e.g. a CLI flag)."""
        return render(self.template, name_of)

    def __str__(self) -> str:
        return self.render(keyword)
