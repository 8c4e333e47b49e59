"""``zerocalc memory``: per-GPU model-state bytes for each strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from zerocalc.base.units import ByteUnit, parse_byte_unit
from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app, fail, flag
from zerocalc.cli.render import console, print_json
from zerocalc.render.memory import render_framework_states, render_memory, render_peak
from zerocalc.request.launch import with_launch_configs
from zerocalc.request.options import Command, as_given

if TYPE_CHECKING:
    from zerocalc.peak.report import MemoryReport
    from zerocalc.request.training import TrainingRequest


NO_ARCHITECTURE_PEAK = "activations, buffers and the peak of a step need --model"


@app.command(cls=PlainTextCommand)
@opt.takes_options(Command.MEMORY)
def memory(values: dict[str, Any], given_flags: frozenset[str]) -> None:
    """Per-GPU memory under DDP, ZeRO-1/2/3 and FSDP: model states, and with --model the peak of a
    training step, simulated event by event (activations, loss, buffers, allocator, CUDA context)."""
    from zerocalc.request.options_model import TrainingOptions
    from zerocalc.request.training import parse_request

    unit = parse_byte_unit(values["units"])
    json = values["json"]
    options, notes = with_launch_configs(Command.MEMORY, values, given_flags)
    request = parse_request(TrainingOptions(**options))

    def given(result: Any) -> Any:
        return as_given(result, Command.MEMORY, options, flag, notes)

    timeline, snapshot_out, html = values["timeline"], values["snapshot_out"], values["html"]
    _check_pictures(request, timeline, snapshot_out, json, html)
    if request.model.architecture is None:
        if request.framework.value != "paper":  # the framework's own accounting
            from zerocalc.peak.evaluate import evaluate

            report = given(evaluate(request))
            if json:
                import json as jsonlib

                typer.echo(jsonlib.dumps(report.to_json_dict(), indent=2))
                return
            render_memory(console(), report, unit)
            render_framework_states(console(), report.framework_states or [], unit)
        else:
            from zerocalc.states.memory import evaluate_memory

            estimate = given(evaluate_memory(request))
            if json:
                print_json(estimate)
                return
            render_memory(console(), estimate, unit)
        console().print(f"[dim]· model states only: {NO_ARCHITECTURE_PEAK}[/dim]")
        return
    from zerocalc.peak.evaluate import evaluate_peak

    report = given(evaluate_peak(request))
    if snapshot_out is not None:
        assert report.peak is not None
        stage = report.peak.strategies[0].stage
        if stage is not None:  # the pipeline stage whose peak decides
            request = request.with_(stage=stage)
        _write_snapshot(request, snapshot_out, json)
    if html is not None:
        from zerocalc.cli.html import write_html
        from zerocalc.render.html_memory import memory_page

        write_html(html, memory_page(report), json)
    if json:
        import json as jsonlib

        typer.echo(jsonlib.dumps(report.to_json_dict(), indent=2))
        return
    render_memory(console(), report, unit)
    assert report.peak is not None
    render_peak(console(), report.peak, unit)
    if timeline:
        _render_timelines(report, unit)


def _check_pictures(
    request: TrainingRequest, timeline: bool, snapshot_out: str | None, json: bool, html: str | None
) -> None:
    """--timeline, --snapshot-out and --html draw the step: they need an architecture (and
    --snapshot-out one GPU's step)."""
    from zerocalc.base.atomic import unwritable
    from zerocalc.base.errors import InputError, shown

    if request.model.architecture is None:
        pictures = (
            (timeline, "--timeline"),
            (snapshot_out is not None, "--snapshot-out"),
            (html is not None, "--html"),
        )
        for given, option in pictures:
            if given:
                raise InputError(f"{option} needs --model: a step's events need the model's architecture")
    if timeline and json:
        raise InputError(
            "--timeline draws on the terminal and --json carries the timeline; accepted: one of them"
        )
    if snapshot_out is not None:
        if len(request.strategies) != 1:
            names = ", ".join(s.value for s in request.strategies)
            raise InputError(
                f"--snapshot-out writes one GPU's step, and --strategy gives {len(request.strategies)} "
                f"({names}); accepted: one strategy"
            )
        why = unwritable(snapshot_out)
        if why is not None:
            raise InputError(f"--snapshot-out {shown(snapshot_out)} {why}; accepted: a file path to write")
    if html is not None:  # plotly missing, a path not writable
        from zerocalc.cli.html import check_html

        check_html(html)


def _write_snapshot(request: TrainingRequest, path: str, json: bool) -> None:
    """The predicted step as a PyTorch memory snapshot (a pickle of plain dicts and lists), atomically."""
    import pickle

    from zerocalc.base.atomic import write_bytes_atomic
    from zerocalc.base.errors import why_not
    from zerocalc.peak.snapshot import predicted_snapshot

    snapshot, _ = predicted_snapshot(request, request.strategies[0])
    try:
        write_bytes_atomic(path, pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError as exc:  # the path was checked first: the disk or its permissions changed
        raise fail(f"--snapshot-out {path!r} cannot be written ({why_not(exc)})", 1) from None
    events = len(snapshot["device_traces"][0])
    typer.echo(
        f"snapshot of the predicted step ({events:,} allocator events) written to {path}; draw it with "
        f"python -m torch.cuda._memory_viz trace_plot {path} -o out.html",
        err=json,
    )


def _render_timelines(report: MemoryReport, unit: ByteUnit) -> None:
    from zerocalc.render.timeline import TIMELINE_WIDTH, timeline_lines

    out = console()
    assert report.peak is not None
    for row in report.peak.strategies:
        out.print(f"\n[bold]{row.title}[/bold] ({row.strategy.value}): one training step, {unit.value}")
        for line in timeline_lines(row.timeline, unit, width=min(TIMELINE_WIDTH, out.width)):
            out.print(line, markup=False, highlight=False, overflow="ignore", crop=False)
