"""``zerocalc comm``: collectives per step, bytes each GPU sends, and their time."""

from __future__ import annotations

from typing import Any

from zerocalc.base.units import parse_byte_unit
from zerocalc.cli import options as opt
from zerocalc.cli.base import PlainTextCommand, app, flag
from zerocalc.cli.render import console, print_json
from zerocalc.render.comm import render_comm
from zerocalc.request.launch import with_launch_configs
from zerocalc.request.options import Command, as_given


@app.command(cls=PlainTextCommand)
@opt.takes_options(Command.COMM)
def comm(values: dict[str, Any], given_flags: frozenset[str]) -> None:
    """Collectives of each strategy per optimizer step: bytes each GPU sends and the time they take."""
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate
    from zerocalc.request.options_model import TrainingOptions
    from zerocalc.request.training import parse_request

    unit = parse_byte_unit(values["units"])
    json, per_unit = values["json"], values["per_unit"]
    options, notes = with_launch_configs(Command.COMM, values, given_flags)
    from zerocalc.request.compute import compute_table

    request = parse_request(TrainingOptions(estimate=Estimate.COMM, **options))
    if values["html"] is not None:  # refused before the work: plotly missing, a path not writable
        from zerocalc.cli.html import check_html

        check_html(values["html"])
    table = compute_table(request.compute_calibration, request.gpu.name if request.gpu else None)
    computed = evaluate_comm(request, table.table, table.name) if table else evaluate_comm(request)
    estimate = as_given(computed, Command.COMM, options, flag, notes)
    if values["html"] is not None:
        from zerocalc.cli.html import write_html
        from zerocalc.render.html_comm import comm_page

        write_html(values["html"], comm_page(estimate), json)
    if json:
        print_json(estimate)
    else:
        render_comm(console(), estimate, unit, per_unit)
