"""A user's own launch configuration read into the options the flags give.

Three formats, each mapped key by key onto :data:`zerocalc.request.options.OPTIONS` (the flags a user types
override what a file says):

* a DeepSpeed config (``ds_config.json``; keys as in ``deepspeed/runtime/config.py`` and
  ``deepspeed/runtime/zero/config.py``, DeepSpeed 0.16);
* a torchtitan job TOML (``torchtitan/config/job_config.py``, v0.2.2: ``[parallelism]``, ``[training]``,
  ``[activation_checkpoint]``, ``[model]``, ``[optimizer]``; and the older layout of ``config_manager.py`` at
  commit 9dec370, whose degrees are under ``[training]`` and ``[experimental]``);
* an accelerate config (``accelerate config``'s YAML, ``accelerate/commands/config/config_args.py``, with its
  ``fsdp_config`` or ``deepspeed_config`` table).

:func:`read_launch_config` is pure (text in, :class:`LaunchConfig` out); reading the file is the caller's.
Every key is sorted by its format's table in :mod:`zerocalc.request.launch_keys`: modelled (read here),
harmless (listed in :attr:`LaunchConfig.harmless`) or refused; a setting zerocalc cannot honour (a schedule
or a layer split it does not model, a value it does not know, a key no table names) is an
:class:`~zerocalc.base.errors.InputError` naming the key, never dropped.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Any

from zerocalc.base.errors import InputError, literal
from zerocalc.request.launch_keys import (
    ACCELERATE_KEYS,
    DEEPSPEED_KEYS,
    FP8,
    TORCHTITAN_KEYS,
    Sort,
    rule_of,
    shown_value,
    sort_keys,
)

HARMLESS_NOTE = "harmless (no bearing on memory, communication or step time)"
"""How a note lists a file's harmless keys."""


class LaunchFormat(StrEnum):
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    ACCELERATE = "accelerate"


@dataclass(frozen=True)
class LaunchConfig:
    """What a launch configuration says, as option values (keyword → value as the library takes it)."""

    values: dict[str, Any]
    notes: tuple[str, ...] = ()
    harmless: tuple[str, ...] = field(default=())
    """Keys of the file with no bearing on memory, communication or step time (dotted paths,
    :mod:`zerocalc.request.launch_keys`)."""
    stages: TitanStages | None = None
    """How the file splits the model's layers over pipeline stages, which gives ``vpp`` and the first and
    last stage's layers once the model's layer count is known (:meth:`TitanStages.options`)."""

    def note_lines(self, source: str) -> list[str]:
        lines = [f"{source}: {note}" for note in self.notes]
        if self.harmless:
            lines.append(f"{source}: {HARMLESS_NOTE}: {', '.join(self.harmless)}")
        return lines


def read_launch_config(kind: LaunchFormat, text: str, where: str) -> LaunchConfig:
    """The options ``text`` (a file of format ``kind``, named ``where`` in messages) sets."""
    if kind is LaunchFormat.DEEPSPEED:
        return _deepspeed(_json(text, where), where)
    if kind is LaunchFormat.TORCHTITAN:
        return _torchtitan(_toml(text, where), where)
    return _accelerate(_yaml(text, where), where)


# ---------------------------------------------------------------------------------------------- parsing
def _json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where} is not JSON ({exc.msg}, line {exc.lineno}); accepted: a ds_config.json"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{where} is not a JSON object; accepted: a ds_config.json")
    return data


def _toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where} is not TOML ({exc}); accepted: a torchtitan job TOML") from None


def _scalar(text: str) -> Any:
    raw = text.strip()
    if raw in ("", "null", "~"):
        return None
    if raw in ("true", "True"):
        return True
    if raw in ("false", "False"):
        return False
    if raw[:1] in "'\"" and raw[-1:] == raw[:1]:
        return raw[1:-1]
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw


def _yaml(text: str, where: str) -> dict[str, Any]:
    """accelerate's config YAML: mappings of scalars nested by indentation (what ``accelerate config``
    writes), and the empty ``[]`` and ``{}`` it writes for unset lists. Other lists and flow collections are
    refused in one line rather than misread."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for number, line in enumerate(text.splitlines(), 1):
        content = line.split(" #", 1)[0].rstrip()
        if not content.strip() or content.lstrip().startswith("#") or content.strip() == "---":
            continue
        indent = len(content) - len(content.lstrip())
        key, sep, value = content.strip().partition(":")
        if value.strip() in ("[]", "{}"):  # an empty list or table, as `accelerate config` writes tpu_env
            while indent <= stack[-1][0]:
                stack.pop()
            stack[-1][1][key.strip()] = [] if value.strip() == "[]" else {}
            continue
        if not sep or content.strip().startswith("- ") or value.strip()[:1] in ("[", "{", "|", ">"):
            raise InputError(
                f"{where} line {number} {content.strip()!r} is not a 'key: value' line; accepted: an "
                "accelerate config as `accelerate config` writes it"
            )
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key.strip()] = _scalar(value)
        else:
            child: dict[str, Any] = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return root


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _refuse(where: str, key: str, value: Any, accepted: str) -> InputError:
    """A setting the framework runs and zerocalc does not model."""
    return InputError(f"{where}: {key} {value!r} is not modelled; accepted: {accepted}")


def _invalid(where: str, key: str, value: Any, accepted: str) -> InputError:
    """A value that is not one the key takes (a word for a count)."""
    return InputError(f"{where}: {key} {value!r} is not accepted; accepted: {accepted}")


# -------------------------------------------------------------------------------------------- DeepSpeed
_DS_STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
"""A ZeRO stage (``zero_optimization.stage``, accelerate's ``zero_stage``: DeepSpeed 0.19.8
``ZeroStageEnum``) as zerocalc's strategy."""


def _modelled_stages() -> dict[int, str]:
    """The stages whose strategy DeepSpeed's framework record models: the one table the accepted stages
    are read from (:data:`~zerocalc.parallel.framework_records.FRAMEWORKS`)."""
    from zerocalc.parallel.framework_records import framework_strategies
    from zerocalc.parallel.frameworks import Framework

    modelled = {strategy.value for strategy in framework_strategies(Framework.DEEPSPEED)}
    return {stage: name for stage, name in _DS_STAGES.items() if name in modelled}


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" or {items[-1]}"


