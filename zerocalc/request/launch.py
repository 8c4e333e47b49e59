"""A user's own launch configuration read into the options the flags give.

Three formats, each mapped key by key onto :data:`zerocalc.request.options.OPTIONS` (the flags a user types
override what a file says):

* a DeepSpeed config (``ds_config.json``; keys as in ``deepspeed/runtime/config.py`` and
  ``deepspeed/runtime/zero/config.py``, DeepSpeed 0.16);
* a torchtitan job TOML (``torchtitan/config/job_config.py``: ``[parallelism]``, ``[training]``,
  ``[activation_checkpoint]``, ``[model]``, ``[optimizer]``);
* an accelerate config (``accelerate config``'s YAML, ``accelerate/commands/config/config_args.py``, with its
  ``fsdp_config`` or ``deepspeed_config`` table).

:func:`read_launch_config` is pure (text in, :class:`LaunchConfig` out); reading the file is the caller's.
Every key a format defines that zerocalc does not model is listed in :attr:`LaunchConfig.unmodelled`, and a
setting zerocalc cannot honour (tensor or pipeline parallelism, a value it does not know) is an
:class:`~zerocalc.base.errors.InputError` naming the key, never dropped.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from zerocalc.base.errors import InputError


class LaunchFormat(StrEnum):
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    ACCELERATE = "accelerate"


@dataclass(frozen=True)
class LaunchConfig:
    """What a launch configuration says, as option values (keyword → value as the library takes it)."""

    values: dict[str, Any]
    notes: tuple[str, ...] = ()
    unmodelled: tuple[str, ...] = field(default=())
    """Keys of the file that zerocalc reads but does not model (dotted paths)."""

    def note_lines(self, source: str) -> list[str]:
        lines = [f"{source}: {note}" for note in self.notes]
        if self.unmodelled:
            lines.append(f"{source}: not modelled: {', '.join(self.unmodelled)}")
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
    writes). Lists and flow collections are refused in one line rather than misread."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for number, line in enumerate(text.splitlines(), 1):
        content = line.split(" #", 1)[0].rstrip()
        if not content.strip() or content.lstrip().startswith("#") or content.strip() == "---":
            continue
        indent = len(content) - len(content.lstrip())
        key, sep, value = content.strip().partition(":")
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
    return InputError(f"{where}: {key} {value!r} is not modelled; accepted: {accepted}")


# -------------------------------------------------------------------------------------------- DeepSpeed
_DS_STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
_DS_READ = {
    "zero_optimization.stage", "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device", "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size", "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_quantized_gradients",
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16.enabled", "fp16.enabled",
    "communication_data_type", "optimizer.type",
}  # fmt: skip
_DS_HARMLESS = {"train_batch_size", "steps_per_print", "wall_clock_breakdown", "gradient_clipping"}
"""Keys with no bearing on memory or communication per step (listed as not modelled all the same)."""


def _zero(values: dict[str, Any], where: str, get: Any, key: str) -> None:
    """A DeepSpeed ZeRO stage (``key``) as ``strategies``."""
    stage = get(key)
    if stage is not None:
        if stage not in _DS_STAGES:
            raise _refuse(where, key, stage, "0, 1, 2 or 3")
        values["strategies"] = _DS_STAGES[stage]


def _offload(values: dict[str, Any], where: str, get: Any, key: str, option: str) -> None:
    """A DeepSpeed offload device (``key``) as ``option``."""
    device = get(key)
    if device is not None:
        if str(device).lower() not in ("none", "cpu", "nvme"):
            raise _refuse(where, key, device, "none, cpu or nvme")
        values[option] = str(device).lower()


def _deepspeed(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(config)
    values: dict[str, Any] = {"framework": "deepspeed"}
    notes: list[str] = []
    for key, value in flat.items():
        if value == "auto":
            notes.append(
                f"{key} is 'auto' (filled in by the Hugging Face Trainer): zerocalc's default is used"
            )
    get = {k: v for k, v in flat.items() if v != "auto"}.get
    _zero(values, where, get, "zero_optimization.stage")
    _offload(values, where, get, "zero_optimization.offload_optimizer.device", "offload_optimizer")
    _offload(values, where, get, "zero_optimization.offload_param.device", "offload_params")
    for key, option in (
        ("zero_optimization.reduce_bucket_size", "reduce_bucket"),
        ("zero_optimization.allgather_bucket_size", "allgather_bucket"),
        ("train_micro_batch_size_per_gpu", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
    ):
        if get(key) is not None:
            values[option] = str(get(key))
    if get("bf16.enabled") and get("fp16.enabled"):
        raise _refuse(where, "bf16.enabled and fp16.enabled", True, "one of them")
    if get("bf16.enabled") is not None or get("fp16.enabled") is not None:
        values["precision"] = (
            "bf16-mixed" if get("bf16.enabled") else "fp16-mixed" if get("fp16.enabled") else "fp32"
        )
    if get("communication_data_type") is not None:
        values["reduce_dtype"] = str(get("communication_data_type"))
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
    unmodelled = sorted(k for k in flat if k not in _DS_READ and not k.startswith("optimizer.params"))
    return LaunchConfig(values=values, notes=tuple(notes), unmodelled=tuple(unmodelled))


# ------------------------------------------------------------------------------------------- torchtitan
_TITAN_MODELS = {
    ("llama3", "8B"): "llama-3-8b",
    ("llama3", "70B"): "llama-3-70b",
    ("llama3", "405B"): "llama-3.1-405b",
}
_TITAN_AC_MODES = ("none", "full", "selective")
_TITAN_SAC_DEFAULT = "2"
"""torchtitan ``ActivationCheckpoint.selective_ac_option``'s default (v0.2.2 ``config/job_config.py``)."""
_TITAN_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
_TITAN_REDUCE_DEFAULT = "float32"
"""``Training.mixed_precision_reduce``'s default (v0.2.2 ``config/job_config.py``, and ``config_manager.py``
at commit 9dec370): FSDP reduces gradients in fp32 unless the file says otherwise."""
_TITAN_READ = {
    "model.name", "model.flavor", "parallelism.data_parallel_shard_degree",
    "parallelism.data_parallel_replicate_degree", "parallelism.tensor_parallel_degree",
    "parallelism.pipeline_parallel_degree", "parallelism.context_parallel_degree",
    "parallelism.expert_parallel_degree", "parallelism.fsdp_reshard_after_forward",
    "training.local_batch_size", "training.batch_size", "training.seq_len",
    "training.mixed_precision_param", "training.mixed_precision_reduce", "activation_checkpoint.mode",
    "activation_checkpoint.selective_ac_option", "optimizer.name",
}  # fmt: skip


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


