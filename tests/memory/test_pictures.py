"""Pictures of the step: the terminal chart of ``memory --timeline`` and the PyTorch memory snapshot of
``--snapshot-out``, rendered by PyTorch's own ``torch.cuda._memory_viz``."""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc import estimate_peak
from zerocalc.base.units import ByteUnit
from zerocalc.cli import app
from zerocalc.peak.kinds import StepPhase
from zerocalc.peak.report import TimelineEvent
from zerocalc.render.timeline import timeline_lines

runner = CliRunner()
GiB = 2**30


def _event(phase: str, name: str, allocated_gib: int, reserved_gib: int | None = 8) -> TimelineEvent:
    return TimelineEvent(
        phase=StepPhase(phase),
        event=name,
        allocated_bytes=allocated_gib * GiB,
        reserved_bytes=None if reserved_gib is None else reserved_gib * GiB,
    )


HAND_MADE = [
    _event("start", "start", 2),
    _event("forward", "layer 0 forward", 4),
    _event("forward", "loss forward", 6),
    _event("backward", "loss backward", 7),
    _event("backward", "layer 0 backward", 5),
    _event("optimizer", "zero_grad", 3),
]


def _plot_columns(lines: list[str], height: int) -> tuple[int, list[str]]:
    """Where the plot starts in each line, and the plot's columns top to bottom as strings."""
    start = lines[0].index("┤") + 1
    rows = [line[start:] for line in lines[:height]]
    return start, ["".join(row[c] for row in rows) for c in range(len(rows[0]))]


