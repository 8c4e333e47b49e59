"""``zerocalc validate``: run the real frameworks, measure every rank, compare with the exact prediction.

Thin: parse the options, call :func:`zerocalc.validate.run.run_all` (the orchestration), render the report.
Exit codes: 0 every model-state line matches, 1 a model-state line differs or a configuration failed,
2 bad input, 130 Ctrl-C. torch is imported only once the command runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from zerocalc.base.errors import InputError
from zerocalc.cli.base import PlainTextCommand, app, fail
from zerocalc.cli.options import annotated
from zerocalc.request.options import Command

Json = annotated(Command.MEMORY, "json")
Model = annotated(Command.MEMORY, "model")

if TYPE_CHECKING:
    from rich.table import Table

    from zerocalc.network.schedule import GradSync
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.request.training import TrainingRequest
    from zerocalc.validate.compare import ConfigResult, ValidationReport
    from zerocalc.validate.step_timing import StepTiming

NEEDS_TORCH = "zerocalc validate needs PyTorch; install it with: pip install 'zerocalc[bench]'"
ALL_STRATEGIES = (
    "ddp,zero1,fsdp1-no-shard,fsdp1-shard-grad-op,fsdp1-full-shard,fsdp1-hybrid-shard,fsdp2-no-reshard,fsdp2,"
    "fsdp2-hsdp"
)
"""For --help without importing the records; a test checks it equals validate.config.STRATEGIES."""

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
    int,
    typer.Option(
        "--nproc",
        help="Processes per configuration (not under torchrun/srun): 2 to one per GPU, or 4 per CPU core.",
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds allowed per configuration; ≤ 1 day.")]
GradAccum = Annotated[int, typer.Option("--grad-accum", "-A", help="A: micro-batches per optimizer step.")]
GradSyncs = Annotated[
    str,
    typer.Option(
        "--grad-sync",
        help="Comma list of every, last: gradients reduced every micro-batch, or only on the last "
        "(no_sync() or FSDP2 gradient sync off before).",
    ),
]
GpusPerNode = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        "-g",
        help="Ranks per node: the shard group of fsdp1-hybrid-shard and fsdp2-hsdp, which need 2 nodes or "
        "more \\[default: the launch's; spawned: --nproc].",
        show_default=False,
    ),
]

Tp = Annotated[
    str,
    typer.Option(
        "--tp",
        help="Tensor-parallel ranks t: torchtitan's TP plan on a dp × tp mesh (TP innermost, dp = ranks / "
        "t), then FSDP2 over dp (fsdp2, fsdp2-no-reshard); with --fake a comma list (a case per --world).",
    ),
]
SequenceParallelOpt = Annotated[
    bool,
    typer.Option(
        "--sequence-parallel/--no-sequence-parallel",
        help="With --tp: SequenceParallel norms, activations sharded on the sequence between blocks.",
    ),
]
LossParallelOpt = Annotated[
    bool,
    typer.Option(
        "--loss-parallel/--no-loss-parallel",
        help="With --tp: the logits stay sharded over the vocabulary into the cross entropy (loss_parallel).",
    ),
]


Activations = Annotated[
    bool,
    typer.Option(
        "--activations",
        help="Measure on the CPU what real Hugging Face modules save for backward (saved_tensors_hooks) and "
        "compare it, region by region and to the byte, with the hf model profile (needs transformers).",
    ),
]
Families = Annotated[
    str,
    typer.Option("--family", help="With --activations: comma list of families (tiny configs), or all."),
]
Attentions = Annotated[
    str, typer.Option("--attention", help="With --activations: comma list of sdpa, eager.")
]
MicroBatch = Annotated[
    int, typer.Option("--micro-batch", "-b", help="With --activations or --device cuda: sequences b.")
]
SeqLen = Annotated[
    int, typer.Option("--seq-len", "-s", help="With --activations or --device cuda: tokens s.")
]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="cuda: run real FSDP2 steps on this GPU and compare each phase's peak with the step timeline; "
        "cpu: the same as --activations.",
        show_default=False,
    ),
]
TimeSteps = Annotated[
    int | None,
    typer.Option(
        "--time-steps",
        help="With --device cuda: then time this many whole steps (after 3 warm-up steps) and print their "
        "median against the step time `zerocalc comm` predicts (1 to 1,000).",
        show_default=False,
    ),
]
SnapshotOut = Annotated[
    str | None,
    typer.Option(
        "--snapshot-out",
        help="With --device cuda: write the measured step's PyTorch memory snapshot to this file, and the "
        "predicted one beside it (NAME.predicted.pickle for NAME.pickle).",
        show_default=False,
    ),
]
Fake = Annotated[
    bool,
    typer.Option(
        "--fake",
        help="Run real FSDP2 steps of a real Hugging Face model on the CPU under fake tensors and a fake "
        "process group of --world ranks (FSDPMemTracker), and compare each phase's allocated bytes with the "
        "step timeline, exactly (needs transformers).",
    ),
]
World = Annotated[
    str,
    typer.Option("--world", help="With --fake: comma list of world sizes (ranks of the fake group), ≥ 1."),
]
RecomputeOpt = Annotated[
    str, typer.Option("--recompute", help="With --fake: comma list of none, full (activation checkpointing).")
]
Reshard = Annotated[
    str, typer.Option("--reshard", help="With --fake: comma list of yes, no (FSDP2 reshard_after_forward).")
]
Pp = Annotated[
    int | None,
    typer.Option(
        "--pp",
        help="Pipeline stages: torch.distributed.pipelining Schedule1F1B over --nproc ranks (pp × dp, "
        "-A micro-batches, default 2·pp; --strategies none, ddp, fsdp2 per stage); with --fake, FSDP2 "
        "stages at each --world.",
        show_default=False,
    ),
]
PpFirstStageLayers = Annotated[
    int | None,
    typer.Option(
        "--pp-first-stage-layers",
        help="With --pp: the first stage's blocks; the others split the rest evenly (Megatron-LM's "
        "uneven split).",
        show_default=False,
    ),
]
PpLastStageLayers = Annotated[
    int | None,
    typer.Option(
        "--pp-last-stage-layers",
        help="With --pp: the last stage's blocks; the others split the rest evenly (Megatron-LM's "
        "uneven split).",
        show_default=False,
    ),
]
Ep = Annotated[
    int | None,
    typer.Option(
        "--ep",
        help="Expert-parallel ranks: the all-to-alls of a tiny MoE layer with a fixed router over --nproc "
        "ranks.",
        show_default=False,
    ),
]
Routing = Annotated[str, typer.Option("--routing", help="With --ep: comma list of balanced, skewed, or all.")]
FRAMEWORK_RUN_ONLY = (
    "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "strategies", "optimizer", "grad_accum",
    "grad_sync", "gpus_per_node", "nproc", "timeout", "tp", "sequence_parallel", "loss_parallel",
)  # fmt: skip
"""Options only the framework runs read (the default mode)."""
MODEL_SIZES = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
"""The architecture overrides (``--pp`` reads them too)."""
PIPELINE_READS = (
    "model", "precision", *MODEL_SIZES, "strategies", "optimizer", "grad_accum", "nproc", "timeout", "pp",
    "pp_first_stage_layers", "pp_last_stage_layers", "json",
)  # fmt: skip
FAKE_PIPELINE_READS = (
    "model", "precision", *MODEL_SIZES, "optimizer", "grad_accum", "world", "pp", "micro_batch", "seq_len",
    "reshard", "json",
)  # fmt: skip
READ_BY_MODE = {
    "activations": ("model", "precision", "family", "attention", "micro_batch", "seq_len", "json"),
    "cuda": ("model", "micro_batch", "seq_len", "snapshot_out", "time_steps", "json"),
    "fake": (
        "model",
        "world",
        "micro_batch",
        "seq_len",
        "recompute",
        "reshard",
        "tp",
        "sequence_parallel",
        "loss_parallel",
        "json",
    ),
    "frameworks": ("model", "precision", *FRAMEWORK_RUN_ONLY, "json"),
    "pipeline": PIPELINE_READS,
    "fake-pipeline": FAKE_PIPELINE_READS,
    "expert": ("ep", "routing", "nproc", "timeout", "micro_batch", "seq_len", "json"),
}
"""The options each mode reads; one given to a mode that does not read it is refused, not ignored."""
MAX_ACTIVATION_TOKENS = 65_536
"""--activations: b·s at most (a CPU forward of a tiny model; the attention's [b, a, s, s] when eager)."""


@app.command(cls=PlainTextCommand)
def validate(
    ctx: typer.Context,
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
    grad_accum: GradAccum = 1,
    grad_sync: GradSyncs = "every",
    gpus_per_node: GpusPerNode = None,
    nproc: Nproc = 2,
    timeout: Timeout = 120.0,
    tp: Tp = "1",
    sequence_parallel: SequenceParallelOpt = True,
    loss_parallel: LossParallelOpt = True,
    activations: Activations = False,
    family: Families = "all",
    attention: Attentions = "sdpa,eager",
    micro_batch: MicroBatch = 2,
    seq_len: SeqLen = 64,
    device: DeviceOpt = None,
    snapshot_out: SnapshotOut = None,
    time_steps: TimeSteps = None,
    fake: Fake = False,
    world: World = "8",
    recompute: RecomputeOpt = "none",
    reshard: Reshard = "yes",
    pp: Pp = None,
    pp_first_stage_layers: PpFirstStageLayers = None,
    pp_last_stage_layers: PpLastStageLayers = None,
    ep: Ep = None,
    routing: Routing = "all",
    json: Json = False,
) -> None:
    """Run DDP, ZeRO-1, FSDP1 and FSDP2 for real; compare each rank's bytes and collectives with the
    prediction. --activations: the saved activations of real Hugging Face modules against the hf profile;
    --device cuda: each phase's peak of real FSDP2 steps against the step timeline; --fake: the same at
    any world size, on the CPU, under fake tensors."""
    chosen_device = _parse_device(device)
    if fake and (activations or chosen_device is not None):
        given = "--activations" if activations else f"--device {chosen_device}"
        raise InputError(f"--fake with {given} is not accepted; accepted: one of the two")
    if fake:
        mode = "fake"
    elif chosen_device == "cuda":
        mode = "cuda"
    else:
        mode = "activations" if activations or chosen_device == "cpu" else "frameworks"
    if pp is not None and mode in ("fake", "frameworks"):
        mode = "fake-pipeline" if fake else "pipeline"
    elif ep is not None and mode == "frameworks":
        mode = "expert"
    _refuse_unread_options(ctx, mode)
    if mode in ("pipeline", "fake-pipeline", "expert"):
        from zerocalc.cli import validate_parallel

        sizes = {"num_layers": layers, "hidden_size": hidden, "num_heads": heads, "num_kv_heads": kv_heads,
                 "intermediate_size": ffn, "vocab_size": vocab}  # fmt: skip
        overrides = {k: v for k, v in sizes.items() if v is not None}
        microbatches = grad_accum if _given(ctx, "grad_accum") else None
        if mode == "pipeline":
            validate_parallel.pipeline(
                model, overrides, strategies, precision, optimizer, microbatches, nproc, timeout, pp or 0,
                json, pp_first_stage_layers, pp_last_stage_layers,
            )  # fmt: skip
        elif mode == "fake-pipeline":
            validate_parallel.fake_pipeline(
                model, overrides, world, pp or 0, microbatches, micro_batch, seq_len, precision, optimizer,
                reshard, json,
            )  # fmt: skip
        else:
            validate_parallel.expert(ep or 0, routing, nproc, timeout, micro_batch, seq_len, json)
        return
    tps = _parse_tps(tp, many=fake)
    if tps == [1]:
        for name, value in (("sequence_parallel", sequence_parallel), ("loss_parallel", loss_parallel)):
            if _given(ctx, name):
                flag = f"--{'' if value else 'no-'}{name.replace('_', '-')}"
                raise InputError(f"{flag} without --tp is not accepted; accepted: --tp 2 or more with it")
    if fake:
        switches = (sequence_parallel, loss_parallel)
        _validate_fake(model, world, micro_batch, seq_len, recompute, reshard, json, tps, switches)
        return
    if chosen_device == "cuda":
        _validate_cuda(model, micro_batch, seq_len, json, snapshot_out, time_steps)
        return
    if activations or chosen_device == "cpu":
        _validate_activations(model, family, precision, attention, micro_batch, seq_len, json)
        return
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH)
    from zerocalc.bench.topology import launched_by, placement_from_env
    from zerocalc.harness import procs
    from zerocalc.network.schedule import GradSync
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.request.values import MAX_GRAD_ACCUM
    from zerocalc.validate import run
    from zerocalc.validate.config import OPTIMIZERS, PRECISIONS, STRATEGIES, check_buildable
    from zerocalc.validate.tp import TP_STRATEGIES, check_tp, plan_for

    overrides = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "intermediate_size": ffn,
        "vocab_size": vocab,
    }
    (tp_size,) = tps
    if tp_size > 1 and gpus_per_node is not None:
        raise InputError(
            f"--gpus-per-node with --tp {tp_size} is not accepted; accepted: one of the two (TP groups are "
            "the innermost ranks)"
        )
    arch = run.resolve_architecture(model, {k: v for k, v in overrides.items() if v is not None}, tp_size)
    check_buildable(arch)
    chosen = _parse_list(strategies, "--strategies", tuple(STRATEGIES), allow_all=True)
    if tp_size > 1 and strategies.strip().lower() == "all":
        chosen = [s for s in chosen if s in TP_STRATEGIES]
    recipes = _parse_list(precision, "--precision", tuple(p.value for p in PRECISIONS), allow_all=False)
    syncs = [
        GradSync(s) for s in _parse_list(grad_sync, "--grad-sync", tuple(g.value for g in GradSync), False)
    ]
    if not 1 <= grad_accum <= MAX_GRAD_ACCUM:
        raise InputError(
            f"--grad-accum {procs.brief(grad_accum)} is not accepted; "
            f"accepted: 1 to {MAX_GRAD_ACCUM:,} micro-batches"
        )
    opt = optimizer.strip().lower()
    if opt not in {o.value for o in OPTIMIZERS}:
        accepted = ", ".join(o.value for o in OPTIMIZERS)
        raise InputError(f"--optimizer {optimizer!r} is not accepted; accepted: {accepted}")
    procs.check_timeout(timeout)
    launched = launched_by() is not None
    if not launched and nproc < 2:
        raise InputError(f"--nproc {procs.brief(nproc)} is not accepted; accepted: 2 or more processes")
    world, per_node = run.world_and_node(None if launched else nproc, gpus_per_node)
    tp_plan = None
    if tp_size > 1:
        tp_plan = plan_for(world, tp_size, sequence_parallel, loss_parallel)
        check_tp(arch, tp_plan, chosen, grad_accum)
    else:
        chosen = run.check_nodes(world, per_node, chosen, explicit=strategies.strip().lower() != "all")

    shows = not launched or placement_from_env().rank == 0
    total = len(chosen) * len(recipes) * len(syncs)
    progress = procs.Progress("zerocalc validate", total) if shows else None

    upcoming = [
        job_title(s, PrecisionName(p), grad_accum, sync) for s in chosen for p in recipes for sync in syncs
    ]  # run_all's order
    if progress is not None and upcoming:
        progress.running(upcoming[0])

    def on_result(result: ConfigResult, done: int, total: int) -> None:
        if progress is not None:
            progress.step(config_title(result), _progress_line(result, done, total))
            if done < len(upcoming):
                progress.running(upcoming[done])

    try:
        report = run.run_all(
            arch,
            chosen,
            recipes,
            opt,
            None if launched else nproc,
            timeout,
            on_result,
            grad_accum=grad_accum,
            grad_syncs=syncs,
            gpus_per_node=per_node,
            tp_plan=tp_plan,
        )
    except KeyboardInterrupt:  # every spawned rank has been stopped
        if progress is not None:
            progress.close()  # first: the bar would overwrite the line
        typer.echo(f"zerocalc: {procs.INTERRUPTED}", err=True)
        raise typer.Exit(procs.EXIT_INTERRUPTED) from None
    finally:
        if progress is not None:
            progress.close()
    if report is None:  # a rank other than 0 under torchrun
        return
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render(report)
    if not report.all_match:
        raise typer.Exit(1)


