"""A decoder layer's moments beyond its saved tensors, node by node where the coarse terms miss them
(pure): Hugging Face transformers 5.17 under torch 2.13's autograd.

The timeline (:mod:`zerocalc.peak.timeline`) holds a layer's saved tensors from its forward to its
backward, adds :attr:`~zerocalc.model.code.base.LayerSaves.forward_excess` at the layer's forward peak
and :attr:`~zerocalc.model.code.base.LayerSaves.backward_excess` at the start of its backward, then its
weight gradients once the saved tensors are freed. Autograd produces each weight's gradient when the
weight's node runs, while the saved tensors of the nodes still to run are alive, and the gradient stays
(``AccumulateGrad`` into the unsharded parameter's ``.grad``) until the unit's post-backward reduces it.
Three moments of the real order are larger than those terms:

* a mixture-of-experts layer's backward (:func:`experts_backward_program`): the experts' weight
  gradients, the largest tensors of the layer ([E, 2f, h] and [E, h, f]), are produced first, beside
  nearly every saved tensor of the layer;
* its forward (:func:`experts_forward_transients`): the weighted expert outputs and their gather by the
  inverse permutation, [S, h] each, with the router's and the sort's tensors still held;
* the layer's first norm (:func:`first_norm_backward_excess`): its backward runs last, when every weight
  gradient of the layer exists, with its saved fp32 input and the fp32 gradients of its chain.

Each was traced op by op under ``FakeTensorMode`` and PyTorch's ``FSDPMemTracker`` on the CPU (torch
2.13.0, transformers 5.17.0; the same aten ops and autograd nodes run on CUDA), on Qwen3-30B-A3B's and
Mixtral-8x7B's layer shapes (4 layers, FSDP2 at worlds 4 to 128, b 2, s 537) and Llama-3-8B's.
"""

from __future__ import annotations

from zerocalc.model.architecture import Architecture, BlockLayout
from zerocalc.model.code import FP32, INT64, ModelCode, Shape
from zerocalc.model.traits import traits

Op = tuple[str, str, int]
"""``(verb, name, size)``: ``("temp", name, bytes)`` a gradient or intermediate of the backward,
``("drop", name, 0)`` frees it, ``("free", name, 0)`` frees the layer's saved tensor ``name`` (the last
node holding it has run), ``("grad", parameter, elements)`` a weight's gradient (kept as the unit's
unsharded gradient)."""

ROUTED_WEIGHTS = {"softmax_topk_norm": FP32, "softmax_topk_norm_cast": 0}
"""The routers whose experts run ``grouped_mm_experts_forward`` alone (no shared experts), and the bytes per
element of the routing weights they hand the experts: Mixtral's stay fp32 (``MixtralTopKRouter``:
``router_top_value /= …`` of the fp32 softmax), Qwen3-MoE's are cast back to the compute dtype
(``Qwen3MoeTopKRouter``: ``.to(router_logits.dtype)``; 0: the compute dtype)."""


def experts_traced(impl: ModelCode, arch: Architecture, index: int, shape: Shape) -> bool:
    """The layer's experts are traced node by node here (:func:`experts_forward_transients`,
    :func:`experts_backward_program`): ``grouped_mm_experts_forward`` alone (no shared experts) under a
    router of :data:`ROUTED_WEIGHTS`, on one rank's whole micro-batch (no tensor, context or expert
    parallelism)."""
    return (
        impl.transformers_modules
        and impl.transients
        and arch.is_moe_layer(index)
        and traits(arch).router in ROUTED_WEIGHTS
        and not arch.num_shared_experts
        and shape.tp == 1
        and shape.cp == 1
        and shape.ep == 1
    )


def experts_forward_transients(
    impl: ModelCode, arch: Architecture, index: int, shape: Shape, act: int
) -> tuple[int, ...]:
    """Bytes of each tensor alive above the layer's saved ones at a mixture-of-experts layer's forward
    peak, the gather ``weighted_out[inv_perm]`` of transformers 5.17 ``integrations/moe.py``
    ``grouped_mm_experts_forward`` (in place of :attr:`~zerocalc.model.code.base.LayerSaves.
    forward_excess`; empty where not written, :func:`experts_backward_program`'s conditions): the mid
    residual [T, h]; the router's logits [T, E] and scores [T, k] (``Qwen3MoeSparseMoeBlock`` /
    ``MixtralSparseMoeBlock`` hold the router's outputs until the block returns: Qwen3-MoE's the
    compute-dtype cast, Mixtral's the fp32 top-k values divided in place); the function's locals: the
    sorted expert ids (int64 [S]), ``expert_ids_g.float()`` [S] and ``histc``'s [E] fp32; the weighted
    output ``proj_out * sample_weights_g`` and its gather, p [S, h] each (p fp32 with fp32 routing
    weights). The ``sum`` over the k copies comes once the weighted output is freed, and is smaller
    (traced, module docstring)."""
    if not experts_traced(impl, arch, index, shape):
        return ()
    T, h, E, k = shape.local_tokens, arch.hidden_size, arch.num_experts, arch.experts_per_token
    S = T * k
    weights = ROUTED_WEIGHTS[traits(arch).router] or act
    p = max(act, weights)
    return (act * T * h, act * T * E, weights * T * k, INT64 * S, FP32 * S, FP32 * E, p * S * h, p * S * h)