def test_the_chart_of_a_hand_made_timeline() -> None:
    """Eight rows of 1 GiB each (reserved, 8 GiB, is the top): a column's full cells are its GiB
    allocated, the reserved line is the top row, the peak (7 GiB, the fourth event) is marked under the
    first column of its event, and each phase is named where it starts."""
    lines = timeline_lines(HAND_MADE, ByteUnit.GiB, width=80, height=8)
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("8.00 GiB ┤") and lines[4].startswith("4.00 GiB ┤")
    start, columns = _plot_columns(lines, 8)
    assert len(columns) == 80 - start
    # 74 columns over 6 events: event i covers the columns c with c·6 // 74 == i
    owner = [c * 6 // len(columns) for c in range(len(columns))]
    for c, column in enumerate(columns):
        allocated = HAND_MADE[owner[c]].allocated_bytes // GiB
        assert column == "─" + " " * (7 - allocated) + "█" * allocated, (c, column)
    axis = lines[8]
    assert axis.startswith("   0 GiB └") and axis.count("▲") == 1
    assert axis.index("▲") - start == owner.index(3)
    # each phase's first column is ┴, but backward's: it starts at the peak, and ▲ wins
    assert [i - start for i, mark in enumerate(axis) if mark == "┴"] == [owner.index(e) for e in (0, 1, 5)]
    names = lines[9]
    for phase, first in (("start", 0), ("forward", 1), ("backward", 3), ("optimizer", 5)):
        assert names[start + owner.index(first) :].startswith(phase)
    legend = " ".join(lines[10:])
    assert legend.startswith("y: GiB per GPU; x: the step's 6 events in order, ┴ where a phase starts")
    assert "(start, forward, backward, optimizer)" in legend
    assert "▲ its peak: 7.00 GiB at backward: loss backward" in legend
    assert "reserved by the caching allocator: up to 8.00 GiB" in legend


def test_more_events_than_columns_keep_each_columns_largest() -> None:
    """200 events in 30 columns: every column shows the largest allocated of its events, so the peak
    (a single event) still reaches its height."""
    events = [_event("forward", f"e{i}", 1, 2) for i in range(200)]
    events[137] = _event("backward", "the peak", 2, 2)
    lines = timeline_lines(events, ByteUnit.GiB, width=36, height=4)
    start, columns = _plot_columns(lines, 4)
    tall = [c for c, column in enumerate(columns) if column.count("█") == 4]
    assert tall == [
        c for c in range(len(columns)) if c * 200 // len(columns) <= 137 < (c + 1) * 200 // len(columns)
    ]
    assert lines[4].index("▲") - start == tall[0]


def test_no_reserved_draws_allocated_only() -> None:
    lines = timeline_lines([_event("start", "start", 1, None), _event("forward", "f", 2, None)], ByteUnit.GiB)
    assert "─" not in "".join(lines[:12]) and "reserved" not in " ".join(lines)


def test_memory_timeline_draws_every_strategy_at_80_columns() -> None:
    result = runner.invoke(
        app,
        ["memory", "--model", "gpt2", "--gpus", "4", "--framework", "fsdp2", "--timeline"],
        env={"COLUMNS": "80"},
    )
    assert result.exit_code == 0, result.output
    report = estimate_peak("gpt2", 4, framework="fsdp2")
    assert report.peak is not None
    for row in report.peak.strategies:
        assert f"{row.title} ({row.strategy.value}): one training step" in result.stdout
        assert (
            f"{row.allocated_peak_bytes / GiB:.2f} GiB at {row.peak_phase.value}: {row.peak_event}"
            in " ".join(result.stdout.split())
        )
    axes = [line for line in result.stdout.splitlines() if "└" in line and line.count("▲") == 1]
    assert len(axes) == len(report.peak.strategies)
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7B", "--timeline"], "--timeline needs --model"),
        (["--params", "7B", "--snapshot-out", "x.pickle"], "--snapshot-out needs --model"),
        (["--model", "gpt2", "--timeline", "--json"], "--timeline draws on the terminal"),
        (["--model", "gpt2", "--gpus", "2", "--snapshot-out", "x.pickle"], "accepted: one strategy"),
        (["--model", "gpt2", "-s", "ddp", "--snapshot-out", "/"], "is a directory"),
    ],
)
def test_bad_picture_options_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["memory", *args])
    assert result.exit_code == 2
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_snapshot_never_replaces_a_file_that_is_not_regular(tmp_path: Path) -> None:
    """The atomic write renames over its target: a pipe (or a device such as /dev/null) is refused."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    result = runner.invoke(app, ["memory", "--model", "gpt2", "-s", "ddp", "--snapshot-out", str(pipe)])
    assert result.exit_code == 2 and "is not a regular file" in result.stderr
    assert stat.S_ISFIFO(pipe.stat().st_mode)


def _memory_viz_peak(snapshot: dict) -> tuple[int, int]:
    """The largest allocated total over the trace and the total at its end, rebuilt as the page
    ``trace_plot`` writes does it: ``process_alloc_data`` of torch/utils/viz/MemoryViz.js (PyTorch main),
    after ``annotate_snapshot`` elides each free_requested + free_completed pair into one ``free``.
    Elements are the trace's allocations, its frees of earlier allocations and the segments' allocated
    blocks no trace allocation accounts for (sized by ``requested_size``); each action adds or removes
    one element."""
    events: list[dict] = []
    for e in snapshot["device_traces"][0]:
        previous = events[-1] if events else None
        if (
            e["action"] == "free_completed"
            and previous
            and previous["action"] == "free_requested"
            and previous["addr"] == e["addr"]
        ):
            events[-1] = {**previous, "action": "free"}
            continue
        events.append(e)
    sizes: list[int] = []
    initially: list[int] = []
    actions: list[int] = []
    alive: dict[int, int] = {}
    for e in events:
        if e["action"] == "alloc":
            sizes.append(e["size"])
            alive[e["addr"]] = len(sizes) - 1
            actions.append(len(sizes) - 1)
        elif e["action"] in ("free", "free_completed"):
            if e["addr"] in alive:
                actions.append(alive.pop(e["addr"]))
            else:
                sizes.append(e["size"])
                initially.append(len(sizes) - 1)
                actions.append(len(sizes) - 1)
    for segment in snapshot["segments"]:
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and address not in alive:
                sizes.append(block["requested_size"])
                initially.append(len(sizes) - 1)
            address += block["size"]
    current = set(initially)
    total = sum(sizes[i] for i in current)
    largest = 0
    for element in actions:
        if element in current:
            current.remove(element)
            total -= sizes[element]
        else:
            current.add(element)
            total += sizes[element]
        largest = max(largest, total)
    return largest, total


def _format_size(n: float) -> str:
    """``torch.cuda._memory_viz._format_size``: how its ``stats`` prints a size."""
    for unit in ["", "Ki", "Mi", "Gi", "Ti"]:
        if abs(n) < 1024.0:
            return f"{n:3.1f}{unit}B"
        n /= 1024.0
    return f"{n:.1f}PiB"


def _viz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        ["--model", "gpt2", "--gpus", "4", "-s", "zero3", "--framework", "fsdp2"],
        ["--model", "gpt2", "--gpus", "2", "-s", "ddp", "--framework", "ddp", "--expandable-segments"],
    ],
    ids=["fsdp2-zero3", "ddp-expandable"],
)
def test_pytorchs_memory_viz_renders_the_predicted_snapshot(options: list[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "predicted.pickle"
    result = runner.invoke(app, ["memory", *options, "--snapshot-out", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert f"written to {path}" in result.stderr
    (row,) = json.loads(result.stdout)["peak"]["strategies"]
    assert b"zerocalc" not in path.read_bytes()  # plain dicts, lists, str and int: loads without zerocalc
    snapshot = pickle.loads(path.read_bytes())
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed"} <= actions
    assert all(e["frames"] and e["size"] > 0 for e in snapshot["device_traces"][0] if e["action"] == "alloc")

    # the page counts the requests; memory_allocated (the row) also the remainders of blocks handed out whole
    largest, at_end = _memory_viz_peak(snapshot)
    remainders = sum(t["bytes"] for t in row["terms"] if t["kind"] == "allocator block remainders")
    assert largest == row["allocated_peak_bytes"] - remainders
    blocks = [
        b for segment in snapshot["segments"] for b in segment["blocks"] if b["state"] == "active_allocated"
    ]
    assert (
        at_end + sum(b["size"] - b["requested_size"] for b in blocks)
        == row["timeline"][-1]["allocated_bytes"]
    )
    reserved = sum(segment["total_size"] for segment in snapshot["segments"])
    assert reserved == row["reserved_bytes"] == row["timeline"][-1]["reserved_bytes"]

    for plot in ("trace_plot", "segment_plot"):
        page = tmp_path / f"{plot}.html"
        done = _viz(plot, str(path), "-o", str(page))
        assert done.returncode == 0, done.stderr
        embedded = re.search(r'"base64": "([^"]+)"', page.read_text()).group(1)
        assert pickle.loads(base64.b64decode(embedded)) == snapshot  # what MemoryViz.js is given
    stats = _viz("stats", str(path))  # segsum: raises if a segment's blocks do not add up
    assert stats.returncode == 0, stats.stderr
    allocated_blocks = sum(
        block["requested_size"]
        for segment in snapshot["segments"]
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    )
    assert allocated_blocks == at_end
    assert f"total_allocated: {_format_size(at_end)}" in stats.stdout
    assert f"total_reserved: {_format_size(reserved)}" in stats.stdout
    trace = _viz("trace", str(path))
    assert trace.returncode == 0 and f"{len(snapshot['device_traces'][0])} entries" in trace.stdout