MAX_TP = 1_048_576
"""--tp at most (the ranks of the largest fake world)."""


def _parse_tps(text: str, many: bool) -> list[int]:
    """``--tp``: one whole number ≥ 1, or with ``many`` (``--fake``) a comma list of them."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and 1 <= int(p) <= MAX_TP for p in parts) or (len(parts) > 1 and not many):
        accepted = "a comma list of whole numbers ≥ 1" if many else "a whole number ≥ 1"
        raise InputError(f"--tp {text!r} is not accepted; accepted: {accepted}")
    return list(dict.fromkeys(int(p) for p in parts))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` was given on the command line."""
    source = ctx.get_parameter_source(name)  # typer's own click: compare the member's name
    return source is not None and source.name == "COMMANDLINE"


def _refuse_unread_options(ctx: typer.Context, mode: str) -> None:
    """One line, exit 2, for an option given on the command line that ``mode`` does not read."""
    read = READ_BY_MODE[mode] + ("activations", "device", "fake")
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)  # typer's own click: compare the member's name
        if param.name in read or source is None or source.name != "COMMANDLINE":
            continue
        what = {
            "cuda": "--device cuda",
            "activations": "--activations",
            "fake": "--fake",
            "frameworks": "the framework runs",
            "pipeline": "--pp",
            "fake-pipeline": "--fake --pp",
            "expert": "--ep",
        }
        flags = {p.name: p.opts[0] for p in ctx.command.params}
        accepted = ", ".join(flags[name] for name in READ_BY_MODE[mode])
        raise InputError(f"{param.opts[0]} is not read by {what[mode]}; accepted there: {accepted}")


