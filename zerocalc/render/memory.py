"""The tables of ``zerocalc memory``: model states per strategy, a framework's own accounting, and the peak
of one step (printed by the CLI, and by the results' display in a notebook or on a Rich console)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerocalc.base.units import ByteUnit, format_count
from zerocalc.render.tables import (
    Column,
    Output,
    byte_cell,
    byte_text,
    print_fitted,
    print_phrases,
    unit_label,
)

if TYPE_CHECKING:
    from zerocalc.peak.report import FrameworkStates, PeakEstimate, StrategyPeak
    from zerocalc.states.memory import MemoryEstimate, MemoryRequest, StateKind, StrategyMemory

_STATE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("params", "Params"),
    ("frozen", "Frozen"),
    ("quantized", "Quan-\ntised"),
    ("grads", "Grads"),
    ("grad_accum", "fp32\ngrad acc."),
    ("optimizer", "Optimizer"),
)

_FINETUNE_KINDS = ("frozen", "quantized")
"""The columns of a fine-tuning run's frozen and quantised parameters (shown where a row has them)."""


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


Value = int | float | str | None
"""A table cell's value in :func:`memory_rows`: bytes, a fraction, a text, or absent."""

FREE_KEY = "Free"
"""The key of the model-state table's "Free of <capacity>" column."""
VERDICT_KEY = "Of GPU"
"""The key of the peak table's "Of <capacity>" column (fits, tight or does not fit)."""


def _state_columns(estimate: MemoryEstimate, unit: ByteUnit) -> list[tuple[Column, list[Value], str]]:
    """The model-state table's columns after the strategy, each with its rows' values (bytes on the GPU,
    0 for a state the table shows offloaded; fractions) and its key in :func:`memory_rows`."""
    from zerocalc.states.memory import StateKind

    rows = estimate.strategies
    bpp = estimate.bytes_per_parameter

    columns = [
        (
            Column(label, [_state_cell(row, StateKind(key), unit) for row in rows]),
            [row.bytes_of(StateKind(key)) for row in rows],
            column_key(label),
        )
        for key, label in _STATE_COLUMNS
        if (key != StateKind.GRAD_ACCUM.value or bpp.grad_accum > 0)
        and (key not in _FINETUNE_KINDS or any(s.kind.value == key for row in rows for s in row.states))
    ]
    columns += [
        (
            Column("Total\n/ GPU", [f"[bold]{byte_cell(row.gpu_bytes, unit)}[/bold]" for row in rows]),
            [row.gpu_bytes for row in rows],
            column_key("Total\n/ GPU"),
        ),
        (
            Column("vs\nDDP", [f"{row.fraction_of_ddp:.1%}" for row in rows]),
            [row.fraction_of_ddp for row in rows],
            column_key("vs\nDDP"),
        ),
    ]
    sizes: list[tuple[str, list[int]]] = []
    if any(r.cpu_bytes_per_gpu for r in rows):
        sizes += [
            ("CPU\n/ GPU", [row.cpu_bytes_per_gpu for row in rows]),
            ("CPU\n/ node", [row.cpu_bytes_per_node for row in rows]),
        ]
    if any(r.nvme_bytes_per_gpu for r in rows):
        sizes += [
            ("NVMe\n/ GPU", [row.nvme_bytes_per_gpu for row in rows]),
            ("NVMe\n/ node", [row.nvme_bytes_per_node for row in rows]),
        ]
    columns += [
        (Column(header, [byte_cell(v, unit) for v in values]), list(values), column_key(header))
        for header, values in sizes
    ]
    capacity = estimate.request.states_capacity_bytes
    if capacity is not None:
        columns.append(
            (
                Column(f"Free of\n{byte_cell(capacity, unit)}", [_headroom_cell(row, unit) for row in rows]),
                [row.headroom_bytes for row in rows],
                FREE_KEY,
            )
        )
    return columns


def _finetune_phrases(estimate: MemoryEstimate, unit: ByteUnit) -> list[str]:
    """A fine-tuning run's heading: the trained parameters with their bytes per parameter (stored,
    gradient, optimizer), the frozen and the quantised parameters with their whole model's bytes."""
    summary = estimate.finetune
    assert summary is not None
    bpp, counts = estimate.bytes_per_parameter, summary.counts
    extra = f" + {bpp.grad_accum}" if bpp.grad_accum else ""
    quantized = counts.quantized
    frozen = counts.frozen - (quantized.weights if quantized is not None else 0)
    phrases = [
        f"trained {counts.trainable:,}",
        f"(b_p = {bpp.b_p}, b_g = {bpp.b_g}, K = {bpp.k:g}{extra} bytes each),",
        f"frozen {frozen:,} ({byte_text(summary.frozen_bytes, unit)})" + ("," if quantized else ";"),
    ]
    if quantized is not None:
        phrases.append(f"quantised {quantized.weights:,} ({byte_text(summary.quantized_bytes, unit)});")
    return phrases


