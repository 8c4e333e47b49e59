"""``zerocalc comm``: collectives per step, bytes each GPU sends, and their time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.base.units import (
    ByteUnit,
    format_bandwidth,
    format_count,
    format_seconds,
    parse_byte_unit,
    plural,
)
from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app
from zerocalc.cli.render import (
    COLLECTIVE_LEGEND,
    byte_cell,
    collective_label,
    compact_table,
    console,
    print_json,
    unit_label,
)
from zerocalc.network.cluster import RankGroup
from zerocalc.network.schedule import GradSync, Tensor
from zerocalc.request.options import Command, echo

if TYPE_CHECKING:
    from rich.table import Table

    from zerocalc.comm.estimate import CollectiveCost, CommEstimate, StrategyComm
    from zerocalc.network.links import LinkFigures


@app.command(cls=PlainTextCommand)
@opt.takes_options(Command.COMM)
def comm(values: dict[str, Any], given_flags: frozenset[str]) -> None:
    """Collectives of each strategy per optimizer step: bytes each GPU sends and the time they take."""
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate
    from zerocalc.request.training import TrainingOptions, parse_request

    unit = parse_byte_unit(values["units"])
    json, per_unit = values["json"], values["per_unit"]
    options, notes = opt.request_values(Command.COMM, values, given_flags)
    request = parse_request(TrainingOptions(estimate=Estimate.COMM, **options))
    estimate = evaluate_comm(request)
    estimate = estimate.model_copy(
        update={"options": echo(Command.COMM, options), "notes": [*estimate.notes, *notes]}
    )
    if json:
        print_json(estimate)
    else:
        render_comm(estimate, unit, per_unit)


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


def _group(c: CollectiveCost) -> str:
    kind = "across" if c.group is RankGroup.ACROSS_NODES else c.group.value
    return f"{kind} {c.group_size}{'*' if c.spans_nodes else ''}"


def _strategy_table(row: StrategyComm, unit: ByteUnit) -> Table:
    table = compact_table(
        ("collective", False, "total"),
        ("tensor", False, ""),
        ("group", False, ""),
        ("calls", True, f"{row.calls_per_step:,}"),
        ("sent/GPU", True, byte_cell(row.total_bytes_per_gpu, unit)),
        ("time", True, format_seconds(row.time_s)),
    )
    for c in row.collectives:
        table.add_row(
            _label(c),
            _tensor(c),
            _group(c),
            f"{c.calls_per_step:,}",
            byte_cell(c.total_bytes_per_gpu, unit),
            format_seconds(c.time_s),
        )
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


def render_comm(estimate: CommEstimate, unit: ByteUnit, per_unit: bool = False) -> None:
    request = estimate.request
    cluster = request.cluster
    out = console()
    model = f"{request.model}, " if request.model else ""
    out.print(
        f"[bold]Communication per optimizer step[/bold] ({request.framework.value}): {model}"
        f"Ψ = {request.params:,} ({format_count(request.params)}), "
        f"N = {plural(cluster.world_size, 'GPU')} on {plural(cluster.nodes, 'node')} "
        f"(g = {cluster.ranks_per_node}), A = {request.grad_accum} micro-batch"
        f"{'es' if request.grad_accum > 1 else ''}, {request.precision.value}"
        + (f", ZeRO++ {'+'.join(z.value for z in request.zeropp)}" if request.zeropp else "")
        + f"; sizes in {unit_label(unit)}"
    )
    if cluster.world_size == 1:
        out.print(
            "[yellow]No communication: a single GPU has nothing to reduce or gather (0 bytes, 0 s).[/yellow]"
        )
        return
    for row in estimate.strategies:
        when = "every micro-batch" if row.grad_sync is GradSync.EVERY else "on the last micro-batch"
        out.print(f"\n[bold]{row.title}[/bold]: {row.schedule_source}")
        out.print(f"gradients reduced {when} ({row.grad_sync_reason})")
        out.print(_unit_table(row, unit) if per_unit else _strategy_table(row, unit))
        for c in row.collectives:
            if not c.scales:
                out.print(f"[dim]  {_label(c)}: {c.behaviour}[/dim]")
    out.print(
        f"[dim]· {COLLECTIVE_LEGEND}; * a group spanning nodes (inter-node bandwidth); calls and bytes per "
        "step, per GPU[/dim]"
    )

    compute = estimate.compute
    summary = compact_table(
        ("strategy", False, ""),
        ("sent/GPU", True, ""),
        ("inter-node", True, ""),
        ("vs DDP", True, ""),
        ("time", True, ""),
        *((("exposed", True, ""),) if compute is not None else ()),
    )
    for row in estimate.strategies:
        ratio = "–" if row.ratio_to_ddp is None else f"{row.ratio_to_ddp:.2f}×"
        cells = [
            row.strategy.value,
            byte_cell(row.total_bytes_per_gpu, unit),
            byte_cell(row.inter_node_bytes_per_gpu, unit),
            ratio,
            format_seconds(row.time_s),
        ]
        if compute is not None:
            cells.append(format_seconds(row.exposed_time_s or 0.0))
        summary.add_row(*cells)
    out.print("\n[bold]Per strategy, per GPU, per step[/bold]")
    out.print(summary)
    if estimate.calibration_used:
        out.print(f"[dim]· bandwidth from calibration {estimate.calibration_used} where it has a fit[/dim]")
    out.print(f"[dim]· {_figure_line('intra-node', request.bandwidths.intra_node)}[/dim]")
    out.print(f"[dim]· {_figure_line('inter-node', request.bandwidths.inter_node)}[/dim]")
    if compute is not None:
        out.print(
            f"[dim]· compute: 6·Ψ·T / (N·F) = {compute.flops_per_step:.3g} FLOP / "
            f"({cluster.world_size} × {request.tflops:g} TFLOP/s) = "
            f"{format_seconds(compute.seconds)} "
            "(Kaplan et al. 2020); 'exposed' is what cannot hide behind it with perfect overlap[/dim]"
        )
    out.print(
        "[dim]· bytes per GPU: ring algorithm, all_reduce 2(n-1)/n·S, reduce_scatter, all_gather and "
        "all_to_all (n-1)/n·S, broadcast S (nccl-tests PERFORMANCE.md); time = calls × α + bytes / β[/dim]"
    )
    for note in estimate.notes:
        out.print(f"[yellow]· {note}[/yellow]")
