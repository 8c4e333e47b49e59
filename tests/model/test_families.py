"""Every config.json family counts exactly as transformers 5.17 builds it (on the meta device).

For each family: tiny configs (its defaults, then each key that changes the count), built with
``AutoModelForCausalLM.from_config`` on the meta device, against zerocalc reading the same dict from a
config.json: the total, the largest module (most parameters held directly, DeepSpeed's ``model_to_params``),
the active parameters per token (MoE: k of each experts module's E experts) and the largest block. Then the
published models, full size, from their published config.json hyper-parameters.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from zerocalc.model.architecture import (  # noqa: E402
    ParameterCount,
    TensorParallelRank,
    count_parameters,
    layer_tensors,
)
from zerocalc.model.hf_config import FAMILIES, architecture_from_hf_config  # noqa: E402
from zerocalc.request.presets import load_model  # noqa: E402

transformers.logging.set_verbosity_error()

TOKENS = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}  # inside the tiny vocabularies
TINY = {"vocab_size": 101, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, **TOKENS}  # fmt: skip
QWEN_MOE = {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 8}
DEEPSEEK = {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_group": 2,
            "topk_group": 1, "num_hidden_layers": 3, "first_k_dense_replace": 1, "q_lora_rank": 12,
            "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}  # fmt: skip

# family → its tiny base config and the variants toggling each key that changes the count
CASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "gemma2": (TINY, [{}, {"head_dim": 8}, {"num_key_value_heads": 2}, {"attention_bias": True},
                      {"tie_word_embeddings": False}]),
    "gemma3_text": (TINY, [{}, {"head_dim": 12, "num_key_value_heads": 1}, {"attention_bias": True},
                           {"tie_word_embeddings": False}]),
    "phi3": (TINY, [{}, {"num_key_value_heads": 2}, {"head_dim": 12}, {"tie_word_embeddings": True}]),
    "qwen3": ({**TINY, "num_attention_heads": 32}, [  # its default num_key_value_heads is 32
        {}, {"head_dim": 16}, {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8},
        {"attention_bias": True}, {"tie_word_embeddings": True}, {"num_key_value_heads": None},
    ]),
    "qwen3_moe": ({**TINY, **QWEN_MOE}, [
        {}, {"head_dim": 12, "num_key_value_heads": 2}, {"attention_bias": True, "tie_word_embeddings": True},
        {"num_hidden_layers": 4, "decoder_sparse_step": 2}, {"mlp_only_layers": [0]}, {"num_experts": 0},
        {"num_experts_per_tok": 6, "moe_intermediate_size": 40},
    ]),
    "qwen2_moe": ({**TINY, **QWEN_MOE, "num_attention_heads": 16}, [  # its default num_key_value_heads: 16
        {}, {"shared_expert_intermediate_size": 24}, {"qkv_bias": False}, {"num_key_value_heads": 2},
        {"num_hidden_layers": 3, "decoder_sparse_step": 3}, {"mlp_only_layers": [1]}, {"num_experts": 0},
        {"tie_word_embeddings": True, "head_dim": 12},
    ]),
    "deepseek_v3": ({**TINY, **DEEPSEEK}, [
        {}, {"q_lora_rank": None}, {"first_k_dense_replace": 0}, {"first_k_dense_replace": 3},
        {"n_shared_experts": 0}, {"n_shared_experts": 2}, {"attention_bias": True},
        {"tie_word_embeddings": True, "v_head_dim": 10, "qk_rope_head_dim": 2},
        {"intermediate_size": 400, "moe_intermediate_size": 4, "kv_lora_rank": 64},
    ]),
    "olmo2": (TINY, [{}, {"num_key_value_heads": 2}, {"head_dim": 12}, {"attention_bias": True},
                     {"tie_word_embeddings": True}]),
    "falcon": ({k: v for k, v in TINY.items() if k != "intermediate_size"}, [
        {}, {"multi_query": False}, {"parallel_attn": False}, {"bias": True}, {"ffn_hidden_size": 40},
        {"new_decoder_architecture": True, "num_kv_heads": 2},
        {"new_decoder_architecture": True, "num_kv_heads": 1, "num_ln_in_parallel_attn": 1},
        {"num_ln_in_parallel_attn": 2}, {"tie_word_embeddings": False},
    ]),
    "gpt_neox": (TINY, [{}, {"use_parallel_residual": False}, {"attention_bias": False},
                        {"tie_word_embeddings": True}]),
    "gpt2": ({"vocab_size": 101, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16, **TOKENS},
             [{}, {"tie_word_embeddings": False}, {"n_inner": 40}]),
    "llama": (TINY, [{}, {"num_key_value_heads": 2, "head_dim": 12}, {"attention_bias": True},
                     {"mlp_bias": True}, {"tie_word_embeddings": True}]),
    "mistral": ({**TINY, "num_attention_heads": 8}, [  # its default num_key_value_heads is 8
        {}, {"num_key_value_heads": 2, "head_dim": 12}, {"tie_word_embeddings": True}]),
    "mixtral": ({**TINY, "num_attention_heads": 8, "num_local_experts": 4, "num_experts_per_tok": 2},
                [{}, {"num_experts_per_tok": 1, "head_dim": 12, "num_key_value_heads": 2}]),
    "qwen2": ({**TINY, "num_attention_heads": 32}, [  # its default num_key_value_heads is 32
        {}, {"num_key_value_heads": 2, "num_attention_heads": 4, "tie_word_embeddings": True}]),
    "gpt_oss": ({**TINY, "num_attention_heads": 8, "num_local_experts": 4, "num_experts_per_tok": 2}, [
        # its defaults: head_dim 64, num_key_value_heads 8
        {}, {"head_dim": 12, "num_key_value_heads": 2}, {"head_dim": 4, "num_key_value_heads": 8},
        {"attention_bias": False}, {"tie_word_embeddings": True}, {"num_experts_per_tok": 4},
        {"num_local_experts": 6, "experts_per_token": 6},  # the released file's twin key, unread
    ]),
}  # fmt: skip


class Reference(NamedTuple):
    total: int
    largest_layer: int
    active: int
    largest_block: int


def build(config: dict[str, Any]) -> tuple[Any, Any]:
    """transformers' own model of ``config`` on the meta device, and its configuration object."""
    settings = dict(config)
    cfg = AutoConfig.for_model(settings.pop("model_type"), **settings)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg), cfg


