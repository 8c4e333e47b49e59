"""``zerocalc validate pipeline``: real ``torch.distributed.pipelining`` stages (Schedule1F1B; bare, DDP or
FSDP2 over each stage's data-parallel ranks) on ``--nproc`` processes, each rank's model states and every
point-to-point call compared with the prediction, exactly; ``--fake``: FSDP2 stages under fake tensors at
any ``--world``, each stage's model states and buffers against the prediction.

Thin: read the options, call :mod:`zerocalc.validate.pipeline_run`, render. torch is imported only once the
run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError
from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import comma_list, seconds, takes_measure, whole_number
from zerocalc.cli.validate_common import (
    MAX_RANKS,
    finish,
    mark,
    optimizer,
    precisions,
    progress_of,
    require_torch,
    reshards,
    shape,
    size_overrides,
    spawned_ranks,
    step_line,
)

if TYPE_CHECKING:
    from zerocalc.validate.pipeline import FakePipelineReport, PipelineReport

SHORT = {"forward": "fwd", "backward": "bwd"}


@takes_measure(Measure.PIPELINE)
def pipeline(values: dict[str, Any], given: frozenset[str]) -> None:
    """Schedule1F1B pipeline stages on processes (--fake: under fake tensors).

    Run torch.distributed.pipelining's Schedule1F1B on pp × dp processes (bare, DDP or FSDP2 stages);
    compare each rank's bytes and every send and receive with the prediction, exactly. --fake: FSDP2
    stages under fake tensors at each --world, each stage's states and buffers. Without --model: GPT-2
    shrunk, a block per stage, its head untied."""
    pp = whole_number(values["pp"], "--pp")
    microbatches = whole_number(values["grad_accum"], "--grad-accum")
    assert pp is not None
    if values["fake"]:
        _fake_pipeline(values, pp, microbatches)
    else:
        _pipeline(values, pp, microbatches)


def _pipeline(values: dict[str, Any], pp: int, microbatches: int | None) -> None:
    """Every strategy × precision of a P-stage Schedule1F1B over --nproc spawned ranks."""
    from zerocalc.harness import procs
    from zerocalc.validate.pipeline import PIPELINE_STRATEGIES, check_pipeline, pipeline_architecture

    nproc = spawned_ranks(values, "pipeline")
    chosen = comma_list(values["configurations"], "--strategies", PIPELINE_STRATEGIES, allow_all=True)
    recipes, opt = precisions(values["precision"]), optimizer(values["optimizer"])
    timeout = seconds(values["timeout"])
    if pp < 2 or nproc % pp:
        raise InputError(
            f"--pp {procs.brief(pp)} with --nproc {nproc} is not accepted; accepted: 2 or more stages "
            "dividing --nproc"
        )
    first = whole_number(values["pp_first_stage_layers"], "--pp-first-stage-layers")
    last = whole_number(values["pp_last_stage_layers"], "--pp-last-stage-layers")
    m = 2 * pp if microbatches is None else microbatches
    arch = pipeline_architecture(values["model"], size_overrides(values), pp)
    check_pipeline(arch, pp, nproc, m, first, last)
    require_torch()
    from zerocalc.validate.pipeline_run import run_pipeline

    with progress_of(len(chosen) * len(recipes)) as progress:
        report = run_pipeline(
            arch, pp, chosen, recipes, opt, m, nproc, timeout, step_line(progress), first, last
        )
    finish(report, values["json"], render_pipeline, report.all_match)


def _fake_pipeline(values: dict[str, Any], pp: int, microbatches: int | None) -> None:
    """``--fake``: every stage of a P-stage Schedule1F1B with FSDP2 at each fake world size."""
    from zerocalc.validate.pipeline import FakePipelineCase, check_pipeline, pipeline_architecture

    world = values["world"]
    worlds = []
    for text in world.split(","):
        size = text.strip()
        if not size.isdigit() or not 1 <= int(size) <= MAX_RANKS or int(size) % max(pp, 1):
            raise InputError(
                f"--world {world!r} with --pp {pp} is not accepted; accepted: a comma list of world sizes, "
                f"multiples of {pp} up to {MAX_RANKS:,}"
            )
        worlds.append(int(size))
    recipes, opt = precisions(values["precision"]), optimizer(values["optimizer"])
    resharding = reshards(values["reshard"])
    micro_batch, seq_len = shape(values, at_most=None)
    m = 2 * pp if microbatches is None else microbatches
    arch = pipeline_architecture(values["model"], size_overrides(values), pp)
    for size in worlds:
        check_pipeline(arch, pp, size, m)
    cases = [
        FakePipelineCase(
            world=size, pp=pp, stage=stage, microbatches=m, micro_batch=micro_batch, seq_len=seq_len,
            precision=p, reshard=r,
        )
        for size in dict.fromkeys(worlds)
        for p in recipes
        for r in resharding
        for stage in range(pp)
    ]  # fmt: skip
    require_torch()
    from zerocalc.validate.pipeline_run import run_fake_pipeline

    report = run_fake_pipeline(arch, cases, opt)
    finish(report, values["json"], render_fake_pipeline, report.all_match)


def render_pipeline(report: PipelineReport) -> None:
    """Per configuration: each rank's model states, its sends and receives, its gradient reduction."""
    from rich.markup import escape

    from zerocalc.cli.render import Column, console, print_fitted
    from zerocalc.parallel.mesh import describe_layer_counts
    from zerocalc.validate.config import WARMUP_STEPS

    out = console()
    blocks = describe_layer_counts(tuple(report.stage_blocks))
    if len(set(report.stage_blocks)) == 1:
        blocks = f"{report.stage_blocks[0]} block{'s' if report.stage_blocks[0] > 1 else ''}"
    else:
        blocks += " blocks"
    out.print(
        f"[bold]{escape(report.model)}[/bold]: {report.pp} stages of {blocks}, "
        f"{report.world_size} ranks (pp {report.pp} × dp {report.dp}, {report.backend}), {report.schedule}, "
        f"micro-batches of b={report.micro_batch} × s={report.seq_len}; bytes per rank after one step and "
        f"its point-to-point calls (after {WARMUP_STEPS} warm-up steps)"
    )
    for config in report.configs:
        if config.status == "failed":
            out.print(f"[bold red]✗ {escape(config.title)}: failed: {escape(config.error or '')}[/bold red]")
            continue
        keys, predicted, measured, difference, marks = [], [], [], [], []
        for stage in config.stages:
            for line in stage.lines:
                keys.append(f"r{stage.rank} s{stage.stage} {line.line}")
                predicted.append(f"{line.predicted:,}")
                measured.append(f"{line.measured:,}")
                difference.append(f"{line.difference:+,}")
                marks.append(mark(line.ok))
        print_fitted(
            "rank, stage",
            keys,
            [
                Column(header="predicted", cells=predicted),
                Column(header="measured", cells=measured),
                Column(header="diff", cells=difference),
                Column(header="", cells=marks, justify="left"),
            ],
            title=f"{config.title} ({config.seconds:g} s)",
            key_width=18,
        )
        rows = [(stage, call) for stage in config.stages for call in stage.p2p]
        ok = {
            (s.rank, c.op, c.phase): c.predicted_calls == c.measured_calls and s.p2p_in_order for s, c in rows
        }
        print_fitted(
            "rank: call",
            [
                f"r{s.rank}: {c.op} {SHORT[c.phase]} {'→' if c.op == 'send' else '←'} r{c.peer}"
                for s, c in rows
            ],
            [
                Column(header="calls\npred.", cells=[str(c.predicted_calls) for _, c in rows]),
                Column(header="calls\nmeas.", cells=[str(c.measured_calls) for _, c in rows]),
                Column(header="bytes\neach", cells=[f"{c.bytes_per_call:,}" for _, c in rows]),
                Column(header="bytes\npred.", cells=[f"{c.predicted_bytes:,}" for _, c in rows]),
                Column(header="bytes\nmeas.", cells=[f"{c.measured_bytes:,}" for _, c in rows]),
                Column(header="", cells=[mark(ok[(s.rank, c.op, c.phase)]) for s, c in rows], justify="left"),
            ],
            key_width=18,
        )
        for stage in config.stages:
            if stage.p2p_difference:
                out.print(f"[red]  ✗ rank {stage.rank}: {escape(stage.p2p_difference)}[/red]")
        seen = {}
        for stage in config.stages:
            seen.setdefault((stage.stage, stage.reduction), []).append(stage.reduction_ok)
        for (index, reduction), oks in seen.items():
            verdict = "n/a" if all(ok is None for ok in oks) else mark(all(ok is not False for ok in oks))
            out.print(f"[dim]· stage {index} gradient reduction: {escape(reduction)} {verdict}[/dim]")
    out.print(
        "[dim]· sends and receives compared call by call, in the order Schedule1F1B issues them; fwd: a "
        "micro-batch's hidden states b·s·h, bwd: their gradient[/dim]"
    )
    counts = {s: sum(1 for c in report.configs if c.status == s) for s in ("match", "mismatch", "failed")}
    verdict = (
        "every model-state line and point-to-point call matches exactly"
        if report.all_match
        else "[bold red]NOT all match[/bold red]"
    )
    out.print(
        f"{counts['match']} configuration{'' if counts['match'] == 1 else 's'} match, {counts['mismatch']} "
        f"mismatch, {counts['failed']} failed: {verdict}"
    )


