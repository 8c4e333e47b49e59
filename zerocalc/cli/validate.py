"""``zerocalc validate``: run the real frameworks, measure every rank, compare with the exact prediction.

Each configuration (strategy × precision) is its own world of ``--nproc`` spawned processes (the bench
launcher), so one failing configuration is reported and the others still run. Under torchrun/srun the
configurations run one after the other in the launched processes; rank 0 prints.
Exit codes: 0 every model-state line matches, 1 a model-state line differs or a configuration failed,
2 bad input. torch is imported only once the command runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from typing import TYPE_CHECKING, Annotated

import typer

from zerocalc.cli import app, fail
from zerocalc.cli.options import Json, Model
from zerocalc.errors import InputError

if TYPE_CHECKING:
    from zerocalc.architecture import Architecture
    from zerocalc.validate.compare import ConfigResult, ValidationReport
    from zerocalc.validate.config import Job

NEEDS_TORCH = "zerocalc validate needs PyTorch; install it with: pip install 'zerocalc[bench]'"
DEFAULT_MODEL = "gpt2"
DEFAULT_SHRINK = {
    "num_layers": 2,
    "hidden_size": 63,
    "num_heads": 3,
    "intermediate_size": 252,
    "vocab_size": 1001,
}
"""Without ``--model``: GPT-2 shrunk to 2 layers, hidden 63 (3 heads), MLP 252, vocabulary 1001: odd sizes,
so FSDP1's padding, FSDP2's uneven rows and ZeroRedundancyOptimizer's uneven partition all show."""
MAX_CPU_PARAMS = 200_000_000
ALL_STRATEGIES = "ddp,zero1,fsdp1-no-shard,fsdp1-shard-grad-op,fsdp1-full-shard,fsdp2,fsdp2-no-reshard"

Layers = Annotated[int | None, typer.Option("--layers", help="Override the number of transformer blocks.")]
Hidden = Annotated[int | None, typer.Option("--hidden", help="Override the hidden size d.")]
Heads = Annotated[int | None, typer.Option("--heads", help="Override the attention heads.")]
KvHeads = Annotated[int | None, typer.Option("--kv-heads", help="Override the key/value heads (GQA).")]
Ffn = Annotated[int | None, typer.Option("--ffn", help="Override the MLP width f.")]
Vocab = Annotated[int | None, typer.Option("--vocab", help="Override the vocabulary size V.")]
Strategies = Annotated[
    str, typer.Option("--strategies", help="Comma list of " + ALL_STRATEGIES.replace(",", ", ") + ", or all.")
]
Precisions = Annotated[str, typer.Option("--precision", help="Comma list of fp32, bf16-mixed.")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adam or adamw.")]
Nproc = Annotated[
    int, typer.Option("--nproc", help="Processes per configuration (not under torchrun/srun); ≥ 2.")
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds allowed per configuration.")]


@app.command()
def validate(
    model: Model = None,
    layers: Layers = None,
    hidden: Hidden = None,
    heads: Heads = None,
    kv_heads: KvHeads = None,
    ffn: Ffn = None,
    vocab: Vocab = None,
    strategies: Strategies = "all",
    precision: Precisions = "fp32,bf16-mixed",
    optimizer: OptimizerOpt = "adam",
    nproc: Nproc = 2,
    timeout: Timeout = 120.0,
    json: Json = False,
) -> None:
    """Run DDP, ZeRO-1, FSDP1 and FSDP2 for real; compare measured bytes per rank with the prediction."""
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH)
    from zerocalc.bench.topology import launched_by
    from zerocalc.framework_states import OPTIMIZERS, PRECISIONS
    from zerocalc.validate.config import STRATEGIES, check_buildable

    overrides = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "intermediate_size": ffn,
        "vocab_size": vocab,
    }
    arch = resolve_architecture(model, {k: v for k, v in overrides.items() if v is not None})
    check_buildable(arch)
    chosen = _parse_list(strategies, "--strategies", tuple(STRATEGIES), allow_all=True)
    recipes = _parse_list(precision, "--precision", PRECISIONS, allow_all=False)
    opt = optimizer.strip().lower()
    if opt not in OPTIMIZERS:
        raise InputError(f"--optimizer {optimizer!r} is not accepted; accepted: {', '.join(OPTIMIZERS)}")
    if not timeout > 0:
        raise InputError(f"--timeout {timeout:g} is not accepted; accepted: seconds > 0")
    launched = launched_by() is not None
    if not launched and nproc < 2:
        raise InputError(f"--nproc {nproc} is not accepted; accepted: 2 or more processes")

    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus > 0 else "gloo"
    from zerocalc.architecture import count_parameters

    params = count_parameters(arch).total
    if backend == "gloo" and params > MAX_CPU_PARAMS:
        raise InputError(
            f"{arch.name} has {params:,} parameters, too many to train on CPU ({MAX_CPU_PARAMS:,} at most); "
            "accepted: size overrides such as --layers 2 --hidden 256 --vocab 1001"
        )
    if backend == "nccl" and not launched and nproc > gpus:
        raise InputError(f"--nproc {nproc} needs {nproc} GPUs, {gpus} visible; accepted: ≤ {gpus}")
    try:
        report = run_all(arch, chosen, recipes, opt, backend, nproc, timeout, launched)
    except KeyboardInterrupt:
        typer.echo("zerocalc: interrupted; every spawned process was stopped", err=True)
        raise typer.Exit(130) from None
    if report is None:  # a rank other than 0 under torchrun
        return
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render(report)
    if not report.all_match:
        raise typer.Exit(1)


