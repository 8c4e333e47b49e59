"""The training method of a fine-tuning run, typed once: LoRA (PEFT 0.21), a quantised frozen base
(bitsandbytes 0.50 through transformers 5.17) and frozen modules of a full fine-tune; the kind of every
parameter tensor it leaves (:func:`parameter_kinds`, the one place that decides it) and its counts
(:func:`finetune_counts`).

A request carries ``FineTuning | None`` (None: every parameter trained). Nothing here parses text: the
request layer builds these from options, PEFT's ``adapter_config.json`` and config.json's
``quantization_config``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.model.adapters import ALL_LINEAR, AdapterLayer, adapter_tensors, peft_plan, saved_tensors
from zerocalc.model.architecture import Architecture, ParamTensor, parameter_tensors
from zerocalc.model.code.finetune import ForwardTuning
from zerocalc.model.hf_modules import hf_modules, hf_name
from zerocalc.model.quantized import Part, QuantMethod, StoragePart, quantized_modules, weight_storage
from zerocalc.parallel.precision import (
    ParamKind,
    ParamLayout,
    PrecisionName,
    QuantDtypes,
    TensorDtypes,
    tensor_dtypes,
)


class LoraConfig(BaseModel):
    """PEFT's ``LoraConfig`` as far as memory goes (peft/tuners/lora/config.py; its defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(gt=0, description="r (``LoraConfig.r``)")
    alpha: float = Field(default=8.0, gt=0, description="lora_alpha: scales the update, not the memory")
    targets: tuple[str, ...] | str | None = Field(
        default=None,
        description="target_modules: module names (a name or a suffix .name), 'all-linear', or None for "
        "PEFT's default for the model_type",
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="lora_dropout")
    dora: bool = Field(default=False, description="use_dora")
    modules_to_save: tuple[str, ...] = Field(default=(), description="trainable copies of these modules")
    autocast_adapter_dtype: bool = Field(
        default=True,
        description="get_peft_model's autocast_adapter_dtype: fp32 adapters on a 16-bit base (PEFT ≥ 0.12's "
        "default); False: the base layer's dtype, as PEFT before 0.12 made them",
    )

    @model_validator(mode="after")
    def _targets(self) -> LoraConfig:
        if isinstance(self.targets, str) and self.targets != ALL_LINEAR:
            raise ValueError(f"targets must be module names or {ALL_LINEAR!r}")
        if isinstance(self.targets, tuple) and not self.targets:
            raise ValueError("targets must name at least one module")
        return self


QUANT_STORAGE = (DType.UINT8, DType.INT8, DType.BF16, DType.FP16, DType.FP32)
"""The storage dtypes ``BitsAndBytesConfig`` takes for 4-bit data (transformers/utils/quantization_config.py:
uint8, int8, bfloat16, float16, float32; float64 too, which zerocalc has no dtype for)."""


