"""`validate fake --fp8` where torchao's eager casts meet the peaks: the real Float8Linear and FSDP2 under
fake tensors (torch 2.13, torchao 0.18, transformers 5.17) against the timeline, every phase to the byte."""

from __future__ import annotations

import importlib.util

import pytest

from zerocalc.model.activations import Recompute
from zerocalc.model.hf_config import architecture_from_hf_dict
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.validate import fake

needs_torchao = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "torchao")),
    reason="needs torch, transformers and torchao",
)
WIDE = {
    "model_type": "llama", "vocab_size": 1024, "hidden_size": 512, "intermediate_size": 2048,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": False,
}  # fmt: skip
"""Two Llama layers of 512-wide blocks and a 2048-wide MLP: a weight's cast (9 B per element of 2048 × 512)
is the forward's peak and the gate projection's the backward's."""
LLAMA_3_8B_LAYERS = {
    **WIDE, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 16384,
}  # fmt: skip
"""Two of Llama 3 8B's layers, a vocabulary small enough for the casts to meet the peaks."""
CASES = [
    (WIDE, Fp8RecipeName.TENSORWISE, False, 8, 2, 64),
    (WIDE, Fp8RecipeName.ROWWISE, False, 8, 2, 64),
    (WIDE, Fp8RecipeName.TENSORWISE, True, 64, 2, 64),
    (WIDE, Fp8RecipeName.TENSORWISE, False, 8, 2, 512),
    (WIDE, Fp8RecipeName.ROWWISE_GW_HP, False, 8, 2, 512),
    (WIDE, Fp8RecipeName.TENSORWISE, True, 8, 2, 512),
    (LLAMA_3_8B_LAYERS, Fp8RecipeName.TENSORWISE, False, 8, 1, 2048),
]


@needs_torchao
@pytest.mark.slow
@pytest.mark.parametrize(("config", "recipe", "all_gather", "world", "b", "s"), CASES)
def test_the_casts_at_the_peaks_agree_to_the_byte(
    config: dict, recipe: Fp8RecipeName, all_gather: bool, world: int, b: int, s: int
) -> None:
    from zerocalc.validate import fake_step

    arch = architecture_from_hf_dict(config, "llama", "llama")
    case = fake.FakeCase(
        model="llama", world=world, micro_batch=b, seq_len=s, recompute=Recompute.NONE, reshard=True,
        fp8=recipe, fp8_all_gather=all_gather,
    )  # fmt: skip
    request = fake.request_for(arch, case)
    measured, seconds = fake_step.run(config, world, b, s, True, False, (recipe.value, all_gather))
    result = fake.compare(request, case, measured, seconds, config)
    assert result.exact, [(line.line, line.measured - line.predicted) for line in result.lines]
    if not all_gather:  # the casts are what the forward's peak holds above bf16's
        plain = fake.request_for(arch, case.model_copy(update={"fp8": Fp8RecipeName.NONE}))
        assert measured.forward_peak > fake.predict(plain, case)[0].forward_peak
