"""Every option of the measuring commands, ``bench`` and the ``validate`` subcommands, defined once.

The sibling of :data:`zerocalc.request.options.OPTIONS` (the options of ``memory``, ``comm`` and ``plan``),
with the same :class:`~zerocalc.request.options.Option` record: its flags, default, help and what it
accepts are written here, and ``zerocalc.cli.options.takes_measure`` derives each command's Typer
parameters from them, so a command takes exactly the options whose records name it. An option these
commands share with ``memory`` (``--model``, ``--json``; ``bench --compute``'s ``--micro-batch``,
``--seq-len`` and ``--tp``, which it parses as ``comm`` does; ``validate frameworks``' ``--grad-accum``;
``validate pipeline``'s ``--pp-first-stage-layers`` and ``--pp-last-stage-layers``) is memory's record,
taken as it is, with the commands here that also take it. Values reach the commands as typed (text); the
commands parse them (``zerocalc.cli.options.whole_number``, ...), naming what is accepted.

A name means one flag wherever it is taken, here and in ``OPTIONS`` (``--strategies``, which names validate's
configurations, is ``configurations``: memory's ``strategies`` is ``--strategy``).

A command may have one variant chosen by a flag (:data:`VARIANTS`): ``bench --compute`` measures compute
instead of collectives, ``validate pipeline --fake`` runs the stages under fake tensors instead of
processes. Each record names the variants that read it; an option given to a variant that does not read
it is refused in one line.

No torch and no pydantic model is imported here: ``--help`` and bad input stay fast.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from zerocalc.bench.defaults import DEFAULT_COLLECTIVES_TEXT, DEFAULT_ITERS, DEFAULT_TIMEOUT_S, DEFAULT_WARMUP
from zerocalc.request.options import FINETUNE_OPTIONS, LORA_FIELDS, Command, Kind, Option, option


class Measure(StrEnum):
    """A measuring command, or a variant of one (``bench --compute``, ``validate pipeline --fake``)."""

    BENCH = "bench"
    BENCH_COMPUTE = "bench --compute"
    FRAMEWORKS = "validate frameworks"
    TP = "validate tp"
    ACTIVATIONS = "validate activations"
    CUDA = "validate cuda"
    FAKE = "validate fake"
    PIPELINE = "validate pipeline"
    FAKE_PIPELINE = "validate pipeline --fake"
    EXPERT = "validate expert"


BENCH, COMPUTE = Measure.BENCH, Measure.BENCH_COMPUTE
FRAMEWORKS, TP, ACTIVATIONS, CUDA = Measure.FRAMEWORKS, Measure.TP, Measure.ACTIVATIONS, Measure.CUDA
FAKE, PIPELINE, FAKE_PIPELINE, EXPERT = Measure.FAKE, Measure.PIPELINE, Measure.FAKE_PIPELINE, Measure.EXPERT
VALIDATE = frozenset(m for m in Measure if m.value.startswith("validate"))

VARIANTS: dict[Measure, tuple[str, Measure]] = {
    BENCH: ("compute", COMPUTE),
    PIPELINE: ("fake", FAKE_PIPELINE),
}
"""A command → (the flag option choosing its variant, the variant)."""

FRAMEWORK_STRATEGIES = (
    "ddp, zero1, fsdp1-no-shard, fsdp1-shard-grad-op, fsdp1-full-shard, fsdp1-hybrid-shard, "
    "fsdp2-no-reshard, fsdp2, fsdp2-hsdp"
)
"""For --help without importing the records: validate.config.STRATEGIES (a test checks they agree)."""
TP_STRATEGIES = "fsdp2-no-reshard, fsdp2"
"""validate.tp.TP_STRATEGIES in validate.config.STRATEGIES' order, likewise."""
PIPELINE_STRATEGIES = "none, ddp, fsdp2"
"""validate.pipeline.PIPELINE_STRATEGIES, likewise."""


def _opt(name: str, flags: tuple[str, ...], help: str, commands: set[Measure], **fields: Any) -> Option:
    return Option(name=name, flags=flags, help=help, commands=frozenset(commands), **fields)  # type: ignore[arg-type]


def _memory(name: str, *commands: Measure) -> Option:
    """memory's record of ``name`` as it is, taken by ``commands`` too."""
    return option(Command.MEMORY, name)._replace(commands=frozenset(commands))  # type: ignore[arg-type]


