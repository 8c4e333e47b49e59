"""A DeepSpeed config (``ds_config.json``; keys as in ``deepspeed/runtime/config.py`` and
``deepspeed/runtime/zero/config.py``, DeepSpeed 0.16) read into the options the flags give (pure); its ZeRO
stage, offload and integer readers are accelerate's too (its ``deepspeed_config`` table)."""

from __future__ import annotations

import re
from typing import Any

from zerocalc.base.errors import InputError, literal
from zerocalc.base.json_text import json_object
from zerocalc.request.launch_config import LaunchConfig, flatten, invalid, listed, refused
from zerocalc.request.launch_keys import (
    DEEPSPEED_KEYS,
    Sort,
    rule_of,
    shown_value,
    sort_keys,
)


def read_json(text: str, where: str) -> dict[str, Any]:
    return json_object(text, where, "a ds_config.json")


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


_DS_DTYPES = ("fp16", "bf16", "fp32")
"""``communication_data_type``'s values (DeepSpeed 0.19.8 ``runtime/config.py``
``get_communication_data_type``, case-insensitive)."""
_DS_OFFLOAD = ("none", "cpu", "nvme")
"""``OffloadDeviceEnum`` (DeepSpeed 0.19.8 ``runtime/zero/offload_config.py``)."""
_LAX_INT = re.compile(r"\s*[+-]?[0-9]+(?:\.0*)?\s*")
"""An integer as pydantic's lax mode reads one from a string (``"3"``, ``" 3"``, ``"3.0"``; not ``"5e8"``)."""


def ds_int(value: Any, key: str, where: str, least: int = 1, lax: bool = False) -> int:
    """A whole number a ds_config key holds: an int, or a float with no fraction (JSON's ``5e8``); with
    ``lax`` (a pydantic field of ``DeepSpeedZeroConfig``, validated in lax mode) also a string of digits."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif lax and isinstance(value, str) and _LAX_INT.fullmatch(value):
        value = int(float(value))
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise invalid(where, key, value, f"a whole number, {least} or more")
    return value


def ds_bool(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(where, key, value, "true or false")
    return value


def zero_stage(values: dict[str, Any], where: str, get: Any, key: str) -> None:
    """A DeepSpeed ZeRO stage (``key``) as ``strategies``; digits as DeepSpeed's pydantic config reads them
    (``ZeroStageEnum``, lax mode: ``"3"`` is stage 3)."""
    stage = get(key)
    if stage is not None:
        number = ds_int(stage, key, where, least=0, lax=True) if not isinstance(stage, bool) else -1
        stages = _modelled_stages()
        accepted = listed([f"{n} ({name})" for n, name in stages.items()])
        if number not in stages:
            raise (refused if number in _DS_STAGES else invalid)(where, key, stage, accepted)
        values["strategies"] = stages[number]


def offload_device(values: dict[str, Any], where: str, get: Any, key: str, option: str) -> None:
    """A DeepSpeed offload device (``key``) as ``option``."""
    device = get(key)
    if device is not None:
        if str(device).lower() not in _DS_OFFLOAD:
            raise invalid(where, key, device, ", ".join(_DS_OFFLOAD[:-1]) + f" or {_DS_OFFLOAD[-1]}")
        values[option] = str(device).lower()


def deepspeed_config(config: dict[str, Any], where: str) -> LaunchConfig:
    flat = flatten(config)
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
    zero_stage(values, where, get, "zero_optimization.stage")
    offload_device(values, where, get, "zero_optimization.offload_optimizer.device", "offload_optimizer")
    offload_device(values, where, get, "zero_optimization.offload_param.device", "offload_params")
    for key, option, least, lax in (
        ("zero_optimization.reduce_bucket_size", "reduce_bucket", 1, True),  # Field(gt=0)
        ("zero_optimization.allgather_bucket_size", "allgather_bucket", 0, True),  # Field(ge=0)
        ("train_micro_batch_size_per_gpu", "micro_batch", 1, False),  # get_scalar_param: as written
        ("gradient_accumulation_steps", "grad_accum", 1, False),
    ):
        if get(key) is not None:
            values[option] = str(ds_int(get(key), key, where, least, lax))
    for key in ("train_batch_size",):
        if get(key) is not None:
            ds_int(get(key), key, where)
    for key in (
        "bf16.enabled", "bfloat16.enabled", "fp16.enabled", "zero_optimization.overlap_comm",
        "zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients",
    ):  # fmt: skip
        if get(key) is not None:
            ds_bool(get(key), key, where)
    stage = ds_int(get("zero_optimization.stage", 0), "zero_optimization.stage", where, least=0, lax=True)
    if get("zero_optimization.overlap_comm") and stage in (1, 2):
        values["overlap_comm"] = True  # reductions beside backward (stage 3: its default)
    if get("zero_optimization.zero_hpz_partition_size") is not None:
        ds_int(get("zero_optimization.zero_hpz_partition_size"), "zero_optimization.zero_hpz_partition_size",
                where, least=0, lax=True)  # fmt: skip
    per_gpu = all(
        get(key) is not None or key in auto
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    )
    _ds_checked(get, where, per_gpu)
    bf16 = get("bf16.enabled", get("bfloat16.enabled"))
    if bf16 and get("fp16.enabled"):
        raise refused(where, "bf16.enabled and fp16.enabled", True, "one of them")
    if bf16 is not None or get("fp16.enabled") is not None:
        values["precision"] = "bf16-mixed" if bf16 else "fp16-mixed" if get("fp16.enabled") else "fp32"
    dtype = get("communication_data_type")
    if dtype is not None:
        if str(dtype).lower() not in _DS_DTYPES:
            raise invalid(
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
            raise refused(where, "optimizer.type", optimizer, "Adam or AdamW")
        values["optimizer"] = name
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless)


def _ds_checked(get: Any, where: str, per_gpu: bool) -> None:
    """The modelled keys that set no option, checked against what zerocalc models: ``overlap_comm`` at its
    default for the stage (``DeepSpeedZeroConfig.overlap_comm_valid``: on for ZeRO-3, off below; the step
    model overlaps ZeRO-3's collectives and exposes ZeRO-1/2's reductions, :mod:`zerocalc.comm.step`), and
    ``train_batch_size`` only beside the micro-batch and accumulation it would otherwise derive from the
    world (``DeepSpeedConfig._set_batch_related_parameters``)."""
    stage = ds_int(get("zero_optimization.stage", 0), "zero_optimization.stage", where, least=0, lax=True)
    overlap = get("zero_optimization.overlap_comm")
    if overlap is not None and overlap != (stage == 3) and not (overlap and stage in (1, 2)):
        what = "reductions overlapped with backward" if overlap else "ZeRO-3's collectives not overlapped"
        raise InputError(
            f"{where}: zero_optimization.overlap_comm {overlap!r} is not modelled ({what}: zerocalc's step "
            f"time models DeepSpeed's default for stage {stage}); accepted: {shown_value(stage == 3)} (or "
            "leave it out)"
        )
    if get("train_batch_size") is not None and not per_gpu:
        raise refused(
            where, "train_batch_size", get("train_batch_size"),
            "train_micro_batch_size_per_gpu and gradient_accumulation_steps given beside it (DeepSpeed "
            "derives the missing one from the world size)",
        )  # fmt: skip
