"""The fine-tuning options, PEFT's adapter_config.json and config.json's quantization_config become the
typed FineTuning of the request; every key of the two files is modelled, harmless or refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import H100_DATA, one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.model.quantized import QuantMethod
from zerocalc.parallel.finetune import FineTuning, LoraConfig, QuantConfig
from zerocalc.request.training import parse_options

runner = CliRunner()
CONFIG = json.loads((H100_DATA / "config.json").read_text())

BNB_NF4_DQ_BF16 = {
    # transformers 5.17 BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    # bnb_4bit_use_double_quant=True, bnb_4bit_quant_storage=torch.bfloat16,
    # bnb_4bit_compute_dtype=torch.bfloat16).to_dict(), as save_pretrained writes it into config.json
    "quant_method": "bitsandbytes", "_load_in_8bit": False, "_load_in_4bit": True,
    "llm_int8_threshold": 6.0, "llm_int8_skip_modules": None, "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "bfloat16", "load_in_4bit": True,
    "load_in_8bit": False,
}  # fmt: skip

ADAPTER = {
    # peft 0.21.2 LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
    # task_type="CAUSAL_LM").to_dict() as save_pretrained writes adapter_config.json
    "task_type": "CAUSAL_LM", "peft_type": "LORA", "auto_mapping": None, "peft_version": "0.21.2",
    "base_model_name_or_path": "meta-llama/Meta-Llama-3-8B", "revision": None, "inference_mode": True,
    "r": 16, "target_modules": ["q_proj", "v_proj"], "exclude_modules": None, "lora_alpha": 32,
    "lora_dropout": 0.05, "fan_in_fan_out": False, "bias": "none", "use_rslora": False,
    "modules_to_save": None, "init_lora_weights": True, "layers_to_transform": None, "layers_pattern": None,
    "rank_pattern": {}, "alpha_pattern": {}, "megatron_config": None, "megatron_core": "megatron.core",
    "trainable_token_indices": None, "loftq_config": {}, "eva_config": None, "corda_config": None,
    "lora_ga_config": None, "use_dora": False, "velora_config": None, "alora_invocation_tokens": None,
    "use_qalora": False, "qalora_group_size": 16, "monteclora_config": None, "layer_replication": None,
    "runtime_config": {"ephemeral_gpu_offload": False}, "lora_bias": False, "target_parameters": None,
    "use_bdlora": None, "arrow_config": None, "kasa_config": None, "ensure_weight_tying": False,
}  # fmt: skip


def _write(folder: Path, name: str, data: dict) -> str:
    path = folder / name
    path.write_text(json.dumps(data))
    return str(path)


def test_the_options_make_the_typed_fine_tuning() -> None:
    request = parse_options(
        model="llama-3-8b", lora_rank=16, lora_targets="all-linear", quantize="nf4", double_quant=True
    )
    assert request.finetune == FineTuning(
        lora=LoraConfig(rank=16, targets="all-linear"),
        quant=QuantConfig(method=QuantMethod.NF4, double_quant=True),
    )
    assert parse_options(model="llama-3-8b").finetune is None
    assert parse_options(model="llama-3-8b", lora_rank=0).finetune is None
    names = parse_options(
        model="llama-3-8b", lora_rank="8", lora_targets="q_proj, v_proj", lora_dropout="0.1", dora=True,
        modules_to_save="lm_head", lora_alpha=16,
    ).finetune  # fmt: skip
    assert names is not None and names.lora == LoraConfig(
        rank=8, alpha=16, targets=("q_proj", "v_proj"), dropout=0.1, dora=True, modules_to_save=("lm_head",)
    )
    frozen = parse_options(model="llama-3-8b", freeze="embed_tokens,layers.0").finetune
    assert frozen == FineTuning(freeze=("embed_tokens", "layers.0"))


@pytest.mark.parametrize(
    ("options", "recompute"),
    [
        ({"quantize": "nf4", "lora_rank": 8}, "full"),  # prepare_model_for_kbit_training checkpoints
        ({"quantize": "nf4", "lora_rank": 8, "kbit_prepare": False}, "none"),
        ({"quantize": "nf4", "lora_rank": 8, "recompute": "none"}, "none"),  # asked: as asked
        ({"lora_rank": 8}, "none"),  # LoRA without kbit preparation: the script's own choice, none here
        ({}, "none"),
        ({"recompute": "selective"}, "selective"),
    ],
)
def test_recompute_auto_follows_prepare_model_for_kbit_training(options: dict, recompute: str) -> None:
    """PEFT 0.21.2 ``prepare_model_for_kbit_training(use_gradient_checkpointing=True)`` (its default) calls
    ``gradient_checkpointing_enable()``: with ``--kbit-prepare`` (on with ``--quantize``) the default
    recompute is full, and a note says so."""
    request = parse_options(model="llama-3-8b", **options)
    assert request.activations.recompute.value == recompute
    noted = any("prepare_model_for_kbit_training checkpoints" in note for note in request.notes)
    assert noted == ("recompute" not in options and recompute == "full")


def test_a_config_json_quantization_config_is_read_and_flags_override_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "config.json", {**CONFIG, "quantization_config": BNB_NF4_DQ_BF16})
    read = parse_options(model=path, lora_rank=8).finetune
    assert read is not None and read.quant == QuantConfig(
        method=QuantMethod.NF4, double_quant=True, storage=DType.BF16, compute_dtype=DType.BF16
    )
    flags = parse_options(model=path, lora_rank=8, quantize="fp4", double_quant=False).finetune
    assert flags is not None and flags.quant is not None
    assert (flags.quant.method, flags.quant.double_quant, flags.quant.storage) == (
        QuantMethod.FP4,
        False,
        DType.BF16,
    )
    unquantised = parse_options(model=path, lora_rank=8, quantize="none").finetune
    assert unquantised == FineTuning(lora=LoraConfig(rank=8))
    as_dict = parse_options(model={**CONFIG, "quantization_config": BNB_NF4_DQ_BF16}, lora_rank=8).finetune
    assert as_dict == read
    eight = {"quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_skip_modules": ["lm_head"]}
    int8 = parse_options(model={**CONFIG, "quantization_config": eight}, lora_rank=8).finetune
    assert int8 is not None and int8.quant == QuantConfig(method=QuantMethod.INT8, skip_modules=("lm_head",))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"llm_int8_has_fp16_weight": True}, "llm_int8_has_fp16_weight True is not modelled"),
        ({"llm_int8_enable_fp32_cpu_offload": True}, "llm_int8_enable_fp32_cpu_offload True"),
        ({"bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type 'int4' is not accepted; accepted: nf4, fp4"),
        ({"bnb_4bit_quant_storage": "float8_e4m3fn"}, "bnb_4bit_quant_storage 'float8_e4m3fn'"),
        ({"load_in_8bit": True}, "loads in 4 and 8 bits"),
        ({"bnb_4bit_new_key": 1}, "'bnb_4bit_new_key' is not a BitsAndBytesConfig key"),
    ],
)
def test_a_quantization_config_key_not_modelled_is_refused(
    tmp_path: Path, change: dict, fragment: str
) -> None:
    path = _write(tmp_path, "config.json", {**CONFIG, "quantization_config": {**BNB_NF4_DQ_BF16, **change}})
    one_line_error(runner.invoke(app, ["memory", "--model", path, "--lora-rank", "8"]), fragment)


def test_an_adapter_config_is_read_and_flags_override_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "adapter_config.json", ADAPTER)
    read = parse_options(model="llama-3-8b", adapter_config=path).finetune
    assert read == FineTuning(lora=LoraConfig(rank=16, alpha=32, targets=("q_proj", "v_proj"), dropout=0.05))
    flags = parse_options(model="llama-3-8b", adapter_config=path, lora_rank=4, lora_targets="all-linear")
    assert flags.finetune is not None and flags.finetune.lora is not None
    assert (flags.finetune.lora.rank, flags.finetune.lora.targets) == (4, "all-linear")


def test_a_real_peft_adapter_config_has_every_key_classified(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=8, target_modules="all-linear", use_dora=True, modules_to_save=["lm_head"])
    config.save_pretrained(str(tmp_path))
    read = parse_options(model="llama-3-8b", adapter_config=str(tmp_path / "adapter_config.json")).finetune
    assert read == FineTuning(
        lora=LoraConfig(rank=8, targets="all-linear", dora=True, modules_to_save=("lm_head",))
    )


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern {'q_proj': 4} is not modelled; accepted: {}"),
        ({"bias": "all"}, "bias 'all' is not modelled; accepted: \"none\""),
        ({"layers_to_transform": [0, 1]}, "layers_to_transform [0, 1] is not modelled"),
        ({"init_lora_weights": "eva"}, "init_lora_weights 'eva' is not modelled"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not modelled"),
        ({"lora_dropuot": 0.1}, "'lora_dropuot' is not a PEFT 0.21 LoraConfig key"),
        ({"lora_dropout": 2}, "lora_dropout"),
        ({"r": 0}, "r 0 is not accepted"),
    ],
)
def test_an_adapter_config_key_not_modelled_is_refused(tmp_path: Path, change: dict, fragment: str) -> None:
    path = _write(tmp_path, "adapter_config.json", {**ADAPTER, **change})
    one_line_error(
        runner.invoke(app, ["memory", "--model", "llama-3-8b", "--adapter-config", path]), fragment
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lora-rank", "-1"], "--lora-rank '-1' is not accepted; accepted: a whole number"),
        (
            ["--lora-rank", "8", "--lora-dropout", "1"],
            "--lora-dropout '1' is not accepted; accepted: 0 ≤ P < 1",
        ),
        (["--lora-rank", "8", "--quantize", "nf5"], "--quantize 'nf5' is not accepted; accepted: none, nf4"),
        (["--quantize", "nf4"], "accepted: with --lora-rank R (QLoRA), or --quantize none"),
        (["--lora-alpha", "16"], "--lora-alpha describes LoRA, which is off without a rank"),
        (["--lora-rank", "8", "--double-quant"], "--double-quant describes a quantised base"),
        (["--lora-rank", "8", "--quantize", "int8", "--no-double-quant"], "--double-quant quantises 4-bit"),
        (["--lora-rank", "8", "--quantize", "nf4", "--quant-storage", "fp8"], "--quant-storage 'fp8'"),
        (["--lora-rank", "8", "--lora-targets", "qproj"], "--lora-targets ['qproj'] match no module"),
        (["--lora-rank", "8", "--lora-targets", ","], "--lora-targets ',' names no module"),
        (["--lora-rank", "8", "--freeze", "embed_tokens"], "--freeze names modules frozen in a full"),
        (["--freeze", "vision_tower"], "--freeze 'vision_tower' matches no module"),
        (["--freeze", "model,lm_head"], "--freeze 'model,lm_head' freezes every parameter"),
        (["--lora-rank", "8", "--adapter-config", "/nonexistent/adapter_config.json"], "cannot be read"),
    ],
)
def test_a_bad_fine_tuning_value_is_one_line(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["memory", "--model", "llama-3-8b", *args]), fragment)


def test_fine_tuning_needs_the_modules_and_a_quantised_config_needs_adapters(tmp_path: Path) -> None:
    one_line_error(
        runner.invoke(app, ["memory", "--params", "7B", "--lora-rank", "8"]), "fine-tuning needs the model's"
    )
    path = _write(tmp_path, "config.json", {**CONFIG, "quantization_config": BNB_NF4_DQ_BF16})
    one_line_error(runner.invoke(app, ["comm", "--model", path]), "quantises the base, which is trained")
    assert runner.invoke(app, ["comm", "--model", path, "--lora-rank", "8"]).exit_code == 0


def test_adapters_in_the_base_dtype_take_a_quantised_base_s_compute_dtype() -> None:
    """PEFT 0.21.2 ``_get_base_layer_device_and_dtype``: a ``Linear4bit``'s ``compute_dtype`` is the dtype
    adapters left uncast take; fp32 beside the recipe's bf16 is refused, PEFT's fp32 adapters are not."""
    fp32 = {**BNB_NF4_DQ_BF16, "bnb_4bit_compute_dtype": "float32"}
    model = {**CONFIG, "quantization_config": fp32}
    with pytest.raises(InputError, match="take bnb_4bit_compute_dtype fp32, not the recipe's bf16"):
        parse_options(model=model, lora_rank=8, autocast_adapter_dtype=False, framework="fsdp2")
    assert parse_options(model=model, lora_rank=8, framework="fsdp2").finetune is not None
    bf16 = parse_options(
        model={**CONFIG, "quantization_config": BNB_NF4_DQ_BF16}, lora_rank=8, autocast_adapter_dtype=False
    ).finetune
    assert bf16 is not None and bf16.lora is not None and not bf16.lora.autocast_adapter_dtype


def test_the_adapter_dtype_switch_reads_as_its_flags(tmp_path: Path) -> None:
    path = _write(tmp_path, "config.json", {**CONFIG, "quantization_config": BNB_NF4_DQ_BF16})
    base = ["memory", "--model", str(path), "--lora-rank", "8", "--framework", "fsdp2", "--json"]
    on = json.loads(runner.invoke(app, base).stdout)
    off = json.loads(runner.invoke(app, [*base, "--no-autocast-adapter-dtype"]).stdout)
    assert (
        on["options"]["autocast_adapter_dtype"] is None and off["options"]["autocast_adapter_dtype"] is False
    )
    one_line_error(
        runner.invoke(app, [*base, "--lora-targets", "q_proj,lm_head", "--no-autocast-adapter-dtype"]),
        "zerocalc: error: adapters in the base layer's dtype (--no-autocast-adapter-dtype) on lm_head, which "
        "is not quantised and prepare_model_for_kbit_training makes fp32, would be fp32 beside the others' "
        "bf16; accepted: targets among the quantised Linear layers, --no-kbit-prepare, or "
        "--autocast-adapter-dtype (PEFT's default)",
    )
