"""Hugging Face ``config.json`` → :class:`~zerocalc.model.architecture.Architecture`, read offline.

One declarative record per ``model_type`` (:data:`FAMILIES`) says which ``transformers`` 5.17 modeling file
and classes it follows, the keys it reads (with the configuration class's default where it has one), the
keys it knows do not change the parameter count, and how that file computes what the architecture
describes (its :class:`Traits`, which the model codes' saved tensors follow: :mod:`zerocalc.model.traits`).
The count is then the count of ``AutoModelForCausalLM.from_config(config)`` (checked on the meta device in
``tests/model/test_families.py``).

How a key is treated, in this order:

1. a key the record reads (or an alias transformers maps onto it) is checked: whole numbers from 1 (0
   where stated) to 2**31 − 1, ``true``/``false``, lists of layer indices, ``null`` only where the
   configuration class allows it; anything else is refused naming the file, the key and what is accepted;
2. a key the record pins (transformers does not read it, but it would change the model it describes) is
   accepted with that one value only (DeepSeek-V3 ``moe_layer_freq`` 1, GPT-2 ``add_cross_attention``
   false);
3. a key the record lists as not changing the count, or one of the common keys (:data:`COMMON_IGNORED`,
   :data:`HARMLESS`: token ids, dtypes, dropout, norm epsilon, rotary settings, attention masks...), is
   accepted and not read;
4. any other key whose name looks like it sizes the model (:data:`COUNT_AFFECTING`: layers, heads,
   experts, MoE, sizes, dims, ranks, biases, norms, ties, projections...) is **refused, not guessed**;
5. any other key is accepted (it cannot change the count).

Keys a record reads and does not find take the configuration class's default, except the sizes every
count needs (vocabulary, hidden size, layers, heads, MLP width, and for MoE families the experts, top-k and
the experts' width), which are required.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from zerocalc.base.errors import InputError, literal, shown, why_not
from zerocalc.base.json_text import json_value
from zerocalc.model.architecture import (
    MAX_LAYERS,
    Architecture,
    BlockLayout,
    LatentAttention,
    MlpKind,
    NormKind,
    QkNorm,
)
from zerocalc.model.hf_classes import ModuleClass

MAX_SIZE = 2**31 - 1
"""The largest whole number a size key may hold."""


class KeyKind(StrEnum):
    SIZE = "a whole number from 1 to 2147483647"
    LAYER_COUNT = f"a whole number of layers from 1 to {MAX_LAYERS}"
    COUNT = "a whole number from 0 to 2147483647"
    OPTIONAL_SIZE = "null or a whole number from 1 to 2147483647"
    FLAG = "true or false"
    LAYERS = "null or a list of layer indices (whole numbers from 0)"


class Key(BaseModel):
    """One key a family record reads."""

    model_config = ConfigDict(frozen=True)

    kind: KeyKind = KeyKind.SIZE
    required: bool = False
    default: Any = None


Values = dict[str, Any]


class Traits(NamedTuple):
    """How a family's transformers code computes what the architecture describes: its record's
    (:attr:`Family.traits`, Llama's where a record does not say), with ``norm``, ``rotary`` and
    ``rotary_tables`` resolved against the architecture by :func:`zerocalc.model.traits.traits`."""

    norm: str = "llama"
    """``llama`` (x.float(), rsqrt, .to(dtype), weight *), ``gemma`` / ``olmo`` (the product with the
    weight in fp32: the normalised fp32 tensor is kept; ``olmo``: ``Olmo2RMSNorm`` and ``GptOssRMSNorm``,
    ``(self.weight * x).to(dtype)``), ``layernorm`` (input, mean, rstd: every architecture with
    LayerNorm)."""
    gelu: str = "exact"
    """``tanh_decomposed`` (GPT-2 ``NewGELUActivation``: four tensors), ``exact`` (``nn.GELU``)."""
    qkv_views_kept: bool = False
    """A fused q/k/v output whose q is saved as a view, so the whole storage stays (GPT-2 ``c_attn``)."""
    router: str = "softmax_topk_norm"
    """``softmax_topk_norm`` (Mixtral: fp32 routing weights), ``softmax_topk_norm_cast`` (Qwen3-MoE with
    ``norm_topk_prob`` true, as published: the normalised weights cast back to the compute dtype),
    ``softmax_topk`` (Qwen2-MoE), ``sigmoid_group`` (DeepSeek-V3), ``topk_softmax`` (GPT-OSS
    ``GptOssTopKRouter``: ``topk`` of the logits, then ``softmax`` over the k values in the compute dtype;
    no softmax over the E experts)."""
    expert_gate: str = "silu"
    """How the routed experts gate their gate/up output [S, 2f] (transformers 5.17 ``integrations/moe.py``
    calls the experts' ``_apply_gate``): ``silu`` (``_default_apply_gate``: ``act_fn(gate) * up`` of the
    two halves), ``clamped_swiglu`` (``GptOssExperts._apply_gate``: interleaved halves ``[..., ::2]`` and
    ``[..., 1::2]`` clamped to ``limit`` 7.0, ``gate * sigmoid(gate * alpha)`` with alpha 1.702, times
    ``up + 1``)."""
    rotary: bool = True
    """The positions are rotary (every architecture without learned position embeddings)."""
    rotary_fraction: float = 1.0
    """The share of the head dimension the rotary embedding turns (GPT-NeoX ``rotary_pct``, default 0.25
    in ``GPTNeoXConfig``; Pythia's configs keep it): cos and sin are [1, s, fraction·d]."""
    rotary_fp32: bool = False
    """cos and sin stay fp32 (``Olmo2RotaryEmbedding`` returns them uncast; ``apply_rotary_pos_emb`` casts
    its fp32 products back)."""
    rotary_half_tables: bool = False
    """cos and sin are [1, s, d/2] (``GptOssRotaryEmbedding``: ``emb = freqs``, not ``cat((freqs, freqs))``;
    ``_apply_rotary_emb`` turns the two halves of q and k with the same table)."""
    rotary_cat: bool = False
    """The rotary output is a ``torch.cat`` (Phi-3's and GPT-NeoX's partial rotary; DeepSeek-V3's
    nope/pe): a contiguous [b, a, s, d] q, so SDPA's output (``empty_like`` in q's layout) is [b, a, s, d]
    too and ``transpose(1, 2).reshape(...).contiguous()`` copies it for the o projection."""
    eager_softmax_fp32: bool = True
    """Eager attention's softmax runs in fp32 and is cast back (``softmax(..., dtype=float32).to(dtype)``);
    GPT-2's runs in the compute dtype (``modeling_gpt2.eager_attention_forward``)."""
    attention_softcap: bool = False
    """Eager attention soft-caps the scores, ``tanh(scores / cap) · cap`` (Gemma 2 ``eager_attention_forward``
    with ``attn_logit_softcapping``, 50.0 in ``Gemma2Config`` and its published configs): ``tanh`` keeps its
    output [b, a, s, s] in the compute dtype."""
    eager_sink_column: bool = False
    """Eager attention appends the head's sink logit as one more column, ``cat([logits, sinks], -1)``
    [b, a, s, s + 1], subtracts the row maximum (``max(dim=-1)`` keeps its int64 indices [b, a, s, 1]) and
    takes the softmax over s + 1 columns (kept whole: ``probs[..., :-1]`` is a view of it) in the compute
    dtype (GPT-OSS ``eager_attention_forward``; with ``eager_softmax_fp32`` False)."""
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
    global once the model has both (from ``sliding_pattern`` layers; one before)."""
    embedding_scale_buffer: bool = False
    """The √h scale is a fp32 0-dim buffer of the embedding (``Gemma2ScaledWordEmbedding.embed_scale``,
    ``Gemma3TextScaledWordEmbedding.embed_scale``), resident like the rotary tables."""


class PeftMoeConversion(NamedTuple):
    """How PEFT 0.21 maps LoRA targets of a transformers 4.x mixture-of-experts layout onto 5.x's
    (peft/utils/transformers_weight_conversion.py ``_MOE_TARGET_MODULE_MAPPING``, ``_MOE_FUSED_TARGETS``,
    applied by ``convert_peft_config_for_transformers`` before any adapter is injected): a target naming a
    4.x projection (or ending in ``.<name>``) becomes a ``target_parameters`` entry on the stacked 5.x
    parameter; projections fused into one parameter are targeted together, at r and alpha times their
    number."""

    renamed: dict[str, str]
    """4.x module name → the 5.x parameter targeted instead (in PEFT's order: the first that matches)."""
    fused: dict[str, tuple[str, ...]]
    """5.x parameter → the 4.x names fused into it."""


MIXTRAL_MOE = PeftMoeConversion(
    renamed={"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"},
    fused={"gate_up_proj": ("w1", "w3")},
)
QWEN2_MOE = PeftMoeConversion(
    renamed={
        "gate": "gate.weight",
        "gate_proj": "gate_up_proj",
        "up_proj": "gate_up_proj",
        "down_proj": "down_proj",
    },
    fused={"gate_up_proj": ("gate_proj", "up_proj")},
)

LLAMA_NAMES: dict[str, str] = {
    "attn": "self_attn",
    "input_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "pre_feedforward_norm": "pre_feedforward_layernorm",
    "post_feedforward_norm": "post_feedforward_layernorm",
    "final_norm": "norm",
    "moe": "mlp",
    "router": "gate",
    "q_a_norm": "q_a_layernorm",
    "kv_a_proj": "kv_a_proj_with_mqa",
    "kv_a_norm": "kv_a_layernorm",
}
"""zerocalc's module names (:mod:`zerocalc.model.architecture`) as Llama's modeling file and those built
like it name them, where they differ (every other part of a name is the same)."""


class Family(BaseModel):
    """What one ``model_type`` reads, in the layout of the transformers file it follows, and how that
    file computes (:attr:`traits`)."""

    model_config = ConfigDict(frozen=True)

    model_type: str
    follows: str
    reads: dict[str, Key]
    aliases: dict[str, str] = {}
    """Other spellings transformers maps onto a read key (``attribute_map``, ``FalconConfig``'s n_embed)."""
    pinned: dict[str, Any] = {}
    ignores: frozenset[str] = frozenset()
    rule: Callable[[Values], dict[str, Any]]
    traits: Traits = Traits()
    """How the family's modeling code computes what the architecture describes, where it differs from
    Llama's (:func:`zerocalc.model.traits.traits` resolves them for an architecture)."""
    body: str = "model"
    """The attribute of the ``...ForCausalLM`` that holds the decoder: the first part of every module's name
    but ``lm_head`` (GPT-2's and Falcon's ``transformer``, GPT-NeoX's ``gpt_neox``)."""
    names: dict[str, str] = {}
    """zerocalc's module names as the modeling file spells them, where they differ from Llama's
    (:data:`LLAMA_NAMES`)."""
    fused: dict[str, tuple[str, ...]] = {}
    """Modules the modeling file builds as one that zerocalc lists apart: the fused module's zerocalc name
    → the sibling modules it holds, stacked on the output dimension in this order (GPT-2's ``c_attn``: q,
    k and v)."""
    projection: ModuleClass = ModuleClass.LINEAR
    """The class of its projections (every module but the embeddings, norms, routers, experts and
    ``lm_head``, which is a ``torch.nn.Linear`` in every family)."""
    registered_first: str | None = None
    """The projection its modeling file registers first in a block where zerocalc lists another first
    (``Phi3Attention`` builds ``o_proj`` before ``qkv_proj``): the first ``torch.nn.Linear`` that
    ``named_modules()`` meets (:func:`~zerocalc.model.hf_modules.hf_linear_ends`)."""
    peft_targets: tuple[str, ...] | None = None
    """PEFT 0.21's default LoRA targets for the model_type (peft/utils/constants.py
    ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``); None where it has none (LoRA then needs
    target_modules: peft/tuners/lora/model.py ``_prepare_adapter_config``)."""
    experts_in_out: bool = False
    """Its experts' 3-D weights are held [E, in, out] (``GptOssExperts.gate_up_proj`` [E, d, 2f],
    ``down_proj`` [E, f, d]), not [E, out, in] as zerocalc writes them (Mixtral's)."""
    peft_moe: PeftMoeConversion | None = None
    """PEFT 0.21's conversion of 4.x MoE targets (:class:`PeftMoeConversion`) where it applies to the
    model_type: transformers' ``conversion_mapping._MODEL_TO_CONVERSION_PATTERN`` (PEFT adds
    mixtral → mixtral) gives the pattern, which must have an entry in PEFT's tables."""


def _req(kind: KeyKind = KeyKind.SIZE) -> Key:
    return Key(kind=kind, required=True)


def _opt(default: int | None = None) -> Key:
    return Key(kind=KeyKind.OPTIONAL_SIZE, default=default)


def _size(default: int) -> Key:
    return Key(kind=KeyKind.SIZE, default=default)


def _count(default: int) -> Key:
    return Key(kind=KeyKind.COUNT, default=default)


def _flag(default: bool) -> Key:
    return Key(kind=KeyKind.FLAG, default=default)


CORE = {
    "vocab_size": _req(),
    "hidden_size": _req(),
    "num_hidden_layers": _req(KeyKind.LAYER_COUNT),
    "num_attention_heads": _req(),
}
"""The sizes every family requires (with ``intermediate_size`` where the family has no default width)."""

COMMON_IGNORED = frozenset(
    {
        "architectures", "auto_map", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
        "max_position_embeddings", "original_max_position_embeddings",  # rotary: no learned positions
        "hidden_act", "hidden_activation", "activation_function", "activation",
        "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "sliding_window_pattern",
        "_sliding_window_pattern", "use_bidirectional_attention", "attention_chunk_size",  # attention masks
        "pretraining_tp",  # Llama/DeepSeek: how pre-training sliced the projections, not their size
        "router_aux_loss_coef", "router_jitter_noise", "norm_topk_prob",  # routing, not sizes
        "chunk_size_feed_forward", "is_decoder", "is_encoder_decoder", "add_cross_attention",
        "cross_attention_hidden_size", "tie_encoder_decoder", "num_labels", "id2label", "label2id",
        "problem_type", "task_specific_params", "tokenizer_class", "prefix", "pruned_heads",
        "use_cache", "return_dict", "torchscript", "use_bfloat16", "tf_legacy_loss",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "num_beams", "num_beam_groups",
        "num_return_sequences",  # generation settings of 4.x configs
    }
)  # fmt: skip
"""Keys of every family that do not change the parameter count."""

HARMLESS = re.compile(
    r"dropout|pdrop|(^|_)eps$|epsilon|_token_id$|^rope|rotary|softcapping|initializer|^output_"
)
"""Key names that never size a model: dropout, norm epsilon, token ids, rotary embeddings (buffers, no
parameters), logit soft-capping, initialisation, outputs."""

COUNT_AFFECTING = re.compile(
    r"layer|head|expert|moe|embd|embed|hidden|inner|intermediate|ffn|mlp|vocab|bias|norm|tie|shared|dense|"
    r"sparse|lora|rank|dim|parallel|proj|qkv|query|key|value|position|n_ctx|^n_|^num_|size|width|gate|"
    r"router|cross|multi|fused|group|decoder|architecture"
)
"""Key names that may size a model: refused unless the family record reads or lists them."""


# ------------------------------------------------------------------------------------------ the rules
GATED_RMS = {"mlp": MlpKind.SWIGLU, "norm": NormKind.RMSNORM}


def _core(v: Values) -> dict[str, Any]:
    return {
        "vocab_size": v["vocab_size"],
        "hidden_size": v["hidden_size"],
        "num_layers": v["num_hidden_layers"],
        "num_heads": v["num_attention_heads"],
    }


def _attention(v: Values) -> dict[str, Any]:
    """q/k/v/o of ``num_key_value_heads`` and ``head_dim`` (d / a when null or absent)."""
    return {"num_kv_heads": v["num_key_value_heads"], "head_dim": v.get("head_dim")}


def _biases(flag: bool) -> dict[str, Any]:
    return {"qkv_bias": flag, "out_bias": flag}


def _llama(v: Values) -> dict[str, Any]:
    return {
        **_core(v), **GATED_RMS, **_attention(v), **_biases(v["attention_bias"]),
        "intermediate_size": v["intermediate_size"], "mlp_bias": v["mlp_bias"],
        "tied_embeddings": v["tie_word_embeddings"],
    }  # fmt: skip


def _mistral(v: Values) -> dict[str, Any]:
    return {
        **_core(v), **GATED_RMS, **_attention(v), "intermediate_size": v["intermediate_size"],
        "tied_embeddings": v["tie_word_embeddings"],
    }  # fmt: skip


def _mixtral(v: Values) -> dict[str, Any]:
    return {
        **_mistral(v),
        "num_experts": v["num_local_experts"],
        "experts_per_token": v["num_experts_per_tok"],
    }


def _qwen2(v: Values) -> dict[str, Any]:
    return {**_mistral(v), "qkv_bias": True}


def _gpt2(v: Values) -> dict[str, Any]:
    d = v["n_embd"]
    return {
        "vocab_size": v["vocab_size"], "hidden_size": d, "num_layers": v["n_layer"], "num_heads": v["n_head"],
        "intermediate_size": v["n_inner"] or 4 * d, "mlp": MlpKind.GELU, "norm": NormKind.LAYERNORM,
        **_biases(True), "mlp_bias": True, "tied_embeddings": v["tie_word_embeddings"],
        "learned_position_embeddings": True, "max_position_embeddings": v["n_positions"],
    }  # fmt: skip


def _gemma2(v: Values) -> dict[str, Any]:
    return {
        **_llama({**v, "mlp_bias": False}),
        "block_layout": BlockLayout.SANDWICH_NORM,
    }


def _gemma3(v: Values) -> dict[str, Any]:
    return {**_gemma2(v), "qk_norm": QkNorm.PER_HEAD}


def _phi3(v: Values) -> dict[str, Any]:
    return {**_mistral(v), "fused_qkv": True, "fused_gate_up": True}


def _qwen3(v: Values) -> dict[str, Any]:
    return {**_llama({**v, "mlp_bias": False}), "qk_norm": QkNorm.PER_HEAD}


def _olmo2(v: Values) -> dict[str, Any]:
    return {**_llama({**v, "mlp_bias": False}), "qk_norm": QkNorm.FULL, "block_layout": BlockLayout.POST_NORM}


def _moe(v: Values, sparse: list[int], experts: int, shared: dict[str, Any]) -> dict[str, Any]:
    """Expert fields for the layers in ``sparse``; every other layer has a dense MLP of
    ``intermediate_size``. No sparse layer: a dense model."""
    if not sparse:
        return {"intermediate_size": v["intermediate_size"]}
    dense = tuple(i for i in range(v["num_hidden_layers"]) if i not in sparse)
    return {
        "num_experts": experts, "experts_per_token": v["num_experts_per_tok"],
        "intermediate_size": v["moe_intermediate_size"], "dense_layers": dense,
        "dense_intermediate_size": v["intermediate_size"] if dense else None, **shared,
    }  # fmt: skip


def _qwen_sparse_layers(v: Values) -> list[int]:
    """``Qwen3MoeDecoderLayer`` / ``Qwen2MoeDecoderLayer``: layer i is sparse when it is not in
    ``mlp_only_layers``, there are experts and (i + 1) is a multiple of ``decoder_sparse_step``."""
    only, step = set(v["mlp_only_layers"]), v["decoder_sparse_step"]
    return [
        i
        for i in range(v["num_hidden_layers"])
        if i not in only and v["num_experts"] > 0 and (i + 1) % step == 0
    ]


def _qwen3_moe(v: Values) -> dict[str, Any]:
    return {**_qwen3(v), **_moe(v, _qwen_sparse_layers(v), v["num_experts"], {})}


def _qwen2_moe(v: Values) -> dict[str, Any]:
    shared = {
        "num_shared_experts": 1,
        "shared_expert_intermediate_size": v["shared_expert_intermediate_size"],
        "shared_expert_gate": True,
    }
    base = {**_mistral(v), "qkv_bias": v["qkv_bias"]}
    return {**base, **_moe(v, _qwen_sparse_layers(v), v["num_experts"], shared)}


def _deepseek_v3(v: Values) -> dict[str, Any]:
    mla = LatentAttention(
        q_lora_rank=v["q_lora_rank"],
        kv_lora_rank=v["kv_lora_rank"],
        qk_nope_head_dim=v["qk_nope_head_dim"],
        qk_rope_head_dim=v["qk_rope_head_dim"],
        v_head_dim=v["v_head_dim"],
    )
    n_shared = v["n_shared_experts"]
    shared = {
        "num_shared_experts": n_shared,
        "shared_expert_intermediate_size": v["moe_intermediate_size"] if n_shared else None,
    }
    # DeepseekV3DecoderLayer: layer i has DeepseekV3MoE when i >= first_k_dense_replace, else DeepseekV3MLP
    sparse = list(range(v["first_k_dense_replace"], v["num_hidden_layers"]))
    return {
        **_core(v), **GATED_RMS, **_biases(v["attention_bias"]), "latent_attention": mla,
        "head_dim": mla.qk_head_dim, "tied_embeddings": v["tie_word_embeddings"],
        **_moe(v, sparse, v["n_routed_experts"], shared),
    }  # fmt: skip


def _gpt_oss(v: Values) -> dict[str, Any]:
    """``GptOssDecoderLayer``: q/k/v/o with ``attention_bias`` and one sink per head (``GptOssAttention``);
    every layer a ``GptOssMLP``: ``GptOssTopKRouter`` (weight and bias) and ``GptOssExperts`` (gate_up_proj
    and down_proj with their biases); the layers' sliding-window alternation (``layer_types``) masks, it
    holds no parameter."""
    return {
        **_core(v), **GATED_RMS, **_attention(v), **_biases(v["attention_bias"]),
        "intermediate_size": v["intermediate_size"], "tied_embeddings": v["tie_word_embeddings"],
        "num_experts": v["num_local_experts"], "experts_per_token": v["num_experts_per_tok"],
        "router_bias": True, "expert_bias": True, "attention_sinks": True,
    }  # fmt: skip


def _divisible_heads(v: Values, where: str) -> None:
    d, a = v["hidden_size"], v["num_attention_heads"]
    if d % a:
        raise ValueError(
            f"hidden_size {d} is not a multiple of num_attention_heads {a} ({where} splits the hidden size "
            "into heads); accepted: hidden_size = heads × head dim"
        )


def _falcon(v: Values) -> dict[str, Any]:
    """``FalconAttention``: query_key_value of (a + 2·kv)·h_d rows, kv = num_kv_heads with
    new_decoder_architecture, else 1 with multi_query, else a; ``FalconDecoderLayer``: two norms without
    parallel_attn, ln_attn + ln_mlp with two parallel norms (the new architecture's default), else one."""
    _divisible_heads(v, "FalconAttention")
    a, new = v["num_attention_heads"], v["new_decoder_architecture"]
    kv = (v["num_kv_heads"] or a) if new else (1 if v["multi_query"] else a)
    norms = v["num_ln_in_parallel_attn"] or (2 if new else None)
    if not v["parallel_attn"]:
        layout = BlockLayout.PRE_NORM
    else:
        layout = BlockLayout.PARALLEL if norms == 2 else BlockLayout.PARALLEL_SHARED_NORM
    return {
        **_core(v), "num_kv_heads": kv, "intermediate_size": v["ffn_hidden_size"] or 4 * v["hidden_size"],
        "mlp": MlpKind.GELU, "norm": NormKind.LAYERNORM, **_biases(v["bias"]), "mlp_bias": v["bias"],
        "tied_embeddings": v["tie_word_embeddings"], "fused_qkv": True, "block_layout": layout,
    }  # fmt: skip


def _gpt_neox(v: Values) -> dict[str, Any]:
    _divisible_heads(v, "GPTNeoXAttention")
    parallel = v["use_parallel_residual"]
    return {
        **_core(v), "intermediate_size": v["intermediate_size"], "mlp": MlpKind.GELU,
        "norm": NormKind.LAYERNORM, **_biases(v["attention_bias"]), "mlp_bias": True,
        "tied_embeddings": v["tie_word_embeddings"], "fused_qkv": True,
        "block_layout": BlockLayout.PARALLEL if parallel else BlockLayout.PRE_NORM,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------- the records
_QWEN_MOE_LAYOUT = {
    "num_experts": _req(KeyKind.COUNT),
    "num_experts_per_tok": _req(KeyKind.COUNT),
    "moe_intermediate_size": _req(),
    "decoder_sparse_step": _size(1),
    "mlp_only_layers": Key(kind=KeyKind.LAYERS, default=()),
}

_RECORDS = [
    Family(
        model_type="llama",
        follows="models/llama/modeling_llama.py: LlamaForCausalLM (LlamaAttention, LlamaMLP)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(), "head_dim": _opt(),
               "attention_bias": _flag(False), "mlp_bias": _flag(False), "tie_word_embeddings": _flag(False)},
        rule=_llama,
        peft_targets=("q_proj", "v_proj"),
    ),
    Family(
        model_type="mistral",
        follows="models/mistral/modeling_mistral.py: MistralForCausalLM (projections without biases)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(8), "head_dim": _opt(),
               "tie_word_embeddings": _flag(False)},
        ignores=frozenset({"attention_bias", "mlp_bias"}),  # MistralAttention and MistralMLP: bias=False
        rule=_mistral,
        peft_targets=("q_proj", "v_proj"),
    ),
    Family(
        model_type="mixtral",
        follows="models/mixtral/modeling_mixtral.py: MixtralForCausalLM (MixtralTopKRouter, MixtralExperts)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(8), "head_dim": _opt(),
               "num_local_experts": _req(), "num_experts_per_tok": _req(),
               "tie_word_embeddings": _flag(False)},
        aliases={"num_experts": "num_local_experts"},
        ignores=frozenset({"attention_bias", "mlp_bias"}),
        rule=_mixtral,
        peft_targets=("q_proj", "v_proj"),
        peft_moe=MIXTRAL_MOE,
    ),
    Family(
        model_type="qwen2",
        follows="models/qwen2/modeling_qwen2.py: Qwen2ForCausalLM (q/k/v biases, none on o)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(32), "head_dim": _opt(),
               "tie_word_embeddings": _flag(False)},
        ignores=frozenset({"attention_bias"}),  # Qwen2Attention: bias=True on q/k/v whatever the config says
        rule=_qwen2,
        peft_targets=("q_proj", "v_proj"),
    ),
    Family(
        model_type="gpt2",
        follows="models/gpt2/modeling_gpt2.py: GPT2LMHeadModel (c_attn, c_proj, c_fc: Conv1D with biases)",
        reads={"vocab_size": _req(), "n_embd": _req(), "n_layer": _req(KeyKind.LAYER_COUNT), "n_head": _req(),
               "n_positions": _req(), "n_inner": _opt(), "tie_word_embeddings": _flag(True)},
        aliases={"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                 "max_position_embeddings": "n_positions"},  # GPT2Config.attribute_map
        pinned={"add_cross_attention": False},  # true adds cross-attention blocks to GPT2LMHeadModel
        ignores=frozenset({"n_ctx", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                           "reorder_and_upcast_attn", "summary_type", "summary_use_proj",
                           "summary_activation", "summary_proj_to_labels", "summary_first_dropout"}),
        rule=_gpt2,
        body="transformer",
        fused={"qkv_proj": ("q_proj", "k_proj", "v_proj")},  # GPT2Attention.c_attn: Conv1D(3·d, d)
        names={"embed_tokens": "wte", "embed_positions": "wpe", "layers": "h", "input_norm": "ln_1",
               "post_attention_norm": "ln_2", "attn": "attn", "qkv_proj": "c_attn", "o_proj": "c_proj",
               "fc_in": "c_fc", "fc_out": "c_proj", "final_norm": "ln_f"},
        projection=ModuleClass.CONV1D,
        peft_targets=("c_attn",),
        traits=Traits(gelu="tanh_decomposed", qkv_views_kept=True, eager_softmax_fp32=False),
    ),
    Family(
        model_type="gemma2",
        follows="models/gemma2/modeling_gemma2.py: Gemma2ForCausalLM (Gemma2DecoderLayer: four norms)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _size(4), "head_dim": _size(256),
               "attention_bias": _flag(False), "tie_word_embeddings": _flag(True)},
        ignores=frozenset({"query_pre_attn_scalar", "cache_implementation"}),
        rule=_gemma2,
        peft_targets=("q_proj", "v_proj"),
        traits=Traits(norm="gemma", embedding_scale=True, logit_softcap=True, attention_softcap=True,
                      sliding_pattern=2, embedding_scale_buffer=True),
    ),
    Family(
        model_type="gemma3_text",
        follows="models/gemma3/modeling_gemma3.py: Gemma3ForCausalLM (Gemma3Attention q_norm/k_norm on h_d)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _size(4), "head_dim": _size(256),
               "attention_bias": _flag(False), "tie_word_embeddings": _flag(True)},
        ignores=frozenset({"query_pre_attn_scalar", "cache_implementation"}),
        rule=_gemma3,
        peft_targets=("q_proj", "v_proj"),
        traits=Traits(norm="gemma", embedding_scale=True, sliding_pattern=6, rotary_tables=2,
                      embedding_scale_buffer=True),
    ),
    Family(
        model_type="phi3",
        follows="models/phi3/modeling_phi3.py: Phi3ForCausalLM (fused qkv_proj and gate_up_proj)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(), "head_dim": _opt(),
               "tie_word_embeddings": _flag(False)},
        ignores=frozenset({"attention_bias"}),  # Phi3Attention: bias=False whatever the config says
        rule=_phi3,
        traits=Traits(rotary_cat=True),
        registered_first="o_proj",
    ),
    Family(
        model_type="qwen3",
        follows="models/qwen3/modeling_qwen3.py: Qwen3ForCausalLM (Qwen3Attention q_norm/k_norm over h_d)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(32), "head_dim": _size(128),
               "attention_bias": _flag(False), "tie_word_embeddings": _flag(False)},
        rule=_qwen3,
        peft_targets=("q_proj", "v_proj"),
    ),
    Family(
        model_type="qwen3_moe",
        follows="models/qwen3_moe/modeling_qwen3_moe.py: Qwen3MoeForCausalLM (Qwen3MoeSparseMoeBlock: "
        "Qwen3MoeTopKRouter, Qwen3MoeExperts; Qwen3MoeMLP on mlp_only_layers and between sparse steps)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(4), "head_dim": _opt(),
               "attention_bias": _flag(False), "tie_word_embeddings": _flag(False), **_QWEN_MOE_LAYOUT},
        aliases={"num_local_experts": "num_experts"},  # Qwen3MoeConfig.attribute_map
        rule=_qwen3_moe,
        peft_moe=QWEN2_MOE,  # _MODEL_TO_CONVERSION_PATTERN: qwen3_moe → qwen2_moe
        traits=Traits(router="softmax_topk_norm_cast"),
    ),
    Family(
        model_type="qwen2_moe",
        follows="models/qwen2_moe/modeling_qwen2_moe.py: Qwen2MoeForCausalLM (Qwen2MoeSparseMoeBlock: "
        "gate, experts, shared_expert, shared_expert_gate)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(16), "head_dim": _opt(),
               "qkv_bias": _flag(True), "shared_expert_intermediate_size": _size(5632),
               "tie_word_embeddings": _flag(False), **_QWEN_MOE_LAYOUT},
        ignores=frozenset({"attention_bias"}),  # Qwen2MoeAttention reads qkv_bias; o_proj has no bias
        rule=_qwen2_moe,
        names={"shared_experts": "shared_expert"},  # Qwen2MoeSparseMoeBlock.shared_expert
        traits=Traits(router="softmax_topk"),
    ),
    Family(
        model_type="deepseek_v3",
        follows="models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3ForCausalLM (DeepseekV3Attention, "
        "DeepseekV3MoE: DeepseekV3TopkRouter, DeepseekV3Experts, shared_experts; no MTP layers)",
        reads={**CORE, "intermediate_size": _req(), "moe_intermediate_size": _req(),
               "n_routed_experts": _req(), "num_experts_per_tok": _req(KeyKind.COUNT),
               "n_shared_experts": _count(1), "first_k_dense_replace": _count(3), "q_lora_rank": _opt(1536),
               "kv_lora_rank": _size(512), "qk_nope_head_dim": _size(128), "qk_rope_head_dim": _size(64),
               "v_head_dim": _size(128), "attention_bias": _flag(False), "tie_word_embeddings": _flag(False)},
        aliases={"num_local_experts": "n_routed_experts"},  # DeepseekV3Config.attribute_map
        # transformers builds every layer from first_k_dense_replace on as MoE: it does not read
        # moe_layer_freq (DeepSeek's own code does), so only the value it implies is accepted
        pinned={"moe_layer_freq": 1},
        ignores=frozenset({
            "num_key_value_heads",  # MLA projections do not depend on it (kv_b_proj serves every head)
            "head_dim", "qk_head_dim",  # DeepseekV3Config.__post_init__ derives both
            "num_nextn_predict_layers", "num_mtp_layers",  # the MTP module is not built by from_config
            "n_group", "topk_group", "topk_method", "routed_scaling_factor", "scoring_func", "seq_aux",
            "aux_loss_alpha", "ep_size",  # routing and expert parallelism, not sizes
        }),
        rule=_deepseek_v3,
        peft_moe=QWEN2_MOE,  # _MODEL_TO_CONVERSION_PATTERN: deepseek_v3 → qwen2_moe
        traits=Traits(router="sigmoid_group", rotary_cat=True),
    ),
    Family(
        model_type="gpt_oss",
        follows="models/gpt_oss/modeling_gpt_oss.py: GptOssForCausalLM (GptOssAttention with sinks, "
        "GptOssMLP: GptOssTopKRouter and GptOssExperts with biases)",
        # GptOssConfig is a strict dataclass: head_dim and num_key_value_heads are whole numbers (no null)
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _size(8), "head_dim": _size(64),
               "num_local_experts": _req(), "num_experts_per_tok": _req(), "attention_bias": _flag(True),
               "tie_word_embeddings": _flag(False)},
        aliases={"num_experts": "num_local_experts"},  # GptOssConfig.attribute_map
        # the released config.json also carries experts_per_token (= num_experts_per_tok), which
        # GptOssConfig does not read; swiglu_limit and initial_context_length size nothing
        ignores=frozenset({"experts_per_token", "swiglu_limit", "initial_context_length"}),
        rule=_gpt_oss,
        traits=Traits(norm="olmo", router="topk_softmax", expert_gate="clamped_swiglu",
                      rotary_half_tables=True, rotary_cat=True, eager_softmax_fp32=False,
                      eager_sink_column=True, sliding_pattern=2),
        names={"router": "router"},  # GptOssMLP.router
        experts_in_out=True,
    ),
    Family(
        model_type="olmo2",
        follows="models/olmo2/modeling_olmo2.py: Olmo2ForCausalLM (q_norm/k_norm over all heads, norms "
        "after attention and MLP)",
        reads={**CORE, "intermediate_size": _req(), "num_key_value_heads": _opt(), "head_dim": _opt(),
               "attention_bias": _flag(False), "tie_word_embeddings": _flag(False)},
        rule=_olmo2,
        traits=Traits(norm="olmo", rotary_fp32=True),
    ),
    Family(
        model_type="falcon",
        follows="models/falcon/modeling_falcon.py: FalconForCausalLM (FalconAttention.query_key_value, "
        "FalconDecoderLayer norms)",
        reads={**CORE, "num_kv_heads": _opt(), "new_decoder_architecture": _flag(False),
               "multi_query": _flag(True), "parallel_attn": _flag(True), "num_ln_in_parallel_attn": _opt(),
               "bias": _flag(False), "ffn_hidden_size": _opt(), "tie_word_embeddings": _flag(True)},
        aliases={"n_embed": "hidden_size"},  # FalconConfig.__post_init__
        ignores=frozenset({"alibi", "apply_residual_connection_post_layernorm"}),
        rule=_falcon,
        body="transformer",
        names={"embed_tokens": "word_embeddings", "layers": "h", "attn": "self_attention",
               "qkv_proj": "query_key_value", "o_proj": "dense", "fc_in": "dense_h_to_4h",
               "fc_out": "dense_4h_to_h", "final_norm": "ln_f", "attn_norm": "ln_attn", "mlp_norm": "ln_mlp"},
        projection=ModuleClass.LINEAR_SUBCLASS,  # FalconLinear
        peft_targets=("query_key_value",),
    ),
    Family(
        model_type="gpt_neox",
        follows="models/gpt_neox/modeling_gpt_neox.py: GPTNeoXForCausalLM (query_key_value, MLP with biases)",
        reads={**CORE, "intermediate_size": _req(), "attention_bias": _flag(True),
               "use_parallel_residual": _flag(True), "tie_word_embeddings": _flag(False)},
        rule=_gpt_neox,
        body="gpt_neox",
        names={"embed_tokens": "embed_in", "attn": "attention", "qkv_proj": "query_key_value",
               "o_proj": "dense", "fc_in": "dense_h_to_4h", "fc_out": "dense_4h_to_h",
               "final_norm": "final_layer_norm", "attn_norm": "input_layernorm",
               "mlp_norm": "post_attention_layernorm"},
        peft_targets=("query_key_value",),
        traits=Traits(rotary_fraction=0.25, rotary_cat=True),
    ),
]  # fmt: skip

