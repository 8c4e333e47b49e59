"""``zerocalc validate activations``: the hf profile against what the real transformers modules save.

Every family the profile describes is built from its tiny config (zerocalc/validate/saved.py), run forward
in train mode under ``saved_tensors_hooks`` on the CPU, and compared region by region (embedding, each
layer, final, loss) with :func:`zerocalc.validate.saved.predict_regions`: to the byte wherever the profile
claims exactness; where it does not (``NOT_EXACT``), the measurement must still differ, so a stale entry
fails. A few seconds per family (model build included), in-process.
"""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.model.code import HF_ATTENTION, Shape
from zerocalc.model.hf_config import architecture_from_hf_dict
from zerocalc.model.quantized import QuantMethod
from zerocalc.parallel.finetune import FineTuning, LoraConfig, QuantConfig, forward_tuning, peft_alone
from zerocalc.validate.saved import (
    NOT_EXACT,
    TINY_CONFIGS,
    MeasuredStorage,
    Term,
    _match,
    compare,
    not_exact_reason,
    predict_regions,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from zerocalc.validate import saved_measure  # noqa: E402

runner = CliRunner()
SHAPES = [(2, 64), (1, 48)]  # b = 1: the loss's target is a view of the padded labels (no copy)


def _arch(family: str):
    return architecture_from_hf_dict(TINY_CONFIGS[family], family, family)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("family", list(TINY_CONFIGS))
def test_saved_bytes_per_region_equal_the_profile(family: str, dtype: str, attention: str) -> None:
    if attention == "sdpa" and family not in HF_ATTENTION:  # its transformers code runs eager only
        pytest.skip(f"{family}: _supports_sdpa = False")
    arch = _arch(family)
    model = saved_measure.build(TINY_CONFIGS[family], dtype, attention)
    for b, s in SHAPES:
        measured = saved_measure.measure(model, arch.num_layers, b, s, arch.vocab_size)
        case = compare(family, arch, Shape(b, s), dtype, attention, measured)
        assert [r.region for r in case.regions][:2] == ["embedding", "layer 0"]
        assert case.regions[-1].region == "loss"
        if not_exact_reason(family, attention) is None:
            wrong = {r.region: (r.predicted, r.measured, r.unmatched_terms, r.unmatched_storages)
                     for r in case.regions if not r.ok}  # fmt: skip
            assert wrong == {}, f"{family} {dtype} {attention} b={b} s={s}"
        else:  # not claimed: it must still be off, else the NOT_EXACT entry is stale
            assert not case.exact or (b, s) != SHAPES[0]


def test_every_family_the_hf_profile_reads_has_a_tiny_config() -> None:
    from zerocalc.model.hf_config import FAMILIES

    assert set(TINY_CONFIGS) == set(FAMILIES)
    assert {family for family, _ in NOT_EXACT} <= set(FAMILIES)


def test_llama_layer_by_hand() -> None:
    """FINDINGS' per-layer formula for Llama under bf16 SDPA (flash): 16Th + 4T·a·d + 4T·kv·d + 8Tf + 4T·a
    + 8T (norm copies, q/k/v, SwiGLU, log-sum-exp, rsqrt), layer 0 also cos and sin 2·2·s·d; the loss
    4TV + 8T + 4; against both the profile and the measurement."""
    cfg = TINY_CONFIGS["llama"]
    b, s = 2, 64
    T, h, f, a, kv, d, V = b * s, cfg["hidden_size"], cfg["intermediate_size"], 8, 2, 16, cfg["vocab_size"]
    layer = 16 * T * h + 4 * T * a * d + 4 * T * kv * d + 8 * T * f + 4 * T * a + 8 * T
    regions = predict_regions(_arch("llama"), Shape(b, s), "bf16", "sdpa")
    assert sum(t.bytes for t in regions["layer 1"]) == layer
    assert sum(t.bytes for t in regions["layer 0"]) == layer + 4 * s * d
    assert sum(t.bytes for t in regions["loss"]) == 4 * T * V + 8 * T + 4
    model = saved_measure.build(cfg, "bf16", "sdpa")
    measured = saved_measure.measure(model, 2, b, s, V)
    assert sum(m.bytes for m in measured if m.region == "layer 1") == layer


@pytest.mark.parametrize(("dtype", "act", "layer_bytes"), [("bf16", 2, 1_431_824), ("fp32", 4, 2_581_776)])
def test_gpt_oss_layer_by_hand(dtype: str, act: int, layer_bytes: int) -> None:
    """GPT-OSS (transformers 5.17 ``modeling_gpt_oss.py``, eager: ``_supports_sdpa = False``), per layer:
    two ``GptOssRMSNorm`` (``(weight * x).to(dtype)``: the fp32 copy, rsqrt, the fp32 normalised tensor,
    the output) 2·(8Th + 4T + act·Th); q, k and v repeated to a heads, the output 4·act·T·a·d; the sink
    column: the row max's int64 indices 8·T·a and the softmax over s + 1 columns act·T·a·(s + 1); the
    router's top-k indices and softmax over the k values (8 + act)·T·k; the experts (``grouped_mm``, S =
    T·k): perm // k, perm, the sorted expert ids that index the biases and the inverse perm 4·8·S, the
    sentinel mask S, offsets 4·E, the gathered tokens and the down output 2·act·S·h, the clamped SwiGLU's
    gate/up output and five [S, f] tensors 7·act·S·f, the sorted routing weights act·S. Layer 0 also
    keeps cos and sin [1, s, d/2]; the final norm and the LM head's input 8Th + 4T + act·Th. b 2, s 64."""
    cfg = TINY_CONFIGS["gpt_oss"]
    b, s = 2, 64
    T, h, f, a, d = b * s, cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], 16
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    S = T * k
    norm = 8 * T * h + 4 * T + act * T * h
    attention = 4 * act * T * a * d + 8 * T * a + act * T * a * (s + 1)
    experts = 4 * 8 * S + S + 4 * E + 2 * act * S * h + 7 * act * S * f + act * S
    layer = 2 * norm + attention + (8 + act) * T * k + experts
    assert layer == layer_bytes
    regions = predict_regions(_arch("gpt_oss"), Shape(b, s), dtype, "eager")
    assert sum(t.bytes for t in regions["layer 1"]) == layer
    assert sum(t.bytes for t in regions["layer 0"]) == layer + 2 * act * s * d // 2
    assert sum(t.bytes for t in regions["final"]) == norm
    model = saved_measure.build(cfg, dtype, "eager")
    measured = saved_measure.measure(model, 2, b, s, cfg["vocab_size"])
    for region in ("layer 0", "layer 1", "final"):  # layer 0 slides (window 16 < s), layer 1 does not
        assert sum(m.bytes for m in measured if m.region == region) == sum(t.bytes for t in regions[region])
    assert not_exact_reason("gpt_oss", "eager") is None


