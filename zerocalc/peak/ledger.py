"""A ledger of the tensors one training step allocates and frees, in program order.

Each allocation is rounded up to the device allocator's block (512 B on CUDA: the caching allocator's
``kMinBlockSize``, ``c10/cuda/CUDACachingAllocator.cpp``), as ``torch.cuda.memory_allocated`` counts it.
Events record the allocated total at a point of the step (plus, optionally, an unnamed transient that
exists only at that point); a phase's peak is the maximum over its events, as
``torch.cuda.max_memory_allocated`` reads between ``reset_peak_memory_stats`` calls. The log of
allocations and frees (with the stream each allocation is made on) is what
:mod:`zerocalc.peak.allocator` replays to find what the caching allocator reserves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

CUDA_BLOCK = 512
"""The caching allocator rounds every request up to a multiple of 512 bytes."""


class Event(NamedTuple):
    phase: str
    name: str
    allocated: int


class Alloc(NamedTuple):
    name: str
    nbytes: int
    stream: str
    kind: str = ""


class Free(NamedTuple):
    name: str


class Sizes(tuple[int, ...]):
    """The sizes in bytes of tensors allocated together (:meth:`Ledger.alloc_each`), their rounded total
    kept per allocator block: a unit's tensors are allocated thousands of times in a plan's runs."""

    def __init__(self, _sizes: Iterable[int] = ()) -> None:
        self.totals: dict[int, int] = {}
        """Per allocator block, the sizes each rounded and summed (:meth:`Ledger.rounded_total`)."""


class Ledger:
    """Named live tensors and the step's events. Names are unique while alive."""

    def __init__(self, block: int = CUDA_BLOCK, record: bool = True):
        self.block = block
        self.record = record
        """Keep the allocation log and the bytes by kind (the allocator replay and the report need them)."""
        self.live: dict[str, int] = {}
        self.kinds: dict[str, str] = {}
        self.by_kind: dict[str, int] = {}
        self.groups: dict[str, list[str]] = {}
        self.total = 0
        self.phase = "start"
        self.events: list[Event] = []
        self.log: list[Alloc | Free] = []
        self.marks: list[int] = []
        """Per event, the length of the log at it (its transient included): where a replay of the log
        stands at that event."""
        self.peak_live: dict[str, dict[str, int]] = {}
        """Per phase, the live tensors (by kind) at that phase's peak event."""
        self._peak: dict[str, int] = {}
        self._transients = 0

    def rounded(self, nbytes: int) -> int:
        return 0 if nbytes <= 0 else -(-nbytes // self.block) * self.block

    def rounded_total(self, sizes: Iterable[int]) -> int:
        """The bytes of tensors of these sizes, each rounded on its own (:class:`Sizes`: once)."""
        if not isinstance(sizes, Sizes):
            return sum(map(self.rounded, sizes))
        total = sizes.totals.get(self.block)
        if total is None:
            total = sizes.totals[self.block] = sum(map(self.rounded, sizes))
        return total

    def alloc(
        self, name: str, nbytes: int, kind: str, stream: str = "default", group: str | None = None
    ) -> None:
        """Allocate ``nbytes`` (rounded) named ``name``; ``kind`` groups it in the report, ``group`` lets
        :meth:`free_group` free it with the others of its group."""
        if nbytes <= 0:
            return
        block = self.block
        size = -(-nbytes // block) * block  # rounded (inline: a plan allocates ~10⁴ tensors per search)
        if group is not None:
            self.groups.setdefault(group, []).append(name)
        if name in self.live:
            raise KeyError(f"{name} is already allocated")
        self.live[name] = size
        self.kinds[name] = kind
        self.total += size
        if self.record:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + size
            self.log.append(Alloc(name, size, stream, kind))

    def free(self, name: str) -> None:
        size = self.live.pop(name, None)
        if size is None:
            return  # a zero-byte tensor was never allocated
        kind = self.kinds.pop(name)
        self.total -= size
        if self.record:
            self.by_kind[kind] -= size
            self.log.append(Free(name))

    def alloc_each(
        self, prefixes: tuple[str, ...], sizes: Sequence[int], kind: str, stream: str = "default"
    ) -> None:
        """One tensor per size and prefix: ``{prefix}#{i}`` of ``sizes[i]`` bytes, i by i and each
        prefix in turn (Adam's two states of one parameter, then the next parameter's)."""
        for i, nbytes in enumerate(sizes):
            for prefix in prefixes:
                self.alloc(f"{prefix}#{i}", nbytes, kind, stream)

    def alloc_group(self, group: str, entries: Iterable[tuple[str, int]], kind: str) -> None:
        """Allocate each (name, bytes) of ``entries`` as ``{group}.{name}`` in ``group`` (a layer's saved
        activations, freed by :meth:`free_group` in its backward)."""
        for name, nbytes in entries:
            self.alloc(f"{group}.{name}", nbytes, kind, group=group)

    def free_each(self, prefix: str, count: int) -> None:
        """Free ``{prefix}#0`` … ``{prefix}#{count − 1}``."""
        for i in range(count):
            self.free(f"{prefix}#{i}")

    def free_group(self, group: str) -> None:
        for name in self.groups.pop(group, []):
            self.free(name)

    def free_group_but(self, group: str, nbytes: int) -> str | None:
        """Free ``group`` but its first live member of ``nbytes`` (rounded), whose name is returned (None:
        no such member, all freed): a tensor a variable still holds after its list is cleared."""
        size = self.rounded(nbytes)
        members = self.groups.pop(group, [])
        kept = next((name for name in members if self.live.get(name) == size), None) if size else None
        for name in members:
            if name != kept:
                self.free(name)
        return kept

    def rename(self, old: str, new: str, kind: str | None = None) -> None:
        """The same storage under another name (a view takes over, a variable is rebound)."""
        if old not in self.live:
            return
        size = self.live.pop(old)
        old_kind = self.kinds.pop(old)
        self.live[new] = size
        self.kinds[new] = kind or old_kind
        for members in self.groups.values():
            if old in members:
                members[members.index(old)] = new
        if self.record:
            self.by_kind[old_kind] -= size
            self.by_kind[self.kinds[new]] = self.by_kind.get(self.kinds[new], 0) + size
            self.log.append(Alloc(new, 0, "rename:" + old))

    def has(self, name: str) -> bool:
        return name in self.live

    def event(self, name: str, transient: int = 0, transient_kind: str = "transient") -> None:
        """Record the allocated total here, with an unnamed transient alive only at this point."""
        extra = self.rounded(transient)
        allocated = self.total + extra
        self.events.append(Event(self.phase, name, allocated))
        if allocated > self._peak.get(self.phase, -1):
            self._peak[self.phase] = allocated
            by_kind = {kind: size for kind, size in self.by_kind.items() if size}
            if extra:
                by_kind[transient_kind] = by_kind.get(transient_kind, 0) + extra
            self.peak_live[self.phase] = by_kind
        if extra:
            self._transients += 1
            transient_name = f"during {name} #{self._transients}"
            self.log.append(Alloc(transient_name, extra, "default", transient_kind))
        self.marks.append(len(self.log))
        if extra:
            self.log.append(Free(transient_name))

    def clear_events(self) -> None:
        """Forget the events so far (the live tensors stay): what follows is measured afresh."""
        self.events = []
        self.marks = []
        self._peak = {}
        self.peak_live = {}

    def phase_peak(self, phase: str) -> Event:
        """The first event of ``phase`` with the largest allocated total."""
        return max((e for e in self.events if e.phase == phase), key=lambda e: e.allocated)
