"""``zerocalc plan``: the fastest data-parallel configuration that fits, searched, timed and explained."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError
from zerocalc.base.units import ByteUnit, parse_byte_unit
from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app
from zerocalc.cli.render import (
    Column,
    byte_cell,
    console,
    print_fitted,
    print_json,
    print_phrases,
    unit_label,
)
from zerocalc.render.plan import candidate_label, command
from zerocalc.render.tables import STEP_TIME_ACCURACY
from zerocalc.request.launch import with_launch_configs
from zerocalc.request.options import Command, echo

if TYPE_CHECKING:
    from zerocalc.plan.search import PlanResult


@app.command(cls=PlainTextCommand)
@opt.takes_options(Command.PLAN)
def plan(values: dict[str, Any], given_flags: frozenset[str]) -> None:
    """Search strategies, frameworks, micro-batch × accumulation, recompute, offload, reduce dtype,
    prefetch, gradient sync and whole nodes: the configurations that fit, fastest first, each with the
    memory and comm commands that reproduce it."""
    from zerocalc.plan.search import search
    from zerocalc.plan.space import PlanOptions, parse_plan

    unit = parse_byte_unit(values["units"])
    json, every = values["json"], values["all_candidates"]
    if every and not json:
        raise InputError(
            "--all-candidates lists every candidate in the JSON; accepted: --json --all-candidates"
        )
    given, _ = with_launch_configs(Command.PLAN, values, given_flags)
    request = parse_plan(PlanOptions(**given))
    html = values["html"]
    if html is not None:  # refused before the search: plotly missing, a path not writable
        from zerocalc.cli.html import check_html

        check_html(html)
    progress = _Progress()
    try:  # --html draws every candidate: kept only then
        result = search(request, progress.update, keep_all=every or html is not None)
        result = result.model_copy(update={"options": echo(Command.PLAN, given)})
    finally:
        progress.close()
    if html is not None:
        from zerocalc.cli.html import write_html
        from zerocalc.render.html_plan import plan_page

        write_html(html, plan_page(result), json)
        if not every:
            result = result.model_copy(update={"candidates": None})
    if json:
        print_json(result)
        return
    render_plan(result, unit)


class _Progress:
    """Progress on stderr once the search has run for more than a second (zerocalc.harness.procs.Progress),
    on a terminal only: a search takes seconds, and piped or logged, its lines would only clutter what
    reads stderr."""

    def __init__(self) -> None:
        import sys

        self.start = time.perf_counter()
        self.bar = None
        self.shows = sys.stderr.isatty()

    def update(self, done: int, total: int) -> None:
        if not self.shows:
            return
        if self.bar is None:
            if time.perf_counter() - self.start < 1.0 or done >= total:
                return
            from zerocalc.harness.procs import Progress

            self.bar = Progress("zerocalc plan", 20)
        self.bar.step("groups", f"{done}/{total} groups of candidates")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def render_plan(result: PlanResult, unit: ByteUnit) -> None:
    out = console()
    r = result.request
    print_phrases(
        f"[bold]{r.model}{f', {r.method},' if r.method else ''} on up to {r.max_gpus} × {r.gpu}:[/bold]",
        f"global batch {r.global_batch_tokens:,} tokens",
        f"({r.global_batch_sequences:,} × {r.seq_len:,}),",
        f"objective {r.objective.value}",
    )
    rows = result.top
    if not rows:
        out.print("[bold red]No configuration fits.[/bold red]")
    else:
        print_fitted(
            "Configuration",
            [candidate_label(row) for row in rows],
            [
                Column(f"Peak\n{unit.value}", [byte_cell(row.peak_bytes or 0, unit) for row in rows]),
                Column(f"Free\n{unit.value}", [byte_cell(row.headroom_bytes or 0, unit) for row in rows]),
                Column("Step\ns", [f"{row.step_s:.3f}" for row in rows]),
                Column("Exposed\ncomm s", [f"{row.exposed_comm_s:.3f}" for row in rows]),
                Column("tok/s\n/GPU", [f"{row.tokens_per_s_per_gpu:,.0f}" for row in rows]),
                Column("MFU", [f"{row.mfu:.1%}" for row in rows]),
            ],
            key_width=24,
        )
        out.print(
            f"[dim]{unit_label(unit)}; Peak: memory's exact peak_bytes; Free: headroom to the GPU's "
            "memory[/dim]"
        )
        print_fitted(
            "Step (s)",
            [f"#{row.rank}" for row in rows],
            [
                Column("Matmul", [f"{row.matmul_s:.3f}" for row in rows]),
                Column("Attn", [f"{row.attention_s:.3f}" for row in rows]),
                Column("Elem-\nwise", [f"{row.elementwise_s:.3f}" for row in rows]),
                Column("Optim", [f"{row.optimizer_s:.3f}" for row in rows]),
                Column("Re-\ncompute", [f"{row.recompute_s:.3f}" for row in rows]),
                Column("Comm", [f"{row.exposed_comm_s:.3f}" for row in rows]),
                Column("Off-\nload", [f"{row.offload_s:.3f}" for row in rows]),
            ],
            key_width=8,
        )
        out.print(
            f"[dim]compute by class (recompute included in each, and shown apart) at the rates of "
            f"{r.compute_table} compute table; Comm: exposed[/dim]"
        )
        out.print(f"[dim]· {STEP_TIME_ACCURACY}[/dim]")
        out.print("[bold]Reproduce[/bold] (peak: memory's peak_bytes; comm: its time_s for the strategy):")
        for row in rows:
            out.print(f"{row.rank}. {command('memory', row.memory_options)}", soft_wrap=True, markup=False)
            out.print(f"   {command('comm', row.comm_options)}", soft_wrap=True, markup=False)
    out.print(
        f"[bold]Searched[/bold] {result.candidates_evaluated:,} candidates in {result.search_seconds:.2f} s "
        f"({result.candidates_per_second:,.0f}/s), each with its peak (the step's allocated peak plus the "
        "runtime context and collective communicators: a lower bound of the device peak), communication and "
        "step time (none for a model-parallel one whose bound is above the limit: it cannot be ranked); then "
        f"{result.exact_peaks:,} evaluated exactly (memory's full model, the allocator replayed) in "
        f"{result.exact_seconds:.2f} s"
    )
    if result.rejections:
        out.print("[bold]Left out[/bold] (candidates):")
        for rejection in result.rejections:
            out.print(f"  {rejection.candidates:>7,}  {rejection.reason}", markup=False)
    for line in result.assumptions:
        out.print(f"[dim]· {line}[/dim]")
