"""What FP8 changes of the step's peak (pure): the bytes of FSDP2's gathered weights under the FP8 all-gather.

torchao 0.18 ``float8/fsdp_utils.py``: ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts a
converted weight's shard to fp8 (1 B per element, where FSDP2 would cast it to ``param_dtype``) and
``fsdp_post_all_gather`` wraps the gathered bytes as the ``Float8TrainingTensor`` forward uses and
``Float8Linear`` saves for backward (``ctx.save_for_backward(input_hp, weight_hp_t)``: the unsharded fp8
weight itself, no second copy). torchtitan turns the FP8 all-gather on only where FSDP shards
(``Float8LinearConverter``: ``parallel_dims.dp_shard_enabled and enable_fsdp_float8_all_gather``).
"""

from __future__ import annotations

from functools import lru_cache

from zerocalc.base.dtypes import DType
from zerocalc.model.architecture import Architecture, ParamTensor
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.states.framework import fsdp_units


def fp8_gather_bytes(
    arch: Architecture, fp8: Fp8Setting, param_bytes: int, world: int
) -> dict[str, tuple[int, ...]] | None:
    """Per FSDP unit (named as the timeline names them: ``"root"``, ``"0"`` … ``"L−1"``), each parameter's
    bytes per element as FSDP2 gathers it: 1 for a converted weight, ``param_bytes`` for the rest; None
    without the FP8 all-gather (or on one rank, where nothing is sharded)."""
    if not fp8.all_gather or world == 1:
        return None
    return _gather_bytes(arch, fp8, param_bytes)


def _per_parameter(tensors: list[ParamTensor], fp8: Fp8Setting, param_bytes: int) -> tuple[int, ...]:
    return tuple(DType.FP8.bytes if fp8.converts(t) else param_bytes for t in tensors)


@lru_cache(maxsize=64)
def _gather_bytes(arch: Architecture, fp8: Fp8Setting, param_bytes: int) -> dict[str, tuple[int, ...]]:
    return {
        name.removeprefix("layers.") if name != "root" else "root": _per_parameter(
            list(tensors), fp8, param_bytes
        )
        for name, tensors in fsdp_units(arch)
    }