def render_memory(out: Output, estimate: MemoryEstimate, unit: ByteUnit) -> None:
    """The model-state table: a line on the model, the GPU and the recipe, a row per strategy, then the
    assumptions and notes."""
    request = estimate.request
    bpp = estimate.bytes_per_parameter
    k = f"{bpp.k:g}"
    extra = f" + {bpp.grad_accum} (fp32 grad accumulation)" if bpp.grad_accum else ""
    if estimate.model is not None:
        count = estimate.model.parameter_count
        active = (
            f", {format_count(count.active_per_token)} active per token"
            if count.active_per_token != count.total
            else ""
        )
        print_phrases(
            out,
            f"[bold]Model[/bold] {estimate.model.title or estimate.model.name}:",
            f"{count.total:,} parameters{active};",
            f"largest layer {count.largest_layer_name} ({count.largest_layer_params:,})",
        )
    if estimate.gpu is not None:
        gpu = estimate.gpu
        out.print(
            f"[bold]GPU[/bold] {gpu.title}: {byte_cell(gpu.usable_bytes, unit)} {unit.value} as PyTorch "
            f"sees it ({byte_cell(gpu.memory_bytes, unit)} {unit.value} in {gpu.memory_tool})"
        )
    print_phrases(
        out,
        f"[bold]Model states per GPU[/bold]: Ψ = {request.params:,} ({format_count(request.params)}),",
        f"N = {request.mesh.world}" + (f" ({mesh_text})," if (mesh_text := _mesh_text(request)) else ","),
        *(
            [f"Ψ_t = {request.rank_params:,} per TP rank,"]
            if request.mesh.tp > 1 and request.mesh.pp == 1
            else []
        ),
        *([f"Ψ_s = {request.rank_params:,} on the largest stage,"] if request.mesh.pp > 1 else []),
        f"{request.precision.value} + {request.optimizer.value}:",
        *(
            _finetune_phrases(estimate, unit)
            if estimate.finetune is not None
            else [f"b_p = {bpp.b_p},", f"b_g = {bpp.b_g},", f"K = {k} bytes/param{extra};"]
        ),
        f"units: {unit_label(unit)}",
    )
    capacity = request.states_capacity_bytes
    columns = [column for column, _, _ in _state_columns(estimate, unit)]
    print_fitted(out, "Strategy", [row.title for row in estimate.strategies], columns)
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


def _framework_lines(rows: list[FrameworkStates]) -> list[tuple[str, list[int | None]]]:
    """The framework accounting's lines (their labels as printed) with each strategy's bytes."""
    names = list(dict.fromkeys(line.name for row in rows for line in row.lines))
    lines: list[tuple[str, list[int | None]]] = [
        (name, [next((x.bytes for x in row.lines if x.name == name), None) for row in rows]) for name in names
    ]
    lines.append(("[bold]total per GPU[/bold]", [row.gpu_bytes for row in rows]))
    if any(row.framework_estimate_bytes is not None for row in rows):
        lines.append(("its own estimate", [row.framework_estimate_bytes for row in rows]))
        lines.append(("its host memory per node", [row.host_bytes_per_node for row in rows]))
    return lines


def render_framework_states(out: Output, rows: list[FrameworkStates], unit: ByteUnit) -> None:
    """A framework's own accounting, one line per term and a column per strategy, then the sources."""
    if not rows:
        return
    out.print(f"[bold]{rows[0].source}[/bold], per GPU, {unit.value}")
    lines = _framework_lines(rows)
    columns = _strategy_columns(rows, lines, unit)
    print_fitted(out, "Term", [label for label, _ in lines], columns, key_width=PEAK_TERM_WIDTH)
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


def _strategy_columns(rows: list, lines: list, unit: ByteUnit) -> list[Column]:
    """One column per strategy of ``rows``: each line's value for it in ``unit`` (blank where None)."""
    return [
        Column(
            _short_header(row.strategy.value),
            ["" if values[i] is None else byte_cell(values[i] or 0, unit) for _, values in lines],
        )
        for i, row in enumerate(rows)
    ]


def _verdict_cell(row: StrategyPeak, unit: ByteUnit) -> str:
    from zerocalc.peak.report import Verdict

    headroom = row.headroom_bytes or 0
    if row.verdict is Verdict.FITS:
        return f"[green]fits[/green], {byte_cell(headroom, unit)} free"
    if row.verdict is Verdict.TIGHT:
        return f"[yellow]tight[/yellow], {byte_cell(headroom, unit)} free"
    return f"[red]no[/red], {byte_cell(-headroom, unit)} over"