def _parse_device(device: str | None) -> str | None:
    if device is None:
        return None
    name = device.strip().lower()
    if name not in ("cpu", "cuda"):
        raise InputError(f"--device {device!r} is not accepted; accepted: cpu, cuda")
    return name


NEEDS_TRANSFORMERS = (
    "zerocalc validate --activations needs PyTorch and transformers; install them with: "
    "pip install 'zerocalc[validate]'"
)


def _check_shape(micro_batch: int, seq_len: int) -> None:
    from zerocalc.harness import procs

    if micro_batch < 1 or seq_len < 2 or micro_batch * seq_len > MAX_ACTIVATION_TOKENS:
        raise InputError(
            f"--micro-batch {procs.brief(micro_batch)} --seq-len {procs.brief(seq_len)} is not accepted; "
            f"accepted: b ≥ 1, s ≥ 2 and b·s ≤ {MAX_ACTIVATION_TOKENS:,} tokens"
        )


def _validate_activations(
    model: str | None, family: str, precision: str, attention: str, micro_batch: int, seq_len: int, json: bool
) -> None:
    """``--activations``: tiny configs of ``family`` (or ``model``, a config.json) measured on the CPU."""
    from zerocalc.validate.saved import ATTENTIONS, TINY_CONFIGS

    dtypes = [
        {"fp32": "fp32", "bf16-mixed": "bf16"}[p]
        for p in _parse_list(precision, "--precision", ("fp32", "bf16-mixed"), allow_all=False)
    ]
    attentions = _parse_list(attention, "--attention", ATTENTIONS, allow_all=False)
    _check_shape(micro_batch, seq_len)
    if model is not None:
        if family.strip().lower() != "all":
            raise InputError(f"--family {family!r} with --model is not accepted; accepted: one of the two")
        models = [_activation_model(model)]
    else:
        models = [(f, TINY_CONFIGS[f]) for f in _parse_list(family, "--family", tuple(TINY_CONFIGS), True)]
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise fail(NEEDS_TRANSFORMERS)
    from zerocalc.validate import saved_measure

    report = saved_measure.run_cases(models, dtypes, attentions, [(micro_batch, seq_len)])
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render_activations(report)
    if not report.all_match:
        raise typer.Exit(1)


