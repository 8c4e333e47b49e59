"""The fine-tuning options, PEFT's ``adapter_config.json`` and config.json's ``quantization_config``, parsed
once into the typed :class:`~zerocalc.parallel.finetune.FineTuning` a request carries.

Every key of the two files is modelled, harmless (it changes no byte: a scaling, an initialisation, a
name) or refused with the value and what is accepted; none is ignored. Flags override the files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.base.dtypes import DType, parse_dtype
from zerocalc.base.errors import InputError, shown, why_not
from zerocalc.base.paths import user_path
from zerocalc.base.units import parse_fraction, parse_whole
from zerocalc.model.activations import Recompute
from zerocalc.model.adapters import ALL_LINEAR, peft_plan
from zerocalc.model.hf_modules import ModuleClass
from zerocalc.model.quantized import QuantMethod
from zerocalc.parallel.finetune import (
    QUANT_STORAGE,
    FineTuning,
    LoraConfig,
    QuantConfig,
    parameter_kinds,
    quantized_module_names,
)
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.framework_records.record import StatesModel, Wrap
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import RECIPES, Fp8RecipeName, ParamLayout, PrecisionName
from zerocalc.parallel.strategies import OffloadTarget
from zerocalc.request.options import LORA_FIELDS, MEMORY
from zerocalc.request.options import given as option_given
from zerocalc.request.values import choice

if TYPE_CHECKING:
    from zerocalc.parallel.framework_records.record import FrameworkRecord
    from zerocalc.request.training import ModelSpec, TrainingOptions, TrainingRequest

MAX_LORA_RANK = 2**16
"""The largest r accepted (65,536: above any layer's width worth adapting)."""

QUANT_FIELDS = ("double_quant", "quant_storage", "kbit_prepare")
"""The options that describe a quantised base (each needs one)."""

# ------------------------------------------------------------------------------ adapter_config.json
ADAPTER_MODELLED = {
    "r": "rank",
    "lora_alpha": "alpha",
    "target_modules": "targets",
    "lora_dropout": "dropout",
    "use_dora": "dora",
    "modules_to_save": "modules_to_save",
}
"""PEFT 0.21 ``LoraConfig`` keys (peft/tuners/lora/config.py) that set :class:`LoraConfig` fields."""

ADAPTER_HARMLESS = frozenset({
    "task_type", "peft_version", "base_model_name_or_path", "revision", "auto_mapping",
    "inference_mode",  # save_pretrained writes true; training loads with is_trainable=True
    "fan_in_fan_out",  # Conv1D's weight layout: the same tensors
    "use_rslora",  # the scaling lora_alpha / sqrt(r): no byte
    "alpha_pattern",  # per-layer alphas: scalings
    "megatron_core", "qalora_group_size", "runtime_config",
})  # fmt: skip
"""Keys that change no tensor: names, scalings, layouts of the same bytes."""

ADAPTER_DEFAULTS: dict[str, Any] = {
    "peft_type": "LORA",
    "bias": "none",
    "exclude_modules": None,
    "layers_to_transform": None,
    "layers_pattern": None,
    "rank_pattern": {},
    "megatron_config": None,
    "trainable_token_indices": None,
    "loftq_config": {},
    "eva_config": None,
    "corda_config": None,
    "lora_ga_config": None,
    "velora_config": None,
    "alora_invocation_tokens": None,
    "use_qalora": False,
    "monteclora_config": None,
    "layer_replication": None,
    "lora_bias": False,
    "target_parameters": None,
    "use_bdlora": None,
    "arrow_config": None,
    "kasa_config": None,
    "ensure_weight_tying": False,
}
"""Keys of features zerocalc does not model: accepted at PEFT's default (``LoraConfig``'s), refused
otherwise (they add or reshape tensors: biases, per-layer ranks, replicated layers, trainable tokens)."""

INIT_HARMLESS = (True, False, "gaussian", "pissa", "olora")
"""``init_lora_weights`` values that fill the same tensors (PiSSA and OLoRA rewrite the base weight in
place); the data-driven ones (eva, corda, lora-ga, loftq) are refused."""


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value is False


def read_adapter_config(path: str) -> dict[str, Any]:
    """A PEFT ``adapter_config.json`` → the :class:`LoraConfig` fields it sets."""
    import json  # with json_text: loaded where a file is read, not at start-up

    from zerocalc.base.json_text import json_object

    where = f"{{adapter_config}} {shown(path)}"
    try:
        raw = user_path(path).read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte
        raise InputError(f"{where} cannot be read ({why_not(exc)}); accepted: a readable JSON file") from exc
    config = json_object(raw, where, "PEFT's adapter_config.json")
    fields: dict[str, Any] = {}
    for key, value in config.items():
        if key in ADAPTER_MODELLED:
            fields[ADAPTER_MODELLED[key]] = value
        elif key in ADAPTER_HARMLESS:
            continue
        elif key == "init_lora_weights":
            if value not in INIT_HARMLESS:
                accepted = ", ".join(json.dumps(v) for v in INIT_HARMLESS)
                raise InputError(
                    f"{where}: init_lora_weights {shown(value)} is not modelled (a data-driven "
                    f"initialisation may change the ranks); accepted: {accepted}"
                )
        elif key in ADAPTER_DEFAULTS:
            default = ADAPTER_DEFAULTS[key]
            if value != default and not (_empty(value) and _empty(default)):
                raise InputError(
                    f"{where}: {key} {shown(value)} is not modelled; accepted: {json.dumps(default)} "
                    "(PEFT 0.21's default)"
                )
        else:
            raise InputError(
                f"{where}: {shown(key)} is not a PEFT 0.21 LoraConfig key; accepted: its keys "
                "(peft/tuners/lora/config.py)"
            )
    if "rank" not in fields:
        raise InputError(f"{where} has no r; accepted: a LoRA adapter_config.json with r")
    return fields


# ------------------------------------------------------------------------------ quantization_config
QUANT_HARMLESS = frozenset({
    "quant_method",  # checked: bitsandbytes
    "llm_int8_threshold",  # LLM.int8's outlier threshold: compute, not storage
    "_load_in_4bit", "_load_in_8bit",  # the properties' stored values (to_dict writes both)
})  # fmt: skip
"""``BitsAndBytesConfig`` keys (transformers 5.17 utils/quantization_config.py) that change no byte."""

QUANT_DEFAULTS: dict[str, Any] = {
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
}
"""Keys accepted at their default only: fp32 CPU offload of modules (a device map), and int8 weights kept
fp16 and trainable (no quantised storage)."""

_TORCH_DTYPE_NAMES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "uint8": "uint8",
    "int8": "int8",
}


