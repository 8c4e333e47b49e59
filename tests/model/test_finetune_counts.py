"""Fine-tuning's tensors by hand: LoRA's trainable parameters, the quantised base's bytes part by part, the
kinds and their dtypes in the precision record, and a property: trainable + frozen is the model plus what
PEFT adds, for any rank and targets. (The same functions against the real PEFT and bitsandbytes:
tests/model/test_finetune_peft.py, tests/model/test_finetune_bnb.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.model.adapters import adapter_tensors
from zerocalc.model.architecture import count_parameters
from zerocalc.model.hf_classes import LINEAR_CLASSES
from zerocalc.model.hf_modules import hf_modules
from zerocalc.model.quantized import Part, QuantMethod
from zerocalc.parallel.finetune import (
    FineTuning,
    LoraConfig,
    QuantConfig,
    finetune_counts,
    parameter_kinds,
    quantized_storage,
)
from zerocalc.parallel.precision import (
    ParamKind,
    ParamLayout,
    PrecisionName,
    QuantDtypes,
    tensor_dtypes,
)
from zerocalc.request.presets import load_model

LLAMA_3_8B = load_model("llama-3-8b")[0]
D, KV, F, L = 4096, 1024, 14336, 32  # hidden, k/v width (8 heads × 128), MLP width, layers
LINEARS = 2 * D * D + 2 * D * KV + 3 * D * F  # q, o; k, v; gate, up, down: one block's Linear weights


def test_llama_3_8b_all_linear_rank_8_trains_20_971_520_parameters() -> None:
    # r·(in + out) per Linear: q and o 8·(4096 + 4096), k and v 8·(4096 + 1024),
    # gate, up and down 8·(4096 + 14336)
    per_block = 8 * (2 * (D + D) + 2 * (D + KV) + 3 * (D + F))
    assert per_block * L == 20_971_520
    counts = finetune_counts(LLAMA_3_8B, FineTuning(lora=LoraConfig(rank=8, targets="all-linear")))
    assert (counts.trainable, counts.adapters, counts.saved_copies) == (20_971_520, 20_971_520, 0)
    assert counts.frozen == 8_030_261_248  # the whole base, as published


def test_llama_default_targets_are_q_and_v() -> None:
    """PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"]: q_proj, v_proj."""
    counts = finetune_counts(LLAMA_3_8B, FineTuning(lora=LoraConfig(rank=8)))
    assert counts.trainable == L * 8 * ((D + D) + (D + KV)) == 3_407_872


def test_dora_adds_one_magnitude_per_output_feature() -> None:
    plain = finetune_counts(LLAMA_3_8B, FineTuning(lora=LoraConfig(rank=8, targets="all-linear")))
    dora = finetune_counts(LLAMA_3_8B, FineTuning(lora=LoraConfig(rank=8, targets="all-linear", dora=True)))
    assert dora.trainable - plain.trainable == L * (D + KV + KV + D + F + F + D)


def test_nf4_with_double_quantisation_of_llama_3_8b_stores_3_600_416_768_bytes_and_its_tables() -> None:
    """Of W decoder Linear weights (224 of them, blocks of 64, 256 blocks per nested absmax): W/2 packed,
    W/64 uint8 absmax, 4·W/64/256 fp32 nested absmax = 3,600,416,768 B; then per weight its 16-entry fp32
    code (64 B), its copy of the 256-entry fp32 dynamic map (1,024 B) and its fp32 offset (4 B)."""
    weights = L * LINEARS
    assert weights == 6_979_321_856
    assert weights // 2 + weights // 64 + 4 * weights // 64 // 256 == 3_600_416_768
    quant = QuantConfig(method=QuantMethod.NF4, double_quant=True)
    storage = quantized_storage(LLAMA_3_8B, quant)
    assert (storage.weights, storage.modules) == (weights, 7 * L)
    data = storage.parts[Part.PACKED] + storage.parts[Part.ABSMAX] + storage.parts[Part.NESTED_ABSMAX]
    assert data == 3_600_416_768
    assert storage.parts[Part.CODE] + storage.parts[Part.NESTED_CODE] == 224 * (16 + 256) * 4 == 243_712
    assert storage.parts[Part.OFFSET] == 224 * 4 == 896
    assert storage.total == 3_600_416_768 + 243_712 + 896