def _peak_lines(peak: PeakEstimate) -> list[tuple[str, list[int | None]]]:
    """What is alive at each strategy's peak, one line per kind of tensor, down to the device footprint
    (the labels as printed; the runtime's as its GPU preset names them)."""
    from zerocalc.parallel.framework_records import FRAMEWORKS
    from zerocalc.peak.kinds import TensorKind

    names = peak.options.runtime_names
    rows = peak.strategies
    kinds = [k for k in TensorKind if any(r.term(k) for r in rows)]
    lines: list[tuple[str, list[int | None]]] = [(k.value, [r.term(k) or None for r in rows]) for k in kinds]
    lines += [
        ("[bold]allocated (max_allocated)[/bold]", [r.allocated_peak_bytes for r in rows]),
        ("+ allocator reserve", [r.allocator_reserve_bytes for r in rows]),
        (f"+ {names.context}, kernels", [r.context_bytes for r in rows]),
    ]
    if any(r.nccl_bytes for r in rows):
        lines.append((f"+ {names.collectives} communicators", [r.nccl_bytes or None for r in rows]))
    lines.append((f"[bold]= device ({names.mem_get_info})[/bold]", [r.peak_bytes for r in rows]))
    if FRAMEWORKS[peak.options.framework].estimate_covers_states_only:
        lines += [
            ("DeepSpeed's own estimate", [r.framework_estimate_bytes for r in rows]),
            ("its host memory per node", [r.host_bytes_per_node for r in rows]),
        ]
    return lines


def render_peak(out: Output, peak: PeakEstimate, unit: ByteUnit) -> None:
    """The peak of one step per strategy: where it is and whether it fits, then what is alive there, one
    line per kind of tensor, down to the device footprint; then each term's source."""
    from rich.table import Table

    from zerocalc.parallel.framework_records import FRAMEWORKS
    from zerocalc.peak.evaluate import FIT_MARGIN
    from zerocalc.peak.kinds import TensorKind

    o = peak.options
    capacity = o.gpu_memory_bytes
    print_phrases(
        out,
        f"[bold]Peak of one training step per GPU[/bold] ({o.framework.value},",
        f"{o.model_impl.value} model code,",
        f"{o.optimizer_step};",
        f"s = {o.seq_len},",
        f"b = {o.micro_batch},",
        f"recompute {o.recompute.value}),",
        unit.value,
    )
    summary = Table(header_style="bold")
    summary.add_column("Strategy", ratio=1, overflow="fold")
    summary.add_column("Peak in", ratio=1, overflow="fold")
    summary.add_column("Device", justify="right", no_wrap=True)
    if capacity is not None:
        summary.add_column(f"Of {byte_cell(capacity, unit)}", no_wrap=True)
    for row in peak.strategies:
        where = f"{row.peak_phase.value}: {row.peak_event}"
        cells = [
            f"{row.title} [dim]({row.strategy.value})[/dim]",
            where if row.stage is None else f"stage {row.stage}, {where}",
            byte_cell(row.peak_bytes, unit),
        ]
        if capacity is not None:
            cells.append(_verdict_cell(row, unit))
        summary.add_row(*cells)
    out.print(summary)
    for row in peak.strategies:
        _print_stages(out, row, unit)

    for row in peak.strategies:
        legend = FRAMEWORKS[o.framework].legend_of(row.strategy)
        if legend:
            out.print(f"[dim]· {row.title}: {legend}[/dim]")

    rows = peak.strategies
    lines = _peak_lines(peak)
    columns = _strategy_columns(rows, lines, unit)
    print_fitted(out, "At the peak", [label for label, _ in lines], columns, key_width=PEAK_TERM_WIDTH)

    sources: dict[TensorKind, dict[str, list[str]]] = {}
    for row in rows:
        for term in row.terms:
            sources.setdefault(term.kind, {}).setdefault(term.source, []).append(row.strategy.value)
    for kind in TensorKind:
        by_source = sources.get(kind, {})
        for source, names in by_source.items():
            which = f" ({', '.join(names)})" if len(by_source) > 1 else ""
            out.print(f"[dim]· {kind.value}{which}: {source}[/dim]")
    names = o.runtime_names
    figure = "measured" if o.context_measured else "estimated"
    context = "--reserve" if o.context_given else f"the {o.runtime_gpu} preset's {figure} figure"
    out.print(
        f"[dim]· reserve: the caching allocator replayed over model creation and three steps"
        f"{' with expandable segments' if o.expandable_segments else ''}; context "
        f"{byte_text(o.context_bytes, unit)}: {context}; {names.collectives}: "
        f"{byte_text(o.nccl_communicator_bytes, unit)} per communicator of more than one rank; "
        f"{names.blas} workspace {byte_text(o.cublas_workspace_bytes, unit)} per stream[/dim]"
    )
    retried = [row.strategy.value for row in rows if row.allocator_retried]
    if retried:
        which = f" ({', '.join(retried)})" if len(rows) > 1 else ""
        out.print(
            f"[dim]· reserve{which}: the replay ran out of the GPU's free memory; the caching allocator "
            "freed its unused cached segments and retried (release_cached_blocks), and the step fit: its "
            "reserve is after that[/dim]"
        )
    if capacity is not None:
        out.print(
            f"[dim]· tight: within {FIT_MARGIN:.0%} of the GPU's memory, the model's margin; "
            "not promised to fit[/dim]"
        )
    if peak.init_host_bytes_per_node is not None:
        out.print(
            f"[dim]· host memory per node at creation (--init cpu): "
            f"{byte_text(peak.init_host_bytes_per_node, unit)}, {peak.init_host_model} per rank that "
            "loads it[/dim]"
        )
    if peak.offloaded_activations_host_bytes is not None:
        out.print(
            f"[dim]· pinned host memory per GPU of the offloaded activations (--offload-activations): "
            f"{byte_text(peak.offloaded_activations_host_bytes, unit)}[/dim]"
        )
    for note in peak.notes:
        out.print(f"[yellow]· {note}[/yellow]")