def _activation_model(model: str, mode: str = "--activations", on_cpu: bool = True) -> tuple[str, dict]:
    """A config.json of a family the hf profile reads (``on_cpu``: small enough for a CPU forward)."""
    from pathlib import Path

    from zerocalc.model.architecture import count_parameters
    from zerocalc.model.hf_config import _load, architecture_from_hf_dict
    from zerocalc.validate.run import MAX_CPU_PARAMS

    path = Path(model).expanduser()
    if not (model.endswith(".json") or path.is_file()):
        raise InputError(
            f"--model {model!r} with {mode} is not accepted; accepted: a Hugging Face config.json "
            "(the modules are built from it), or --family"
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


def render_activations(report) -> None:
    """One row per case (predicted and measured saved bytes), then the regions that differ."""
    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"Saved activations of one training forward, hf profile vs torch {report.torch} + transformers "
        f"{report.transformers} on the CPU (saved_tensors_hooks; bytes per storage)"
    )
    keys, predicted, measured, difference, marks = [], [], [], [], []
    for case in report.cases:
        keys.append(f"{case.model} {case.dtype} {case.attention} b={case.micro_batch} s={case.seq_len}")
        predicted.append(f"{case.predicted:,}")
        measured.append(f"{case.measured:,}")
        difference.append(f"{case.measured - case.predicted:+,}")
        marks.append("exact" if case.exact else ("not claimed" if case.not_exact else "✗ OFF"))
    print_fitted(
        "case",
        keys,
        [
            Column(header="predicted", cells=predicted),
            Column(header="measured", cells=measured),
            Column(header="diff", cells=difference),
            Column(header="", cells=marks, justify="left"),
        ],
        key_width=24,
    )
    from rich.markup import escape

    notes: dict[str, list[str]] = {}
    for case in report.cases:
        if case.exact:
            continue
        title = f"{case.model} {case.dtype} {case.attention}"
        if case.not_exact:
            notes.setdefault(case.not_exact, []).append(f"{case.model} {case.attention}")
            continue
        for region in case.regions:
            if region.ok:
                continue
            out.print(
                f"[bold red]✗ {title}, {region.region}: predicted {region.predicted:,}, measured "
                f"{region.measured:,} ({region.difference:+,})[/bold red]"
            )
            for term in region.unmatched_terms:
                out.print(f"    predicted, not measured: {term.name} ({term.bytes:,} B)")
            for st in region.unmatched_storages:
                shape = "×".join(map(str, st.shape)) or "scalar"
                out.print(
                    f"    measured, not predicted: {st.dtype} {shape} ({st.bytes:,} B) saved by {st.saved_by}"
                )
    for reason, cases in notes.items():
        out.print(f"[dim]· not claimed exact ({', '.join(dict.fromkeys(cases))}): {escape(reason)}[/dim]")
    exact = sum(c.exact for c in report.cases)
    claimed = sum(c.not_exact is None for c in report.cases)
    verdict = "every claimed case is exact" if report.all_match else "[bold red]NOT all exact[/bold red]"
    out.print(f"{exact} of {len(report.cases)} cases exact to the byte ({claimed} claimed exact): {verdict}")


