"""The tables of ``zerocalc comm``: each strategy's collectives per optimizer step, then a summary per
strategy (printed by the CLI, and by the results' display in a notebook or on a Rich console)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerocalc.base.units import ByteUnit, format_bandwidth, format_count, format_seconds, format_size, plural
from zerocalc.compute.ops import MFU_FORMULA
from zerocalc.network.cluster import RankGroup
from zerocalc.network.links import BandwidthSource
from zerocalc.network.schedule import GradSync, Tensor
from zerocalc.parallel.mesh import describe_layer_counts
from zerocalc.render.tables import (
    COLLECTIVE_LEGEND,
    OP_SHORT,
    PHASE_SHORT,
    STEP_TIME_ACCURACY,
    Column,
    Output,
    byte_cell,
    byte_text,
    collective_label,
    compact_table,
    print_fitted,
    print_phrases,
    unit_label,
)

if TYPE_CHECKING:
    from rich.table import Table

    from zerocalc.comm.estimate import CollectiveCost, CommEstimate, DimensionComm, StrategyComm
    from zerocalc.comm.mesh import MeshCollectiveCost
    from zerocalc.comm.pipeline import PipelineComm, PipelineLink
    from zerocalc.network.links import LinkFigures


def _figure_line(label: str, link: LinkFigures) -> str:
    return (
        f"{label}: {format_bandwidth(link.bus_bandwidth_Bps)} bus bandwidth, "
        f"α = {format_seconds(link.latency_s)} ({link.detail})"
    )


def _label(c: CollectiveCost) -> str:
    return collective_label(c.op.value, c.phase.value)


def _tensor(c: CollectiveCost) -> str:
    what = "scales" if c.scales else ("params" if c.tensor is Tensor.PARAMETERS else "grads")
    return f"{what} {c.dtype.value}"


def _group(c: CollectiveCost, mesh_run: bool = False) -> str:
    """``world 16*``; in a mesh the data-parallel group is the dp × cp ranks of one TP index: ``dp 8*``."""
    kind = "across" if c.group is RankGroup.ACROSS_NODES else c.group.value
    if mesh_run and c.group is RankGroup.WORLD:
        kind = "dp"
    return f"{kind} {c.group_size}{'*' if c.spans_nodes else ''}"


BETA_FROM = {
    BandwidthSource.CALIBRATION: "fit",
    BandwidthSource.EXPLICIT: "flag",
    BandwidthSource.GPU_PRESET: "preset",
    BandwidthSource.DEFAULT: "default",
}
"""Where a row's β came from, in its column."""
BETA_LEGEND = (
    "β from: fit, the calibration's fit; flag, --intra-node-bw/--inter-node-bw; preset, the --gpu preset's; "
    "default, the stated default below"
)


def _strategy_table(row: StrategyComm, unit: ByteUnit, mesh_run: bool = False) -> Table:
    """The data-parallel collectives of a strategy, with their totals."""
    costs = row.collectives
    table = compact_table(
        ("collective", False, "total"),
        ("tensor", False, ""),
        ("group", False, ""),
        ("calls", True, f"{sum(c.calls_per_step for c in costs):,}"),
        ("sent/GPU", True, byte_cell(sum(c.total_bytes_per_gpu for c in costs), unit)),
        ("time", True, format_seconds(sum(c.time_s for c in costs))),
        ("β from", False, ""),
    )
    for c in row.collectives:
        table.add_row(
            _label(c),
            _tensor(c),
            _group(c, mesh_run),
            f"{c.calls_per_step:,}",
            byte_cell(c.total_bytes_per_gpu, unit),
            format_seconds(c.time_s),
            BETA_FROM[c.bandwidth_source],
        )
    return table


MESH_LEGEND = "P2P send/recv (factor 1: each rank sends S to one peer); rec forward re-run in backward"

DIMENSION_TITLES = {
    "tp": "Tensor parallelism",
    "cp": "Context parallelism",
    "ep": "Expert parallelism",
    "etp": "Expert tensor parallelism",
}