def experts_backward_program(
    impl: ModelCode, arch: Architecture, index: int, shape: Shape, act: int
) -> tuple[Op, ...]:
    """The backward of a mixture-of-experts layer's experts, node by node, from the gradient of the block's
    output to the gradient of its input (transformers 5.17 ``integrations/moe.py``
    ``grouped_mm_experts_forward``, the default ``grouped_mm`` experts; torch 2.13 autograd): empty where
    it is not written (other code, other routers, shared experts, tensor, context or expert parallelism).

    Forward: ``sort`` of the expert ids (``perm``), the tokens gathered by ``perm // k`` [S, h], the
    routing weights gathered by ``perm`` [S], ``masked_fill_`` by the sentinel mask, ``grouped_mm`` with
    ``gate_up_proj`` [S, 2f] and its ``masked_fill``, ``silu(gate) * up`` [S, f], ``grouped_mm`` with
    ``down_proj`` and its ``masked_fill`` [S, h], ``* sample_weights_g`` (fp32 [S, h] for fp32 routing
    weights), the gather by the inverse permutation, ``view(T, k, h).sum(1)``, ``.to(dtype)``. Backward,
    in reverse (S = T·k; p is the combine's dtype, fp32 with fp32 routing weights):

    1. ``ToCopyBackward0`` (fp32 weights only): the output gradient in fp32 [T, h];
    2. ``ViewBackward0`` of the expanded ``SumBackward1`` gradient: a copy p [S, h];
    3. ``IndexBackward0`` (by the inverse permutation): ``new_zeros`` and ``index_put`` p [S, h]; the
       inverse permutation is freed;
    4. ``MulBackward0`` (``proj_out * w``): grad·proj_out p [S, h] (summed into the weights' gradient
       [S]) and grad·w p [S, h] (cast to the compute dtype when p is fp32); the sorted routing weights and
       the down projection's output are freed;
    5. ``MaskedFillBackward0``: [S, h];
    6. ``GroupedMmBackward0`` (down): ``down_proj``'s gradient [E, h, f], then the input's [S, f]; the
       down input (``silu(gate) * up``) is freed;
    7. ``MulBackward0``: [S, f] twice; the activation output is freed;
    8. ``SiluBackward0``: [S, f]; the gate/up output (whose views gate and up were saved) is freed;
    9. ``SplitBackward0``: the ``cat`` [S, 2f]; 10. ``MaskedFillBackward0``: [S, 2f];
    11. ``GroupedMmBackward0`` (gate/up): ``gate_up_proj``'s gradient [E, 2f, h], then the input's
        [S, h] — the layer's peak, both expert gradients beside the attention's and the norms' saved
        tensors; the offsets and the gathered tokens are freed;
    12. ``MaskedFillBackward0`` (of the in-place ``masked_fill_``): [S, h]; the sentinel mask is freed;
    13. ``IndexBackward0`` (the weights by ``perm``): [S] twice; ``perm`` is freed;
    14. ``IndexBackward0`` (the tokens by ``perm // k``): [T, h] twice; ``perm // k`` is freed.

    The router's backward that follows holds [T, E] and [T, k] tensors (freed with the layer's other
    saved tensors here)."""
    if not experts_traced(impl, arch, index, shape):
        return ()
    T, h, f = shape.local_tokens, arch.hidden_size, arch.intermediate_size
    E, k = arch.num_experts, arch.experts_per_token
    S = T * k
    weights = ROUTED_WEIGHTS[traits(arch).router] or act
    p = max(act, weights)  # the combine's dtype: the routing weights promote it to fp32
    ops: list[Op] = []
    if p != act:
        ops.append(("temp", "d output (fp32)", p * T * h))
    ops.append(("temp", "d weighted (view copy)", p * S * h))
    if p != act:
        ops.append(("drop", "d output (fp32)", 0))
    ops += [
        ("temp", "d weighted (zeros)", p * S * h),
        ("temp", "d weighted", p * S * h),
        ("drop", "d weighted (zeros)", 0),
        ("drop", "d weighted (view copy)", 0),
        ("free", "experts: inverse perm", 0),
        ("temp", "d weighted · down output", p * S * h),
        ("temp", "d down output", p * S * h),
    ]
    if p != act:
        ops += [
            ("temp", "d down output (cast)", act * S * h),
            ("drop", "d down output", 0),
            ("temp", "d routing weights (sum)", weights * S),
        ]
    else:
        ops.append(("temp", "d routing weights (sum)", weights * S))
    down_output = "d down output (cast)" if p != act else "d down output"
    ops += [
        ("drop", "d weighted · down output", 0),
        ("drop", "d weighted", 0),
        ("free", "experts: routing weights (sorted)", 0),
        ("free", "experts: down output", 0),
        ("temp", "d down output (masked)", act * S * h),
        ("drop", down_output, 0),
        ("grad", "experts down_proj", E * h * f),
        ("temp", "d down input", act * S * f),
        ("drop", "d down output (masked)", 0),
        ("free", "experts: activation × up (down input)", 0),
        ("temp", "d up", act * S * f),
        ("temp", "d activation", act * S * f),
        ("drop", "d down input", 0),
        ("free", "experts: activation output", 0),
        ("temp", "d gate", act * S * f),
        ("drop", "d activation", 0),
        ("free", "experts: gate/up output", 0),
        ("temp", "d gate/up", 2 * act * S * f),
        ("drop", "d gate", 0),
        ("drop", "d up", 0),
        ("temp", "d gate/up (masked)", 2 * act * S * f),
        ("drop", "d gate/up", 0),
        ("grad", "experts gate_up_proj", E * 2 * f * h),
        ("temp", "d gathered tokens", act * S * h),
        ("drop", "d gate/up (masked)", 0),
        ("free", "experts: offsets", 0),
        ("free", "experts: gathered tokens", 0),
        ("temp", "d gathered tokens (masked)", act * S * h),
        ("drop", "d gathered tokens", 0),
        ("free", "experts: sentinel mask", 0),
        ("temp", "d sorted weights (zeros)", weights * S),
        ("temp", "d sorted weights", weights * S),
        ("drop", "d sorted weights (zeros)", 0),
        ("drop", "d routing weights (sum)", 0),
        ("free", "experts: perm", 0),
        ("temp", "d tokens (zeros)", act * T * h),
        ("temp", "d experts input", act * T * h),
        ("drop", "d tokens (zeros)", 0),
        ("drop", "d gathered tokens (masked)", 0),
        ("free", "experts: perm // k", 0),
        ("drop", "d sorted weights", 0),
        ("drop", "d experts input", 0),
    ]
    return tuple(ops)