def predicted_snapshot_path(path: str) -> Path:
    """Where ``--device cuda --snapshot-out FILE`` puts the predicted snapshot: beside FILE, ``.predicted``
    before its suffix."""
    measured = Path(path)
    return measured.with_name(f"{measured.stem}.predicted{measured.suffix}")


def _validate_cuda(
    model: str | None,
    micro_batch: int,
    seq_len: int,
    json: bool,
    snapshot_out: str | None = None,
    time_steps: int | None = None,
) -> None:
    """``--device cuda``: real FSDP2 steps on this GPU (bf16 parameters, fp32 reduce: the recipe of the
    shared H100 measurements), each phase's peak against the step timeline; with ``snapshot_out``, the
    measured and the predicted step as PyTorch memory snapshots."""
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH)
    from zerocalc.validate import cuda_step

    device = cuda_step.cuda_device()
    if device is None:
        raise fail("--device cuda: no CUDA device is visible to torch here; accepted: a machine with a GPU")
    _check_shape(micro_batch, seq_len)
    from zerocalc.harness import procs
    from zerocalc.validate.step_timing import MAX_TIMED_STEPS

    if time_steps is not None and not 1 <= time_steps <= MAX_TIMED_STEPS:
        raise InputError(
            f"--time-steps {procs.brief(time_steps)} is not accepted; "
            f"accepted: 1 to {MAX_TIMED_STEPS:,} steps"
        )
    if snapshot_out is not None:
        from zerocalc.base.atomic import unwritable
        from zerocalc.base.errors import shown

        for path in (snapshot_out, predicted_snapshot_path(snapshot_out)):
            why = unwritable(path)
            if why is not None:
                raise InputError(f"--snapshot-out {shown(str(path))} {why}; accepted: a file path to write")
    name, config = _activation_model(model or "", "--device cuda", on_cpu=False)
    if importlib.util.find_spec("transformers") is None:
        raise fail(NEEDS_TRANSFORMERS)
    from zerocalc.parallel.strategies import StrategyName
    from zerocalc.peak.evaluate import evaluate_peak
    from zerocalc.request.training import parse_options
    from zerocalc.validate.phases import compare_phases

    gpu = _device_gpu_preset(*device)
    request = parse_options(
        model=model, gpus=1, framework="fsdp2", strategies="zero3", micro_batch=micro_batch, seq_len=seq_len,
        recompute="none", reduce_dtype="fp32", model_impl="hf", flash_attention=True, gpu=gpu, init="gpu",
    )  # fmt: skip
    peak = evaluate_peak(request).peak
    assert peak is not None
    (row,) = peak.strategies
    measured, recorded = cuda_step.run(
        config, micro_batch, seq_len, reshard=True, recompute=False, snapshot=snapshot_out is not None
    )
    report = compare_phases(row, measured)
    if snapshot_out is not None and recorded is not None:
        import pickle

        from zerocalc.base.atomic import write_bytes_atomic
        from zerocalc.peak.snapshot import predicted_snapshot

        predicted, _ = predicted_snapshot(request, StrategyName.ZERO3)
        beside = predicted_snapshot_path(snapshot_out)
        from zerocalc.base.errors import why_not

        for path, snapshot in ((Path(snapshot_out), recorded), (beside, predicted)):
            try:
                write_bytes_atomic(path, pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL))
            except OSError as exc:  # the paths were checked before the run: the disk changed
                raise fail(f"--snapshot-out {str(path)!r} cannot be written ({why_not(exc)})", 1) from None
        typer.echo(
            f"snapshots of the last step written: measured {snapshot_out}, predicted {beside}; draw each "
            "with python -m torch.cuda._memory_viz trace_plot FILE -o out.html",
            err=json,
        )
    timing = _timed(config, request, micro_batch, seq_len, time_steps) if time_steps else None
    if json:
        from zerocalc.cli.render import print_json

        print_json(report if timing is None else {"phases": report, "step_time": timing})
    else:
        from zerocalc.cli.render import Column, print_fitted

        lines = report.lines
        print_fitted(
            "line",
            [line.line for line in lines],
            [
                Column(header="predicted", cells=[f"{line.predicted:,}" for line in lines]),
                Column(header="measured", cells=[f"{line.measured:,}" for line in lines]),
                Column(header="diff", cells=[f"{line.relative:+.2%}" for line in lines]),
                Column(header="", cells=["✓" if line.ok else "✗ OFF" for line in lines], justify="left"),
            ],
            title=f"{name}: FSDP2 world 1, b={micro_batch} s={seq_len}, GPU preset {gpu}",
        )
        typer.echo(
            f"peak phase: predicted {report.predicted_phase.value}, measured {report.measured_phase.value}"
        )
        if timing is not None:
            typer.echo(
                f"step time: predicted {timing.predicted_s:.4f} s, measured {timing.measured_s:.4f} s "
                f"(median of {len(timing.step_seconds)} steps after {timing.warmup_steps} warm-up), "
                f"{timing.relative:+.1%} ({timing.compute_table} compute table)"
            )
    if not report.ok:
        raise typer.Exit(1)


