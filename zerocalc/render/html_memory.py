"""``zerocalc memory --model … --html FILE``: per strategy, the peak per GPU as stacked bars of what is
alive at it (each tensor kind of the step's ledger, then the caching allocator's reserve and the CUDA
context with the NCCL communicators) against the GPU's memory; and the step's allocated and reserved
memory over its events (the timeline ``--timeline`` draws), coloured by phase, its peak marked, one
strategy at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.peak.evaluate import FIT_MARGIN
from zerocalc.peak.kinds import TensorKind
from zerocalc.render.html_page import Section, Table, base_layout, gib, load_plotly, page_html

if TYPE_CHECKING:
    from zerocalc.peak.report import MemoryReport, StrategyPeak, TimelineEvent

KIND_COLOURS = {
    TensorKind.PARAMETERS: "#1f77b4",
    TensorKind.GATHERED: "#aec7e8",
    TensorKind.GRADIENTS: "#2ca02c",
    TensorKind.REDUCTION: "#98df8a",
    TensorKind.OPTIMIZER_STATES: "#9467bd",
    TensorKind.OPTIMIZER_TEMPORARIES: "#c5b0d5",
    TensorKind.ACTIVATIONS: "#ff7f0e",
    TensorKind.LOSS: "#d62728",
    TensorKind.INPUTS: "#8c564b",
    TensorKind.RUNTIME: "#e377c2",
    TensorKind.BUFFERS: "#17becf",
    TensorKind.PIPELINE: "#bcbd22",
    TensorKind.TRANSIENT: "#ffbb78",
    TensorKind.BLOCK_REMAINDERS: "#c49c94",
}
"""A colour per tensor kind (every kind has one: tests/render checks it)."""
RESERVE = ("allocator reserve", "#7f7f7f")
"""Reserved by the caching allocator beyond the allocated peak."""
CONTEXT = ("CUDA context + NCCL", "#c7c7c7")
PHASE_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#d9d9d9")
"""The timeline's area, by phase in the order the step runs them."""


def _stack(row: StrategyPeak) -> list[tuple[str, str, int]]:
    """What makes up ``row``'s peak_bytes: its terms by kind, the allocator's reserve, the context."""
    by_kind: dict[TensorKind, int] = {}
    for term in row.terms:
        by_kind[term.kind] = by_kind.get(term.kind, 0) + term.bytes
    stack = [(kind.value, KIND_COLOURS[kind], by_kind[kind]) for kind in TensorKind if kind in by_kind]
    stack.append((*RESERVE, row.allocator_reserve_bytes))
    stack.append((*CONTEXT, row.context_bytes + row.nccl_bytes))
    return stack


def _phase_runs(events: list[TimelineEvent]) -> list[tuple[str, int, int]]:
    """The phases of the timeline as (phase, first event, last event), in order."""
    runs: list[tuple[str, int, int]] = []
    for i, event in enumerate(events):
        if runs and runs[-1][0] == event.phase.value:
            runs[-1] = (runs[-1][0], runs[-1][1], i)
        else:
            runs.append((event.phase.value, i, i))
    return runs


def _timeline_traces(go: Any, row: StrategyPeak, visible: bool) -> list[Any]:
    events = row.timeline
    traces = []
    colours = {}
    for phase, first, last in _phase_runs(events):
        colour = colours.setdefault(phase, PHASE_COLOURS[len(colours) % len(PHASE_COLOURS)])
        end = min(last + 1, len(events) - 1)  # joined to the next phase's first event
        span = range(first, end + 1)
        traces.append(
            go.Scatter(
                x=list(span),
                y=[gib(events[i].allocated_bytes) for i in span],
                mode="lines",
                fill="tozeroy",
                line={"color": colour, "width": 1, "shape": "hv"},
                fillcolor=colour,
                name=f"allocated: {phase}",
                legendgroup=f"phase {phase}",
                showlegend=phase not in [t.name.removeprefix("allocated: ") for t in traces],
                customdata=[[events[i].phase.value, events[i].event] for i in span],
                hovertemplate="%{customdata[0]}: %{customdata[1]}<br>allocated %{y:.2f} GiB<extra></extra>",
                visible=visible,
                xaxis="x2",
                yaxis="y2",
            )
        )
    if all(e.reserved_bytes is not None for e in events):
        traces.append(
            go.Scatter(
                x=list(range(len(events))),
                y=[gib(e.reserved_bytes or 0) for e in events],
                mode="lines",
                line={"color": "#333", "width": 2, "shape": "hv"},
                name="reserved",
                hovertemplate="reserved %{y:.2f} GiB<extra></extra>",
                visible=visible,
                xaxis="x2",
                yaxis="y2",
            )
        )
    allocated = [e.allocated_bytes for e in events]
    peak = allocated.index(max(allocated))
    traces.append(
        go.Scatter(
            x=[peak],
            y=[gib(allocated[peak])],
            mode="markers+text",
            marker={"symbol": "triangle-down", "size": 14, "color": "#d62728"},
            text=[f"peak {gib(allocated[peak]):.2f} GiB"],
            textposition="top center",
            name="allocated peak",
            hovertemplate=f"peak: {events[peak].phase.value}: {events[peak].event}<br>"
            "%{y:.2f} GiB<extra></extra>",
            visible=visible,
            xaxis="x2",
            yaxis="y2",
        )
    )
    return traces


