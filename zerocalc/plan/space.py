"""What ``zerocalc plan`` searches: its options, parsed once, and the space of candidate configurations.

A candidate is one exact ``zerocalc memory`` / ``zerocalc comm`` request: a framework, a strategy, a
number of GPUs (whole nodes up to ``--gpus``), a mesh of tensor, context and pipeline parallelism (``--tp``,
``--cp``, ``--pp``, ``--vpp``, ``--ep``: degrees searched), a micro-batch b and gradient accumulation A with
**b · A · d = the global batch exactly** (in sequences; d = N / (t·c·p) data-parallel replicas),
recompute, offload where the framework models it,
the reduce dtype, the prefetch depth where the memory model reads it, and when gradients are reduced.
Candidates that differ only in b (and so A) form a :class:`Group`: one parsed request, one family for the
fitted peak of :mod:`zerocalc.plan.search`.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from itertools import product
from types import SimpleNamespace
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError, shown
from zerocalc.base.units import BINARY_SUFFIXES, parse_count, parse_whole
from zerocalc.compute.table import ComputeTable, no_fp8_problem
from zerocalc.model.activations import Recompute
from zerocalc.model.code import MODEL_CODES, LossImpl, ModelImplName
from zerocalc.network.calibration import Calibration
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.finetune import FineTuning
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.framework_records import FRAMEWORKS, framework_strategies
from zerocalc.parallel.frameworks import Estimate, Framework
from zerocalc.parallel.pipeline import shorter_end_stages
from zerocalc.parallel.precision import FP8_RECIPES, Fp8RecipeName, PrecisionName
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, StrategyName
from zerocalc.request.compute import compute_table
from zerocalc.request.finetune import finetune_offloads, tunes
from zerocalc.request.fp8 import fp8_gpu_problem, fp8_recipe, fp8_strategy_problem, parse_fp8
from zerocalc.request.gpu import DEFAULT_GPU
from zerocalc.request.options import FINETUNE_OPTIONS, Command, given
from zerocalc.request.options_model import options_from_keywords, options_model
from zerocalc.request.presets import gpu_file, load_gpu
from zerocalc.request.savers import parse_loss
from zerocalc.request.training import TrainingRequest, parse_options
from zerocalc.request.values import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_GRAD_ACCUM, MAX_MICRO_BATCH, MAX_SEQ_LEN

DEFAULT_FRAMEWORKS: tuple[Framework, ...] = (Framework.FSDP2, Framework.TORCH_ZERO1, Framework.DEEPSPEED)
"""Searched without ``--framework``: the implementations whose allocations zerocalc models exactly or by
their own estimator, covering every strategy (DDP and ZeRO-1: torch-zero1; ZeRO-2 and offload: DeepSpeed;
SHARD_GRAD_OP, FULL_SHARD and HYBRID_SHARD: FSDP2)."""

MAX_TOP = 1000

SEARCHED_RECOMPUTES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
"""The recomputations ``plan`` tries: ``op`` is torchtitan's policy over torchtitan's model code
(``--model-impl torchtitan``), which ``plan`` does not take."""

MESH_DEGREES = ("tp", "cp", "pp", "vpp", "ep")
"""The mesh dimensions ``plan`` searches, as ``memory`` and ``comm`` name them."""


class Objective(StrEnum):
    TIME = "time"
    """Shortest step time (the global batch is fixed, so also the most tokens per second)."""
    GPUS = "gpus"
    """Fewest GPUs that fit, then the shortest step."""
    MEMORY = "memory"
    """Lowest peak per GPU, then the shortest step."""


PlanOptions = options_model("PlanOptions", (Command.PLAN,))
"""What the user typed for ``zerocalc plan`` (its options, :data:`~zerocalc.request.options.OPTIONS`);
nothing checked yet."""


class PlanRequest(BaseModel):
    """``zerocalc plan``'s options, typed."""

    model_config = ConfigDict(frozen=True)

    model: str
    """As given (a preset name or a config.json path): the reproducing commands repeat it."""
    gpu: str | None
    """As given (a preset name or a GPU file); None: ``gpu_memory`` instead."""
    gpu_memory: str | None = None
    """``--gpu-memory`` as given: the GPU's memory, its other figures :data:`DEFAULT_GPU`'s."""
    max_gpus: int
    gpus_per_node: int
    global_batch_sequences: int
    seq_len: int
    frameworks: tuple[Framework, ...]
    calibration: Calibration | None = None
    calibration_path: str | None = None
    objective: Objective = Objective.TIME
    top: int = 5
    compute: ComputeTable
    """What the step times are priced with (:mod:`zerocalc.compute`)."""
    compute_name: str
    """``--compute-calibration``'s path, else "the <gpu> preset's"."""
    base: TrainingRequest
    """The model and GPU parsed once (at the largest world): the architecture, capacity and peak FLOPs."""
    degrees: dict[str, tuple[int, ...] | None] = {name: (1,) for name in MESH_DEGREES}
    """The degrees searched per mesh dimension (tp, cp, pp, vpp, ep); None: auto (every degree the rules
    allow)."""
    sequence_parallel: tuple[bool, ...] | None = None
    """``--sequence-parallel``: the values searched for each TP > 1 candidate whose model code runs it
    (:func:`runs_sequence_parallel`); None (the default): on where it runs, off elsewhere."""
    fp8: tuple[Fp8RecipeName, ...] | None = (Fp8RecipeName.NONE,)
    """``--fp8``: the recipes searched (none among them: 16-bit GEMMs); None: auto (none and every recipe
    each framework's record runs, :func:`fp8_settings`)."""
    losses: tuple[LossImpl, ...] = (LossImpl.FULL,)
    """``--loss``: the losses searched (auto: every one with fine-tuning, full otherwise); each candidate's
    refused where memory's ``--loss`` would be (:func:`~zerocalc.request.savers.savers_problem`)."""
    optimizer_in_backward: tuple[bool, ...] = (False,)
    """``--optimizer-in-backward``: the values searched (default: off and on with fine-tuning, off
    otherwise); refused where memory's would be (:func:`~zerocalc.request.savers.savers_problem`)."""
    finetune_options: dict[str, str] = {}
    """The fine-tuning options as given (``--lora-rank 16``, ``--quantize nf4``): the one method every
    candidate runs (``base.finetune``), repeated by the reproducing commands."""

    @property
    def method(self) -> str | None:
        """The fine-tuning method searched, as the heading names it; None: full training."""
        return method_label(self.base.finetune)

    @property
    def global_batch_tokens(self) -> int:
        return self.global_batch_sequences * self.seq_len

    @property
    def gpu_label(self) -> str:
        """The GPU as outputs name it: its preset, or ``--gpu-memory`` and whose compute prices it."""
        if self.gpu is not None:
            return self.gpu
        return f"{self.gpu_memory} GPU ({self.base.runtime.name} compute)"

    def gpu_options(self, estimate: Estimate) -> dict[str, str]:
        """The GPU options of a candidate's ``memory`` or ``comm`` command: ``--gpu`` as given, else
        ``--gpu-memory`` for memory and the GPU whose compute and links priced the plan for comm; and
        ``--precision`` where the GPU takes no bf16 (:func:`plan_precision`)."""
        precision = self.base.precision
        out = {} if precision is PLAN_PRECISION else {"precision": precision.value}
        if self.gpu is not None:
            return {"gpu": self.gpu, **out}
        if estimate is Estimate.MEMORY:
            return {"gpu_memory": str(self.gpu_memory), **out}
        return {"gpu": self.base.runtime.name, **out}


