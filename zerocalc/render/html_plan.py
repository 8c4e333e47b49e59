"""``zerocalc plan --html FILE``: every evaluated candidate as a point (step time against its peak per
GPU), the GPU's memory and the fit limit drawn, candidates that do not fit apart; hovering a point shows
its row, clicking it the ``memory`` and ``comm`` commands that reproduce it; then the top rows as ``plan``
prints them and the candidates left out, by reason."""

from __future__ import annotations

import html
import json
import math
from typing import TYPE_CHECKING, Any

from zerocalc.peak.evaluate import FIT_MARGIN
from zerocalc.render.html_page import Section, Table, base_layout, gib, load_plotly, page_html, wrapped
from zerocalc.render.plan import candidate_label, command

if TYPE_CHECKING:
    from zerocalc.plan.search import PlanResult, PlanRow

FRAMEWORK_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#bcbd22")
"""One colour per framework searched, in the order the plan lists them."""
LOG_TICKS = (1, 2, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240)
"""The memory axis' ticks (GiB): a GPU's memory sits between two of them."""
REJECTED_COLOUR = "#b0b0b0"
TOP_COLOUR = "#d62728"
FITTING = ("ranked", "fits", "not ranked")
"""The statuses of candidates whose peak is within the limit (exact, or only the lower bound)."""

CLICK_SCRIPT = """
var plot = document.getElementById('{plot_id}');
var detail = document.getElementById('{plot_id}-detail');
plot.on('plotly_click', function (data) {
  var point = data.points[0];
  if (point && point.customdata) { detail.textContent = point.customdata[1]; }
});
"""
"""Clicking a point puts its commands in the box under the figure, where they can be copied."""


def _peak(row: PlanRow) -> int:
    """The peak a point is drawn at: memory's exact peak_bytes, else the candidate's lower bound."""
    if row.peak_bytes is not None:
        return row.peak_bytes
    assert row.peak_lower_bound_bytes is not None
    return row.peak_lower_bound_bytes


def _peak_kind(row: PlanRow) -> str:
    return "exact peak" if row.peak_bytes is not None else "lower bound of the peak"


def _hover(row: PlanRow) -> str:
    label = candidate_label(row).replace("\n", " · ")
    lines = [
        f"<b>{html.escape(label)}</b>",
        f"status: {row.status.value}",
        f"peak: {gib(_peak(row)):.2f} GiB ({_peak_kind(row)})",
        f"step: {row.step_s:.3f} s (compute {row.compute_s:.3f}, exposed comm {row.exposed_comm_s:.3f}, "
        f"bubble {row.bubble_s:.3f}, offload {row.offload_s:.3f})",
        f"{row.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {row.mfu:.1%}",
        wrapped(command("memory", row.memory_options)),
        wrapped(command("comm", row.comm_options)),
    ]
    return "<br>".join(lines)


def _commands(row: PlanRow) -> str:
    label = candidate_label(row).replace("\n", " · ")
    return f"{label}\n{command('memory', row.memory_options)}\n{command('comm', row.comm_options)}"


def _points(go: Any, rows: list[PlanRow], name: str, marker: dict[str, Any], **extra: Any) -> Any:
    return go.Scatter(
        x=[gib(_peak(r)) for r in rows],
        y=[r.step_s for r in rows],
        mode="markers",
        name=name,
        marker=marker,
        customdata=[[_hover(r), _commands(r)] for r in rows],
        hovertemplate="%{customdata[0]}<extra></extra>",
        **extra,
    )