def quantization_from_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """A config.json's ``quantization_config`` (bitsandbytes: ``BitsAndBytesConfig.to_dict()``) → the
    :class:`QuantConfig` fields it sets; other methods were refused when the model was read."""
    import json

    where = f"{where}: quantization_config"
    four = config.get("load_in_4bit", config.get("_load_in_4bit", False))
    eight = config.get("load_in_8bit", config.get("_load_in_8bit", False))
    if four and eight:
        raise InputError(f"{where} loads in 4 and 8 bits; accepted: one of load_in_4bit, load_in_8bit")
    if not (four or eight):
        raise InputError(f"{where} loads in neither 4 nor 8 bits; accepted: load_in_4bit or load_in_8bit")
    fields: dict[str, Any] = {}
    for key, value in config.items():
        if key in QUANT_HARMLESS or key in ("load_in_4bit", "load_in_8bit"):
            continue
        if key in QUANT_DEFAULTS:
            if value != QUANT_DEFAULTS[key]:
                raise InputError(
                    f"{where}: {key} {shown(value)} is not modelled; accepted: "
                    f"{json.dumps(QUANT_DEFAULTS[key])}"
                )
        elif key == "bnb_4bit_quant_type":
            if four:
                fields["method"] = _choice_of(value, f"{where}: bnb_4bit_quant_type", ("nf4", "fp4"))
        elif key == "bnb_4bit_use_double_quant":
            if four:
                fields["double_quant"] = bool(value)
        elif key in ("bnb_4bit_quant_storage", "bnb_4bit_compute_dtype"):
            if four and value is not None:
                name = _TORCH_DTYPE_NAMES.get(str(value).removeprefix("torch."), str(value))
                allowed = (
                    QUANT_STORAGE if key == "bnb_4bit_quant_storage" else (DType.BF16, DType.FP16, DType.FP32)
                )
                dtype = parse_dtype(name, f"{where}: {key}", allowed)
                fields["storage" if key == "bnb_4bit_quant_storage" else "compute_dtype"] = dtype
        elif key == "llm_int8_skip_modules":
            if value is not None:
                fields["skip_modules"] = tuple(str(v) for v in value)
        else:
            raise InputError(
                f"{where}: {shown(key)} is not a BitsAndBytesConfig key; accepted: its keys "
                "(transformers utils/quantization_config.py)"
            )
    if four:
        fields.setdefault("method", QuantMethod.FP4)  # BitsAndBytesConfig's bnb_4bit_quant_type default
    else:
        fields["method"] = QuantMethod.INT8
    return fields