PLAN_PRECISION = PrecisionName.BF16_MIXED
"""What ``plan`` trains in: bf16-mixed, or fp16-mixed on a GPU whose tensor cores take no bf16."""


def plan_precision(gpu: str | None) -> PrecisionName:
    """:data:`PLAN_PRECISION`, fp16-mixed on a GPU without bf16 (``bf16 = false`` in its preset: the
    V100), where ``memory`` refuses bf16 (``zerocalc.request.gpu.parse_gpu``)."""
    if gpu is not None and not load_gpu(gpu).bf16:
        return PrecisionName.FP16_MIXED
    return PLAN_PRECISION


def _global_batch(text: int | str | None, seq_len: int) -> int:
    """Sequences per optimizer step from ``4M`` / ``4194304`` (tokens) or ``512seq`` (sequences); k and M
    are 1,024 and 1,048,576, the rule for tokens and sequences (:data:`~zerocalc.base.units.COUNT_RULE`)."""
    accepted = (
        "tokens such as 4M (4,194,304) or 4194304 (a multiple of {seq_len}), or sequences such as 512seq"
    )
    if text is None:
        raise InputError(f"give {{global_batch}}; accepted: {accepted}")
    raw = str(text).strip().lower().replace(" ", "")
    for suffix in ("sequences", "seqs", "seq"):
        if raw.endswith(suffix):
            return parse_count(
                raw.removesuffix(suffix), "{global_batch}", accepted, MAX_GPUS * MAX_MICRO_BATCH,
                BINARY_SUFFIXES,
            )  # fmt: skip
    tokens = parse_count(
        text, "{global_batch}", accepted, MAX_GPUS * MAX_MICRO_BATCH * MAX_SEQ_LEN, BINARY_SUFFIXES
    )
    if tokens % seq_len:
        raise InputError(
            f"{{global_batch}} {shown(text)} ({tokens:,} tokens) is not a whole number of sequences of "
            f"{{seq_len}} {seq_len:,} tokens; accepted: a multiple of {seq_len:,} tokens, "
            "or sequences (512seq)"
        )
    return tokens // seq_len


def _comma_list(text: str | list[str] | tuple[str, ...] | int) -> tuple[str, list[str]]:
    """A list option as typed (``1,2,4``, or the library's list) → (its text, its non-empty items)."""
    if isinstance(text, (list, tuple)):
        text = ",".join(str(t) for t in text)
    return str(text), [p.strip() for p in str(text).split(",") if p.strip()]