def _timed(config: dict, request: TrainingRequest, micro_batch: int, seq_len: int, steps: int) -> StepTiming:
    """Time ``steps`` real steps of the recipe and predict the same configuration (``comm``'s step)."""
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate
    from zerocalc.request.compute import compute_table
    from zerocalc.validate import cuda_step
    from zerocalc.validate.step_timing import WARMUP_STEPS, step_timing

    assert request.gpu is not None
    table = compute_table(None, request.gpu.name)
    if table is None:
        raise fail(f"--time-steps: the GPU preset {request.gpu.name} has no compute table", 1)
    comm = evaluate_comm(request.model_copy(update={"estimate": Estimate.COMM}), table.table, table.name)
    step = comm.strategies[0].step
    assert step is not None
    seconds = cuda_step.timed_steps(config, micro_batch, seq_len, steps, WARMUP_STEPS)
    return step_timing(seconds, WARMUP_STEPS, step.step_s, table.name)


MAX_FAKE_WORLD = 1_048_576
"""--fake: ranks of the fake process group at most (each rank's shard is computed, none allocated)."""


def _validate_fake(
    model: str | None,
    world: str,
    micro_batch: int,
    seq_len: int,
    recompute: str,
    reshard: str,
    json: bool,
    tps: list[int] | None = None,
    switches: tuple[bool, bool] = (True, True),
) -> None:
    """``--fake``: every (world, tp, recompute, reshard) case of the model, tracked under fake tensors;
    ``switches``: sequence parallel and loss parallel of the dp × tp cases."""
    from zerocalc.harness import procs
    from zerocalc.model.activations import Recompute
    from zerocalc.validate.fake import RECOMPUTES, FakeCase, request_for
    from zerocalc.validate.tp import check_tp_model

    worlds = []
    for text in world.split(","):
        size = text.strip()
        if not size.isdigit() or not 1 <= int(size) <= MAX_FAKE_WORLD:
            raise InputError(
                f"--world {world!r} is not accepted; accepted: a comma list of world sizes from 1 to "
                f"{MAX_FAKE_WORLD:,}"
            )
        worlds.append(int(size))
    recomputes = [
        Recompute(r) for r in _parse_list(recompute, "--recompute", tuple(r.value for r in RECOMPUTES), False)
    ]
    reshards = [r == "yes" for r in _parse_list(reshard, "--reshard", ("yes", "no"), allow_all=False)]
    if micro_batch < 1 or seq_len < 2:
        raise InputError(
            f"--micro-batch {procs.brief(micro_batch)} --seq-len {procs.brief(seq_len)} is not accepted; "
            "accepted: b ≥ 1 and s ≥ 2"
        )
    tps = tps or [1]
    for w in worlds:
        for t in tps:
            if w % t:
                raise InputError(
                    f"--tp {t} does not divide --world {w}; accepted: tensor-parallel sizes dividing every "
                    "world size (dp = world / tp)"
                )
    sp, lp = switches
    for t in tps:
        if t > 1 and sp and seq_len % t:
            raise InputError(
                f"--seq-len {seq_len:,} does not split into --tp {t} sequence-parallel chunks; accepted: "
                f"--seq-len a multiple of {t} (or --no-sequence-parallel)"
            )
    name, config, arch = _fake_model(model, tp=max(tps) > 1)
    cases = [
        FakeCase(
            model=name, world=w, micro_batch=micro_batch, seq_len=seq_len, recompute=r, reshard=rs, tp=t,
            sequence_parallel=sp, loss_parallel=lp,
        )
        for w in dict.fromkeys(worlds)
        for t in tps
        for r in recomputes
        for rs in reshards
    ]  # fmt: skip
    for t in tps:
        if t > 1:
            check_tp_model(arch, t)
    plain = [case for case in cases if case.tp == 1]
    requests = [request_for(arch, case) for case in plain]  # every option checked before the first run
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise fail(NEEDS_TRANSFORMERS.replace("--activations", "--fake"))
    from zerocalc.validate import fake_step

    report = fake_step.run_cases(
        config,
        list(zip(plain, requests, strict=True)),
        tuple((case, arch) for case in cases if case.tp > 1),
    )
    if json:
        from zerocalc.cli.render import print_json

        print_json(report)
    else:
        render_fake(report)
    if not report.all_match:
        raise typer.Exit(1)


