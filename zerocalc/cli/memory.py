"""``zerocalc memory``: per-GPU model-state bytes for each strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from zerocalc.base.units import ByteUnit, format_count, parse_byte_unit
from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app
from zerocalc.cli.render import Column, byte_cell, byte_text, console, print_fitted, print_json, unit_label
from zerocalc.request.options import Command, echo

if TYPE_CHECKING:
    from zerocalc.peak.report import FrameworkStates, PeakEstimate, StrategyPeak
    from zerocalc.states.memory import MemoryEstimate, StateKind, StrategyMemory

_STATE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("params", "Params"),
    ("grads", "Grads"),
    ("grad_accum", "fp32\ngrad acc."),
    ("optimizer", "Optimizer"),
)


@app.command(cls=PlainTextCommand)
@opt.takes_options(Command.MEMORY)
def memory(values: dict[str, Any], given_flags: frozenset[str]) -> None:
    """Per-GPU memory under DDP, ZeRO-1/2/3 and FSDP: model states, and with --model the peak of a
    training step, simulated event by event (activations, loss, buffers, allocator, CUDA context)."""
    from zerocalc.request.training import TrainingOptions, parse_request

    unit = parse_byte_unit(values["units"])
    json = values["json"]
    options, notes = opt.request_values(Command.MEMORY, values, given_flags)
    request = parse_request(TrainingOptions(**options))
    echoed = echo(Command.MEMORY, options)

    def given(result: Any) -> Any:  # the options as given, and the launch configs' notes
        return result.model_copy(update={"options": echoed, "notes": [*result.notes, *notes]})

    if request.model.architecture is None:
        if request.framework.value != "paper":  # the framework's own accounting of Ψ
            from zerocalc.peak.evaluate import evaluate

            report = given(evaluate(request))
            if json:
                import json as jsonlib

                typer.echo(jsonlib.dumps(report.to_json_dict(), indent=2))
                return
            render_memory(report, unit)
            render_framework_states(report.framework_states or [], unit)
        else:
            from zerocalc.states.memory import evaluate_memory

            estimate = given(evaluate_memory(request))
            if json:
                print_json(estimate)
                return
            render_memory(estimate, unit)
        console().print(
            "[dim]· model states only: activations, buffers and the peak of a step need --model[/dim]"
        )
        return
    from zerocalc.peak.evaluate import evaluate_peak

    report = given(evaluate_peak(request))
    if json:
        import json as jsonlib

        typer.echo(jsonlib.dumps(report.to_json_dict(), indent=2))
        return
    render_memory(report, unit)
    assert report.peak is not None
    render_peak(report.peak, unit)


def _state_cell(row: StrategyMemory, kind: StateKind, unit: ByteUnit) -> str:
    from zerocalc.states.memory import Location

    states = [s for s in row.states if s.kind is kind]
    if states and all(s.location is not Location.GPU for s in states):
        return f"[dim]→ {states[0].location.value}[/dim]"
    return byte_cell(row.bytes_of(kind), unit)


def _headroom_cell(row: StrategyMemory, unit: ByteUnit) -> str:
    headroom = row.headroom_bytes or 0
    if row.fits:
        return f"[green]{byte_cell(headroom, unit)}[/green]"
    return f"[red]-{byte_cell(-headroom, unit)}[/red]"


def render_memory(estimate: MemoryEstimate, unit: ByteUnit) -> None:
    from zerocalc.states.memory import StateKind

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
        gpu = estimate.gpu
        out.print(
            f"[bold]GPU[/bold] {gpu.title}: {byte_cell(gpu.usable_bytes, unit)} {unit.value} as PyTorch "
            f"sees it ({byte_cell(gpu.memory_bytes, unit)} {unit.value} in nvidia-smi)"
        )
    out.print(
        f"[bold]Model states per GPU[/bold]: Ψ = {request.params:,} ({format_count(request.params)}), "
        f"N = {request.cluster.world_size}, {request.precision.value} + {request.optimizer.value}: "
        f"b_p = {bpp.b_p}, b_g = {bpp.b_g}, K = {k} bytes/param{extra}; units: {unit_label(unit)}"
    )
    rows = estimate.strategies
    columns = [
        Column(label, [_state_cell(row, StateKind(key), unit) for row in rows])
        for key, label in _STATE_COLUMNS
        if key != StateKind.GRAD_ACCUM.value or bpp.grad_accum > 0
    ]
    columns += [
        Column("Total\n/ GPU", [f"[bold]{byte_cell(row.gpu_bytes, unit)}[/bold]" for row in rows]),
        Column("vs\nDDP", [f"{row.fraction_of_ddp:.1%}" for row in rows]),
    ]
    if any(r.cpu_bytes_per_gpu for r in rows):
        columns += [
            Column("CPU\n/ GPU", [byte_cell(row.cpu_bytes_per_gpu, unit) for row in rows]),
            Column("CPU\n/ node", [byte_cell(row.cpu_bytes_per_node, unit) for row in rows]),
        ]
    if any(r.nvme_bytes_per_gpu for r in rows):
        columns += [
            Column("NVMe\n/ GPU", [byte_cell(row.nvme_bytes_per_gpu, unit) for row in rows]),
            Column("NVMe\n/ node", [byte_cell(row.nvme_bytes_per_node, unit) for row in rows]),
        ]
    capacity = request.states_capacity_bytes
    if capacity is not None:
        columns.append(
            Column(f"Free of\n{byte_cell(capacity, unit)}", [_headroom_cell(row, unit) for row in rows])
        )
    print_fitted("Strategy", [row.title for row in rows], columns)
    for line in estimate.assumptions[1:]:
        out.print(f"[dim]· {line}[/dim]")
    if capacity is not None:
        out.print(
            f"[dim]· free of {byte_text(capacity or 0, unit)}: the GPU's "
            f"{byte_text(request.gpu_memory_bytes or 0, unit)} less "
            f"{byte_text(request.context_bytes, unit)} held outside the caching allocator, less the "
            "model states; negative: they do not fit (the peak of a step needs --model)[/dim]"
        )
    for note in estimate.notes:
        out.print(f"[yellow]· {note}[/yellow]")


def render_framework_states(rows: list[FrameworkStates], unit: ByteUnit) -> None:
    """A framework's own accounting, one line per term and a column per strategy, then the sources."""
    if not rows:
        return
    out = console()
    out.print(f"[bold]{rows[0].source}[/bold], per GPU, {unit.value}")
    names = list(dict.fromkeys(line.name for row in rows for line in row.lines))
    lines: list[tuple[str, list[int | None]]] = [
        (name, [next((x.bytes for x in row.lines if x.name == name), None) for row in rows]) for name in names
    ]
    lines.append(("[bold]total per GPU[/bold]", [row.gpu_bytes for row in rows]))
    if any(row.framework_estimate_bytes is not None for row in rows):
        lines.append(("its own estimate", [row.framework_estimate_bytes for row in rows]))
        lines.append(("its host memory per node", [row.host_bytes_per_node for row in rows]))
    columns = [
        Column(
            _short_header(row.strategy.value),
            ["" if v[i] is None else byte_cell(v[i] or 0, unit) for _, v in lines],
        )
        for i, row in enumerate(rows)
    ]
    print_fitted("Term", [label for label, _ in lines], columns, key_width=PEAK_TERM_WIDTH)
    sources = dict.fromkeys(
        f"{line.name}: {line.source}" + ("" if line.in_framework_estimate else " (not in its estimate)")
        for row in rows
        for line in row.lines
    )
    for text in sources:
        out.print(f"[dim]· {text}[/dim]")


