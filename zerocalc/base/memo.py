"""A cache keyed by an object's identity (pure): for values derived from an object that is costly to hash
(a frozen model holding lists, such as a compute table or a calibration) and many cheap ones."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityCache(Generic[V]):
    """Values keyed by (``held``'s identity, a hashable key). The object is kept with its value, so a key is
    never another object's (an id is reused once its object is freed); the cache is emptied when it
    holds ``limit`` values."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._values: dict[tuple[int, Hashable], tuple[object, V]] = {}

    def get(self, held: object, key: Hashable) -> V | None:
        cached = self._values.get((id(held), key))
        if cached is not None and cached[0] is held:
            return cached[1]
        return None

    def put(self, held: object, key: Hashable, value: V) -> V:
        if len(self._values) >= self.limit:
            self._values.clear()
        self._values[id(held), key] = (held, value)
        return value

    def clear(self) -> None:
        self._values.clear()
