"""The predicted step as a PyTorch memory snapshot (pure: plain dicts and lists, no torch).

``torch.cuda.memory._snapshot()`` returns ``{"segments": [...], "device_traces": [[...]]}``: the caching
allocator's segments at the moment of the snapshot, each with its blocks in address order, and per device
the trace of what happened since ``_record_memory_history`` was enabled (``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``, ``segment_map``), each with an address, a size, a stream and the
allocating code's frames. ``torch/cuda/_memory_viz.py`` (``trace_plot``, ``segment_plot``) embeds it in a
page whose ``MemoryViz.js`` (``torch/utils/viz``) rebuilds the allocated total over the trace from the
segments' allocated blocks and the trace's ``alloc`` / ``free_completed`` entries (``process_alloc_data``).

Here the trace is the measured step of :func:`~zerocalc.peak.simulate.simulate` (a steady step, after model
creation and two steps), replayed through :class:`~zerocalc.peak.allocator.CachingAllocator` with
addresses: each segment gets its own range, a tensor's address is its segment's plus its block's offset.
An allocation's size is the ledger's (the request rounded up to 512 B), so the total MemoryViz rebuilds is
the allocated total the step's events report; a frame names the tensor and its kind.
"""

from __future__ import annotations

from typing import Any

from zerocalc.parallel.strategies import STRATEGIES, StrategyName
from zerocalc.peak.allocator import ROUND_LARGE, CachingAllocator
from zerocalc.peak.ledger import Alloc, Free
from zerocalc.peak.simulate import StepResult, runtime_for, simulate
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.request.training import TrainingRequest

FIRST_ADDRESS = 0x7F00_0000_0000
"""Where the first segment starts (a device address as CUDA hands them out on x86-64)."""
EXPANDABLE_RANGE = 1 << 40
"""The virtual range each expandable segment may grow into (torch reserves the device's memory)."""

Snapshot = dict[str, Any]


def _frames(kind: str, name: str) -> list[dict[str, Any]]:
    return [{"filename": kind, "line": 0, "name": name}]


class RecordingAllocator(CachingAllocator):
    """The caching allocator, with an address per segment and a trace of the measured step in the
    snapshot's vocabulary."""

    def __init__(self, expandable: bool = False):
        super().__init__(expandable)
        self.addresses: list[int] = []
        self.requests: dict[tuple[int, int], tuple[int, list[dict[str, Any]]]] = {}
        """Per allocated block, the size asked for and the frames naming the tensor."""
        self.streams: dict[str, int] = {"default": 0}
        self.trace: list[dict[str, Any]] = []
        self.recording = False
        self._next_address = FIRST_ADDRESS
        self._kind = ""

    def measured_step_begins(self) -> None:
        self.recording = True

    def stream_id(self, stream: str) -> int:
        return self.streams.setdefault(stream, len(self.streams))

    def _record(self, action: str, address: int, size: int, stream: str, frames: list) -> None:
        if self.recording:
            self.trace.append(
                {"action": action, "addr": address, "size": size, "stream": self.stream_id(stream),
                 "frames": frames}
            )  # fmt: skip

    def _place(self, index: int, span: int) -> None:
        while len(self.addresses) <= index:
            self.addresses.append(self._next_address)
            self._next_address += span

    def _new_segment(self, size: int, stream: str, small: bool, pool: list) -> None:
        super()._new_segment(size, stream, small, pool)
        index = len(self.segments) - 1
        segment_size = self.segments[index][0]
        self._place(index, -(-segment_size // ROUND_LARGE) * ROUND_LARGE)
        self._record("segment_alloc", self.addresses[index], segment_size, stream, [])

    def _grow(self, size: int, stream: str, small: bool, pool: list) -> None:
        index = self.expand_segment.get((stream, small), len(self.segments))
        before = self.segments[index][0] if index < len(self.segments) else 0
        super()._grow(size, stream, small, pool)
        self._place(index, EXPANDABLE_RANGE)
        grown = self.segments[index][0] - before
        self._record("segment_map", self.addresses[index] + before, grown, stream, [])

    def malloc(self, name: str, size: int, stream: str) -> None:
        super().malloc(name, size, stream)
        index, offset = self.handles[name]
        frames = _frames(self._kind, name)
        self.requests[(index, offset)] = (size, frames)
        self._record("alloc", self.addresses[index] + offset, size, stream, frames)

    def free(self, name: str) -> None:
        index, offset = self.handles[name]
        size, frames = self.requests.pop((index, offset))
        stream = self.segments[index][1]
        address = self.addresses[index] + offset
        self._record("free_requested", address, size, stream, frames)
        super().free(name)
        self._record("free_completed", address, size, stream, frames)

    def replay(self, log: list[Alloc | Free]) -> None:
        for op in log:
            if isinstance(op, Alloc):
                self._kind = str(op.kind)  # a plain str: the pickle must load without zerocalc
            super().replay([op])

    def segments_now(self) -> list[dict[str, Any]]:
        """Every segment and its blocks in address order, as ``_snapshot()`` lists them."""
        segments = []
        for index, (total, stream, small) in enumerate(self.segments):
            blocks = []
            for offset in self.offsets[index]:
                size, free = self.blocks[(index, offset)]
                requested, frames = (0, []) if free else self.requests[(index, offset)]
                blocks.append(
                    {"address": self.addresses[index] + offset, "size": size, "requested_size": requested,
                     "state": "inactive" if free else "active_allocated", "frames": frames}
                )  # fmt: skip
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            segments.append(
                {
                    "device": 0,
                    "address": self.addresses[index],
                    "total_size": total,
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": sum(b["requested_size"] for b in blocks),
                    "stream": self.stream_id(stream),
                    "segment_type": "small" if small else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": self.expandable,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return segments


def predicted_snapshot(request: TrainingRequest, name: StrategyName) -> tuple[Snapshot, StepResult]:
    """The snapshot ``torch.cuda.memory._snapshot()`` would return after the measured step of ``name``
    under ``request``, had history been recorded from that step's start; and the simulated step."""
    states, _ = STATE_BUILDERS[request.framework_record.states](request, STRATEGIES[name])
    allocator = RecordingAllocator(expandable=request.expandable_segments)
    result = simulate(request, name, runtime_for(request), states, allocator=allocator)
    return {"segments": allocator.segments_now(), "device_traces": [allocator.trace]}, result