def test_nf4_without_double_quantisation_and_llm_int8() -> None:
    weights = L * LINEARS
    nf4 = quantized_storage(LLAMA_3_8B, QuantConfig(method=QuantMethod.NF4))
    assert nf4.parts == {Part.PACKED: weights // 2, Part.ABSMAX: 4 * weights // 64, Part.CODE: 224 * 64}
    int8 = quantized_storage(LLAMA_3_8B, QuantConfig(method=QuantMethod.INT8))
    rows = L * (D + KV + KV + D + F + F + D)  # one fp32 scale per output row
    assert int8.parts == {Part.INT8_WEIGHT: weights, Part.ROW_SCALE: 4 * rows}


def test_bf16_quant_storage_holds_the_same_bytes_in_half_the_elements() -> None:
    uint8 = quantized_storage(LLAMA_3_8B, QuantConfig(method=QuantMethod.NF4, double_quant=True))
    bf16 = quantized_storage(
        LLAMA_3_8B, QuantConfig(method=QuantMethod.NF4, double_quant=True, storage=DType.BF16)
    )
    assert uint8.parts == bf16.parts


def test_the_lm_head_embeddings_and_norms_stay_unquantised() -> None:
    finetune = FineTuning(lora=LoraConfig(rank=8), quant=QuantConfig(method=QuantMethod.NF4))
    kinds = {(k.tensor.module.split(".")[-1], k.kind) for k in parameter_kinds(LLAMA_3_8B, finetune)}
    assert ("lm_head", ParamKind.FROZEN_BASE) in kinds and ("embed_tokens", ParamKind.FROZEN_BASE) in kinds
    assert {m for m, k in kinds if k is ParamKind.QUANTIZED} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }  # fmt: skip


# ------------------------------------------------------------------------------------ the precision record
BF16, FP32, UINT8, INT8 = DType.BF16, DType.FP32, DType.UINT8, DType.INT8


def test_a_frozen_base_is_kept_in_the_compute_dtype_with_no_trained_tensor() -> None:
    for layout in ParamLayout:
        dtypes = tensor_dtypes(PrecisionName.BF16_MIXED, layout, kind=ParamKind.FROZEN_BASE)
        assert dtypes.stored is BF16
        assert dtypes.gradient is dtypes.reduce is dtypes.master is dtypes.optimizer_state is None
    # a full fine-tune's frozen module keeps the layout's storage: FSDP's fp32 parameters
    frozen = tensor_dtypes(PrecisionName.BF16_MIXED, ParamLayout.CAST_FOR_COMPUTE, kind=ParamKind.FROZEN)
    assert (frozen.stored, frozen.compute) == (FP32, BF16)


def test_a_quantised_weight_is_gathered_as_stored_and_computed_dequantised() -> None:
    nf4 = QuantDtypes(storage=UINT8)
    dtypes = tensor_dtypes(
        PrecisionName.BF16_MIXED, ParamLayout.CAST_FOR_COMPUTE, kind=ParamKind.QUANTIZED, quant=nf4
    )
    assert (dtypes.stored, dtypes.all_gather, dtypes.compute, dtypes.gemm_input) == (UINT8, UINT8, BF16, BF16)
    assert dtypes.gradient is dtypes.master is dtypes.optimizer_state is None
    fsdp = QuantConfig(method=QuantMethod.NF4, storage=BF16, compute_dtype=FP32).dtypes
    dtypes = tensor_dtypes(
        PrecisionName.BF16_MIXED, ParamLayout.AUTOCAST, kind=ParamKind.QUANTIZED, quant=fsdp
    )
    assert (dtypes.stored, dtypes.all_gather, dtypes.compute) == (BF16, BF16, FP32)
    int8 = QuantConfig(method=QuantMethod.INT8).dtypes
    assert tensor_dtypes(
        PrecisionName.FP16_MIXED, ParamLayout.AUTOCAST, kind=ParamKind.QUANTIZED, quant=int8
    )[:2] == (
        INT8,
        DType.FP16,
    )
    with pytest.raises(ValueError):
        tensor_dtypes(PrecisionName.BF16_MIXED, ParamLayout.AUTOCAST, kind=ParamKind.QUANTIZED)


def test_adapters_train_like_any_parameter_under_mixed_precision_and_in_fp32_under_bf16_pure() -> None:
    for layout in ParamLayout:
        mixed = tensor_dtypes(PrecisionName.BF16_MIXED, layout, kind=ParamKind.ADAPTER)
        assert mixed == tensor_dtypes(PrecisionName.BF16_MIXED, layout)
        pure = tensor_dtypes(PrecisionName.BF16_PURE, layout, kind=ParamKind.ADAPTER)
        assert set(pure._replace(master=FP32)) == {FP32} and pure.master is None
        assert tensor_dtypes(PrecisionName.BF16_PURE, layout).stored is BF16


