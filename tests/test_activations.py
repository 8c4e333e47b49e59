"""Activation accounting against Korthikanti et al. 2022 (Table 2), computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerocalc.model.activations import ActivationShape, MlpKind, layer_terms
from zerocalc.model.model_impl import QUADRATIC_TERMS


def gpt(h: int, a: int, s: int = 2048, b: int = 1) -> ActivationShape:
    return ActivationShape(
        seq_len=s, micro_batch=b, hidden=h, heads=a, kv_heads=a, head_dim=h // a, ffn_hidden=4 * h,
    )  # fmt: skip


def selective(terms: dict[str, int]) -> int:
    """What a layer keeps under selective recomputation: every term but the attention core's s² ones."""
    return sum(b for name, b in terms.items() if name not in QUADRATIC_TERMS)


@pytest.mark.parametrize(
    ("name", "h", "a", "per_layer", "kept"),
    [
        # GPT-3 175B: sbh(34 + 5as/h) = 2048*12288*(34 + 80) ; selective 34*sbh
        ("gpt3-175b", 12288, 96, 2_868_903_936, 855_638_016),
        # MT-NLG 530B: 2048*20480*(34 + 64) ; selective 34*sbh
        ("mt-nlg-530b", 20480, 128, 4_110_417_920, 1_426_063_360),
    ],
)
def test_korthikanti_per_layer_values(name: str, h: int, a: int, per_layer: int, kept: int) -> None:
    shape = gpt(h, a)
    terms = layer_terms(shape)
    assert sum(terms.values()) == per_layer == 2048 * h * (34 + 5 * a * 2048 // h)
    assert selective(terms) == kept == 34 * 2048 * h


def test_flash_attention_removes_the_s_squared_terms_like_selective() -> None:
    shape = gpt(12288, 96)
    flash = shape.model_copy(update={"flash_attention": True})
    lse = 4 * 2048 * 96  # fp32 log-sum-exp per head and row
    assert sum(layer_terms(flash).values()) == selective(layer_terms(shape)) + lse


def test_llama_layer_constants_are_derived_not_34() -> None:
    # Llama-3-8B style: h 4096, 32 heads of 128, 8 kv heads, SwiGLU f 14336, no dropout, flash attention
    s, b, h, f = 8192, 1, 4096, 14336
    shape = ActivationShape(
        seq_len=s, micro_batch=b, hidden=h, heads=32, kv_heads=8, head_dim=128, ffn_hidden=f,
        mlp=MlpKind.SWIGLU, dropout=False, flash_attention=True,
    )  # fmt: skip
    sbh = s * b * h
    # norms 4sbh + qkv input 2sbh + q 2sbh + k, v 2 * 2sb(h/4) + projection input 2sbh = 11 sbh
    # SwiGLU: input 2sbh + gate, up, silu, product 4 * 2sbf ; log-sum-exp 4 * s * b * 32
    expected = 11 * sbh + 2 * sbh + 8 * s * b * f + 4 * s * b * 32
    assert sum(layer_terms(shape).values()) == expected


def test_moe_saves_each_routed_copy() -> None:
    dense = ActivationShape(
        seq_len=4096, micro_batch=1, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn_hidden=14336,
        mlp=MlpKind.SWIGLU, dropout=False, flash_attention=True,
    )  # fmt: skip
    moe = dense.model_copy(update={"experts": 8, "experts_per_token": 2})
    d, m = layer_terms(dense), layer_terms(moe)
    assert m["experts_gate_output"] == 2 * d["gate_output"]
    assert m["router_input"] == d["mlp_input"]
    assert m["router_logits_fp32"] == 4 * 4096 * 8


shapes = st.builds(
    ActivationShape,
    seq_len=st.integers(1, 32768), micro_batch=st.integers(1, 64), hidden=st.integers(64, 16384),
    heads=st.just(8), kv_heads=st.sampled_from([1, 2, 8]), head_dim=st.integers(8, 256),
    ffn_hidden=st.integers(64, 65536), mlp=st.sampled_from(list(MlpKind)), dropout=st.booleans(),
    flash_attention=st.booleans(),
)  # fmt: skip


# Realistic shapes: heads of 128 that fill the hidden size, s ≥ 128.
@st.composite
def realistic(draw: st.DrawFn) -> ActivationShape:
    hidden = draw(st.sampled_from([1024, 2048, 4096, 8192, 12288]))
    heads = hidden // 128
    return ActivationShape(
        seq_len=draw(st.integers(128, 4096)), micro_batch=draw(st.integers(1, 16)), hidden=hidden,
        heads=heads, kv_heads=draw(st.sampled_from([1, heads // 4, heads])), head_dim=128,
        ffn_hidden=draw(st.integers(2 * hidden, 4 * hidden)), mlp=draw(st.sampled_from(list(MlpKind))),
        dropout=draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(realistic())
def test_flash_attention_keeps_less_than_eager_and_more_than_selective(shape: ActivationShape) -> None:
    """Flash attention trades the s² tensors for a log-sum-exp of s·b·a fp32 values per layer."""
    eager = layer_terms(shape)
    flash = sum(layer_terms(shape.model_copy(update={"flash_attention": True})).values())
    assert selective(eager) < flash < sum(eager.values())


@settings(max_examples=200, deadline=None)
@given(shapes)
def test_selective_drops_exactly_the_s_squared_terms(shape: ActivationShape) -> None:
    """Doubling s quadruples every term selective recomputation drops and doubles every one it keeps."""
    terms, longer = layer_terms(shape), layer_terms(shape.model_copy(update={"seq_len": 2 * shape.seq_len}))
    for name, value in terms.items():
        assert longer[name] == (4 if name in QUADRATIC_TERMS else 2) * value, name


@settings(max_examples=100, deadline=None)
@given(shapes, st.integers(1, 4))
def test_monotone_in_micro_batch_and_sequence(shape: ActivationShape, k: int) -> None:
    for field in ("micro_batch", "seq_len"):
        bigger = layer_terms(shape.model_copy(update={field: getattr(shape, field) * (k + 1)}))
        terms = layer_terms(shape)
        assert sum(bigger.values()) > sum(terms.values())
        assert selective(bigger) > selective(terms)
