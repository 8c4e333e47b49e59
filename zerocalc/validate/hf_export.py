"""A model preset written back as the config.json transformers builds it (pure), for ``validate fake``.

The keys are those :mod:`zerocalc.model.hf_config` reads for the family (the layout of its transformers
5.17 configuration class). The result is read back with
:func:`~zerocalc.model.hf_config.architecture_from_hf_dict`: a preset whose config.json would not give the
same architecture again is refused, so the model the fake run builds is the one predicted.
"""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.model.architecture import Architecture
from zerocalc.model.hf_config import architecture_from_hf_dict

TOKENS = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
"""Token ids inside every vocabulary (the configuration classes' defaults can lie beyond a small one)."""
EXPORTED = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe")
"""Families written back: the dense and mixture-of-experts layouts the fake run is checked on."""


def _common(arch: Architecture) -> dict[str, Any]:
    return {
        "model_type": arch.family,
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.kv_heads,
        "head_dim": arch.dim_per_head,
        "intermediate_size": arch.intermediate_size,
        "tie_word_embeddings": arch.tied_embeddings,
        **({"max_position_embeddings": arch.max_position_embeddings} if arch.max_position_embeddings else {}),
        **TOKENS,
    }


def hf_config_of(arch: Architecture, where: str) -> dict[str, Any]:
    """The config.json of ``arch``; an InputError naming ``where`` when its family is not written back or
    the config.json would not give ``arch`` again."""
    if arch.family not in EXPORTED:
        raise InputError(
            f"{where} is a {arch.family or 'custom'} model, not built from a preset by validate fake; "
            f"accepted: a preset of {', '.join(EXPORTED)}, or its config.json"
        )
    config = _common(arch)
    if arch.family == "llama":
        config |= {"attention_bias": arch.qkv_bias, "mlp_bias": arch.mlp_bias}
    if arch.family == "mixtral":
        config |= {"num_local_experts": arch.num_experts, "num_experts_per_tok": arch.experts_per_token}
    if arch.family == "qwen3_moe":
        config |= {
            "moe_intermediate_size": arch.intermediate_size,
            "intermediate_size": arch.dense_intermediate_size or arch.intermediate_size,
            "num_experts": arch.num_experts,
            "num_experts_per_tok": arch.experts_per_token,
            "decoder_sparse_step": 1,
            "mlp_only_layers": list(arch.dense_layers),
            "norm_topk_prob": True,
        }
    back = architecture_from_hf_dict(config, where, arch.name)
    written = {"name", "head_dim", "num_kv_heads"}  # unset: d / a and a, written out here
    derived = (back.dim_per_head, back.kv_heads) == (arch.dim_per_head, arch.kv_heads)
    if back.model_dump(exclude=written) != arch.model_dump(exclude=written) or not derived:
        raise InputError(
            f"{where} cannot be written as a {arch.family} config.json that transformers builds the same; "
            "accepted: its config.json"
        )
    return config