def memory_figure(report: MemoryReport) -> Any:
    """The stacked peaks (left) and the timeline of one strategy, chosen by a menu (right)."""
    go = load_plotly()
    from plotly.subplots import make_subplots

    assert report.peak is not None
    rows = report.peak.strategies
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.38, 0.62],
        horizontal_spacing=0.08,
        subplot_titles=("the peak, by what is alive at it", "one step: allocated and reserved"),
    )
    fig.update_layout(base_layout(go, 580))
    names = [row.title for row in rows]
    stacks = [_stack(row) for row in rows]
    present = {label for stack in stacks for label, _, _ in stack}
    labels = [label for label in [*(k.value for k in TensorKind), RESERVE[0], CONTEXT[0]] if label in present]
    colours = {label: colour for stack in stacks for label, colour, _ in stack}
    for label in labels:
        values = [next((b for name, _, b in stack if name == label), 0) for stack in stacks]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[gib(v) for v in values],
                name=label,
                marker={"color": colours[label]},
                legendgroup="peak",
                legendgrouptitle={"text": "at the peak"},
                hovertemplate=f"{label}: " + "%{y:.2f} GiB<extra>%{x}</extra>",
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=names,
            y=[gib(row.peak_bytes) for row in rows],
            mode="text",
            text=[f"{gib(row.peak_bytes):.1f}" for row in rows],
            textposition="top center",
            showlegend=False,
            hoverinfo="skip",
        ),
        row=1,
        col=1,
    )
    gpu_memory = report.peak.options.gpu_memory_bytes
    if gpu_memory is not None:
        fig.add_hline(
            y=gib(gpu_memory),
            line={"color": "#222", "width": 2},
            annotation={"text": f"GPU memory {gib(gpu_memory):.1f} GiB", "font": {"size": 12}},
            annotation_position="top left",
            row=1,
            col=1,
        )
        fig.add_hline(
            y=gib(gpu_memory) * (1 - FIT_MARGIN),
            line={"color": "#222", "width": 1, "dash": "dash"},
            annotation={"text": f"fit limit {1 - FIT_MARGIN:.0%}", "font": {"size": 11}},
            annotation_position="bottom left",
            row=1,
            col=1,
        )
    fixed = len(fig.data)
    counts = []
    for i, row in enumerate(rows):
        traces = _timeline_traces(go, row, visible=i == 0)
        counts.append(len(traces))
        for trace in traces:
            fig.add_trace(trace, row=1, col=2)
    buttons = []
    for i, row in enumerate(rows):
        visible = [True] * fixed
        for j, count in enumerate(counts):
            visible += [i == j] * count
        buttons.append(
            {"label": f"timeline: {row.title}", "method": "update", "args": [{"visible": visible}]}
        )
    fig.update_layout(
        barmode="stack",
        title={"text": "memory per GPU", "x": 0.01},
        legend={
            "orientation": "v",
            "y": 1.0,
            "yanchor": "top",
            "x": 1.02,
            "xanchor": "left",
            "font": {"size": 11},
            "tracegroupgap": 8,
        },
        margin={"r": 230, "t": 80},
        updatemenus=[
            {"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.08, "yanchor": "bottom", "active": 0}
        ]
        if len(rows) > 1
        else [],
        yaxis={"title": {"text": "memory per GPU (GiB)"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "memory per GPU (GiB)"}, "rangemode": "tozero"},
        xaxis2={"title": {"text": "the step's events, in order"}},
    )
    return fig


def _title(report: MemoryReport) -> str:
    assert report.peak is not None
    options = report.peak.options
    model = report.model.title or report.model.name
    return (
        f"{model}, {options.framework.value}, b = {options.micro_batch}, s = {options.seq_len:,}, "
        f"A = {options.grad_accum}" + (f", on {report.gpu.title}" if report.gpu is not None else "")
    )


def _peak_table(report: MemoryReport) -> Table:
    assert report.peak is not None
    rows = []
    for row in report.peak.strategies:
        verdict = row.verdict.value if row.verdict is not None else ""
        rows.append(
            [
                f"{row.title} ({row.strategy.value})",
                f"{gib(row.allocated_peak_bytes):.2f}",
                f"{gib(row.reserved_bytes):.2f}",
                f"{gib(row.peak_bytes):.2f}",
                f"{gib(row.headroom_bytes):.2f}" if row.headroom_bytes is not None else "",
                verdict,
                f"{row.peak_phase.value}: {row.peak_event}",
            ]
        )
    headers = ["Strategy", "Allocated GiB", "Reserved GiB", "Peak GiB", "Free GiB", "Verdict", "Peak at"]
    return Table("Peak per GPU", headers, rows, frozenset({0, 5, 6}))


def memory_sections(report: MemoryReport) -> tuple[list[Section], list[Table]]:
    return [Section(memory_figure(report))], [_peak_table(report)]


def memory_page(report: MemoryReport) -> str:
    """``memory --html``'s page."""
    sections, tables = memory_sections(report)
    assert report.peak is not None
    lead = (
        "Peak: the step's allocated peak, the caching allocator's reserve above it, and the CUDA context "
        "and NCCL communicators outside it (memory's peak_bytes). The timeline: allocated (area, by phase) "
        "and reserved (line) after each event of one step; the menu picks the strategy."
    )
    return page_html(f"zerocalc memory: {_title(report)}", lead, sections, tables, [*report.peak.notes])
