"""What a decoder layer holds for a moment above its saved tensors, at its forward and its backward peak."""

from __future__ import annotations

from zerocalc.model.architecture import Architecture
from zerocalc.model.code.base import FP32, ModelCode
from zerocalc.model.code.shape import Shape


def forward_excess(impl, arch, index, t, shape, act) -> int:
    """Above the saved tensors at the layer's forward peak: the mid residual, the down projection's output
    and the new hidden (3·act·T·h; measured on CPU op by op); Mixtral's fp32 routing weights promote the
    combined expert output to fp32 [T, h] and its [S, h] gather.

    Under tensor parallelism (:func:`tensor_parallel_forward_excess`) the peak is the down projection's
    row-parallel reduction instead."""
    if shape.tp > 1:
        return tensor_parallel_forward_excess(impl, arch, shape, act)
    T, h = shape.local_tokens, arch.hidden_size
    extra = 3 * act * T * h
    if t.norm == "layernorm" and arch.residual_dropout > 0:
        extra += act * T * h  # the dropout output before the residual add
    if arch.is_moe_layer(index) and t.router == "softmax_topk_norm":  # fp32 routing weights
        S = T * arch.experts_per_token  # the fp32 weighted output [S, h], its gather, the fp32 sum [T, h]
        extra = max(extra, act * T * h + 2 * FP32 * S * h + FP32 * T * h)
    return extra


def tensor_parallel_forward_excess(impl: ModelCode, arch: Architecture, shape: Shape, act: int) -> int:
    """The down projection's reduction, per rank: its row-parallel partial output (L × h) and the reduced
    result (R rows), out of place (``funcol.all_reduce`` for ``Partial`` → ``Replicate``; torch 2.13
    ``distributed/_functional_collectives.py::reduce_scatter_single`` makes the Shard(1) scatter dimension
    contiguous first, one more L × h copy, under sequence parallelism, while the MLP norm's R-row output
    stays alive as the call argument of ``feed_forward``); the mid residual counts where the norm keeps an
    fp32 copy rather than the residual itself (``hf``). Measured op by op on CPU (torch 2.13, gloo,
    world 2, a torchtitan Llama block with a norm saving its input and rstd as the fused CUDA kernel
    does): b 2, s 64, h 64, f 512 and 64, t 2 with sequence parallelism: 2·act·(L + R)·h."""
    L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    rows = L + R
    if R < L:
        rows += L + R
    if impl.norm_fp32_copy:
        rows += R
    return act * rows * h


def backward_excess(impl, arch, index, t, shape, act) -> int:
    """Above the state at the start of a layer's backward: the down projection's weight gradient (act·h·f,
    plus its bias) and the two f-wide gradients of the activation product (2·act·T·f); measured on CPU
    op by op (the same aten ops run on CUDA). MoE: the combine backward's [S, h] gradients (fp32 for
    Mixtral's fp32 routing weights, 14·S·h; 7·S·h for Qwen2-MoE).

    Per rank under tensor parallelism, f/t columns of L tokens, and the moment the reductions add, where
    larger (measured op by op on CPU as :func:`tensor_parallel_forward_excess`, b 1 and 2, f 512 and 64):

    * sequence parallelism: the output gradient all-gathered to L rows (``funcol``'s gather on dim 1 is a
      staging buffer and a ``cat`` copy unless b = 1, ``_maybe_view_chunk_cat``); then beside it the down
      projection's input and weight gradients. The input gradient's reduce-scatter comes after the MLP's
      saved tensors are freed, and is smaller;
    * without: the up projection's input gradient (L × h) and its out-of-place all-reduce, beside the
      weight gradients of the down and up projections and the activation's pending gradient, once the
      product, activation output and up output are freed (autograd runs the up projection's backward
      before the activation's)."""
    L, h, f = shape.local_tokens, arch.hidden_size, arch.intermediate_size
    if arch.is_moe_layer(index):
        S = L * arch.experts_per_token
        moe = (14 if t.router == "softmax_topk_norm" else 7) * S * h * act // 2
        shared = 0
        if arch.num_shared_experts:
            fs = arch.num_shared_experts * (arch.shared_expert_intermediate_size or f)
            shared = act * h * fs + 2 * act * L * fs
        return max(moe, shared)
    width = shape.split(arch.dense_intermediate_size or f if arch.is_moe else f, "the MLP width")
    bias = act * h if arch.mlp_bias else 0
    mlp = act * h * width + 2 * act * L * width + ((bias + 511) // 512 * 512 if bias else 0)
    if shape.tp == 1:
        return mlp
    if shape.sequence_tokens < L:
        gather = act * L * h * (2 if shape.b > 1 else 1)
        return max(mlp, gather, act * (L * h + L * width + h * width))
    return max(mlp, act * (2 * h * width + 2 * L * h - 2 * L * width))