def plan_figure(result: PlanResult) -> Any:
    """The candidates' scatter: x the peak per GPU (GiB), y the step (s)."""
    go = load_plotly()
    request = result.request
    rows = result.candidates if result.candidates is not None else result.top
    fig = go.Figure(layout=base_layout(go, 560))
    rejected = [r for r in rows if r.status.value not in FITTING]
    if rejected:
        fig.add_trace(
            _points(
                go,
                rejected,
                f"does not fit or tight ({len(rejected):,})",
                {"symbol": "x-thin", "size": 7, "line": {"width": 1.5, "color": REJECTED_COLOUR}},
            )
        )
    for i, framework in enumerate(request.frameworks):
        mine = [r for r in rows if r.framework is framework and r.status.value in FITTING and r.rank is None]
        if not mine:
            continue
        colour = FRAMEWORK_COLOURS[i % len(FRAMEWORK_COLOURS)]
        fig.add_trace(
            _points(
                go,
                mine,
                f"{framework.value} ({len(mine):,})",
                {
                    "size": 8,
                    "color": colour,
                    "symbol": ["circle" if r.peak_bytes is not None else "circle-open" for r in mine],
                    "line": {"width": 1.2, "color": colour},
                    "opacity": 0.8,
                },
            )
        )
    top = sorted((r for r in rows if r.rank is not None), key=lambda r: r.rank or 0)
    if top:
        fig.add_trace(
            _points(
                go,
                top,
                f"top {len(top)} (numbered)",
                {"symbol": "star", "size": 15, "color": TOP_COLOUR, "line": {"width": 1, "color": "#222"}},
                text=[str(r.rank) for r in top],
                textposition="top center",
                textfont={"size": 13, "color": TOP_COLOUR},
            )
        )
        fig.data[-1].mode = "markers+text"
    memory = gib(request.gpu_memory_bytes)
    limits = (
        (memory, f"{request.gpu}: {memory:.1f} GiB", "solid", 2, 1.0, "left"),
        (memory * (1 - FIT_MARGIN), f"fit limit ({1 - FIT_MARGIN:.0%})", "dash", 1, 0.0, "right"),
    )
    for x, text, dash, width, y, side in limits:
        fig.add_shape(
            type="line",
            x0=x,
            x1=x,
            y0=0,
            y1=1,
            yref="paper",
            line={"color": "#222", "width": width, "dash": dash},
        )
        fig.add_annotation(  # on a log axis an annotation's x is the exponent
            x=math.log10(x),
            y=y,
            yref="paper",
            text=text,
            textangle=-90,
            showarrow=False,
            xanchor=side,
            yanchor="top" if y else "bottom",
            font={"size": 12},
        )
    peaks = [gib(_peak(r)) for r in rows] + [memory]
    ticks = [t for t in LOG_TICKS if min(peaks) / 2 <= t <= max(peaks) * 2]
    fig.update_layout(
        title={"text": f"{len(rows):,} candidates: step time against peak memory per GPU", "x": 0.01},
        xaxis={"title": {"text": "peak memory per GPU (GiB, log scale)"}, "type": "log", "tickvals": ticks},
        yaxis={"title": {"text": "step time (s)"}, "rangemode": "tozero"},
        legend={"orientation": "v", "y": 1.0, "yanchor": "top", "x": 1.02, "xanchor": "left"},
        margin={"r": 200},
    )
    return fig


def _top_table(result: PlanResult) -> Table:
    rows = [
        [
            candidate_label(r),
            f"{gib(r.peak_bytes or 0):.2f}",
            f"{gib(r.headroom_bytes or 0):.2f}",
            f"{r.step_s:.3f}",
            f"{r.exposed_comm_s:.3f}",
            f"{r.tokens_per_s_per_gpu:,.0f}",
            f"{r.mfu:.1%}",
            f"{command('memory', r.memory_options)}\n{command('comm', r.comm_options)}",
        ]
        for r in result.top
    ]
    headers = ["Configuration", "Peak GiB", "Free GiB", "Step s", "Exposed comm s", "tok/s/GPU", "MFU"]
    return Table("Top configurations", [*headers, "Reproduce"], rows, frozenset({0}), frozenset({7}))


def _rejections_table(result: PlanResult) -> Table:
    rows = [[f"{r.candidates:,}", r.reason] for r in result.rejections]
    return Table("Left out (candidates, reason)", ["Candidates", "Reason"], rows, frozenset({1}))


def plan_sections(result: PlanResult) -> tuple[list[Section], list[Table]]:
    """The plan's figure (with its click-to-copy box) and its tables."""
    detail = "Click a point: its row and the memory and comm commands that reproduce it appear here."
    return [Section(plan_figure(result), CLICK_SCRIPT, detail)], [
        _top_table(result),
        _rejections_table(result),
    ]


def plan_page(result: PlanResult) -> str:
    """``plan --html``'s page."""
    sections, tables = plan_sections(result)
    request = result.request
    lead = (
        f"Global batch {request.global_batch_tokens:,} tokens ({request.global_batch_sequences:,} × "
        f"{request.seq_len:,}), objective {request.objective.value}. Filled: exact peak; open: its lower "
        "bound (not evaluated exactly); ×: does not fit or tight. Hover a point for its row, click it for "
        "its commands."
    )
    notes = [*result.assumptions]
    if result.options is not None:
        notes.insert(0, "options: " + json.dumps(result.options))
    title = f"zerocalc plan: {request.model} on up to {request.max_gpus} × {request.gpu}"
    return page_html(title, lead, sections, tables, notes)
