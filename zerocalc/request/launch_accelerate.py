"""An accelerate config (``accelerate config``'s YAML, ``accelerate/commands/config/config_args.py``, with
its ``fsdp_config`` or ``deepspeed_config`` table) read into the options the flags give (pure)."""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.request.launch_config import LaunchConfig, flatten, invalid, refused, whole
from zerocalc.request.launch_deepspeed import ds_bool, ds_int, offload_device, zero_stage
from zerocalc.request.launch_keys import ACCELERATE_KEYS, sort_keys


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
    fp8 = str(precision).lower() == "fp8"
    if precision is not None:
        mapped = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": "fp32", "fp8": "bf16-mixed"}
        if str(precision).lower() not in mapped:
            raise invalid(where, "mixed_precision", precision, "bf16, fp16, fp8 or no")
        values["precision"] = mapped[str(precision).lower()]
    if fp8:
        _accelerate_fp8(get, where, kind, values, notes)
    elif any(key.startswith("fp8_config.") for key in flat):
        notes.append("fp8_config: read only with mixed_precision fp8; not applied")
    _accelerate_compile(get, where, values)
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
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless, fp8_skip_of_model=fp8)


_FP8_BACKENDS = "AO (torchao) under distributed_type FSDP with fsdp_version 2"


def _accelerate_fp8(get: Any, where: str, kind: str, values: dict[str, Any], notes: list[str]) -> None:
    """``mixed_precision: fp8`` and its ``fp8_config`` (accelerate 1.16.0). The launcher exports each key as
    ``ACCELERATE_FP8_<KEY>`` (``commands/launch.py``, ``utils/launch.py`` ``setup_fp8_env``), which the
    backend's recipe reads; ``Accelerator`` keeps bf16 beneath (``FullyShardedDataParallelPlugin.
    set_mixed_precision``: ``"fp8": torch.bfloat16``; ``utils/modeling.py`` bf16 autocast).

    * ``backend: AO``: ``AORecipeKwargs`` builds torchao's ``Float8LinearConfig(pad_inner_dim,
      enable_fsdp_float8_all_gather)``, both true unless the file says otherwise: the tensorwise recipe, and
      under FSDP2 the float8 all-gather, whose scales ``Accelerator._prepare_ao`` precomputes after each
      optimizer step (``precompute_float8_dynamic_scale_for_fsdp`` as a step post-hook);
      ``convert_model_to_fp8_ao`` leaves the first and last ``nn.Linear`` in high precision (the request's
      ``fp8_skip``, set from the model: :func:`~zerocalc.parallel.fp8.accelerate_ao_skip`). zerocalc's
      torchao recipes run under FSDP2 only (its framework record); ``Accelerator.__init__`` refuses torchao
      with FSDP2's ``cpu_ram_efficient_loading``.
    * ``backend: TE`` (``utils/transformer_engine.py``: ``convert_model`` swaps ``nn.Linear`` for
      ``te.Linear``, ``fp8_autocast`` with ``DelayedScaling``): refused, zerocalc models Transformer
      Engine's recipes under Megatron-LM only; ``MSAMP`` (removed in 1.16.0) refused; unset, accelerate
      picks torchao where it is installed and Transformer Engine otherwise, which a file cannot say:
      refused."""
    key = "fp8_config.backend"
    backend = get(key)
    if backend is None:
        raise InputError(
            f"{where}: mixed_precision 'fp8' without {key} is not modelled (accelerate then picks torchao "
            f"where it is installed, else Transformer Engine); accepted: {key} {_FP8_BACKENDS}"
        )
    name = str(backend).upper()
    if name == "TE":
        why = (
            "accelerate's te.Linear swap, utils/transformer_engine.py, is not modelled: zerocalc runs "
            "Transformer Engine's recipes under --framework megatron only"
        )
        raise refused(where, key, backend, f"{_FP8_BACKENDS} ({why})")
    if name == "MSAMP":
        raise refused(where, key, backend, f"{_FP8_BACKENDS} (MS-AMP, removed in accelerate 1.16.0)")
    if name != "AO":
        raise invalid(where, key, backend, "AO or TE")
    if values.get("framework") != "fsdp2":
        under = f"{kind}{' with fsdp_version 1' if kind == 'FSDP' else ''}"
        raise InputError(
            f"{where}: {key} {backend!r} under distributed_type {under} is not modelled (zerocalc runs "
            f"torchao's float8 under FSDP2 only); accepted: {_FP8_BACKENDS}"
        )
    if get("fsdp_config.fsdp_cpu_ram_efficient_loading"):
        raise InputError(
            f"{where}: fsdp_config.fsdp_cpu_ram_efficient_loading True with {key} {backend!r}: accelerate "
            'refuses it ("torchao with FSDP2 and cpu_ram_efficient_loading is not supported"); accepted: '
            "fsdp_cpu_ram_efficient_loading false"
        )
    gather_key = "fp8_config.enable_fsdp_float8_all_gather"
    gather = get(gather_key, True)
    if not isinstance(gather, bool):
        raise invalid(where, gather_key, gather, "true or false")
    values["fp8"] = "tensorwise"
    if gather:
        values["fp8_all_gather"] = True
        values["fp8_precompute_scales"] = True
    notes.append(
        f"{key} AO: torchao tensorwise{', all-gathered in fp8' if gather else ''}; accelerate leaves the "
        "model's first and last nn.Linear in high precision (--fp8-skip follows the model)"
    )


_INDUCTOR_MODES = ("default", "max-autotune-no-cudagraphs")
"""torch.compile's modes that run Inductor's kernels without CUDA graphs (``reduce-overhead`` and
``max-autotune`` capture CUDA graphs, whose static memory and launch savings are not modelled)."""


def _accelerate_compile(get: Any, where: str, values: dict[str, Any]) -> None:
    """``dynamo_config.dynamo_backend`` (the older top-level ``dynamo_backend``; accelerate 1.16.0
    ``utils/dataclasses.py`` ``TorchDynamoPlugin``, ``DynamoBackend``): INDUCTOR with a mode without CUDA
    graphs → ``--compile model`` (``Accelerator.prepare_model``: ``torch.compile(model)``, the whole forward
    with transformers' loss); NO → none; another backend or mode, and regional compilation, refused."""
    key = next(
        (k for k in ("dynamo_config.dynamo_backend", "dynamo_backend") if get(k) is not None),
        "dynamo_config.dynamo_backend",
    )
    backend = str(get(key) or "NO").upper()
    if backend == "NO":
        return
    if backend != "INDUCTOR":
        raise refused(where, key, get(key), "INDUCTOR (the fused kernels zerocalc prices) or NO")
    mode = str(get("dynamo_config.dynamo_mode") or "default")
    if mode not in _INDUCTOR_MODES:
        raise refused(
            where, "dynamo_config.dynamo_mode", mode,
            f"{' or '.join(_INDUCTOR_MODES)} (no CUDA graphs: their static buffers and launches are not "
            "modelled)",
        )  # fmt: skip
    if get("dynamo_config.dynamo_use_regional_compilation"):
        raise refused(
            where, "dynamo_config.dynamo_use_regional_compilation", True,
            "false (the whole forward compiled: what zerocalc prices for transformers' code)",
        )  # fmt: skip
    values["compile"] = "model"
