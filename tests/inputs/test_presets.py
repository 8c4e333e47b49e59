"""Model and GPU presets, HF config.json reading, scenarios and `zerocalc check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.api import estimate_memory
from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.model.architecture import count_parameters
from zerocalc.model.hf_config import architecture_from_hf_config
from zerocalc.request.presets import (
    ModelPreset,
    load_gpu,
    load_model,
    load_toml,
    preset_names,
    preset_path,
)

runner = CliRunner()

PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_the_published_count(name: str) -> None:
    arch, preset = load_model(name)
    assert count_parameters(arch).total == PUBLISHED[name] == preset.published_params


def test_every_shipped_model_matches_its_own_published_figure() -> None:
    for name in preset_names("models"):
        arch, preset = load_model(name)
        total = count_parameters(arch).total
        assert abs(total - preset.published_params) <= preset.published_tolerance * preset.published_params, (
            name
        )
    # GPT-3: the paper's "175.0B" is rounded; its architecture counts 174.6B
    assert count_parameters(load_model("gpt3-175b")[0]).total == 174_604_259_328


def test_mixtral_active_parameters_use_two_of_eight_experts() -> None:
    count = count_parameters(load_model("mixtral-8x7b")[0])
    expert = 3 * 4096 * 14336
    assert count.active_per_token == count.total - 6 * expert * 32 == 12_879_925_248


def test_largest_layer_is_deepspeeds_largest_module() -> None:
    count = count_parameters(load_model("llama-3-8b")[0])
    assert (count.largest_layer_name, count.largest_layer_params) == ("embed_tokens", 128256 * 4096)
    assert count.largest_block_params == 218_112_000


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


HF_CONFIGS = {
    "llama-2-7b": {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
                   "tie_word_embeddings": False},
    "mistral-7b": {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336},
    "mixtral-8x7b": {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2.5-7b": {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                   "tie_word_embeddings": False},
    "gpt2": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
             "n_positions": 1024, "n_inner": None},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_config_round_trip_matches_the_preset(tmp_path: Path, name: str) -> None:
    arch = architecture_from_hf_config(_write(tmp_path, HF_CONFIGS[name]))
    assert count_parameters(arch).total == PUBLISHED[name]
    assert estimate_memory(model=str(tmp_path / "config.json"), gpus=8).request.params == PUBLISHED[name]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"model_type": "bert"}), "model_type 'bert' is not supported"),
        (json.dumps({"model_type": "llama", "vocab_size": 32000}), "lacks the key 'hidden_size'"),
    ],
)
def test_bad_config_json_is_one_line(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    result = runner.invoke(app, ["memory", "--model", str(path)])
    assert (
        result.exit_code == 2 and fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1
    )


def test_unknown_preset_suggests_the_closest_names() -> None:
    with pytest.raises(InputError, match="did you mean llama-3-70b"):
        preset_path("models", "llama-3-7b")
    result = runner.invoke(app, ["memory", "--model", "lama-2-7b"])
    assert result.exit_code == 2 and "llama-2-7b" in result.stderr


def test_model_and_params_are_mutually_exclusive() -> None:
    result = runner.invoke(app, ["memory", "--model", "gpt2", "--params", "7B"])
    assert result.exit_code == 2 and "give --params or --model, not both;" in result.stderr


def test_neither_model_nor_params_asks_for_one_without_not_both() -> None:
    """Bare ``zerocalc memory`` gave neither: the message asks for one, and says nothing of both."""
    result = runner.invoke(app, ["memory"])
    assert result.exit_code == 2 and "give --params or --model; accepted:" in result.stderr
    assert "not both" not in result.stderr


def test_gpu_preset_capacity_is_what_pytorch_sees_less_the_context() -> None:
    """H100 80GB: nvidia-smi's 81559 MiB; torch.cuda.mem_get_info's total 79.18 GiB (81080 MiB); 1,395,458,048
    bytes outside the caching allocator (shared/measurements: device_used − max_reserved)."""
    gpu = load_gpu("h100-80gb")
    assert gpu.memory_bytes == 81559 * 2**20
    assert gpu.usable_bytes == 81080 * 2**20 and gpu.context_bytes == 1_395_458_048
    est = estimate_memory(model="llama-3-8b", gpus=8, gpu="h100-80gb", reserve="4GiB")
    assert est.request.gpu_memory_bytes == 81080 * 2**20
    assert est.request.states_capacity_bytes == 81080 * 2**20 - 4 * 2**30
    default = estimate_memory(model="llama-3-8b", gpus=8, gpu="h100-80gb")
    assert default.request.states_capacity_bytes == 81080 * 2**20 - 1_395_458_048
    result = runner.invoke(app, ["memory", "--model", "llama-3-70b", "--gpu", "h100-80gb", "--gpus", "64"])
    assert result.exit_code == 0 and "Of 79.18" in result.stdout and "Llama-3-70B" in result.stdout


def test_gpu_preset_supplies_comm_bandwidths() -> None:
    result = runner.invoke(
        app, ["comm", "--model", "llama-2-7b", "--gpus", "16", "--gpu", "a100-80gb", "--json"]
    )
    c = json.loads(result.stdout)["strategies"][0]["collectives"][0]
    assert c["bandwidth_source"] == "gpu_preset" and c["bus_bandwidth_Bps"] == 25e9  # 200 Gb/s HDR


def test_a_broken_preset_names_its_path_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('title = "x"\nsource = "y"\nsurprise = 1\n[architecture]\n')
    with pytest.raises(InputError, match=r"bad\.toml: surprise"):
        load_toml(bad, ModelPreset)


def test_check_passes_on_the_shipped_presets() -> None:
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 0, result.output
    assert "changed" not in result.stdout


def test_check_fails_on_a_changed_number_and_update_restores_it(presets_copy: Path) -> None:
    expected = presets_copy / "expected" / "llama-2-7b-8xa100.json"
    data = json.loads(expected.read_text())
    data["memory"]["strategies"][0]["gpu_bytes"] += 1
    expected.write_text(json.dumps(data))
    result = runner.invoke(app, ["check", str(presets_copy)])
    assert result.exit_code == 1
    assert "llama-2-7b-8xa100" in result.stdout and "memory.strategies.0.gpu_bytes" in result.stdout
    assert runner.invoke(app, ["check", str(presets_copy), "--update"]).exit_code == 0
    assert runner.invoke(app, ["check", str(presets_copy)]).exit_code == 0


def test_check_reports_a_broken_scenario_and_still_checks_the_others(presets_copy: Path) -> None:
    (presets_copy / "scenarios" / "zz-broken.toml").write_text('description = "x"\nmodel = "gpt2"\n')
    result = runner.invoke(app, ["check", str(presets_copy)])
    assert result.exit_code == 1
    assert "zz-broken" in result.stdout and "broken" in result.stdout
    shipped = len(preset_names("scenarios"))
    assert f"{shipped} of {shipped + 1}" in result.stdout


def test_check_of_a_folder_without_scenarios_is_bad_input(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check", str(tmp_path)])
    assert result.exit_code == 2 and "scenarios/" in result.stderr


def test_presets_list_and_show() -> None:
    listed = runner.invoke(app, ["presets", "list", "models"])
    assert listed.exit_code == 0 and "llama-3.1-405b" in listed.stdout
    shown = runner.invoke(app, ["presets", "show", "llama-2-7b"])
    assert shown.exit_code == 0 and "6,738,415,616" in shown.stdout and "largest_layer_params" in shown.stdout


def test_an_expectation_without_a_scenario_is_an_orphan(presets_copy: Path) -> None:
    (presets_copy / "scenarios" / "gpt2-xl-2x4090.toml").unlink()
    result = runner.invoke(app, ["check", str(presets_copy)])
    assert result.exit_code == 1 and "orphan" in result.stdout and "gpt2-xl-2x4090" in result.stdout
