"""``zerocalc check``: recompute every scenario and compare with its committed expectation."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from zerocalc.base.units import plural
from zerocalc.cli.base import PlainTextCommand, app, fail
from zerocalc.cli.render import console

Directory = Annotated[
    Path | None,
    typer.Argument(help="A presets folder with scenarios/ and expected/ \\[default: the shipped presets]."),
]
Update = Annotated[
    bool, typer.Option("--update", help="Rewrite the expectations (atomically, file by file).")
]
MAX_CHANGES_SHOWN = 8

if TYPE_CHECKING:
    from rich.table import Table


@app.command(cls=PlainTextCommand)
def check(directory: Directory = None, update: Update = False) -> None:
    """Recompute every preset scenario (memory and comm) and compare with presets/expected/NAME.json."""
    from rich.table import Table

    from zerocalc.harness import procs
    from zerocalc.request.presets import installed_presets, presets_root

    root = directory or presets_root()
    if not root.exists():
        raise fail(f"{str(root)!r} does not exist; accepted: a presets folder (scenarios/, expected/)")
    scenarios_dir = root / "scenarios"
    if not scenarios_dir.is_dir():
        raise fail(
            f"{str(root)!r} has no scenarios/ folder; accepted: a presets folder (scenarios/, expected/)"
        )
    if update and directory is None and installed_presets(root):
        raise fail(
            f"--update would rewrite the presets installed with zerocalc ({root}); accepted: "
            "`zerocalc check --update DIR` with the folder you mean to rewrite (e.g. a checkout's presets/)"
        )
    files = sorted(p for p in scenarios_dir.glob("*.toml") if p.is_file())
    if not files:
        raise fail(f"{str(scenarios_dir)!r} holds no scenario (*.toml)")

    table = Table(header_style="bold")
    table.add_column("Scenario", no_wrap=True)
    table.add_column("Result", no_wrap=True)
    details: dict[str, list[str]] = {}
    failures = 0
    progress = procs.Progress("zerocalc check", len(files))
    try:
        for number, path in enumerate(files):
            progress.running(path.stem)
            failures += _check_one(root, path, update, table, details)
            progress.step(path.stem, f"{number + 1}/{len(files)} scenarios")
    finally:
        progress.close()
    known = {path.stem for path in files}
    for orphan in sorted((root / "expected").glob("*.json")):
        if orphan.stem not in known:
            failures += 1
            table.add_row(orphan.stem, "[red]orphan[/red]")
            details[orphan.stem] = [f"expected/{orphan.name} has no scenario (delete or add one)"]
    out = console()
    out.print(f"[bold]zerocalc check[/bold]: {root}", soft_wrap=True)
    out.print(table)
    for name, lines in details.items():  # whole lines, never cut: a terminal wraps them
        out.print(f"[bold]{name}[/bold]")
        for line in lines:
            out.print(f"  {line}", soft_wrap=True, markup=False)
    if update:
        written = plural(len(files) - failures, "expectation")
        out.print(f"{written} written, {plural(failures, 'scenario')} broken")
    else:
        out.print(f"{len(files) - failures} of {plural(len(files), 'scenario')} match their expectations")
    if failures:
        raise typer.Exit(1)


def _check_one(root: Path, path: Path, update: bool, table: Table, details: dict[str, list[str]]) -> int:
    """Recompute one scenario, add its row and what changed (``details``); 1 when it is broken or changed,
    else 0."""
    from zerocalc.base.atomic import write_text_atomic
    from zerocalc.base.errors import InputError, why_not
    from zerocalc.request.presets import load_toml
    from zerocalc.scenarios.check import diff
    from zerocalc.scenarios.scenario import Scenario, evaluate_scenario

    expected_path = root / "expected" / f"{path.stem}.json"
    expected_name = f"expected/{expected_path.name}"
    try:
        actual = evaluate_scenario(load_toml(path, Scenario))
    except InputError as exc:
        table.add_row(path.stem, "[red]broken[/red]")
        details[path.stem] = [str(exc)]
        return 1
    text = jsonlib.dumps(actual, indent=2, sort_keys=True) + "\n"
    if update:
        try:
            write_text_atomic(expected_path, text, parents=True)  # expected/ of the named folder
        except OSError as exc:
            raise fail(
                f"{str(expected_path)!r} cannot be written ({why_not(exc)}); nothing after it was "
                "written; accepted: a writable presets folder"
            ) from None
        table.add_row(path.stem, f"[cyan]updated[/cyan] {expected_name}")
        return 0
    if not expected_path.is_file():
        table.add_row(path.stem, "[red]no expectation[/red]")
        details[path.stem] = [f"{expected_name} is missing (run --update)"]
        return 1
    try:
        expected = jsonlib.loads(expected_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        table.add_row(path.stem, "[red]broken[/red]")
        details[path.stem] = [f"{expected_name}: not UTF-8 text"]
        return 1
    except jsonlib.JSONDecodeError as exc:
        table.add_row(path.stem, "[red]broken[/red]")
        details[path.stem] = [f"{expected_name}: not JSON ({exc.msg})"]
        return 1
    changes = diff(expected, jsonlib.loads(text))
    if not changes:
        table.add_row(path.stem, "[green]ok[/green]")
        return 0
    shown = [f"{c.path}: {c.old} → {c.new}" for c in changes[:MAX_CHANGES_SHOWN]]
    if len(changes) > MAX_CHANGES_SHOWN:
        shown.append(f"… and {len(changes) - MAX_CHANGES_SHOWN} more")
    table.add_row(path.stem, f"[red]changed ({len(changes)})[/red]")
    details[path.stem] = shown
    return 1
