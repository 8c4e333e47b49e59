"""``zerocalc comm --html FILE``: each strategy's time per collective and rank group per optimizer step
(the data-parallel collectives, and the tensor-, context- and expert-parallel ones of a mesh), and, with
--model, its step split into compute, exposed communication, the pipeline bubble and offload."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.render.html_page import Section, Table, base_layout, load_plotly, page_html

if TYPE_CHECKING:
    from zerocalc.comm.estimate import CommEstimate, StrategyComm

STRATEGY_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#bcbd22")
SPLIT = (
    ("compute", "compute_s", "#4c72b0"),
    ("exposed communication", "exposed_comm_s", "#dd8452"),
    ("pipeline bubble", "bubble_s", "#c44e52"),
    ("offload", "offload_s", "#8172b3"),
)
"""The parts of a step (:class:`zerocalc.comm.step.StepEstimate`: they sum to step_s), each with its field."""


def _collective_times(row: StrategyComm) -> dict[str, float]:
    """Seconds per step of each collective of ``row``, by ``op tensor (phase) · group of n``; the same
    collective run in two phases is two entries."""
    times: dict[str, float] = {}
    for cost in row.collectives:
        scales = " scales" if cost.scales else ""
        group = f"{cost.group.value} of {cost.group_size}"
        key = f"{cost.op.value} {cost.tensor.value}{scales} ({cost.phase.value}) · {group}"
        times[key] = times.get(key, 0.0) + cost.time_s
    for mesh_cost in row.mesh_collectives:
        again = ", recomputed" if mesh_cost.recomputed else ""
        key = (
            f"{mesh_cost.op.value} {mesh_cost.moves} ({mesh_cost.phase.value}{again}) · "
            f"{mesh_cost.dimension.value} of {mesh_cost.group_size}"
        )
        times[key] = times.get(key, 0.0) + mesh_cost.time_s
    return times


def comm_figure(estimate: CommEstimate) -> Any:
    """Left: seconds per collective and group, a bar per strategy; right: each strategy's step split."""
    go = load_plotly()
    from plotly.subplots import make_subplots

    rows = estimate.strategies
    steps = [row for row in rows if row.step is not None]
    times = [_collective_times(row) for row in rows]
    keys = list(dict.fromkeys(key for t in times for key in t))
    cols = 2 if steps else 1
    fig = make_subplots(
        rows=1,
        cols=cols,
        column_widths=[0.6, 0.4] if steps else [1.0],
        horizontal_spacing=0.1,
        subplot_titles=(
            "per collective and rank group",
            *(["the step, split"] if steps else []),
        ),
    )
    fig.update_layout(base_layout(go, 40 * max(len(keys), 4) + 320))
    for i, (row, row_times) in enumerate(zip(rows, times, strict=True)):
        fig.add_trace(
            go.Bar(
                y=keys,
                x=[row_times.get(key, 0.0) * 1e3 for key in keys],
                orientation="h",
                name=row.title,
                legendgroup="strategy",
                legendgrouptitle={"text": "strategy"},
                marker={"color": STRATEGY_COLOURS[i % len(STRATEGY_COLOURS)]},
                hovertemplate=f"{row.title}<br>" + "%{y}<br>%{x:.2f} ms per step<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for label, field, colour in SPLIT:
        values = [getattr(row.step, field) for row in steps]
        if not any(values):
            continue
        fig.add_trace(
            go.Bar(
                x=[row.title for row in steps],
                y=values,
                name=label,
                legendgroup="split",
                legendgrouptitle={"text": "step"},
                marker={"color": colour},
                hovertemplate=f"{label}: " + "%{y:.3f} s<extra>%{x}</extra>",
            ),
            row=1,
            col=2,
        )
    if steps:
        fig.add_trace(
            go.Scatter(
                x=[row.title for row in steps],
                y=[row.step.step_s for row in steps if row.step is not None],
                mode="text",
                text=[f"{row.step.step_s:.3f} s" for row in steps if row.step is not None],
                textposition="top center",
                showlegend=False,
                hoverinfo="skip",
            ),
            row=1,
            col=2,
        )
    fig.update_layout(
        barmode="group",
        title={"text": "communication and step time per optimizer step", "x": 0.01},
        xaxis={"title": {"text": "time per optimizer step (ms)"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True},
        legend={"y": -0.12},
    )
    if steps:
        fig.update_layout(
            xaxis2={"title": {"text": "strategy"}},
            yaxis2={"title": {"text": "time per optimizer step (s)"}, "rangemode": "tozero"},
        )
        fig.update_traces(selector={"legendgroup": "split"}, offsetgroup="split")
        _stack_split(fig)
    return fig


def _stack_split(fig: Any) -> None:
    """Stack the step's parts (the collectives beside them stay grouped): each part's base is the sum of
    the parts below it."""
    split = [trace for trace in fig.data if trace.legendgroup == "split"]
    bases = [0.0] * (len(split[0].y) if split else 0)
    for trace in split:
        trace.base = list(bases)
        bases = [b + y for b, y in zip(bases, trace.y, strict=True)]


def _table(estimate: CommEstimate) -> Table:
    rows = []
    for row in estimate.strategies:
        step = row.step
        cells = [row.title, f"{row.total_bytes_per_gpu / 2**30:.2f}", f"{row.time_s:.3f}"]
        if step is not None:
            cells += [f"{step.compute_s:.3f}", f"{step.exposed_comm_s:.3f}", f"{step.bubble_s:.3f}"]
            cells += [f"{step.offload_s:.3f}", f"{step.step_s:.3f}", f"{step.tokens_per_s_per_gpu:,.0f}"]
        else:
            cells += [""] * 6
        rows.append(cells)
    headers = ["Strategy", "Sent GiB/GPU", "Comm s", "Compute s", "Exposed s", "Bubble s", "Offload s"]
    return Table("Per strategy, per optimizer step", [*headers, "Step s", "tok/s/GPU"], rows)


def comm_sections(estimate: CommEstimate) -> tuple[list[Section], list[Table]]:
    return [Section(comm_figure(estimate))], [_table(estimate)]


def comm_page(estimate: CommEstimate) -> str:
    """``comm --html``'s page."""
    sections, tables = comm_sections(estimate)
    lead = (
        "Time per optimizer step of each collective (α + bytes / β per call, as comm's table), and the "
        "step (with --model): compute, the communication it does not hide, the pipeline bubble, offload."
    )
    request = estimate.request
    model = request.model or f"{request.params:,} parameters"
    title = f"zerocalc comm: {model}, {request.mesh.world} GPUs, {request.framework.value}"
    return page_html(title, lead, sections, tables, [*estimate.notes])