FAMILIES: dict[str, Family] = {f.model_type: f for f in _RECORDS}
SUPPORTED = tuple(FAMILIES)

MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}
"""model_types read by another family's record: Kimi K2's config.json says ``kimi_k2`` for what its
``architectures`` and ``auto_map`` name DeepSeek-V3's classes (moonshotai/Kimi-K2-Instruct config.json:
``DeepseekV3ForCausalLM``, ``configuration_deepseek.DeepseekV3Config``; its deployment guide: the model
reuses DeepSeek-V3's architecture, and ``model_type`` may be set to ``deepseek_v3``); transformers 5.17
registers no ``kimi_k2``."""


def _family(model_type: Any) -> Family | None:
    """The record that reads ``model_type`` (its own, or an alias's: :data:`MODEL_TYPE_ALIASES`)."""
    if not isinstance(model_type, str):
        return None
    return FAMILIES.get(MODEL_TYPE_ALIASES.get(model_type, model_type))


# --------------------------------------------------------------------------------------------- reading
def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except ValueError:  # pragma: no cover - json values always serialise
        text = repr(value)
    return literal(text if len(text) <= 40 else f"{text[:24]}… ({len(text)} characters)")


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(where: str, key: str, value: Any, kind: KeyKind) -> Any:
    """The value of a read key, or InputError naming the file, the key and what is accepted."""
    if kind is KeyKind.FLAG:
        if isinstance(value, bool):
            return value
    elif kind is KeyKind.LAYERS:
        if value is None:
            return ()
        if isinstance(value, list) and all(_is_whole(i) and 0 <= i <= MAX_SIZE for i in value):
            return tuple(value)
    elif value is None and kind is KeyKind.OPTIONAL_SIZE:
        return None
    elif _is_whole(value) and (0 if kind is KeyKind.COUNT else 1) <= value <= (
        MAX_LAYERS if kind is KeyKind.LAYER_COUNT else MAX_SIZE
    ):
        return value
    raise InputError(f"{where}: {key} {_show(value)} is not accepted; accepted: {kind.value}")


