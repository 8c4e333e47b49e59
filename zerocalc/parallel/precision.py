"""Precision recipes: the dtypes of compute parameters, gradients, master weights and optimizer states.

The bytes per parameter follow the ZeRO paper (Rajbhandari et al. 2020, section 3.1): mixed-precision
Adam keeps 2-byte parameters and gradients (b_p = b_g = 2) and K = 12 bytes of optimizer state (a 4-byte
fp32 master copy plus 4-byte m and v). The optimizer's own states are counted by
``zerocalc.parallel.optimizers``;
this module says which dtype they are kept in and whether a master copy exists.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.base.dtypes import DType


class PrecisionName(StrEnum):
    BF16_MIXED = "bf16-mixed"
    FP16_MIXED = "fp16-mixed"
    FP32 = "fp32"
    BF16_PURE = "bf16-pure"


class PrecisionRecipe(NamedTuple):
    """Which dtype each model-state tensor is kept in."""

    name: PrecisionName
    param_dtype: DType
    """Compute copy of the parameters (b_p = its size)."""
    grad_dtype: DType
    """Gradients as produced by backward and reduced across ranks (b_g = its size)."""
    master_dtype: DType | None
    """fp32 master copy of the parameters kept by the optimizer, or None when it updates them in place."""
    optimizer_state_dtype: DType
    """Dtype of the optimizer's full-precision states (Adam's m and v, SGD's momentum)."""
    note: str


RECIPES: dict[PrecisionName, PrecisionRecipe] = {
    recipe.name: recipe
    for recipe in (
        PrecisionRecipe(
            name=PrecisionName.BF16_MIXED,
            param_dtype=DType.BF16,
            grad_dtype=DType.BF16,
            master_dtype=DType.FP32,
            optimizer_state_dtype=DType.FP32,
            note="bf16 parameters and gradients, fp32 master weights and optimizer states (ZeRO paper §3.1)",
        ),
        PrecisionRecipe(
            name=PrecisionName.FP16_MIXED,
            param_dtype=DType.FP16,
            grad_dtype=DType.FP16,
            master_dtype=DType.FP32,
            optimizer_state_dtype=DType.FP32,
            note=(
                "fp16 parameters and gradients, fp32 master weights and optimizer states; dynamic loss "
                "scaling keeps one scalar, no per-parameter state (Micikevicius et al. 2018)"
            ),
        ),
        PrecisionRecipe(
            name=PrecisionName.FP32,
            param_dtype=DType.FP32,
            grad_dtype=DType.FP32,
            master_dtype=None,
            optimizer_state_dtype=DType.FP32,
            note="fp32 everywhere; the parameters are their own master copy",
        ),
        PrecisionRecipe(
            name=PrecisionName.BF16_PURE,
            param_dtype=DType.BF16,
            grad_dtype=DType.BF16,
            master_dtype=None,
            optimizer_state_dtype=DType.BF16,
            note="bf16 parameters, gradients and optimizer states, no fp32 master copy",
        ),
    )
}