class QuantConfig(BaseModel):
    """transformers' ``BitsAndBytesConfig`` as far as memory goes, and whether
    ``prepare_model_for_kbit_training`` runs (peft/utils/other.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: QuantMethod
    double_quant: bool = Field(default=False, description="bnb_4bit_use_double_quant")
    storage: DType = Field(
        default=DType.UINT8, description="bnb_4bit_quant_storage (the packed 4-bit data's dtype)"
    )
    compute_dtype: DType | None = Field(
        default=None, description="bnb_4bit_compute_dtype; None: the recipe's parameter dtype"
    )
    skip_modules: tuple[str, ...] | None = Field(
        default=None, description="llm_int8_skip_modules; None: transformers' default (the LM head)"
    )
    kbit_prepare: bool = Field(
        default=True,
        description="prepare_model_for_kbit_training: every 16-bit parameter but 4-bit weights to fp32",
    )

    @model_validator(mode="after")
    def _consistent(self) -> QuantConfig:
        if self.method is QuantMethod.INT8 and self.storage is not DType.UINT8:
            raise ValueError("the storage dtype is bnb_4bit_quant_storage: LLM.int8 stores int8")
        if self.storage not in QUANT_STORAGE:
            raise ValueError(f"bnb_4bit_quant_storage is one of {', '.join(d.value for d in QUANT_STORAGE)}")
        if self.method in (QuantMethod.INT8, QuantMethod.NONE) and self.double_quant:
            raise ValueError("double quantisation is of 4-bit absmax values (nf4, fp4)")
        return self

    @property
    def dtypes(self) -> QuantDtypes:
        storage = DType.INT8 if self.method is QuantMethod.INT8 else self.storage
        return QuantDtypes(storage=storage, compute=self.compute_dtype)


class FineTuning(BaseModel):
    """Which parameters a run trains, freezes or quantises, and what it adds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lora: LoraConfig | None = None
    quant: QuantConfig | None = None
    freeze: tuple[str, ...] = Field(
        default=(),
        description="full fine-tuning: modules whose parameters are frozen (a module's name or a suffix "
        ".name, as PEFT matches names; every parameter inside it)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> FineTuning:
        if self.quantized and self.lora is None:
            # transformers/trainer_utils.py validate_quantization_for_training
            raise ValueError(
                "a quantised base is trained through adapters: purely quantised models are refused"
            )
        if self.kbit_prepared and self.lora is None:
            # peft/utils/other.py prepare_model_for_kbit_training: "freeze base model's layers"
            raise ValueError("prepare_model_for_kbit_training freezes every parameter: it needs adapters")
        if self.freeze and self.lora is not None:
            raise ValueError("freeze names modules frozen in a full fine-tune; LoRA freezes the whole base")
        return self

    @property
    def quantized(self) -> bool:
        return self.quant is not None and self.quant.method is not QuantMethod.NONE

    @property
    def base_frozen(self) -> bool:
        """Whether the whole base model is frozen (LoRA: PEFT freezes every parameter but the adapters and
        the ``modules_to_save`` copies)."""
        return self.lora is not None

    @property
    def kbit_prepared(self) -> bool:
        return self.quant is not None and self.quant.kbit_prepare

    @property
    def adapter_autocast(self) -> bool:
        """PEFT upcasts the adapters to fp32 (``autocast_adapter_dtype``; :func:`~zerocalc.parallel.
        precision.kind_recipe`)."""
        return self.lora is None or self.lora.autocast_adapter_dtype


TRAINED_KINDS = (ParamKind.TRAINABLE, ParamKind.ADAPTER, ParamKind.SAVED_COPY)
"""The kinds with a gradient, optimizer states and a reduction (the others are frozen)."""


class KindedTensor(NamedTuple):
    """One parameter tensor of a fine-tuning run and its kind."""

    tensor: ParamTensor
    kind: ParamKind


def _frozen_by_name(arch: Architecture, tensor: ParamTensor, names: tuple[str, ...]) -> bool:
    """Whether ``tensor`` lies in a module named (or ending with ``.name``) by one of ``names``: its own
    module or any module holding it, by transformers' names."""
    parts = hf_name(arch, tensor.module).split(".")
    held_by = {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    return any(key == name or key.endswith(f".{name}") for key in held_by for name in names)


def quantized_module_names(arch: Architecture, finetune: FineTuning) -> frozenset[str]:
    """The modules of ``arch`` whose weights ``finetune`` quantises (none where the base is not)."""
    if not finetune.quantized:
        return frozenset()
    assert finetune.quant is not None
    return frozenset(m.module for m in quantized_modules(arch, finetune.quant.skip_modules))


def _quantized_tensors(arch: Architecture, finetune: FineTuning) -> set[ParamTensor]:
    if not finetune.quantized:
        return set()
    assert finetune.quant is not None
    return {
        t
        for m in quantized_modules(arch, finetune.quant.skip_modules)
        for t in m.tensors
        if t.name == "weight"
    }


@lru_cache(maxsize=64)
def _kinds(arch: Architecture, finetune: FineTuning | None) -> tuple[KindedTensor, ...]:
    base = parameter_tensors(arch)
    if finetune is None:
        return tuple(KindedTensor(t, ParamKind.TRAINABLE) for t in base)
    if finetune.lora is None:
        return tuple(
            KindedTensor(
                t, ParamKind.FROZEN if _frozen_by_name(arch, t, finetune.freeze) else ParamKind.TRAINABLE
            )
            for t in base
        )
    quantized = _quantized_tensors(arch, finetune)
    plan = peft_plan(arch, finetune.lora)
    for saved in plan.saved:
        if any(t in quantized for m in saved.members for t in m.tensors):
            raise InputError(
                f"{{modules_to_save}} copies {saved.hf_name}, whose weight is quantised and cannot be "
                "trained (bitsandbytes' Params4bit and Int8Params hold no gradient); accepted: modules "
                "left unquantised"
            )
    kinded = [KindedTensor(t, ParamKind.QUANTIZED if t in quantized else ParamKind.FROZEN_BASE) for t in base]
    kinded += [KindedTensor(t, ParamKind.ADAPTER) for t in adapter_tensors(arch, finetune.lora)]
    kinded += [KindedTensor(t, ParamKind.SAVED_COPY) for t in saved_tensors(arch, finetune.lora)]
    return tuple(kinded)


def parameter_kinds(arch: Architecture, finetune: FineTuning | None) -> list[KindedTensor]:
    """Every parameter tensor of ``arch`` under ``finetune`` (None: full training) and its kind, the base
    model's first, then the adapters (:mod:`zerocalc.model.adapters`) and the ``modules_to_save`` copies:

    * full training: every tensor :attr:`~ParamKind.TRAINABLE`; with ``freeze``, those inside a named
      module :attr:`~ParamKind.FROZEN`;
    * LoRA: the base :attr:`~ParamKind.FROZEN_BASE` (PEFT ``_mark_only_adapters_as_trainable``, ``bias=
      "none"``), its quantised weights :attr:`~ParamKind.QUANTIZED` (:mod:`zerocalc.model.quantized`),
      the adapters :attr:`~ParamKind.ADAPTER`, the copies :attr:`~ParamKind.SAVED_COPY` in the module's
      dtype (``ModulesToSaveWrapper`` deep-copies the module; ``cast_adapter_dtype`` casts only adapters).

    The dtypes of each kind are the precision record's (``tensor_dtypes(..., kind, quant.dtypes,
    finetune.kbit_prepared)``)."""
    return list(_kinds(arch, finetune))


class QuantizedBytes(BaseModel):
    """A quantised base's storage, part by part."""

    model_config = ConfigDict(frozen=True)

    weights: int = Field(description="quantised weight elements")
    modules: int = Field(description="quantised modules (one weight each)")
    parts: dict[Part, int] = Field(description="bytes of each part of their storage, summed")

    @property
    def total(self) -> int:
        return sum(self.parts.values())


class FineTuneCounts(BaseModel):
    """What a fine-tuning run trains, freezes and quantises."""

    model_config = ConfigDict(frozen=True)

    trainable: int = Field(description="trained parameter elements: adapters, copies, unfrozen parameters")
    frozen: int = Field(description="frozen parameter elements of the base, quantised weights included")
    adapters: int = Field(description="of the trainable: LoRA's (and DoRA's) adapter elements")
    saved_copies: int = Field(description="of the trainable: the modules_to_save copies' elements")
    quantized: QuantizedBytes | None = Field(
        description="the quantised weights' storage (None: not quantised)"
    )


def quantized_storage(arch: Architecture, quant: QuantConfig) -> QuantizedBytes:
    """The storage bitsandbytes keeps for the weights it quantises in ``arch``."""
    parts: dict[Part, int] = {}
    weights = 0
    modules = quantized_modules(arch, quant.skip_modules)
    for module in modules:
        storage: tuple[StoragePart, ...] = weight_storage(
            module, quant.method, quant.double_quant, quant.storage
        )
        weights += module.weight[0] * module.weight[1]
        for part in storage:
            parts[part.part] = parts.get(part.part, 0) + part.bytes
    return QuantizedBytes(weights=weights, modules=len(modules), parts=parts)


def finetune_counts(arch: Architecture, finetune: FineTuning | None) -> FineTuneCounts:
    """Trainable and frozen parameters and the quantised bytes of ``arch`` under ``finetune``."""
    kinded = parameter_kinds(arch, finetune)
    trained = TRAINED_KINDS
    quantized = None
    if finetune is not None and finetune.quantized:
        assert finetune.quant is not None
        quantized = quantized_storage(arch, finetune.quant)
    copies = saved_tensors(arch, finetune.lora) if finetune is not None and finetune.lora is not None else []
    return FineTuneCounts(
        trainable=sum(k.tensor.numel for k in kinded if k.kind in trained),
        frozen=sum(k.tensor.numel for k in kinded if k.kind not in trained),
        adapters=sum(k.tensor.numel for k in kinded if k.kind is ParamKind.ADAPTER),
        saved_copies=sum(t.numel for t in copies),
        quantized=quantized,
    )


class ForwardWeights(NamedTuple):
    """The dtypes a fine-tuning forward reads off its weights (:attr:`TensorRole.MODULE_WEIGHT
    <zerocalc.base.dtypes.TensorRole.MODULE_WEIGHT>` in the precision record)."""

    adapter: DType
    """``lora_A.weight.dtype``, which PEFT 0.21 casts each LoRA input to (peft/tuners/lora/layer.py
    ``Linear.forward``: ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``, a copy where the dtypes
    differ; tuners_utils.py): fp32 adapters stay fp32 under autocast and without a framework, FSDP's mixed
    precision casts them to ``param_dtype`` with the rest of its unit (FSDP2 ``MixedPrecisionPolicy``,
    torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``init_dtype_attrs``; FSDP1's flat parameter),
    DeepSpeed's bit16 engine holds them in bf16."""
    fp32_stream: bool
    """The hidden states are fp32: ``prepare_model_for_kbit_training`` made the embeddings fp32 and the
    forward reads them so (not where FSDP's mixed precision casts them back to ``param_dtype``)."""


PEFT_ALONE = ForwardWeights(adapter=DType.FP32, fp32_stream=False)
"""PEFT's model run as it is (no framework, no autocast): fp32 adapters, the base's stream."""


def peft_alone(finetune: FineTuning, base: DType) -> ForwardWeights:
    """What PEFT's model of a base loaded in ``base`` (bitsandbytes' compute dtype on a 4-bit base) reads
    off its weights run as it is: fp32 adapters where PEFT upcasts them, else the base's dtype
    (:data:`~zerocalc.parallel.precision.BASE_DTYPE_ADAPTER_RECIPES`); the stream fp32 after
    ``prepare_model_for_kbit_training``."""
    adapter = DType.FP32 if finetune.adapter_autocast else base
    return ForwardWeights(adapter=adapter, fp32_stream=finetune.kbit_prepared)


def finetune_tensor_dtypes(
    finetune: FineTuning,
    precision: PrecisionName,
    layout: ParamLayout,
    main_gradient: DType | None,
    reduce: DType | None,
    kind: ParamKind,
) -> TensorDtypes:
    """The dtypes of a fine-tuning run's tensors of ``kind`` under ``precision`` by a framework of
    ``layout`` (its own main-gradient dtype, ``--reduce-dtype``): the precision record's kind rules, the
    quantised storage and ``prepare_model_for_kbit_training``."""
    quant = finetune.quant.dtypes if finetune.quant is not None else None
    return tensor_dtypes(
        precision,
        layout,
        main_gradient,
        reduce,
        kind,
        quant=quant,
        kbit_prepared=finetune.kbit_prepared,
        adapter_autocast=finetune.adapter_autocast,
    )


class AdapterOpDtypes(NamedTuple):
    """The dtypes a fine-tuning's own operations run in (:func:`~zerocalc.compute.finetune.finetune_ops`),
    the precision record's; a flat record of dtypes, so the parts of a plan that read it are keyed by its
    value."""

    gemm_input: DType
    """The adapters' GEMM input."""
    weight_seen: DType
    """The adapters' weight as the forward sees it: the stored fp32 adapter under autocast, the cast one
    under FSDP's mixed precision."""
    base_compute: DType
    """What the frozen base's GEMMs run in: the quantised kind's compute dtype on a quantised base (the
    dequantised weight), else the adapters'."""


def adapter_op_dtypes(
    finetune: FineTuning,
    precision: PrecisionName,
    layout: ParamLayout,
    main_gradient: DType | None,
    reduce: DType | None,
) -> AdapterOpDtypes:
    """:class:`AdapterOpDtypes` of ``finetune`` (the arguments :func:`finetune_tensor_dtypes`')."""
    adapter = finetune_tensor_dtypes(finetune, precision, layout, main_gradient, reduce, ParamKind.ADAPTER)
    seen = adapter.stored if layout is ParamLayout.AUTOCAST else adapter.compute
    compute = adapter.compute
    if finetune.quantized:
        quantized = finetune_tensor_dtypes(
            finetune, precision, layout, main_gradient, reduce, ParamKind.QUANTIZED
        )
        compute = quantized.compute
    return AdapterOpDtypes(adapter.gemm_input, seen, compute)


def forward_weights(finetune: FineTuning, layout: ParamLayout, precision: PrecisionName) -> ForwardWeights:
    """What ``finetune``'s forward reads off its weights when a framework of ``layout`` trains it under
    ``precision``: the precision record's :attr:`~zerocalc.base.dtypes.TensorRole.MODULE_WEIGHT` of the
    adapters and of the frozen base's embeddings."""
    base = tensor_dtypes(precision, layout, kind=ParamKind.FROZEN_BASE, kbit_prepared=finetune.kbit_prepared)
    adapter = finetune_tensor_dtypes(finetune, precision, layout, None, None, ParamKind.ADAPTER)
    return ForwardWeights(
        adapter=adapter.module_weight,
        fp32_stream=finetune.kbit_prepared and base.module_weight is DType.FP32,
    )


def forward_tuning(
    arch: Architecture,
    finetune: FineTuning,
    checkpointed: bool = False,
    weights: ForwardWeights | None = None,
) -> ForwardTuning:
    """What ``finetune`` changes in the forward's saved tensors (the activation model's input,
    :class:`zerocalc.model.code.ForwardTuning`), from the tensors' kinds (:func:`parameter_kinds`), PEFT's
    plan and the quantised modules. ``checkpointed``: gradient checkpointing is on, so the input embeddings'
    output requires grad (``enable_input_require_grads``: PEFT's ``_prepare_model_for_gradient_checkpointing``
    when the model checkpoints, ``prepare_model_for_kbit_training(use_gradient_checkpointing=True)``).
    ``weights``: the dtypes its framework gives the weights in forward (None: PEFT's model alone, its
    stream fp32 after ``prepare_model_for_kbit_training``)."""
    if weights is None:
        if not finetune.adapter_autocast:
            raise ValueError("adapters in the base's dtype need the base's dtype: pass peft_alone(...)")
        weights = peft_alone(finetune, DType.FP32)  # fp32 adapters whatever the base
    kinded = parameter_kinds(arch, finetune)
    trainable = {k.tensor for k in kinded if k.kind in (ParamKind.TRAINABLE, ParamKind.SAVED_COPY)}
    # a module is trained when a tensor it holds is (GPT-2's c_attn holds q, k and v); a tied LM head holds
    # none: it is the embedding's weight
    trained = {
        m.module
        for m in hf_modules(arch)
        if any(t in trainable for t in m.tensors)
        or (not m.tensors and m.module == "lm_head" and any(t.module == "embed_tokens" for t in trainable))
    }
    adapted: list[tuple[str, int]] = []
    if finetune.lora is not None:
        plan = peft_plan(arch, finetune.lora)
        trained = {m.module for saved in plan.saved for m in saved.members}
        for a in plan.adapted:
            if a.layer is not AdapterLayer.LINEAR:
                raise InputError(
                    f"{{lora_targets}} adapts {a.module.hf_name} ({a.layer.value}), whose saved tensors are "
                    "not modelled; accepted: Linear and Conv1D targets"
                )
            adapted.append((a.module.module, a.rank))
    quantized = quantized_module_names(arch, finetune)
    return ForwardTuning(
        trained=frozenset(trained),
        adapted=tuple(adapted),
        dropout=finetune.lora.dropout if finetune.lora is not None else 0.0,
        dora=finetune.lora.dora if finetune.lora is not None else False,
        quantized=quantized,
        fp32_stream=weights.fp32_stream,
        input_requires_grad=checkpointed,
        adapter_bytes=weights.adapter.bytes,
    )