def _mesh_label(c: MeshCollectiveCost) -> str:
    return f"{OP_SHORT.get(c.op.value, c.op.value)} {'rec' if c.recomputed else PHASE_SHORT[c.phase.value]}"


def _group_text(size: int, apart: int, spans_nodes: bool) -> str:
    """``8 consecutive``, ``2, 8 apart*``: a group's ranks and where they sit (* across nodes)."""
    if size == 1:
        return "1"
    where = " consecutive" if apart == 1 else f", {apart:,} apart"
    return f"{size:,}{where}{'*' if spans_nodes else ''}"


def _mesh_heading(estimate: CommEstimate, dimension: DimensionComm) -> str:
    mesh = estimate.request.mesh
    if dimension.dimension.value == "cp":
        what = f"cp {mesh.cp} ({mesh.cp_impl.value})"
    elif dimension.dimension.value == "ep":
        what = f"ep {mesh.ep} (token dispatch and combine per MoE layer)"
    elif dimension.dimension.value == "etp":
        what = f"expert tp {mesh.etp} (the dispatcher's gather and reduce-scatter per MoE layer)"
    else:
        sp = " + sequence parallel" if mesh.sequence_parallel else ""
        what = f"tp {mesh.tp}{sp} ({mesh.tp_style.value} layers)"
    apart = "consecutive" if dimension.stride == 1 else f"{dimension.stride:,} apart"
    placement = "across nodes" if dimension.spans_nodes else "within a node"
    title = DIMENSION_TITLES[dimension.dimension.value]
    return f"[bold]{title}[/bold]: {what}; groups of {dimension.group_size:,} GPUs, {apart}, {placement}"


def _mesh_table(costs: list[MeshCollectiveCost], unit: ByteUnit) -> Table:
    """A dimension's collectives per step: each row's calls over the layers and micro-batches."""
    table = compact_table(
        ("collective", False, "total"),
        ("moves", False, ""),
        ("dtype", False, ""),
        ("calls", True, f"{sum(c.calls_per_step for c in costs):,}"),
        ("sent/GPU", True, byte_cell(sum(c.total_bytes_per_gpu for c in costs), unit)),
        ("time", True, format_seconds(sum(c.time_s for c in costs))),
        ("β from", False, ""),
    )
    for c in costs:
        table.add_row(
            _mesh_label(c),
            c.moves,
            c.dtype.value,
            f"{c.calls_per_step:,}",
            byte_cell(c.total_bytes_per_gpu, unit),
            format_seconds(c.time_s),
            BETA_FROM[c.bandwidth_source],
        )
    return table


SCOPE_EACH = {
    "layer": "layer",
    "model": "micro-batch",
    "step": "step",
    "sync": "sync",
    "moe_layer": "MoE layer",
}


def _mesh_unit_table(costs: list[MeshCollectiveCost], unit: ByteUnit) -> Table:
    """A dimension's collectives each time they run (per layer, micro-batch or step): their calls, S of a
    call, the bytes each GPU sends, and how many times per step they run."""
    table = compact_table(
        ("collective", False, ""),
        ("each", False, ""),
        ("calls", True, ""),
        ("S/call", True, ""),
        ("sent/GPU", True, ""),
        ("× step", True, ""),
    )
    for c in costs:
        sizes = sorted(set(c.elements))
        table.add_row(
            f"{_mesh_label(c)} {c.moves}",
            SCOPE_EACH[c.scope.value],
            f"{len(c.elements):,}",
            byte_cell(sizes[0] * c.dtype.bytes, unit)
            if len(sizes) == 1
            else f"{byte_cell(sizes[0] * c.dtype.bytes, unit)}–{byte_cell(sizes[-1] * c.dtype.bytes, unit)}",
            byte_cell(c.bytes_sent_per_gpu, unit),
            f"{c.times_per_step:,}",
        )
    return table