def _torchtitan(job: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(job)
    get = flat.get
    values: dict[str, Any] = {"framework": "fsdp2", "model_impl": "torchtitan"}
    notes: list[str] = []
    model = (get("model.name"), str(get("model.flavor")))
    if model in _TITAN_MODELS:
        values["model"] = _TITAN_MODELS[model]
    elif get("model.name") is not None:
        notes.append(f"model {model[0]} {model[1]} has no preset: give --model")
    for key in ("pipeline_parallel_degree", "expert_parallel_degree"):
        degree = get(f"parallelism.{key}")
        if degree not in (None, 1):
            raise _refuse(where, f"parallelism.{key}", degree, "1 (zerocalc models dp × cp × tp meshes)")
    model_parallel = 1
    for key, option in (("tensor_parallel_degree", "tp"), ("context_parallel_degree", "cp")):
        degree = get(f"parallelism.{key}")
        if degree is None:
            continue
        if not isinstance(degree, int) or degree < 1:
            raise _refuse(where, f"parallelism.{key}", degree, "a whole number of ranks, 1 or more")
        values[option] = str(degree)
        model_parallel *= degree
    shard = get("parallelism.data_parallel_shard_degree")
    replicate = get("parallelism.data_parallel_replicate_degree") or 1
    reshard = str(get("parallelism.fsdp_reshard_after_forward") or "default").lower()
    if reshard not in ("default", "always", "never"):
        raise _refuse(where, "parallelism.fsdp_reshard_after_forward", reshard, "default, always or never")
    if replicate > 1:
        if shard in (None, -1):
            raise _refuse(
                where, "parallelism.data_parallel_shard_degree", shard, "a degree with replicate > 1"
            )
        if model_parallel > 1:
            raise _refuse(
                where, "parallelism.data_parallel_replicate_degree", replicate,
                "1 with tensor or context parallelism (HSDP is modelled on data-parallel meshes)",
            )  # fmt: skip
        values["strategies"] = "hybrid_shard"
        values["gpus_per_node"] = str(shard)
        values["gpus"] = str(shard * replicate)
        notes.append(
            f"HSDP {replicate} × {shard}: the shard group is taken as the node (--gpus-per-node {shard})"
        )
    else:
        values["strategies"] = "shard_grad_op" if reshard == "never" else "zero3"
        if shard not in (None, -1):
            values["gpus"] = str(shard * model_parallel)
    batch = get("training.local_batch_size", get("training.batch_size"))
    if batch is not None:
        values["micro_batch"] = str(batch)
    if get("training.seq_len") is not None:
        values["seq_len"] = str(get("training.seq_len"))
    param = get("training.mixed_precision_param")
    if param is not None:
        if param not in _TITAN_DTYPES:
            raise _refuse(where, "training.mixed_precision_param", param, "bfloat16 or float32")
        values["precision"] = "bf16-mixed" if param == "bfloat16" else "fp32"
    reduce = get("training.mixed_precision_reduce", _TITAN_REDUCE_DEFAULT)
    if reduce not in _TITAN_DTYPES:
        raise _refuse(where, "training.mixed_precision_reduce", reduce, "bfloat16 or float32")
    values["reduce_dtype"] = _TITAN_DTYPES[reduce]
    mode = get("activation_checkpoint.mode")
    if mode is not None:
        if mode not in _TITAN_AC_MODES:
            raise _refuse(where, "activation_checkpoint.mode", mode, "none, full or selective")
        option = str(get("activation_checkpoint.selective_ac_option", _TITAN_SAC_DEFAULT))
        values.update({"recompute": mode} if mode != "selective" else _titan_selective(option, where))
    optimizer = get("optimizer.name")
    if optimizer is not None:
        if str(optimizer).lower() not in ("adam", "adamw"):
            raise _refuse(where, "optimizer.name", optimizer, "Adam or AdamW")
        values["optimizer"] = str(optimizer).lower()
    unmodelled = sorted(k for k in flat if k not in _TITAN_READ)
    return LaunchConfig(values=values, notes=tuple(notes), unmodelled=tuple(unmodelled))


# ------------------------------------------------------------------------------------------- accelerate
_FSDP1_STRATEGIES = {
    "FULL_SHARD": "zero3", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "ddp",
    "HYBRID_SHARD": "hybrid_shard", "1": "zero3", "2": "shard_grad_op", "3": "ddp", "4": "hybrid_shard",
}  # fmt: skip
_ACCELERATE_READ = {
    "distributed_type", "mixed_precision", "num_processes", "num_machines", "fsdp_config.fsdp_version",
    "fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_reshard_after_forward",
    "fsdp_config.fsdp_activation_checkpointing", "fsdp_config.fsdp_offload_params",
    "deepspeed_config.zero_stage", "deepspeed_config.offload_optimizer_device",
    "deepspeed_config.offload_param_device", "deepspeed_config.gradient_accumulation_steps",
    "deepspeed_config.zero3_init_flag",
}  # fmt: skip


def _accelerate(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = _flatten(config)
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
            strategy = str(get("fsdp_config.fsdp_sharding_strategy") or "FULL_SHARD").upper()
            if strategy not in _FSDP1_STRATEGIES:
                raise _refuse(
                    where, "fsdp_config.fsdp_sharding_strategy", strategy, ", ".join(_FSDP1_STRATEGIES)
                )
            values["strategies"] = _FSDP1_STRATEGIES[strategy]
        if get("fsdp_config.fsdp_activation_checkpointing"):
            values["recompute"] = "full"
        if get("fsdp_config.fsdp_offload_params"):
            values["offload_params"] = "cpu"
    elif kind == "DEEPSPEED":
        values["framework"] = "deepspeed"
        _zero(values, where, get, "deepspeed_config.zero_stage")
        _offload(values, where, get, "deepspeed_config.offload_optimizer_device", "offload_optimizer")
        _offload(values, where, get, "deepspeed_config.offload_param_device", "offload_params")
        if get("deepspeed_config.gradient_accumulation_steps") is not None:
            values["grad_accum"] = str(get("deepspeed_config.gradient_accumulation_steps"))
        if get("deepspeed_config.zero3_init_flag") is not None:  # deepspeed.zero.Init, or built on the host
            values["init"] = "meta" if get("deepspeed_config.zero3_init_flag") else "cpu"
    elif kind == "MULTI_GPU":
        values["framework"] = "ddp"
        values["strategies"] = "ddp"
    elif kind:
        raise _refuse(where, "distributed_type", kind, "FSDP, DEEPSPEED or MULTI_GPU")
    precision = get("mixed_precision")
    if precision is not None:
        mapped = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": "fp32"}.get(str(precision).lower())
        if mapped is None:
            raise _refuse(where, "mixed_precision", precision, "bf16, fp16 or no")
        values["precision"] = mapped
    processes = get("num_processes")
    if processes is not None:
        values["gpus"] = str(processes)
        machines = get("num_machines") or 1
        if processes % machines:
            raise _refuse(where, "num_processes", processes, f"a multiple of num_machines {machines}")
        values["gpus_per_node"] = str(processes // machines)
    unmodelled = sorted(k for k in flat if k not in _ACCELERATE_READ)
    return LaunchConfig(values=values, notes=tuple(notes), unmodelled=tuple(unmodelled))


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
        notes += config.note_lines(f"{kind.value} {Path(path).name}")
    return merged, notes