def _choice_of(value: Any, what: str, accepted: tuple[str, ...]) -> QuantMethod:
    key = str(value).strip().lower()
    if key not in accepted:
        raise InputError(f"{what} {shown(value)} is not accepted; accepted: {', '.join(accepted)}")
    return QuantMethod(key)


# ----------------------------------------------------------------------------------------- options
def _names(text: str | list[str] | tuple[str, ...], what: str) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else [str(t) for t in text]
    names = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
    if not names:
        raise InputError(f"{what} {shown(text)} names no module; accepted: a comma list of module names")
    return names


def _switch(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _lora(o: TrainingOptions) -> LoraConfig | None:
    fields: dict[str, Any] = {}
    if o.adapter_config is not None:
        fields = read_adapter_config(o.adapter_config)
    rank = fields.get("rank")
    if (
        o.lora_rank is None
        and rank is not None
        and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1)
    ):
        raise InputError(
            f"{{adapter_config}} {shown(o.adapter_config)}: r {shown(rank)} is not accepted; accepted: a "
            "whole number ≥ 1"
        )
    if o.lora_rank is not None:
        rank = parse_whole(o.lora_rank, "{lora_rank}", 0, MAX_LORA_RANK, "the rank r")
    given = [name for name in LORA_FIELDS[1:] if option_given(MEMORY, name, getattr(o, name))]
    if not rank:
        if given or o.adapter_config is not None:
            raise InputError(
                f"{{{given[0] if given else 'adapter_config'}}} describes LoRA, which is off without a rank; "
                "accepted: with {lora_rank} R > 0 (or {adapter_config}'s r)"
            )
        return None
    fields["rank"] = rank
    if o.lora_alpha is not None:
        fields["alpha"] = parse_fraction(o.lora_alpha, "{lora_alpha}", 1e-9, 1e9, "a number > 0")
    if o.lora_dropout is not None:
        fields["dropout"] = parse_fraction(o.lora_dropout, "{lora_dropout}", 0, 0.999999, "0 ≤ P < 1")
    if o.dora:
        fields["dora"] = True
    if o.autocast_adapter_dtype is not None:
        fields["autocast_adapter_dtype"] = bool(o.autocast_adapter_dtype)
    if o.lora_targets is not None:
        names = _names(o.lora_targets, "{lora_targets}")
        fields["targets"] = ALL_LINEAR if names == (ALL_LINEAR,) else names
    elif isinstance(fields.get("targets"), list):
        fields["targets"] = tuple(fields["targets"])
    if o.modules_to_save is not None:
        fields["modules_to_save"] = _names(o.modules_to_save, "{modules_to_save}")
    elif fields.get("modules_to_save") is None:
        fields.pop("modules_to_save", None)
    else:
        fields["modules_to_save"] = tuple(fields["modules_to_save"])
    for key in ("alpha", "dropout", "dora"):  # null in the file: PEFT's default
        if key in fields and fields[key] is None:
            fields.pop(key)
    try:
        return LoraConfig(**fields)
    except ValueError as exc:  # the file's values (flags were checked above)
        first = exc.errors()[0] if hasattr(exc, "errors") else {"msg": str(exc), "loc": ()}  # type: ignore[attr-defined]
        raise InputError(
            f"{{adapter_config}} {shown(o.adapter_config)}: {'.'.join(map(str, first['loc'])) or 'a value'} "
            f"is not accepted ({first['msg']}); accepted: r ≥ 1, lora_dropout 0 ≤ P < 1, lora_alpha > 0, "
            "target_modules a list of names or 'all-linear'"
        ) from None


