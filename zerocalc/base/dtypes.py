"""Numeric formats and their sizes: the one table every byte count in zerocalc is derived from."""

from __future__ import annotations

from enum import StrEnum

from zerocalc.base.errors import InputError, shown


class DType(StrEnum):
    """A tensor element format. The value is the short name used on the command line and in JSON."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    UINT8 = "uint8"
    """Bytes of packed or quantised storage (bitsandbytes' 4-bit weights, their double-quantised absmax)."""

    @property
    def bytes(self) -> int:
        """Bytes per element (IEEE 754 binary32/binary16, bfloat16, OCP FP8 E4M3/E5M2, int8, uint8)."""
        return _BYTES_PER_ELEMENT[self]

    @property
    def torch_name(self) -> str:
        """The attribute of ``torch`` naming this format (used by bench/validate only)."""
        return _TORCH_NAMES[self]


class TensorRole(StrEnum):
    """What a tensor is to the training step, which decides its dtype (the precision record,
    :mod:`zerocalc.parallel.precision`, maps each role to a dtype for a recipe and a framework's layout)."""

    STORED = "stored"
    """The parameters as the model keeps them at rest (FSDP: its shards), and so their ``.grad`` where the
    framework leaves gradients in the parameters' dtype (DDP)."""
    COMPUTE = "compute"
    """The weights forward and backward read: the all-gathered or cast copy (FSDP ``param_dtype``,
    DeepSpeed's bit16 parameters, autocast's cast)."""
    MODULE_WEIGHT = "module_weight"
    """The parameter a module holds while its forward runs, whose dtype the module's code reads
    (``lora_A.weight.dtype``): FSDP's unsharded parameter in ``param_dtype``, DeepSpeed's bit16 parameter,
    the stored parameter itself where autocast casts each op's inputs instead (DDP)."""
    GEMM_INPUT = "gemm_input"
    """What a matrix multiply is fed: the compute dtype, or a low-precision cast of it."""
    ACTIVATION = "activation"
    """Activations, and the tensors backward saves of them."""
    GRADIENT = "gradient"
    """Gradients as backward produces them (of the compute copy)."""
    MAIN_GRADIENT = "main_gradient"
    """The gradients the optimizer steps from (Megatron-LM's ``main_grad``, FSDP's sharded ``.grad``)."""
    REDUCE = "reduce"
    """Gradients as a data-parallel reduction moves them (``--reduce-dtype``, FSDP ``reduce_dtype``)."""
    ALL_GATHER = "all_gather"
    """Parameters as an all-gather moves them (the wire)."""
    MASTER = "master"
    """A separate master copy of the parameters kept by the optimizer (None: the parameters are their own)."""
    OPTIMIZER_STATE = "optimizer_state"
    """The optimizer's full-precision states (Adam's m and v)."""


_BYTES_PER_ELEMENT: dict[DType, int] = {
    DType.FP32: 4,
    DType.BF16: 2,
    DType.FP16: 2,
    DType.FP8: 1,
    DType.INT8: 1,
    DType.UINT8: 1,
}

_TORCH_NAMES: dict[DType, str] = {
    DType.FP32: "float32",
    DType.BF16: "bfloat16",
    DType.FP16: "float16",
    DType.FP8: "float8_e4m3fn",
    DType.INT8: "int8",
    DType.UINT8: "uint8",
}

_ALIASES: dict[str, DType] = {
    "float32": DType.FP32,
    "float": DType.FP32,
    "bfloat16": DType.BF16,
    "float16": DType.FP16,
    "half": DType.FP16,
}


def parse_dtype(text: str, what: str = "{dtype}", allowed: tuple[DType, ...] | None = None) -> DType:
    """Resolve a dtype name (``bf16``, ``bfloat16``, ``fp32``, ...), optionally restricted to ``allowed``."""
    key = text.strip().lower()
    dtype = _ALIASES.get(key) or next((d for d in DType if d.value == key), None)
    choices = tuple(dict.fromkeys(allowed or DType))  # (fp32, fp32) under fp32: named once
    if dtype is None or dtype not in choices:
        raise InputError(
            f"{what} {shown(text)} is not accepted; accepted: {', '.join(d.value for d in choices)}"
        )
    return dtype
