"""``zerocalc presets list|show``: what the shipped presets hold."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from zerocalc.cli.base import OneLineErrorGroup, PlainTextCommand, app, fail
from zerocalc.cli.render import console

presets_app = typer.Typer(
    help="List and show model, GPU and scenario presets.", no_args_is_help=True, cls=OneLineErrorGroup
)
app.add_typer(presets_app, name="presets")

Kind = Annotated[str | None, typer.Argument(help="models, gpus or scenarios \\[default: all three].")]
Name = Annotated[str, typer.Argument(help="A model, GPU or scenario preset name.")]
Gpus = Annotated[str, typer.Option("--gpus", "-n", help="GPUs for the default memory setup of a model.")]
AsToml = Annotated[
    bool,
    typer.Option(
        "--toml",
        help="Print the preset's file as it is: a model's is a starting point for --model path.toml.",
    ),
]


def _cell(value: Any) -> str:
    """A field value as a person reads it: no raw None/False, enums by their value."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (tuple, list)):
        return ", ".join(_cell(v) for v in value) if value else "none"
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, dict):
        return ", ".join(f"{k} {_cell(v)}" for k, v in value.items())
    return str(getattr(value, "value", value))


@presets_app.command("list", cls=PlainTextCommand)
def list_presets(kind: Kind = None) -> None:
    """Names of the presets, with a one-line description each (broken files are marked)."""
    from rich.table import Table

    from zerocalc.base.errors import InputError
    from zerocalc.request.presets import KINDS, GpuSpec, ModelPreset, load_toml, preset_names, preset_path
    from zerocalc.scenarios.scenario import Scenario

    if kind is not None and kind not in KINDS:
        raise fail(f"presets list {kind!r} is not a kind; accepted: {', '.join(KINDS)}")
    models: dict[str, type] = {"models": ModelPreset, "gpus": GpuSpec, "scenarios": Scenario}
    out = console()
    broken = 0
    for k in (kind,) if kind else KINDS:
        table = Table(title=k, header_style="bold")
        table.add_column("Name", no_wrap=True)
        table.add_column("Description", overflow="fold")
        for name in preset_names(k):
            try:
                data = load_toml(preset_path(k, name), models[k])
            except InputError as exc:
                broken += 1
                table.add_row(name, f"[red]broken: {exc}[/red]")
                continue
            table.add_row(name, getattr(data, "title", None) or getattr(data, "description", ""))
        out.print(table)
    if broken:
        raise typer.Exit(1)


@presets_app.command("show", cls=PlainTextCommand)
def show(name: Name, gpus: Gpus = "8", as_toml: AsToml = False) -> None:
    """A model's architecture, counts, largest layer and default memory; a GPU's or scenario's fields;
    with --toml, the preset's file."""
    from rich.table import Table

    from zerocalc.base.errors import InputError, shown
    from zerocalc.request.presets import KINDS, load_gpu, load_toml, preset_names, preset_path
    from zerocalc.scenarios.scenario import Scenario

    out = console()
    found = None
    for kind in KINDS:
        try:
            found = (kind, preset_path(kind, name))
            break
        except InputError:
            continue
    if found is None:
        listing = "; ".join(f"{kind}: {', '.join(preset_names(kind))}" for kind in KINDS)
        raise InputError(
            f"presets show {shown(name)} is not a model, GPU or scenario preset; accepted: {listing}"
        )
    kind, path = found
    if as_toml:
        typer.echo(path.read_text(encoding="utf-8"), nl=False)
        return
    if kind == "models":
        from zerocalc.api import estimate_memory
        from zerocalc.base.units import ByteUnit
        from zerocalc.render.memory import render_memory
        from zerocalc.request.presets import load_model

        estimate = estimate_memory(model=name, gpus=gpus)
        _, preset = load_model(name)
        assert estimate.model is not None
        arch = estimate.model.parameter_count
        out.print(f"[bold]{preset.title if preset else name}[/bold]: {path}", soft_wrap=True)
        table = Table(header_style="bold")
        table.add_column("Field", no_wrap=True)
        table.add_column("Value", overflow="fold")
        architecture, _ = load_model(name)
        for field, value in architecture.model_dump(exclude={"name"}).items():
            table.add_row(field, _cell(value))
        for field, value in arch.model_dump().items():
            table.add_row(f"[bold]{field}[/bold]", _cell(value))
        if preset and preset.published_params:
            table.add_row("published count", f"{preset.published_params:,} ({preset.source})")
        out.print(table)
        render_memory(out, estimate, ByteUnit.GiB)
        return
    data = load_gpu(name) if kind == "gpus" else load_toml(path, Scenario)
    out.print(f"[bold]{name}[/bold]: {path}", soft_wrap=True)
    table = Table(header_style="bold")
    table.add_column("Field", no_wrap=True)
    table.add_column("Value", overflow="fold")
    for field, value in data.model_dump().items():
        table.add_row(field, _cell(value))
    out.print(table)
