"""A part of a computation over a request, declared with the request fields it reads (pure).

A :class:`Part` is a name, the fields of the request it reads (dotted paths: ``"mesh"``,
``"activations.micro_batch"``; a path names everything below it) and its function. Its cache key is derived
from that declaration: the values at those paths, and the part's other arguments. A search that evaluates
thousands of requests differing in a few fields shares each part's result among the requests that agree on
what it reads (:class:`PartCache`); one evaluation runs the function (:data:`UNCACHED`). A part that reads a
field its declaration does not name would share a result it should not: tests/test_parts.py runs every part
on a proxy of a request that records each path read and fails where one is not declared.

A key holds a value that is a number, a string, an enum member, None or a tuple (a named one too) of them
by value, and any other object (a mesh, a model, a calibration) by identity (:class:`Same`): two requests
share a result where they hold the same object, which a search's requests do (each is a copy of one parsed
request, its sub-models shared), and never where they hold different ones, whatever they compare as. The
key holds the object (a :class:`PartCache` keeps it beside its result), so its identity is not reused
while the cache lives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from enum import Enum
from operator import attrgetter
from typing import Any, Protocol

_BY_VALUE = (int, float, str, bytes, type(None), Enum)
_SCALARS: set[type] = {int, float, str, bytes, bool, type(None)}
"""Types held by value without a look at their class's bases (an enum's members are added as met)."""


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
    kind = type(value)
    if kind in _SCALARS:
        return value  # type: ignore[return-value]
    if isinstance(value, _BY_VALUE):
        _SCALARS.add(kind)  # an enum (or a subclass of a number or string): by value
        return value  # type: ignore[return-value]
    if isinstance(value, tuple) and all(isinstance(v, _BY_VALUE) for v in value):  # a record of scalars
        return value  # type: ignore[return-value]
    return Same(value)


class Parts(Protocol):
    """How a part's function asks for another part's value (cached or not)."""

    def get(self, part: Part, request: Any, *args: Hashable) -> Any: ...


class Part:
    """One part of a computation: ``run(request, parts, *args)``, reading of the request only the paths
    ``reads`` names (``parts``: how it asks for the parts it is made of, whose reads its own include)."""

    __slots__ = ("_get", "_tops", "name", "reads", "run")

    def __init__(self, name: str, reads: Iterable[str], run: Callable[..., Any]):
        self.name = name
        self.reads: tuple[str, ...] = tuple(dict.fromkeys(reads))
        self.run = run
        self._get = attrgetter(*self.reads) if len(self.reads) > 1 else _one(self.reads[0])
        self._tops = frozenset(read.split(".")[0] for read in self.reads)

    def key(self, request: Any, *args: Hashable) -> tuple:
        """The values at the paths it reads (:func:`key_value`), then its other arguments."""
        scalars = _SCALARS
        return tuple(
            value if type(value) in scalars else key_value(value) for value in (*self._get(request), *args)
        )

    def names(self, path: str) -> bool:
        """Whether its declaration covers ``path``: the path itself, or one above it."""
        return any(path == read or path.startswith(read + ".") for read in self.reads)

    def reads_any(self, changed: Iterable[str]) -> bool:
        """Whether a change of any of ``changed`` (paths) can change what it reads: a path above, equal to or
        below one it reads."""
        return any(
            path.split(".")[0] in self._tops
            and any(
                read == path or read.startswith(path + ".") or path.startswith(read + ".")
                for read in self.reads
            )
            for path in changed
        )

    def __repr__(self) -> str:
        return f"Part({self.name!r})"


def _one(path: str) -> Callable[[Any], tuple]:
    get = attrgetter(path)
    return lambda request: (get(request),)


class _Uncached:
    """Runs every part it is asked for."""

    def get(self, part: Part, request: Any, *args: Hashable) -> Any:
        return part.run(request, self, *args)


UNCACHED: Parts = _Uncached()
"""One evaluation: every part run afresh (``comm`` and ``memory`` of one request)."""


_OBJECTS: set[type] = set()
"""Types met in keys and held by identity."""


def _by_identity(value: object) -> Hashable:
    """A value in a :class:`PartCache`'s key: by value where :func:`key_value` holds it so, else its
    identity (each type decided once, but tuples: by their contents)."""
    kind = type(value)
    if kind in _OBJECTS:
        return id(value)
    if isinstance(value, tuple):
        return value if all(isinstance(v, _BY_VALUE) for v in value) else id(value)
    if isinstance(value, _BY_VALUE):
        _SCALARS.add(kind)
        return value
    _OBJECTS.add(kind)
    return id(value)


class PartCache:
    """Each part's results by its key (:meth:`Part.key`), for one search. Its keys hold an object by its
    ``id`` and each result the values its key was made of, so that no id is another object's while the
    result is kept (and no key allocates a :class:`Same` per object: a search makes tens of thousands)."""

    def __init__(self) -> None:
        self._results: dict[Part, dict[tuple, tuple[Any, tuple]]] = {}
        self._tuples: dict[int, tuple[tuple, Hashable]] = {}
        """Each tuple met in a key (by identity, kept: a request's shape or stages are one object that
        thousands of keys hold), with what the key holds of it (:func:`_by_identity`)."""

    def get(self, part: Part, request: Any, *args: Hashable) -> Any:
        results = self._results.get(part)
        if results is None:
            results = self._results[part] = {}
        values = (*part._get(request), *args)
        scalars, objects, tuples = _SCALARS, _OBJECTS, self._tuples
        held: list[Hashable] = []
        for value in values:
            kind = type(value)
            if kind in scalars:
                held.append(value)
            elif kind in objects:
                held.append(id(value))
            elif isinstance(value, tuple):
                known = tuples.get(id(value))
                if known is None or known[0] is not value:
                    known = tuples[id(value)] = (value, _by_identity(value))
                held.append(known[1])
            else:
                held.append(_by_identity(value))
        key = tuple(held)
        found = results.get(key)
        if found is not None:
            return found[0]
        value = part.run(request, self, *args)
        results[key] = (value, values)
        return value

    def size(self, part: Part) -> int:
        """How many results of ``part`` it holds (distinct keys met)."""
        return len(self._results.get(part, ()))