def _quant(o: TrainingOptions, raw: dict[str, Any] | None) -> QuantConfig | None:
    fields = quantization_from_config(raw, "{model}") if raw else {}
    if o.quantize is not None:
        method = _choice_of(o.quantize, "{quantize}", tuple(m.value for m in QuantMethod))
        if method is QuantMethod.NONE:
            fields = {}
        else:
            if fields.get("method") in (QuantMethod.INT8,) or method is QuantMethod.INT8:
                fields = {k: v for k, v in fields.items() if k == "skip_modules"}
            fields["method"] = method
    given = [name for name in QUANT_FIELDS if getattr(o, name) is not None]
    if not fields:
        if given:
            raise InputError(
                f"{{{given[0]}}} describes a quantised base; accepted: with {{quantize}} nf4, fp4 or int8"
            )
        return None
    four = fields["method"] in (QuantMethod.NF4, QuantMethod.FP4)
    if o.double_quant is not None:
        if not four:
            raise InputError(
                "{double_quant} quantises 4-bit absmax values; accepted: with {quantize} nf4 or fp4"
            )
        fields["double_quant"] = bool(o.double_quant)
    if o.quant_storage is not None:
        if not four:
            raise InputError(
                "{quant_storage} is the 4-bit data's dtype; accepted: with {quantize} nf4 or fp4"
            )
        fields["storage"] = parse_dtype(o.quant_storage, "{quant_storage}", QUANT_STORAGE)
    if o.kbit_prepare is not None:
        fields["kbit_prepare"] = bool(o.kbit_prepare)
    return QuantConfig(**fields)


def parse_finetune(o: TrainingOptions, model: ModelSpec) -> FineTuning | None:
    """The fine-tuning of a request (None: every parameter trained), checked against the architecture
    (PEFT's targets and copies found, a quantised base trained through adapters)."""
    raw = model.quantization_config
    lora = _lora(o)
    quant = _quant(o, raw)
    freeze = () if o.freeze is None else _names(o.freeze, "{freeze}")
    if lora is None and quant is None and not freeze:
        return None
    if model.architecture is None:
        raise InputError("fine-tuning needs the model's modules; accepted: {model} NAME or config.json")
    if quant is not None and lora is None and o.quantize is None:
        # transformers/trainer_utils.py validate_quantization_for_training
        raise InputError(
            f"{{model}}'s quantization_config ({quant.method.value}) quantises the base, which is trained "
            "through adapters: it is modelled with {lora_rank} R (QLoRA); accepted: "
            "{lora_rank} R, or a config.json without quantization_config"
        )
    if quant is not None and lora is None:
        # transformers/trainer_utils.py validate_quantization_for_training
        raise InputError(
            f"a quantised base ({quant.method.value}: {{quantize}} or config.json's quantization_config) is "
            "frozen and trained through adapters; accepted: with {lora_rank} R (QLoRA), or {quantize} none"
        )
    if freeze and lora is not None:
        raise InputError(
            "{freeze} names modules frozen in a full fine-tune, and LoRA freezes the whole base; accepted: "
            "{freeze} without {lora_rank}, or {modules_to_save} for modules LoRA trains in full"
        )
    finetune = FineTuning(lora=lora, quant=quant, freeze=freeze)
    parameter_kinds(model.architecture, finetune)  # PEFT's refusals, before any estimate
    if freeze:
        _check_frozen(model, finetune)
    return finetune


def _check_frozen(model: ModelSpec, finetune: FineTuning) -> None:
    from zerocalc.parallel.precision import ParamKind

    assert model.architecture is not None
    kinds = [k.kind for k in parameter_kinds(model.architecture, finetune)]
    if ParamKind.FROZEN not in kinds:
        raise InputError(
            f"{{freeze}} {shown(','.join(finetune.freeze))} matches no module of the model; accepted: "
            "module names as transformers names them (embed_tokens, layers.0, self_attn)"
        )
    if ParamKind.TRAINABLE not in kinds:
        raise InputError(
            f"{{freeze}} {shown(','.join(finetune.freeze))} freezes every parameter; accepted: modules "
            "leaving some trained"
        )


