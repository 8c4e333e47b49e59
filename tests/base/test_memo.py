"""zerocalc.base.memo.IdentityCache: values keyed by an object's identity and a hashable key."""

from __future__ import annotations

from zerocalc.base.memo import IdentityCache


class _Table:
    """An object that cannot be hashed (as a frozen model holding lists is costly to)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, rows: list[int]):
        self.rows = rows


def test_a_value_is_found_by_its_objects_identity_and_key() -> None:
    cache: IdentityCache[int] = IdentityCache()
    table, twin = _Table([1, 2]), _Table([1, 2])
    assert cache.get(table, "a") is None
    assert cache.put(table, "a", 3) == 3
    assert cache.get(table, "a") == 3
    assert cache.get(table, "b") is None
    assert cache.get(twin, "a") is None  # an equal object is another key
    assert cache.get(None, "a") is None and cache.put(None, "a", 4) == 4 and cache.get(None, "a") == 4


def test_a_key_is_never_a_freed_objects() -> None:
    """The object is kept with its value: its id cannot be reused by another object while cached."""
    cache: IdentityCache[int] = IdentityCache()
    cache.put(_Table([1]), "a", 1)
    others = [_Table([n]) for n in range(1000)]
    assert all(cache.get(other, "a") is None for other in others)


def test_the_cache_empties_at_its_limit() -> None:
    cache: IdentityCache[int] = IdentityCache(limit=3)
    table = _Table([])
    for key in range(3):
        cache.put(table, key, key)
    assert [cache.get(table, key) for key in range(3)] == [0, 1, 2]
    cache.put(table, 3, 3)
    assert [cache.get(table, key) for key in range(4)] == [None, None, None, 3]
