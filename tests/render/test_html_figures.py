"""``--html FILE``'s figures, from the results they draw: every candidate of a plan is a point at its
peak and step, a strategy's stacked bars add up to memory's peak_bytes, the collectives' bars to comm's
time_s and the step's parts to its step_s; the page loads nothing from the network; the command line
writes it and refuses what it cannot draw."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc import estimate_comm, estimate_peak
from zerocalc.cli import app
from zerocalc.peak.evaluate import FIT_MARGIN
from zerocalc.peak.kinds import TensorKind

pytest.importorskip("plotly", reason="the html extra (pip install 'zerocalc[html]') draws the figures")

from zerocalc.render.html_comm import comm_figure, comm_page
from zerocalc.render.html_memory import KIND_COLOURS, memory_figure, memory_page
from zerocalc.render.html_plan import plan_figure, plan_page
from zerocalc.render.plan import command

runner = CliRunner()
GIB = 2**30
MEMORY = ["--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2", "--gpu", "h100-80gb"]
"""The spelling of the memory check (and comm's, the same run)."""
PLAN = ["--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--global-batch", "1048576"]
PLAN += ["--seq-len", "8192"]
"""The spelling of the plan check."""


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    return estimate_peak(model="llama-3-8b", gpus=8, framework="fsdp2", gpu="h100-80gb")


@pytest.fixture(scope="module")
def comm():  # type: ignore[no-untyped-def]
    return estimate_comm(model="llama-3-8b", gpus=8, framework="fsdp2", gpu="h100-80gb")


@pytest.fixture(scope="module")
def planned():  # type: ignore[no-untyped-def]
    import zerocalc

    return zerocalc.plan(
        model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch=1048576, seq_len=8192, candidates=True
    )


def test_every_tensor_kind_has_its_colour() -> None:
    assert set(KIND_COLOURS) == set(TensorKind)
    assert len(set(KIND_COLOURS.values())) == len(TensorKind)


def test_each_strategys_stacked_bars_add_up_to_memorys_peak(report) -> None:  # type: ignore[no-untyped-def]
    fig = memory_figure(report)
    bars = [t for t in fig.data if t.type == "bar"]
    names = [row.title for row in report.peak.strategies]
    for i, row in enumerate(report.peak.strategies):
        assert list(bars[0].x) == names
        total = sum(bar.y[i] for bar in bars) * GIB
        assert total == pytest.approx(row.peak_bytes, rel=1e-12)
        reserve = next(b for b in bars if b.name == "allocator reserve")
        assert reserve.y[i] * GIB == pytest.approx(row.allocator_reserve_bytes)


def test_the_timeline_is_the_steps_events_and_its_peak_is_memorys(report) -> None:  # type: ignore[no-untyped-def]
    fig = memory_figure(report)
    row = report.peak.strategies[0]
    allocated = [t for t in fig.data if t.name and t.name.startswith("allocated: ") and t.visible]
    points = {x: y for t in allocated for x, y in zip(t.x, t.y, strict=True)}
    assert sorted(points) == list(range(len(row.timeline)))
    assert [points[i] * GIB for i in range(len(row.timeline))] == pytest.approx(
        [e.allocated_bytes for e in row.timeline]
    )
    peak = next(t for t in fig.data if t.name == "allocated peak" and t.visible)
    assert peak.y[0] * GIB == pytest.approx(row.allocated_peak_bytes)
    menu = fig.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == [f"timeline: {r.title}" for r in report.peak.strategies]


def test_the_collectives_add_up_to_comms_time_and_the_parts_to_the_step(comm) -> None:  # type: ignore[no-untyped-def]
    fig = comm_figure(comm)
    for i, row in enumerate(comm.strategies):
        bar = next(t for t in fig.data if t.name == row.title)
        assert sum(bar.x) / 1e3 == pytest.approx(row.time_s)
        parts = [t for t in fig.data if t.legendgroup == "split"]
        assert sum(t.y[i] for t in parts) == pytest.approx(row.step.step_s)
        assert {t.name for t in parts} >= {"compute", "exposed communication"}


def test_every_candidate_is_a_point_at_its_peak_and_step(planned) -> None:  # type: ignore[no-untyped-def]
    fig = plan_figure(planned)
    points = [(x, y) for t in fig.data for x, y in zip(t.x, t.y, strict=True)]
    assert len(points) == planned.candidates_evaluated == len(planned.candidates)
    expected = sorted(
        ((r.peak_bytes if r.peak_bytes is not None else r.peak_lower_bound_bytes) / GIB, r.step_s)
        for r in planned.candidates
    )
    assert sorted(points) == expected  # the same division of the same integers
    rejected = next(t for t in fig.data if t.name.startswith("does not fit"))
    outside = [r for r in planned.candidates if r.status.value in ("does not fit", "tight")]
    assert len(rejected.x) == len(outside) > 0
    limit = (1 - FIT_MARGIN) * planned.request.gpu_memory_bytes  # the fit limit the figure draws
    fitting = [x for t in fig.data if t is not rejected for x in t.x]
    assert max(fitting) * GIB <= limit * (1 + 1e-12) < min(rejected.x) * GIB * (1 + 1e-12)


def test_hovering_a_top_row_shows_the_commands_plan_prints(planned) -> None:  # type: ignore[no-untyped-def]
    fig = plan_figure(planned)
    top = next(t for t in fig.data if t.name.startswith("top "))
    assert [int(text) for text in top.text] == list(range(1, len(planned.top) + 1))
    first = planned.top[0]
    hover, commands = top.customdata[0]
    assert command("memory", first.memory_options) in commands
    assert command("comm", first.comm_options) in commands
    assert "zerocalc memory" in hover and f"{first.step_s:.3f} s" in hover


NETWORK_REFERENCE = re.compile(
    r"<(?:script|link|img|iframe)[^>]+(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.I
)


@pytest.mark.parametrize("which", ["plan", "memory", "comm"])
def test_the_page_refers_to_nothing_on_the_network(which, planned, report, comm) -> None:  # type: ignore[no-untyped-def]
    page = {
        "plan": lambda: plan_page(planned),
        "memory": lambda: memory_page(report),
        "comm": lambda: comm_page(comm),
    }
    text = page[which]()
    assert text.startswith("<!DOCTYPE html>") and 'class="plotly-graph-div"' in text
    assert NETWORK_REFERENCE.search(text) is None
    assert text.count("<script") == text.count("</script>") and "<script src" not in text
    assert text.count("Plotly.newPlot") >= 1 and len(text) > 3_000_000  # plotly.js inline


def test_the_network_check_finds_a_reference() -> None:
    assert NETWORK_REFERENCE.search('<script src="https://cdn.plot.ly/plotly.min.js"></script>')
    assert NETWORK_REFERENCE.search("<link rel=stylesheet href=//fonts.example/x.css>")


def test_the_check_commands_write_their_pages(tmp_path: Path) -> None:
    for name, args in (("memory", MEMORY), ("comm", MEMORY), ("plan", PLAN)):
        out = tmp_path / f"{name}.html"
        result = runner.invoke(app, [name, *args, "--html", str(out)])
        assert result.exit_code == 0, result.output
        assert "figures written to" in result.stdout and str(out) in result.stdout.replace("\n", "")
        text = out.read_text()
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
        assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left


def test_plan_keeps_every_candidate_for_the_page_only(tmp_path: Path) -> None:
    import json

    small = ["--model", "gpt2", "--gpu", "rtx-4090", "--gpus", "2", "--global-batch", "8seq"]
    result = runner.invoke(
        app, ["plan", *small, "--seq-len", "1024", "--json", "--html", str(tmp_path / "p.html")]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["candidates"] is None
    assert "figures written to" in result.stderr  # --json owns stdout


def test_without_plotly_one_line_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises ImportError
    out = tmp_path / "m.html"
    for args in (["memory", *MEMORY], ["comm", *MEMORY], ["plan", *PLAN]):
        line = one_line_error(runner.invoke(app, [*args, "--html", str(out)]), "pip install 'zerocalc[html]'")
        assert "plotly" in line
    assert not out.exists()


def test_what_cannot_be_drawn_is_refused_before_the_work(tmp_path: Path) -> None:
    one_line_error(
        runner.invoke(app, ["memory", "--params", "7B", "--html", str(tmp_path / "m.html")]), "--model"
    )
    one_line_error(runner.invoke(app, ["memory", *MEMORY, "--html", str(tmp_path)]), "is a directory")
    missing = tmp_path / "no" / "m.html"
    one_line_error(runner.invoke(app, ["comm", *MEMORY, "--html", str(missing)]), "does not exist")