# ------------------------------------------------------------------------------------ the frameworks
FINETUNE_STATES = {
    StatesModel.PAPER: "the ZeRO paper's sharding of each kind of tensor",
    StatesModel.TORCH_EXACT: "PyTorch's DDP, FSDP1 (use_orig_params=True) and FSDP2 with PEFT",
}
"""The accountings whose model states count a fine-tuning run's kinds of tensor; DeepSpeed's estimators
count every parameter as trained (DeepSpeed issue 5304) and Megatron-LM has no PEFT."""

PAGED_OPTIMIZERS = (OptimizerName.PAGED_ADAMW_8BIT, OptimizerName.PAGED_ADAMW)
BNB_OPTIMIZERS = (OptimizerName.ADAM_8BIT, *PAGED_OPTIMIZERS)
"""bitsandbytes' optimizers: modelled tensor by tensor (a fine-tuning run's tensors)."""


def finetune_problem(record: FrameworkRecord, request: TrainingRequest) -> str | None:
    """Why ``record`` does not model this fine-tuning run (or a paged optimizer without one), or None:
    None also when the run is not fine-tuning (the record's own checks apply)."""
    fw = record.framework.value
    if request.finetune is None:
        if request.optimizer in PAGED_OPTIMIZERS:
            return (
                f"{{optimizer}} {request.optimizer.value} pages tensor by tensor, modelled for fine-tuning "
                "runs; accepted: with {lora_rank} or {freeze}, or {optimizer} adam-8bit"
            )
        return None
    accepted = " or ".join(f.value for f, r in FRAMEWORKS.items() if tunes(r))
    if not tunes(record):
        return (
            f"{{framework}} {fw} does not model fine-tuning (its accounting counts every parameter "
            f"trained); accepted: {{framework}} {accepted}"
        )
    if request.fp8.recipe is not Fp8RecipeName.NONE:
        return (
            f"{{fp8}} {request.fp8.recipe.value} is not modelled with fine-tuning (which weights a frozen or "
            "quantised base converts is not); accepted: {fp8} none with {lora_rank}, {quantize} or {freeze}"
        )
    mesh = request.mesh
    if mesh.tp > 1 or mesh.pp > 1 or mesh.ep > 1:
        return (
            "fine-tuning is modelled over data-parallel ranks; accepted: {tp}, {pp} and {ep} 1 with "
            "{lora_rank}, {quantize} or {freeze}"
        )
    if request.fp32_grad_accum and not record.fp32_grad_accum:
        return f"{{framework}} {fw} models {record.accepts}"
    if request.buffers.wrap is Wrap.MODEL and not record.wrap_model:
        return f"{{wrap}} model is not accepted with {{framework}} {fw}; accepted: {{wrap}} block"
    torch = record.states is StatesModel.TORCH_EXACT
    precisions = (*record.precisions, PrecisionName.BF16_PURE) if torch else record.precisions
    if request.precision not in precisions:
        return f"{{framework}} {fw} models {record.accepts}"
    base_dtype = _base_dtype_adapter_problem(record, request) or _dora_conv1d_problem(request)
    if base_dtype is not None:
        return base_dtype
    optimizers = record.optimizers if torch else (*record.optimizers, *BNB_OPTIMIZERS)
    if torch and record.framework is Framework.DDP:
        optimizers = (*optimizers, *BNB_OPTIMIZERS)
    if request.optimizer not in optimizers:
        return (
            f"{{optimizer}} {request.optimizer.value} is not modelled with {{framework}} {fw}; accepted: "
            f"{', '.join(o.value for o in optimizers)}"
        )
    if torch:
        if request.offload_optimizer is not OffloadTarget.NONE or request.offload_params not in (
            params for _, params in TORCH_FINETUNE_OFFLOADS
        ):
            return (
                f"{{framework}} {fw} offloads parameters, gradients and the optimizer together (FSDP's "
                "CPUOffload); accepted: {offload_params} cpu and no {offload_optimizer}"
            )
        if request.offload_params is OffloadTarget.CPU and record.framework is Framework.DDP:
            return (
                "{framework} ddp does not offload; accepted: {framework} fsdp or fsdp2 with "
                "{offload_params} cpu"
            )
    return None


