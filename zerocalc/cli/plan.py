"""``zerocalc plan``: the fastest data-parallel configuration that fits, searched, timed and explained."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from zerocalc.base.units import ByteUnit, parse_byte_unit
from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app, flag
from zerocalc.cli.render import (
    Column,
    byte_cell,
    console,
    print_fitted,
    print_json,
    print_phrases,
    unit_label,
)

if TYPE_CHECKING:
    from zerocalc.plan.search import PlanResult, PlanRow

GlobalBatch = Annotated[
    str | None,
    typer.Option(
        "--global-batch",
        "-B",
        help="Per optimizer step: tokens (4194304, 4M = 4,000,000; a multiple of --seq-len) or sequences "
        "(512seq). b × A × N equals it exactly.",
    ),
]
Frameworks = Annotated[
    str | None,
    typer.Option(
        "--framework",
        help="all, or a comma list of paper, deepspeed, megatron, fsdp, fsdp2, torch-zero1, ddp "
        "\\[default: fsdp2,torch-zero1,deepspeed].",
        show_default=False,
    ),
]
CalibrationOpt = Annotated[
    str | None, typer.Option("--calibration", help="A calibration JSON written by `zerocalc bench`.")
]
ObjectiveOpt = Annotated[
    str, typer.Option("--objective", help="time (shortest step), gpus (fewest GPUs) or memory (lowest peak).")
]
Top = Annotated[str, typer.Option("--top", "-k", help="K: configurations shown.")]
Mfu = Annotated[
    str,
    typer.Option(
        "--mfu",
        help="Fraction of the GPU's dense bf16 peak executed FLOPs run at (torchtitan: 0.33-0.39 for Llama "
        "3.1 8B FSDP2 on 8 H100; PaLM 0.46).",
    ),
]
GpusMax = Annotated[
    str,
    typer.Option("--gpus", "-n", metavar="N", help="N: the most GPUs; fewer whole nodes are searched too."),
]


@app.command(cls=PlainTextCommand)
def plan(
    model: opt.Model = None,
    gpu: opt.Gpu = None,
    gpus: GpusMax = "8",
    gpus_per_node: opt.GpusPerNode = None,
    global_batch: GlobalBatch = None,
    seq_len: opt.SeqLen = "2048",
    framework: Frameworks = None,
    calibration: CalibrationOpt = None,
    objective: ObjectiveOpt = "time",
    top: Top = "5",
    mfu: Mfu = "0.4",
    units: opt.Units = "GiB",
    json: opt.Json = False,
) -> None:
    """Search strategies, frameworks, micro-batch × accumulation, recompute, offload, reduce dtype,
    prefetch, gradient sync and whole nodes: the configurations that fit, fastest first, each with the
    memory and comm commands that reproduce it."""
    from zerocalc.plan.search import search
    from zerocalc.plan.space import PlanOptions, parse_plan

    unit = parse_byte_unit(units)
    request = parse_plan(
        PlanOptions(
            model=model,
            gpu=gpu,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            global_batch=global_batch,
            seq_len=seq_len,
            frameworks=framework,
            calibration=calibration,
            objective=objective,
            top=top,
            mfu=mfu,
        )
    )
    progress = _Progress()
    try:
        result = search(request, progress.update, keep_all=json)
    finally:
        progress.close()
    if json:
        print_json(result)
        return
    render_plan(result, unit)


class _Progress:
    """Progress on stderr once the search has run for more than a second (zerocalc.harness.procs.Progress)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.bar = None

    def update(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.perf_counter() - self.start < 1.0 or done >= total:
                return
            from zerocalc.harness.procs import Progress

            self.bar = Progress("zerocalc plan", 20)
        self.bar.step("groups", f"{done}/{total} groups of candidates")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def command(name: str, options: dict[str, str]) -> str:
    """``zerocalc memory --model ... --gpus 8 ...``: a candidate's options as a command line."""
    import shlex

    parts = ["zerocalc", name]
    for concept, value in options.items():
        parts += [flag(concept), shlex.quote(value)]
    return " ".join(parts)


def _label(row: PlanRow) -> str:
    node = f" g{row.gpus_per_node}" if row.strategy.value == "hybrid_shard" else ""
    extras = [f"b{row.micro_batch}×A{row.grad_accum}"]
    if row.recompute.value != "none":
        extras.append(f"rc {row.recompute.value}")
    if row.offload_optimizer.value != "none":
        extras.append(f"opt→{row.offload_optimizer.value}")
    if row.offload_params.value != "none":
        extras.append(f"params→{row.offload_params.value}")
    if row.reduce_dtype is not None:
        extras.append(f"reduce {row.reduce_dtype.value}")
    if row.prefetch is not None:
        extras.append(f"prefetch {row.prefetch}")
    if row.grad_sync is not None:
        extras.append(f"sync {row.grad_sync.value}")
    framework = row.framework.value
    named = framework.replace("-", "") in row.title.lower().replace("-", "")  # "FSDP2 HSDP" names fsdp2
    head = f"{row.rank}. {'' if named else framework + ' '}{row.title}{node} ×{row.gpus}"
    return head + "\n" + " ".join(extras)


def render_plan(result: PlanResult, unit: ByteUnit) -> None:
    out = console()
    r = result.request
    print_phrases(
        f"[bold]{r.model} on up to {r.max_gpus} × {r.gpu}:[/bold]",
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
            [_label(row) for row in rows],
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
        out.print("[bold]Reproduce[/bold] (peak: memory's peak_bytes; comm: its time_s for the strategy):")
        for row in rows:
            out.print(f"{row.rank}. {command('memory', row.memory_options)}", soft_wrap=True, markup=False)
            out.print(f"   {command('comm', row.comm_options)}", soft_wrap=True, markup=False)
    out.print(
        f"[bold]Searched[/bold] {result.candidates_evaluated:,} candidates in {result.search_seconds:.2f} s "
        f"({result.candidates_per_second:,.0f}/s), each with its peak (the step's allocated peak plus the "
        "context and NCCL: a lower bound of the device peak), communication and step time; then "
        f"{result.exact_peaks:,} evaluated exactly (memory's full model, the allocator replayed) in "
        f"{result.exact_seconds:.2f} s"
    )
    if result.rejections:
        out.print("[bold]Left out[/bold] (candidates):")
        for rejection in result.rejections:
            out.print(f"  {rejection.candidates:>7,}  {rejection.reason}", markup=False)
    for line in result.assumptions:
        out.print(f"[dim]· {line}[/dim]")