def _values(family: Family, config: dict[str, Any], where: str) -> Values:
    """Every key ``family`` reads, checked (defaults filled in); every other key sorted by the rule above."""
    values: Values = {}
    spelled: dict[str, str] = {}
    for key, value in config.items():
        if key == "model_type":
            continue
        target = family.aliases.get(key, key)
        if target in family.reads:
            checked = _check(where, key, value, family.reads[target].kind)
            if target in values and values[target] != checked:
                raise InputError(
                    f"{where}: {spelled[target]} and {key} disagree ({_show(values[target])} vs "
                    f"{_show(value)}); accepted: one of them, or both equal"
                )
            values[target], spelled[target] = checked, key
        elif key in family.pinned:
            accepted = family.pinned[key]
            if value != accepted or type(value) is not type(accepted):
                raise InputError(
                    f"{where}: {key} {_show(value)} describes a model that transformers' {family.model_type} "
                    f"({family.follows.split(':')[0]}) does not build; accepted: {_show(accepted)}"
                )
        elif key in family.ignores or key in COMMON_IGNORED or HARMLESS.search(key):
            continue
        elif COUNT_AFFECTING.search(key):
            raise InputError(
                f"{where}: key {shown(key)} is not read by the {family.model_type} record "
                f"({family.follows.split(':')[0]}) and may change the parameter count, so it is refused, not "
                f"guessed; accepted: the keys it reads ({', '.join(family.reads)}), their aliases and keys "
                "that do not size the model"
            )
    for key, spec in family.reads.items():
        if key not in values:
            if spec.required:
                raise InputError(
                    f"{where}: config.json lacks the key {key!r} needed for {family.model_type}; "
                    f"accepted: {spec.kind.value}"
                )
            values[key] = spec.default
    return values


