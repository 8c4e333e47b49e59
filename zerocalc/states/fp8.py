"""What Transformer Engine's FP8 recipes keep of the weights beside the model states (Megatron-LM).

Transformer Engine 2.x (2.20.0.dev0, ``transformer_engine/pytorch/module/linear.py``): a training Linear
quantises its weight for both usages (``weight_quantizer.set_usage(rowwise=True, columnwise=...)``,
columnwise when gradients are on: the transposed copy the data-gradient GEMM reads, or MXFP8's second
quantisation along columns) and keeps the result as a workspace across micro-batches and steps
(``cache_name = "weight"`` whenever ``is_first_microbatch`` is given, which Megatron-LM's TE wrappers do:
``core/extensions/transformer_engine.py``, unless ``disable_parameter_transpose_cache``). So each converted
weight holds, beside its 16-bit parameter, two fp8 copies and their scales (a 128×128 block's fp32 scale
under Float8BlockScaling, one E8M0 byte per 32 elements under MXFP8BlockScaling; one scale per tensor
otherwise, not counted). With ``quantized_model_init`` (Megatron-LM ``--fp8-param-gather``:
``argument_utils.py`` ``fp8_param = args.fp8_param_gather``) the fp8 tensor is the parameter: no 16-bit
copy of the converted weights; its two usages and scales remain. The fp32 main gradients, master copy and
Adam states are untouched (the precision record's master and optimizer dtypes).
"""

from __future__ import annotations

from collections.abc import Callable

from zerocalc.base.units import ceil_div
from zerocalc.parallel.fp8 import converted_elements
from zerocalc.parallel.precision import Fp8Library
from zerocalc.request.training import TrainingRequest

USAGES = 2
"""Rowwise and columnwise: a training Linear's weight in both (``set_usage(rowwise=True,
columnwise=True)``)."""


def te_fp8(request: TrainingRequest) -> bool:
    """The request runs a Transformer Engine FP8 recipe."""
    return request.fp8.on and request.fp8.record.library is Fp8Library.TRANSFORMER_ENGINE


def te_param_parts(request: TrainingRequest, rest: int) -> Callable[[int], dict[str, int]]:
    """The parameters' tensors of a part of ``n`` elements (:data:`~zerocalc.states.memory.PartsOf`): the
    stored 16-bit parameters, and under a Transformer Engine FP8 recipe, in the part of ``rest`` elements
    (everything but the routed experts: 3-D grouped GEMMs, never converted), the converted weights' fp8
    copies and scales, their 16-bit parameters gone with ``--fp8-model-init``."""
    stored = request.dtypes.stored
    key = f"params_{stored.value}"
    if not te_fp8(request):
        return lambda n: {key: n * stored.bytes}
    fp8 = request.fp8
    converted = converted_elements(request.architecture, fp8)
    dtypes = request.framework_record.dtypes(request.precision, request.reduce_dtype, fp8=fp8.use)
    recipe = fp8.record
    copy = dtypes.stored if fp8.model_init else dtypes.gemm_input
    name = f"fp8_params_{copy.value}" if fp8.model_init else f"fp8_weight_copies_{copy.value}"

    def parts(n: int) -> dict[str, int]:
        c = converted if n == rest else 0
        found = {key: (n - c if fp8.model_init else n) * stored.bytes}
        if c:
            found[name] = USAGES * c * copy.bytes
            if recipe.weight_block:
                found["fp8_scales"] = USAGES * ceil_div(c, recipe.weight_block) * recipe.scale_bytes
        return found

    return parts