def render_fake_pipeline(report: FakePipelineReport) -> None:
    """Per world × precision × reshard: each stage's peak, its model states against the prediction, and
    the last stage's kept outputs."""
    from rich.markup import escape

    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"[bold]{escape(report.model)}[/bold]: {report.schedule} with FSDP2 per stage under fake tensors "
        f"(torch {report.torch}, CPU, FSDPMemTracker, storages rounded to 512 B); bytes on the stage's "
        "first data-parallel rank"
    )
    groups: dict[tuple, list] = {}
    for stage in report.stages:
        c = stage.case
        groups.setdefault(
            (c.world, c.pp, c.microbatches, c.micro_batch, c.seq_len, c.precision, c.reshard), []
        ).append(stage)
    for (world, pp, m, b, s, precision, reshard), stages in groups.items():
        seconds = sum(st.seconds for st in stages)
        title = (
            f"world {world} = pp {pp} × dp {world // pp}, m={m}, b={b} s={s}, {precision.value}, "
            f"{'reshard' if reshard else 'no reshard'} ({seconds:g} s)"
        )
        states_ok = [all(line.ok for line in st.lines) for st in stages]
        print_fitted(
            "stage",
            [f"{st.case.stage} (r{st.case.rank})" for st in stages],
            [
                Column(header="peak", cells=[f"{st.figures.peak:,}" for st in stages]),
                Column(
                    header="activations\nat the peak",
                    cells=[f"{st.figures.at_peak.get('Activation', 0):,}" for st in stages],
                ),
                Column(
                    header="buffers\nat start",
                    cells=[f"{st.figures.at_start.get('Activation', 0):,}" for st in stages],
                ),
                Column(header="params\n(= grads)", cells=[f"{st.figures.params:,}" for st in stages]),
                Column(header="exact", cells=[mark(ok) for ok in states_ok], justify="left"),
            ],
            title=title,
            key_width=9,
        )
        for st in stages:
            for line in st.lines:
                if not line.ok:
                    out.print(
                        f"[red]  ✗ stage {st.case.stage} {line.line}: predicted {line.predicted:,}, measured "
                        f"{line.measured:,}[/red]"
                    )
            if st.outputs_kept is not None and st.figures.peak_without_outputs is not None:
                kept, higher = st.outputs_kept, st.figures.peak - st.figures.peak_without_outputs
                out.print(
                    f"[dim]· last stage, outputs kept by step(return_outputs=True): {kept.measured:,} B when "
                    f"the step returns, predicted {kept.predicted:,} = m logits of b × s × V "
                    f"{mark(kept.ok)}; the peak {higher:,} B higher than without them[/dim]"
                )
    out.print(
        "[dim]· exact: params, grads, optimizer states and step counters against the stage's tensors "
        "sharded over dp, and the buffers at the step's start against m receive buffers per direction "
        "(b × s × h), the last stage's previous outputs and the token batch[/dim]"
    )
    exact = sum(st.ok for st in report.stages)
    verdict = "every stage exact" if report.all_match else "[bold red]NOT all exact[/bold red]"
    out.print(f"{exact} of {len(report.stages)} stages exact to the byte: {verdict}")