def _load(path: Path) -> Any:
    where = f"{{model}} {shown(str(path))}"
    try:
        raw = path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte
        if path.name == "config.json" and path.parent.is_dir():
            raise InputError(
                f"{{model}} {shown(str(path.parent))} is a folder without a readable config.json "
                f"({why_not(exc)}); accepted: a preset name, a config.json or a folder holding one"
            ) from exc
        raise InputError(
            f"{where} cannot be read ({why_not(exc)}); accepted: a preset name or a readable config.json"
        ) from exc
    return _parsed(raw, where)


def _parsed(raw: bytes, where: str) -> Any:
    """The JSON value of a config.json's bytes (``where`` names it in errors)."""
    return json_value(raw, where, "a Hugging Face config.json")


DROPOUT_KEYS: dict[str, dict[str, tuple[str, float]]] = {
    "gpt2": {
        "residual_dropout": ("resid_pdrop", 0.1),
        "embedding_dropout": ("embd_pdrop", 0.1),
        "attention_dropout": ("attn_pdrop", 0.1),
    },
    "falcon": {"residual_dropout": ("hidden_dropout", 0.0), "attention_dropout": ("attention_dropout", 0.0)},
    "gpt_neox": {
        "residual_dropout": ("hidden_dropout", 0.0),
        "attention_dropout": ("attention_dropout", 0.0),
    },
}
"""Where a family's config keeps its dropout probabilities (``GPT2Config``: 0.1 each by default); the
other families read ``attention_dropout`` (0.0 by default). Dropout changes what the forward saves, not
the count."""


