"""What zerocalc predicts of a PEFT model, named as PEFT names it, and what the real model holds: shared by
the fine-tuning tests that build real models (tests/model/test_finetune_peft.py and
tests/model/test_finetune_bnb.py)."""

from __future__ import annotations

from typing import Any

from zerocalc.base.dtypes import DType
from zerocalc.model.architecture import Architecture, ParamTensor, parameter_tensors
from zerocalc.model.hf_classes import ModuleClass
from zerocalc.model.hf_config import FAMILIES
from zerocalc.model.hf_modules import hf_modules, hf_name, module_class
from zerocalc.model.quantized import Part, quantized_modules, weight_storage
from zerocalc.parallel.finetune import FineTuning, parameter_kinds
from zerocalc.parallel.precision import ParamKind, ParamLayout, PrecisionName, tensor_dtypes

Entry = tuple[tuple[int, ...], str, bool]
"""A parameter's shape, dtype (zerocalc's name) and requires_grad."""

TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "uint8", "int8": "int8"}

PEFT_ON_BF16 = (PrecisionName.BF16_PURE, ParamLayout.AUTOCAST)
"""A model loaded in bf16 and wrapped by PEFT, before any framework: its parameters as loaded (the frozen
base bf16, PEFT's adapters fp32)."""


def _stored(kind: ParamKind, finetune: FineTuning) -> DType:
    quant = finetune.quant.dtypes if finetune.quant is not None else None
    return tensor_dtypes(*PEFT_ON_BF16, kind=kind, quant=quant, kbit_prepared=finetune.kbit_prepared).stored


def expected(arch: Architecture, finetune: FineTuning) -> dict[str, Entry]:
    """zerocalc's parameters of ``arch`` under ``finetune``, named as the PEFT model's ``named_parameters``
    are once ``base_layer`` and ``original_module`` are taken out of the base's names."""
    kinded = parameter_kinds(arch, finetune)
    held = len(parameter_tensors(arch))
    kinds = {k.tensor: k.kind for k in kinded[:held]}
    quantized = {}
    if finetune.quantized:
        assert finetune.quant is not None
        q = finetune.quant
        for module in quantized_modules(arch, q.skip_modules):
            packed = weight_storage(module, q.method, q.double_quant, q.storage)[0]
            quantized[module.hf_name] = (packed.elements, 1) if packed.part is Part.PACKED else module.weight
    entries: dict[str, Entry] = {}
    for module in hf_modules(arch):
        by_name = {t.name: kinds[t] for t in module.tensors}
        for name, shape in module.hf_parameters().items():
            kind = by_name[name]
            if kind is ParamKind.QUANTIZED:
                shape = quantized[module.hf_name]
            entries[f"{module.hf_name}.{name}"] = (shape, _stored(kind, finetune).value, False)
    for tensor, kind in kinded[held:]:
        shape = tensor.shape
        copy = kind is ParamKind.SAVED_COPY
        if copy and tensor.name == "weight" and _copied_class(arch, tensor) is ModuleClass.CONV1D:
            shape = shape[::-1]  # a copy of a Conv1D keeps its [in, out] weight
        experts = copy and len(shape) == 3 and _copied_class(arch, tensor) is ModuleClass.EXPERTS
        if experts and FAMILIES[arch.family or "llama"].experts_in_out:  # GPT-OSS's experts: [E, in, out]
            shape = (shape[0], shape[2], shape[1])
        entries[f"{hf_name(arch, tensor.module)}.{tensor.name}"] = (
            shape,
            _stored(kind, finetune).value,
            True,
        )
    return entries


def _copied_class(arch: Architecture, copy: ParamTensor) -> ModuleClass:
    original = copy.module.replace(".modules_to_save.default", "").removeprefix("modules_to_save.default.")
    return module_class(arch, original)


def measured(model: Any) -> dict[str, Entry]:
    """The real model's parameters, PEFT's wrapping names of the base taken out (its adapters keep theirs:
    a nested ParamWrapper's ``experts.base_layer.lora_A``)."""
    entries = {}
    for name, p in model.named_parameters():
        name = name.removeprefix("base_model.model.")
        if not p.requires_grad:
            name = name.replace(".base_layer", "").replace(".original_module", "")
        entries[name] = (tuple(p.shape), TORCH_DTYPES[str(p.dtype).removeprefix("torch.")], p.requires_grad)
    return entries