def resolve_architecture(model: str | None, overrides: dict[str, int]) -> Architecture:
    """The preset or config.json with the size overrides (the shrunk GPT-2 without ``--model``)."""
    from pydantic import ValidationError

    from zerocalc.architecture import Architecture
    from zerocalc.presets import load_model

    arch, _ = load_model(model or DEFAULT_MODEL)
    changes = dict(overrides) if model else {**DEFAULT_SHRINK, **overrides}
    for name, value in changes.items():
        if value < 1:
            raise InputError(f"{_OPTION_FIELDS[name]} {value} is not accepted; accepted: a whole number ≥ 1")
    if not changes:
        return arch
    data = arch.model_dump()
    if "hidden_size" in changes or "num_heads" in changes:
        data["head_dim"] = None
        hidden_size = changes.get("hidden_size", arch.hidden_size)
        heads = changes.get("num_heads", arch.num_heads)
        if hidden_size % heads:
            raise InputError(
                f"--hidden {hidden_size} is not a multiple of --heads {heads}; "
                "accepted: hidden = heads × head dim"
            )
    kv = changes.get("num_kv_heads", data.get("num_kv_heads"))
    if kv and changes.get("num_heads", arch.num_heads) % kv:
        raise InputError(
            f"{changes.get('num_heads', arch.num_heads)} heads are not a multiple of {kv} key/value heads; "
            "accepted: --kv-heads dividing --heads"
        )
    data.update(changes)
    data["name"] = f"{arch.name} (" + ", ".join(f"{_OPTION_FIELDS[k]} {v}" for k, v in changes.items()) + ")"
    try:
        return Architecture.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"the overridden architecture is not accepted: {first['msg']}") from None


_OPTION_FIELDS = {
    "num_layers": "--layers",
    "hidden_size": "--hidden",
    "num_heads": "--heads",
    "num_kv_heads": "--kv-heads",
    "intermediate_size": "--ffn",
    "vocab_size": "--vocab",
}


def _parse_list(text: str, option: str, accepted: tuple[str, ...], allow_all: bool) -> list[str]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if allow_all and names == ["all"]:
        return list(accepted)
    bad = [n for n in names if n not in accepted]
    if not names or bad:
        shown = ("all, or " if allow_all else "") + ", ".join(accepted)
        raise InputError(f"{option} {text!r} is not accepted; accepted: {shown}")
    return list(dict.fromkeys(names))


def run_all(
    arch: Architecture,
    strategies: list[str],
    precisions: list[str],
    optimizer: str,
    backend: str,
    nproc: int,
    timeout: float,
    launched: bool,
) -> ValidationReport | None:
    from zerocalc.architecture import count_parameters
    from zerocalc.validate.compare import ValidationReport
    from zerocalc.validate.config import Job

    world = nproc
    if launched:
        from zerocalc.bench.topology import placement_from_env

        world = placement_from_env().world_size
    jobs = [
        Job(arch=arch, strategy=s, precision=p, optimizer=optimizer, backend=backend, timeout_s=timeout)
        for s in strategies
        for p in precisions
    ]
    if launched:
        results = _run_launched(jobs, world)
        if results is None:
            return None
    else:
        results = [_run_spawned(job, world) for job in jobs]
    return ValidationReport(
        model=arch.name,
        architecture=arch,
        parameters=count_parameters(arch).total,
        world_size=world,
        optimizer=optimizer,
        backend=backend,
        peak=(
            "torch.cuda.max_memory_allocated per rank, compared with model states + unsharded parameters"
            if backend == "nccl"
            else "not measurable on CPU (torch.cpu has no allocator statistics; RSS is not a measure)"
        ),
        configs=results,
        all_match=all(r.status == "match" for r in results),
    )


