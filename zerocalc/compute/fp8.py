"""What FP8 changes of a rank's compute (pure): which of a converted Linear's three GEMMs run in FP8, and the
bytes of the casts that feed them, priced as element-wise (memory-bound) kernels.

**Which GEMMs.** A converted weight (:meth:`~zerocalc.parallel.fp8.Fp8Setting.converts`) runs its forward
and input-gradient products in FP8, and its weight-gradient product too unless its recipe keeps that one in
high precision (the precision record's ``weight_grad_fp8``: torchao ``ROWWISE_WITH_GW_HP``). Transformer
Engine runs all three in FP8 (E4M3 forward, E5M2 gradients under the hybrid format). An FP8 product's rate
is the compute table's FP8 rate for its shape (:meth:`~zerocalc.compute.table.ComputeTable.gemm_rate`).

**The casts**, per converted Linear and micro-batch, bytes read + written per element of the tensor cast:

* torchao 0.18 eager (``float8/float8_linear.py`` ``matmul_with_hp_or_float8_args``; ``float8_utils.py``
  ``tensor_to_amax``, ``to_fp8_saturated``; ``float8_training_tensor.py`` ``_ToFloat8ConstrFunc``), a
  16-bit tensor: ``abs`` r2 w2, ``max`` r2, ``.to(float32)`` r2 w4, ``· scale`` r4 w4, ``clamp`` r4 w4,
  ``.to(float8)`` r4 w1: :data:`TORCHAO_EAGER_CAST` = 33. Forward: the input (m·k) and the weight (n·k);
  backward: the output gradient (m·n) and the weight again for the input gradient, and, where the weight
  gradient runs in FP8, the output gradient (m·n) and the saved high-precision input (m·k) cast once more
  (each cast its own ``hp_tensor_to_float8_dynamic``). A weight all-gathered in FP8 is cast already
  (``tensor_already_casted_to_fp8``; its shard's cast in ``fsdp_pre_all_gather`` is not counted). The
  casts' results have the layouts ``torch._scaled_mm`` takes (``float8_ops.py`` ``preprocess_addmm``
  copies none: traced op by op on the CPU, torch 2.13). Eager, as torchtitan runs without
  ``compile.enable``.
* torchao 0.18 under ``torch.compile`` (``--compile model``: torchtitan compiles the converted Linears
  inside each block): Inductor fuses ``abs``, ``max``, the scale, ``clamp`` and the cast, but the
  tensor-wide amax is a full reduction the cast must wait for, so a cast tensor is read twice, by its amax
  pass (r2) and its cast (r2 w1): :data:`TORCHAO_COMPILED_CAST` = 5; where a fused kernel produces the
  tensor, the cast is that kernel's. Counted from Inductor's generated code (torch 2.13 CPU; a converted
  256 → 768 Linear and a converted torchtitan block at s 128 and 2048, tensorwise; docs/model.md), by
  what writes the Linear's input (:class:`InputFrom`):

  - forward: the weight 5; the input 5, but 1 where a compiled norm writes it (the attention's and the
    MLP's input projections: the norm's kernel writes the FP8 copy instead of the bf16 one, its amax pass
    and its cast reading the norm's input; :data:`TORCHAO_NORM_FUSED_CAST`), over the norm's rows: under
    sequence parallelism tensorwise scaling casts the sequence shard before the all-gather (torchao
    ``float8_tensor_parallel.py`` ``Float8ColwiseParallel._prepare_input_fn``, torchtitan's
    ``enable_float8_tensorwise_tp``), the other recipes cast the gathered input (5);
  - backward: the weight 3 (r2 w1, its amax saved); the output gradient's amax pass and its cast into the
    two layouts the input- and weight-gradient products take, r2 r2 w1 w1 (:data:`TORCHAO_GRAD_CAST` = 6);
    the input again for the weight gradient's product: 5 from the saved bf16 tensor (the attention's
    output), 2 where a compiled norm writes it (its backward kernel writes the FP8 copy, w1, its amax pass
    re-reading the norm's input, shared by the norm's Linears) or where it is SwiGLU's output (its
    forward FP8 copy re-laid out, r1 w1) (:data:`TORCHAO_FUSED_RECAST`). Without an FP8 weight gradient
    (``ROWWISE_WITH_GW_HP``) the output gradient is cast once (5) and the input not again.

  Against the converted block's generated code (each cast input read twice, by its amax and its cast
  pass): at s 2048, 17.0 MB forward and 44.8 MB backward against 17.6 and 39-44; at s 128 4.75 and 5.01 MB
  against 4.78 and 6.03 (the per-Linear rule: one output gradient, the block's, feeds two Linears' casts,
  and the gate's and up's gradients are cast inside SwiGLU's backward).
* Transformer Engine 2.x (``transformer_engine/common/transpose/cast_transpose.cu``): one fused kernel
  per tensor writes its rowwise and columnwise FP8 copies, r2 w1 w1 (:data:`TE_CAST_TRANSPOSE` = 4), with
  the amax computed in the same pass (DelayedScaling from the history; block and MX recipes per block);
  ``Float8CurrentScaling`` reads the tensor once more for its amax first (``nvte_compute_amax``,
  :data:`TE_AMAX` = 2). Forward: the input and the weight (none with FP8 parameters: the distributed
  optimizer's fp8 parameter gather); backward: the output gradient; the input's columnwise copy is saved
  from the forward. The weight is cast every micro-batch here; TE caches it over a step's micro-batches
  (``is_first_microbatch``): an overcount of (A − 1)/A of the weights' casts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.compute.table import ComputeTable
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.precision import Fp8Library, Fp8RecipeName

TORCHAO_EAGER_CAST = 33
"""Bytes per element of torchao's eager cast of a 16-bit tensor to FP8 (see the module's doc)."""
TORCHAO_COMPILED_CAST = 5
"""Bytes per element of torchao's cast under torch.compile: the amax pass r2, the fused cast r2 w1."""
TORCHAO_COMPILED_RECAST = 3
"""Bytes per element of a compiled cast from an amax already computed (the weight in backward): r2 w1."""
TORCHAO_NORM_FUSED_CAST = 1
"""Bytes per element of a compiled cast fused into the norm that writes the input: the FP8 copy (w1); the
amax pass's and the cast's reads of the norm's input replace the norm's bf16 write and its read."""
TORCHAO_GRAD_CAST = 6
"""Bytes per element of a compiled output gradient's casts: its amax pass r2, the cast r2 into two layouts
w1 w1."""
TORCHAO_FUSED_RECAST = 2
"""Bytes per element of the input's compiled re-cast for the weight gradient where a fused kernel makes it
(the norm's backward, SwiGLU's saved FP8 copy re-laid out)."""


