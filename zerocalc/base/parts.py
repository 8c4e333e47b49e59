"""A part of a computation over a request, declared with the request fields it reads (pure).

A :class:`Part` is a name, the fields of the request it reads (dotted paths: ``"mesh"``,
``"activations.micro_batch"``; a path names everything below it) and its function. Its cache key is derived
from that declaration: the values at those paths, and the part's other arguments. A search that evaluates
thousands of requests differing in a few fields shares each part's result among the requests that agree on
what it reads (:class:`PartCache`); one evaluation runs the function (:data:`UNCACHED`). A part that reads a
field its declaration does not name would share a result it should not: tests/test_parts.py runs every part
on a proxy of a request that records each path read and fails where one is not declared.

A key holds a value that is a number, a string, an enum member, None or a tuple of them by value, and any
other object (a mesh, a model, a calibration) by identity (:class:`Same`): two requests share a result where
they hold the same object, which a search's requests do (each is a copy of one parsed request, its
sub-models shared), and never where they hold different ones, whatever they compare as. The key holds
the object, so its identity is not reused while the cache lives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from enum import Enum
from typing import Any, Protocol

_BY_VALUE = (int, float, str, bytes, type(None), Enum)


class Same:
    """An object in a key by its identity (it is kept: its identity is not reused while the key lives)."""

    __slots__ = ("held",)

    def __init__(self, held: object):
        self.held = held

    def __hash__(self) -> int:
        return id(self.held)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.held is self.held

    def __repr__(self) -> str:
        return f"Same({type(self.held).__name__} at {id(self.held):#x})"


def key_value(value: object) -> Hashable:
    """``value`` as a key holds it: by value where it is a number, a string, an enum member, None or a tuple
    of them, else by identity."""
    if isinstance(value, _BY_VALUE):
        return value  # type: ignore[return-value]
    if type(value) is tuple and all(isinstance(v, _BY_VALUE) for v in value):
        return value
    return Same(value)


class Parts(Protocol):
    """How a part's function asks for another part's value (cached or not)."""

    def get(self, part: Part, request: Any, *args: Hashable) -> Any: ...


class Part:
    """One part of a computation: ``run(request, parts, *args)``, reading of the request only the paths
    ``reads`` names (``parts``: how it asks for the parts it is made of, whose reads its own include)."""

    __slots__ = ("_paths", "name", "reads", "run")

    def __init__(self, name: str, reads: Iterable[str], run: Callable[..., Any]):
        self.name = name
        self.reads: tuple[str, ...] = tuple(reads)
        self.run = run
        self._paths = tuple(tuple(path.split(".")) for path in self.reads)

    def key(self, request: Any, *args: Hashable) -> tuple:
        """The values at the paths it reads (:func:`key_value`), then its other arguments."""
        values = []
        for path in self._paths:
            value = request
            for name in path:
                value = getattr(value, name)
            values.append(key_value(value))
        return (*values, *(key_value(arg) for arg in args))

    def names(self, path: str) -> bool:
        """Whether its declaration covers ``path``: the path itself, or one above it."""
        return any(path == read or path.startswith(read + ".") for read in self.reads)

    def reads_any(self, changed: Iterable[str]) -> bool:
        """Whether a change of any of ``changed`` (paths) can change what it reads: a path above, equal to or
        below one it reads."""
        return any(
            read == path or read.startswith(path + ".") or path.startswith(read + ".")
            for path in changed
            for read in self.reads
        )

    def __repr__(self) -> str:
        return f"Part({self.name!r})"


class _Uncached:
    """Runs every part it is asked for."""

    def get(self, part: Part, request: Any, *args: Hashable) -> Any:
        return part.run(request, self, *args)


UNCACHED: Parts = _Uncached()
"""One evaluation: every part run afresh (``comm`` and ``memory`` of one request)."""


class PartCache:
    """Each part's results by its key (:meth:`Part.key`), for one search."""

    def __init__(self) -> None:
        self._results: dict[Part, dict[tuple, Any]] = {}

    def get(self, part: Part, request: Any, *args: Hashable) -> Any:
        results = self._results.get(part)
        if results is None:
            results = self._results[part] = {}
        key = part.key(request, *args)
        if key in results:
            return results[key]
        value = results[key] = part.run(request, self, *args)
        return value

    def size(self, part: Part) -> int:
        """How many results of ``part`` it holds (distinct keys met)."""
        return len(self._results.get(part, ()))