def _dropout(model_type: str, config: dict[str, Any], where: str) -> dict[str, float]:
    keys = DROPOUT_KEYS.get(model_type, {"attention_dropout": ("attention_dropout", 0.0)})
    values: dict[str, float] = {}
    for field, (key, default) in keys.items():
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise InputError(
                f"{where}: {key} {_show(value)} is not accepted; accepted: a probability 0 ≤ p < 1"
            )
        values[field] = float(value)
    return values


def architecture_from_hf_config(path: Path) -> Architecture:
    """The architecture a Hugging Face ``config.json`` describes, as transformers 5.17 builds it."""
    return read_hf_config(path)[0]


def read_hf_config(path: Path) -> tuple[Architecture, tuple[str, ...]]:
    """The architecture of a ``config.json`` and what the reader says about it (the text model of a
    multimodal config)."""
    config = _load(path)
    where = f"{{model}} {shown(str(path))}"
    name = path.parent.name or path.stem
    return architecture_from_hf_dict(config, where, name, bitsandbytes=True), hf_config_notes(config)


BITSANDBYTES = "bitsandbytes"
"""``quant_method`` of transformers' ``BitsAndBytesConfig``: the one quantisation zerocalc models (its
storage: :mod:`zerocalc.model.quantized`; its keys: ``zerocalc.request.finetune``)."""


