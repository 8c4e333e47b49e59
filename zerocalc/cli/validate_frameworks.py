"""``zerocalc validate frameworks`` and ``validate tp``: the real frameworks run on ``--nproc`` processes (or
in the world torchrun/srun launched), each rank's bytes and every collective of a step compared with the
prediction, exactly.

Thin: read the options (:mod:`zerocalc.cli.measure_options`), call :func:`zerocalc.validate.run.run_all`,
render (:mod:`zerocalc.cli.validate_report`). Every prediction is made, so every bad input refused, before
any rank starts. torch is imported only once the command runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError
from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import comma_list, seconds, takes_measure, whole_number
from zerocalc.cli.validate_common import (
    MAX_RANKS,
    optimizer,
    precisions,
    progress_of,
    ranks,
    require_torch,
    size_overrides,
)

if TYPE_CHECKING:
    from zerocalc.model.architecture import Architecture
    from zerocalc.network.schedule import GradSync
    from zerocalc.parallel.finetune import FineTuning
    from zerocalc.validate.compare import ConfigResult
    from zerocalc.validate.config import TpPlan


@takes_measure(Measure.FRAMEWORKS)
def frameworks(values: dict[str, Any], given: frozenset[str]) -> None:
    """DDP, ZeRO-1, FSDP1 and FSDP2 on processes: bytes and collectives per rank.

    Run the real frameworks on --nproc processes (or in the world torchrun/srun launched); compare each
    rank's bytes after a step and every collective of the step with the prediction, exactly. Without
    --model: GPT-2 shrunk to odd sizes. With --lora-rank (--lora-targets, --dora, ...): PEFT's LoRA of
    the model (Llama shrunk without --model), its frozen base and trained adapters per rank."""
    from types import SimpleNamespace

    from zerocalc.request.finetune import finetune_of_options
    from zerocalc.request.options import FINETUNE_OPTIONS

    finetune = finetune_of_options(SimpleNamespace(**{name: values.get(name) for name in FINETUNE_OPTIONS}))
    require_torch()
    from zerocalc.harness import procs
    from zerocalc.network.schedule import GradSync
    from zerocalc.request.training import MAX_GRAD_ACCUM
    from zerocalc.validate import run
    from zerocalc.validate.config import STRATEGIES, check_buildable

    arch = run.resolve_architecture(values["model"], size_overrides(values), lora=finetune is not None)
    check_buildable(arch)
    chosen = comma_list(values["configurations"], "--strategies", tuple(STRATEGIES), allow_all=True)
    explicit = values["configurations"].strip().lower() != "all"
    if finetune is not None:
        chosen = run.check_finetune(arch, chosen, finetune, explicit)
        if finetune.lora is not None:
            require_peft()
    recipes = [p.value for p in precisions(values["precision"])]
    opt = optimizer(values["optimizer"]).value
    syncs = [
        GradSync(s)
        for s in comma_list(values["grad_sync"], "--grad-sync", tuple(g.value for g in GradSync), False)
    ]
    grad_accum = whole_number(values["grad_accum"], "--grad-accum")
    assert grad_accum is not None
    if not 1 <= grad_accum <= MAX_GRAD_ACCUM:
        raise InputError(
            f"--grad-accum {procs.brief(grad_accum)} is not accepted; "
            f"accepted: 1 to {MAX_GRAD_ACCUM:,} micro-batches"
        )
    timeout, nproc = seconds(values["timeout"]), ranks(values, "frameworks", launched_ok=True)
    world, per_node = run.world_and_node(nproc, whole_number(values["gpus_per_node"], "--gpus-per-node"))
    chosen = run.check_nodes(world, per_node, chosen, explicit=explicit)
    _run(
        arch,
        chosen,
        recipes,
        opt,
        grad_accum,
        syncs,
        nproc,
        timeout,
        per_node,
        None,
        values["json"],
        finetune,
    )


@takes_measure(Measure.TP)
def tp(values: dict[str, Any], given: frozenset[str]) -> None:
    """DTensor TP + FSDP2 on a dp × tp mesh of processes: bytes and collectives per rank.

    Run torchtitan's TP plan on the tp ranks, then FSDP2 over dp; compare each rank's bytes and every
    collective of a step, in order, with the prediction, exactly. Without --model: Llama shrunk to odd
    sizes."""
    require_torch()
    from zerocalc.harness import procs
    from zerocalc.network.schedule import GradSync
    from zerocalc.validate import run
    from zerocalc.validate.config import STRATEGIES, check_buildable
    from zerocalc.validate.tp import TP_STRATEGIES, check_tp, plan_for

    t = whole_number(values["tp"], "--tp")
    assert t is not None
    if not 2 <= t <= MAX_RANKS:
        raise InputError(
            f"--tp {procs.brief(t)} is not accepted; accepted: 2 to {MAX_RANKS:,} tensor-parallel ranks "
            "(zerocalc validate frameworks runs without TP)"
        )
    arch = run.resolve_architecture(values["model"], size_overrides(values), t)
    check_buildable(arch)
    accepted = tuple(s for s in STRATEGIES if s in TP_STRATEGIES)
    chosen = comma_list(values["configurations"], "--strategies", accepted, allow_all=True)
    recipes = [p.value for p in precisions(values["precision"])]
    opt = optimizer(values["optimizer"]).value
    timeout, nproc = seconds(values["timeout"]), ranks(values, "tp", launched_ok=True)
    world, per_node = run.world_and_node(nproc, None)
    plan = plan_for(world, t, values["sequence_parallel"], values["loss_parallel"])
    check_tp(arch, plan, chosen, 1)
    _run(arch, chosen, recipes, opt, 1, [GradSync.EVERY], nproc, timeout, per_node, plan, values["json"])


def require_peft() -> None:
    """PEFT, which a LoRA run needs, or one line saying how to get it."""
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise InputError(
            "validate frameworks with --lora-rank needs peft; accepted: pip install 'zerocalc[test]' "
            "(peft 0.21.2), or no fine-tuning option"
        )


def _run(
    arch: Architecture,
    chosen: list[str],
    recipes: list[str],
    opt: str,
    grad_accum: int,
    syncs: list[GradSync],
    nproc: int | None,
    timeout: float,
    per_node: int,
    tp_plan: TpPlan | None,
    json: bool,
    finetune: FineTuning | None = None,
) -> None:
    """Every strategy × precision × gradient-sync mode, with a progress line per configuration (on rank 0
    under torchrun), then the report (rank 0)."""
    from zerocalc.bench.topology import placement_from_env
    from zerocalc.cli.validate_common import finish
    from zerocalc.cli.validate_report import config_title, job_title, progress_line, render
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.validate import run

    shows = nproc is not None or placement_from_env().rank == 0
    upcoming = [
        job_title(s, PrecisionName(p), grad_accum, sync) for s in chosen for p in recipes for sync in syncs
    ]  # run_all's order
    with progress_of(len(upcoming), shows) as progress:
        if progress is not None and upcoming:
            progress.running(upcoming[0])

        def on_result(result: ConfigResult, done: int, total: int) -> None:
            if progress is not None:
                progress.step(config_title(result), progress_line(result, done, total))
                if done < len(upcoming):
                    progress.running(upcoming[done])

        report = run.run_all(
            arch,
            chosen,
            recipes,
            opt,
            nproc,
            timeout,
            on_result,
            grad_accum=grad_accum,
            grad_syncs=syncs,
            gpus_per_node=per_node,
            tp_plan=tp_plan,
            finetune=finetune,
        )
    if report is None:  # a rank other than 0 under torchrun
        return
    finish(report, json, render, report.all_match)
