"""The family traits: how a family's transformers code computes what the architecture describes."""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.model.architecture import Architecture, MlpKind, NormKind


class Traits(NamedTuple):
    """How a family's transformers code computes what the architecture describes."""

    norm: str
    """``llama`` (x.float(), rsqrt, .to(dtype), weight *), ``gemma`` / ``olmo`` (the product with the
    weight in fp32: the normalised fp32 tensor is kept), ``layernorm`` (input, mean, rstd)."""
    gelu: str
    """``tanh_decomposed`` (GPT-2 ``NewGELUActivation``: four tensors), ``exact`` (``nn.GELU``)."""
    qkv_views_kept: bool
    """A fused q/k/v output whose q is saved as a view, so the whole storage stays (GPT-2 ``c_attn``)."""
    router: str
    """``softmax_topk_norm`` (Mixtral: fp32 routing weights), ``softmax_topk_norm_cast`` (Qwen3-MoE with
    ``norm_topk_prob`` true, as published: the normalised weights cast back to the compute dtype),
    ``softmax_topk`` (Qwen2-MoE), ``sigmoid_group`` (DeepSeek-V3)."""
    rotary: bool
    rotary_fraction: float = 1.0
    """The share of the head dimension the rotary embedding turns (GPT-NeoX ``rotary_pct``, default 0.25
    in ``GPTNeoXConfig``; Pythia's configs keep it): cos and sin are [1, s, fraction·d]."""
    rotary_fp32: bool = False
    """cos and sin stay fp32 (``Olmo2RotaryEmbedding`` returns them uncast; ``apply_rotary_pos_emb`` casts
    its fp32 products back)."""
    rotary_cat: bool = False
    """The rotary output is a ``torch.cat`` (Phi-3's and GPT-NeoX's partial rotary; DeepSeek-V3's
    nope/pe): a contiguous [b, a, s, d] q, so SDPA's output (``empty_like`` in q's layout) is [b, a, s, d]
    too and ``transpose(1, 2).reshape(...).contiguous()`` copies it for the o projection."""
    eager_softmax_fp32: bool = True
    """Eager attention's softmax runs in fp32 and is cast back (``softmax(..., dtype=float32).to(dtype)``);
    GPT-2's runs in the compute dtype (``modeling_gpt2.eager_attention_forward``)."""
    embedding_scale: bool = False
    """The embedding output is multiplied by a 0-dim ``normalizer`` tensor (√h) in the compute dtype,
    which ``mul`` saves (Gemma 2 / Gemma 3)."""
    logit_softcap: bool = False
    """``final_logit_softcapping`` (Gemma 2: 30.0 in ``Gemma2Config`` and its published configs):
    ``tanh(logits / cap) · cap``, and ``tanh`` saves its output [T, V] in the compute dtype."""
    sliding_pattern: int = 0
    """Layer i has sliding-window attention when (i + 1) % pattern ≠ 0 (the configs' default
    ``layer_types``: ``Gemma2Config`` 2, ``Gemma3TextConfig``'s ``sliding_window_pattern`` 6); 0: none.
    Its ``DynamicCache`` layer (``cache_utils.DynamicSlidingWindowLayer``) moves a 0-dim int64
    ``_sliding_window_tensor`` to the device at its first update, alive until the forward's output is
    dropped."""
    rotary_tables: int = 1
    """Rotary tables: Gemma 3 keeps one per attention type (``Gemma3RotaryEmbedding``: ``inv_freq`` and
    ``original_inv_freq`` per layer type; ``Gemma3TextModel.forward``: cos and sin per type), local and
    global once the model has both (from ``sliding_pattern`` layers)."""
    embedding_scale_buffer: bool = False
    """The √h scale is a fp32 0-dim buffer of the embedding (``Gemma2ScaledWordEmbedding.embed_scale``,
    ``Gemma3TextScaledWordEmbedding.embed_scale``), resident like the rotary tables."""


SLIDING_PATTERNS = {"gemma2": 2, "gemma3_text": 6}
"""Layer i is full attention when (i + 1) % pattern == 0, the others sliding-window: the default
``layer_types`` of ``Gemma2Config`` and ``Gemma3TextConfig`` (``sliding_window_pattern``)."""


def traits(arch: Architecture) -> Traits:
    """The family's traits: from ``arch.family`` (the transformers model_type), else from the block."""
    family = arch.family or (
        "gpt2" if arch.norm is NormKind.LAYERNORM and arch.mlp is MlpKind.GELU else "llama"
    )
    norm = {"gemma2": "gemma", "gemma3_text": "gemma", "olmo2": "olmo"}.get(family, "llama")
    if arch.norm is NormKind.LAYERNORM:
        norm = "layernorm"
    return Traits(
        norm=norm,
        gelu="tanh_decomposed" if family == "gpt2" else "exact",
        qkv_views_kept=family == "gpt2",
        router={
            "qwen2_moe": "softmax_topk",
            "qwen3_moe": "softmax_topk_norm_cast",
            "deepseek_v3": "sigmoid_group",
        }.get(family, "softmax_topk_norm"),
        rotary=not arch.learned_position_embeddings,
        rotary_fraction=0.25 if family == "gpt_neox" else 1.0,
        rotary_fp32=family == "olmo2",
        rotary_cat=family in ("phi3", "gpt_neox", "deepseek_v3"),
        eager_softmax_fp32=family != "gpt2",
        embedding_scale=family in ("gemma2", "gemma3_text"),
        logit_softcap=family == "gemma2",
        sliding_pattern=SLIDING_PATTERNS.get(family, 0),
        rotary_tables=2 if family == "gemma3_text" and arch.num_layers >= SLIDING_PATTERNS[family] else 1,
        embedding_scale_buffer=family in ("gemma2", "gemma3_text"),
    )
