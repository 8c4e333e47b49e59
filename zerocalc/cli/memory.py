"""``zerocalc memory``: per-GPU model-state bytes for each strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app
from zerocalc.cli.render import byte_cell, console, print_json, unit_label
from zerocalc.units import ByteUnit, format_count, parse_byte_unit

if TYPE_CHECKING:
    from zerocalc.memory import MemoryEstimate, StateKind, StrategyMemory
    from zerocalc.peak.report import PeakEstimate

_STATE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("params", "Params"),
    ("grads", "Grads"),
    ("grad_accum", "fp32 grad acc."),
    ("optimizer", "Optimizer"),
)


@app.command(cls=PlainTextCommand)
def memory(
    params: opt.Params = None,
    model: opt.Model = None,
    gpus: opt.Gpus = "1",
    gpus_per_node: opt.GpusPerNode = None,
    strategy: opt.StrategyOpt = "all",
    precision: opt.Precision = "bf16-mixed",
    optimizer: opt.Optimizer = "adamw",
    fp32_grad_accum: opt.Fp32GradAccum = False,
    zero_init: opt.ZeroInit = True,
    offload_optimizer: opt.OffloadOptimizer = "none",
    offload_params: opt.OffloadParams = "none",
    units: opt.Units = "GiB",
    gpu_memory: opt.GpuMemory = None,
    gpu: opt.Gpu = None,
    reserve: opt.Reserve = None,
    seq_len: opt.SeqLen = "2048",
    micro_batch: opt.MicroBatch = "1",
    recompute: opt.RecomputeOpt = "none",
    flash_attention: opt.FlashAttention = None,
    prefetch: opt.Prefetch = "1",
    wrap: opt.WrapOpt = "block",
    framework: opt.FrameworkOpt = "paper",
    ddp_bucket: opt.DdpBucket = "25MiB",
    reduce_bucket: opt.ReduceBucket = "5e8",
    allgather_bucket: opt.AllgatherBucket = "5e8",
    fragmentation: opt.Fragmentation = "0.1",
    reduce_dtype: opt.ReduceDtype = None,
    json: opt.Json = False,
) -> None:
    """Per-GPU memory under DDP, ZeRO-1/2/3 and FSDP: model states, and with --model the peak of a step
    (activations, buffers, overheads)."""
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
            optimizer=optimizer,
            fp32_grad_accum=fp32_grad_accum,
            zero_init=zero_init,
            offload_optimizer=offload_optimizer,
            offload_params=offload_params,
            gpu_memory=gpu_memory,
            gpu=gpu,
            reserve=reserve,
            seq_len=seq_len,
            micro_batch=micro_batch,
            recompute=recompute,
            flash_attention=flash_attention,
            prefetch=prefetch,
            wrap=wrap,
            framework=framework,
            ddp_bucket=ddp_bucket,
            reduce_bucket=reduce_bucket,
            allgather_bucket=allgather_bucket,
            fragmentation=fragmentation,
            reduce_dtype=reduce_dtype,
        )
    )
    if request.model.architecture is None:
        from zerocalc.memory import evaluate_memory

        estimate = evaluate_memory(request)
        if json:
            print_json(estimate)
            return
        render_memory(estimate, unit)
        console().print(
            "[dim]· model states only: activations, buffers and the peak of a step need --model[/dim]"
        )
        return
    from zerocalc.peak.evaluate import evaluate_peak

    report = evaluate_peak(request)
    if json:
        import json as jsonlib

        typer.echo(jsonlib.dumps(report.to_json_dict(), indent=2))
        return
    render_memory(report, unit)
    assert report.peak is not None
    render_peak(report.peak, unit)


def _state_cell(row: StrategyMemory, kind: StateKind, unit: ByteUnit) -> str:
    from zerocalc.memory import Location

    states = [s for s in row.states if s.kind is kind]
    if states and all(s.location is not Location.GPU for s in states):
        return f"[dim]→ {states[0].location.value}[/dim]"
    return byte_cell(row.bytes_of(kind), unit)


def render_memory(estimate: MemoryEstimate, unit: ByteUnit) -> None:
    from rich.table import Table

    from zerocalc.memory import StateKind

    request = estimate.request
    bpp = estimate.bytes_per_parameter
    out = console()
    k = f"{bpp.k:g}"
    extra = f" + {bpp.grad_accum} (fp32 grad accumulation)" if bpp.grad_accum else ""
    if estimate.model is not None:
        count = estimate.model.parameter_count
        active = (
            f", {format_count(count.active_per_token)} active per token"
            if count.active_per_token != count.total
            else ""
        )
        out.print(
            f"[bold]Model[/bold] {estimate.model.title or estimate.model.name}: "
            f"{count.total:,} parameters{active}; "
            f"largest layer {count.largest_layer_name} ({count.largest_layer_params:,})"
        )
    if estimate.gpu is not None:
        out.print(
            f"[bold]GPU[/bold] {estimate.gpu.name}: {byte_cell(estimate.gpu.memory_bytes, unit)} "
            f"less a {byte_cell(estimate.gpu.reserve_bytes, unit)} reserve (CUDA context, NCCL, allocator)"
        )
    out.print(
        f"[bold]Model states per GPU[/bold]: Ψ = {request.params:,} ({format_count(request.params)}), "
        f"N = {request.cluster.world_size}, {request.precision.value} + {request.optimizer.value}: "
        f"b_p = {bpp.b_p}, b_g = {bpp.b_g}, K = {k} bytes/param{extra}; units: {unit_label(unit)}"
    )
    rows = estimate.strategies
    has_accum = bpp.grad_accum > 0
    has_cpu = any(r.cpu_bytes_per_gpu for r in rows)
    has_nvme = any(r.nvme_bytes_per_gpu for r in rows)
    has_fits = request.gpu_memory_bytes is not None

    table = Table(title=None, header_style="bold")
    table.add_column("Strategy")
    for key, label in _STATE_COLUMNS:
        if key == StateKind.GRAD_ACCUM.value and not has_accum:
            continue
        table.add_column(label, justify="right")
    table.add_column("Total / GPU", justify="right", style="bold")
    table.add_column("vs DDP", justify="right")
    if has_cpu:
        table.add_column("CPU / GPU", justify="right")
        table.add_column("CPU / node", justify="right")
    if has_nvme:
        table.add_column("NVMe / GPU", justify="right")
        table.add_column("NVMe / node", justify="right")
    if has_fits:
        table.add_column(f"Fits {byte_cell(request.gpu_memory_bytes or 0, unit)}", justify="center")
        table.add_column("Headroom", justify="right")

    for row in rows:
        cells = [row.title]
        for key, _ in _STATE_COLUMNS:
            if key == StateKind.GRAD_ACCUM.value and not has_accum:
                continue
            cells.append(_state_cell(row, StateKind(key), unit))
        cells += [byte_cell(row.gpu_bytes, unit), f"{row.fraction_of_ddp:.1%}"]
        if has_cpu:
            cells += [byte_cell(row.cpu_bytes_per_gpu, unit), byte_cell(row.cpu_bytes_per_node, unit)]
        if has_nvme:
            cells += [byte_cell(row.nvme_bytes_per_gpu, unit), byte_cell(row.nvme_bytes_per_node, unit)]
        if has_fits:
            headroom = row.headroom_bytes or 0
            cells += [
                "[green]yes[/green]" if row.fits else "[red]no[/red]",
                byte_cell(headroom, unit) if headroom >= 0 else f"[red]-{byte_cell(-headroom, unit)}[/red]",
            ]
        table.add_row(*cells)
    out.print(table)
    for line in estimate.assumptions[1:]:
        out.print(f"[dim]· {line}[/dim]")
    for note in estimate.notes:
        out.print(f"[yellow]· {note}[/yellow]")


def render_peak(peak: PeakEstimate, unit: ByteUnit) -> None:
    """The peak of one step per strategy: a column per kind of line, then each line's source."""
    from rich.table import Table

    from zerocalc.frameworks import Framework
    from zerocalc.peak.report import LineKind

    out = console()
    options = peak.options
    deepspeed = options.framework is Framework.DEEPSPEED
    has_fits = options.gpu_memory_bytes is not None
    table = Table(
        title=f"Peak per GPU of one training step ({options.framework.value} accounting), {unit.value}",
        header_style="bold",
    )
    table.add_column("Strategy")
    columns = (
        (LineKind.STATES, "Model states"),
        (LineKind.ACTIVATIONS, "Activations"),
        (LineKind.BUFFERS, "Buffers"),
        (LineKind.OVERHEAD, "CUDA+NCCL"),
        (LineKind.FRAGMENTATION, "Fragmentation"),
    )
    for _, label in columns:
        table.add_column(label, justify="right")
    table.add_column("Peak", justify="right", style="bold")
    if deepspeed:
        table.add_column("DeepSpeed's estimate", justify="right")
        table.add_column("Host / node", justify="right")
    if has_fits:
        table.add_column(f"Fits {byte_cell(options.gpu_memory_bytes or 0, unit)}", justify="center")
        table.add_column("Headroom", justify="right")
    for row in peak.strategies:
        cells = [row.title] + [byte_cell(row.total(kind), unit) for kind, _ in columns]
        cells.append(byte_cell(row.peak_bytes, unit))
        if deepspeed:
            cells += [
                byte_cell(row.framework_estimate_bytes, unit),
                byte_cell(row.host_bytes_per_node or 0, unit),
            ]
        if has_fits:
            headroom = row.headroom_bytes or 0
            cells += [
                "[green]yes[/green]" if row.fits else "[red]no[/red]",
                byte_cell(headroom, unit) if headroom >= 0 else f"[red]-{byte_cell(-headroom, unit)}[/red]",
            ]
        table.add_row(*cells)
    out.print(table)
    if has_fits:
        fitting = [row.title for row in peak.strategies if row.fits]
        out.print(f"[bold]Fits:[/bold] {', '.join(fitting) if fitting else 'none of these strategies'}")
    seen: dict[str, str] = {}
    for row in peak.strategies:
        for line in row.lines:
            marker = "" if line.in_framework_estimate else " [yellow](not in DeepSpeed's estimate)[/yellow]"
            seen.setdefault(line.name, f"{line.source}{marker}")
    for name, source in seen.items():
        out.print(f"[dim]· {name}: {source}[/dim]")
    out.print(
        f"[dim]· activations {'with' if peak.flash_attention else 'without'} flash attention; "
        f"{peak.activation_note}[/dim]"
    )
    for note in peak.notes:
        out.print(f"[yellow]· {note}[/yellow]")