PEAK_TERM_WIDTH = 26
"""The longest kind of tensor ("optimizer step temporaries") fits on one line."""


def _short_header(name: str) -> str:
    """``shard_grad_op`` → ``shard_`` / ``grad_op``: a strategy's name on two lines when long."""
    head, _, tail = name.partition("_")
    return f"{head}_\n{tail}" if tail and len(name) > 8 else name


def _verdict_cell(row: StrategyPeak, unit: ByteUnit) -> str:
    from zerocalc.peak.report import Verdict

    headroom = row.headroom_bytes or 0
    if row.verdict is Verdict.FITS:
        return f"[green]fits[/green], {byte_cell(headroom, unit)} free"
    if row.verdict is Verdict.TIGHT:
        return f"[yellow]tight[/yellow], {byte_cell(headroom, unit)} free"
    return f"[red]no[/red], {byte_cell(-headroom, unit)} over"


def render_peak(peak: PeakEstimate, unit: ByteUnit) -> None:
    """The peak of one step per strategy: where it is and whether it fits, then what is alive there, one
    line per kind of tensor, down to the device footprint; then each term's source."""
    from rich.table import Table

    from zerocalc.parallel.frameworks import Framework
    from zerocalc.peak.evaluate import FIT_MARGIN
    from zerocalc.peak.kinds import TensorKind

    out = console()
    o = peak.options
    capacity = o.gpu_memory_bytes
    out.print(
        f"[bold]Peak of one training step per GPU[/bold] ({o.framework.value}, {o.model_impl.value} model "
        f"code, {o.optimizer_impl.value} Adam; s = {o.seq_len}, b = {o.micro_batch}, recompute "
        f"{o.recompute.value}), {unit.value}"
    )
    summary = Table(header_style="bold")
    summary.add_column("Strategy", ratio=1, overflow="fold")
    summary.add_column("Peak in", ratio=1, overflow="fold")
    summary.add_column("Device", justify="right", no_wrap=True)
    if capacity is not None:
        summary.add_column(f"Of {byte_cell(capacity, unit)}", no_wrap=True)
    for row in peak.strategies:
        cells = [
            f"{row.title} [dim]({row.strategy.value})[/dim]",
            f"{row.peak_phase.value}: {row.peak_event}",
            byte_cell(row.peak_bytes, unit),
        ]
        if capacity is not None:
            cells.append(_verdict_cell(row, unit))
        summary.add_row(*cells)
    out.print(summary)
    from zerocalc.parallel.strategies import STRATEGIES

    for row in peak.strategies:
        legend = STRATEGIES[row.strategy].legend_under(o.framework)
        if legend:
            out.print(f"[dim]· {row.title}: {legend}[/dim]")

    kinds = [k for k in TensorKind if any(r.term(k) for r in peak.strategies)]
    rows = peak.strategies
    lines: list[tuple[str, list[int | None]]] = [(k.value, [r.term(k) or None for r in rows]) for k in kinds]
    lines += [
        ("[bold]allocated (max_allocated)[/bold]", [r.allocated_peak_bytes for r in rows]),
        ("+ allocator reserve", [r.allocator_reserve_bytes for r in rows]),
        ("+ CUDA context, kernels", [r.context_bytes for r in rows]),
    ]
    if any(r.nccl_bytes for r in rows):
        lines.append(("+ NCCL communicators", [r.nccl_bytes or None for r in rows]))
    lines.append(("[bold]= device (cudaMemGetInfo)[/bold]", [r.peak_bytes for r in rows]))
    if o.framework is Framework.DEEPSPEED:
        lines += [
            ("DeepSpeed's own estimate", [r.framework_estimate_bytes for r in rows]),
            ("its host memory per node", [r.host_bytes_per_node for r in rows]),
        ]
    columns = [
        Column(
            _short_header(row.strategy.value),
            ["" if values[i] is None else byte_cell(values[i] or 0, unit) for _, values in lines],
        )
        for i, row in enumerate(rows)
    ]
    print_fitted("At the peak", [label for label, _ in lines], columns, key_width=PEAK_TERM_WIDTH)

    sources: dict[TensorKind, dict[str, list[str]]] = {}
    for row in rows:
        for term in row.terms:
            sources.setdefault(term.kind, {}).setdefault(term.source, []).append(row.strategy.value)
    for kind in TensorKind:
        by_source = sources.get(kind, {})
        for source, names in by_source.items():
            which = f" ({', '.join(names)})" if len(by_source) > 1 else ""
            out.print(f"[dim]· {kind.value}{which}: {source}[/dim]")
    context = "--reserve" if o.context_given else f"the {o.runtime_gpu} preset's measured figure"
    out.print(
        f"[dim]· reserve: the caching allocator replayed over model creation and three steps"
        f"{' with expandable segments' if o.expandable_segments else ''}; context "
        f"{byte_text(o.context_bytes, unit)}: {context}; NCCL: "
        f"{byte_text(o.nccl_communicator_bytes, unit)} per communicator of more than one rank; cuBLAS "
        f"workspace {byte_text(o.cublas_workspace_bytes, unit)} per stream[/dim]"
    )
    if capacity is not None:
        out.print(
            f"[dim]· tight: within {FIT_MARGIN:.0%} of the GPU's memory, the model's margin; "
            "not promised to fit[/dim]"
        )
    for note in peak.notes:
        out.print(f"[yellow]· {note}[/yellow]")
