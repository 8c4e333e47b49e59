"""``zerocalc presets list|show``: what the shipped presets hold."""

from __future__ import annotations

from typing import Annotated

import typer

from zerocalc.cli.base import app, fail
from zerocalc.cli.render import console

presets_app = typer.Typer(help="List and show model, GPU and scenario presets.", no_args_is_help=True)
app.add_typer(presets_app, name="presets")

Kind = Annotated[str | None, typer.Argument(help="models, gpus or scenarios [default: all three].")]
Name = Annotated[str, typer.Argument(help="A model, GPU or scenario preset name.")]
Gpus = Annotated[int, typer.Option("--gpus", "-n", help="GPUs for the default memory setup of a model.")]


@presets_app.command("list")
def list_presets(kind: Kind = None) -> None:
    """Names of the presets, with a one-line description each."""
    from rich.table import Table

    from zerocalc.presets import KINDS, GpuSpec, ModelPreset, load_toml, preset_names, preset_path
    from zerocalc.scenarios import Scenario

    if kind is not None and kind not in KINDS:
        raise fail(f"presets list {kind!r} is not a kind; accepted: {', '.join(KINDS)}")
    models: dict[str, type] = {"models": ModelPreset, "gpus": GpuSpec, "scenarios": Scenario}
    out = console()
    for k in (kind,) if kind else KINDS:
        table = Table(title=k, header_style="bold")
        table.add_column("Name")
        table.add_column("Description")
        for name in preset_names(k):
            data = load_toml(preset_path(k, name), models[k])
            table.add_row(name, getattr(data, "title", None) or getattr(data, "description", ""))
        out.print(table)


@presets_app.command("show")
def show(name: Name, gpus: Gpus = 8) -> None:
    """A model's architecture, counts, largest layer and default memory; a GPU's or scenario's fields."""
    from rich.table import Table

    from zerocalc.errors import InputError
    from zerocalc.presets import load_gpu, load_model, load_toml, preset_path
    from zerocalc.scenarios import Scenario

    out = console()
    try:
        path = preset_path("models", name)
    except InputError:
        path = None
    if path is not None:
        from zerocalc.api import estimate_memory
        from zerocalc.architecture import count_parameters
        from zerocalc.cli.memory import render_memory
        from zerocalc.units import ByteUnit

        arch, preset = load_model(name)
        count = count_parameters(arch)
        table = Table(title=f"{preset.title if preset else arch.name} ({path})", header_style="bold")
        table.add_column("Field")
        table.add_column("Value")
        for field, value in arch.model_dump(exclude={"name"}).items():
            table.add_row(field, str(getattr(value, "value", value)))
        for field, value in count.model_dump().items():
            table.add_row(f"[bold]{field}[/bold]", f"{value:,}" if isinstance(value, int) else str(value))
        if preset and preset.published_params:
            table.add_row("published count", f"{preset.published_params:,} ({preset.source})")
        out.print(table)
        render_memory(estimate_memory(model=name, gpus=gpus), ByteUnit.GiB)
        return
    for kind in ("gpus", "scenarios"):
        try:
            path = preset_path(kind, name)
        except InputError:
            continue
        data = load_gpu(name) if kind == "gpus" else load_toml(path, Scenario)
        table = Table(title=f"{name} ({path})", header_style="bold")
        table.add_column("Field")
        table.add_column("Value")
        for field, value in data.model_dump().items():
            table.add_row(field, str(value))
        out.print(table)
        return
    preset_path("models", name)  # raises the one-line error with the closest model names