def test_deepseek_v3_moe_layer_by_hand() -> None:
    """DeepSeek-V3 (``modeling_deepseek_v3.py``) under bf16 SDPA, its MoE layer 1 (b 2, s 64): the Llama
    norm 8Th + 4T on the attention and MLP inputs (with their outputs), on the q_a (r_q = 64) and kv_a
    (r_kv = 32) latents 6·T·r + 4T and the b-projections' inputs 2·T·r; q and k 2·T·a·d_qk each; v a view
    of kv_b_proj's output, kept whole, 2·T·a·(d_nope + d_v); the output and its contiguous copy; the
    log-sum-exp 4·T·a (kv_a_proj's output itself is kept by nothing: the norm copies its split to fp32);
    ``DeepseekV3TopkRouter``: the fp32 copies of its input 4Th and weight 4Eh, the sigmoid scores 4TE,
    the top-k indices 8Tk, the sum 4T and the weights 4Tk (the group top-k's tensors are freed with
    nodes the loss does not reach); the experts as Mixtral's (f = 96) and one shared expert 4·2·T·96."""
    cfg = TINY_CONFIGS["deepseek_v3"]
    b, s = 2, 64
    T, h, a, E, k, f = b * s, cfg["hidden_size"], 8, cfg["n_routed_experts"], 2, cfg["moe_intermediate_size"]
    rq, rkv, nope, rope, dv = 64, 32, 16, 8, 24
    S = T * k
    norm = 8 * T * h + 4 * T
    latents = sum(6 * T * r + 4 * T + 2 * T * r for r in (rq, rkv))
    attention = 2 * 2 * T * a * (nope + rope) + 2 * T * a * (nope + dv) + 2 * 2 * T * a * dv + 4 * T * a
    router = 4 * T * h + 4 * E * h + 4 * T * E + 8 * T * k + 4 * T + 4 * T * k
    experts = 3 * 8 * S + S + 4 * E + 2 * 2 * S * h + 4 * 2 * S * f + 4 * S
    layer = 2 * norm + latents + attention + router + experts + 4 * 2 * T * f
    assert layer == 1_151_760
    regions = predict_regions(_arch("deepseek_v3"), Shape(b, s), "bf16", "sdpa")
    assert sum(t.bytes for t in regions["layer 1"]) == layer
    model = saved_measure.build(cfg, "bf16", "sdpa")
    measured = saved_measure.measure(model, 3, b, s, cfg["vocab_size"])
    assert [sum(m.bytes for m in measured if m.region == f"layer {i}") for i in (1, 2)] == [layer, layer]
    assert not_exact_reason("deepseek_v3", "sdpa") is None


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gemma2_eager_attention_keeps_the_soft_capping_tanh(dtype: str) -> None:
    """``Gemma2`` ``eager_attention_forward``: ``tanh(scores / 50) · 50`` keeps tanh's output [b, a, s, s]
    in the compute dtype, one per layer, beside the fp32 softmax."""
    b, s, a, act = 2, 64, 8, {"bf16": 2, "fp32": 4}[dtype]
    model = saved_measure.build(TINY_CONFIGS["gemma2"], dtype, "eager")
    measured = saved_measure.measure(model, 2, b, s, 1024)
    tanh = [m.bytes for m in measured if m.region == "layer 1" and "Tanh" in m.saved_by]
    assert tanh == [act * b * a * s * s]
    terms = predict_regions(_arch("gemma2"), Shape(b, s), dtype, "eager")["layer 1"]
    assert [t.bytes for t in terms if "soft-capping" in t.name] == tanh
    assert not_exact_reason("gemma2", "eager") is None


