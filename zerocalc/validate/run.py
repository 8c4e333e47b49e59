"""Orchestration of ``zerocalc validate``: which model, which backend, the configurations, their worlds.

The configurations (strategy × precision × gradient-sync mode) run one after the other in one world of
``nproc`` ranks spawned by :func:`zerocalc.harness.procs.spawn_series`, each within its own ``--timeout``;
a configuration that fails is reported in one line and the ones after it run in a fresh world. Under
torchrun/srun every configuration runs in the launched world, one after the other, in one process group;
rank 0 gets the report, the other ranks None. Every prediction is made before any rank starts, so bad
input is refused up front. Imports torch only to count GPUs (and, under torchrun, in the worker).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from pydantic import ValidationError

from zerocalc.base.errors import InputError
from zerocalc.comm.estimate import StrategyComm
from zerocalc.harness import procs
from zerocalc.harness.series import Results, run_series
from zerocalc.model.architecture import Architecture, count_parameters
from zerocalc.network.cluster import RankGroup
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.finetune import FineTuning
from zerocalc.states.framework import RankStates
from zerocalc.validate.compare import ConfigResult, ValidationReport, compare, predicted_comm, predictions
from zerocalc.validate.config import STRATEGIES, Job, Measured, TpPlan
from zerocalc.validate.tp import TpCall, tp_predictions

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
OPTION_FIELDS = {
    "num_layers": "--layers",
    "hidden_size": "--hidden",
    "num_heads": "--heads",
    "num_kv_heads": "--kv-heads",
    "intermediate_size": "--ffn",
    "vocab_size": "--vocab",
}
"""Architecture fields that can be overridden, and the options that do it."""

Predicted = StrategyComm | list[list[TpCall]]
"""A configuration's predicted collectives: ``zerocalc comm``'s estimate, or each rank's calls in order."""
OnResult = Callable[[ConfigResult, int, int], None]
"""Called after each configuration with its result, how many are done and how many there are."""


DEFAULT_TP_MODEL = "llama-3-8b"


def default_tp_shrink(tp: int) -> dict[str, int]:
    """Without ``--model`` under ``--tp t``: Llama shrunk to 2 layers, 3t heads of dimension 11 (t key/value
    heads), MLP 87t, vocabulary 1001: each tp rank's q, k, v and MLP slices have odd rows (33, 11, 87), so
    FSDP2's uneven dp rows show, and the vocabulary splits unevenly over tp (torch.chunk)."""
    return {
        "num_layers": 2,
        "hidden_size": 33 * tp,
        "num_heads": 3 * tp,
        "num_kv_heads": tp,
        "intermediate_size": 87 * tp,
        "vocab_size": 1001,
    }


def resolve_architecture(
    model: str | None, overrides: dict[str, int], tp: int = 1, lora: bool = False
) -> Architecture:
    """The preset or config.json with the size overrides (without ``--model``: the shrunk GPT-2, or under
    ``validate tp`` and with LoRA (``lora``: GPT-2's fused ``c_attn`` is not validate's model) the shrunk
    Llama of :func:`default_tp_shrink`)."""
    from zerocalc.request.presets import load_model

    shrunk_llama = tp > 1 or lora
    arch, _ = load_model(model or (DEFAULT_TP_MODEL if shrunk_llama else DEFAULT_MODEL))
    default = default_tp_shrink(tp) if shrunk_llama else DEFAULT_SHRINK
    changes = dict(overrides) if model else {**default, **overrides}
    for name, value in changes.items():
        if value < 1:
            raise InputError(
                f"{OPTION_FIELDS[name]} {procs.brief(value)} is not accepted; accepted: a whole number ≥ 1"
            )
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
    data["name"] = f"{arch.name} (" + ", ".join(f"{OPTION_FIELDS[k]} {v}" for k, v in changes.items()) + ")"
    try:
        return Architecture.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"the overridden architecture is not accepted: {first['msg']}") from None


LORA_FAMILIES = ("llama", "mistral", "qwen2")
"""The families whose transformers modules validate's model mirrors module for module (separate q, k, v
and o projections and MLP Linears of the same shapes), so that PEFT adapts the same Linears in both:
GPT-2's transformers attention is one fused ``c_attn`` Conv1D."""


