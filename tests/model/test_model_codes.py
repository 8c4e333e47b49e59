"""The model codes (zerocalc/model/code/): one record per --model-impl value, each answering every question
of the protocol, and the family traits read from the family records."""

from __future__ import annotations

import pytest

from zerocalc.model.architecture import Architecture, MlpKind, NormKind
from zerocalc.model.code import HF, MODEL_CODES, ModelCode, ModelImplName
from zerocalc.model.code.hf import HfCode
from zerocalc.model.hf_config import FAMILIES, Traits
from zerocalc.model.traits import traits


def test_every_model_impl_value_has_one_record_of_its_name() -> None:
    assert set(MODEL_CODES) == set(ModelImplName)
    for name, code in MODEL_CODES.items():
        assert isinstance(code, ModelCode)
        assert code.name is name


def test_a_code_that_leaves_a_decision_unset_is_refused_where_it_is_defined() -> None:
    with pytest.raises(TypeError, match="does not set sharded_logits"):
        type(
            "Partial",
            (ModelCode,),
            {f: getattr(HF, f) for f in ModelCode.__annotations__ if f != "sharded_logits"},
        )


def test_a_code_that_leaves_a_question_unanswered_cannot_be_made() -> None:
    answers = {k: v for k, v in vars(HfCode).items() if not k.startswith("_") and k != "layer"}
    with pytest.raises(TypeError, match=r"abstract method.*layer"):
        type("NoLayer", (ModelCode,), answers)()


def _arch(**fields: object) -> Architecture:
    base = dict(name="tiny", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                intermediate_size=128, mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM)  # fmt: skip
    return Architecture(**{**base, **fields})


def test_traits_are_the_family_records_resolved_against_the_architecture() -> None:
    """Gemma 3 (transformers 5.17 Gemma3TextConfig: sliding_window_pattern 6) keeps a second rotary table
    once it has a full-attention layer, the sixth; the record states its traits, the block the rest."""
    assert FAMILIES["gemma3_text"].traits.rotary_tables == 2
    assert traits(_arch(family="gemma3_text", num_layers=5)).rotary_tables == 1
    assert traits(_arch(family="gemma3_text", num_layers=6)).rotary_tables == 2
    assert traits(_arch(family="gemma3_text")).norm == "gemma"
    assert traits(_arch(family="falcon", norm=NormKind.LAYERNORM)).norm == "layernorm"
    assert traits(_arch(learned_position_embeddings=True, max_position_embeddings=64)).rotary is False


def test_an_architecture_without_a_family_takes_gpt2s_or_llamas_traits() -> None:
    gpt = traits(
        _arch(
            mlp=MlpKind.GELU,
            norm=NormKind.LAYERNORM,
            learned_position_embeddings=True,
            max_position_embeddings=64,
        )
    )
    assert gpt._replace(norm="llama", rotary=True) == FAMILIES["gpt2"].traits
    assert traits(_arch()) == Traits()
