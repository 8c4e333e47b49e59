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

    @property
    def bytes(self) -> int:
        """Bytes per element (IEEE 754 binary32/binary16, bfloat16, OCP FP8 E4M3/E5M2, int8)."""
        return _BYTES_PER_ELEMENT[self]

    @property
    def torch_name(self) -> str:
        """The attribute of ``torch`` naming this format (used by bench/validate only)."""
        return _TORCH_NAMES[self]


_BYTES_PER_ELEMENT: dict[DType, int] = {
    DType.FP32: 4,
    DType.BF16: 2,
    DType.FP16: 2,
    DType.FP8: 1,
    DType.INT8: 1,
}

_TORCH_NAMES: dict[DType, str] = {
    DType.FP32: "float32",
    DType.BF16: "bfloat16",
    DType.FP16: "float16",
    DType.FP8: "float8_e4m3fn",
    DType.INT8: "int8",
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