def reference(model: Any, cfg: Any) -> Reference:
    """What transformers' model holds: parameters (tied once), the module holding most parameters
    directly, the parameters a token passes through (each experts module: k of its E experts) and the
    largest decoder layer."""
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    inactive = 0
    for m in model.modules():
        if type(m).__name__.endswith("Experts"):  # MixtralExperts, Qwen3MoeExperts, DeepseekV3Experts, ...
            held = sum(p.numel() for p in m.parameters())
            inactive += held // m.num_experts * (m.num_experts - cfg.num_experts_per_tok)
    layers = next(
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == cfg.num_hidden_layers
    )
    block = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    return Reference(total, largest, total - inactive, block)


def ours(count: ParameterCount) -> Reference:
    return Reference(
        count.total, count.largest_layer_params, count.active_per_token, count.largest_block_params
    )


def read(folder: Path, config: dict[str, Any] | str) -> ParameterCount:
    """zerocalc's count of ``config`` written as ``folder/config.json`` (the path users take)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return count_parameters(architecture_from_hf_config(path))


def _cases() -> list[Any]:
    cases = []
    for family, (base, variants) in CASES.items():
        for variant in variants:
            label = ",".join(f"{k}={v}" for k, v in variant.items()) or "defaults"
            config = {"model_type": family, **base, **variant}
            cases.append(pytest.param(config, id=f"{family}-{label}"))
    return cases


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # n_shared_experts 0
@pytest.mark.parametrize("config", _cases())
def test_tiny_configs_count_as_transformers_builds_them(tmp_path: Path, config: dict[str, Any]) -> None:
    model, cfg = build(config)
    expected = reference(model, cfg)
    assert ours(read(tmp_path / "given", config)) == expected
    # the configuration class's whole config.json (every key it writes) is accepted and counts the same
    assert ours(read(tmp_path / "full", cfg.to_json_string(use_diff=False))) == expected


def test_every_supported_family_is_tested_and_cites_a_real_modeling_class() -> None:
    assert set(CASES) == set(FAMILIES)
    for family in FAMILIES.values():
        path, classes = family.follows.split(": ", 1)
        module = importlib.import_module("transformers." + path.removesuffix(".py").replace("/", "."))
        assert hasattr(module, classes.split(" ")[0]), family.model_type


def test_mixtral_experts_are_one_module_in_transformers_5() -> None:
    """The 5.x layout the largest-layer term follows: MixtralExperts holds every expert's weights."""
    config = {"model_type": "mixtral", **CASES["mixtral"][0]}
    model, _ = build(config)
    experts = model.model.layers[0].mlp.experts
    assert [n for n, _ in experts.named_parameters(recurse=False)] == ["gate_up_proj", "down_proj"]
    count = count_parameters(load_model("mixtral-8x7b")[0])
    assert (count.largest_layer_name, count.largest_layer_params) == (
        "layers.*.moe.experts",
        8 * 3 * 4096 * 14336,
    )