def _frameworks(text: str | list[str] | tuple[str, ...] | None) -> tuple[Framework, ...]:
    if text is None:
        return DEFAULT_FRAMEWORKS
    text, items = _comma_list(text)
    parts = [p.lower().replace("_", "-") for p in items]
    accepted = "all, or a comma list of " + ", ".join(f.value for f in Framework)
    if parts == ["all"]:
        return tuple(Framework)
    known = {f.value: f for f in Framework}
    if not parts or any(p not in known for p in parts):
        raise InputError(f"{{frameworks}} {shown(text)} is not accepted; accepted: {accepted}")
    return tuple(dict.fromkeys(known[p] for p in parts))


def _degrees(text: str | list[str] | tuple[str, ...] | int | None, name: str) -> tuple[int, ...] | None:
    """``--tp 1,2,4`` → (1, 2, 4); ``auto`` → None (every degree the rules allow); absent → (1,)."""
    if text is None:
        return (1,)
    text, items = _comma_list(text)
    parts = [p.lower() for p in items]
    if parts == ["auto"]:
        return None
    accepted = "auto, or a comma list of whole numbers such as 1,2,4,8"
    if not parts:
        raise InputError(f"{{{name}}} {shown(text)} is not accepted; accepted: {accepted}")
    return tuple(sorted({parse_whole(p, f"{{{name}}}", 1, MAX_GPUS, accepted) for p in parts}))


SWITCH_VALUES = {"on": True, "off": False}


def _switches(text: str | list[str] | tuple[str, ...] | None, name: str) -> tuple[bool, ...] | None:
    """``--sequence-parallel on,off`` → (True, False), the order given; absent → None (the default)."""
    if text is None:
        return None
    text, items = _comma_list(text)
    parts = [p.lower() for p in items]
    if not parts or any(p not in SWITCH_VALUES for p in parts):
        raise InputError(f"{{{name}}} {shown(text)} is not accepted; accepted: on, off, or on,off")
    return tuple(dict.fromkeys(SWITCH_VALUES[p] for p in parts))


def runs_sequence_parallel(framework: Framework, model_impl: ModelImplName) -> bool:
    """Whether a TP candidate of ``framework`` can shard its norms and dropouts by sequence: its model
    code has sequence parallelism (Megatron-LM's and torchtitan's layers; transformers' tensor-parallel
    plans replicate the norms), the framework's own code where it runs no other."""
    return MODEL_CODES[FRAMEWORKS[framework].model_code or model_impl].sequence_parallel


def method_label(finetune: FineTuning | None) -> str | None:
    """``LoRA r 16 on an nf4 base``, ``DoRA r 8``, ``full fine-tuning, embed_tokens frozen``; None: full
    training."""
    if finetune is None:
        return None
    if finetune.lora is None:
        return f"full fine-tuning, {','.join(finetune.freeze)} frozen"
    label = f"{'DoRA' if finetune.lora.dora else 'LoRA'} r {finetune.lora.rank}"
    if finetune.quant is not None and finetune.quantized:
        label += f" on an {finetune.quant.method.value} base"  # nf4, fp4, int8
    return label


FINETUNE_FRAMEWORKS: tuple[Framework, ...] = tuple(
    f for f, record in FRAMEWORKS.items() if tunes(record) and f is not Framework.PAPER
)
"""Searched for a fine-tuning run without ``--framework``: every framework whose record models one
(:func:`~zerocalc.request.finetune.tunes`: PyTorch's DDP, FSDP1 and FSDP2 with PEFT), the ZeRO paper's
accounting aside (not a framework one runs; ``--framework paper`` takes it)."""