def _fake_model(model: str | None, tp: bool = False):
    """The model's name, its config.json dict (what transformers builds) and its architecture: the tiny
    Llama of ``--activations`` without ``--model`` (with ``tp``: untied, 8 key/value heads, which TP up to
    8 ranks splits), else a config.json, a preset or a model TOML file."""
    from pathlib import Path

    from zerocalc.model.hf_config import _load, architecture_from_hf_dict
    from zerocalc.validate.saved import TINY_CONFIGS

    if model is None:
        config = TINY_CONFIGS["llama"]
        name = "tiny llama"
        if tp:
            config = dict(config, tie_word_embeddings=False, num_key_value_heads=8)
            name = "tiny llama (untied, 8 kv heads)"
        return name, config, architecture_from_hf_dict(config, f"the {name}", name)
    from zerocalc.request.presets import load_model, model_file
    from zerocalc.validate.hf_export import hf_config_of

    path = Path(model).expanduser()
    if model.endswith(".json") or (path.is_file() and model_file(model) != ("toml", path)):
        config = _load(path)
        name = path.parent.name or path.stem
        return name, config, architecture_from_hf_dict(config, f"--model {model!r}", name)

    arch, _ = load_model(model)
    return model, hf_config_of(arch, f"--model {model!r}"), arch


def render_fake(report) -> None:
    """Per case: each line's timeline bytes (CUDA extras left out), the tracker's, the difference; the
    CUDA extras named under the table."""
    from rich.markup import escape

    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"FSDP2 steps under fake tensors (torch {report.torch}, transformers {report.transformers}, CPU, "
        "FSDPMemTracker, storages rounded to 512 B) against the step timeline"
    )
    for case in report.cases:
        lines = case.lines
        print_fitted(
            "line",
            [line.line for line in lines],
            [
                Column(header="predicted", cells=[f"{line.predicted:,}" for line in lines]),
                Column(header="tracker", cells=[f"{line.measured:,}" for line in lines]),
                Column(header="diff", cells=[f"{line.measured - line.predicted:+,}" for line in lines]),
                Column(
                    header="", cells=[_fake_mark(line.ok, case.not_claimed) for line in lines], justify="left"
                ),
            ],
            title=f"{case.case.title} ({case.seconds:g} s)",
            key_width=17,
        )
        if case.not_claimed and not case.exact:
            out.print(f"[dim]· not claimed exact: {escape(case.not_claimed)}[/dim]")
        extras = "; ".join(
            f"{extra.name} {extra.count} × {extra.bytes:,} B ({extra.lifetime})" for extra in case.cuda_extras
        )
        out.print(
            f"[dim]· predicted leaves out what only a CUDA step allocates (zerocalc memory adds it: "
            f"+{max(case.cuda_added):,} B at most): {extras}[/dim]"
        )
    for tp_case in report.tp_cases:
        _render_fake_tp(tp_case)
    verdict = "every claimed case is exact" if report.all_match else "[bold red]NOT all exact[/bold red]"
    if report.cases:
        exact = sum(case.exact for case in report.cases)
        claimed = sum(case.not_claimed is None for case in report.cases)
        total = len(report.cases)
        out.print(f"{exact} of {total} cases exact to the byte ({claimed} claimed exact): {verdict}")
    if report.tp_cases:
        exact = sum(case.exact for case in report.tp_cases)
        out.print(
            f"{exact} of {len(report.tp_cases)} dp × tp cases with model states exact to the byte: {verdict}"
        )


def _render_fake_tp(result) -> None:
    """A dp × tp case: the model states against zerocalc/validate/tp.py, then the tracker's phases."""
    from zerocalc.cli.render import Column, console, print_fitted
    from zerocalc.validate.phases import ALLOCATED_LINES

    lines = result.lines
    phases = [(label, getattr(result.phases, field)) for label, field in ALLOCATED_LINES]
    blank = [""] * len(phases)
    tracked = [f"{value:,}" for _, value in phases]
    print_fitted(
        "line",
        [line.line for line in lines] + [label for label, _ in phases],
        [
            Column(header="predicted", cells=[f"{line.predicted:,}" for line in lines] + ["—"] * len(phases)),
            Column(header="tracker", cells=[f"{x.measured:,}" for x in lines] + tracked),
            Column(header="diff", cells=[f"{line.measured - line.predicted:+,}" for line in lines] + blank),
            Column(header="", cells=["✓" if line.ok else "✗ OFF" for line in lines] + blank, justify="left"),
        ],
        title=f"{result.case.title} ({result.seconds:g} s)",
        key_width=17,
    )
    console().print(
        "[dim]· model states on rank 0 (zerocalc/validate/tp.py, storages rounded to 512 B); the phases as "
        "the tracker gives them: the step timeline does not model TP activations[/dim]"
    )