_DS_DTYPES = ("fp16", "bf16", "fp32")
"""``communication_data_type``'s values (DeepSpeed 0.19.8 ``runtime/config.py``
``get_communication_data_type``, case-insensitive)."""
_DS_OFFLOAD = ("none", "cpu", "nvme")
"""``OffloadDeviceEnum`` (DeepSpeed 0.19.8 ``runtime/zero/offload_config.py``)."""
_LAX_INT = re.compile(r"\s*[+-]?[0-9]+(?:\.0*)?\s*")
"""An integer as pydantic's lax mode reads one from a string (``"3"``, ``" 3"``, ``"3.0"``; not ``"5e8"``)."""


def _ds_int(value: Any, key: str, where: str, least: int = 1, lax: bool = False) -> int:
    """A whole number a ds_config key holds: an int, or a float with no fraction (JSON's ``5e8``); with
    ``lax`` (a pydantic field of ``DeepSpeedZeroConfig``, validated in lax mode) also a string of digits."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif lax and isinstance(value, str) and _LAX_INT.fullmatch(value):
        value = int(float(value))
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise _invalid(where, key, value, f"a whole number, {least} or more")
    return value


def _ds_bool(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(where, key, value, "true or false")
    return value


def _zero(values: dict[str, Any], where: str, get: Any, key: str) -> None:
    """A DeepSpeed ZeRO stage (``key``) as ``strategies``; digits as DeepSpeed's pydantic config reads them
    (``ZeroStageEnum``, lax mode: ``"3"`` is stage 3)."""
    stage = get(key)
    if stage is not None:
        number = _ds_int(stage, key, where, least=0, lax=True) if not isinstance(stage, bool) else -1
        stages = _modelled_stages()
        accepted = _listed([f"{n} ({name})" for n, name in stages.items()])
        if number not in stages:
            raise (_refuse if number in _DS_STAGES else _invalid)(where, key, stage, accepted)
        values["strategies"] = stages[number]


def _offload(values: dict[str, Any], where: str, get: Any, key: str, option: str) -> None:
    """A DeepSpeed offload device (``key``) as ``option``."""
    device = get(key)
    if device is not None:
        if str(device).lower() not in _DS_OFFLOAD:
            raise _invalid(where, key, device, ", ".join(_DS_OFFLOAD[:-1]) + f" or {_DS_OFFLOAD[-1]}")
        values[option] = str(device).lower()


def _deepspeed(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(config)
    if not any(rule_of(DEEPSPEED_KEYS, key) is not None for key in flat):
        model = " (a Hugging Face config.json: give it as --model)" if "model_type" in config else ""
        raise InputError(
            f"{where} has no ds_config key{literal(model)}; accepted: a DeepSpeed ds_config.json "
            "(zero_optimization, train_micro_batch_size_per_gpu, bf16, ...)"
        )
    values: dict[str, Any] = {"framework": "deepspeed"}
    notes: list[str] = []
    auto = [
        key
        for key, value in flat.items()
        if value == "auto"
        and (rule := rule_of(DEEPSPEED_KEYS, key)) is not None
        and rule.sort is not Sort.HARMLESS
    ]
    for key in auto:
        notes.append(f"{key} is 'auto' (filled in by the Hugging Face Trainer): zerocalc's default is used")
    present = {k: v for k, v in flat.items() if k not in auto}
    harmless = sort_keys(present, DEEPSPEED_KEYS, where)
    get = present.get
    _zero(values, where, get, "zero_optimization.stage")
    _offload(values, where, get, "zero_optimization.offload_optimizer.device", "offload_optimizer")
    _offload(values, where, get, "zero_optimization.offload_param.device", "offload_params")
    for key, option, least, lax in (
        ("zero_optimization.reduce_bucket_size", "reduce_bucket", 1, True),  # Field(gt=0)
        ("zero_optimization.allgather_bucket_size", "allgather_bucket", 0, True),  # Field(ge=0)
        ("train_micro_batch_size_per_gpu", "micro_batch", 1, False),  # get_scalar_param: as written
        ("gradient_accumulation_steps", "grad_accum", 1, False),
    ):
        if get(key) is not None:
            values[option] = str(_ds_int(get(key), key, where, least, lax))
    for key in ("train_batch_size",):
        if get(key) is not None:
            _ds_int(get(key), key, where)
    for key in (
        "bf16.enabled", "bfloat16.enabled", "fp16.enabled", "zero_optimization.overlap_comm",
        "zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients",
    ):  # fmt: skip
        if get(key) is not None:
            _ds_bool(get(key), key, where)
    stage = _ds_int(get("zero_optimization.stage", 0), "zero_optimization.stage", where, least=0, lax=True)
    if get("zero_optimization.overlap_comm") and stage in (1, 2):
        values["overlap_comm"] = True  # reductions beside backward (stage 3: its default)
    if get("zero_optimization.zero_hpz_partition_size") is not None:
        _ds_int(get("zero_optimization.zero_hpz_partition_size"), "zero_optimization.zero_hpz_partition_size",
                where, least=0, lax=True)  # fmt: skip
    per_gpu = all(
        get(key) is not None or key in auto
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    )
    _ds_checked(get, where, per_gpu)
    bf16 = get("bf16.enabled", get("bfloat16.enabled"))
    if bf16 and get("fp16.enabled"):
        raise _refuse(where, "bf16.enabled and fp16.enabled", True, "one of them")
    if bf16 is not None or get("fp16.enabled") is not None:
        values["precision"] = "bf16-mixed" if bf16 else "fp16-mixed" if get("fp16.enabled") else "fp32"
    dtype = get("communication_data_type")
    if dtype is not None:
        if str(dtype).lower() not in _DS_DTYPES:
            raise _invalid(
                where, "communication_data_type", dtype, ", ".join(_DS_DTYPES[:-1]) + f" or {_DS_DTYPES[-1]}"
            )
        values["reduce_dtype"] = str(dtype).lower()
    zeropp = [
        name
        for name, on in (
            ("qwz", get("zero_optimization.zero_quantized_weights")),
            ("hpz", (get("zero_optimization.zero_hpz_partition_size") or 1) > 1),
            ("qgz", get("zero_optimization.zero_quantized_gradients")),
        )
        if on
    ]
    if zeropp:
        values["zeropp"] = ",".join(zeropp)
    optimizer = get("optimizer.type")
    if optimizer is not None:
        name = str(optimizer).lower()
        if name not in ("adam", "adamw"):
            raise _refuse(where, "optimizer.type", optimizer, "Adam or AdamW")
        values["optimizer"] = name
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless)


def _ds_checked(get: Any, where: str, per_gpu: bool) -> None:
    """The modelled keys that set no option, checked against what zerocalc models: ``overlap_comm`` at its
    default for the stage (``DeepSpeedZeroConfig.overlap_comm_valid``: on for ZeRO-3, off below; the step
    model overlaps ZeRO-3's collectives and exposes ZeRO-1/2's reductions, :mod:`zerocalc.comm.step`), and
    ``train_batch_size`` only beside the micro-batch and accumulation it would otherwise derive from the
    world (``DeepSpeedConfig._set_batch_related_parameters``)."""
    stage = _ds_int(get("zero_optimization.stage", 0), "zero_optimization.stage", where, least=0, lax=True)
    overlap = get("zero_optimization.overlap_comm")
    if overlap is not None and overlap != (stage == 3) and not (overlap and stage in (1, 2)):
        what = "reductions overlapped with backward" if overlap else "ZeRO-3's collectives not overlapped"
        raise InputError(
            f"{where}: zero_optimization.overlap_comm {overlap!r} is not modelled ({what}: zerocalc's step "
            f"time models DeepSpeed's default for stage {stage}); accepted: {shown_value(stage == 3)} (or "
            "leave it out)"
        )
    if get("train_batch_size") is not None and not per_gpu:
        raise _refuse(
            where, "train_batch_size", get("train_batch_size"),
            "train_micro_batch_size_per_gpu and gradient_accumulation_steps given beside it (DeepSpeed "
            "derives the missing one from the world size)",
        )  # fmt: skip


# ------------------------------------------------------------------------------------------- torchtitan
_TITAN_MODELS = {
    ("llama3", "8B"): "llama-3-8b",
    ("llama3", "70B"): "llama-3-70b",
    ("llama3", "405B"): "llama-3.1-405b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
}
_TITAN_AC_MODES = ("none", "full", "selective")
_TITAN_AC_DEFAULT = "selective"
_TITAN_SAC_DEFAULT = "2"
"""torchtitan ``ActivationCheckpoint.mode`` and ``selective_ac_option``'s defaults (v0.2.2
``config/job_config.py``; ``--activation_checkpoint.mode`` and ``selective_ac_option`` at 9dec370): a file
without them checkpoints every second block."""
_TITAN_IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
_TITAN_IMPLEMENTATION_DEFAULT = "fused"
"""``Optimizer.implementation``'s values and default (v0.2.2 ``config/job_config.py``, as v0.1.0's); at
9dec370 ``--optimizer.fused`` (default false: ``build_optimizers`` passes ``foreach=not fused``)."""
_TITAN_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
_TITAN_REDUCE_DEFAULT = "float32"
"""``Training.mixed_precision_reduce``'s default (v0.2.2 ``config/job_config.py``, and ``config_manager.py``
at commit 9dec370): FSDP reduces gradients in fp32 unless the file says otherwise."""
_TITAN_LOCAL_BATCH_DEFAULT = 8
"""``Training.local_batch_size``'s default (v0.2.2 ``config/job_config.py``; ``--training.batch_size`` at
9dec370): the sequences a data-parallel rank's pipeline splits into micro-batches."""
_TITAN_DEFAULTS = (
    "training.local_batch_size", "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
    "optimizer.implementation",
)  # fmt: skip
"""The keys whose torchtitan default differs from zerocalc's, applied where a file leaves them out."""
_TITAN_SCHEDULES: dict[str, tuple[str, bool]] = {
    "gpipe": ("gpipe", False),
    "1f1b": ("1f1b", False),
    "interleaved1f1b": ("interleaved-1f1b", True),
    "interleavedzerobubble": ("zero-bubble", True),
}
"""torch.distributed.pipelining ``get_schedule_class``'s names (case-insensitive,
``torch/distributed/pipelining/schedules.py``) that zerocalc models: its ``--pp-schedule``, and whether the
schedule runs several stages a rank (a ``PipelineScheduleMulti``). LoopedBFS (breadth-first), ZBVZeroBubble
and DualPipeV (two stages a rank in a V: rank i holds stages i and 2p − 1 − i) are not modelled."""
_TITAN_SCHEDULES_ACCEPTED = "GPipe, 1F1B, Interleaved1F1B or InterleavedZeroBubble"
_TITAN_RENAMED = {
    "training.data_parallel_shard_degree": "parallelism.data_parallel_shard_degree",
    "training.data_parallel_replicate_degree": "parallelism.data_parallel_replicate_degree",
    "training.tensor_parallel_degree": "parallelism.tensor_parallel_degree",
    "training.fsdp_reshard_after_forward": "parallelism.fsdp_reshard_after_forward",
    "training.batch_size": "training.local_batch_size",
    "experimental.context_parallel_degree": "parallelism.context_parallel_degree",
    "experimental.pipeline_parallel_degree": "parallelism.pipeline_parallel_degree",
    "experimental.pipeline_parallel_schedule": "parallelism.pipeline_parallel_schedule",
    "experimental.pipeline_parallel_schedule_csv": "parallelism.pipeline_parallel_schedule_csv",
    "experimental.pipeline_parallel_split_points": "parallelism.pipeline_parallel_split_points",
    "experimental.pipeline_parallel_microbatches": "parallelism.pipeline_parallel_microbatches",
}
"""The older layout's keys (``config_manager.py`` at commit 9dec370: degrees under ``[training]`` and
``[experimental]``, ``batch_size``) as the v0.2.2 keys they became (commit 785c34c moved them to
``[parallelism]``, v0.1.0 renamed ``batch_size`` ``local_batch_size``)."""
_TITAN_COUNTED = "parallelism.pipeline_parallel_microbatches"
"""The older layouts' micro-batch count (default: the pipeline degree), which commit 5e2033c replaced by
``pipeline_parallel_microbatch_size``; a file with it splits layers as 9dec370 did."""
_TITAN_SIZED = (
    "parallelism.pipeline_parallel_microbatch_size", "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.pipeline_parallel_first_stage_less_layers",
    "parallelism.pipeline_parallel_last_stage_less_layers", "parallelism.module_fqns_per_model_part",
)  # fmt: skip
"""The keys of the layout that sizes micro-batches (v0.1.0 on), not read with :data:`_TITAN_COUNTED`."""