def _render_mesh(
    out: Output, estimate: CommEstimate, row: StrategyComm, unit: ByteUnit, per_unit: bool
) -> None:
    """The tensor- and context-parallel collectives of a strategy, one table per dimension, and the code
    each follows."""
    for dimension in row.dimensions:
        if dimension.dimension.value in ("dp", "pp"):  # the pipeline's sends: render_pipeline
            continue
        costs = [c for c in row.mesh_collectives if c.dimension is dimension.dimension]
        out.print("")
        out.print(_mesh_heading(estimate, dimension))
        if not per_unit:
            out.print(_mesh_table(costs, unit))
            out.print("[dim]  the code issuing each collective: --per-unit or --json[/dim]")
            continue
        out.print(_mesh_unit_table(costs, unit))
        for c in costs:
            if not c.recomputed:
                out.print(f"[dim]  {_mesh_label(c)} {c.moves}: {c.source}[/dim]")


def _dimension_table(estimate: CommEstimate, unit: ByteUnit) -> Table:
    """Each strategy's bytes and time per dimension of the mesh."""
    table = compact_table(
        ("strategy", False, ""),
        ("dim", False, ""),
        ("group", False, ""),
        ("calls", True, ""),
        ("sent/GPU", True, ""),
        ("time", True, ""),
    )
    for row in estimate.strategies:
        for i, d in enumerate(row.dimensions):
            table.add_row(
                row.strategy.value if i == 0 else "",
                d.dimension.value,
                _group_text(d.group_size, d.stride, d.spans_nodes),
                f"{d.calls_per_step:,}",
                byte_cell(d.total_bytes_per_gpu, unit),
                format_seconds(d.time_s),
            )
        table.add_section()
    return table


def _unit_table(row: StrategyComm, unit: ByteUnit) -> Table:
    """One row per unit, bucket or broadcasting rank of each collective: its calls each time the collective
    runs, their Σ S, the bytes each GPU sends for them, and how many times per step the collective runs."""
    table = compact_table(
        ("collective", False, ""),
        ("moves", False, ""),
        ("calls", True, ""),
        ("Σ S", True, ""),
        ("sent/GPU", True, ""),
        ("× step", True, ""),
    )
    for c in row.collectives:
        for i, u in enumerate(c.units):
            table.add_row(
                f"{_label(c)}{' scales' if c.scales else ''}" if i == 0 else "",
                u.unit,
                f"{len(u.elements):,}",
                byte_cell(u.message_bytes, unit),
                byte_cell(u.bytes_sent_per_gpu, unit),
                f"{c.times_per_step:,}",
            )
        table.add_section()
    return table