def test_prepare_model_for_kbit_training_casts_every_16_bit_parameter_but_the_4_bit_weights() -> None:
    def stored(kind: ParamKind, prepared: bool) -> DType:
        quant = QuantDtypes(storage=BF16) if kind is ParamKind.QUANTIZED else None
        layout = ParamLayout.AUTOCAST
        return tensor_dtypes(
            PrecisionName.BF16_PURE, layout, kind=kind, quant=quant, kbit_prepared=prepared
        ).stored

    assert [stored(k, False) for k in ParamKind] == [BF16, BF16, BF16, BF16, FP32, BF16]
    assert [stored(k, True) for k in ParamKind] == [FP32, FP32, FP32, BF16, FP32, FP32]


def test_a_modules_to_save_copy_is_trained_in_the_dtype_the_base_was_loaded_in() -> None:
    # peft 0.21.2 ModulesToSaveWrapper deep-copies the base's module (bf16 under bf16-mixed: the base loaded
    # in the recipe's parameter dtype), and torch's Adam creates its states zeros_like the parameter it
    # steps: bf16 gradient and states under FSDP's cast for compute and DDP's autocast (measured by
    # validate frameworks --modules-to-save); an fp32 master and fp32 states where the layout keeps one
    def dtypes(layout: ParamLayout, prepared: bool = False):
        return tensor_dtypes(
            PrecisionName.BF16_MIXED, layout, kind=ParamKind.SAVED_COPY, kbit_prepared=prepared
        )

    for layout in (ParamLayout.CAST_FOR_COMPUTE, ParamLayout.AUTOCAST):
        copy = dtypes(layout)
        assert (copy.stored, copy.main_gradient, copy.master, copy.optimizer_state) == (
            BF16,
            BF16,
            None,
            BF16,
        )
        trained = tensor_dtypes(PrecisionName.BF16_MIXED, layout, kind=ParamKind.TRAINABLE)
        assert (trained.stored, trained.optimizer_state) == (FP32, FP32)  # a parameter trained in full
        prepared = dtypes(layout, prepared=True)  # prepare_model_for_kbit_training casts it first
        assert (prepared.stored, prepared.optimizer_state) == (FP32, FP32)
    master = dtypes(ParamLayout.MASTER_COPY)
    assert (master.stored, master.master, master.optimizer_state) == (BF16, FP32, FP32)


# ---------------------------------------------------------------------------------------- the typed method
def test_a_quantised_base_needs_adapters_and_freeze_is_for_full_fine_tuning() -> None:
    with pytest.raises(ValidationError, match="purely quantised"):
        FineTuning(quant=QuantConfig(method=QuantMethod.NF4))
    with pytest.raises(ValidationError, match="freezes every parameter"):
        FineTuning(quant=QuantConfig(method=QuantMethod.NONE))
    assert FineTuning(quant=QuantConfig(method=QuantMethod.NONE, kbit_prepare=False)).quant is not None
    with pytest.raises(ValidationError, match="full fine-tune"):
        FineTuning(lora=LoraConfig(rank=8), freeze=("embed_tokens",))
    with pytest.raises(ValidationError):
        LoraConfig(rank=8, targets="q_proj")  # one name is a tuple; a string is all-linear
    with pytest.raises(ValidationError):
        QuantConfig(method=QuantMethod.INT8, double_quant=True)
    with pytest.raises(ValidationError, match="bnb_4bit_quant_storage"):
        QuantConfig(method=QuantMethod.NF4, storage=DType.FP8)
    assert FineTuning(lora=LoraConfig(rank=8)).base_frozen
    assert not FineTuning(freeze=("embed_tokens",)).base_frozen
    assert hash(FineTuning(lora=LoraConfig(rank=8, targets=("q_proj",)))) == hash(
        FineTuning(lora=LoraConfig(rank=8, targets=("q_proj",)))
    )


def test_freezing_modules_of_a_full_fine_tune() -> None:
    total = count_parameters(LLAMA_3_8B).total
    embeddings = finetune_counts(LLAMA_3_8B, FineTuning(freeze=("embed_tokens",)))
    assert (embeddings.frozen, embeddings.trainable) == (128256 * D, total - 128256 * D)
    attention = finetune_counts(LLAMA_3_8B, FineTuning(freeze=("self_attn",)))
    assert attention.frozen == L * (2 * D * D + 2 * D * KV)
    assert finetune_counts(LLAMA_3_8B, None).trainable == total


def test_peft_refusals_are_input_errors_naming_the_targets() -> None:
    phi3 = load_model("phi-3-mini-4k")[0]
    with pytest.raises(InputError, match="no default LoRA targets") as refused:
        finetune_counts(phi3, FineTuning(lora=LoraConfig(rank=8)))
    assert "{lora_targets}" in refused.value.template
    mixtral = load_model("mixtral-8x7b")[0]
    with pytest.raises(InputError, match="MoE conversion"):
        finetune_counts(mixtral, FineTuning(lora=LoraConfig(rank=8)))
    with pytest.raises(InputError, match="no dropout"):
        finetune_counts(mixtral, FineTuning(lora=LoraConfig(rank=8, targets="all-linear", dropout=0.05)))
    with pytest.raises(InputError, match="match no module"):
        finetune_counts(LLAMA_3_8B, FineTuning(lora=LoraConfig(rank=8, targets=("c_attn",))))