def _quant_method(quantization: Any) -> str | None:
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if (
        isinstance(quantization, dict)
        and method is None
        and (quantization.get("load_in_4bit") or quantization.get("load_in_8bit"))
    ):
        method = BITSANDBYTES  # an older BitsAndBytesConfig without quant_method
    return method if isinstance(method, str) else None


def _refuse_quantization(config: dict[str, Any], where: str, bitsandbytes: bool) -> None:
    """``quantization_config`` (bitsandbytes 4/8-bit, FP8, GPTQ, AWQ...): ``from_pretrained`` would store
    the weights quantised. bitsandbytes' is modelled where ``bitsandbytes`` (the request reads it:
    :func:`hf_quantization_config`); the others are refused, not ignored."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return
    method = _quant_method(quantization)
    if bitsandbytes and method == BITSANDBYTES:
        return
    named = f" ({method})" if method else ""
    accepted = "bitsandbytes' (4-bit or LLM.int8) in a config.json file or dict, or none"
    raise InputError(f"{where}: quantization_config{named} is not modelled; accepted: {accepted}")


def hf_quantization_config(config: Any) -> dict[str, Any] | None:
    """A config.json's bitsandbytes ``quantization_config`` (its text model's for a multimodal config),
    as written; None where it has none."""
    if not isinstance(config, dict):
        return None
    text = _text_config(config)
    quantization = (text or config).get("quantization_config", config.get("quantization_config"))
    return quantization if _quant_method(quantization) == BITSANDBYTES else None


def read_hf_quantization_config(path: Path) -> dict[str, Any] | None:
    """:func:`hf_quantization_config` of a config.json file."""
    return hf_quantization_config(_load(path))


def _text_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """A multimodal config's ``text_config`` when it is a supported family (and the whole is not)."""
    text = config.get("text_config")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or _family(model_type) or not isinstance(text, dict):
        return None
    text_type = text.get("model_type")
    return text if _family(text_type) is not None else None


