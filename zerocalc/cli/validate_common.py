"""What the ``zerocalc validate`` subcommands share: reading their typed values (the recipes, the optimizer,
the size overrides, a micro-batch shape), the refusals of a missing torch or of a launched world, and the
run's ending (progress on stderr, the JSON or the tables, exit code 1 when a figure differs). No torch at
import.

Exit codes of every subcommand: 0 every compared figure matches, 1 one differs or a configuration failed,
2 bad input, 130 Ctrl-C.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from zerocalc.base.errors import InputError
from zerocalc.cli.base import fail
from zerocalc.cli.options import comma_list, whole_number

if TYPE_CHECKING:
    from zerocalc.harness.procs import Progress
    from zerocalc.parallel.optimizers import OptimizerName
    from zerocalc.parallel.precision import PrecisionName

NEEDS_TORCH = "zerocalc validate needs PyTorch; install it with: pip install 'zerocalc[bench]'"
NEEDS_TRANSFORMERS = (
    "zerocalc validate {command} needs PyTorch and transformers; install them with: "
    "pip install 'zerocalc[validate]'"
)
SIZES = {
    "layers": "num_layers",
    "hidden": "hidden_size",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
}
"""The size overrides (option → the architecture's field) of the subcommands that build validate's model."""
MAX_RANKS = 1_048_576
"""Ranks of a fake process group at most (each rank's shard is computed, none allocated), and so --tp."""
MAX_TOKENS = 65_536
"""b·s at most where the run is a CPU forward of a tiny model (the attention's [b, a, s, s] when eager)."""


def require_torch(transformers: str | None = None) -> None:
    """One line when torch (and, naming the subcommand ``transformers``, transformers) is missing."""
    if importlib.util.find_spec("torch") is None and transformers is None:
        raise fail(NEEDS_TORCH)
    if transformers is not None and (
        importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None
    ):
        raise fail(NEEDS_TRANSFORMERS.format(command=transformers))


def size_overrides(values: dict[str, Any]) -> dict[str, int]:
    """The architecture fields the size options given set (``--layers 2`` → ``num_layers: 2``)."""
    found = {}
    for name, field in SIZES.items():
        value = whole_number(values[name], "--" + name.replace("_", "-"))
        if value is not None:
            found[field] = value
    return found


def precisions(text: str) -> list[PrecisionName]:
    """``--precision``: a comma list of validate's recipes."""
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.validate.config import PRECISIONS

    accepted = tuple(p.value for p in PRECISIONS)
    return [PrecisionName(p) for p in comma_list(text, "--precision", accepted, allow_all=False)]


def optimizer(text: str) -> OptimizerName:
    """``--optimizer``: one of validate's optimizers."""
    from zerocalc.parallel.optimizers import OptimizerName
    from zerocalc.validate.config import OPTIMIZERS

    name = text.strip().lower()
    if name not in {o.value for o in OPTIMIZERS}:
        raise InputError(
            f"--optimizer {text!r} is not accepted; accepted: {', '.join(o.value for o in OPTIMIZERS)}"
        )
    return OptimizerName(name)


def shape(values: dict[str, Any], at_most: int | None = MAX_TOKENS, min_seq: int = 2) -> tuple[int, int]:
    """``--micro-batch`` b and ``--seq-len`` s: b ≥ 1, s ≥ ``min_seq`` and (``at_most``) b·s bounded."""
    from zerocalc.harness import procs

    b, s = whole_number(values["micro_batch"], "--micro-batch"), whole_number(values["seq_len"], "--seq-len")
    assert b is not None and s is not None
    if b < 1 or s < min_seq or (at_most is not None and b * s > at_most):
        accepted = f"b ≥ 1 and s ≥ {min_seq}"
        if at_most is not None:
            accepted = f"b ≥ 1, s ≥ {min_seq} and b·s ≤ {at_most:,} tokens"
        raise InputError(
            f"--micro-batch {procs.brief(b)} --seq-len {procs.brief(s)} is not accepted; accepted: {accepted}"
        )
    return b, s


def ranks(values: dict[str, Any], command: str, launched_ok: bool = False) -> int | None:
    """``--nproc`` of a subcommand that starts its processes: 2 or more (default 2); None under
    torchrun/srun where ``launched_ok`` (the launched world's ranks), else refused there."""
    from zerocalc.bench.topology import launched_by
    from zerocalc.harness import procs

    if launched_by() is not None:
        if launched_ok:
            return None
        raise InputError(
            f"zerocalc validate {command} starts its own --nproc processes; accepted: zerocalc validate "
            f"{command} --nproc N ... outside torchrun/srun"
        )
    nproc = whole_number(values["nproc"], "--nproc")
    nproc = 2 if nproc is None else nproc
    if nproc < 2:
        raise InputError(f"--nproc {procs.brief(nproc)} is not accepted; accepted: 2 or more processes")
    return nproc


def spawned_ranks(values: dict[str, Any], command: str) -> int:
    """:func:`ranks` of a subcommand that runs outside torchrun/srun only."""
    nproc = ranks(values, command)
    assert nproc is not None
    return nproc


@contextmanager
def progress_of(total: int, shows: bool = True) -> Iterator[Progress | None]:
    """The progress of ``total`` configurations on stderr (None where this rank does not show it); Ctrl-C
    while they run is one line and exit 130 (every spawned rank has been stopped)."""
    from zerocalc.harness import procs

    progress = procs.Progress("zerocalc validate", total) if shows else None
    try:
        yield progress
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()  # first: the bar would overwrite the line
        typer.echo(f"zerocalc: {procs.INTERRUPTED}", err=True)
        raise typer.Exit(procs.EXIT_INTERRUPTED) from None
    finally:
        if progress is not None:
            progress.close()


def step_line(progress: Progress | None) -> Callable[[Any, int, int], None]:
    """An ``on_result`` marking each finished configuration (``title``, ``status``, ``seconds``)."""

    def on_result(result: Any, done: int, total: int) -> None:
        if progress is not None:
            seconds = f" ({result.seconds:g} s)" if result.seconds is not None else ""
            progress.step(result.title, f"{result.status}{seconds}, {done}/{total} configurations")

    return on_result


def finish(report: Any, json: bool, render: Callable[[Any], None], ok: bool) -> None:
    """Print ``report`` (its JSON, or ``render``'s tables); exit code 1 unless ``ok``."""
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render(report)
    if not ok:
        raise typer.Exit(1)


def mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("✓" if ok else "✗ OFF")


def hf_config(model: str, command: str, on_cpu: bool = True) -> tuple[str, dict[str, Any]]:
    """``--model`` of ``validate activations`` and ``validate cuda``: the name and dict of a Hugging Face
    config.json of a family the hf profile reads (``on_cpu``: small enough for a CPU forward)."""
    from pathlib import Path

    from zerocalc.model.architecture import count_parameters
    from zerocalc.model.hf_config import _load, architecture_from_hf_dict
    from zerocalc.validate.run import MAX_CPU_PARAMS

    path = Path(model).expanduser()
    if not (model.endswith(".json") or path.is_file()):
        alternative = ", or --family" if command == "activations" else ""
        raise InputError(
            f"--model {model!r} with zerocalc validate {command} is not accepted; accepted: a Hugging Face "
            f"config.json (the modules are built from it){alternative}"
        )
    config = _load(path)
    arch = architecture_from_hf_dict(config, f"--model {model!r}", path.parent.name or path.stem)
    params = count_parameters(arch).total
    if on_cpu and params > MAX_CPU_PARAMS:
        raise InputError(
            f"--model {model!r} has {params:,} parameters, too many for a CPU forward ({MAX_CPU_PARAMS:,} at "
            "most); accepted: a config.json with fewer layers or a smaller hidden size"
        )
    return arch.name, config


def reshards(text: str) -> list[bool]:
    """``--reshard``: a comma list of yes, no (FSDP2 ``reshard_after_forward``)."""
    return [r == "yes" for r in comma_list(text, "--reshard", ("yes", "no"), allow_all=False)]
