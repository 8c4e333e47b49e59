"""What a fine-tuning forward saves for backward (zerocalc/model/code/finetune.py), against hand counts of
Llama-3-8B's layers and against the full-training profile where everything is trained. The measurement
against the real PEFT and bitsandbytes is tests/validate/test_validate_activations.py's."""

from __future__ import annotations

import pytest

from zerocalc.model.code import HF, MEGATRON, Device, ForwardTuning, Shape, layer_saves
from zerocalc.model.code.finetune import tuned_embedding_saves, tuned_final_saves, tuned_shared_saves
from zerocalc.model.hf_config import architecture_from_hf_dict
from zerocalc.model.hf_modules import hf_modules
from zerocalc.model.quantized import QuantMethod
from zerocalc.parallel.finetune import FineTuning, LoraConfig, QuantConfig, forward_tuning
from zerocalc.validate.saved import TINY_CONFIGS

LLAMA3_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "tie_word_embeddings": False}  # fmt: skip
T = 2048  # b = 1, s = 2048
h, f, q_width, kv_width, heads, r = 4096, 14336, 4096, 1024, 32, 8


def _llama():
    return architecture_from_hf_dict(LLAMA3_8B, "llama-3-8b", "llama-3-8b")


def _total(saves) -> int:
    return sum(b for _, b in saves.saved)


def test_lora_on_q_and_v_of_a_bf16_llama_layer_by_hand() -> None:
    """PEFT's default targets (q_proj, v_proj), r 8, fp32 adapters on a bf16 base, CUDA, SDPA. A layer after
    the first (its input requires grad through layer 0's adapters): per token, each norm's x.float() (4h)
    and rsqrt (4) — its frozen weight keeps no normalised tensor —, each adapter's own fp32 copy of its input
    (4h) and lora_A's output (4r), q, the cached k and v, the attention output (2 B each) and the fp32
    log-sum-exp per head, and SwiGLU's gate, up and activation outputs (2f each); no frozen Linear keeps its
    input (no down-projection input). Layer 0 (its input requires no grad): no attention-norm tensors."""
    arch = _llama()
    tuning = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8)))
    norms = 2 * (4 * h + 4)
    adapters = 2 * (4 * h + 4 * r)
    attention = 2 * q_width + 2 * kv_width + 2 * kv_width + 2 * q_width + 4 * heads
    mlp = 3 * 2 * f
    per_token = norms + adapters + attention + mlp
    assert per_token == 172_232
    later = layer_saves(HF, arch, 5, Shape(1, 2048), 2, Device.CUDA, tuning=tuning)
    assert _total(later) == 172_232 * T == 352_731_136
    assert not later.keeps_input
    first = layer_saves(HF, arch, 0, Shape(1, 2048), 2, Device.CUDA, tuning=tuning)
    assert _total(first) == (per_token - (4 * h + 4)) * T
    # the rotary cos and sin [1, s, d] from layer 0 on (q requires grad there)
    assert tuned_shared_saves(arch, Shape(1, 2048), 2, Device.CUDA, tuning) == (
        0,
        [("rotary cos", 2 * 2048 * 128), ("rotary sin", 2 * 2048 * 128)],
    )


def test_lora_dropout_keeps_a_mask_per_adapter_bool_on_cuda_fp32_on_the_cpu() -> None:
    arch = _llama()
    base = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8)))
    drop = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8, dropout=0.1)))
    shape = Shape(1, 2048)
    for device, mask in ((Device.CUDA, 1), (Device.CPU, 4)):
        plain = _total(layer_saves(HF, arch, 5, shape, 2, device, tuning=base))
        # the dropout output replaces the fp32 copy as lora_A's input: only the masks are added
        assert _total(layer_saves(HF, arch, 5, shape, 2, device, tuning=drop)) == plain + 2 * mask * h * T
        # layer 0's adapters read an input that requires no grad: dropout records no node, keeps no mask
        zero = _total(layer_saves(HF, arch, 0, shape, 2, device, tuning=base))
        assert _total(layer_saves(HF, arch, 0, shape, 2, device, tuning=drop)) == zero


def test_qlora_kbit_prepared_all_linear_layer_by_hand() -> None:
    """NF4 base, prepare_model_for_kbit_training (every other parameter fp32: the whole stream fp32), LoRA
    on all-linear: the adapters read fp32 x itself (q, k, v share the norm's output; o reads the attention
    output SDPA keeps; gate and up share theirs; down reads the SwiGLU product); MatMul4Bit keeps no input.
    Per token: rsqrt ×2 (8), the shared q/k/v input 4h, seven lora_A outputs 7·4r, q, k, v, output and
    log-sum-exp in fp32, the mid residual (the MLP norm's x.float() is it) 4h, the shared gate/up input 4h,
    gate, up and activation outputs 3·4f, down's input 4f; the layer's input is the attention norm's
    x.float() itself (kept)."""
    arch = _llama()
    quant = QuantConfig(method=QuantMethod.NF4, double_quant=True)
    tuning = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8, targets="all-linear"), quant=quant))
    assert tuning.fp32_stream and len(tuning.quantized) == 7 * 32
    attention = 4 * q_width + 4 * kv_width + 4 * kv_width + 4 * q_width + 4 * heads
    per_token = 8 + 4 * h + 7 * 4 * r + attention + 4 * h + 4 * h + 3 * 4 * f + 4 * f
    assert per_token == 319_848
    saves = layer_saves(HF, arch, 3, Shape(1, 2048), 2, Device.CUDA, tuning=tuning)
    assert _total(saves) == per_token * T
    assert saves.keeps_input
    # the final norm keeps the fp32 last hidden state itself and rsqrt; the frozen head no input
    final, keeps_last = tuned_final_saves(arch, Shape(1, 2048), 2, Device.CUDA, tuning)
    assert final == [("final norm: rsqrt (fp32)", 4 * T)] and keeps_last


