"""A fine-tuning run's model states are the real ones, to the byte: a tiny Llama (transformers 5.17
from_config, bf16) with PEFT 0.21's LoRA, plain or on a bitsandbytes 0.50 NF4 base after
prepare_model_for_kbit_training, one forward, backward and optimizer step on CPU (torch's AdamW,
bitsandbytes' AdamW8bit, PagedAdamW8bit and PagedAdamW): the trained parameters, the frozen ones, the
quantised storage, the gradients and the optimizer states hold what zerocalc's DDP row at N = 1 gives."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")

from zerocalc.request.training import parse_options  # noqa: E402
from zerocalc.states.memory import Location, StateKind, evaluate_memory  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]
transformers.logging.set_verbosity_error()

CONFIG = {
    # q's lora_A 8 × 512 = 4,096 elements (8-bit states), k's lora_B 128 × 8 = 1,024 (32-bit)
    "model_type": "llama", "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "pad_token_id": 0,
    "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False,
}  # fmt: skip
OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, foreach=False),
    "adam-8bit": lambda ps: bnb.optim.AdamW8bit(ps),
    "paged-adamw-8bit": lambda ps: bnb.optim.PagedAdamW8bit(ps),  # on CPU: not paged, the same bytes
    "paged-adamw": lambda ps: bnb.optim.PagedAdamW(ps),
}


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def _quant_state_bytes(weight: Any) -> int:
    state = weight.quant_state
    tensors = [weight.data, state.absmax, state.code]
    if state.nested:
        tensors += [state.state2.absmax, state.state2.code, state.offset]
    return sum(_nbytes(t) for t in tensors)


def _measure(model: Any, optimizer: str) -> dict[str, int]:
    """The bytes of each kind of state after one step."""
    trained = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(1, CONFIG["vocab_size"], (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt = OPTIMIZERS[optimizer](trained)
    opt.step()
    seen: dict[int, int] = {}
    for p in trained:
        for key, value in opt.state[p].items():
            if torch.is_tensor(value) and key != "step":  # torch's step counters: CPU scalars
                seen[value.data_ptr()] = _nbytes(value)  # bitsandbytes' qmaps are shared
    frozen = [p for p in model.parameters() if not p.requires_grad]
    quantised = [p for p in frozen if isinstance(p, bnb.nn.Params4bit)]
    return {
        "params": sum(_nbytes(p) for p in trained),
        "frozen": sum(_nbytes(p) for p in frozen if not isinstance(p, bnb.nn.Params4bit)),
        "quantized": sum(_quant_state_bytes(p) for p in quantised),
        "grads": sum(_nbytes(p.grad) for p in trained),
        "optimizer": sum(seen.values()),
    }


def _predicted(optimizer: str, **finetune: object) -> dict[str, int]:
    request = parse_options(model=dict(CONFIG), framework="ddp", optimizer=optimizer, **finetune)
    row = evaluate_memory(request).strategies[0]
    kinds = ("params", "frozen", "quantized", "grads", "optimizer")
    on_device = (Location.GPU, Location.UNIFIED)
    return {
        k: sum(s.bytes for s in row.states if s.kind is StateKind(k) and s.location in on_device)
        for k in kinds
    }


def _lora_model(lora: Any, folder: Path | None = None, autocast_adapter_dtype: bool = True) -> Any:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**CONFIG)
    if folder is None:
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    else:
        transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, quantization_config=quant, dtype=torch.bfloat16, device_map="cpu"
            )
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    # in training mode, as a training step runs: from_pretrained returns the model in eval mode, where
    # bitsandbytes 0.50.2 repacks a 4-bit weight for the CPU on a CPU with AVX512-BF16 when the input needs
    # no gradient (nn/modules.py Linear4bit.forward → _convert_weight_packed_for_cpu: bf16 absmax, not
    # nested), an inference path a training step does not take
    return peft.get_peft_model(model, lora, autocast_adapter_dtype=autocast_adapter_dtype).train()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_lora_states_are_the_real_ones(optimizer: str) -> None:
    lora = peft.LoraConfig(r=8, target_modules="all-linear", use_dora=True)
    measured = _measure(_lora_model(lora), optimizer)
    predicted = _predicted(optimizer, lora_rank=8, lora_targets="all-linear", dora=True)
    assert measured == predicted


@pytest.mark.parametrize("optimizer", ["adamw", "adam-8bit"])
def test_qlora_states_are_the_real_ones(optimizer: str, tmp_path: Path) -> None:
    lora = peft.LoraConfig(r=8, target_modules="all-linear", modules_to_save=["lm_head"])
    measured = _measure(_lora_model(lora, tmp_path), optimizer)
    predicted = _predicted(
        optimizer,
        lora_rank=8,
        lora_targets="all-linear",
        modules_to_save="lm_head",
        quantize="nf4",
        double_quant=True,
    )
    assert measured == predicted


@pytest.mark.parametrize("quantized", [False, True])
def test_adapters_left_in_the_base_dtype_are_bf16_states(quantized: bool, tmp_path: Path) -> None:
    """``get_peft_model(..., autocast_adapter_dtype=False)`` (PEFT before 0.12 always): the adapters take
    the bf16 base's dtype (a ``Linear4bit``'s compute dtype), so do their gradients and AdamW's states."""
    lora = peft.LoraConfig(r=8, target_modules="all-linear", use_dora=True)
    measured = _measure(
        _lora_model(lora, tmp_path if quantized else None, autocast_adapter_dtype=False), "adamw"
    )
    quant = {"quantize": "nf4", "double_quant": True} if quantized else {}
    predicted = _predicted(
        "adamw", lora_rank=8, lora_targets="all-linear", dora=True, autocast_adapter_dtype=False, **quant
    )
    assert measured == predicted
    upcast = _predicted("adamw", lora_rank=8, lora_targets="all-linear", dora=True, **quant)
    assert 2 * predicted["params"] == upcast["params"] and 2 * predicted["grads"] == upcast["grads"]


def test_dora_dropout_on_a_conv1d_in_its_own_dtype_holds_a_weight_gradient_per_forward() -> None:
    """The premise of zerocalc's refusal (zerocalc.request.finetune ``_dora_conv1d_problem``): PEFT 0.21.2
    DoRA with dropout on GPT-2's fp32 Conv1D ``c_attn``: ``transpose`` wraps the weight's ``.T`` in a new
    Parameter for ``F.linear``, and after backward it holds an [out, in] gradient until the loss is freed."""
    import gc
    import weakref

    from peft.tuners.lora import dora

    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, use_dora=True, lora_dropout=0.1)).train()
    made: list[weakref.ref] = []
    transpose = dora.transpose

    def recording(weight: Any, fan_in_fan_out: bool) -> Any:
        out = transpose(weight, fan_in_fan_out)
        if isinstance(out, torch.nn.Parameter) and out is not weight:
            made.append(weakref.ref(out))
        return out

    dora.transpose = recording
    try:
        ids = torch.randint(0, 100, (2, 16))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        gc.collect()
        held = [p for p in (r() for r in made) if p is not None]
        assert [tuple(p.grad.shape) for p in held] == [(3 * 64, 64)] * 2  # one c_attn per layer
        del held, loss
        gc.collect()
        assert all(r() is None for r in made)
    finally:
        dora.transpose = transpose