def hf_config_notes(config: Any) -> tuple[str, ...]:
    """What the reader tells the user about a config it accepted: a multimodal config's text model."""
    if not isinstance(config, dict):
        return ()
    text = _text_config(config)
    if text is None:
        return ()
    return (
        f"model_type {config.get('model_type')!r} is multimodal: its text_config ({text['model_type']}) is "
        "the model read; the vision tower and projector are not counted",
    )


def architecture_from_hf_text(raw: bytes, where: str, name: str) -> Architecture:
    """The architecture of a config.json's bytes read from elsewhere than a file (standard input)."""
    return architecture_from_hf_dict(_parsed(raw, where), where, name)


def config_title(architecture: Architecture, where: str) -> str:
    """How a config.json's model is titled: the class transformers builds for it, and where it was read
    (``LlamaForCausalLM, cfg/config``), whatever the file or its folder is named."""
    built = FAMILIES[architecture.family].follows.split(": ", 1)[-1].split(" ", 1)[0]
    return f"{built}, {where}"


def architecture_from_hf_dict(config: Any, where: str, name: str, bitsandbytes: bool = False) -> Architecture:
    """The architecture of a parsed ``config.json`` (``where`` names it in errors); a bitsandbytes
    ``quantization_config`` accepted where ``bitsandbytes`` (its reader models it), else refused."""
    if not isinstance(config, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(config), "a number"
        )
        raise InputError(
            f"{where} is not a config.json object (it holds {kind}); accepted: a JSON object {{...}}"
        )
    _refuse_quantization(config, where, bitsandbytes)
    text = _text_config(config)
    if text is not None:
        config, where = text, f"{where} text_config"
        _refuse_quantization(config, where, bitsandbytes)
    model_type = config.get("model_type")
    family = _family(model_type)
    if family is None:
        named = shown(model_type) if isinstance(model_type, str) else _show(model_type)
        aliases = ", ".join(f"{alias} (as {target})" for alias, target in MODEL_TYPE_ALIASES.items())
        raise InputError(
            f"{where}: model_type {named} is not supported; accepted: {', '.join(SUPPORTED)}, {aliases}"
        )
    values = _values(family, config, where)
    try:
        fields = family.rule(values)
        heads, kv = fields["num_heads"], fields.get("num_kv_heads") or fields["num_heads"]
        if heads % kv:
            raise ValueError(
                f"{heads} attention heads are not a multiple of {kv} key/value heads (the config's "
                "num_key_value_heads, or its family default); accepted: key/value heads dividing the heads"
            )
        positions = config.get("max_position_embeddings")
        if (
            not fields.get("learned_position_embeddings")
            and _is_whole(positions)
            and 0 < positions <= MAX_SIZE
        ):
            fields["max_position_embeddings"] = positions  # rotary: the positions it was trained for
        return Architecture(
            name=name, family=family.model_type, **fields, **_dropout(family.model_type, config, where)
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise InputError(f"{where}: {field + ': ' if field else ''}{message}") from exc
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from exc
