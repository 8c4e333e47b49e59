"""zerocalc's LoRA tensors are PEFT 0.21's: for tiny transformers 5.17 models of every family, built from a
config with random weights in bf16, ``get_peft_model(model, LoraConfig(...))`` holds exactly the parameters
zerocalc predicts — every name, shape, dtype and requires_grad — for the default targets, all-linear,
explicit names, DoRA, an embedding target and modules_to_save; and where PEFT refuses a configuration,
zerocalc refuses it too."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from finetune_reference import expected, measured  # noqa: E402
from test_families import CASES  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from zerocalc.base.errors import InputError  # noqa: E402
from zerocalc.model.hf_config import architecture_from_hf_dict  # noqa: E402
from zerocalc.parallel.finetune import FineTuning, LoraConfig, finetune_counts  # noqa: E402
from zerocalc.validate.peft_model import lora_model  # noqa: E402

pytestmark = pytest.mark.slow

TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"mlp_only_layers": [0]},  # a dense layer beside a sparse one
    "qwen2_moe": {"mlp_only_layers": [0], "shared_expert_intermediate_size": 24},
}

LORAS: dict[str, dict[str, Any]] = {
    "default": {},
    "all-linear": {"targets": "all-linear"},
    "all-linear-dora": {"targets": "all-linear", "dora": True},
    "all-linear-dropout": {"targets": "all-linear", "dropout": 0.05},
    "named": {"targets": ("q_proj", "self_attn.o_proj", "down_proj", "c_fc", "dense")},
    "embedding-dora": {"targets": ("embed_tokens", "wte", "embed_in", "word_embeddings"), "dora": True},
    "router": {"targets": ("gate", "q_proj")},
    "saved": {"targets": "all-linear", "modules_to_save": ("lm_head", "norm")},
    "saved-container": {"targets": ("q_proj", "c_attn", "query_key_value"), "modules_to_save": ("mlp",)},
    "half-fused": {"targets": ("gate_proj", "w1")},
}


def _config(family: str) -> dict[str, Any]:
    return {"model_type": family, **CASES[family][0], **TINY_OVERRIDES.get(family, {})}


def _peft_model(config: dict[str, Any], lora: LoraConfig) -> Any:
    settings = dict(config)
    cfg = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Conv1D's fan_in_fan_out, tied layers, unmatched rank patterns
        return lora_model(model, lora)  # the builder validate uses


def _cases() -> list[Any]:
    return [pytest.param(family, name, id=f"{family}-{name}") for family in CASES for name in LORAS]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("family", "name"), _cases())
def test_the_peft_model_holds_what_zerocalc_predicts(family: str, name: str) -> None:
    config = _config(family)
    arch = architecture_from_hf_dict(config, "config.json", "tiny")
    lora = LoraConfig(rank=4, **LORAS[name])
    finetune = FineTuning(lora=lora)
    try:
        model = _peft_model(config, lora)
    except ValueError as refusal:  # PEFT refuses it: so does zerocalc
        with pytest.raises(InputError):
            expected(arch, finetune)
        assert str(refusal)
        return
    assert measured(model) == expected(arch, finetune)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    counts = finetune_counts(arch, finetune)
    assert (counts.trainable, counts.frozen) == (trainable, frozen)
