"""zerocalc's quantised storage is bitsandbytes 0.50's, to the byte: tiny transformers 5.17 models saved to
a folder and loaded with ``BitsAndBytesConfig`` on CPU quantise exactly the modules zerocalc names, and each
quantised weight's tensors — the packed data and every tensor of its quant state (absmax, code, offset, the
nested absmax and code), or LLM.int8's weight and row scales — hold the bytes zerocalc gives each part, no
storage shared between weights. QLoRA's model (``prepare_model_for_kbit_training`` then ``get_peft_model``)
holds every parameter with the name, shape, dtype and requires_grad zerocalc predicts."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")

from finetune_reference import expected, measured  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from zerocalc.base.dtypes import DType  # noqa: E402
from zerocalc.model.architecture import Architecture  # noqa: E402
from zerocalc.model.hf_config import architecture_from_hf_dict  # noqa: E402
from zerocalc.model.quantized import Part, QuantMethod, quantized_modules, weight_storage  # noqa: E402
from zerocalc.parallel.finetune import FineTuning, LoraConfig, QuantConfig, quantized_storage  # noqa: E402
from zerocalc.validate.peft_model import lora_model  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]
transformers.logging.set_verbosity_error()

TOKENS = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
MODELS: dict[str, dict[str, Any]] = {
    # gate/up/down 320 × 64: 320 blocks, two nested absmax; k/v 32 × 64; an odd vocabulary
    "llama": {"model_type": "llama", "vocab_size": 101, "hidden_size": 64, "intermediate_size": 320,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, **TOKENS},
    # Conv1D projections, a tied LM head
    "gpt2": {"model_type": "gpt2", "vocab_size": 101, "n_embd": 32, "n_layer": 2, "n_head": 4,
             "n_positions": 16, **TOKENS},
    # a router (nn.Module) and experts (3-D parameters): neither quantised
    "mixtral": {"model_type": "mixtral", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 48,
                "num_hidden_layers": 2, "num_attention_heads": 8, "num_local_experts": 4,
                "num_experts_per_tok": 2, **TOKENS},
    # a shared expert gate of 32 weights (one block of 64, part full)
    "qwen2_moe": {"model_type": "qwen2_moe", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 48,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                  "shared_expert_intermediate_size": 24, **TOKENS},
    # tied embeddings, head_dim 256
    "gemma2": {"model_type": "gemma2", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 48,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, **TOKENS},
    # FalconLinear is a subclass of nn.Linear: left unquantised
    "falcon": {"model_type": "falcon", "vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 4, **TOKENS},
}  # fmt: skip

TORCH = {d: d.torch_name for d in (DType.UINT8, DType.INT8, DType.BF16, DType.FP32, DType.FP16)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny model, random weights in bf16, saved as a checkpoint."""
    folders = {}
    for name, config in MODELS.items():
        settings = dict(config)
        cfg = AutoConfig.for_model(settings.pop("model_type"), **settings)
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(name)
        AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(folder)
        folders[name] = folder
    return folders


def _bnb_config(quant: QuantConfig) -> BitsAndBytesConfig:
    skip = list(quant.skip_modules) if quant.skip_modules is not None else None
    if quant.method is QuantMethod.INT8:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant.method.value,
        bnb_4bit_use_double_quant=quant.double_quant,
        bnb_4bit_quant_storage=getattr(torch, TORCH[quant.storage]),
        bnb_4bit_compute_dtype=torch.bfloat16,
        llm_int8_skip_modules=skip,
    )