def test_mixtral_all_linear_reaches_the_router_and_the_experts_as_parameters() -> None:
    """PEFT 0.21's v4 → v5 conversion: the router's weight at rank r, w1 and w3 fused in gate_up_proj at
    2r over every expert, w2's down_proj at r; the attention as Linears."""
    mixtral = load_model("mixtral-8x7b")[0]
    e, d, f, r = 8, 4096, 14336, 8
    attention = r * ((d + d) + 2 * (d + 1024) + (d + d))
    router = r * (d + e)
    experts = (2 * r * e) * (d + 2 * f) + (r * e) * (f + d)
    counts = finetune_counts(mixtral, FineTuning(lora=LoraConfig(rank=r, targets="all-linear")))
    assert counts.trainable == 32 * (attention + router + experts)


# ------------------------------------------------------------------------------------------------ property
PRESETS = ["llama-3-8b", "qwen2.5-7b", "gemma-2-2b", "gpt2", "qwen3-8b", "pythia-1.4b", "qwen1.5-moe-a2.7b"]


@settings(max_examples=60, deadline=None)
@given(
    preset=st.sampled_from(PRESETS),
    rank=st.integers(1, 256),
    pick=st.lists(st.integers(0, 63), min_size=1, max_size=5),
    dora=st.booleans(),
)
def test_trainable_and_frozen_are_the_model_and_its_adapters(
    preset: str, rank: int, pick: list[int], dora: bool
) -> None:
    arch = load_model(preset)[0]
    leaves = sorted({m.hf_name.rsplit(".", 1)[-1] for m in hf_modules(arch) if m.cls in LINEAR_CLASSES})
    leaves = [leaf for leaf in leaves if leaf != "lm_head"]
    targets = tuple(sorted({leaves[i % len(leaves)] for i in pick}))
    lora = LoraConfig(rank=rank, targets=targets, dora=dora)
    counts = finetune_counts(arch, FineTuning(lora=lora))
    total = count_parameters(arch).total
    assert counts.trainable + counts.frozen == total + counts.adapters
    assert counts.frozen == total
    adapted = [m for m in hf_modules(arch) if m.hf_name.rsplit(".", 1)[-1] in targets]
    assert counts.adapters == sum(
        rank * (m.in_features + m.out_features) + dora * m.out_features for m in adapted
    )
    assert counts.adapters == sum(t.numel for t in adapter_tensors(arch, lora))


def test_torchaos_nf4_is_half_a_byte_plus_1_64_plus_2_16384_per_bf16_weight() -> None:
    """torchao's NF4Tensor (torchtune's QLoRA): uint8 codes, int8 block scalers, bf16 factors per 256 blocks,
    a bf16 mean and a 16-entry bf16 table per weight; Llama-3-8B's decoder Linear weights."""
    from zerocalc.model.quantized import torchao_nf4_storage

    weights = [D * D, D * KV, D * KV, D * D, D * F, D * F, F * D]
    data = sum(sum(p.bytes for p in torchao_nf4_storage(n, BF16)[:3]) for n in weights) * L
    assert data == L * LINEARS // 2 + L * LINEARS // 64 + 2 * L * LINEARS // 16384 == 3_599_564_800
    assert sum(p.bytes for p in torchao_nf4_storage(D * D, BF16)[3:]) == 2 + 16 * 2
    with pytest.raises(ValueError, match="multiple of 16384"):
        torchao_nf4_storage(64 * 255, BF16)


def test_names_that_match_nothing_beside_names_that_do_are_listed() -> None:
    """PEFT ignores them; the plan lists them (a module name of another family, a typo)."""
    from zerocalc.model.adapters import peft_plan

    lora = LoraConfig(
        rank=8, targets=("q_proj", "self_attn.o_proj", "c_fc", "qproj"), modules_to_save=("wte",)
    )
    plan = peft_plan(LLAMA_3_8B, lora)
    assert plan.unmatched == ("c_fc", "qproj", "wte")
    assert {a.module.hf_name.rsplit(".", 1)[-1] for a in plan.adapted} == {"q_proj", "o_proj"}
    every = peft_plan(LLAMA_3_8B, LoraConfig(rank=8, targets="all-linear", modules_to_save=("mlp",)))
    assert every.unmatched == ()  # the MLPs' Linears are copied, not adapted: not unmatched
    assert {a.module.hf_name.rsplit(".", 1)[-1] for a in every.adapted} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    }
