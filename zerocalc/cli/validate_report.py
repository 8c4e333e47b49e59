"""The tables of ``zerocalc validate frameworks`` and ``validate tp``: per configuration, each rank's
model-state lines against the prediction, then every collective of the step (calls and bytes per rank)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

    from zerocalc.network.schedule import GradSync
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.validate.compare import ConfigResult, ValidationReport


def config_title(config: ConfigResult) -> str:
    """``fsdp2 · bf16-mixed``, with ``· A=2 last`` under gradient accumulation."""
    return job_title(config.strategy, config.precision, config.grad_accum, config.grad_sync)


def job_title(strategy: str, precision: PrecisionName, grad_accum: int, grad_sync: GradSync) -> str:
    """A configuration's title, before or after it runs (:func:`config_title`)."""
    title = f"{strategy} · {precision.value}"
    if grad_accum > 1:
        title += f" · A={grad_accum} {grad_sync.value}"
    return title


def progress_line(result: ConfigResult, done: int, total: int) -> str:
    seconds = f" ({result.seconds:g} s)" if result.seconds is not None else ""
    return f"{result.status}{seconds}, {done}/{total} configurations"


def _per_rank(values: list[int]) -> str:
    """One number when every rank agrees, else the range over ranks."""
    low, high = min(values, default=0), max(values, default=0)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def collective_table(config: ConfigResult) -> Table:
    from zerocalc.cli.render import collective_label, compact_table

    table = compact_table(
        ("collective", False, ""),
        ("dtype", False, ""),
        ("group", False, ""),
        ("calls\npred.", True, ""),
        ("calls\nmeas.", True, ""),
        ("bytes/rank\npred.", True, ""),
        ("bytes/rank\nmeas.", True, ""),
        ("", False, ""),
    )
    for c in config.collectives:
        table.add_row(
            collective_label(c.op, c.phase),
            c.dtype,
            f"{c.group.replace('across_nodes', 'across')} {c.group_size}",
            f"{c.predicted_calls:,}",
            _per_rank(c.measured_calls),
            _per_rank(c.predicted_bytes),
            _per_rank(c.measured_bytes),
            "✓" if c.ok else "✗ OFF",
            style=None if c.ok else "bold red",
        )
    return table


def render(report: ValidationReport) -> None:
    from rich.markup import escape
    from rich.table import Table

    from zerocalc.cli.render import COLLECTIVE_LEGEND, console
    from zerocalc.validate.config import WARMUP_STEPS

    out = console()
    out.print(
        f"[bold]{report.model}[/bold]: {report.parameters:,} parameters, {report.world_size} ranks "
        f"({report.backend}), {report.optimizer.value}; bytes per rank after one step, and the collectives "
        f"of that step (after {WARMUP_STEPS} warm-up steps)"
    )
    plan = report.tp_plan
    if plan is not None:
        firsts = range(0, plan.world, plan.tp)
        groups = ", ".join(f"{first}-{first + plan.tp - 1}" for first in firsts)
        out.print(
            f"mesh {plan.title}; TP innermost: TP groups {groups}, DP groups strided by {plan.tp}; "
            "predicted by zerocalc/validate/tp.py"
        )
    for config in report.configs:
        title = config_title(config)
        if config.status == "failed":
            out.print(f"[bold red]✗ {title}: failed: {config.error}[/bold red]")
            continue
        table = Table(title=f"{title} ({config.seconds:g} s)", title_justify="left")
        for column in ("rank", "line", "predicted", "measured", "difference", ""):
            table.add_column(column, justify="left" if column in ("line", "") else "right")
        for rank in config.ranks:
            for line in rank.lines:
                if line.ok is None:
                    mark = "n/a"
                elif line.ok:
                    mark = "✓"
                else:
                    mark = "✗ OFF" if line.model_state else "~ outside tolerance"
                style = "bold red" if line.ok is False and line.model_state else None
                table.add_row(
                    str(rank.rank),
                    line.line,
                    f"{line.predicted:,}",
                    "—" if line.measured is None else f"{line.measured:,}",
                    "—" if line.difference is None else f"{line.difference:+,}",
                    mark,
                    style=style,
                )
            table.add_section()
        out.print(table)
        if config.collectives:
            out.print(collective_table(config))
            for c in config.collectives:
                if not c.ok:
                    out.print(f"[red]  ✗ {c.op} {c.phase} {c.dtype} over {c.group}: {c.explanation}[/red]")
        if config.call_order_ok is True:
            out.print("  every rank issued the predicted calls in the predicted order ✓")
        elif config.call_order_ok is False:
            out.print(f"[red]  ✗ out of order: {escape(config.call_order_note or '')}[/red]")
    out.print(
        f"[dim]· {COLLECTIVE_LEGEND}; calls and bytes sent per rank in the step, pred. predicted by "
        "zerocalc, meas. measured (every rank, or its range)[/dim]"
    )
    out.print(f"peak: {report.peak}")
    counts = {s: sum(1 for c in report.configs if c.status == s) for s in ("match", "mismatch", "failed")}
    verdict = (
        "every model-state line and collective matches exactly"
        if report.all_match
        else "[bold red]NOT all match[/bold red]"
    )
    out.print(
        f"{counts['match']} configuration{'' if counts['match'] == 1 else 's'} match, "
        f"{counts['mismatch']} mismatch, "
        f"{counts['failed']} failed: {verdict}"
    )