def check_finetune(
    arch: Architecture, strategies: list[str], finetune: FineTuning, explicit: bool
) -> list[str]:
    """The strategies that run ``finetune`` (LoRA) rank by rank as modelled
    (:data:`zerocalc.states.finetune_ranks.FINETUNE_WRAPPERS`: left out of ``all``, refused when named);
    refuses, in one line, a fine-tuning validate does not build and a family :data:`LORA_FAMILIES` leaves
    out; PEFT's own refusals (targets that match nothing) come from the prediction."""
    from zerocalc.parallel.finetune import parameter_kinds
    from zerocalc.states.finetune_ranks import FINETUNE_WRAPPERS

    if finetune.lora is None or finetune.quant is not None or finetune.freeze:
        raise InputError(
            "validate frameworks fine-tunes with LoRA or DoRA only; accepted: --lora-rank R (with "
            "--lora-targets, --lora-dropout, --dora, --modules-to-save, --adapter-config)"
        )
    if arch.family not in LORA_FAMILIES:
        raise InputError(
            f"--lora-rank with {arch.name} ({arch.family or 'no model_type'}) is not accepted: validate's "
            "model mirrors transformers' modules of "
            f"{', '.join(LORA_FAMILIES)} only (GPT-2's attention is one fused c_attn there); accepted: "
            "--model llama-3-8b, mistral-7b, qwen2.5-7b or their config.json (no --model: Llama shrunk)"
        )
    runs = [s for s in strategies if STRATEGIES[s][2].wrapper in FINETUNE_WRAPPERS]
    refused = [s for s in strategies if s not in runs]
    if refused and explicit:
        accepted = ", ".join(s for s in STRATEGIES if STRATEGIES[s][2].wrapper in FINETUNE_WRAPPERS)
        raise InputError(
            f"--strategies {refused[0]} with --lora-rank is not accepted (its fine-tuning states are not "
            f"modelled rank by rank); accepted: {accepted}"
        )
    parameter_kinds(arch, finetune)  # PEFT's refusals, before any rank starts
    return runs


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(arch: Architecture, nproc: int | None, gpus: int) -> str:
    """nccl with GPUs, else gloo; refuses a model too large for CPU and more ranks than the node runs
    (``nproc`` None: the world is torchrun's/srun's)."""
    backend = "nccl" if gpus > 0 else "gloo"
    params = count_parameters(arch).total
    if backend == "gloo" and params > MAX_CPU_PARAMS:
        raise InputError(
            f"{arch.name} has {params:,} parameters, too many to train on CPU ({MAX_CPU_PARAMS:,} at most); "
            "accepted: size overrides such as --layers 2 --hidden 256 --vocab 1001"
        )
    if nproc is not None:
        procs.check_nproc(nproc, gpus)
    return backend


def is_hybrid(strategy: str) -> bool:
    """Whether a configuration shards over a node's ranks and replicates across nodes."""
    return STRATEGIES[strategy][2].shard_group is RankGroup.NODE


def world_and_node(nproc: int | None, gpus_per_node: int | None) -> tuple[int, int]:
    """(ranks, ranks per node): ``nproc`` spawned ranks on this node, or the torchrun/srun world (``nproc``
    None); ``gpus_per_node`` replaces the launch's ranks per node (a CPU run's nodes are notional)."""
    if nproc is None:
        from zerocalc.bench.topology import placement_from_env

        placement = placement_from_env()
        world, per_node = placement.world_size, placement.local_world_size
    else:
        world = per_node = nproc
    return world, gpus_per_node or per_node


def check_nodes(world: int, gpus_per_node: int, strategies: list[str], explicit: bool) -> list[str]:
    """The strategies that can run on ``world`` ranks of ``gpus_per_node`` per node: a hybrid one needs two
    nodes or more (left out of ``all`` otherwise, refused when named)."""
    if gpus_per_node < 1 or world % gpus_per_node:
        raise InputError(
            f"--gpus-per-node {procs.brief(gpus_per_node)} does not divide the {world} ranks; "
            "accepted: a divisor of the world size"
        )
    if world // gpus_per_node >= 2:
        return strategies
    hybrid = [s for s in strategies if is_hybrid(s)]
    if hybrid and explicit:
        raise InputError(
            f"{hybrid[0]} shards inside a node and replicates across nodes: {world} ranks of "
            f"{gpus_per_node} per node are one node; accepted: --gpus-per-node {world // 2} or fewer"
        )
    return [s for s in strategies if not is_hybrid(s)]