def render_comm(out: Output, estimate: CommEstimate, unit: ByteUnit, per_unit: bool = False) -> None:
    """The tensor- and context-parallel collectives where the mesh has them, each strategy's data-parallel
    collectives (or, ``per_unit``, their units and buckets, and the model-parallel collectives per layer),
    then a summary per dimension and per strategy and the figures and formulas behind the times."""
    request = estimate.request
    cluster, mesh = request.cluster, request.mesh
    model = f" {request.model}," if request.model else ""
    if mesh.model_parallel:
        shape = [
            f"N = {plural(mesh.world, 'GPU')} on {plural(mesh.nodes, 'node')}",
            f"(g = {mesh.gpus_per_node}),",
            f"mesh {mesh.describe()},",
            f"b = {request.micro_batch}, s = {request.seq_len:,},",
        ]
        if request.recompute.value != "none":
            shape.append(f"{request.recompute.value} recompute,")
    else:
        shape = [
            f"N = {plural(cluster.world_size, 'GPU')} on {plural(cluster.nodes, 'node')}",
            f"(g = {cluster.ranks_per_node}),",
        ]
        if any(row.step is not None for row in estimate.strategies):
            shape.append(f"b = {request.micro_batch}, s = {request.seq_len:,},")
            if request.recompute.value != "none":
                shape.append(f"{request.recompute.value} recompute,")
    print_phrases(
        out,
        f"[bold]Communication per optimizer step[/bold] ({request.framework.value}):{model}",
        f"Ψ = {request.params:,} ({format_count(request.params)}),",
        *shape,
        f"A = {request.grad_accum} micro-batch{'es' if request.grad_accum > 1 else ''},",
        request.precision.value
        + (f", ZeRO++ {'+'.join(z.value for z in request.zeropp)}" if request.zeropp else "")
        + ";",
        f"sizes in {unit_label(unit)}",
    )
    if mesh.world == 1:
        out.print(
            "[yellow]No communication: a single GPU has nothing to reduce or gather (0 bytes, 0 s).[/yellow]"
        )
        render_step(out, estimate)
        return
    rows = estimate.strategies
    shared = all(row.mesh_collectives == rows[0].mesh_collectives for row in rows)
    if mesh.model_parallel and shared:
        _render_mesh(out, estimate, rows[0], unit, per_unit)
    for row in rows:
        when = "every micro-batch" if row.grad_sync is GradSync.EVERY else "on the last micro-batch"
        out.print(f"\n[bold]{row.title}[/bold]: {row.schedule_source}")
        if mesh.model_parallel and not shared:
            _render_mesh(out, estimate, row, unit, per_unit)
            out.print(f"\n[bold]{row.title}[/bold], data parallelism:")
        if cluster.world_size == 1:
            out.print("no data-parallel collectives: the dp × cp group of a TP rank is one GPU")
            continue
        out.print(f"gradients reduced {when} ({row.grad_sync_reason})")
        out.print(_unit_table(row, unit) if per_unit else _strategy_table(row, unit, mesh.model_parallel))
        for c in row.collectives:
            if not c.scales:
                out.print(f"[dim]  {_label(c)}: {c.behaviour}[/dim]")
    legend = COLLECTIVE_LEGEND + (f"; {MESH_LEGEND}" if mesh.model_parallel else "")
    out.print(
        f"[dim]· {legend}; * a group spanning nodes (inter-node bandwidth); calls and bytes per "
        f"step, per GPU{'' if per_unit else '; ' + BETA_LEGEND}[/dim]"
    )

    if estimate.pipeline is not None:
        render_pipeline(out, estimate.pipeline, unit)
    compute = estimate.compute
    if mesh.model_parallel:
        out.print("\n[bold]Per dimension, per GPU, per step[/bold]")
        out.print(_dimension_table(estimate, unit))
    columns = _summary_columns(estimate, unit)
    summary = compact_table(*((header, numeric, "") for header, numeric, _, _ in columns))
    for i in range(len(estimate.strategies)):
        summary.add_row(*(cells[i] for _, _, cells, _ in columns))
    out.print("\n[bold]Per strategy, per GPU, per step[/bold]")
    out.print(summary)
    if mesh.model_parallel:
        out.print(
            "[dim]· sent/GPU and time: every dimension; vs DDP: the data-parallel bytes over DDP's[/dim]"
        )
    if estimate.calibration_used:
        out.print(f"[dim]· bandwidth from calibration {estimate.calibration_used} where it has a fit[/dim]")
    out.print(f"[dim]· {_figure_line('intra-node', request.bandwidths.intra_node)}[/dim]")
    out.print(f"[dim]· {_figure_line('inter-node', request.bandwidths.inter_node)}[/dim]")
    if compute is not None:
        out.print(
            f"[dim]· compute: 6·Ψ·T / (N·F) = {compute.flops_per_step:.3g} FLOP / "
            f"({mesh.world} × {request.tflops:g} TFLOP/s) = "
            f"{format_seconds(compute.seconds)} "
            "(Kaplan et al. 2020); 'exposed' is what cannot hide behind it with perfect overlap[/dim]"
        )
    out.print(
        "[dim]· bytes per GPU: ring algorithm, all_reduce 2(n-1)/n·S, reduce_scatter, all_gather and "
        "all_to_all (n-1)/n·S, broadcast S (nccl-tests PERFORMANCE.md); time = calls × α + bytes / β[/dim]"
    )
    render_step(out, estimate)
    for note in estimate.notes:
        out.print(f"[yellow]· {note}[/yellow]")