def test_a_saved_tensor_freed_before_backward_is_not_kept() -> None:
    """DeepSeek-V3's group router saves the indices of two ``topk`` whose values it drops, and a mask, in
    nodes the loss does not reach: freed when the router returns, so not measured as kept, and the
    addresses they free are new storages when reused (every MoE layer then measures the same)."""
    cfg = TINY_CONFIGS["deepseek_v3"]
    model = saved_measure.build(cfg, "bf16", "sdpa")
    measured = saved_measure.measure(model, 3, 2, 64, cfg["vocab_size"])
    assert all(m.saved_by for m in measured)  # every storage kept is one a node of the loss's graph holds
    layers = [sorted(m.bytes for m in measured if m.region == f"layer {i}") for i in (1, 2)]
    assert layers[0] == layers[1]


def test_gemma_norm_keeps_one_plus_weight_in_fp32() -> None:
    """Gemma's ``output * (1.0 + self.weight.float())`` saves the fp32 sum over its width: four [h] per
    layer (the sandwich norms) and two [d] (the per-head q/k norms)."""
    model = saved_measure.build(TINY_CONFIGS["gemma3_text"], "bf16", "sdpa")
    measured = saved_measure.measure(model, 2, 2, 64, 1024)
    layer = [m for m in measured if m.region == "layer 1"]
    kept = sorted(m.bytes for m in layer if len(m.shape) == 1 and m.dtype == "fp32")
    h, d = TINY_CONFIGS["gemma3_text"]["hidden_size"], TINY_CONFIGS["gemma3_text"]["head_dim"]
    assert kept == sorted([4 * h] * 4 + [4 * d] * 2)
    terms = predict_regions(_arch("gemma3_text"), Shape(2, 64), "bf16", "sdpa")["layer 1"]
    assert sorted(t.bytes for t in terms if t.name.endswith("1 + weight (fp32)")) == kept