class InputFrom(StrEnum):
    """What writes a Linear's input in a compiled block (where its FP8 cast runs)."""

    SAVED = "saved"
    """An extern kernel's output (the attention's): cast on its own."""
    NORM = "norm"
    """A compiled norm's kernel."""
    SWIGLU = "swiglu"
    """SwiGLU's compiled kernel."""


TE_CAST_TRANSPOSE = 4
"""Bytes per element of Transformer Engine's fused cast-transpose of a 16-bit tensor."""
TE_AMAX = 2
"""Bytes per element of Transformer Engine's separate amax pass (current scaling)."""


class Fp8Gemms(NamedTuple):
    """Which of a Linear's products run in FP8."""

    forward: bool = False
    input_grad: bool = False
    weight_grad: bool = False


HIGH_PRECISION = Fp8Gemms()


def fp8_gemms(fp8: Fp8Setting) -> Fp8Gemms:
    """The products a weight ``fp8`` converts runs in FP8 (its recipe's)."""
    if not fp8.on:
        return HIGH_PRECISION
    return Fp8Gemms(True, True, fp8.record.weight_grad_fp8)


def cast_bytes(
    m: int,
    n: int,
    k: int,
    fp8: Fp8Setting,
    compiled: bool = False,
    source: InputFrom = InputFrom.SAVED,
    norm_rows: int | None = None,
) -> tuple[int, int]:
    """(forward, backward) bytes of the casts feeding a converted Linear's products, an (m × k) input and an
    (n × k) weight (see the module's doc); ``compiled``: torchao's casts under torch.compile, ``source``:
    what writes the input there, ``norm_rows``: the rows a compiled norm writing it runs on (its sequence
    shard under sequence parallelism, where torchao's ``Float8ColwiseParallel`` casts before the
    all-gather; m by default)."""
    weight_cast = not fp8.all_gather and not fp8.model_init  # an fp8 weight is cast already
    if fp8.record.library is Fp8Library.TORCHAO and compiled:
        cast = TORCHAO_COMPILED_CAST
        fused = (m if norm_rows is None else norm_rows) * k  # the input's elements the norm's kernel casts
        forward = TORCHAO_NORM_FUSED_CAST * fused if source is InputFrom.NORM else cast * m * k
        forward += cast * n * k if weight_cast else 0
        backward = TORCHAO_COMPILED_RECAST * n * k if weight_cast else 0
        if not fp8.record.weight_grad_fp8:
            return forward, backward + cast * m * n
        recast = {InputFrom.SAVED: cast * m * k, InputFrom.NORM: TORCHAO_FUSED_RECAST * fused}
        return forward, backward + TORCHAO_GRAD_CAST * m * n + recast.get(
            source, TORCHAO_FUSED_RECAST * m * k
        )
    if fp8.record.library is Fp8Library.TORCHAO:
        per = TORCHAO_EAGER_CAST
        forward = per * (m * k + (n * k if weight_cast else 0))
        backward = per * (m * n + (n * k if weight_cast else 0))
        if fp8.record.weight_grad_fp8:
            backward += per * (m * n + m * k)
        return forward, backward
    per = TE_CAST_TRANSPOSE + (TE_AMAX if fp8.recipe is Fp8RecipeName.CURRENT else 0)
    return per * (m * k + (n * k if weight_cast else 0)), per * m * n


def fp8_rate_note(fp8: Fp8Setting, table: ComputeTable, compiled: bool = False) -> str:
    """Where the step's FP8 GEMM rates come from (said under a step that runs FP8 GEMMs)."""
    measured = any(p.dtype is DType.FP8 for p in table.gemm)
    if measured:
        rates = "the compute table's measured FP8 GEMMs (torch._scaled_mm)"
    elif any(p.dtype is DType.BF16 for p in table.gemm):
        rates = (
            "the compute table's bf16 GEMM rate at each shape × the fp8 / bf16 datasheet peaks (an "
            "assumption: FP8 GEMMs reach the bf16 ones' fraction of their peak)"
        )
    else:
        rates = "the roofline over the datasheet's dense FP8 peak"
    if fp8.record.library is not Fp8Library.TORCHAO:
        casts = "Transformer Engine's fused casts"
    elif compiled:
        casts = "torchao's casts under torch.compile at 5 B per element (amax pass, fused cast)"
    else:
        casts = "torchao's eager casts at 33 B per element (no torch.compile)"
    return f"{{fp8}} {fp8.recipe.value}: its GEMMs at {rates}; {casts} as element-wise kernels"