def _base_dtype_adapter_problem(record: FrameworkRecord, request: TrainingRequest) -> str | None:
    """Why adapters in the base layer's dtype (``--no-autocast-adapter-dtype``) are not modelled here, or
    None: they take one dtype, the recipe's 16-bit one (:data:`~zerocalc.parallel.precision.
    BASE_DTYPE_ADAPTER_RECIPES`). PEFT 0.21.2 ``_get_base_layer_device_and_dtype`` reads the base weight's
    dtype, or a ``Linear4bit``'s ``compute_dtype``; an integer weight (``Int8Params``) leaves the adapter
    as ``nn.Linear`` created it, fp32; a base weight ``prepare_model_for_kbit_training`` made fp32 gives an
    fp32 adapter beside bf16 ones."""
    finetune = request.finetune
    if finetune is None or finetune.adapter_autocast:
        return None
    refused = "adapters in the base layer's dtype ({no_autocast_adapter_dtype})"
    if request.precision is PrecisionName.FP16_MIXED and record.param_layout is not ParamLayout.MASTER_COPY:
        return (
            f"{refused} on an fp16 base are fp16 parameters, whose training is not modelled; accepted: "
            "{precision} bf16-mixed, bf16-pure or fp32 with {no_autocast_adapter_dtype}"
        )
    quant = finetune.quant
    if not finetune.quantized or quant is None:
        return None
    if quant.method is QuantMethod.INT8:
        return (
            f"{refused} on an LLM.int8 base: its int8 weight leaves them fp32, PEFT's default; accepted: "
            "{quantize} nf4 or fp4 with {no_autocast_adapter_dtype}, or {autocast_adapter_dtype} (PEFT's "
            "default)"
        )
    recipe_dtype = RECIPES[request.precision].param_dtype
    if quant.compute_dtype is not None and quant.compute_dtype is not recipe_dtype:
        return (
            f"{refused} take bnb_4bit_compute_dtype {quant.compute_dtype.value}, not the recipe's "
            f"{recipe_dtype.value}; accepted: a compute dtype of {recipe_dtype.value}, or "
            "{autocast_adapter_dtype} (PEFT's default)"
        )
    if finetune.kbit_prepared and finetune.lora is not None and recipe_dtype is not DType.FP32:
        arch = request.architecture
        quantized = quantized_module_names(arch, finetune)
        adapted = peft_plan(arch, finetune.lora).adapted
        fp32 = [a.module.hf_name for a in adapted if a.module.module not in quantized]
        if fp32:
            return (
                f"{refused} on {fp32[0]}, which is not quantised and prepare_model_for_kbit_training makes "
                "fp32, would be fp32 beside the others' bf16; accepted: targets among the quantised "
                "Linear layers, {no_kbit_prepare}, or {autocast_adapter_dtype} (PEFT's default)"
            )
    return None


def _dora_conv1d_problem(request: TrainingRequest) -> str | None:
    """Why DoRA with dropout on a Conv1D (GPT-2's) whose weight the forward reads in its own dtype is not
    modelled, or None. peft 0.21.2 ``DoraLinearLayer.forward`` computes the base result as
    ``F.linear(dropout(x), transpose(weight, fan_in_fan_out))``, and ``transpose`` (peft/utils/other.py)
    wraps the Parameter's ``.T`` in a new ``nn.Parameter``: backward gives each forward's new one an
    [out, in] gradient, held by the graph until the loss is freed (measured on the CPU with PEFT 0.21.2),
    which the step's timeline does not hold. A weight cast to x's dtype first (a 16-bit base under fp32
    adapters, a quantised one) is a plain tensor: none."""
    finetune, weights = request.finetune, request.forward_weights
    if finetune is None or finetune.lora is None or weights is None:
        return None
    lora = finetune.lora
    if not (lora.dora and lora.dropout > 0):
        return None
    stream = DType.FP32 if weights.fp32_stream else request.activation_dtype
    if weights.adapter is not stream:
        return None
    quantized = quantized_module_names(request.architecture, finetune)
    for adapted in peft_plan(request.architecture, lora).adapted:
        if adapted.module.cls is ModuleClass.CONV1D and adapted.module.module not in quantized:
            return (
                f"{{dora}} with {{lora_dropout}} {lora.dropout:g} on {adapted.module.hf_name} (a Conv1D "
                f"whose weight the forward reads in its own {stream.value}): PEFT 0.21.2's transpose "
                "makes a new Parameter each forward, whose weight-sized gradient the graph holds until "
                "the loss is freed, which is not modelled; accepted: {lora_dropout} 0, or fp32 adapters "
                "that the forward casts the weight to ({framework} ddp with bf16-mixed)"
            )
    return None