def run_all(
    arch: Architecture,
    strategies: list[str],
    precisions: list[str],
    optimizer: str,
    nproc: int | None,
    timeout_s: float,
    on_result: OnResult | None = None,
    grad_accum: int = 1,
    grad_syncs: list[GradSync] | None = None,
    gpus_per_node: int | None = None,
    tp_plan: TpPlan | None = None,
    finetune: FineTuning | None = None,
) -> ValidationReport | None:
    """Run every strategy × precision × gradient-sync mode and compare; ``nproc`` None: in the torchrun/srun
    world (the report on rank 0, None on the others), else in a world of ``nproc`` spawned ranks.
    ``strategies`` must run on ``gpus_per_node`` ranks per node (default: the launch's; see
    :func:`check_nodes`). ``tp_plan``: a ``dp × tp`` mesh of the world (checked with
    :func:`zerocalc.validate.tp.check_tp`), predicted by :mod:`zerocalc.validate.tp`. ``finetune``: PEFT's
    LoRA of the model on every rank (:func:`check_finetune`), predicted by
    :mod:`zerocalc.states.finetune_ranks` and :mod:`zerocalc.comm.finetune`."""
    procs.check_timeout(timeout_s)
    backend = choose_backend(arch, nproc, visible_gpus())
    world, per_node = world_and_node(nproc, gpus_per_node)
    jobs = [
        Job(
            arch=arch,
            strategy=s,
            precision=p,
            optimizer=optimizer,
            backend=backend,
            timeout_s=timeout_s,
            grad_accum=grad_accum,
            grad_sync=sync,
            gpus_per_node=per_node,
            tp_plan=tp_plan,
            finetune=finetune,
        )
        for s in strategies
        for p in precisions
        for sync in grad_syncs or [GradSync.EVERY]
    ]
    preds: list[list[RankStates]] = []
    comms: list[Predicted] = []
    for job in jobs:
        if tp_plan is None:
            preds.append(
                predictions(arch, job.strategy, world, job.precision, job.optimizer, per_node, finetune)
            )
            comms.append(predicted_comm(job, world))
        else:
            states, calls = tp_predictions(job)
            preds.append(states)
            comms.append(calls)
    results = (
        _run_launched(jobs, preds, comms, on_result)
        if nproc is None
        else _run_spawned(jobs, preds, comms, world, timeout_s, on_result)
    )
    if results is None:
        return None
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
        tp_plan=tp_plan,
        configs=results,
        all_match=all(r.status == "match" for r in results),
    )


def _failed(job: Job, error: str, seconds: float | None = None) -> ConfigResult:
    return ConfigResult(
        strategy=job.strategy,
        precision=job.precision,
        grad_accum=job.grad_accum,
        grad_sync=job.grad_sync,
        status="failed",
        error=error,
        seconds=seconds,
    )


def _measured(text: str) -> list[Measured]:
    return [Measured.model_validate(m) for m in json.loads(text)]


def _comparing(
    jobs: list[Job], preds: list[list[RankStates]], comms: list[Predicted]
) -> Callable[[int, list[Measured], float], ConfigResult]:
    """Job ``index``'s measurement compared with its predictions."""

    def compared(index: int, measured: list[Measured], seconds: float) -> ConfigResult:
        return compare(jobs[index], preds[index], comms[index], measured, seconds)

    return compared


def _run_spawned(
    jobs: list[Job],
    preds: list[list[RankStates]],
    comms: list[Predicted],
    world: int,
    timeout_s: float,
    on_result: OnResult | None,
) -> list[ConfigResult]:
    """Every configuration in a world of ``world`` spawned ranks (a fresh one after a failure); a failure
    is its configuration's one line."""

    compared = _comparing(jobs, preds, comms)
    module = "zerocalc.validate.worker"
    return run_series(module, jobs, world, timeout_s, _measured, _failed, compared, on_result)


def _run_launched(
    jobs: list[Job], preds: list[list[RankStates]], comms: list[Predicted], on_result: OnResult | None
) -> list[ConfigResult] | None:
    """Every configuration in the torchrun/srun world, one process group; None on ranks other than 0."""
    from zerocalc.validate import worker

    rank0 = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"

    compared = _comparing(jobs, preds, comms)
    results: Results[Job, list[Measured], ConfigResult] = Results(jobs, _failed, compared, on_result)

    def done(index: int, outcome: worker.Outcome, seconds: float) -> None:
        if not rank0:
            return
        if outcome is None or isinstance(outcome, str):
            results.done(index, procs.RanksFailed(outcome or "no figures came back"), seconds)
        else:
            results.done(index, outcome, seconds)

    worker.run_many(jobs, done)
    return results.results if rank0 else None
