"""Activation accounting against Korthikanti et al. 2022 (Table 2), computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerocalc.model.activations import (
    ActivationShape,
    CpImpl,
    MlpKind,
    layer_input_bytes,
    layer_terms,
)
from zerocalc.model.code import QUADRATIC_TERMS


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


# Korthikanti et al. 2022, Table 2, GPT-3 175B (Table 3: s 2048, h 12288, a 96, t 8) with b = 1, per layer
# and per rank; sbh = 2048 * 12288 = 25_165_824 and 5as/h = 5 * 96 * 2048 / 12288 = 80:
#   tensor parallel                     sbh(10 + 24/t + 5as/(ht)) = sbh(10 + 3 + 10)  = 23 sbh
#   tensor + sequence parallel          sbh(34/t + 5as/(ht))      = sbh(4.25 + 10)   = 14.25 sbh
#   tensor parallel + selective         sbh(10 + 24/t)            = 13 sbh
#   tensor + sequence + selective       sbh(34/t)                 = 4.25 sbh
#   full recomputation                  2sbh (the layer input), 2sbh/t under sequence parallelism
SBH = 2048 * 12288


@pytest.mark.parametrize(
    ("sequence_parallel", "per_layer", "kept"),
    [
        (False, 578_813_952, 327_155_712),  # 23 sbh, 13 sbh
        (True, 358_612_992, 106_954_752),  # 14.25 sbh, 4.25 sbh
    ],
)
def test_korthikanti_table_2_gpt3_175b_tensor_parallel(
    sequence_parallel: bool, per_layer: int, kept: int
) -> None:
    shape = gpt(12288, 96).model_copy(update={"tp": 8, "sequence_parallel": sequence_parallel})
    terms = layer_terms(shape)
    assert sum(terms.values()) == per_layer
    assert selective(terms) == kept
    if sequence_parallel:
        assert per_layer == SBH * 57 // 4 and kept == SBH * 17 // 4
    else:
        assert per_layer == 23 * SBH and kept == 13 * SBH


def test_korthikanti_table_2_full_recomputation_keeps_the_layer_input() -> None:
    assert layer_input_bytes(gpt(12288, 96)) == 2 * SBH == 50_331_648
    tp = gpt(12288, 96).model_copy(update={"tp": 8})
    assert layer_input_bytes(tp) == 2 * SBH  # replicated without sequence parallelism
    sp = tp.model_copy(update={"sequence_parallel": True})
    assert layer_input_bytes(sp) == 2 * SBH // 8 == 6_291_456


def test_megatron_theoretical_memory_usage_formulas() -> None:
    """Megatron-LM ``training/theoretical_memory_usage.py``: per layer per rank sbh(18 + 4f/h)/t with
    sequence parallelism and selective recomputation, sbh(10 + 24/t) without sequence parallelism; here
    the 22B model of Korthikanti Table 3 (h 6144, a 64, f 4h) at t 8, s 2048, b 4."""
    shape = gpt(6144, 64, b=4).model_copy(update={"tp": 8})
    sbh = 2048 * 4 * 6144
    assert selective(layer_terms(shape)) == sbh * (10 + 24 // 8)
    sp = shape.model_copy(update={"sequence_parallel": True})
    assert selective(layer_terms(sp)) == sbh * (18 + 4 * 4) // 8


def test_tensor_parallel_splits_the_columns_and_keeps_the_replicated_ten() -> None:
    """Without sequence parallelism the two norm inputs, the QKV and MLP inputs (2sbh each) and the two
    dropout masks (sbh each) stay whole: 10 sbh; every other term is /t."""
    whole, split = layer_terms(gpt(12288, 96)), layer_terms(gpt(12288, 96).model_copy(update={"tp": 8}))
    replicated = {"attn_norm_input", "qkv_input", "attn_out_dropout_mask", "mlp_norm_input", "mlp_input"}
    replicated |= {"mlp_dropout_mask"}
    assert sum(whole[name] for name in replicated) == 10 * SBH
    for name, value in whole.items():
        assert split[name] == (value if name in replicated else value // 8), name


def test_grouped_query_attention_under_tensor_parallelism() -> None:
    # Llama-3-70B style: h 8192, 64 heads of 128, 8 kv heads, SwiGLU f 28672, flash, t 8: per rank 8 heads,
    # 1 kv head, f/t 3584; s 4096, b 1, sequence parallel: the norms' and inputs' rows are s/t = 512
    s, h, f = 4096, 8192, 28672
    shape = ActivationShape(
        seq_len=s, micro_batch=1, hidden=h, heads=64, kv_heads=8, head_dim=128, ffn_hidden=f,
        mlp=MlpKind.SWIGLU, dropout=False, flash_attention=True, tp=8, sequence_parallel=True,
    )  # fmt: skip
    terms = layer_terms(shape)
    assert terms["k"] == terms["v"] == 2 * s * 128
    assert terms["q"] == terms["out_proj_input"] == 2 * s * 1024
    assert terms["gate_output"] == 2 * s * 3584
    assert terms["mlp_input"] == terms["qkv_input"] == 2 * 512 * h
    assert terms["softmax_logsumexp_fp32"] == 4 * s * 8
    # norms and inputs 4 x 2 x 512h, q/out 2 x 2s x 1024, k/v 2 x 2s x 128, SwiGLU 4 x 2s x 3584, lse
    expected = 8 * 512 * h + 4 * s * 1024 + 4 * s * 128 + 8 * s * 3584 + 4 * s * 8
    assert sum(terms.values()) == expected


@pytest.mark.parametrize("impl", list(CpImpl))
def test_context_parallelism_divides_the_sequence(impl: CpImpl) -> None:
    """Every per-token term of a rank holds s/c tokens; Ulysses keeps the attention output twice (the
    kernel's, over s × a/c, and the projection input all-to-all'd back, over s/c × a)."""
    base = gpt(12288, 96).model_copy(update={"flash_attention": True, "seq_len": 8192})
    cp = layer_terms(base.model_copy(update={"cp": 4, "cp_impl": impl}))
    whole = layer_terms(base)
    for name, value in whole.items():
        assert cp[name] == value // 4, name
    extra = set(cp) - set(whole)
    if impl is CpImpl.ULYSSES:
        assert extra == {"attn_output_before_all_to_all"}
        assert cp["attn_output_before_all_to_all"] == cp["out_proj_input"] == 2 * 2048 * 12288
    else:
        assert extra == set()


def test_context_parallelism_needs_flash_attention() -> None:
    with pytest.raises(ValueError, match="flash"):
        layer_terms(gpt(12288, 96).model_copy(update={"cp": 2}))


def test_indivisible_heads_are_refused() -> None:
    with pytest.raises(ValueError, match=r"attention heads \(96\) is not divisible by 5"):
        layer_terms(gpt(12288, 96).model_copy(update={"tp": 5}))