def render_step(out: Output, estimate: CommEstimate) -> None:
    """Each strategy's step time on one GPU: compute by class, exposed communication by dimension, the
    pipeline bubble and offload (none printed without a step time)."""
    rows = [row for row in estimate.strategies if row.step is not None]
    if not rows:
        return
    steps = [row.step for row in rows if row.step is not None]
    mesh = estimate.request.mesh

    def seconds(values: list[float]) -> list[str]:
        return [f"{v:.3f}" for v in values]

    columns = [
        Column("Matmul", seconds([s.matmul_s for s in steps])),
        Column("Attn", seconds([s.attention_s for s in steps])),
        Column("Elem-\nwise", seconds([s.elementwise_s for s in steps])),
        Column("Optim", seconds([s.optimizer_s for s in steps])),
        Column("Comm\ndp", seconds([s.exposed_dp_s for s in steps])),
    ]
    if mesh.tp > 1:
        columns.append(Column("Comm\ntp", seconds([s.exposed_tp_s for s in steps])))
    if mesh.cp > 1:
        columns.append(Column("Comm\ncp", seconds([s.exposed_cp_s for s in steps])))
    if mesh.ep > 1:
        columns.append(Column("Comm\nep", seconds([s.exposed_ep_s for s in steps])))
    if mesh.pp > 1:
        columns.append(Column("Comm\npp", seconds([s.exposed_pp_s for s in steps])))
        columns.append(Column("Bubble", seconds([s.bubble_s for s in steps])))
    if any(s.offload_s for s in steps):
        columns.append(Column("Off-\nload", seconds([s.offload_s for s in steps])))
    columns += [
        Column("Step", seconds([s.step_s for s in steps])),
        Column("tok/s\n/GPU", [f"{s.tokens_per_s_per_gpu:,.0f}" for s in steps]),
        Column("MFU", [f"{s.mfu:.1%}" if s.mfu is not None else "-" for s in steps]),
    ]
    out.print("\n[bold]Step time per GPU[/bold] (s): compute by class, exposed communication")
    print_fitted(out, "strategy", [row.title for row in rows], columns, key_width=10)
    recompute = [s.recompute_s for s in steps]
    extra = (
        f"; of compute, recomputation {', '.join(f'{r:.3f}' for r in recompute)} s" if any(recompute) else ""
    )
    out.print(
        f"[dim]· compute: each layer's GEMMs, attention and element-wise kernels at their per-rank shapes, "
        f"at the rates of {steps[0].compute_table} compute table{extra}; comm: what the framework's overlap "
        "leaves exposed (docs/model.md, Step time)[/dim]"
    )
    out.print(f"[dim]· {MFU_FORMULA}[/dim]")
    out.print(f"[dim]· {STEP_TIME_ACCURACY}[/dim]")


def _link_runs(pipeline: PipelineComm) -> list[tuple[str, PipelineLink]]:
    """The links as printed: consecutive ones that send alike as one row (``0→1 … 6→7``)."""
    runs: list[list[PipelineLink]] = []
    for link in pipeline.links:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and link.next_stage == link.stage + 1
            and last.next_stage == last.stage + 1
            and (link.forward_sends, link.spans_nodes) == (last.forward_sends, last.spans_nodes)
        ):
            runs[-1].append(link)
        else:
            runs.append([link])
    named = []
    for run in runs:
        first, last = run[0], run[-1]
        label = f"{first.stage}→{first.next_stage}"
        if len(run) > 1:
            label += f" … {last.stage}→{last.next_stage}"
        named.append((label, first))
    return named


