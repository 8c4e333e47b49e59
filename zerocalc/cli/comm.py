"""``zerocalc comm``: collectives per step, bytes each GPU sends, and their time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app
from zerocalc.cli.render import byte_cell, console, print_json, unit_label
from zerocalc.units import (
    ByteUnit,
    format_bandwidth,
    format_count,
    format_seconds,
    parse_byte_unit,
    plural,
)

if TYPE_CHECKING:
    from zerocalc.comm import CommEstimate
    from zerocalc.links import LinkFigures

Calibration = Annotated[
    str | None, typer.Option("--calibration", help="A calibration JSON written by `zerocalc bench`.")
]
IntraBw = Annotated[
    str | None, typer.Option("--intra-node-bw", help="Bus bandwidth per GPU inside a node, e.g. 450GB/s.")
]
InterBw = Annotated[
    str | None, typer.Option("--inter-node-bw", help="Bus bandwidth per GPU across nodes, e.g. 50GB/s.")
]
Latency = Annotated[
    str | None,
    typer.Option("--latency", help="Latency α per collective: 20us, 0.05ms, 2e-5 (s) [default: 20us]."),
]
TokensPerStep = Annotated[
    str | None, typer.Option("--tokens-per-step", help="T: tokens per optimizer step (all GPUs), e.g. 4M.")
]
Tflops = Annotated[str | None, typer.Option("--tflops", help="F: achieved TFLOP/s per GPU, e.g. 400.")]


@app.command(cls=PlainTextCommand)
def comm(
    params: opt.Params = None,
    model: opt.Model = None,
    gpus: opt.Gpus = "1",
    gpus_per_node: opt.GpusPerNode = None,
    strategy: opt.StrategyOpt = "all",
    precision: opt.Precision = "bf16-mixed",
    grad_accum: opt.GradAccum = "1",
    reduce_dtype: opt.ReduceDtype = None,
    calibration: Calibration = None,
    gpu: opt.Gpu = None,
    intra_node_bw: IntraBw = None,
    inter_node_bw: InterBw = None,
    latency: Latency = None,
    tokens_per_step: TokensPerStep = None,
    tflops: Tflops = None,
    units: opt.Units = "GiB",
    json: opt.Json = False,
) -> None:
    """Collectives of each strategy per optimizer step: bytes each GPU sends and the time they take."""
    from zerocalc.comm import evaluate_comm
    from zerocalc.request import TrainingOptions, parse_request

    unit = parse_byte_unit(units)
    request = parse_request(
        TrainingOptions(
            params=params,
            model=model,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            strategies=strategy,
            precision=precision,
            grad_accum=grad_accum,
            reduce_dtype=reduce_dtype,
            calibration=calibration,
            gpu=gpu,
            intra_node_bw=intra_node_bw,
            inter_node_bw=inter_node_bw,
            latency=latency,
            tokens_per_step=tokens_per_step,
            tflops=tflops,
        )
    )
    estimate = evaluate_comm(request)
    if json:
        print_json(estimate)
    else:
        render_comm(estimate, unit)


def _figure_line(label: str, link: LinkFigures) -> str:
    return (
        f"{label}: {format_bandwidth(link.bus_bandwidth_Bps)} bus bandwidth, "
        f"α = {format_seconds(link.latency_s)} ({link.detail})"
    )


def render_comm(estimate: CommEstimate, unit: ByteUnit) -> None:
    from rich.table import Table

    request = estimate.request
    cluster = request.cluster
    out = console()
    out.print(
        f"[bold]Communication per optimizer step[/bold]: "
        f"Ψ = {request.params:,} ({format_count(request.params)}), "
        f"N = {plural(cluster.world_size, 'GPU')} on {plural(cluster.nodes, 'node')} "
        f"(g = {cluster.ranks_per_node}), A = {request.grad_accum} micro-batch"
        f"{'es' if request.grad_accum > 1 else ''}, {request.precision.value}; sizes in {unit_label(unit)}"
    )
    if cluster.world_size == 1:
        out.print(
            "[yellow]No communication: a single GPU has nothing to reduce or gather (0 bytes, 0 s).[/yellow]"
        )
        return

    table = Table(header_style="bold")
    for name, justify in (
        ("Strategy", "left"),
        ("Collective", "left"),
        ("Phase", "left"),
        ("Tensor", "left"),
        ("Group", "left"),
        ("Size S", "right"),
        ("× / step", "right"),
        ("Sent / GPU / step", "right"),
        ("Time / step", "right"),
        ("Bandwidth", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in estimate.strategies:
        for i, c in enumerate(row.collectives):
            group = f"{c.group.value} ({c.group_size}{', spans nodes' if c.spans_nodes else ''})"
            table.add_row(
                row.title if i == 0 else "",
                c.op.value,
                c.phase.value,
                f"{c.tensor.value} {c.dtype.value}",
                group,
                byte_cell(c.message_bytes, unit),
                str(c.count_per_step),
                byte_cell(c.total_bytes_per_gpu, unit),
                format_seconds(c.time_s),
                f"{format_bandwidth(c.bus_bandwidth_Bps)} ({c.bandwidth_source.value})",
            )
        table.add_section()
    out.print(table)
    for row in estimate.strategies:
        follows = "; ".join(
            f"{c.op.value} ({c.phase.value}) × {c.count_per_step}: {c.behaviour}" for c in row.collectives
        )
        out.print(f"[dim]· {row.title} follows {follows}[/dim]")

    summary = Table(header_style="bold", title="Per strategy, per GPU, per step")
    summary.add_column("Strategy")
    summary.add_column("Sent / GPU", justify="right")
    summary.add_column("of which inter-node", justify="right")
    summary.add_column("vs DDP", justify="right")
    summary.add_column("Comm time", justify="right")
    if estimate.compute is not None:
        summary.add_column("Compute time", justify="right")
        summary.add_column("Could hide", justify="right")
        summary.add_column("Exposed", justify="right")
    for row in estimate.strategies:
        ratio = "–" if row.ratio_to_ddp is None else f"{row.ratio_to_ddp:.2f}×"
        cells = [
            row.title,
            byte_cell(row.total_bytes_per_gpu, unit),
            byte_cell(row.inter_node_bytes_per_gpu, unit),
            ratio,
            format_seconds(row.time_s),
        ]
        if estimate.compute is not None:
            cells += [
                format_seconds(estimate.compute.seconds),
                format_seconds(row.hidden_time_s or 0.0),
                format_seconds(row.exposed_time_s or 0.0),
            ]
        summary.add_row(*cells)
    out.print(summary)
    if estimate.calibration_used:
        out.print(f"[dim]· bandwidth from calibration {estimate.calibration_used} where it has a fit[/dim]")
    out.print(f"[dim]· {_figure_line('intra-node', request.bandwidths.intra_node)}[/dim]")
    out.print(f"[dim]· {_figure_line('inter-node', request.bandwidths.inter_node)}[/dim]")
    if estimate.compute is not None:
        out.print(
            f"[dim]· compute: 6·Ψ·T / (N·F) = {estimate.compute.flops_per_step:.3g} FLOP / "
            f"({cluster.world_size} × {request.tflops:g} TFLOP/s) = "
            f"{format_seconds(estimate.compute.seconds)} "
            "(Kaplan et al. 2020); 'could hide' assumes perfect overlap[/dim]"
        )
    out.print(
        "[dim]· bytes per GPU: ring algorithm, all_reduce 2(n-1)/n·S, reduce_scatter and all_gather "
        "(n-1)/n·S (nccl-tests PERFORMANCE.md); a group spanning nodes runs at the inter-node figure[/dim]"
    )
    for note in estimate.notes:
        out.print(f"[yellow]· {note}[/yellow]")