def _load(folder: Path, quant: QuantConfig) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=_bnb_config(quant), dtype=torch.bfloat16, device_map="cpu"
        )


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _storage(weight: Any) -> dict[Part, Any]:
    """The tensors bitsandbytes keeps for one quantised weight, by zerocalc's part names."""
    if isinstance(weight, bnb.nn.Int8Params):
        assert weight.CB is None or weight.CB.data_ptr() == weight.data_ptr()  # CB is the weight's storage
        return {Part.INT8_WEIGHT: weight.data, Part.ROW_SCALE: weight.SCB}
    state = weight.quant_state
    parts = {Part.PACKED: weight.data, Part.ABSMAX: state.absmax, Part.CODE: state.code}
    if state.nested:
        parts |= {Part.NESTED_ABSMAX: state.state2.absmax, Part.NESTED_CODE: state.state2.code}
        parts[Part.OFFSET] = state.offset
    return parts


def _quantized(model: Any) -> dict[str, dict[Part, Any]]:
    return {
        name: _storage(module.weight)
        for name, module in model.named_modules()
        if isinstance(
            module.weight if hasattr(module, "weight") else None, (bnb.nn.Params4bit, bnb.nn.Int8Params)
        )
    }


def _arch(name: str) -> Architecture:
    return architecture_from_hf_dict(MODELS[name], "config.json", name)


FOUR_BIT = [
    QuantConfig(method=method, double_quant=double, storage=storage)
    for method in (QuantMethod.NF4, QuantMethod.FP4)
    for double in (False, True)
    for storage in (DType.UINT8, DType.BF16)
]
CASES = [
    pytest.param("llama", q, id=f"llama-{q.method}-dq{int(q.double_quant)}-{q.storage}") for q in FOUR_BIT
]
CASES += [
    pytest.param("llama", QuantConfig(method=QuantMethod.INT8), id="llama-int8"),
    pytest.param("llama", QuantConfig(method=QuantMethod.NF4, skip_modules=("q_proj",)), id="llama-skip-q"),
    pytest.param(
        "llama", QuantConfig(method=QuantMethod.INT8, skip_modules=("mlp.down_proj",)), id="llama-int8-skip"
    ),
    pytest.param("llama", QuantConfig(method=QuantMethod.NF4, storage=DType.FP32), id="llama-nf4-fp32"),
    pytest.param("llama", QuantConfig(method=QuantMethod.FP4, storage=DType.INT8), id="llama-fp4-int8"),
    pytest.param("llama", QuantConfig(method=QuantMethod.NF4, storage=DType.FP16), id="llama-nf4-fp16"),
]
for family in ("gpt2", "mixtral", "qwen2_moe", "gemma2", "falcon"):
    CASES += [
        pytest.param(family, QuantConfig(method=QuantMethod.NF4, double_quant=True), id=f"{family}-nf4-dq"),
        pytest.param(family, QuantConfig(method=QuantMethod.INT8), id=f"{family}-int8"),
    ]


@pytest.mark.parametrize(("name", "quant"), CASES)
def test_every_quantised_weight_stores_the_bytes_zerocalc_gives_each_part(
    saved: dict[str, Path], name: str, quant: QuantConfig
) -> None:
    model = _load(saved[name], quant)
    arch = _arch(name)
    theirs = _quantized(model)
    ours = {m.hf_name: m for m in quantized_modules(arch, quant.skip_modules)}
    assert set(theirs) == set(ours)
    for hf_name, module in ours.items():
        parts = weight_storage(module, quant.method, quant.double_quant, quant.storage)
        assert {p.part: p.bytes for p in parts} == {p: _nbytes(t) for p, t in theirs[hf_name].items()}, (
            hf_name
        )
        assert {p.part: p.dtype.torch_name for p in parts} == {
            p: str(t.dtype).removeprefix("torch.") for p, t in theirs[hf_name].items()
        }
    tensors = [t for parts in theirs.values() for t in parts.values()]
    assert len({t.data_ptr() for t in tensors}) == len(tensors)  # no table shared between weights
    totals = quantized_storage(arch, quant)
    assert totals.total == sum(_nbytes(t) for t in tensors)
    assert totals.modules == len(theirs)


