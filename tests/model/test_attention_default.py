"""The attention kernel assumed without --flash-attention: the model code's (§4 of the defaults)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import DATA

from zerocalc.api import estimate_peak
from zerocalc.model.code import HF_ATTENTION, MODEL_CODES, AttentionKernel, ModelImplName
from zerocalc.model.hf_config import FAMILIES, SUPPORTED
from zerocalc.peak.kinds import StepPhase
from zerocalc.request.presets import load_model

GPT2XL_STEPS = DATA / "h200-fsdp2-gpt2xl"
STEPS = [json.loads(line) for line in (GPT2XL_STEPS / "steps.jsonl").read_text().splitlines()]


def test_every_supported_family_names_its_modeling_file() -> None:
    """Every family whose transformers code runs SDPA names its modeling file; the others run eager only
    (test_the_others_run_eager_in_transformers), the kernel assumed for a family without an entry."""
    assert set(HF_ATTENTION) <= set(SUPPORTED)
    assert set(SUPPORTED) - set(HF_ATTENTION) == {"gpt_oss"}


def test_the_others_run_eager_in_transformers() -> None:
    """GPT-OSS's sinks join the softmax, which SDPA does not take: ``_supports_sdpa = False``."""
    transformers = pytest.importorskip("transformers")
    root = Path(transformers.__file__).parent
    for family in set(SUPPORTED) - set(HF_ATTENTION):
        source = (root / FAMILIES[family].follows.split(":")[0]).read_text()
        assert "_supports_sdpa = False" in source, family
    arch, _ = load_model("gpt-oss-20b")
    assert MODEL_CODES[ModelImplName.HF].default_attention(arch)[0] is AttentionKernel.EAGER


def test_the_table_follows_the_transformers_source() -> None:
    """Each family's modeling file supports SDPA, builds its mask with masking_utils (None for a causal
    batch without padding) and hands SDPA that mask: the flash kernel."""
    transformers = pytest.importorskip("transformers")
    assert transformers.__version__ == "5.17.0"
    root = Path(transformers.__file__).parent
    for family, path in HF_ATTENTION.items():
        source = (root / path).read_text()
        assert "_supports_sdpa = True" in source, family
        assert "create_causal_mask" in source, family
        assert "ALL_ATTENTION_FUNCTIONS" in source or re.search(
            r"scaled_dot_product_attention\([^)]*is_causal=is_causal", source, re.S
        ), family
    sdpa = (root / "integrations" / "sdpa_attention.py").read_text()
    assert "is_causal = q_length > 1 and attention_mask is None and is_causal" in sdpa


@pytest.mark.parametrize(
    ("model", "impl", "kernel"),
    [
        ("gpt2-xl", "hf", AttentionKernel.FLASH),
        ("pythia-1.4b", "hf", AttentionKernel.FLASH),
        ("falcon-7b", "hf", AttentionKernel.FLASH),
        ("llama-3-8b", "hf", AttentionKernel.FLASH),
        ("gpt3-175b", "hf", AttentionKernel.EAGER),  # no transformers code for it
        ("gpt2-xl", "megatron", AttentionKernel.EAGER),  # Korthikanti's GPT accounting
        ("llama-3-8b", "torchtitan", AttentionKernel.FLASH),
    ],
)
def test_default_kernel_per_implementation_and_family(model: str, impl: str, kernel: AttentionKernel) -> None:
    peak = estimate_peak(model, 8, strategies="zero3", model_impl=impl, seq_len=1024).peak
    assert peak.options.attention_kernel is kernel
    assert peak.options.flash_attention is (kernel is AttentionKernel.FLASH)
    shown = "flash" if kernel is AttentionKernel.FLASH else "eager, s² kept"
    assert peak.notes[0].endswith(f"; attention: {shown} (the model code's)")
    if impl == "hf" and kernel is AttentionKernel.FLASH:
        assert peak.options.attention_source.startswith("transformers 5.17 models/")
    assert MODEL_CODES[ModelImplName(impl)].name.value == impl


def test_the_flag_still_wins_and_is_named() -> None:
    peak = estimate_peak("gpt2-xl", 8, strategies="zero3", seq_len=1024, flash_attention=False).peak
    assert peak.options.attention_kernel is AttentionKernel.EAGER
    assert peak.options.attention_source == "--no-flash-attention"
    assert peak.notes[0].endswith("; attention: eager, s² kept (--no-flash-attention)")


@pytest.mark.parametrize("m", STEPS, ids=[f"b{m['b']}-{m['attn']}" for m in STEPS])
def test_gpt2_xl_steps_on_an_h200_with_default_flags(m: dict) -> None:
    """Real steps (tests/data/h200-fsdp2-gpt2xl): with transformers' default (sdpa) the default flags give
    the allocated peak within 2% and the device footprint within 10%; eager attention needs the flag, and
    is then as close."""
    flag = {} if m["attn"] == "sdpa" else {"flash_attention": False}
    (row,) = estimate_peak(
        "gpt2-xl", 1, framework="fsdp2", strategies="zero3", micro_batch=m["b"], seq_len=1024,
        reduce_dtype="fp32", gpu="h200-141gb", init="gpu", **flag,
    ).peak.strategies  # fmt: skip
    measured = max(m["fwd"], m["bwd"], m["opt"])
    assert abs(row.allocated_peak_bytes / measured - 1) < 0.02
    assert abs(row.peak_bytes / m["used"] - 1) < 0.10
    for phase, key in ((StepPhase.FORWARD, "fwd"), (StepPhase.BACKWARD, "bwd"), (StepPhase.OPTIMIZER, "opt")):
        assert abs(row.phase(phase).allocated_bytes / m[key] - 1) < 0.025