def test_match_names_what_each_side_lacks() -> None:
    terms = [Term(name="a", bytes=8), Term(name="b", bytes=16), Term(name="c", bytes=16)]
    storages = [MeasuredStorage(region="x", bytes=b, dtype="fp32", shape=(b // 4,)) for b in (16, 8, 32)]
    missing, extra = _match(terms, storages)
    assert [t.name for t in missing] == ["c"] and [s.bytes for s in extra] == [32]


@pytest.mark.slow
def test_cli_activations_table_and_exit_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["validate", "activations", "--family", "llama,gpt2", "--precision", "bf16-mixed"]
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "4 of 4 cases exact to the byte" in ok.stdout
    assert all(len(line) <= 80 for line in ok.stdout.splitlines())
    # a prediction one byte off must be reported and fail
    import zerocalc.validate.saved as saved

    real = saved.loss_saves
    monkeypatch.setattr(saved, "loss_saves", lambda *a: [*real(*a), ("one byte", 1)])
    off = runner.invoke(app, ["validate", "activations", "--family", "qwen2", "--attention", "sdpa"])
    assert off.exit_code == 1
    assert "qwen2 fp32 sdpa, loss: predicted" in off.stdout and "one byte (1 B)" in off.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--attention", "flash"], "--attention 'flash' is not accepted; accepted: sdpa"),
        (["--family", "bert"], "--family 'bert' is not accepted"),
        (
            ["--model", "llama-3-8b"],
            "accepted: a Hugging Face config.json (the modules are built from it), or --family",
        ),
        (["-b", "0"], "accepted: b ≥ 1, s ≥ 2"),
        (["-b", "1024", "-s", "1024"], "b·s ≤ 65,536"),
        (["-s", "many"], "--seq-len 'many' is not accepted; accepted: a whole number"),
        (["--device", "cpu"], "No such option: --device"),
        (["--precision", "fp16"], "--precision 'fp16' is not accepted"),
        (
            ["--family", "gpt_oss", "--attention", "sdpa"],
            "--attention 'sdpa' is not accepted for gpt_oss (its transformers code has no SDPA",
        ),
        (["--compile", "all"], "--compile 'all' is not accepted; accepted: none, model, loss, model,loss"),
        (["--recompute", "op"], "--recompute is read with --compile only"),
        (["--compile", "loss", "--model-impl", "hf"], "transformers' loss runs inside the model's forward"),
        (["--compile", "model", "--family", "gpt2"], "--family 'gpt2' is not accepted"),
        (["--compile", "model", "--attention", "eager"], "the compiled saves are modelled for SDPA"),
        (["--compile", "model", "--lora-rank", "8"], "--lora-rank with --compile is not measured"),
        (["--compile", "model", "--recompute", "selective"], "--recompute 'selective' is not accepted"),
        (["--fp8", "tensorwise"], "--fp8 is read with --compile only"),
        (["--compile", "model", "--fp8", "tensorwise"], "--fp8 tensorwise is measured on torchtitan's"),
        (["--compile", "model", "--model-impl", "torchtitan", "--fp8", "rowwise"], "--fp8 'rowwise' is not"),
    ],
)
def test_cli_activations_bad_input(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["validate", "activations", *args]), fragment)


@pytest.mark.slow
def test_cli_activations_compiled() -> None:
    """``--compile``: real Inductor on the CPU (zerocalc/validate/compiled.py), torchtitan's blocks under
    its op-level policy, the loss compiled: exact to the byte."""
    args = ["validate", "activations", "--compile", "model,loss", "--family", "llama", "--precision",
            "bf16-mixed", "--model-impl", "torchtitan", "--recompute", "op"]  # fmt: skip
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "1 of 1 cases exact to the byte" in ok.stdout
    assert "llama bf16 torchtitan model,loss" in ok.stdout