def tunes(record: FrameworkRecord) -> bool:
    """Whether the framework's accounting models a fine-tuning run (:data:`FINETUNE_STATES`;
    ZeroRedundancyOptimizer's partition of a mixed-``requires_grad`` model is not modelled)."""
    return record.states in FINETUNE_STATES and record.framework is not Framework.TORCH_ZERO1


TORCH_FINETUNE_OFFLOADS = (
    (OffloadTarget.NONE, OffloadTarget.NONE),
    (OffloadTarget.NONE, OffloadTarget.CPU),
)
"""The (optimizer, parameters) offloads of a fine-tuning run under PyTorch's frameworks: none, or FSDP's
CPU offload (FSDP1 ``CPUOffload(offload_params=True)``, FSDP2 ``CPUOffloadPolicy``), which keeps the
parameters, gradients and optimizer on the host together; DDP none."""


def finetune_offloads(record: FrameworkRecord) -> tuple[tuple[OffloadTarget, OffloadTarget], ...] | None:
    """The (optimizer, parameters) offloads ``record`` runs a fine-tuning with (each strategy still
    decides which it allows: parameters offloaded under zero3 alone); None: the record's own (the paper's
    accounting)."""
    if record.states is not StatesModel.TORCH_EXACT:
        return None
    return TORCH_FINETUNE_OFFLOADS[:1] if record.framework is Framework.DDP else TORCH_FINETUNE_OFFLOADS


def finetune_of_options(o: Any) -> FineTuning | None:
    """The fine-tuning the options alone describe (``o``: the fine-tuning options as attributes, as in
    :class:`TrainingOptions`; no config.json's ``quantization_config``): ``validate activations``'. None
    when they describe none."""
    lora = _lora(o)
    quant = _quant(o, None)
    freeze = () if o.freeze is None else _names(o.freeze, "{freeze}")
    if lora is None and quant is None and not freeze:
        return None
    if quant is not None and lora is None:
        raise InputError(
            f"a quantised base ({quant.method.value}: {{quantize}}) is frozen and trained through adapters; "
            "accepted: with {lora_rank} R (QLoRA), or {quantize} none"
        )
    if freeze and lora is not None:
        raise InputError(
            "{freeze} names modules frozen in a full fine-tune, and LoRA freezes the whole base; accepted: "
            "{freeze} without {lora_rank}, or {modules_to_save} for modules LoRA trains in full"
        )
    return FineTuning(lora=lora, quant=quant, freeze=freeze)


RECOMPUTE_AUTO = "auto"
"""``--recompute``'s default: what the run's own code does (:func:`recompute_of`)."""


def recompute_of(text: str, finetune: FineTuning | None) -> tuple[Recompute, tuple[str, ...]]:
    """``--recompute`` and its note: ``auto`` is ``full`` where ``prepare_model_for_kbit_training`` runs
    (PEFT 0.21.2 peft/utils/other.py: ``use_gradient_checkpointing=True`` by default calls
    ``model.gradient_checkpointing_enable()``, every decoder layer checkpointed), else ``none``."""
    if str(text).strip().lower() != RECOMPUTE_AUTO:
        if str(text).strip().lower() not in {r.value for r in Recompute}:
            accepted = ", ".join((RECOMPUTE_AUTO, *(r.value for r in Recompute)))
            raise InputError(f"{{recompute}} {shown(text)} is not accepted; accepted: {accepted}")
        return choice(text, "{recompute}", Recompute), ()
    if finetune is not None and finetune.kbit_prepared:
        return Recompute.FULL, (
            "recompute full: prepare_model_for_kbit_training checkpoints every layer by default "
            "(use_gradient_checkpointing=True, PEFT 0.21 peft/utils/other.py); --recompute none: without",
        )
    return Recompute.NONE, ()