def render_pipeline(out: Output, pipeline: PipelineComm, unit: ByteUnit) -> None:
    """The pipeline's sends per pair of consecutive ranks, the tied embedding's gradient sync, the busiest
    rank and the bubble."""
    virtual = f" × v {pipeline.vpp}" if pipeline.vpp > 1 else ""
    print_phrases(
        out,
        f"\n[bold]Pipeline[/bold] pp {pipeline.pp}{virtual} ({pipeline.schedule.value}),",
        f"m = {pipeline.micro_batches},",
        f"layers {describe_layer_counts(tuple(pipeline.stage_layers))}:",
        f"each send {pipeline.message_elements:,} {pipeline.dtype.value} elements",
        f"({format_size(pipeline.message_bytes)}),",
        f"{pipeline.boundaries} boundaries per micro-batch, forward and back",
    )
    table = compact_table(
        ("link", False, ""),
        ("sends each way", True, ""),
        ("sent each way", True, ""),
        ("pair", False, ""),
        ("time", True, ""),
        ("β from", False, ""),
    )
    for label, link in _link_runs(pipeline):
        table.add_row(
            label,
            f"{link.forward_sends:,}",
            byte_cell(link.bytes_per_direction, unit),
            "inter*" if link.spans_nodes else "intra",
            format_seconds(link.time_s),
            BETA_FROM[link.bandwidth_source],
        )
    sync = pipeline.embedding_sync
    if sync is not None:
        table.add_row(
            "embedding",
            "1",
            byte_cell(sync.bytes_per_gpu, unit),
            "inter*" if sync.spans_nodes else "intra",
            format_seconds(sync.time_s),
            "",
        )
    out.print(table)
    out.print(
        f"[dim]· per link, per step: m sends a boundary each way (activations forward, their gradients "
        f"back), time both ways; the busiest rank sends {byte_text(pipeline.busiest_rank_bytes, unit)} in "
        f"{format_seconds(pipeline.busiest_rank_time_s)}[/dim]"
    )
    if sync is not None:
        out.print(
            f"[dim]· embedding: the tied embedding's gradients, {sync.op.value} over the first and the last "
            f"stage ({sync.source})[/dim]"
        )
    bubble = f"{pipeline.bubble_fraction:.2%}"
    out.print(f"[dim]· bubble {bubble} of the step's ideal time: {pipeline.bubble_source}[/dim]")


def _summary_columns(
    estimate: CommEstimate, unit: ByteUnit
) -> list[tuple[str, bool, list[str], list[str | int | float | None]]]:
    """The summary table's columns: header, numeric, each strategy's cell and value (bytes, seconds)."""
    rows = estimate.strategies
    columns: list[tuple[str, bool, list[str], list[str | int | float | None]]] = [
        ("strategy", False, [r.strategy.value for r in rows], [r.strategy.value for r in rows]),
        (
            "sent/GPU",
            True,
            [byte_cell(r.total_bytes_per_gpu, unit) for r in rows],
            [r.total_bytes_per_gpu for r in rows],
        ),
        (
            "inter-node",
            True,
            [byte_cell(r.inter_node_bytes_per_gpu, unit) for r in rows],
            [r.inter_node_bytes_per_gpu for r in rows],
        ),
        (
            "vs DDP",
            True,
            ["–" if r.ratio_to_ddp is None else f"{r.ratio_to_ddp:.2f}×" for r in rows],
            [r.ratio_to_ddp for r in rows],
        ),
        ("time", True, [format_seconds(r.time_s) for r in rows], [r.time_s for r in rows]),
    ]
    if estimate.compute is not None:
        columns.append(
            (
                "exposed",
                True,
                [format_seconds(r.exposed_time_s or 0.0) for r in rows],
                [r.exposed_time_s for r in rows],
            )
        )
    return columns


def comm_rows(estimate: CommEstimate) -> list[dict[str, str | int | float | None]]:
    """One dict per strategy: the summary table's columns under their headers, sizes in bytes, times in
    seconds, ``vs DDP`` as a ratio; ``title`` and ``calls`` (per step) besides."""
    from zerocalc.base.units import ByteUnit

    columns = _summary_columns(estimate, ByteUnit.B)
    rows = []
    for i, row in enumerate(estimate.strategies):
        values: dict[str, str | int | float | None] = {header: v[i] for header, _, _, v in columns}
        rows.append({**values, "title": row.title, "calls": row.calls_per_step})
    return rows