# ---------------------------------------------------------------------------------------- fine-tuning
FINETUNES = {
    "lora default": FineTuning(lora=LoraConfig(rank=8)),
    "lora all-linear dropout": FineTuning(lora=LoraConfig(rank=8, targets="all-linear", dropout=0.1)),
    "dora all-linear dropout": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", dropout=0.1, dora=True)
    ),
    "lora lm_head saved": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", modules_to_save=("lm_head",))
    ),
    "qlora nf4": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear"),
        quant=QuantConfig(method=QuantMethod.NF4, kbit_prepare=False),
    ),
    "qlora nf4 kbit dora": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", dora=True, dropout=0.1),
        quant=QuantConfig(method=QuantMethod.NF4, double_quant=True),
    ),
    "freeze": FineTuning(freeze=("embed_tokens", "layers.0")),
    # get_peft_model(..., autocast_adapter_dtype=False): bf16 adapters, no fp32 copy of each input
    "lora bf16 adapters dropout": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", dropout=0.1, autocast_adapter_dtype=False)
    ),
    # GPT-2's Conv1D weight in x's dtype: PEFT's transpose makes it a new Parameter, the norm keeps its sum
    "dora bf16 adapters dropout": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", dropout=0.1, dora=True, autocast_adapter_dtype=False)
    ),
    "qlora nf4 kbit dora bf16 adapters": FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", dora=True, dropout=0.1, autocast_adapter_dtype=False),
        quant=QuantConfig(method=QuantMethod.NF4, double_quant=True),
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("tuning", list(FINETUNES))
@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_fine_tuning_saved_bytes_per_region_equal_the_profile(family: str, tuning: str) -> None:
    """The real PEFT 0.21.2 model (bitsandbytes 0.50.2's 4-bit base, prepare_model_for_kbit_training) on the
    CPU, every region to the byte, b = 2 and b = 1."""
    pytest.importorskip("peft")
    finetune = FINETUNES[tuning]
    if finetune.quantized:
        pytest.importorskip("bitsandbytes")
    if family == "gpt2" and tuning == "freeze":
        finetune = FineTuning(freeze=("embed_positions", "layers.0"))  # the tied head keeps its input
    arch = _arch(family)
    model = saved_measure.build(TINY_CONFIGS[family], "bf16", "sdpa", finetune)
    tuned = forward_tuning(arch, finetune, weights=peft_alone(finetune, DType.BF16))
    for b, s in SHAPES:
        measured = saved_measure.measure(model, arch.num_layers, b, s, arch.vocab_size)
        case = compare(family, arch, Shape(b, s), "bf16", "sdpa", measured, tuned, tuning)
        wrong = {r.region: (r.predicted, r.measured, r.unmatched_terms, r.unmatched_storages)
                 for r in case.regions if not r.ok}  # fmt: skip
        assert wrong == {}, f"{family} {tuning} b={b} s={s}"


@pytest.mark.slow
def test_matmul_4bit_keeps_only_the_packed_weight() -> None:
    """bitsandbytes 0.50.2 ``MatMul4Bit`` keeps ``ctx.tensors = (None, B)``: the packed weight, a parameter;
    the wrapped forward sees it (so an activation kept there would be counted) and no activation."""
    pytest.importorskip("bitsandbytes")
    finetune = FINETUNES["qlora nf4"]
    model = saved_measure.build(TINY_CONFIGS["llama"], "bf16", "sdpa", finetune)
    seen: list[torch.Tensor] = []
    with saved_measure._matmul_4bit_saves(lambda t, by: seen.append(t)):
        model(input_ids=torch.zeros((1, 16), dtype=torch.long)).logits.sum().backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert seen and all(t.untyped_storage().data_ptr() in params for t in seen)


@pytest.mark.slow
def test_cli_activations_with_fine_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("peft")
    args = ["validate", "activations", "--family", "llama", "--precision", "bf16-mixed", "--lora-rank", "8",
            "--lora-dropout", "0.1", "--dora", "-b", "1", "-s", "32"]  # fmt: skip
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "Fine-tuning: lora r8 default dropout 0.1 dora (PEFT 0.21.2" in ok.stdout
    assert "1 of 1 cases exact to the byte" in ok.stdout
    assert all(len(line) <= 80 for line in ok.stdout.splitlines())
    import zerocalc.validate.saved as saved

    real = saved.tuned_final_saves
    monkeypatch.setattr(saved, "tuned_final_saves", lambda *a: ([*real(*a)[0], ("one byte", 1)], real(*a)[1]))
    off = runner.invoke(app, args)
    assert off.exit_code == 1
    assert "final: predicted" in off.stdout and "one byte (1 B)" in off.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--lora-rank", "8", "--attention", "eager"],
            "--attention 'eager' is not accepted with fine-tuning",
        ),
        (["--lora-rank", "8", "--family", "mixtral"], "--family 'mixtral' is not accepted"),
        (["--lora-rank", "8", "--quantize", "int8"], "--quantize 'int8' is not measured here"),
        (["--quantize", "nf4"], "accepted: with --lora-rank R (QLoRA), or --quantize none"),
        (["--lora-dropout", "0.1"], "--lora-dropout describes LoRA, which is off without a rank"),
        (["--lora-rank", "8", "--freeze", "layers.0"], "--freeze names modules frozen in a full fine-tune"),
        (["--lora-rank", "-1"], "--lora-rank"),
    ],
)
def test_cli_activations_fine_tuning_bad_input(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["validate", "activations", *args]), fragment)
