"""Tables and headings at any terminal width: whole numbers, headers and titles at 80 columns and below,
no type names in help."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


# ------------------------------------------------------------------ COLUMNS=0 / 1…20: a sane width
@pytest.mark.parametrize("columns", ["0", "1", "20", "59", "abc"])
@pytest.mark.parametrize(
    "args",
    [
        ["memory", "--params", "7B", "--gpus", "8", "--gpu", "h100-80gb"],
        ["comm", "--params", "7B", "--gpus", "16"],
        ["presets", "list"],
    ],
)
def test_narrow_or_zero_columns_print_whole_tables(args: list[str], columns: str) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    assert result.stdout.strip(), "printed nothing"
    assert "…" not in result.stdout  # no number (nor header) cut
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_check_at_zero_columns_prints_its_verdict(tmp_path: Path) -> None:
    """``check`` under a CI job's COLUMNS=0: a table and the count line, never exit 0 having printed
    nothing (one scenario, copied, to keep it short)."""
    presets = ROOT / "presets"
    for folder in ("scenarios", "expected"):
        (tmp_path / folder).mkdir()
    name = "gpt2-xl-2x4090"
    for folder, suffix in (("scenarios", ".toml"), ("expected", ".json")):
        (tmp_path / folder / f"{name}{suffix}").write_bytes(
            (presets / folder / f"{name}{suffix}").read_bytes()
        )
    result = runner.invoke(app, ["check", str(tmp_path)], env={"COLUMNS": "0"})
    assert result.exit_code == 0, result.output
    assert name in result.stdout and "1 of 1 scenario match" in result.stdout


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (54.46e-3, "54.46 ms"),
        (2.5, "2.500 s"),
        (90.0, "1.5 min"),
        (6.8 * 3600, "6.8 h"),
        (3 * 86_400, "3.0 d"),
        (2.45e31, "2.8e+26 d"),  # 2.45e31 s / 86,400 s per day
    ],
)
def test_durations_are_short(seconds: float, shown: str) -> None:
    from zerocalc.base.units import format_seconds

    assert format_seconds(seconds) == shown


def test_slowest_link_keeps_headers_and_times_whole_at_80_columns() -> None:
    """7B over 1 MB/s: an all_reduce of 2·7/8·14 GB = 24.5 GB (ring) takes 24,500 s = 6.8 h."""
    args = ["comm", "--params", "7B", "--gpus", "8", "--intra-node-bw", "1MB/s", "-s", "ddp"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["collective", "tensor", "group"] for line in lines if line.strip())
    assert any(line.startswith("AR bwd") and line.split()[-3:] == ["6.8", "h", "flag"] for line in lines)


# --------------------------------------------------------------------- 80 columns, as read
@pytest.mark.parametrize("command", [[], ["memory"], ["comm"], ["presets"], ["presets", "list"], ["check"]])
def test_help_shows_no_type_for_flags(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "--help" in result.stdout


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (
            ["memory", "--params", "7B", "--gpus", "8", "--fp32-grad-accum"],
            ["b_p = 2,", "b_g = 2,", "K = 12"],
        ),
        (["memory", "--model", "llama-3-8b", "--gpus", "8"], ["Ψ = 8,030,261,248 (8.03B),", "s = 2048,"]),
        (["comm", "--model", "llama-3-8b", "--gpus", "8"], ["Ψ = 8,030,261,248 (8.03B),", "(g = 8),"]),
    ],
)
def test_headings_break_between_phrases_at_80_columns(args: list[str], phrases: list[str]) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for phrase in phrases:
        assert any(phrase in line for line in lines), phrase
    assert not any(line.rstrip().endswith("=") or line.startswith("= ") for line in lines)


def test_plan_rows_keep_their_title_whole_and_name_the_framework_once() -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--global-batch", "64seq",
            "--framework", "fsdp2", "--top", "3"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    keys = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    firsts = [key for key in keys if key[:2] in ("1.", "2.", "3.")]
    assert [key[:15] for key in firsts] == [f"{n}. FSDP2 HSDP g" for n in "123"]
    assert all(key.endswith("×16") for key in firsts)  # the rank, title, nodes and GPUs on one line
    assert all(key.startswith("b") for key in keys[1:2])  # then b×A and the options
    assert "global batch 131,072 tokens (64 × 2,048)," in result.stdout


@pytest.mark.parametrize("name", ["llama-3-8b", "h100-80gb", "llama-3-8b-fsdp-no-sync-16xh100"])
def test_presets_show_prints_its_file_path_whole(name: str) -> None:
    result = runner.invoke(app, ["presets", "show", name], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.endswith(".toml") and "/presets/" in first


def test_check_keeps_scenario_names_whole_and_shows_progress(tmp_path: Path) -> None:
    """The longest shipped name at 80 columns; progress on stderr, one line per scenario when piped."""
    name = "llama-3-8b-fsdp-no-sync-16xh100"
    for folder, suffix in (("scenarios", ".toml"), ("expected", ".json")):
        (tmp_path / folder).mkdir()
        shipped = ROOT / "presets" / folder / f"{name}{suffix}"
        (tmp_path / folder / f"{name}{suffix}").write_bytes(shipped.read_bytes())
    result = runner.invoke(app, ["check", str(tmp_path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert any(f"│ {name} │ ok" in line for line in result.stdout.splitlines())
    assert result.stderr == f"zerocalc check: {name}: 1/1 scenarios\n"


def test_a_progress_bar_names_what_runs_now() -> None:
    import io

    from zerocalc.harness.procs import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = Progress("zerocalc validate", 2, Terminal())
    bar.running("ddp · fp32")
    bar.step("ddp · fp32", "match")
    bar.running("fsdp2 · fp32")  # the one now running, not the one finished
    assert bar._bar.tasks[0].description == "fsdp2 · fp32" and bar._bar.tasks[0].completed == 1
    bar.close()


def test_validate_collective_headers_are_distinct() -> None:
    from zerocalc.cli.validate_report import collective_table
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.validate.compare import CollectiveResult, ConfigResult

    collective = CollectiveResult(op="all_reduce", phase="backward", dtype="fp32", group="world",
                                  group_size=2,
                                  predicted_calls=1, measured_calls=[1, 1], predicted_bytes=[8, 8],
                                  measured_bytes=[8, 8], ok=True, explanation="")  # fmt: skip
    config = ConfigResult(
        strategy="ddp", precision=PrecisionName.FP32, status="match", collectives=[collective]
    )
    headers = [str(column.header) for column in collective_table(config).columns if str(column.header)]
    assert len(headers) == len(set(headers))
    assert "calls\nmeas." in headers and "bytes/rank\nmeas." in headers