REAL_RUNS = {FRAMEWORKS, TP, PIPELINE, EXPERT}
"""The subcommands that spawn their ranks (or join torchrun's)."""
BUILT_MODEL = {FRAMEWORKS, TP, PIPELINE, FAKE_PIPELINE}
"""The subcommands that build validate's own model (zerocalc/validate/model.py) from a preset, shrunk."""
SHAPED = {ACTIVATIONS, CUDA, FAKE, FAKE_PIPELINE, EXPERT}
"""The subcommands whose micro-batch shape b × s is an option."""

MEASURE_OPTIONS: tuple[Option, ...] = (
    # ---------------------------------------------------------------------------------- the model
    _memory("model", FRAMEWORKS, TP, FAKE, PIPELINE, FAKE_PIPELINE),
    _opt("model", ("--model", "-m"),
         "A Hugging Face config.json of a family the hf profile reads (its modules are built from it).",
         {ACTIVATIONS, CUDA}),
    _opt("layers", ("--layers",), "Override the number of transformer blocks.", BUILT_MODEL, metavar="N"),
    _opt("hidden", ("--hidden",), "Override the hidden size d.", BUILT_MODEL, metavar="N"),
    _opt("heads", ("--heads",), "Override the attention heads.", BUILT_MODEL, metavar="N"),
    _opt("kv_heads", ("--kv-heads",), "Override the key/value heads (GQA).", BUILT_MODEL, metavar="N"),
    _opt("ffn", ("--ffn",), "Override the MLP width f.", BUILT_MODEL, metavar="N"),
    _opt("vocab", ("--vocab",), "Override the vocabulary size V.", BUILT_MODEL, metavar="N"),
    _opt("family", ("--family",), "Comma list of families (tiny configs), or all.", {ACTIVATIONS},
         default="all"),
    # ---------------------------------------------------------------------------------- the job
    _opt("configurations", ("--strategies",), f"Comma list of {FRAMEWORK_STRATEGIES}, or all.", {FRAMEWORKS},
         default="all"),
    _opt("configurations", ("--strategies",),
         f"Comma list of {TP_STRATEGIES} (FSDP2 over the dp ranks), or all.", {TP}, default="all"),
    _opt("configurations", ("--strategies",),
         f"Comma list of {PIPELINE_STRATEGIES} (what a stage's data-parallel ranks run), or all.", {PIPELINE},
         default="all"),
    _opt("precision", ("--precision",), "Comma list of fp32, bf16-mixed.",
         {FRAMEWORKS, TP, PIPELINE, FAKE_PIPELINE, ACTIVATIONS}, default="fp32,bf16-mixed"),
    _opt("optimizer", ("--optimizer",), "adam or adamw.", BUILT_MODEL, default="adam"),
    _memory("grad_accum", FRAMEWORKS),
    _opt("grad_accum", ("--grad-accum", "-A"), "m: micro-batches per step, through Schedule1F1B (2 or more).",
         {PIPELINE, FAKE_PIPELINE}, metavar="M", default_help="2 × --pp"),
    _opt("grad_sync", ("--grad-sync",),
         "Comma list of every, last: gradients reduced every micro-batch, or only on the last (no_sync() or "
         "FSDP2 gradient sync off before).", {FRAMEWORKS}, default="every"),
    _opt("attention", ("--attention",), "Comma list of sdpa, eager (fine-tuning: sdpa).", {ACTIVATIONS},
         default="sdpa,eager"),
    # the fine-tuning measured (memory's records: PEFT LoRA/DoRA, a bitsandbytes 4-bit base, --freeze;
    # validate frameworks: LoRA and DoRA, its adapter_config.json)
    *(_memory(name, ACTIVATIONS, *([FRAMEWORKS] if name in (*LORA_FIELDS, "adapter_config") else []))
      for name in FINETUNE_OPTIONS),
    _opt("recompute", ("--recompute",), "Comma list of none, full (activation checkpointing).", {FAKE},
         default="none"),
    _opt("compile", ("--compile",),
         "none, or torch.compile's parts (model, loss, model,loss): real Inductor on the CPU, the compiled "
         "step's saved tensors against the profile (torchtitan's Llama blocks compiled one by one, hf's "
         "whole forward), on the dense Llama-family tiny configs.", {ACTIVATIONS}, default="none"),
    _opt("model_impl", ("--model-impl",),
         "With --compile: comma list of torchtitan, hf (the model code compiled).", {ACTIVATIONS},
         default="torchtitan,hf"),
    _opt("recompute", ("--recompute",),
         "With --compile: comma list of none, full, op (torchtitan's op-level policy; hf: none).",
         {ACTIVATIONS}, default="none"),
    _opt("fp8", ("--fp8",),
         "With --compile: none, or tensorwise (torchao's Float8Linear on every block linear of torchtitan's "
         "model).", {ACTIVATIONS}, default="none"),
    _opt("reshard", ("--reshard",), "Comma list of yes, no (FSDP2 reshard_after_forward).",
         {FAKE, FAKE_PIPELINE}, default="yes"),
    _opt("fp8", ("--fp8",),
         "none, or torchao's tensorwise, rowwise or rowwise-gw-hp: convert_to_float8_training on every "
         "nn.Linear but the LM head (and dimensions not divisible by 16).", {FAKE}, default="none"),
    _opt("fp8_all_gather", ("--fp8-all-gather",),
         "With --fp8 tensorwise: FSDP2 all-gathers the fp8 weights (torchao's float8 all-gather).",
         {FAKE}, default=False, kind=Kind.FLAG),
    # ---------------------------------------------------------------------------------- the parallelism
    _opt("tp", ("--tp",),
         "t: tensor-parallel ranks, torchtitan's TP plan on a dp × tp mesh (TP innermost, dp = ranks / t), "
         "then FSDP2 over dp; 2 or more.", {TP}, default=2, metavar="T"),
    _opt("tp", ("--tp",),
         "Comma list of tensor-parallel degrees t, a case each per --world: torchtitan's TP plan on a "
         "dp × tp mesh, then FSDP2 over dp (1: FSDP2 alone).", {FAKE}, default="1"),
    _opt("sequence_parallel", ("--sequence-parallel",),
         "With t ≥ 2: SequenceParallel norms, activations sharded on the sequence between blocks.",
         {TP, FAKE}, default=True, kind=Kind.SWITCH, negative="--no-sequence-parallel"),
    _opt("loss_parallel", ("--loss-parallel",),
         "With t ≥ 2: the logits stay sharded over the vocabulary into the cross entropy (loss_parallel).",
         {TP, FAKE}, default=True, kind=Kind.SWITCH, negative="--no-loss-parallel"),
    _opt("lora_rank", ("--lora-rank",),
         "PEFT LoRA of rank R on the model's default targets (its base frozen in bf16, adapters fp32); "
         "0: full training.", {FAKE}, default=0, metavar="R"),
    _memory("keep_output", FAKE),
    _opt("pp", ("--pp",),
         "p: pipeline stages of torch.distributed.pipelining's Schedule1F1B (pp × dp ranks, pipeline "
         "outermost); 2 or more.", {PIPELINE, FAKE_PIPELINE}, default=2, metavar="P"),
    _memory("pp_first_stage_layers", PIPELINE),
    _memory("pp_last_stage_layers", PIPELINE),
    _opt("fake", ("--fake",),
         "Run FSDP2 stages under fake tensors at each --world instead (CPU, FSDPMemTracker).",
         {PIPELINE, FAKE_PIPELINE}, default=False, kind=Kind.FLAG),
    _opt("ep", ("--ep",),
         "e: expert-parallel ranks of a tiny MoE layer with a fixed router, dividing --nproc.", {EXPERT},
         default=2, metavar="E"),
    _opt("routing", ("--routing",), "Comma list of balanced, skewed, or all.", {EXPERT}, default="all"),
    # ---------------------------------------------------------------------------------- the shape
    _opt("micro_batch", ("--micro-batch", "-b"), "b: sequences per micro-batch.", SHAPED, default=2,
         metavar="B"),
    _opt("seq_len", ("--seq-len", "-s"), "s: tokens per sequence.", SHAPED, default=64, metavar="S"),
    # ------------------------------------------------------------------------------- bench's sweep (no
    # option name may be a prefix of one of torchrun's: torchrun prefix-matches its own options)
    _opt("collectives", ("--collectives",),
         "Comma list of all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, or all.", {BENCH},
         default=DEFAULT_COLLECTIVES_TEXT),
    _opt("min_bytes", ("--min-bytes",), "Smallest S (bytes of the whole array), ≥ 1.", {BENCH},
         default="1KiB", metavar="BYTES"),
    _opt("max_bytes", ("--max-bytes",), "Largest S, ≤ 1TiB.", {BENCH},
         default_help="1GiB on GPU, 64MiB on CPU", metavar="BYTES"),
    _opt("step_factor", ("--step-factor",), "Multiply S by this from one size to the next (2 to 1024).",
         {BENCH}, default=2, metavar="F"),
    _opt("dtype", ("--dtype",), "bf16, fp16 or fp32.", {BENCH, COMPUTE}, default="bf16"),
    _opt("warmup", ("--warmup",), "Untimed iterations per size (0 to 1,000,000).", {BENCH, COMPUTE},
         default=DEFAULT_WARMUP, metavar="N"),
    _opt("iters", ("--iters",), "Timed iterations per size (1 to 1,000,000).", {BENCH, COMPUTE},
         default=DEFAULT_ITERS, metavar="N"),
    _opt("check", ("--check",), "Verify each collective's result once per size.", {BENCH}, default=False,
         kind=Kind.FLAG),
    # ---------------------------------------------------------------------------------- the world
    _opt("world", ("--world",),
         "Comma list of world sizes, ranks of the fake process group (a pipeline's: multiples of --pp).",
         {FAKE, FAKE_PIPELINE}, default="8", metavar="N,N,..."),
    _opt("nproc", ("--nproc",),
         "Processes to spawn on this node (not under torchrun/srun): 2 to one per GPU, or 4 per CPU core.",
         REAL_RUNS | {BENCH}, metavar="N", default_help="validate: 2; bench: one per visible GPU, else 2"),
    _opt("gpus_per_node", ("--gpus-per-node", "-g"),
         "Ranks per node: the shard group of fsdp1-hybrid-shard and fsdp2-hsdp, which need 2 nodes or more.",
         {FRAMEWORKS}, metavar="G", default_help="the launch's; spawned: --nproc"),
    _opt("backend", ("--backend",), "nccl or gloo.", {BENCH}, default_help="nccl with GPUs, else gloo",
         metavar="NAME"),
    _opt("timeout", ("--timeout",), "Seconds allowed per configuration; ≤ 1 day.", REAL_RUNS, default=120,
         metavar="SECONDS"),
    _opt("timeout", ("--timeout",), "Seconds before a hung or failed run is stopped (all ranks); ≤ 1 day.",
         {BENCH}, default=DEFAULT_TIMEOUT_S, metavar="SECONDS"),
    # ---------------------------------------------------------------------------------- bench --compute
    _opt("compute", ("--compute",),
         "Measure compute instead (no collectives): GEMMs (bf16, and fp8 where the GPU has it), SDPA forward "
         "and backward and an element-wise kernel on this process's device, for `comm` and `plan` "
         "(--compute-calibration); --model, --micro-batch, --seq-len and --tp add that model's shapes.",
         {BENCH, COMPUTE}, default=False, kind=Kind.FLAG),
    _memory("model", COMPUTE),
    _memory("micro_batch", COMPUTE),
    _memory("seq_len", COMPUTE),
    _memory("tp", COMPUTE),
    # ---------------------------------------------------------------------------------- the output
    _opt("snapshot_out", ("--snapshot-out",),
         "Write the measured step's PyTorch memory snapshot to this file, and the predicted one beside it "
         "(NAME.predicted.pickle for NAME.pickle).", {CUDA}, metavar="FILE"),
    _opt("time_steps", ("--time-steps",),
         "Then time this many whole steps (after 3 warm-up steps) and print their median against the step "
         "time `zerocalc comm` predicts (1 to 1,000).", {CUDA}, metavar="N"),
    _opt("out", ("--out",),
         "The file to write (atomically, by rank 0): the calibration, or the compute table.",
         {BENCH, COMPUTE}, metavar="FILE",
         default_help="in $XDG_CACHE_HOME/zerocalc (~/.cache/zerocalc), a calibration-*.json or "
         "compute-*.json named after the backend, world, device and time"),
    _memory("json", *Measure),
)  # fmt: skip
"""Every option of bench and the validate subcommands, in the order their help lists them."""


def measure_options_for(command: Measure) -> tuple[Option, ...]:
    """The options ``command`` (or its variant) takes, in :data:`MEASURE_OPTIONS`' order."""
    return tuple(o for o in MEASURE_OPTIONS if command in o.commands)


def declared_options(command: Measure) -> tuple[Option, ...]:
    """The parameters of the command ``command``: its options and its variant's, each name once (the
    variant's record of a name both take is the same record)."""
    taken = [command, *([VARIANTS[command][1]] if command in VARIANTS else [])]
    found: dict[str, Option] = {}
    for o in MEASURE_OPTIONS:
        if any(c in o.commands for c in taken):
            found.setdefault(o.name, o)
    return tuple(found.values())