def in_flight_text(micro_batches: float) -> str:
    """Micro-batches in flight, to two decimals without trailing zeros (4, 5.5, 10.33)."""
    return f"{micro_batches:.2f}".rstrip("0").rstrip(".")


def _print_stages(out: Output, row: StrategyPeak, unit: ByteUnit) -> None:
    """A pipeline's stages on a line or a few: each stage's device footprint and the micro-batches' worth
    of activations it holds in flight."""
    if not row.stages:
        return
    phrases = [f"[dim]· {row.strategy.value} per stage, device (micro-batches in flight):[/dim]"]
    for stage in row.stages:
        comma = "," if stage is not row.stages[-1] else ""
        device = byte_cell(stage.peak_bytes, unit)
        phrases.append(f"[dim]{stage.stage}: {device} ({in_flight_text(stage.in_flight)}){comma}[/dim]")
    print_phrases(out, *phrases)


def render_result(out: Output, estimate: MemoryEstimate, unit: ByteUnit) -> None:
    """Every table ``zerocalc memory`` prints for this result: model states, then a framework's own
    accounting of them or the peak of one step when the result has one."""
    from zerocalc.peak.report import MemoryReport

    render_memory(out, estimate, unit)
    if isinstance(estimate, MemoryReport):
        if estimate.framework_states:
            render_framework_states(out, estimate.framework_states, unit)
        if estimate.peak is not None:
            render_peak(out, estimate.peak, unit)


def column_key(header: str) -> str:
    """A table header as one line of plain text (``"Total\\n/ GPU"`` → ``"Total / GPU"``)."""
    from rich.text import Text

    return " ".join(Text.from_markup(header).plain.split())


def memory_rows(estimate: MemoryEstimate) -> list[dict[str, Value]]:
    """One dict per strategy: ``strategy`` (its name), then the tables' columns and lines under their
    headers as printed, sizes in bytes and fractions as fractions (``vs DDP`` 0.25 for 25.0%)."""
    from zerocalc.peak.report import MemoryReport

    rows: list[dict[str, Value]] = [
        {"strategy": r.strategy.value, "Strategy": r.title} for r in estimate.strategies
    ]
    for _, values, key in _state_columns(estimate, ByteUnit.B):
        for row, value in zip(rows, values, strict=True):
            row[key] = value
    if not isinstance(estimate, MemoryReport):
        return rows
    by_name = {row["strategy"]: row for row in rows}
    if estimate.framework_states:
        _put_lines(by_name, estimate.framework_states, _framework_lines(estimate.framework_states))
    if estimate.peak is not None:
        peaks = estimate.peak.strategies
        for peak in peaks:
            row = by_name[peak.strategy.value]
            row["Peak in"] = f"{peak.peak_phase.value}: {peak.peak_event}"
            row["Device"] = peak.peak_bytes
            if estimate.peak.options.gpu_memory_bytes is not None:
                row[VERDICT_KEY] = None if peak.verdict is None else peak.verdict.value
                row[FREE_KEY] = peak.headroom_bytes
        _put_lines(by_name, peaks, _peak_lines(estimate.peak))
    return rows


def _put_lines(
    by_name: dict[Value, dict[str, Value]], strategies: list, lines: list[tuple[str, list[int | None]]]
) -> None:
    """Each line's value for each of ``strategies`` (a column per strategy) into that strategy's row, under
    the line's label as plain text."""
    for label, values in lines:
        for strategy, value in zip(strategies, values, strict=True):
            by_name[strategy.strategy.value][column_key(label)] = value


def _mesh_text(request: MemoryRequest) -> str | None:
    """``dp 1 × tp 8 + sp`` where the run is more than data-parallel."""
    return request.mesh.describe() if request.mesh.model_parallel else None