def test_dora_adds_its_norms_and_results() -> None:
    """DoRA on q_proj and v_proj (no dropout), a later layer: per adapter the fp32 weight norm, the base
    result (bf16), ``mag_norm_scale - 1`` and ``mag_norm_scale`` ([1, out] fp32 each) and the fp32 lora
    result."""
    arch = _llama()
    lora = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8)))
    dora = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8, dora=True)))
    shape = Shape(1, 2048)
    extra = sum(4 * out + 2 * T * out + 4 * out + 4 * T * out + 4 * out for out in (q_width, kv_width))
    plain = _total(layer_saves(HF, arch, 5, shape, 2, Device.CUDA, tuning=lora))
    assert _total(layer_saves(HF, arch, 5, shape, 2, Device.CUDA, tuning=dora)) == plain + extra


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gpt2"])
@pytest.mark.parametrize("act", [2, 4])
@pytest.mark.parametrize("device", list(Device))
def test_everything_trained_is_the_full_training_profile(family: str, act: int, device: Device) -> None:
    """With every module trained the fine-tuning walk keeps what the full-training profile (measured
    separately) keeps, layer by layer, final norm and head included."""
    arch = architecture_from_hf_dict(TINY_CONFIGS[family], family, family)
    tuning = ForwardTuning(trained=frozenset(m.module for m in hf_modules(arch)))
    for i in range(arch.num_layers):
        full = layer_saves(HF, arch, i, Shape(2, 64), act, device)
        tuned = layer_saves(HF, arch, i, Shape(2, 64), act, device, tuning=tuning)
        assert (_total(tuned), tuned.keeps_input) == (_total(full), full.keeps_input)
    final, keeps_last = tuned_final_saves(arch, Shape(2, 64), act, device, tuning)
    kept = act * 2 * 64 * arch.hidden_size if keeps_last and family != "gpt2" else 0
    assert sum(b for _, b in final) + kept == sum(
        b for _, b in HF.final_saves(arch, Shape(2, 64), act, device)
    )


def test_an_untuned_case_is_refused() -> None:
    arch = _llama()
    tuning = forward_tuning(arch, FineTuning(lora=LoraConfig(rank=8)))
    with pytest.raises(ValueError, match="SDPA"):
        layer_saves(HF, arch, 0, Shape(1, 64), 2, flash=False, tuning=tuning)
    with pytest.raises(ValueError, match="transformers' code"):
        layer_saves(MEGATRON, arch, 0, Shape(1, 64), 2, tuning=tuning)
    with pytest.raises(ValueError, match="one rank"):
        layer_saves(HF, arch, 0, Shape(1, 64, cp=2), 2, tuning=tuning)
    mixtral = architecture_from_hf_dict(TINY_CONFIGS["mixtral"], "mixtral", "mixtral")
    with pytest.raises(ValueError, match="written out for"):
        layer_saves(HF, mixtral, 0, Shape(1, 64), 2, tuning=ForwardTuning())


def test_lora_on_an_embedding_is_refused_in_one_line() -> None:
    from zerocalc.base.errors import InputError

    with pytest.raises(InputError, match=r"lora\.Embedding\), whose saved tensors are not modelled"):
        forward_tuning(_llama(), FineTuning(lora=LoraConfig(rank=8, targets=("embed_tokens", "q_proj"))))


def test_a_trained_embedding_keeps_its_indices_and_the_stream_requires_grad() -> None:
    """A full fine-tune with layer 0 frozen: the embedding (trained) keeps its int64 indices, and layer 0,
    whose input requires grad through it, keeps its norms' and SwiGLU's tensors but no Linear input."""
    arch = _llama()
    tuning = forward_tuning(arch, FineTuning(freeze=("layers.0",)))
    assert tuned_embedding_saves(arch, Shape(1, 2048), tuning) == [("input ids (embedding indices)", 8 * T)]
    saves = layer_saves(HF, arch, 0, Shape(1, 2048), 2, Device.CUDA, tuning=tuning)
    attention = 2 * q_width + 2 * kv_width + 2 * kv_width + 2 * q_width + 4 * heads
    assert _total(saves) == (2 * (4 * h + 4) + attention + 3 * 2 * f) * T