def _fake_mark(ok: bool, not_claimed: str | None) -> str:
    if ok:
        return "✓"
    return "~ not claimed" if not_claimed else "✗ OFF"


def _device_gpu_preset(device_name: str, total_bytes: int) -> str:
    """The GPU preset describing this device (its context and NCCL sizes make the predicted footprint)."""
    from zerocalc.request.presets import load_gpu, preset_names
    from zerocalc.validate.phases import PRESET_MATCH, matching_gpu_preset

    names = preset_names("gpus")
    usable = {n: load_gpu(n).usable_bytes for n in names}
    gpu = matching_gpu_preset(total_bytes, usable)
    if gpu is None:
        raise fail(
            f"--device cuda: no GPU preset has the usable memory of this {device_name} ({total_bytes:,} "
            f"bytes, ±{PRESET_MATCH:.0%}); accepted: a GPU among the presets ({', '.join(names)})"
        )
    return gpu


def config_title(config: ConfigResult) -> str:
    """``fsdp2 · bf16-mixed``, with ``· A=2 last`` under gradient accumulation."""
    return job_title(config.strategy, config.precision, config.grad_accum, config.grad_sync)


def job_title(strategy: str, precision: PrecisionName, grad_accum: int, grad_sync: GradSync) -> str:
    """A configuration's title, before or after it runs (:func:`config_title`)."""
    title = f"{strategy} · {precision.value}"
    if grad_accum > 1:
        title += f" · A={grad_accum} {grad_sync.value}"
    return title


def _progress_line(result: ConfigResult, done: int, total: int) -> str:
    seconds = f" ({result.seconds:g} s)" if result.seconds is not None else ""
    return f"{result.status}{seconds}, {done}/{total} configurations"


def _parse_list(text: str, option: str, accepted: tuple[str, ...], allow_all: bool) -> list[str]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if allow_all and names == ["all"]:
        return list(accepted)
    bad = [n for n in names if n not in accepted]
    if not names or bad:
        shown = ("all, or " if allow_all else "") + ", ".join(accepted)
        raise InputError(f"{option} {text!r} is not accepted; accepted: {shown}")
    return list(dict.fromkeys(names))


def _per_rank(values: list[int]) -> str:
    """One number when every rank agrees, else the range over ranks."""
    low, high = min(values, default=0), max(values, default=0)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _collective_table(config: ConfigResult) -> Table:
    from zerocalc.cli.render import collective_label, compact_table

    table = compact_table(
        ("collective", False, ""),
        ("dtype", False, ""),
        ("group", False, ""),
        ("calls\npred.", True, ""),
        ("calls\nmeas.", True, ""),
        ("bytes/rank\npred.", True, ""),
        ("bytes/rank\nmeas.", True, ""),
        ("", False, ""),
    )
    for c in config.collectives:
        table.add_row(
            collective_label(c.op, c.phase),
            c.dtype,
            f"{c.group.replace('across_nodes', 'across')} {c.group_size}",
            f"{c.predicted_calls:,}",
            _per_rank(c.measured_calls),
            _per_rank(c.predicted_bytes),
            _per_rank(c.measured_bytes),
            "✓" if c.ok else "✗ OFF",
            style=None if c.ok else "bold red",
        )
    return table


def render(report: ValidationReport) -> None:
    from rich.markup import escape
    from rich.table import Table

    from zerocalc.cli.render import COLLECTIVE_LEGEND, console
    from zerocalc.validate.config import WARMUP_STEPS

    out = console()
    out.print(
        f"[bold]{report.model}[/bold]: {report.parameters:,} parameters, {report.world_size} ranks "
        f"({report.backend}), {report.optimizer.value}; bytes per rank after one step, and the collectives "
        f"of that step (after {WARMUP_STEPS} warm-up steps)"
    )
    plan = report.tp_plan
    if plan is not None:
        firsts = range(0, plan.world, plan.tp)
        groups = ", ".join(f"{first}-{first + plan.tp - 1}" for first in firsts)
        out.print(
            f"mesh {plan.title}; TP innermost: TP groups {groups}, DP groups strided by {plan.tp}; "
            "predicted by zerocalc/validate/tp.py"
        )
    for config in report.configs:
        title = config_title(config)
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
        if config.collectives:
            out.print(_collective_table(config))
            for c in config.collectives:
                if not c.ok:
                    out.print(f"[red]  ✗ {c.op} {c.phase} {c.dtype} over {c.group}: {c.explanation}[/red]")
        if config.call_order_ok is True:
            out.print("  every rank issued the predicted calls in the predicted order ✓")
        elif config.call_order_ok is False:
            out.print(f"[red]  ✗ out of order: {escape(config.call_order_note or '')}[/red]")
    out.print(
        f"[dim]· {COLLECTIVE_LEGEND}; calls and bytes sent per rank in the step, pred. predicted by "
        "zerocalc, meas. measured (every rank, or its range)[/dim]"
    )
    out.print(f"peak: {report.peak}")
    counts = {s: sum(1 for c in report.configs if c.status == s) for s in ("match", "mismatch", "failed")}
    verdict = (
        "every model-state line and collective matches exactly"
        if report.all_match
        else "[bold red]NOT all match[/bold red]"
    )
    out.print(
        f"{counts['match']} configuration{'' if counts['match'] == 1 else 's'} match, "
        f"{counts['mismatch']} mismatch, "
        f"{counts['failed']} failed: {verdict}"
    )
