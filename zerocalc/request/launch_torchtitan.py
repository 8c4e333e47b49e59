"""A torchtitan job TOML (``torchtitan/config/job_config.py``, v0.2.2: ``[parallelism]``, ``[training]``,
``[activation_checkpoint]``, ``[model]``, ``[optimizer]``; and the older layout of ``config_manager.py`` at
commit 9dec370, whose degrees are under ``[training]`` and ``[experimental]``) read into the options the
flags give (pure); its pipeline split is :mod:`zerocalc.request.launch_titan_stages`'s."""

from __future__ import annotations

import tomllib
from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.model.code.compiled import Compiled
from zerocalc.request.launch_config import LaunchConfig, flatten, invalid, refused, whole
from zerocalc.request.launch_keys import (
    TORCHTITAN_KEYS,
    sort_keys,
)
from zerocalc.request.launch_titan_stages import TitanStages


def read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where} is not TOML ({exc}); accepted: a torchtitan job TOML") from None


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


def _titan_selective(option: str, where: str) -> dict[str, str]:
    """``mode = "selective"`` by its ``selective_ac_option`` (v0.2.2 ``distributed/activation_checkpoint.py``
    ``_apply_ac_to_transformer_block``): ``op`` is the op-level policy (``--recompute op``); a whole number
    N checkpoints every N-th block whole (``_apply_layer_sac``: ``not ac_freq or count % ac_freq == 0``):
    ``--recompute full --checkpoint-every N``, every block for 0 and 1."""
    if option == "op":
        return {"recompute": "op"}
    if option.isdigit():
        return {"recompute": "full", "checkpoint_every": str(max(1, int(option)))}
    raise refused(
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
                raise refused(
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
        raise refused(
            where,
            name("parallelism.pipeline_parallel_schedule_csv"),
            csv,
            f"none: a schedule by name, {_TITAN_SCHEDULES_ACCEPTED}",
        )
    schedule = str(get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if schedule.lower() not in _TITAN_SCHEDULES:
        raise refused(where, schedule_key, schedule, _TITAN_SCHEDULES_ACCEPTED)
    zerocalc_schedule, multi_stage = _TITAN_SCHEDULES[schedule.lower()]
    batch_key = name("training.local_batch_size")
    batch = whole(get("training.local_batch_size", _TITAN_LOCAL_BATCH_DEFAULT), batch_key, where)
    counted = get(_TITAN_COUNTED) is not None or name("parallelism.pipeline_parallel_degree") != (
        "parallelism.pipeline_parallel_degree"
    )
    if counted:
        mixed = [key for key in _TITAN_SIZED if get(key) is not None]
        if mixed:
            raise refused(
                where, f"{name(_TITAN_COUNTED)} with {mixed[0]}", get(mixed[0]), "one layout's keys"
            )
        count_key = name(_TITAN_COUNTED)
        if get(_TITAN_COUNTED) is None:
            section = name("parallelism.pipeline_parallel_degree").split(".")[0]
            count_key = f"{section}.pipeline_parallel_microbatches (unset: the pipeline degree)"
        micro_batches = whole(get(_TITAN_COUNTED, pp), count_key, where)
        if batch % micro_batches:
            raise refused(where, count_key, micro_batches, f"a divisor of {batch_key} {batch}")
        micro_batch = batch // micro_batches
    else:
        micro_batch = whole(
            get("parallelism.pipeline_parallel_microbatch_size", 1),
            "parallelism.pipeline_parallel_microbatch_size",
            where,
        )
        if batch % micro_batch:
            raise refused(
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
        first_weight=whole(
            get("parallelism.pipeline_parallel_first_stage_less_layers", 1),
            "parallelism.pipeline_parallel_first_stage_less_layers",
            where,
            0,
        ),
        last_weight=whole(
            get("parallelism.pipeline_parallel_last_stage_less_layers", 1),
            "parallelism.pipeline_parallel_last_stage_less_layers",
            where,
            0,
        ),
        layers_per_stage=None
        if layers_per_stage is None
        else whole(layers_per_stage, "parallelism.pipeline_parallel_layers_per_stage", where),
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
    total = whole(total, key, where)
    if shard in (None, -1):
        raise refused(
            where, key, total, f"-1, or {name('parallelism.data_parallel_shard_degree')} given beside it"
        )
    dp = shard * replicate
    if total % (batch * dp):
        raise invalid(where, key, total, f"a multiple of local_batch_size × dp = {batch} × {dp}")
    steps = total // (batch * dp)
    if steps > 1 and pp > 1:
        raise refused(where, key, total, f"{batch * dp} (no accumulation over a pipeline's micro-batches)")
    if steps > 1:
        values["grad_accum"] = str(steps)


def _titan_optimizer_impl(get: Any, where: str, older: bool) -> str:
    """``--optimizer-impl`` from ``optimizer.implementation`` (or the older ``optimizer.fused``), else
    the file's layout's default."""
    fused = get("optimizer.fused")
    if fused is not None:
        if not isinstance(fused, bool):
            raise invalid(where, "optimizer.fused", fused, "true or false")
        return "fused" if fused else "foreach"
    implementation = get("optimizer.implementation", "foreach" if older else _TITAN_IMPLEMENTATION_DEFAULT)
    if implementation not in _TITAN_IMPLEMENTATIONS:
        raise invalid(where, "optimizer.implementation", implementation, ", ".join(_TITAN_IMPLEMENTATIONS))
    return str(implementation)


def _titan_part_layers(fqns: Any, where: str) -> list[int]:
    """The transformer layers (``layers.N``) of each model part of ``module_fqns_per_model_part``."""
    if not isinstance(fqns, list) or not all(isinstance(part, list) for part in fqns):
        raise refused(
            where, "parallelism.module_fqns_per_model_part", fqns, "a list of lists of module names"
        )
    return [
        sum(1 for module in part if str(module).startswith("layers.") and str(module)[7:].isdigit())
        for part in fqns
    ]


def torchtitan_config(job: dict[str, Any], where: str) -> LaunchConfig:
    original = flatten(job)
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
            raise refused(where, name(f"parallelism.{key}"), degree, "a whole number of ranks, 1 or more")
        degrees[option] = degree
        values[option] = str(degree)
    tp, cp, pp, ep = degrees["tp"], degrees["cp"], degrees["pp"], degrees["ep"]
    if ep > 1:
        expert_tp = get("parallelism.expert_tensor_parallel_degree", 1)
        if expert_tp != tp:
            raise refused(
                where, "parallelism.expert_tensor_parallel_degree", expert_tp,
                f"{tp}, the tensor-parallel degree (EP groups carved from dp_shard × cp, t apart)",
            )  # fmt: skip
    shard = get("parallelism.data_parallel_shard_degree")
    replicate = get("parallelism.data_parallel_replicate_degree") or 1
    reshard = str(get("parallelism.fsdp_reshard_after_forward") or "default").lower()
    if reshard not in ("default", "always", "never"):
        raise refused(
            where, name("parallelism.fsdp_reshard_after_forward"), reshard, "default, always or never"
        )
    if replicate > 1:
        if shard in (None, -1):
            raise refused(
                where, name("parallelism.data_parallel_shard_degree"), shard, "a degree with replicate > 1"
            )
        if tp * cp * pp * ep > 1:
            raise refused(
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
    batch = whole(
        get("training.local_batch_size", _TITAN_LOCAL_BATCH_DEFAULT), name("training.local_batch_size"), where
    )
    values["micro_batch"] = str(batch)
    stages = _titan_pipeline(get, name, where, pp, values) if pp > 1 else None
    _titan_accumulation(get, name, where, values, batch, shard, replicate, pp)
    values["optimizer_impl"] = _titan_optimizer_impl(get, where, bool(spelled))
    if get("training.seq_len") is not None:
        values["seq_len"] = str(whole(get("training.seq_len"), name("training.seq_len"), where))
    param = get("training.mixed_precision_param")
    if param is not None:
        if param not in _TITAN_DTYPES:
            raise refused(where, "training.mixed_precision_param", param, "bfloat16 or float32")
        values["precision"] = "bf16-mixed" if param == "bfloat16" else "fp32"
    reduce = get("training.mixed_precision_reduce", _TITAN_REDUCE_DEFAULT)
    if reduce not in _TITAN_DTYPES:
        raise refused(where, "training.mixed_precision_reduce", reduce, "bfloat16 or float32")
    values["reduce_dtype"] = _TITAN_DTYPES[reduce]
    mode = get("activation_checkpoint.mode", _TITAN_AC_DEFAULT)
    if mode not in _TITAN_AC_MODES:
        raise refused(where, "activation_checkpoint.mode", mode, "none, full or selective")
    option = str(get("activation_checkpoint.selective_ac_option", _TITAN_SAC_DEFAULT))
    values.update({"recompute": mode} if mode != "selective" else _titan_selective(option, where))
    optimizer = get("optimizer.name")
    if optimizer is not None:
        if str(optimizer).lower() not in ("adam", "adamw"):
            raise refused(where, "optimizer.name", optimizer, "Adam or AdamW")
        values["optimizer"] = str(optimizer).lower()
    if get("optimizer.early_step_in_backward"):
        # v0.2.2 components/optimizer.py OptimizersInBackwardContainer: one optimizer per parameter, stepped
        # in its post-accumulate-grad hook (refused by torchtitan with pipeline or expert parallelism)
        values["optimizer_in_backward"] = True
    _titan_fp8(get, where, values, notes)
    _titan_compile(get, where, values, notes, bool(spelled))
    return LaunchConfig(values=values, notes=tuple(notes), harmless=harmless, stages=stages)


_TITAN_COMPILE_COMPONENTS = ("model", "loss")
"""What v0.2.2's ``compile.components`` names (``config/job_config.py::Compile``, its default both)."""


def _titan_compile(get: Any, where: str, values: dict[str, Any], notes: list[str], older: bool) -> None:
    """torch.compile (:mod:`zerocalc.model.code.compiled`): v0.2.2's ``compile.enable`` with
    ``compile.components`` (default model and loss) and ``compile.backend`` (inductor: what zerocalc
    prices); the older layouts' ``training.compile``, the blocks alone at commit 9dec370 (its loss's compile
    commented out, ``train.py``) and the blocks and the loss at v0.1.0 (``components/loss.py``); async TP
    (``parallelism.enable_async_tensor_parallel``, the older ``experimental.`` one) → ``--async-tp``."""
    if get("compile.enable"):
        components = get("compile.components", list(_TITAN_COMPILE_COMPONENTS))
        if isinstance(components, str):
            components = [c.strip() for c in components.split(",") if c.strip()]
        if not isinstance(components, list) or any(c not in _TITAN_COMPILE_COMPONENTS for c in components):
            raise invalid(where, "compile.components", components, "a list of model and loss")
        backend = get("compile.backend", "inductor")
        if backend != "inductor":
            raise refused(where, "compile.backend", backend, "inductor (the fused kernels zerocalc prices)")
        values["compile"] = Compiled.of("model" in components, "loss" in components).value
    elif get("training.compile"):
        values["compile"] = (Compiled.MODEL if older else Compiled.MODEL_LOSS).value
        notes.append(
            "training.compile: "
            + ("the blocks alone (commit 9dec370's layout)" if older else "the blocks and the loss (v0.1.0)")
        )
    for key in ("parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel"):
        if get(key):
            values["async_tp"] = True


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
        raise refused(where, "model.converters", converters, "a list of converter names")
    others = [c for c in converters if c not in _TITAN_FP8_CONVERTERS]
    if others:
        raise refused(
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
        raise refused(where, recipe_key, recipe, "tensorwise, rowwise or rowwise_with_gw_hp")
    if recipe is not None and gather:
        raise refused(
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
