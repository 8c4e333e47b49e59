"""The step's timeline as a text chart: allocated (bars) and reserved (a line) over the events, the
phases along the bottom and the peak marked (``zerocalc memory --model … --timeline``); the y axis is
labelled in its unit and the legend says what each axis is."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from zerocalc.base.units import ByteUnit, format_bytes

if TYPE_CHECKING:
    from zerocalc.peak.report import TimelineEvent

BARS = " ▁▂▃▄▅▆▇█"
"""A cell filled by eighths, from empty to full."""
RESERVED = "─"
PEAK = "▲"
PHASE_START = "┴"
TIMELINE_HEIGHT = 12
"""Rows of the chart."""
TIMELINE_WIDTH = 80


def _buckets(events: int, columns: int) -> list[range]:
    """The events each column shows: consecutive, every event in exactly one column when there are more
    events than columns, each event over one or more columns otherwise."""
    return [
        range(c * events // columns, max((c + 1) * events // columns, c * events // columns + 1))
        for c in range(columns)
    ]


def timeline_lines(
    events: Sequence[TimelineEvent],
    unit: ByteUnit,
    width: int = TIMELINE_WIDTH,
    height: int = TIMELINE_HEIGHT,
) -> list[str]:
    """The chart of ``events`` in ``width`` columns and ``height`` rows, then its axis, the phases and a
    legend naming the peak (the first event with the largest allocated total) and what is reserved."""
    if not events:
        return []
    allocated = [e.allocated_bytes for e in events]
    reserved = [e.reserved_bytes for e in events]
    has_reserved = all(r is not None for r in reserved)
    top = max(max(allocated), *(r or 0 for r in reserved)) or 1
    labels = {  # the y axis in its unit: bytes per GPU
        0: f"{format_bytes(top, unit)} {unit.value}",
        height // 2: f"{format_bytes(top * (height - height // 2) // height, unit)} {unit.value}",
    }
    label_width = max(len(label) for label in labels.values()) + 1
    columns = max(1, width - label_width - 1)
    buckets = _buckets(len(events), columns)
    peak = allocated.index(max(allocated))
    peak_column = next(c for c, bucket in enumerate(buckets) if peak in bucket)

    grid = [[" "] * columns for _ in range(height)]
    for c, bucket in enumerate(buckets):
        level = max(allocated[i] for i in bucket) * height / top
        for row in range(height):
            fill = min(max(level - (height - 1 - row), 0.0), 1.0)
            grid[row][c] = BARS[round(fill * 8)]
        if has_reserved:
            value = max(reserved[i] or 0 for i in bucket)
            row = height - 1 - min(height - 1, int(value * height / top))
            if grid[row][c] == " ":
                grid[row][c] = RESERVED

    lines = []
    for row in range(height):
        label = labels.get(row, "")
        lines.append(f"{label:>{label_width - 1}} {'┤' if label else '│'}{''.join(grid[row])}")

    phase_starts: dict[int, str] = {}
    for i, event in enumerate(events):
        if i == 0 or event.phase != events[i - 1].phase:
            column = next(c for c, bucket in enumerate(buckets) if i in bucket)
            phase_starts.setdefault(column, event.phase.value)
    axis = ["─"] * columns
    for column in phase_starts:
        axis[column] = PHASE_START
    axis[peak_column] = PEAK
    lines.append(f"{'0 ' + unit.value:>{label_width - 1}} └{''.join(axis)}")

    names = [" "] * columns
    starts = sorted(phase_starts)
    for k, column in enumerate(starts):
        room = (starts[k + 1] if k + 1 < len(starts) else columns) - column - 1
        name = phase_starts[column][: max(room, 1)]
        names[column : column + len(name)] = name
    lines.append(" " * (label_width + 1) + "".join(names).rstrip())

    peak_event = events[peak]
    phases = ", ".join(dict.fromkeys(event.phase.value for event in events))
    legend = (
        f"y: {unit.value} per GPU; x: the step's {len(events)} events in order, "
        f"{PHASE_START} where a phase starts ({phases}); {BARS[-1]} allocated, {PEAK} its peak: "
        f"{format_bytes(peak_event.allocated_bytes, unit)} {unit.value} at {peak_event.phase.value}: "
        f"{peak_event.event}"
    )
    if has_reserved:
        most = format_bytes(max(r or 0 for r in reserved), unit)
        legend += f"; {RESERVED} reserved by the caching allocator: up to {most} {unit.value}"
    lines += textwrap.wrap(legend, width, break_long_words=False, break_on_hyphens=False)
    return lines
