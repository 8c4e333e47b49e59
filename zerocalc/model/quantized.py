"""What a quantised base stores: which modules transformers 5.17 quantises with bitsandbytes 0.50, and
the storage of each quantised weight, part by part.

**Which modules** (transformers/quantizers/quantizer_bnb_4bit.py and quantizer_bnb_8bit.py
``_process_model_before_weight_loading`` → transformers/integrations/bitsandbytes.py
``replace_with_bnb_linear``): every module whose class *is* ``torch.nn.Linear`` (not a subclass: Falcon's
``FalconLinear`` stays in 16 bits) or ``Conv1D``, but those ``should_convert_module``
(quantizers/quantizers_utils.py) skips: a pattern that matches the name's start (``re.match``, a regex) or
ends it. Without ``llm_int8_skip_modules`` the patterns are ``get_keys_to_not_convert``'s
(quantizers/base.py): the output embedding (``lm_head``), the modules of tied weights and the last
parameter's module; with them, only them (``HfQuantizer.get_modules_to_not_convert``:
``add_default_skips`` false), so ``lm_head`` is quantised unless listed. Embeddings, norms, routers
(``nn.Module``\\ s) and experts (3-D parameters) are never quantised.

**4-bit storage** (bitsandbytes/functional.py ``quantize_4bit``; backends/cuda/ops.py
``quantize_4bit``; nn/modules.py ``Params4bit``, blocksize 64): of n weights,

* ``packed``: two 4-bit codes per byte, a tensor of ``(n + 1) // (2·s)`` elements of the storage dtype of
  s bytes (``bnb_4bit_quant_storage``, uint8 by default: ceil(n/2) bytes; bf16 for FSDP: the same bytes
  in half the elements);
* ``absmax``: one per block of 64, ceil(n/64), fp32; with double quantisation (``compress_statistics``,
  ``bnb_4bit_use_double_quant``) uint8, quantised by ``quantize_blockwise(absmax - offset, blocksize=256)``,
  which keeps ``nested_absmax`` (fp32, one per 256 blocks, ceil(ceil(n/64)/256)), ``nested_code`` (its
  own copy of the 256-entry fp32 dynamic map, ``code.to(device, copy=True)``) and ``offset`` (the mean,
  a 0-dim fp32 tensor);
* ``code``: the 16-entry fp32 NF4/FP4 table (``get_4bit_type``, a new tensor per weight).

**torchao's NF4** (torchao 0.18 ``quantization/quantize_/workflows/nf4/nf4_tensor.py``
``NF4Tensor.from_tensor``, ``to_nf4(weight, 64, 256)``: torchtune's QLoRA): of n weights in dtype D,
``quantized_data`` uint8 n/2, ``quantized_scalers`` int8 n/64, ``quantization_factor`` D n/64/256,
``scaler_mean`` D (0-dim) and the 16-entry ``nf4`` table in D — 0.5 + 1/64 + 2/16384 B per weight in
bf16; n must be a multiple of 64 · 256.

**LLM.int8 storage** (nn/modules.py ``Int8Params._quantize``: ``int8_vectorwise_quant``): the int8 weight
(``CB``, the parameter's own storage) and one fp32 scale per output row (``SCB``).
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.model.architecture import Architecture
from zerocalc.model.hf_classes import ModuleClass
from zerocalc.model.hf_modules import HfModule, hf_modules

BLOCK = 64
"""Weights per absmax (``Params4bit`` blocksize 64, as transformers builds ``Linear4bit``)."""
NESTED_BLOCK = 256
"""Absmax values per second-level absmax (``quantize_4bit``: ``quantize_blockwise(..., blocksize=256)``)."""
CODE_4BIT = 16
"""Entries of the NF4/FP4 table (``get_4bit_type``)."""
DYNAMIC_CODE = 256
"""Entries of the 8-bit dynamic map the nested absmax is coded with (``create_dynamic_map``)."""


class QuantMethod(StrEnum):
    """How the frozen base is stored (``BitsAndBytesConfig``)."""

    NONE = "none"
    NF4 = "nf4"
    """``load_in_4bit``, ``bnb_4bit_quant_type="nf4"`` (QLoRA's NormalFloat)."""
    FP4 = "fp4"
    """``load_in_4bit``, ``bnb_4bit_quant_type="fp4"`` (transformers' default 4-bit type)."""
    INT8 = "int8"
    """``load_in_8bit``: LLM.int8 (Dettmers et al. 2022)."""


class Part(StrEnum):
    """A tensor of a quantised weight's storage (named as ``QuantState.as_dict`` and ``Int8Params``)."""

    PACKED = "packed"
    ABSMAX = "absmax"
    NESTED_ABSMAX = "nested_absmax"
    NESTED_CODE = "nested_code"
    OFFSET = "offset"
    CODE = "code"
    INT8_WEIGHT = "int8_weight"
    ROW_SCALE = "row_scale"


class StoragePart(NamedTuple):
    part: Part
    dtype: DType
    elements: int

    @property
    def bytes(self) -> int:
        return self.elements * self.dtype.bytes


def _blocks(n: int, size: int) -> int:
    return -(-n // size)


def four_bit_storage(n: int, double_quant: bool, storage: DType = DType.UINT8) -> tuple[StoragePart, ...]:
    """The tensors bitsandbytes keeps for ``n`` weights quantised to 4 bits (NF4 and FP4 alike)."""
    blocks = _blocks(n, BLOCK)
    parts = [StoragePart(Part.PACKED, storage, (n + 1) // (2 * storage.bytes))]
    if double_quant:
        parts += [
            StoragePart(Part.ABSMAX, DType.UINT8, blocks),
            StoragePart(Part.NESTED_ABSMAX, DType.FP32, _blocks(blocks, NESTED_BLOCK)),
            StoragePart(Part.NESTED_CODE, DType.FP32, DYNAMIC_CODE),
            StoragePart(Part.OFFSET, DType.FP32, 1),
        ]
    else:
        parts.append(StoragePart(Part.ABSMAX, DType.FP32, blocks))
    return (*parts, StoragePart(Part.CODE, DType.FP32, CODE_4BIT))


TORCHAO_SCALER_BLOCK = 256
"""Absmax values per quantisation factor (``to_nf4``'s ``scaler_block_size``)."""


def torchao_nf4_storage(n: int, dtype: DType) -> tuple[StoragePart, ...]:
    """The tensors of torchao's ``NF4Tensor`` of ``n`` weights of ``dtype`` (the names: ``quantized_data``,
    ``quantized_scalers``, ``quantization_factor``, ``scaler_mean``, ``nf4``)."""
    if n % (BLOCK * TORCHAO_SCALER_BLOCK):
        raise ValueError(
            f"torchao's NF4Tensor needs a multiple of {BLOCK * TORCHAO_SCALER_BLOCK} weights, not {n}"
        )
    blocks = n // BLOCK
    return (
        StoragePart(Part.PACKED, DType.UINT8, n // 2),
        StoragePart(Part.ABSMAX, DType.INT8, blocks),
        StoragePart(Part.NESTED_ABSMAX, dtype, blocks // TORCHAO_SCALER_BLOCK),
        StoragePart(Part.OFFSET, dtype, 1),
        StoragePart(Part.CODE, dtype, CODE_4BIT),
    )


def int8_storage(rows: int, columns: int) -> tuple[StoragePart, ...]:
    """LLM.int8's int8 weight and fp32 row scales for a [rows, columns] weight."""
    weight = StoragePart(Part.INT8_WEIGHT, DType.INT8, rows * columns)
    return weight, StoragePart(Part.ROW_SCALE, DType.FP32, rows)


def weight_storage(
    module: HfModule, method: QuantMethod, double_quant: bool, storage: DType
) -> tuple[StoragePart, ...]:
    """The storage of ``module``'s weight quantised by ``method``."""
    out, columns = module.weight
    if method is QuantMethod.INT8:
        return int8_storage(out, columns)
    return four_bit_storage(out * columns, double_quant, storage)


def _default_skips(arch: Architecture) -> tuple[str, ...]:
    """``get_keys_to_not_convert``: the output embedding and, when the embedding is tied to it, both
    modules; the last parameter's module is ``lm_head`` when untied (a norm otherwise, never a Linear)."""
    if not arch.tied_embeddings:
        return ("lm_head",)
    embedding = next(m.hf_name for m in hf_modules(arch) if m.module == "embed_tokens")
    return ("lm_head", embedding)


def _converted(name: str, patterns: tuple[str, ...]) -> bool:
    """quantizers/quantizers_utils.py ``should_convert_module``."""
    return not any(
        re.match(f"{key}\\.", name) or re.match(key, name) or name.endswith(key) for key in patterns
    )


@lru_cache(maxsize=64)
def quantized_modules(
    arch: Architecture, skip_modules: tuple[str, ...] | None = None
) -> tuple[HfModule, ...]:
    """The modules bitsandbytes quantises in ``arch``; ``skip_modules`` is ``llm_int8_skip_modules``
    (None: transformers' default skips)."""
    patterns = _default_skips(arch) if skip_modules is None else skip_modules
    return tuple(
        m
        for m in hf_modules(arch)
        if m.cls in (ModuleClass.LINEAR, ModuleClass.CONV1D) and m.tensors and _converted(m.hf_name, patterns)
    )
