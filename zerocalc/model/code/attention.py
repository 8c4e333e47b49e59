"""What attention keeps for backward, in the codes built from PyTorch modules; SDPA without a mask."""

from __future__ import annotations

from zerocalc.model.activations import CpImpl
from zerocalc.model.architecture import QkNorm
from zerocalc.model.code.base import FP32, INT64, Device

SDPA_NO_MASK = "SDPA, no mask"
"""``integrations/sdpa_attention.py``: ``is_causal`` with ``attn_mask`` None where ``masking_utils.
_ignore_causal_mask_sdpa`` drops the causal mask (no padding, no sliding window shorter than s): SDPA's
flash kernel on CUDA in bf16/fp16."""


def attention_saves(add, norm, arch, t, impl, T, shape, act, device, copies, flash) -> None:
    """q, k, v as attention keeps them, its output (the o projection's input) and its softmax statistics,
    for the rank's T tokens and its a/t heads and kv/t key/value heads.

    SDPA with GQA is not expanded (``sdpa_attention.use_gqa_in_sdpa``: ``enable_gqa=True``); q and k are
    kept after the rotary embedding (``q * cos`` keeps only ``cos``); with ``use_cache`` k and v are the
    ``DynamicLayer.update`` copies. GPT-2's q, k, v are views of ``c_attn``'s output, which therefore stays
    whole, next to the k/v cache copies.

    Ulysses context parallelism (DeepSpeed ``runtime/sequence_parallel/ulysses_sp.py``
    ``UlyssesSPAttentionHF``): SDPA keeps q, k, v and its output all-to-all'd to s × a/c heads (the same
    bytes; k and v repeated to c heads where fewer, ``kv_replication_factor``), and the o projection keeps
    the output all-to-all'd back; the cache's k and v copies are the local ones.
    """
    a = shape.split(arch.num_heads, "attention heads")
    kv = shape.split(arch.kv_heads, "key/value heads")
    d = arch.dim_per_head
    ulysses = shape.cp > 1 and shape.cp_impl is CpImpl.ULYSSES
    mla = arch.latent_attention
    if mla is not None:
        # DeepseekV3Attention: q_a_proj → q_a_layernorm → q_b_proj; kv_a_proj_with_mqa → kv_a_layernorm →
        # kv_b_proj; q/k as cat(nope, roped pe); v padded to the qk head dim only for flash-attn-2
        q_width = a * mla.qk_head_dim
        if mla.q_lora_rank is not None:
            norm("q_a norm", mla.q_lora_rank, T)
            add("q_b_proj input", act * T * mla.q_lora_rank)
        kv_a = act * T * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        if impl.norm_fp32_copy and act == FP32:
            # the norm's x.to(float32) of the kv_nope split is that view itself: pow keeps the whole output
            add("kv_a_proj output (the kv_a norm's input is a view of it)", kv_a)
            norm("kv_a norm", mla.kv_lora_rank, T, input_kept=True)
        elif impl.norm_fp32_copy:
            # the norm copies the kv_nope split to fp32 and the rotary keeps only cos and sin: the output
            # itself is kept by nothing
            norm("kv_a norm", mla.kv_lora_rank, T)
        else:
            add("kv_a_proj output", kv_a)
            norm("kv_a norm", mla.kv_lora_rank, T)
        add("kv_b_proj input", act * T * mla.kv_lora_rank)
        add("q", act * T * q_width)
        add("k", act * T * q_width)
        # expand_kv: v is the split of kv_b_proj's [.., qk_nope + v_head] output, a view: SDPA keeps it, so
        # the whole output stays; eager matmul(probs, v) folds it into [b·a, s, v_head], a copy when b > 1
        if not flash and shape.b > 1:
            add("v (matmul's contiguous copy)", act * T * a * mla.v_head_dim)
        else:
            add(
                "v (a view of the kv_b_proj output, kept whole)",
                act * T * a * (mla.qk_nope_head_dim + mla.v_head_dim),
            )
        out = a * mla.v_head_dim
    else:
        q_width, kv_width = a * d, kv * d
        if t.qkv_views_kept and not flash and shape.b > 1:
            # eager matmul(q, kᵀ) folds q [b, a, s, d] (a view of c_attn's output) into [b·a, s, d]: a copy
            # when b > 1, saved by bmm; c_attn's output is then kept by nothing
            add("q (matmul's contiguous copy)", act * T * q_width)
        elif (t.qkv_views_kept and arch.fused_qkv) or (t.qkv_views_kept and not t.rotary):
            add("q/k/v projection output (q is a view of it)", act * T * (q_width + 2 * kv_width))
        if arch.qk_norm is QkNorm.PER_HEAD:
            norm("q norm", d, T * a)
            norm("k norm", d, T * kv)
        elif arch.qk_norm is QkNorm.FULL:
            norm("q norm", q_width, T)
            norm("k norm", kv_width, T)
        if not t.qkv_views_kept:
            add("q", act * T * q_width)
        if ulysses:
            all_to_all_width = max(kv, shape.cp) * d  # this rank's s × kv/c heads, as many bytes as T × kv
            if copies:
                add("k", act * T * kv_width)
                add("v", act * T * kv_width)
            add("k after the all-to-all", act * T * all_to_all_width)
            add("v after the all-to-all", act * T * all_to_all_width)
        elif copies or not t.qkv_views_kept:
            add("k", act * T * kv_width)
            add("v", act * T * kv_width)
        out = q_width
    if ulysses:
        add("attention output before the all-to-all", act * T * out)
    if flash and t.rotary_cat:
        add("attention output", act * T * out)
        add("o projection input (a copy of the [b, a, s, d] output)", act * T * out)
    else:
        add("attention output (o projection input)", act * T * out)
    b, s = shape.b, shape.s
    if flash:
        add("softmax log-sum-exp", FP32 * T * a)
    else:
        probs = b * a * s * s
        if t.attention_softcap:
            add("attention soft-capping tanh output", act * probs)
        if t.eager_sink_column:  # GPT-OSS: the softmax over s + 1 columns, after the max's subtraction
            add("row max indices (int64)", INT64 * b * a * s)
            add("softmax probabilities (with the sink column)", act * b * a * s * (s + 1))
        elif t.eager_softmax_fp32:
            add("softmax probabilities (fp32)", FP32 * probs)
            add("probabilities cast", act * probs if act != FP32 else 0)
        else:
            add("softmax probabilities", act * probs)
        if arch.attention_dropout > 0:
            add("attention dropout mask", (1 if device is Device.CUDA else act) * probs)
            add("attention dropout output", act * probs)
        if kv != a:  # eager repeats k and v to every head (repeat_kv)
            add("k, v repeated", 2 * act * T * (a - kv) * d)