def _failed(job: Job, error: str, seconds: float | None = None) -> ConfigResult:
    from zerocalc.validate.compare import ConfigResult

    return ConfigResult(
        strategy=job.strategy, precision=job.precision, status="failed", error=error, seconds=seconds
    )


def _run_spawned(job: Job, world: int) -> ConfigResult:
    """One configuration as its own world of ``world`` spawned processes (the bench launcher)."""
    from zerocalc.bench.launch import BenchFailed, spawn_module
    from zerocalc.validate.compare import compare, predictions
    from zerocalc.validate.config import OUT_ENV, Measured

    preds = predictions(job.arch, job.strategy, world, job.precision, job.optimizer)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zerocalc-validate-") as folder:
        out = os.path.join(folder, "measured.json")
        try:
            spawn_module(
                "zerocalc.validate.worker", job.model_dump_json(), world, job.timeout_s, {OUT_ENV: out}
            )
            with open(out, encoding="utf-8") as handle:
                measured = [Measured.model_validate(m) for m in json.load(handle)]
        except (BenchFailed, OSError, ValueError) as exc:
            return _failed(job, str(exc), round(time.monotonic() - start, 2))
    return compare(job.strategy, job.precision, preds, measured, round(time.monotonic() - start, 2))


def _run_launched(jobs: list[Job], world: int) -> list[ConfigResult] | None:
    """Every configuration in the torchrun/srun world, one process group; None on ranks other than 0."""
    from zerocalc.validate import worker
    from zerocalc.validate.compare import compare, predictions

    start = time.monotonic()
    outcomes = worker.run_many(jobs)
    if os.environ.get("RANK", "0") != "0":
        return None
    seconds = round((time.monotonic() - start) / len(jobs), 2)
    results = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        if outcome is None or isinstance(outcome, str):
            results.append(_failed(job, outcome or "no figures came back"))
            continue
        preds = predictions(job.arch, job.strategy, world, job.precision, job.optimizer)
        results.append(compare(job.strategy, job.precision, preds, outcome, seconds))
    return results


def render(report: ValidationReport) -> None:
    from rich.table import Table

    from zerocalc.cli.render import console

    out = console()
    out.print(
        f"[bold]{report.model}[/bold]: {report.parameters:,} parameters, {report.world_size} ranks "
        f"({report.backend}), {report.optimizer}; bytes per rank after one step"
    )
    for config in report.configs:
        title = f"{config.strategy} · {config.precision}"
        if config.status == "failed":
            out.print(f"[bold red]✗ {title}: failed: {config.error}[/bold red]")
            continue
        table = Table(title=f"{title} ({config.seconds:g} s)", title_justify="left")
        for column in ("rank", "line", "predicted", "measured", "difference", ""):
            table.add_column(column, justify="left" if column in ("line", "") else "right")
        for rank in config.ranks:
            for line in rank.lines:
                if line.ok is None:
                    mark = "n/a"
                elif line.ok:
                    mark = "✓"
                else:
                    mark = "✗ OFF" if line.model_state else "~ outside tolerance"
                style = "bold red" if line.ok is False and line.model_state else None
                table.add_row(
                    str(rank.rank),
                    line.line,
                    f"{line.predicted:,}",
                    "—" if line.measured is None else f"{line.measured:,}",
                    "—" if line.difference is None else f"{line.difference:+,}",
                    mark,
                    style=style,
                )
            table.add_section()
        out.print(table)
    out.print(f"peak: {report.peak}")
    counts = {s: sum(1 for c in report.configs if c.status == s) for s in ("match", "mismatch", "failed")}
    verdict = (
        "every model-state line matches exactly" if report.all_match else "[bold red]NOT all match[/bold red]"
    )
    out.print(
        f"{counts['match']} configuration{'' if counts['match'] == 1 else 's'} match, "
        f"{counts['mismatch']} mismatch, "
        f"{counts['failed']} failed: {verdict}"
    )