def first_norm_backward_excess(impl: ModelCode, arch: Architecture, shape: Shape, act: int) -> int:
    """Above the layer's gradients once its saved tensors are freed, while its first norm's backward runs
    (the last of the layer's; 0 where not written): transformers 5.17's Llama-family ``RMSNorm``
    (``hidden_states.to(float32)``, ``pow(2).mean(-1)``, ``* rsqrt``, ``.to(dtype)``, ``weight *``) in a 16-
    or 8-bit compute dtype, before the attention of a pre-norm block. ``MulBackward0`` of ``weight *`` has
    produced the weight's gradient (every weight of the layer then has one); ``ToCopyBackward0`` gives the
    fp32 gradient [R, h], ``MulBackward0`` of ``x · rsqrt`` the direct input gradient [R, h] (kept until
    the two paths are added) and the rsqrt's, ``MeanBackward1`` [R, h], ``PowBackward0`` ``pow``, ``·2``
    and the product [R, h]: with the saved fp32 copy of the input (freed once ``PowBackward0`` has run),
    six fp32 [R, h] tensors at once (traced, module docstring)."""
    t = traits(arch)
    if (
        not impl.transformers_modules
        or not impl.transients
        or not impl.norm_fp32_copy
        or act == FP32
        or t.norm != "llama"
        or arch.block_layout is not BlockLayout.PRE_NORM
        or shape.tp > 1
        or shape.cp > 1
    ):
        return 0
    return 6 * FP32 * shape.sequence_tokens * arch.hidden_size
