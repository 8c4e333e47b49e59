"""``zerocalc validate expert``: the all-to-alls of a tiny MoE layer with a fixed router (torchtitan's
exchange: counts, dispatch, combine) on ``--nproc`` processes, what every rank sends to every rank compared
with the prediction, split by split.

Thin: read the options, call :func:`zerocalc.validate.expert.run_expert`, render. torch is imported only
once the run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import comma_list, seconds, takes_measure, whole_number
from zerocalc.cli.validate_common import (
    finish,
    mark,
    progress_of,
    require_torch,
    shape,
    spawned_ranks,
    step_line,
)

if TYPE_CHECKING:
    from zerocalc.validate.expert import ExpertReport

SHORT = {"forward": "fwd", "backward": "bwd"}


@takes_measure(Measure.EXPERT)
def expert(values: dict[str, Any], given: frozenset[str]) -> None:
    """The all-to-alls of a MoE layer on processes, split by split.

    Run a tiny MoE layer with a fixed router over --ep expert-parallel ranks (torchtitan's exchange:
    counts, dispatch, combine); compare what every rank sends to each rank, forward and backward, with the
    prediction."""
    from zerocalc.validate.expert import ROUTINGS, check_expert

    nproc = spawned_ranks(values, "expert")
    routings = comma_list(values["routing"], "--routing", ROUTINGS, allow_all=True)
    timeout = seconds(values["timeout"])
    ep = whole_number(values["ep"], "--ep")
    assert ep is not None
    check_expert(ep, nproc)
    micro_batch, seq_len = shape(values, min_seq=1)
    require_torch()
    from zerocalc.validate.expert import run_expert

    with progress_of(len(routings)) as progress:
        report = run_expert(ep, routings, micro_batch * seq_len, nproc, timeout, step_line(progress))
    finish(report, values["json"], render_expert, report.all_match)


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
                Column(header="", cells=[mark(c.ok) for _, c in rows], justify="left"),
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