@dataclass(frozen=True)
class TitanStages:
    """torchtitan's split of a model's L layers into S pipeline stages, s = S/p of them on each of the p
    ranks (rank i holds stages i, i + p, …: ``stage_ids_this_rank`` / ``pipeline_module_split`` ``loop``
    style), the embedding on stage 0 and the norm and head on stage S − 1.

    * Explicit: ``pipeline_parallel_split_points`` (``layers.N`` starts a stage; 9dec370, v0.1.0) or
      ``module_fqns_per_model_part`` (each stage's modules; v0.2.2).
    * v0.2.2's default (``distributed/pipeline_parallel.py`` ``pipeline_llm`` and
      ``generate_llm_fqn_per_model_part``; v0.1.0's ``generate_split_points`` splits alike): s = 1 for a
      single-stage schedule, 2 for a multi-stage one, or S = ⌈(L + a + z)/``layers_per_stage``⌉; the
      embedding counts as a = ``first_stage_less_layers`` layers and the head as z =
      ``last_stage_less_layers`` (1 each), the L + a + z split evenly over S, the first (L + a + z) mod S
      stages one more; Llama 3.1 405B at p 8: 15, 16 × 6, 15.
    * 9dec370's default (``parallelisms/pipelining_utils.py`` ``generate_split_points``): ⌊L/S⌋ on the
      first stage, one more on each following stage while L mod S lasts, the rest on the last.
    """

    where: str
    pp: int
    multi_stage: bool
    counted: bool
    """The older layouts' split (9dec370's), else v0.2.2's."""
    schedule_key: str
    first_weight: int = 1
    last_weight: int = 1
    layers_per_stage: int | None = None
    split_points: tuple[str, ...] | None = None
    parts: tuple[int, ...] | None = None
    """Layers of each stage of ``module_fqns_per_model_part``."""

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layers of each of the S stages, in order."""
        if self.parts is not None:
            if sum(self.parts) != num_layers:
                raise self._problem(f"its stages hold {sum(self.parts)} layers, the model {num_layers}")
            return self.parts
        if self.split_points is not None:
            return self._from_points(num_layers)
        stages = self.pp * (2 if self.multi_stage else 1)
        if self.counted:
            if stages > num_layers:
                raise self._problem(f"{stages} stages are more than the model's {num_layers} layers")
            base, extra = divmod(num_layers, stages)
            counts = [base]
            for _ in range(stages - 2):
                counts.append(base + (1 if extra > 0 else 0))
                extra -= 1
            return (*counts, num_layers - sum(counts))
        effective = num_layers + self.first_weight + self.last_weight
        if self.layers_per_stage is not None:
            stages = -(-effective // self.layers_per_stage)
        per, extra = divmod(effective, stages)
        if per < max(self.first_weight, self.last_weight, 1):
            raise self._problem(f"{stages} stages over {effective} effective layers leave {per} a stage")
        counts = [per + (1 if stage < extra else 0) for stage in range(stages)]
        counts[0] -= self.first_weight
        counts[-1] -= self.last_weight
        return tuple(counts)

    def _from_points(self, num_layers: int) -> tuple[int, ...]:
        starts: list[int] = []
        for point in self.split_points or ():
            name, _, index = str(point).partition(".")
            if name != "layers" or not index.isdigit():
                raise self._problem(f"split point {point!r} is not a layer ('layers.N')")
            starts.append(int(index))
        bounds = [0, *starts, num_layers]
        if any(b <= a for a, b in pairwise(bounds)):
            raise self._problem(
                f"split points {', '.join(self.split_points or ())} are not increasing layers"
            )
        return tuple(b - a for a, b in pairwise(bounds))

    def _problem(self, why: str) -> InputError:
        return InputError(f"{self.where}: torchtitan's pipeline stages cannot be built ({why})")

    def options(self, num_layers: int) -> dict[str, str]:
        """``vpp`` and the split for the model's L layers: the first and last stage's layers where the
        stages are Megatron-LM's uneven split (s equal chunks a rank, every rank but the first and last
        holding the same layers: :func:`~zerocalc.parallel.pipeline.stage_layer_counts`), else each
        stage's layers (``--pp-stage-layers``: torchtitan's stage k is on rank k mod p, as zerocalc's
        virtual stage k); an :class:`InputError` where a stage holds no layer (the embedding or the head
        alone), which zerocalc does not model."""
        from zerocalc.parallel.mesh import describe_layer_counts
        from zerocalc.parallel.pipeline import split_problem, stage_layer_counts

        counts = self.stage_layers(num_layers)
        stages, pp = len(counts), self.pp
        if stages % pp:
            raise self._problem(f"{stages} stages do not divide over {pp} pipeline ranks")
        vpp = stages // pp
        if (vpp > 1) != self.multi_stage:
            kind = "several stages a rank" if self.multi_stage else "one stage a rank"
            raise self._problem(f"{self.schedule_key} runs {kind}, the split gives {vpp}")
        ranks = [vpp * counts[rank] for rank in range(pp)]
        chunked = all(counts[j * pp + rank] == counts[rank] for j in range(vpp) for rank in range(pp))
        middle = set(ranks[1:-1])
        first = last = None
        if len(middle) == 1:
            (even,) = middle
            first = ranks[0] if ranks[0] != even else None
            last = ranks[-1] if ranks[-1] != even else None
        elif pp == 2 and ranks[0] != ranks[1]:
            first = ranks[0]
        if min(counts) < 1:
            rule = "9dec370" if self.counted else "v0.2.2"
            made = (
                "given"
                if self.parts is not None or self.split_points is not None
                else f"torchtitan {rule} default"
            )
            raise InputError(
                f"{self.where}: the {made} split of {num_layers} layers into {stages} stages over {pp} ranks "
                f"(layers a stage: {describe_layer_counts(counts)}) leaves a stage without a layer, which "
                "is not modelled; accepted: every stage at least one layer (set "
                "parallelism.pipeline_parallel_split_points or module_fqns_per_model_part), or "
                "{pp_stage_layers} given"
            )
        megatron = (
            chunked
            and len(middle) <= 1
            and split_problem(num_layers, pp, vpp, first, last) is None
            and stage_layer_counts(num_layers, pp, first, last) == tuple(ranks)
        )
        values = {"vpp": str(vpp)} if vpp > 1 else {}
        if megatron:
            ends = (("pp_first_stage_layers", first), ("pp_last_stage_layers", last))
            values.update({name: str(n) for name, n in ends if n})
        else:
            values["pp_stage_layers"] = ",".join(map(str, counts))
        return values


def _titan_selective(option: str, where: str) -> dict[str, str]:
    """``mode = "selective"`` by its ``selective_ac_option`` (v0.2.2 ``distributed/activation_checkpoint.py``
    ``_apply_ac_to_transformer_block``): ``op`` is the op-level policy (``--recompute op``); a whole number
    N checkpoints every N-th block whole (``_apply_layer_sac``: ``not ac_freq or count % ac_freq == 0``):
    ``--recompute full --checkpoint-every N``, every block for 0 and 1."""
    if option == "op":
        return {"recompute": "op"}
    if option.isdigit():
        return {"recompute": "full", "checkpoint_every": str(max(1, int(option)))}
    raise _refuse(
        where,
        "activation_checkpoint.selective_ac_option",
        option,
        "op, or a whole number N (every N-th block)",
    )


def _titan_renamed(flat: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``flat`` with the older layout's keys under their v0.2.2 names, and each renamed key's name in the
    file (for messages)."""
    renamed = dict(flat)
    spelled: dict[str, str] = {}
    for old, new in _TITAN_RENAMED.items():
        if old in flat:
            if new in flat:
                raise _refuse(
                    where, f"{old} and {new}", flat[old], "one of them (the older layout's or v0.2.2's)"
                )
            renamed[new] = renamed.pop(old)
            spelled[new] = old
    return renamed, spelled