def _option_text(value: object) -> str:
    """An option's value as typed: a switch ``true``/``false``, a list comma-separated."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _tuning_frameworks(
    text: str | list[str] | tuple[str, ...] | None, frameworks: tuple[Framework, ...]
) -> tuple[Framework, ...]:
    """The frameworks of a fine-tuning plan: those that run it (:data:`FINETUNE_FRAMEWORKS` by default,
    ``all``: every one that does); one named that does not is refused."""
    if text is None:
        return FINETUNE_FRAMEWORKS
    tuning = tuple(f for f in frameworks if tunes(FRAMEWORKS[f]))
    if str(text).strip().lower() == "all":
        return tuning
    refused = [f.value for f in frameworks if f not in tuning]
    if refused:
        accepted = ", ".join(f.value for f, record in FRAMEWORKS.items() if tunes(record))
        raise InputError(
            f"{{frameworks}} {','.join(refused)} does not model fine-tuning (its accounting counts every "
            f"parameter trained, or Megatron-LM has no PEFT); accepted: {{frameworks}} {accepted}"
        )
    return frameworks


def _fp8_recipes(text: str | list[str] | tuple[str, ...] | None) -> tuple[Fp8RecipeName, ...] | None:
    """``--fp8 none,tensorwise`` → (NONE, TENSORWISE); ``auto`` → None; absent → (NONE,)."""
    if text is None:
        return (Fp8RecipeName.NONE,)
    text, parts = _comma_list(text)
    if [p.lower() for p in parts] == ["auto"]:
        return None
    if not parts:
        accepted = "auto, or a comma list of " + ", ".join(m.value for m in Fp8RecipeName)
        raise InputError(f"{{fp8}} {shown(text)} is not accepted; accepted: {accepted}")
    return tuple(dict.fromkeys(fp8_recipe(p) for p in parts))


def _losses(text: str | list[str] | tuple[str, ...] | None, tuning: bool) -> tuple[LossImpl, ...]:
    """``--loss full,chunked`` → (FULL, CHUNKED), each by memory's parser (:func:`~zerocalc.request.
    savers.parse_loss`); ``auto`` (absent: with fine-tuning) → full and every saver (``shifted``, older
    transformers' own loss, only where asked); absent otherwise → (FULL,)."""
    searched = tuple(m for m in LossImpl if m is LossImpl.FULL or m.saver)
    if text is None:
        return searched if tuning else (LossImpl.FULL,)
    text, parts = _comma_list(text)
    if [p.lower() for p in parts] == ["auto"]:
        return searched
    accepted = "auto, or a comma list of " + ", ".join(m.value for m in LossImpl)
    try:
        if parts:
            return tuple(dict.fromkeys(parse_loss(p.lower(), None)[0] for p in parts))
    except InputError:
        pass
    raise InputError(f"{{loss}} {shown(text)} is not accepted; accepted: {accepted}")


def parse_plan(options: PlanOptions) -> PlanRequest:
    """Parse and check every option once; one :class:`InputError` line for the first problem."""
    o = options
    if o.model is None:
        raise InputError("give {model}; accepted: a model preset such as llama-3-8b, or a config.json")
    if o.gpu is None and o.gpu_memory is None:
        raise InputError(
            "give {gpu} or {gpu_memory}: the plan needs the GPU's memory and dense peak FLOP/s; accepted: "
            "{gpu} a GPU preset such as h100-80gb (see `zerocalc presets list gpus`) or a GPU TOML file, or "
            f"{{gpu_memory}} such as 24GiB (priced with the {DEFAULT_GPU}'s compute)"
        )
    objective_key = str(o.objective).strip().lower()
    if objective_key not in {m.value for m in Objective}:
        raise InputError(
            f"{{objective}} {shown(o.objective)} is not accepted; accepted: time, gpus or memory"
        )
    top = parse_whole(o.top, "{top}", 1, MAX_TOP, "rows")
    frameworks = _frameworks(o.frameworks)
    degrees = {name: _degrees(getattr(o, name), name) for name in MESH_DEGREES}
    sequence_parallel = _switches(o.sequence_parallel, "sequence_parallel")
    fp8 = _fp8_recipes(o.fp8)
    if sequence_parallel is not None and degrees["tp"] == (1,):
        raise InputError(
            f"{{sequence_parallel}} {shown(o.sequence_parallel)} shards over the tensor-parallel group, and "
            "{tp} searches 1 alone; accepted: {tp} with degrees of 2 or more (or auto), or no "
            "{sequence_parallel}"
        )
    max_gpus = parse_whole(o.gpus, "{gpus}", 1, MAX_GPUS, "GPUs")
    in_backward = _switches(o.optimizer_in_backward, "optimizer_in_backward")
    tuning = {
        name: getattr(o, name) for name in FINETUNE_OPTIONS if given(Command.PLAN, name, getattr(o, name))
    }
    base = parse_options(
        **tuning,
        model=o.model,
        gpu=o.gpu,
        gpu_memory=o.gpu_memory,
        precision=plan_precision(o.gpu).value,
        gpus=max_gpus,
        gpus_per_node=o.gpus_per_node,
        seq_len=o.seq_len,
        calibration=o.calibration,
        compute_calibration=o.compute_calibration,
        framework="paper",
        init=o.init,
        model_impl=o.model_impl,
        flash_attention=o.flash_attention,
        compile=o.compile,
        recompute=Recompute.NONE.value,  # each candidate sets its own (no note of --recompute auto's)
    )
    gpu = base.runtime  # the preset or GPU file given, else DEFAULT_GPU's figures with --gpu-memory
    table = compute_table(base.compute_calibration, None if gpu_file(o.gpu or "") else gpu.name)
    if table is None:
        shipped = f"presets/compute/{gpu.name}.json" if o.gpu is not None and not gpu_file(o.gpu) else ""
        raise InputError(
            f"{{gpu}} {shown(o.gpu)} has no compute table{f' ({shipped})' if shipped else ''}; accepted: "
            "{compute_calibration} a file written by `zerocalc bench --compute` on that GPU"
        )
    if base.model.architecture is None:  # pragma: no cover - a model always has one
        raise InputError("{model} needs an architecture; accepted: a preset or a config.json")
    if fp8 != (Fp8RecipeName.NONE,) and not table.table.prices_fp8:
        raise InputError(no_fp8_problem(f"{{fp8}} {shown(o.fp8)} on {shown(gpu.name)}"))
    if base.finetune is not None and fp8 != (Fp8RecipeName.NONE,):
        raise InputError(
            f"{{fp8}} {shown(o.fp8)} is not modelled with fine-tuning (which weights a frozen or quantised "
            "base converts is not); accepted: {fp8} none with {lora_rank}, {quantize} or {freeze}"
        )
    if base.finetune is not None:
        frameworks = _tuning_frameworks(o.frameworks, frameworks)
        for name in ("tp", "pp", "ep"):  # finetune_problem's rule, before a space of refused meshes
            if degrees[name] != (1,):
                raise InputError(
                    f"{{{name}}} {shown(getattr(o, name))} with fine-tuning: it is modelled over "
                    f"data-parallel ranks; accepted: {{{name}}} 1 with {{lora_rank}}, {{quantize}} or "
                    "{freeze}"
                )
    per_node = (
        8
        if o.gpus_per_node is None
        else parse_whole(o.gpus_per_node, "{gpus_per_node}", 1, MAX_GPUS_PER_NODE, "GPUs")
    )
    seq_len = base.activations.seq_len
    sequences = _global_batch(o.global_batch, seq_len)
    return PlanRequest(
        model=o.model,
        gpu=o.gpu,
        gpu_memory=None if o.gpu_memory is None else str(o.gpu_memory),
        max_gpus=max_gpus,
        gpus_per_node=per_node,
        global_batch_sequences=sequences,
        seq_len=seq_len,
        frameworks=frameworks,
        calibration=base.calibration,
        calibration_path=o.calibration if isinstance(o.calibration, str) else None,
        objective=Objective(objective_key),
        top=top,
        compute=table.table,
        compute_name=table.name,
        base=base,
        degrees=degrees,
        sequence_parallel=sequence_parallel,
        fp8=fp8,
        losses=_losses(o.loss, base.finetune is not None),
        optimizer_in_backward=in_backward or ((False, True) if base.finetune is not None else (False,)),
        finetune_options={name: _option_text(value) for name, value in tuning.items()},
    )


def plan_options(**values: object) -> PlanRequest:
    """:func:`parse_plan` from keywords; a value of the wrong type is an InputError too."""
    return parse_plan(options_from_keywords(PlanOptions, values))


# ------------------------------------------------------------------------------------------------ space
class Group(NamedTuple):
    """Candidates that differ only in the micro-batch b (and so A = B / (N·b))."""

    world: int
    gpus_per_node: int
    """As passed to the request: the node (HYBRID_SHARD: its shard group)."""
    framework: Framework
    strategy: StrategyName
    recompute: Recompute
    offload_optimizer: OffloadTarget
    offload_params: OffloadTarget
    reduce_dtype: DType | None
    prefetch: int | None
    """Only where the memory model reads it (the paper's gathered units); None: the default."""
    grad_sync: GradSync | None
    accumulates: bool
    """A > 1 (the timeline keeps earlier micro-batches' gradients)."""
    micro_batches: tuple[int, ...]
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    end_stage_layers: int | None = None
    """The first and the last stage's layers where the layers do not split into p·v equal chunks
    (:func:`~zerocalc.parallel.pipeline.shorter_end_stages`); None: an even split."""
    sequence_parallel: bool = False
    """Sequence parallelism over the TP group (only with t > 1)."""
    fp8: Fp8Setting = NO_FP8
    """The FP8 recipe and its all-gather (:func:`fp8_settings`)."""
    loss: LossImpl = LossImpl.FULL
    """The cross-entropy (``--loss``; chunked with torchtune's 8 chunks)."""
    optimizer_in_backward: bool = False
    """The optimizer stepped in backward (``--optimizer-in-backward``)."""

    @property
    def model_parallel(self) -> bool:
        return self.tp * self.cp * self.pp * self.ep > 1

    @property
    def replicas(self) -> int:
        """d: data-parallel replicas, N / (t·c·p); b · A · d is the global batch."""
        return self.world // (self.tp * self.cp * self.pp)

    def accumulation(self, global_batch_sequences: int, b: int) -> int:
        """A = B / (d·b)."""
        return global_batch_sequences // (self.replicas * b)

    def mesh_tag(self) -> str:
        """``tp8+sp pp4 v2``: the degrees above 1, sequence parallelism with TP's."""
        names = {"tp": "tp", "cp": "cp", "pp": "pp", "vpp": "v", "ep": "ep"}
        tags = [f"{names[n]}{getattr(self, n)}" for n in MESH_DEGREES if getattr(self, n) > 1]
        if self.sequence_parallel:  # with its TP degree: tp8+sp
            tags[0] += "+sp"
        return " ".join(tags)


class Rejected(NamedTuple):
    reason: str
    count: int


def world_sizes(plan: PlanRequest) -> list[int]:
    """``--gpus`` and every smaller number of whole nodes; within one node, ``--gpus`` alone."""
    g, n = plan.gpus_per_node, plan.max_gpus
    if n <= g:
        return [n]
    sizes = [k * g for k in range(1, n // g + 1)]
    return sizes if n % g == 0 else [*sizes, n]


def micro_batches(per_gpu: int) -> tuple[int, ...]:
    """Every b dividing the sequences per GPU per step, with A = per_gpu / b within the request's bounds."""
    return tuple(
        b
        for b in range(1, min(per_gpu, MAX_MICRO_BATCH) + 1)
        if per_gpu % b == 0 and per_gpu // b <= MAX_GRAD_ACCUM
    )


def _shard_groups(world: int, per_node: int) -> list[int]:
    """HYBRID_SHARD's shard-group sizes: divisors of the node (≥ 2) that divide N, smaller than N."""
    return [k for k in range(2, per_node + 1) if per_node % k == 0 and world % k == 0 and k < world]


def _offloads(
    framework: Framework, name: StrategyName, finetune: bool = False
) -> list[tuple[OffloadTarget, OffloadTarget]]:
    """(optimizer, parameters) offloads the framework's memory model covers (its record; a fine-tuning
    run's under PyTorch's frameworks, :func:`~zerocalc.request.finetune.finetune_offloads`) and the
    strategy allows."""
    none = OffloadTarget.NONE
    record, strategy = FRAMEWORKS[framework], STRATEGIES[name]
    tuned = finetune_offloads(record) if finetune else None
    if tuned is not None:
        return [
            (o, p)
            for o, p in tuned
            if (o is none or o in strategy.optimizer_offload) and (p is none or p in strategy.param_offload)
        ]
    optimizer = [t for t in strategy.optimizer_offload if t in record.offload_optimizer]
    params = [t for t in strategy.param_offload if t in optimizer and t in record.offload_params]
    return list(dict.fromkeys([(none, none), *((t, none) for t in optimizer), *((t, t) for t in params)]))


class MeshDegrees(NamedTuple):
    tp: int
    cp: int
    pp: int
    vpp: int
    ep: int


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _mesh_problem(plan: PlanRequest, world: int, mesh: MeshDegrees) -> str | None:
    """Why a mesh cannot run, by the frameworks' divisibility rules (Megatron-LM
    ``core/transformer/transformer_config.py`` and ``core/parallel_state.py``; torchtitan
    ``ParallelDims``), or None. Each reason is counted once per mesh and number of GPUs."""
    arch = plan.base.model.architecture
    assert arch is not None
    t, c, p, v, e = mesh
    if world % (t * c * p):
        return "mesh: t·c·p does not divide the GPUs (meshes)"
    if v > 1 and p == 1:
        return "mesh: virtual stages need p > 1 (meshes)"
    if plan.gpus_per_node % t:
        return "mesh: a TP group would span nodes (t does not divide the node) (meshes)"
    heads = (arch.num_heads,) if arch.latent_attention is not None else (arch.num_heads, arch.kv_heads)
    if any(h % t for h in heads):
        return "mesh: attention or key/value heads not divisible by t (meshes)"
    if arch.num_layers % (p * v) and shorter_end_stages(arch.num_layers, p, v) is None:
        return "mesh: layers split into p·v chunks neither evenly nor with shorter end stages (meshes)"
    if e > 1 and not arch.num_experts:
        return "mesh: expert parallelism on a dense model (meshes)"
    if e > 1 and (arch.num_experts % e or (world // (t * p)) % e):
        return "mesh: experts or dp·cp not divisible by e (meshes)"
    return None


def _meshes(plan: PlanRequest, world: int) -> tuple[list[MeshDegrees], Counter[str]]:
    """The meshes searched at ``world`` GPUs: every combination of the degrees given (each checked by
    :func:`_mesh_problem`, the failures counted per reason); ``auto`` takes every degree the rules allow
    (t: divisors of the node; c: powers of two; p: divisors of the layers, and those above 2 of L + 2,
    whose end stages are one layer shorter (:func:`~zerocalc.parallel.pipeline.shorter_end_stages`);
    v: divisors of L/p; e: divisors of the experts) and counts nothing it leaves out."""
    arch = plan.base.model.architecture
    assert arch is not None
    given = plan.degrees
    auto = {
        "tp": _divisors(plan.gpus_per_node),
        "cp": tuple(2**k for k in range(world.bit_length()) if world % 2**k == 0),
        "pp": tuple(
            sorted({*_divisors(arch.num_layers), *(p for p in _divisors(arch.num_layers + 2) if p > 2)})
        ),
        "ep": _divisors(arch.num_experts) if arch.num_experts else (1,),
    }
    chosen = {name: given[name] or auto.get(name, ()) for name in ("tp", "cp", "pp", "ep")}
    meshes: list[MeshDegrees] = []
    rejected: Counter[str] = Counter()
    for t in chosen["tp"]:
        for c in chosen["cp"]:
            for p in chosen["pp"]:
                vpps = given["vpp"] or _divisors(arch.num_layers // p if arch.num_layers % p == 0 else 1)
                for v in vpps:
                    for e in chosen["ep"]:
                        mesh = MeshDegrees(t, c, p, v, e)
                        problem = _mesh_problem(plan, world, mesh)
                        if problem is None:
                            meshes.append(mesh)
                        elif _asked(given, mesh):
                            rejected[problem] += 1
    return meshes, rejected


def _asked(given: dict[str, tuple[int, ...] | None], mesh: MeshDegrees) -> bool:
    """Every degree above 1 of the mesh was given, none tried by ``auto``."""
    return all(given[name] is not None for name, d in zip(MESH_DEGREES, mesh, strict=True) if d > 1)


def enumerate_groups(plan: PlanRequest, flash: bool) -> tuple[list[Group], list[Rejected]]:
    """Every group of the space, and what was left out before evaluation (counted in candidates, meshes
    in meshes)."""
    groups: list[Group] = []
    rejected: list[Rejected] = []
    for world in world_sizes(plan):
        meshes, refused = _meshes(plan, world)
        rejected += [Rejected(reason, count) for reason, count in refused.items()]
        for mesh in meshes:
            _mesh_groups(plan, flash, world, mesh, groups, rejected)
    if not groups:
        raise _nothing_to_search(plan, rejected)
    return groups, rejected


def _nothing_to_search(plan: PlanRequest, rejected: list[Rejected]) -> InputError:
    """The options leave no candidate at all (a degree that divides no number of GPUs searched, a global
    batch no number of replicas divides): a problem of the input, named in one line, not an empty plan."""
    reasons = "; ".join(
        dict.fromkeys(r.reason.removeprefix("mesh: ").removesuffix(" (meshes)") for r in rejected)
    )
    asked = [
        f"{{{name}}} {','.join(map(str, degrees))}"
        for name, degrees in plan.degrees.items()
        if degrees is not None and degrees != (1,)
    ]
    batch = f"{{global_batch}} {plan.global_batch_sequences:,} sequences"
    worlds = ", ".join(map(str, world_sizes(plan)))
    return InputError(
        f"{' '.join(asked) or batch} leave{'' if len(asked) > 1 else 's'} nothing to search on {worlds} GPUs "
        f"({plan.gpus_per_node} a node): {reasons or 'no candidate'}; accepted: degrees dividing the GPUs, "
        "the node and the heads (or auto), and a global batch the data-parallel replicas divide"
    )


def _mesh_groups(
    plan: PlanRequest,
    flash: bool,
    world: int,
    mesh: MeshDegrees,
    groups: list[Group],
    rejected: list[Rejected],
) -> None:
    """The groups of one number of GPUs and one mesh."""
    arch = plan.base.model.architecture
    assert arch is not None
    ends = shorter_end_stages(arch.num_layers, mesh.pp, mesh.vpp)
    replicas = world // (mesh.tp * mesh.cp * mesh.pp)
    if plan.global_batch_sequences % replicas:
        rejected.append(Rejected("GPU counts not dividing the global batch (b·A·d must equal it)", 1))
        return
    bs = micro_batches(plan.global_batch_sequences // replicas)
    if not bs:  # pragma: no cover - b = per-GPU batch always qualifies within bounds
        return
    if mesh.vpp > 1:  # the interleaved schedule runs micro-batches in groups of p (request/training.py)
        kept = tuple(b for b in bs if (plan.global_batch_sequences // (replicas * b)) % mesh.pp == 0)
        if len(kept) < len(bs):
            reason = "interleaved 1F1B: A not a multiple of p (micro-batches run in groups of p)"
            rejected.append(Rejected(reason, len(bs) - len(kept)))
        bs = kept
    if not bs:
        return
    single = tuple(b for b in bs if plan.global_batch_sequences // (replicas * b) == 1)
    multi = tuple(b for b in bs if plan.global_batch_sequences // (replicas * b) > 1)
    for framework in plan.frameworks:
        names = framework_strategies(framework)
        sps = _sequence_parallels(plan, framework, mesh.tp)
        # fp32 reductions where the default is not already fp32 (Megatron-LM's main gradients are), and
        # where gradients are reduced at all: over d·c > 1 ranks (one rank of each has nothing to reduce)
        record = FRAMEWORKS[framework]
        default = record.dtypes(plan.base.precision).reduce
        reduces = world // (mesh.tp * mesh.pp) > 1
        reduce_dtypes: list[DType | None] = [None] + (
            [DType.FP32] if default is not DType.FP32 and reduces else []
        )
        for name in names:
            setup = record.setup(name)
            nodes = (
                _shard_groups(world, plan.gpus_per_node)
                if name is StrategyName.HYBRID_SHARD and mesh == (1, 1, 1, 1, 1)
                else [plan.gpus_per_node]
            )
            if name is StrategyName.HYBRID_SHARD and not nodes:
                rejected.append(Rejected("hybrid_shard: no shard group smaller than N divides it", len(bs)))
            prefetches: list[int | None] = [0, 1] if record.reads_prefetch(name) else [None]
            fp8s = fp8_settings(plan, framework, name)
            for per_node in nodes:
                for recompute in SEARCHED_RECOMPUTES:
                    if recompute is Recompute.SELECTIVE and flash:
                        rejected.append(
                            Rejected(
                                "recompute selective = none here (flash attention keeps no s² tensors)",
                                len(bs) * len(prefetches),
                            )
                        )
                        continue
                    for opt_off, par_off in _offloads(framework, name, plan.base.finetune is not None):
                        for reduce in reduce_dtypes:
                            for prefetch in prefetches:
                                for accumulates, chosen in ((False, single), (True, multi)):
                                    if not chosen:
                                        continue
                                    syncs: list[GradSync | None] = (
                                        [None, GradSync.LAST]
                                        if accumulates and setup.grad_sync is None
                                        else [None]
                                    )
                                    if not sps:
                                        left_out = len(chosen) * len(syncs)
                                        rejected.append(Rejected(NO_SEQUENCE_PARALLEL, left_out))
                                    for sync, sp, fp8 in product(syncs, sps, fp8s):
                                        if isinstance(fp8, str):  # a recipe asked it does not run
                                            rejected.append(Rejected(fp8, len(chosen)))
                                            continue
                                        groups.append(
                                            Group(
                                                world,
                                                per_node,
                                                framework,
                                                name,
                                                recompute,
                                                opt_off,
                                                par_off,
                                                reduce,
                                                prefetch,
                                                sync,
                                                accumulates,
                                                chosen,
                                                *mesh,
                                                ends,
                                                sp,
                                                fp8,
                                                *plain_savers(plan),
                                            )
                                        )


def plain_savers(plan: PlanRequest) -> tuple[LossImpl, bool]:
    """The memory savers every group is enumerated with: the full loss and the optimizer stepped after
    backward where asked (else the first asked)."""
    loss = LossImpl.FULL if LossImpl.FULL in plan.losses else plan.losses[0]
    return loss, False if False in plan.optimizer_in_backward else plan.optimizer_in_backward[0]


def saver_twins(plan: PlanRequest, group: Group, micro_batches: tuple[int, ...]) -> list[Group]:
    """The group at ``micro_batches`` with each other memory saver asked (``--loss``,
    ``--optimizer-in-backward``). The savers change the peak alone (no step time reads them), so the
    search tries them only where they can change the plan: for a candidate whose plain savers' peak does
    not fit, or for the memory objective (:func:`~zerocalc.plan.search.search`). The parser refuses what
    a twin cannot run (:func:`~zerocalc.request.savers.savers_problem`, memory's own check)."""
    plain = plain_savers(plan)
    return [
        group._replace(loss=loss, optimizer_in_backward=v, micro_batches=micro_batches)
        for loss in plan.losses
        for v in plan.optimizer_in_backward
        if (loss, v) != plain
    ]


NO_SEQUENCE_PARALLEL = (
    "sequence parallel on: its model code has none (transformers' TP plans replicate the norms)"
)


def _sequence_parallels(plan: PlanRequest, framework: Framework, tp: int) -> tuple[bool, ...]:
    """The sequence parallelism searched for a mesh of ``tp`` under ``framework``: off without TP; with
    TP, by default on where the model code runs it (:func:`runs_sequence_parallel`), else off; given
    (``--sequence-parallel``), the values asked that it runs (none: the candidates are left out)."""
    if tp == 1:
        return (False,)
    runs = runs_sequence_parallel(framework, plan.base.model_impl)
    if plan.sequence_parallel is None:
        return (runs,)
    return tuple(v for v in plan.sequence_parallel if runs or not v)


def fp8_settings(plan: PlanRequest, framework: Framework, name: StrategyName) -> list[Fp8Setting | str]:
    """The FP8 settings searched for ``framework``'s strategy ``name``: each recipe asked (``auto``: none
    and every recipe its record runs, :class:`~zerocalc.parallel.framework_records.record.Fp8Support`),
    with its FP8 all-gather off, and on where the recipe and the framework have one and the strategy can
    gather FP8 parameters (:func:`~zerocalc.request.fp8.fp8_strategy_problem`: Megatron-LM's fp8 parameter
    gather needs the distributed optimizer). Each setting is the parser's for ``--fp8 RECIPE
    [--fp8-all-gather]`` (:func:`~zerocalc.request.fp8.parse_fp8`: the framework's skipped modules, its
    FP8 weights kept where its gather keeps them); for a recipe asked that the framework does not run,
    or that the GPU's tensor cores do not (:func:`~zerocalc.request.fp8.fp8_gpu_problem`), the reason
    (its candidates left out, counted; ``auto`` searches only what runs)."""
    support = FRAMEWORKS[framework].fp8
    asked = plan.fp8 if plan.fp8 is not None else (Fp8RecipeName.NONE, *(support.recipes if support else ()))
    settings: list[Fp8Setting | str] = []
    for recipe in asked:
        gathers = recipe in FP8_RECIPES and FP8_RECIPES[recipe].all_gather
        for all_gather in (False, True) if gathers else (False,):
            options = SimpleNamespace(
                fp8=recipe.value, fp8_all_gather=all_gather, fp8_precompute_scales=False,
                fp8_model_init=False, fp8_skip=None,
            )  # fmt: skip
            try:
                setting = parse_fp8(options, framework, plan.base.model_impl)
            except InputError as exc:
                if not all_gather and plan.fp8 is not None:  # auto counts nothing it leaves out
                    settings.append(str(exc).split("; accepted")[0])
                continue
            if all_gather and fp8_strategy_problem(framework, setting, (name,)) is not None:
                continue
            if (problem := fp8_gpu_problem(setting, plan.base.gpu)) is not None:
                if not all_gather and plan.fp8 is not None:
                    settings.append(problem.split("; accepted")[0])
                continue
            settings.append(setting)
    return settings
