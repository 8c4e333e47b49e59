"""An accelerate config (``accelerate config``'s YAML, ``accelerate/commands/config/config_args.py``, with
its ``fsdp_config`` or ``deepspeed_config`` table) read into the options the flags give (pure)."""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.request.launch_config import LaunchConfig, flatten, invalid, refused, whole
from zerocalc.request.launch_deepspeed import ds_bool, ds_int, offload_device, zero_stage
from zerocalc.request.launch_keys import (
    ACCELERATE_KEYS,
    FP8,
    sort_keys,
)


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


def read_yaml(text: str, where: str) -> dict[str, Any]:
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
        raise refused(where, shown, policy, f"{_FSDP_WRAP} (a unit per decoder block)")
    if version == 2:
        return
    key = "fsdp_config.fsdp_backward_prefetch"
    prefetch = str(get(key, _FSDP1_PREFETCH_DEFAULT)).upper()
    if prefetch != _FSDP1_PREFETCH:
        shown = key if get(key) is not None else f"{key} (unset: accelerate's {_FSDP1_PREFETCH_DEFAULT})"
        raise refused(where, shown, prefetch, f"{_FSDP1_PREFETCH} (or fsdp_version 2)")
    if get("fsdp_config.fsdp_use_orig_params"):
        raise refused(where, "fsdp_config.fsdp_use_orig_params", True, "false (or fsdp_version 2)")


def accelerate_config(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = flatten(config)
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
                raise refused(where, key, strategy, ", ".join(_FSDP1_STRATEGIES))
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
        zero_stage(values, where, get, "deepspeed_config.zero_stage")
        offload_device(values, where, get, "deepspeed_config.offload_optimizer_device", "offload_optimizer")
        offload_device(values, where, get, "deepspeed_config.offload_param_device", "offload_params")
        key = "deepspeed_config.gradient_accumulation_steps"
        if get(key) is not None:
            values["grad_accum"] = str(ds_int(get(key), key, where))
        key = "deepspeed_config.zero3_init_flag"
        if get(key) is not None:  # deepspeed.zero.Init, or built on the host
            values["init"] = "meta" if ds_bool(get(key), key, where) else "cpu"
    elif kind == "MULTI_GPU":
        values["framework"] = "ddp"
        values["strategies"] = "ddp"
    elif kind:
        raise refused(where, "distributed_type", kind, _ACCELERATE_TYPES)
    else:  # BaseConfig.process_config: "A `distributed_type` must be specified in the config file."
        raise InputError(
            f"{where} has no distributed_type (accelerate requires one); accepted: {_ACCELERATE_TYPES}"
        )
    precision = get("mixed_precision")
    if precision is not None:
        mapped = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": "fp32"}.get(str(precision).lower())
        if str(precision).lower() == "fp8":
            raise refused(where, "mixed_precision", precision, f"bf16, fp16 or no ({FP8})")
        if mapped is None:
            raise invalid(where, "mixed_precision", precision, "bf16, fp16 or no")
        values["precision"] = mapped
    processes = get("num_processes")
    machines = whole(get("num_machines", 1), "num_machines", where)
    if processes == -1:  # ClusterConfig's default: the launcher's command line gives it
        notes.append("num_processes -1 (given at launch): --gpus is used")
    elif processes is not None:
        processes = whole(processes, "num_processes", where)
        values["gpus"] = str(processes)
        if processes % machines:
            raise refused(where, "num_processes", processes, f"a multiple of num_machines {machines}")
        values["gpus_per_node"] = str(processes // machines)
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless)