# ------------------------------------------------------------------------------------ published models
# Hyper-parameters of each model's published config.json (huggingface.co/<repo>/blob/main/config.json), the
# exact count transformers 5.17 builds from them on the meta device, and the preset that carries them.
LLAMA3 = {"vocab_size": 128256, "num_key_value_heads": 8, "tie_word_embeddings": False}
QWEN3 = {"model_type": "qwen3", "vocab_size": 151936, "num_key_value_heads": 8, "head_dim": 128}
GPT_OSS = {"model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_experts_per_tok": 4,
           "attention_bias": True, "tie_word_embeddings": False}  # fmt: skip
PUBLISHED: dict[str, tuple[dict[str, Any], int]] = {
    # google/gemma-2-2b; 2,614,341,888 is the count issue #16 quotes (the Gemma 2 report rounds to 2.6B)
    "gemma-2-2b": ({"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304,
                    "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "head_dim": 256}, 2_614_341_888),
    # google/gemma-3-1b-pt (the model card says 1B)
    "gemma-3-1b": ({"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152,
                    "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
                    "num_key_value_heads": 1, "head_dim": 256}, 999_885_952),
    # microsoft/Phi-3-mini-4k-instruct (3.8B); 3,821,079,552 as issue #16 quotes
    "phi-3-mini-4k": ({"model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
                       "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
                       "num_key_value_heads": 32, "tie_word_embeddings": False}, 3_821_079_552),
    # Qwen/Qwen3-8B (the card: 8.2B, 6.95B without embeddings); 8,190,735,360 as issue #16 quotes
    "qwen3-8b": ({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
                  "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False}, 8_190_735_360),
    # Qwen/Qwen3-30B-A3B (the card: 30.5B total, 3.3B activated, 29.9B without embeddings)
    "qwen3-30b-a3b": ({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
                       "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                       "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                       "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                       "mlp_only_layers": [], "tie_word_embeddings": False}, 30_532_122_624),
    # Qwen/Qwen1.5-MoE-A2.7B (the card: 14.3B total, 2.7B activated)
    "qwen1.5-moe-a2.7b": ({"model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048,
                           "intermediate_size": 5632, "moe_intermediate_size": 1408,
                           "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24,
                           "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
                           "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                           "tie_word_embeddings": False}, 14_315_784_192),
    # deepseek-ai/DeepSeek-V3 without the MTP module (the report: 671B total, 37B activated; the checkpoint
    # adds 14B of MTP weights, which DeepseekV3ForCausalLM does not build)
    "deepseek-v3": ({"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
                     "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
                     "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
                     "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                     "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                     "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 8, "topk_group": 4,
                     "num_nextn_predict_layers": 1, "tie_word_embeddings": False}, 671_026_404_352),
    # allenai/OLMo-2-1124-7B (the card: 7B)
    "olmo-2-1124-7b": ({"model_type": "olmo2", "vocab_size": 100352, "hidden_size": 4096,
                        "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                        "num_key_value_heads": 32, "tie_word_embeddings": False}, 7_298_617_344),
    # meta-llama/Llama-3.1-8B and -70B (128k context: rope_scaling llama3, factor 8), Llama-3.2-1B and -3B
    # (tied, factor 32)
    "llama-3.1-8b": ({"model_type": "llama", **LLAMA3, "hidden_size": 4096, "intermediate_size": 14336,
                      "num_hidden_layers": 32, "num_attention_heads": 32}, 8_030_261_248),
    "llama-3.1-70b": ({"model_type": "llama", **LLAMA3, "hidden_size": 8192, "intermediate_size": 28672,
                       "num_hidden_layers": 80, "num_attention_heads": 64}, 70_553_706_496),
    "llama-3.2-1b": ({"model_type": "llama", **LLAMA3, "hidden_size": 2048, "intermediate_size": 8192,
                      "num_hidden_layers": 16, "num_attention_heads": 32, "head_dim": 64,
                      "tie_word_embeddings": True}, 1_235_814_400),
    "llama-3.2-3b": ({"model_type": "llama", **LLAMA3, "hidden_size": 3072, "intermediate_size": 8192,
                      "num_hidden_layers": 28, "num_attention_heads": 24, "head_dim": 128,
                      "tie_word_embeddings": True}, 3_212_749_824),
    # Qwen/Qwen3-0.6B, -1.7B, -4B (tied), -14B, -32B (the cards: 0.6, 1.7, 4.0, 14.8, 32.8B)
    "qwen3-0.6b": ({**QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "tie_word_embeddings": True}, 596_049_920),
    "qwen3-1.7b": ({**QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "tie_word_embeddings": True}, 1_720_574_976),
    "qwen3-4b": ({**QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                  "num_attention_heads": 32, "tie_word_embeddings": True}, 4_022_468_096),
    "qwen3-14b": ({**QWEN3, "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40,
                   "num_attention_heads": 40, "tie_word_embeddings": False}, 14_768_307_200),
    "qwen3-32b": ({**QWEN3, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                   "num_attention_heads": 64, "tie_word_embeddings": False}, 32_762_123_264),
    # Qwen/Qwen3-235B-A22B (the card: 235B total, 22B activated)
    "qwen3-235b-a22b": ({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 4096,
                         "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 94,
                         "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
                         "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                         "mlp_only_layers": [], "tie_word_embeddings": False}, 235_093_634_560),
    # openai/gpt-oss-20b and -120b, their bf16 training form (the card: 20.91B and 116.83B total)
    "gpt-oss-20b": ({**GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32}, 20_914_757_184),
    "gpt-oss-120b": ({**GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128}, 116_829_156_672),
    # moonshotai/Kimi-K2-Base, read as DeepSeek-V3 (its model_type kimi_k2: test_kimi_k2_is_deepseek_v3)
    "kimi-k2": ({"model_type": "deepseek_v3", "vocab_size": 163840, "hidden_size": 7168,
                 "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
                 "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
                 "n_routed_experts": 384, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                 "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                 "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
                 "num_nextn_predict_layers": 0, "tie_word_embeddings": False}, 1_026_408_209_408),
    # mistralai/Mistral-7B-v0.3 (vocabulary 32,768), Mistral-Small-24B-Base-2501, Mixtral-8x22B-v0.1
    "mistral-7b-v0.3": ({"model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096,
                         "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                         "num_key_value_heads": 8, "tie_word_embeddings": False}, 7_248_023_552),
    "mistral-small-24b": ({"model_type": "mistral", "vocab_size": 131072, "hidden_size": 5120,
                           "intermediate_size": 32768, "num_hidden_layers": 40, "num_attention_heads": 32,
                           "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False},
                          23_572_403_200),
    "mixtral-8x22b": ({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 6144,
                       "intermediate_size": 16384, "num_hidden_layers": 56, "num_attention_heads": 48,
                       "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                       "tie_word_embeddings": False}, 140_620_634_112),
    # tiiuae/falcon-7b (the card: 7B)
    "falcon-7b": ({"model_type": "falcon", "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32,
                   "num_attention_heads": 71, "multi_query": True, "parallel_attn": True,
                   "new_decoder_architecture": False, "bias": False, "alibi": False}, 6_921_720_704),
    # EleutherAI/pythia-1.4b (Biderman et al. 2023, Table 1: 1,414,647,808)
    "pythia-1.4b": ({"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 2048,
                     "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 16,
                     "rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False},
                    1_414_647_808),
}  # fmt: skip


# keys these config.json files also carry, none of which changes the count (they must be accepted)
COMMON_EXTRAS = {
    "architectures": ["ForCausalLM"],
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "initializer_range": 0.02,
    "use_cache": True,
    "attention_dropout": 0.0,
}
LLAMA31_EXTRAS = {"max_position_embeddings": 131072, "rope_theta": 500000.0, "pretraining_tp": 1,
                  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                  "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-05, "hidden_act": "silu",
                  "bos_token_id": 128000, "eos_token_id": 128001}  # fmt: skip
QWEN3_EXTRAS = {"max_position_embeddings": 40960, "max_window_layers": 28, "use_sliding_window": False,
                "sliding_window": None, "rope_scaling": None, "rope_theta": 1000000, "attention_bias": False,
                "rms_norm_eps": 1e-06, "bos_token_id": 151643, "eos_token_id": 151645}  # fmt: skip
LLAMA32_EXTRAS = {**LLAMA31_EXTRAS, "rope_scaling": {**LLAMA31_EXTRAS["rope_scaling"], "factor": 32.0}}
GPT_OSS_EXTRAS = {
    "experts_per_token": 4, "swiglu_limit": 7.0, "initial_context_length": 4096, "sliding_window": 128,
    "layer_types": None, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "max_position_embeddings": 131072, "output_router_logits": False, "router_aux_loss_coef": 0.9,
    "pad_token_id": 199999, "eos_token_id": 200002,
}  # fmt: skip
EXTRAS: dict[str, dict[str, Any]] = {
    "gemma-2-2b": {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                   "query_pre_attn_scalar": 256, "sliding_window": 4096, "cache_implementation": "hybrid",
                   "rms_norm_eps": 1e-06, "max_position_embeddings": 8192, "rope_theta": 10000.0,
                   "attention_bias": False},
    "gemma-3-1b": {"rope_local_base_freq": 10000, "sliding_window_pattern": 6, "sliding_window": 512,
                   "rope_scaling": None, "rope_theta": 1000000, "attn_logit_softcapping": None,
                   "final_logit_softcapping": None, "query_pre_attn_scalar": 256,
                   "max_position_embeddings": 32768},
    "phi-3-mini-4k": {"original_max_position_embeddings": 4096, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                      "attention_bias": False, "sliding_window": 2047, "rope_scaling": None,
                      "rms_norm_eps": 1e-05},
    "qwen3-8b": {"max_window_layers": 36, "use_sliding_window": False, "sliding_window": None,
                 "rope_scaling": None, "rope_theta": 1000000, "attention_bias": False},
    "qwen3-30b-a3b": {"norm_topk_prob": True, "output_router_logits": False, "router_aux_loss_coef": 0.001,
                      "max_window_layers": 48, "use_sliding_window": False, "sliding_window": None,
                      "attention_bias": False},
    "qwen1.5-moe-a2.7b": {"norm_topk_prob": False, "output_router_logits": False, "max_window_layers": 21,
                          "use_sliding_window": False, "sliding_window": 32768,
                          "router_aux_loss_coef": 0.001},
    "deepseek-v3": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "aux_loss_alpha": 0.001,
                    "seq_aux": True, "ep_size": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                    "attention_bias": False, "max_position_embeddings": 163840,
                    "auto_map": {"AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}},
    "olmo-2-1124-7b": {"attention_bias": False, "rope_scaling": None, "rope_theta": 500000,
                       "max_position_embeddings": 4096},
    "falcon-7b": {"apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
                  "layer_norm_epsilon": 1e-05},
    "pythia-1.4b": {"rotary_emb_base": 10000, "layer_norm_eps": 1e-05, "hidden_act": "gelu",
                    "max_position_embeddings": 2048},
    **dict.fromkeys(("llama-3.1-8b", "llama-3.1-70b"), LLAMA31_EXTRAS),
    "llama-3.2-1b": LLAMA32_EXTRAS,
    "llama-3.2-3b": LLAMA32_EXTRAS,
    **dict.fromkeys(("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-14b", "qwen3-32b"), QWEN3_EXTRAS),
    "qwen3-235b-a22b": {**QWEN3_EXTRAS, "norm_topk_prob": True, "output_router_logits": False,
                        "router_aux_loss_coef": 0.001, "max_window_layers": 94},
    "gpt-oss-20b": GPT_OSS_EXTRAS,
    "gpt-oss-120b": GPT_OSS_EXTRAS,
    "kimi-k2": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "aux_loss_alpha": 0.001,
                "seq_aux": True, "ep_size": 1, "routed_scaling_factor": 2.827, "norm_topk_prob": True,
                "attention_bias": False, "max_position_embeddings": 131072, "rope_theta": 50000.0,
                "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                 "type": "yarn"},
                "bos_token_id": 163584, "eos_token_id": 163585, "rms_norm_eps": 1e-06},
    "mistral-7b-v0.3": {"max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": None,
                        "rms_norm_eps": 1e-05, "hidden_act": "silu"},
    "mistral-small-24b": {"max_position_embeddings": 32768, "rope_theta": 100000000.0, "sliding_window": None,
                          "rms_norm_eps": 1e-05, "hidden_act": "silu"},
    "mixtral-8x22b": {"max_position_embeddings": 65536, "rope_theta": 1000000.0, "sliding_window": None,
                      "router_aux_loss_coef": 0.001, "output_router_logits": False, "rms_norm_eps": 1e-05},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_models_count_as_transformers_builds_them(tmp_path: Path, name: str) -> None:
    config, total = PUBLISHED[name]
    config = {**config, **COMMON_EXTRAS, **EXTRAS[name]}
    model, cfg = build(config)
    expected = reference(model, cfg)
    assert expected.total == total
    assert ours(read(tmp_path, config)) == expected
    arch, preset = load_model(name)  # the preset carries the same hyper-parameters
    assert ours(count_parameters(arch)) == expected
    assert preset is not None and preset.published_params is not None
    assert abs(total - preset.published_params) <= preset.published_tolerance * preset.published_params


def test_gpt2_untied_counts_its_head(tmp_path: Path) -> None:
    """Issue #16: a gpt2 config with tie_word_embeddings false was counted tied (124,439,808)."""
    config = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
              "n_positions": 1024, "tie_word_embeddings": False}  # fmt: skip
    model, cfg = build(config)
    assert reference(model, cfg).total == read(tmp_path, config).total == 163_037_184


def test_kimi_k2_is_deepseek_v3(tmp_path: Path) -> None:
    """Kimi K2's config.json names model_type kimi_k2 (which transformers 5.17 does not register) for
    DeepSeek-V3's classes (its architectures and auto_map): zerocalc reads it as deepseek_v3, whose
    DeepseekV3ForCausalLM is what it builds."""
    config, total = PUBLISHED["kimi-k2"]
    config = {**config, **COMMON_EXTRAS, **EXTRAS["kimi-k2"], "architectures": ["DeepseekV3ForCausalLM"],
              "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                           "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}  # fmt: skip
    model, cfg = build(config)
    kimi = read(tmp_path, {**config, "model_type": "kimi_k2"})
    assert ours(kimi) == reference(model, cfg) and kimi.total == total
    assert architecture_from_hf_config(tmp_path / "config.json").family == "deepseek_v3"


def test_gpt_oss_sinks_split_with_the_heads_and_expert_biases_with_their_columns() -> None:
    """Under tensor parallelism a rank holds its heads' sinks and its share of each expert's gate/up columns
    with their biases; the down projection's bias, like a row-parallel Linear's, and the router stay whole."""
    arch, _ = load_model("gpt-oss-20b")
    rank = TensorParallelRank(**dict(arch), tp=2)
    shapes = {f"{t.module.split('.', 2)[-1]}.{t.name}": t.shape for t in layer_tensors(rank, 0)}
    e, d, f = 32, 2880, 2880
    assert shapes["attn.sinks"] == (32,)
    assert shapes["moe.experts.gate_up_proj"] == (e, f, d) and shapes["moe.experts.gate_up_proj_bias"] == (
        e,
        f,
    )
    assert shapes["moe.experts.down_proj"] == (e, d, f // 2) and shapes["moe.experts.down_proj_bias"] == (
        e,
        d,
    )
    assert shapes["moe.router.weight"] == (e, d) and shapes["moe.router.bias"] == (e,)
    experts = TensorParallelRank(**dict(arch), tp=1, ep=4)
    ep_shapes = {t.name: t.shape for t in layer_tensors(experts, 0) if t.module.endswith("experts")}
    assert ep_shapes["gate_up_proj_bias"] == (8, 2 * f) and ep_shapes["down_proj_bias"] == (8, d)
