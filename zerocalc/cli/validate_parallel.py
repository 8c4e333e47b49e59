"""``zerocalc validate --pp`` / ``--fake --pp`` / ``--ep``: pipeline and expert parallelism run for real
(or under fake tensors) and compared with the prediction.

Thin: parse these modes' options, call :mod:`zerocalc.validate.pipeline` / :mod:`zerocalc.validate.expert`,
render. Exit codes as the other modes: 0 every compared figure matches, 1 one differs or a configuration
failed, 2 bad input. torch is imported only once the run starts.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import typer

from zerocalc.base.errors import InputError
from zerocalc.cli.base import fail

if TYPE_CHECKING:
    from zerocalc.validate.expert import ExpertReport
    from zerocalc.validate.pipeline import FakePipelineReport, PipelineReport

NEEDS_TORCH = "zerocalc validate needs PyTorch; install it with: pip install 'zerocalc[bench]'"
SHORT = {"forward": "fwd", "backward": "bwd"}
MAX_FAKE_PIPELINE_WORLD = 1_048_576
"""--fake --pp: ranks of the fake process group at most."""


def _names(text: str, option: str, accepted: tuple[str, ...]) -> list[str]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(accepted)
    if not names or any(n not in accepted for n in names):
        raise InputError(f"{option} {text!r} is not accepted; accepted: all, or {', '.join(accepted)}")
    return list(dict.fromkeys(names))


def _precisions(text: str) -> list:
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.validate.config import PRECISIONS

    accepted = tuple(p.value for p in PRECISIONS)
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not names or any(n not in accepted for n in names):
        raise InputError(f"--precision {text!r} is not accepted; accepted: {', '.join(accepted)}")
    return [PrecisionName(n) for n in dict.fromkeys(names)]


def _optimizer(text: str):
    from zerocalc.parallel.optimizers import OptimizerName
    from zerocalc.validate.config import OPTIMIZERS

    name = text.strip().lower()
    if name not in {o.value for o in OPTIMIZERS}:
        raise InputError(
            f"--optimizer {text!r} is not accepted; accepted: {', '.join(o.value for o in OPTIMIZERS)}"
        )
    return OptimizerName(name)


def _refuse_launched(option: str) -> None:
    from zerocalc.bench.topology import launched_by

    if launched_by() is not None:
        raise InputError(
            f"{option} starts its own --nproc processes; accepted: zerocalc validate --nproc N {option} ... "
            "outside torchrun/srun"
        )


def pipeline(
    model: str | None,
    overrides: dict[str, int],
    strategies: str,
    precision: str,
    optimizer: str,
    microbatches: int | None,
    nproc: int,
    timeout: float,
    pp: int,
    json: bool,
    first: int | None = None,
    last: int | None = None,
) -> None:
    """``--pp P``: every strategy × precision of a P-stage Schedule1F1B over --nproc spawned ranks
    (``first`` and ``last``: the end stages' blocks, ``--pp-first-stage-layers`` and
    ``--pp-last-stage-layers``)."""
    from zerocalc.harness import procs
    from zerocalc.validate.pipeline import PIPELINE_STRATEGIES, check_pipeline, pipeline_architecture

    _refuse_launched("--pp")
    chosen = _names(strategies, "--strategies", PIPELINE_STRATEGIES)
    recipes = _precisions(precision)
    opt = _optimizer(optimizer)
    procs.check_timeout(timeout)
    if nproc < 2:
        raise InputError(f"--nproc {procs.brief(nproc)} is not accepted; accepted: 2 or more processes")
    if pp < 2 or nproc % pp:
        raise InputError(
            f"--pp {procs.brief(pp)} with --nproc {nproc} is not accepted; accepted: 2 or more stages "
            "dividing --nproc"
        )
    m = 2 * pp if microbatches is None else microbatches
    arch = pipeline_architecture(model, overrides, pp)
    check_pipeline(arch, pp, nproc, m, first, last)
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH)
    from zerocalc.validate.pipeline import run_pipeline

    total = len(chosen) * len(recipes)
    progress = procs.Progress("zerocalc validate", total)

    def on_result(result, done: int, total: int) -> None:
        seconds = f" ({result.seconds:g} s)" if result.seconds is not None else ""
        progress.step(result.title, f"{result.status}{seconds}, {done}/{total} configurations")

    try:
        report = run_pipeline(arch, pp, chosen, recipes, opt, m, nproc, timeout, on_result, first, last)
    except KeyboardInterrupt:
        progress.close()
        typer.echo(f"zerocalc: {procs.INTERRUPTED}", err=True)
        raise typer.Exit(procs.EXIT_INTERRUPTED) from None
    finally:
        progress.close()
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render_pipeline(report)
    if not report.all_match:
        raise typer.Exit(1)


def fake_pipeline(
    model: str | None,
    overrides: dict[str, int],
    world: str,
    pp: int,
    microbatches: int | None,
    micro_batch: int,
    seq_len: int,
    precision: str,
    optimizer: str,
    reshard: str,
    json: bool,
) -> None:
    """``--fake --pp P``: every stage of a P-stage Schedule1F1B with FSDP2 at each fake world size."""
    from zerocalc.harness import procs
    from zerocalc.validate.pipeline import FakePipelineCase, check_pipeline, pipeline_architecture

    worlds = []
    for text in world.split(","):
        size = text.strip()
        if not size.isdigit() or not 1 <= int(size) <= MAX_FAKE_PIPELINE_WORLD or int(size) % max(pp, 1):
            raise InputError(
                f"--world {world!r} with --pp {pp} is not accepted; accepted: a comma list of world sizes, "
                f"multiples of {pp} up to {MAX_FAKE_PIPELINE_WORLD:,}"
            )
        worlds.append(int(size))
    recipes = _precisions(precision)
    opt = _optimizer(optimizer)
    reshards = [r == "yes" for r in _names(reshard, "--reshard", ("yes", "no"))]
    if micro_batch < 1 or seq_len < 2:
        raise InputError(
            f"--micro-batch {procs.brief(micro_batch)} --seq-len {procs.brief(seq_len)} is not accepted; "
            "accepted: b ≥ 1 and s ≥ 2"
        )
    m = 2 * pp if microbatches is None else microbatches
    arch = pipeline_architecture(model, overrides, pp)
    for size in worlds:
        check_pipeline(arch, pp, size, m)
    cases = [
        FakePipelineCase(
            world=size,
            pp=pp,
            stage=stage,
            microbatches=m,
            micro_batch=micro_batch,
            seq_len=seq_len,
            precision=p,
            reshard=r,
        )
        for size in dict.fromkeys(worlds)
        for p in recipes
        for r in reshards
        for stage in range(pp)
    ]
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH.replace("validate", "validate --fake"))
    from zerocalc.validate.pipeline import run_fake_pipeline

    report = run_fake_pipeline(arch, cases, opt)
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render_fake_pipeline(report)
    if not report.all_match:
        raise typer.Exit(1)


def expert(
    ep: int, routing: str, nproc: int, timeout: float, micro_batch: int, seq_len: int, json: bool
) -> None:
    """``--ep E``: the all-to-alls of a tiny MoE layer with a fixed router over --nproc spawned ranks."""
    from zerocalc.harness import procs
    from zerocalc.validate.expert import ROUTINGS, check_expert

    _refuse_launched("--ep")
    routings = _names(routing, "--routing", ROUTINGS)
    procs.check_timeout(timeout)
    if nproc < 2:
        raise InputError(f"--nproc {procs.brief(nproc)} is not accepted; accepted: 2 or more processes")
    check_expert(ep, nproc)
    if micro_batch < 1 or seq_len < 1 or micro_batch * seq_len > 65_536:
        raise InputError(
            f"--micro-batch {procs.brief(micro_batch)} --seq-len {procs.brief(seq_len)} is not accepted; "
            "accepted: b ≥ 1, s ≥ 1 and b·s ≤ 65,536 tokens per rank"
        )
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH)
    from zerocalc.validate.expert import run_expert

    progress = procs.Progress("zerocalc validate", len(routings))

    def on_result(result, done: int, total: int) -> None:
        seconds = f" ({result.seconds:g} s)" if result.seconds is not None else ""
        progress.step(result.title, f"{result.status}{seconds}, {done}/{total} configurations")

    try:
        report = run_expert(ep, routings, micro_batch * seq_len, nproc, timeout, on_result)
    except KeyboardInterrupt:
        progress.close()
        typer.echo(f"zerocalc: {procs.INTERRUPTED}", err=True)
        raise typer.Exit(procs.EXIT_INTERRUPTED) from None
    finally:
        progress.close()
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render_expert(report)
    if not report.all_match:
        raise typer.Exit(1)


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("✓" if ok else "✗ OFF")


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
                marks.append(_mark(line.ok))
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
                Column(
                    header="", cells=[_mark(ok[(s.rank, c.op, c.phase)]) for s, c in rows], justify="left"
                ),
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
            verdict = "n/a" if all(ok is None for ok in oks) else _mark(all(ok is not False for ok in oks))
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
                Column(header="exact", cells=[_mark(ok) for ok in states_ok], justify="left"),
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
                    f"{_mark(kept.ok)}; the peak {higher:,} B higher than without them[/dim]"
                )
    out.print(
        "[dim]· exact: params, grads, optimizer states and step counters against the stage's tensors "
        "sharded over dp, and the buffers at the step's start against m receive buffers per direction "
        "(b × s × h), the last stage's previous outputs and the token batch[/dim]"
    )
    exact = sum(st.ok for st in report.stages)
    verdict = "every stage exact" if report.all_match else "[bold red]NOT all exact[/bold red]"
    out.print(f"{exact} of {len(report.stages)} stages exact to the byte: {verdict}")


def render_expert(report: ExpertReport) -> None:
    """Per routing: every rank's all-to-alls, what each sends to each rank, and the bytes that leave it."""
    from rich.markup import escape

    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"MoE layer: {report.experts} experts over ep {report.ep} ({report.world_size} ranks, "
        f"{report.backend}), top-{report.top_k}, hidden {report.hidden}, {report.tokens_per_rank:,} tokens "
        "per rank; the all-to-alls of one forward and backward, elements sent to each rank"
    )
    for config in report.configs:
        if config.status == "failed":
            out.print(f"[bold red]✗ {escape(config.title)}: failed: {escape(config.error or '')}[/bold red]")
            continue
        rows = [(rank, call) for rank in config.ranks for call in rank.calls]
        print_fitted(
            "rank: call",
            [f"r{rank.rank}: {call.what} {SHORT[call.phase]}" for rank, call in rows],
            [
                Column(
                    header="to each rank",
                    cells=["/".join(f"{n:,}" for n in c.predicted_splits) for _, c in rows],
                ),
                Column(header="bytes out\npred.", cells=[f"{c.predicted_bytes:,}" for _, c in rows]),
                Column(
                    header="bytes out\nmeas.",
                    cells=["—" if c.measured_bytes is None else f"{c.measured_bytes:,}" for _, c in rows],
                ),
                Column(header="", cells=[_mark(c.ok) for _, c in rows], justify="left"),
            ],
            title=f"{config.title} ({config.seconds:g} s)",
            key_width=20,
        )
        for rank in config.ranks:
            if not rank.params.ok:
                out.print(
                    f"[red]  ✗ rank {rank.rank} expert weights: predicted {rank.params.predicted:,}, "
                    f"measured {rank.params.measured:,}[/red]"
                )
        weights = {rank.params.measured for rank in config.ranks}
        out.print(f"[dim]· expert weights per rank: {', '.join(f'{w:,}' for w in sorted(weights))} B[/dim]")
    counts = {s: sum(1 for c in report.configs if c.status == s) for s in ("match", "mismatch", "failed")}
    verdict = "every all-to-all matches exactly" if report.all_match else "[bold red]NOT all match[/bold red]"
    out.print(
        f"{counts['match']} configuration{'' if counts['match'] == 1 else 's'} match, {counts['mismatch']} "
        f"mismatch, {counts['failed']} failed: {verdict}"
    )