def _titan_pipeline(get: Any, name: Any, where: str, pp: int, values: dict[str, Any]) -> TitanStages:
    """The pipeline of a job with p = ``pp`` > 1 ranks: ``pp``, ``pp_schedule``, the micro-batch and the
    micro-batches a step (v0.2.2 ``distributed/pipeline_parallel.py`` ``build_pipeline_schedule``:
    ``local_batch_size / pipeline_parallel_microbatch_size`` micro-batches; 9dec370
    ``pipelining_utils.py``: ``pipeline_parallel_microbatches``, default p, each a share of the batch), and
    how the layers split (:class:`TitanStages`)."""
    schedule_key = name("parallelism.pipeline_parallel_schedule")
    csv = get("parallelism.pipeline_parallel_schedule_csv")
    if csv:
        raise _refuse(
            where,
            name("parallelism.pipeline_parallel_schedule_csv"),
            csv,
            f"none: a schedule by name, {_TITAN_SCHEDULES_ACCEPTED}",
        )
    schedule = str(get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if schedule.lower() not in _TITAN_SCHEDULES:
        raise _refuse(where, schedule_key, schedule, _TITAN_SCHEDULES_ACCEPTED)
    zerocalc_schedule, multi_stage = _TITAN_SCHEDULES[schedule.lower()]
    batch_key = name("training.local_batch_size")
    batch = _whole(get("training.local_batch_size", _TITAN_LOCAL_BATCH_DEFAULT), batch_key, where)
    counted = get(_TITAN_COUNTED) is not None or name("parallelism.pipeline_parallel_degree") != (
        "parallelism.pipeline_parallel_degree"
    )
    if counted:
        mixed = [key for key in _TITAN_SIZED if get(key) is not None]
        if mixed:
            raise _refuse(
                where, f"{name(_TITAN_COUNTED)} with {mixed[0]}", get(mixed[0]), "one layout's keys"
            )
        count_key = name(_TITAN_COUNTED)
        if get(_TITAN_COUNTED) is None:
            section = name("parallelism.pipeline_parallel_degree").split(".")[0]
            count_key = f"{section}.pipeline_parallel_microbatches (unset: the pipeline degree)"
        micro_batches = _whole(get(_TITAN_COUNTED, pp), count_key, where)
        if batch % micro_batches:
            raise _refuse(where, count_key, micro_batches, f"a divisor of {batch_key} {batch}")
        micro_batch = batch // micro_batches
    else:
        micro_batch = _whole(
            get("parallelism.pipeline_parallel_microbatch_size", 1),
            "parallelism.pipeline_parallel_microbatch_size",
            where,
        )
        if batch % micro_batch:
            raise _refuse(
                where,
                "parallelism.pipeline_parallel_microbatch_size",
                micro_batch,
                f"a divisor of {batch_key} {batch}",
            )
        micro_batches = batch // micro_batch
    values.update(
        pp=str(pp), pp_schedule=zerocalc_schedule, micro_batch=str(micro_batch), grad_accum=str(micro_batches)
    )
    fqns = get("parallelism.module_fqns_per_model_part")
    points = get("parallelism.pipeline_parallel_split_points")
    layers_per_stage = get("parallelism.pipeline_parallel_layers_per_stage")
    return TitanStages(
        where=where,
        pp=pp,
        multi_stage=multi_stage,
        counted=counted,
        schedule_key=f"{schedule_key} {schedule}",
        first_weight=_whole(
            get("parallelism.pipeline_parallel_first_stage_less_layers", 1),
            "parallelism.pipeline_parallel_first_stage_less_layers",
            where,
            0,
        ),
        last_weight=_whole(
            get("parallelism.pipeline_parallel_last_stage_less_layers", 1),
            "parallelism.pipeline_parallel_last_stage_less_layers",
            where,
            0,
        ),
        layers_per_stage=None
        if layers_per_stage is None
        else _whole(layers_per_stage, "parallelism.pipeline_parallel_layers_per_stage", where),
        split_points=tuple(points) if points else None,
        parts=None if fqns is None else tuple(_titan_part_layers(fqns, where)),
    )


def _titan_accumulation(
    get: Any, name: Any, where: str, values: dict[str, Any], batch: int, shard: Any, replicate: int, pp: int
) -> None:
    """Gradient accumulation from ``global_batch_size`` (v0.2.2 ``train.py``: ``global_batch_size //
    (local_batch_size × dp)`` steps of ``local_batch_size`` sequences, dp = shard × replicate; -1, the
    default: none)."""
    key = "training.global_batch_size"
    total = get(key, -1)
    if total == -1:
        return
    total = _whole(total, key, where)
    if shard in (None, -1):
        raise _refuse(
            where, key, total, f"-1, or {name('parallelism.data_parallel_shard_degree')} given beside it"
        )
    dp = shard * replicate
    if total % (batch * dp):
        raise _invalid(where, key, total, f"a multiple of local_batch_size × dp = {batch} × {dp}")
    steps = total // (batch * dp)
    if steps > 1 and pp > 1:
        raise _refuse(where, key, total, f"{batch * dp} (no accumulation over a pipeline's micro-batches)")
    if steps > 1:
        values["grad_accum"] = str(steps)


def _titan_optimizer_impl(get: Any, where: str, older: bool) -> str:
    """``--optimizer-impl`` from ``optimizer.implementation`` (or the older ``optimizer.fused``), else
    the file's layout's default."""
    fused = get("optimizer.fused")
    if fused is not None:
        if not isinstance(fused, bool):
            raise _invalid(where, "optimizer.fused", fused, "true or false")
        return "fused" if fused else "foreach"
    implementation = get("optimizer.implementation", "foreach" if older else _TITAN_IMPLEMENTATION_DEFAULT)
    if implementation not in _TITAN_IMPLEMENTATIONS:
        raise _invalid(where, "optimizer.implementation", implementation, ", ".join(_TITAN_IMPLEMENTATIONS))
    return str(implementation)


def _titan_part_layers(fqns: Any, where: str) -> list[int]:
    """The transformer layers (``layers.N``) of each model part of ``module_fqns_per_model_part``."""
    if not isinstance(fqns, list) or not all(isinstance(part, list) for part in fqns):
        raise _refuse(
            where, "parallelism.module_fqns_per_model_part", fqns, "a list of lists of module names"
        )
    return [
        sum(1 for module in part if str(module).startswith("layers.") and str(module)[7:].isdigit())
        for part in fqns
    ]


def _whole(value: Any, key: str, where: str, least: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise _invalid(where, key, value, f"a whole number, {least} or more")
    return value


def _torchtitan(job: dict[str, Any], where: str) -> LaunchConfig:
    original = _flatten(job)
    harmless = sort_keys(
        {k: v for k, v in original.items() if k not in _TITAN_RENAMED}, TORCHTITAN_KEYS, where
    )
    flat, spelled = _titan_renamed(original, where)
    get = flat.get

    def name(key: str) -> str:
        return spelled.get(key, key)

    values: dict[str, Any] = {"framework": "fsdp2", "model_impl": "torchtitan"}
    notes: list[str] = []
    if spelled:
        notes.append(
            "torchtitan's older layout (config_manager.py before commit 785c34c) read as v0.2.2's: "
            + ", ".join(f"{old} → {new}" for new, old in spelled.items())
        )
    model = (get("model.name"), str(get("model.flavor")))
    if model in _TITAN_MODELS:
        values["model"] = _TITAN_MODELS[model]
    elif get("model.name") is not None:
        notes.append(f"model {model[0]} {model[1]} has no preset: give --model")
    degrees: dict[str, int] = {}
    for key, option in (
        ("tensor_parallel_degree", "tp"),
        ("context_parallel_degree", "cp"),
        ("pipeline_parallel_degree", "pp"),
        ("expert_parallel_degree", "ep"),
    ):
        degree = get(f"parallelism.{key}")
        if degree is None:
            degrees[option] = 1
            continue
        if not isinstance(degree, int) or isinstance(degree, bool) or degree < 1:
            raise _refuse(where, name(f"parallelism.{key}"), degree, "a whole number of ranks, 1 or more")
        degrees[option] = degree
        values[option] = str(degree)
    tp, cp, pp, ep = degrees["tp"], degrees["cp"], degrees["pp"], degrees["ep"]
    if ep > 1:
        expert_tp = get("parallelism.expert_tensor_parallel_degree", 1)
        if expert_tp != tp:
            raise _refuse(
                where, "parallelism.expert_tensor_parallel_degree", expert_tp,
                f"{tp}, the tensor-parallel degree (EP groups carved from dp_shard × cp, t apart)",
            )  # fmt: skip
    shard = get("parallelism.data_parallel_shard_degree")
    replicate = get("parallelism.data_parallel_replicate_degree") or 1
    reshard = str(get("parallelism.fsdp_reshard_after_forward") or "default").lower()
    if reshard not in ("default", "always", "never"):
        raise _refuse(
            where, name("parallelism.fsdp_reshard_after_forward"), reshard, "default, always or never"
        )
    if replicate > 1:
        if shard in (None, -1):
            raise _refuse(
                where, name("parallelism.data_parallel_shard_degree"), shard, "a degree with replicate > 1"
            )
        if tp * cp * pp * ep > 1:
            raise _refuse(
                where, name("parallelism.data_parallel_replicate_degree"), replicate,
                "1 with tensor, context, pipeline or expert parallelism (HSDP is modelled on data-parallel "
                "meshes)",
            )  # fmt: skip
        values["strategies"] = "hybrid_shard"
        values["gpus_per_node"] = str(shard)
        values["gpus"] = str(shard * replicate)
        notes.append(
            f"HSDP {replicate} × {shard}: the shard group is taken as the node (--gpus-per-node {shard})"
        )
    else:
        # "default" reshards after forward without a pipeline, not with one (v0.2.2
        # models/llama3/infra/parallelize.py apply_fsdp; 9dec370 parallelisms/parallelize_llama.py)
        keeps = reshard == "never" or (reshard == "default" and pp > 1)
        values["strategies"] = "shard_grad_op" if keeps else "zero3"
        if shard not in (None, -1):
            values["gpus"] = str(shard * tp * cp * pp)
    given = {*original, *(["optimizer.implementation"] if get("optimizer.fused") is not None else [])}
    defaults = [key for key in _TITAN_DEFAULTS if get(key) is None and name(key) not in given]
    if defaults:
        notes.append(f"torchtitan's defaults for what the file leaves out: {', '.join(defaults)}")
    batch = _whole(
        get("training.local_batch_size", _TITAN_LOCAL_BATCH_DEFAULT), name("training.local_batch_size"), where
    )
    values["micro_batch"] = str(batch)
    stages = _titan_pipeline(get, name, where, pp, values) if pp > 1 else None
    _titan_accumulation(get, name, where, values, batch, shard, replicate, pp)
    values["optimizer_impl"] = _titan_optimizer_impl(get, where, bool(spelled))
    if get("training.seq_len") is not None:
        values["seq_len"] = str(_whole(get("training.seq_len"), name("training.seq_len"), where))
    param = get("training.mixed_precision_param")
    if param is not None:
        if param not in _TITAN_DTYPES:
            raise _refuse(where, "training.mixed_precision_param", param, "bfloat16 or float32")
        values["precision"] = "bf16-mixed" if param == "bfloat16" else "fp32"
    reduce = get("training.mixed_precision_reduce", _TITAN_REDUCE_DEFAULT)
    if reduce not in _TITAN_DTYPES:
        raise _refuse(where, "training.mixed_precision_reduce", reduce, "bfloat16 or float32")
    values["reduce_dtype"] = _TITAN_DTYPES[reduce]
    mode = get("activation_checkpoint.mode", _TITAN_AC_DEFAULT)
    if mode not in _TITAN_AC_MODES:
        raise _refuse(where, "activation_checkpoint.mode", mode, "none, full or selective")
    option = str(get("activation_checkpoint.selective_ac_option", _TITAN_SAC_DEFAULT))
    values.update({"recompute": mode} if mode != "selective" else _titan_selective(option, where))
    optimizer = get("optimizer.name")
    if optimizer is not None:
        if str(optimizer).lower() not in ("adam", "adamw"):
            raise _refuse(where, "optimizer.name", optimizer, "Adam or AdamW")
        values["optimizer"] = str(optimizer).lower()
    _titan_fp8(get, where, values, notes)
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless, stages=stages)


_TITAN_FP8_CONVERTERS = ("quantize.linear.float8", "float8")
"""The float8 Linear converter's name: v0.2.2 ``components/quantization/float8.py``
``register_model_converter(Float8LinearConverter, "quantize.linear.float8")``, v0.1.0's ``"float8"``."""
_TITAN_FP8_KEYS = (
    "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "recipe_name", "filter_fqns",
)  # fmt: skip


def _titan_fp8(get: Any, where: str, values: dict[str, Any], notes: list[str]) -> None:
    """The float8 converter's options (torchtitan v0.2.2 ``components/quantization/float8.py``
    ``Float8LinearConverter``): a ``recipe_name`` (None: tensorwise) or the FSDP float8 all-gather, not both
    (its assert); the scales precomputed only with the all-gather (``precompute_scale = enable_fsdp_float8_
    all_gather and precompute_float8_dynamic_scale_for_fsdp``); ``filter_fqns`` the modules skipped. Any
    other converter (mx, grouped GEMMs) is refused."""
    converters = get("model.converters", [])
    if isinstance(converters, str):
        converters = [c for c in converters.split(",") if c.strip()]
    if not isinstance(converters, list):
        raise _refuse(where, "model.converters", converters, "a list of converter names")
    others = [c for c in converters if c not in _TITAN_FP8_CONVERTERS]
    if others:
        raise _refuse(
            where, "model.converters", others[0], f"{' or '.join(_TITAN_FP8_CONVERTERS)} (torchao float8)"
        )

    def setting(key: str) -> tuple[str, Any]:
        for table in ("quantize.linear.float8", "float8"):
            if get(f"{table}.{key}") is not None:
                return f"{table}.{key}", get(f"{table}.{key}")
        return f"quantize.linear.float8.{key}", None

    if not converters:
        given = [name for name, value in map(setting, _TITAN_FP8_KEYS) if value not in (None, False, [])]
        if given:
            notes.append(f"{', '.join(given)}: read only by the float8 converter, not in model.converters")
        return
    recipe_key, recipe = setting("recipe_name")
    gather_key, gather = setting("enable_fsdp_float8_all_gather")
    precompute_key, precompute = setting("precompute_float8_dynamic_scale_for_fsdp")
    if recipe is not None and recipe not in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        raise _refuse(where, recipe_key, recipe, "tensorwise, rowwise or rowwise_with_gw_hp")
    if recipe is not None and gather:
        raise _refuse(
            where, gather_key, gather, f"false with {recipe_key} (torchtitan asserts they are not combined)"
        )
    values["fp8"] = (recipe or "tensorwise").replace("_with_", "-").replace("_", "-")
    if gather:
        values["fp8_all_gather"] = True
        values["fp8_precompute_scales"] = bool(precompute)
    elif precompute:
        notes.append(f"{precompute_key}: torchtitan precomputes scales only with {gather_key}; not applied")
    _, skip = setting("filter_fqns")
    if skip:
        values["fp8_skip"] = [str(entry) for entry in skip]


# ------------------------------------------------------------------------------------------- accelerate
_FSDP1_STRATEGIES = {
    "FULL_SHARD": "zero3", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "ddp",
    "HYBRID_SHARD": "hybrid_shard", "1": "zero3", "2": "shard_grad_op", "3": "ddp", "4": "hybrid_shard",
}  # fmt: skip


_ACCELERATE_TYPES = "FSDP, DEEPSPEED or MULTI_GPU"
_FSDP_WRAP = "TRANSFORMER_BASED_WRAP"
_FSDP_WRAP_DEFAULT = "NO_WRAP"
_FSDP1_PREFETCH = "BACKWARD_PRE"
_FSDP1_PREFETCH_DEFAULT = "NO_PREFETCH"
"""accelerate 1.15.0 ``FullyShardedDataParallelPlugin.__post_init__`` (``utils/dataclasses.py``): without
``fsdp_auto_wrap_policy`` the model is one unit (``NO_WRAP``), without ``fsdp_backward_prefetch`` FSDP1 does
not prefetch (``NO_PREFETCH``: ``backward_prefetch=None``); zerocalc models a unit per block and FSDP1's
``BACKWARD_PRE`` (:mod:`zerocalc.peak.mechanics`)."""


def _fsdp_checked(get: Any, where: str, version: int) -> None:
    """The FSDP keys zerocalc models at one value: the wrap policy (a unit per block), and for FSDP1 the
    backward prefetch and ``use_orig_params=False`` (FSDP2 ignores both, with a warning)."""
    key = "fsdp_config.fsdp_auto_wrap_policy"
    policy = str(get(key, _FSDP_WRAP_DEFAULT)).upper()
    if policy != _FSDP_WRAP:
        shown = key if get(key) is not None else f"{key} (unset: accelerate's {_FSDP_WRAP_DEFAULT})"
        raise _refuse(where, shown, policy, f"{_FSDP_WRAP} (a unit per decoder block)")
    if version == 2:
        return
    key = "fsdp_config.fsdp_backward_prefetch"
    prefetch = str(get(key, _FSDP1_PREFETCH_DEFAULT)).upper()
    if prefetch != _FSDP1_PREFETCH:
        shown = key if get(key) is not None else f"{key} (unset: accelerate's {_FSDP1_PREFETCH_DEFAULT})"
        raise _refuse(where, shown, prefetch, f"{_FSDP1_PREFETCH} (or fsdp_version 2)")
    if get("fsdp_config.fsdp_use_orig_params"):
        raise _refuse(where, "fsdp_config.fsdp_use_orig_params", True, "false (or fsdp_version 2)")


def _accelerate(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(config)
    if not flat:
        raise InputError(
            f"{where} holds no key; accepted: an accelerate config as `accelerate config` writes it "
            "(distributed_type, num_processes, mixed_precision, ...)"
        )
    harmless = sort_keys(flat, ACCELERATE_KEYS, where)
    get = flat.get
    values: dict[str, Any] = {}
    notes: list[str] = []
    kind = str(get("distributed_type") or "").upper()
    if kind == "FSDP":
        version = int(get("fsdp_config.fsdp_version") or 1)
        values["framework"] = "fsdp2" if version == 2 else "fsdp"
        if version == 2:
            reshard = get("fsdp_config.fsdp_reshard_after_forward")
            values["strategies"] = "shard_grad_op" if reshard is False else "zero3"
        else:
            # FSDP1 reads fsdp_reshard_after_forward as the sharding strategy when fsdp_sharding_strategy is
            # unset (accelerate 1.15.0 FullyShardedDataParallelPlugin.__post_init__; cluster.py writes it)
            key = next(
                (k for k in ("fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_reshard_after_forward")
                 if get(k) is not None), "fsdp_config.fsdp_sharding_strategy",
            )  # fmt: skip
            strategy = str(get(key) or "FULL_SHARD").upper()
            if strategy not in _FSDP1_STRATEGIES:
                raise _refuse(where, key, strategy, ", ".join(_FSDP1_STRATEGIES))
            values["strategies"] = _FSDP1_STRATEGIES[strategy]
        if get("fsdp_config.fsdp_activation_checkpointing"):
            values["recompute"] = "full"
        if get("fsdp_config.fsdp_offload_params"):
            values["offload_params"] = "cpu"
        if get("fsdp_config.fsdp_cpu_ram_efficient_loading"):  # rank 0 loads on the host, the others receive
            values["init"] = "cpu"
        _fsdp_checked(get, where, version)
    elif kind == "DEEPSPEED":
        values["framework"] = "deepspeed"
        _zero(values, where, get, "deepspeed_config.zero_stage")
        _offload(values, where, get, "deepspeed_config.offload_optimizer_device", "offload_optimizer")
        _offload(values, where, get, "deepspeed_config.offload_param_device", "offload_params")
        key = "deepspeed_config.gradient_accumulation_steps"
        if get(key) is not None:
            values["grad_accum"] = str(_ds_int(get(key), key, where))
        key = "deepspeed_config.zero3_init_flag"
        if get(key) is not None:  # deepspeed.zero.Init, or built on the host
            values["init"] = "meta" if _ds_bool(get(key), key, where) else "cpu"
    elif kind == "MULTI_GPU":
        values["framework"] = "ddp"
        values["strategies"] = "ddp"
    elif kind:
        raise _refuse(where, "distributed_type", kind, _ACCELERATE_TYPES)
    else:  # BaseConfig.process_config: "A `distributed_type` must be specified in the config file."
        raise InputError(
            f"{where} has no distributed_type (accelerate requires one); accepted: {_ACCELERATE_TYPES}"
        )
    precision = get("mixed_precision")
    if precision is not None:
        mapped = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": "fp32"}.get(str(precision).lower())
        if str(precision).lower() == "fp8":
            raise _refuse(where, "mixed_precision", precision, f"bf16, fp16 or no ({FP8})")
        if mapped is None:
            raise _invalid(where, "mixed_precision", precision, "bf16, fp16 or no")
        values["precision"] = mapped
    processes = get("num_processes")
    machines = _whole(get("num_machines", 1), "num_machines", where)
    if processes == -1:  # ClusterConfig's default: the launcher's command line gives it
        notes.append("num_processes -1 (given at launch): --gpus is used")
    elif processes is not None:
        processes = _whole(processes, "num_processes", where)
        values["gpus"] = str(processes)
        if processes % machines:
            raise _refuse(where, "num_processes", processes, f"a multiple of num_machines {machines}")
        values["gpus_per_node"] = str(processes // machines)
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless)


_STAGE_OPTIONS = frozenset({"pp", "vpp", "pp_first_stage_layers", "pp_last_stage_layers", "pp_stage_layers"})
"""The options a file's stage split sets; one of them given on the command line, the split is the flags'."""


def _num_layers(model: Any) -> int | None:
    """The layers of the model named (a preset, a file, an architecture, a config dict), or None without one
    or without its architecture (the request's parser refuses a pipeline then)."""
    if model is None:
        return None
    from zerocalc.request.model_spec import model_spec as _model

    architecture = _model(None, model).architecture
    return None if architecture is None else architecture.num_layers


def read_launch_configs(
    values: dict[str, Any], given: frozenset[str], accepted: frozenset[str]
) -> tuple[dict[str, Any], list[str]]:
    """``values`` with what each named launch configuration (``values[format]``: a path) sets, for every
    option in ``accepted`` that was not ``given`` explicitly (flags override the files); and the notes to
    print (what each file set is echoed in the JSON's ``options``; what it has that zerocalc does not model
    is listed). Files are read in :class:`LaunchFormat`'s order; a later one overrides an earlier one."""
    from pathlib import Path

    from zerocalc.base.errors import shown, why_not

    merged = dict(values)
    notes: list[str] = []
    for kind in LaunchFormat:
        path = values.get(kind.value)
        if path is None:
            continue
        where = f"{{{kind.value}}} {shown(path)}"
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8-sig")
        except (OSError, ValueError) as exc:
            raise InputError(f"{where} cannot be read ({why_not(exc)}); accepted: a readable file") from exc
        config = read_launch_config(kind, text, where)
        for name, value in config.values.items():
            if name in accepted and name not in given:
                merged[name] = value
        if config.stages is not None and not given & _STAGE_OPTIONS:
            layers = _num_layers(merged.get("model"))
            if layers is not None:
                merged.update({k: v for k, v in config.stages.options(layers).items() if k in accepted})
        notes += config.note_lines(f"{kind.value} {Path(path).name}")
    return merged, notes