def test_falcon_and_a_tied_gpt2_keep_what_transformers_keeps() -> None:
    """FalconLinear is a subclass, not torch.nn.Linear: nothing of Falcon is quantised by default; GPT-2's
    four Conv1D per block are, its tied LM head is not."""
    assert quantized_modules(_arch("falcon")) == ()
    gpt2 = quantized_modules(_arch("gpt2"))
    assert [m.hf_name for m in gpt2[:4]] == [
        f"transformer.h.0.{n}" for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]
    assert len(gpt2) == 8


NF4_DQ = QuantConfig(method=QuantMethod.NF4, double_quant=True)
QLORA = [
    pytest.param("llama", NF4_DQ.model_copy(update={"storage": DType.BF16}), {"targets": "all-linear"},
                 id="llama-nf4-bf16-all-linear"),
    pytest.param("llama", NF4_DQ, {"targets": "all-linear", "dora": True, "modules_to_save": ("lm_head",)},
                 id="llama-dora-saved"),
    pytest.param("llama", QuantConfig(method=QuantMethod.FP4, kbit_prepare=False), {},
                 id="llama-fp4-unprepared"),
    pytest.param("llama", QuantConfig(method=QuantMethod.INT8), {"targets": ("q_proj", "v_proj")},
                 id="llama-int8"),
    pytest.param("gpt2", NF4_DQ, {"modules_to_save": ("wte",)}, id="gpt2-nf4"),
    pytest.param("mixtral", NF4_DQ, {"targets": "all-linear"}, id="mixtral-nf4-experts"),
    pytest.param("qwen2_moe", QuantConfig(method=QuantMethod.NF4), {"targets": "all-linear"}, id="qwen2-moe"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "quant", "lora"), QLORA)
def test_qlora_holds_every_parameter_zerocalc_predicts(
    saved: dict[str, Path], name: str, quant: QuantConfig, lora: dict[str, Any]
) -> None:
    model = _load(saved[name], quant)
    if quant.kbit_prepare:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    config = LoraConfig(rank=4, **lora)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lora_model(model, config)  # the builder validate uses
    assert measured(model) == expected(_arch(name), FineTuning(lora=config, quant=quant))


def test_a_quantised_module_cannot_be_saved_for_training() -> None:
    from zerocalc.base.errors import InputError

    finetune = FineTuning(
        lora=LoraConfig(rank=4, targets=("q_proj",), modules_to_save=("down_proj",)),
        quant=QuantConfig(method=QuantMethod.NF4),
    )
    with pytest.raises(InputError, match="quantised"):
        expected(_arch("llama"), finetune)


@pytest.mark.parametrize("dtype", [DType.BF16, DType.FP32])
def test_torchaos_nf4_tensor_stores_the_bytes_zerocalc_gives_each_part(dtype: DType) -> None:
    pytest.importorskip("torchao")
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    from zerocalc.model.quantized import torchao_nf4_storage

    weight = torch.randn(128, 256, dtype=getattr(torch, dtype.torch_name))  # 32,768 weights: 2 factors
    nf4 = to_nf4(weight)
    theirs = {
        Part.PACKED: nf4.quantized_data,
        Part.ABSMAX: nf4.quantized_scalers,
        Part.NESTED_ABSMAX: nf4.quantization_factor,
        Part.OFFSET: nf4.scaler_mean,
        Part.CODE: nf4.nf4,
    }
    parts = torchao_nf4_storage(weight.numel(), dtype)
    assert {p.part: p.bytes for p in parts} == {p: _nbytes(t) for p, t in theirs.items()}
    assert {p.part: p.dtype.torch_name for p in parts} == {
        p: str(t.dtype).removeprefix("torch.") for p, t in theirs.items()
    }
    per_weight = sum(p.bytes for p in parts[:3]) / weight.numel()
    assert per_weight == (0.5 + 1 / 64 + 2 / 16384 if dtype is DType.BF16 else 0.5 + 1 / 64 + 4 / 16384)
