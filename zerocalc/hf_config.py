"""Hugging Face ``config.json`` → :class:`~zerocalc.architecture.Architecture`, read offline.

Supported ``model_type`` families and the keys read (``transformers`` configuration classes):
llama, mistral, qwen2 (``LlamaConfig`` keys: vocab_size, hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, intermediate_size, head_dim, tie_word_embeddings,
attention_bias, mlp_bias; Qwen2 always has q/k/v biases), mixtral (plus num_local_experts,
num_experts_per_tok), gpt2 (vocab_size, n_embd, n_layer, n_head, n_positions, n_inner; tied embeddings).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from zerocalc.architecture import Architecture, MlpKind, NormKind
from zerocalc.errors import InputError

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "gpt2")


def _need(config: dict[str, Any], key: str, path: Path) -> Any:
    if key not in config:
        raise InputError(
            f"--model {str(path)!r}: config.json lacks the key {key!r} needed for {config['model_type']}"
        )
    return config[key]


def architecture_from_hf_config(path: Path) -> Architecture:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--model {str(path)!r} cannot be read ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"--model {str(path)!r} is not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(config, dict):
        raise InputError(f"--model {str(path)!r} is not a config.json object")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise InputError(
            f"--model {str(path)!r}: model_type {model_type!r} is not supported; "
            f"accepted: {', '.join(SUPPORTED)}"
        )
    name = path.parent.name or path.stem
    try:
        if model_type == "gpt2":
            hidden = _need(config, "n_embd", path)
            fields: dict[str, Any] = {
                "vocab_size": _need(config, "vocab_size", path),
                "hidden_size": hidden,
                "num_layers": _need(config, "n_layer", path),
                "num_heads": _need(config, "n_head", path),
                "intermediate_size": config.get("n_inner") or 4 * hidden,
                "mlp": MlpKind.GELU,
                "norm": NormKind.LAYERNORM,
                "qkv_bias": True,
                "out_bias": True,
                "mlp_bias": True,
                "tied_embeddings": True,
                "learned_position_embeddings": True,
                "max_position_embeddings": _need(config, "n_positions", path),
            }
        else:
            attention_bias = bool(config.get("attention_bias", False))
            fields = {
                "vocab_size": _need(config, "vocab_size", path),
                "hidden_size": _need(config, "hidden_size", path),
                "num_layers": _need(config, "num_hidden_layers", path),
                "num_heads": _need(config, "num_attention_heads", path),
                "num_kv_heads": config.get("num_key_value_heads"),
                "head_dim": config.get("head_dim"),
                "intermediate_size": _need(config, "intermediate_size", path),
                "mlp": MlpKind.SWIGLU,
                "norm": NormKind.RMSNORM,
                "qkv_bias": model_type == "qwen2" or attention_bias,
                "out_bias": attention_bias,
                "mlp_bias": bool(config.get("mlp_bias", False)),
                "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
            }
            if model_type == "mixtral":
                fields["num_experts"] = _need(config, "num_local_experts", path)
                fields["experts_per_token"] = _need(config, "num_experts_per_tok", path)
        return Architecture(name=name, **fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise InputError(f"--model {str(path)!r}: {where}: {first['msg']}") from exc
