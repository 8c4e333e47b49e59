"""`--model path.toml`: a model file in the presets' schema (zerocalc/request/presets.py)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_memory
from zerocalc.cli import app
from zerocalc.request.presets import ModelPreset, load_toml, preset_names, preset_path
from zerocalc.scenarios.scenario import Scenario, comm_section, memory_section

runner = CliRunner()

DOCS = ROOT / "docs" / "model.md"
MEGATRON_GPT = re.search(r"```toml\n(.*?)```", DOCS.read_text(), re.S).group(1)  # type: ignore[union-attr]
"""docs/model.md's example model file: a GPT of Megatron-LM's layout."""

SMALL_LLAMA = """\
title = "Small Llama"

[architecture]
vocab_size = 1000
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
intermediate_size = 256
mlp = "swiglu"
norm = "rmsnorm"
"""


def _json(args: list[str]) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("preset", "args"),
    [
        ("llama-3-8b", ["memory", "--gpus", "8", "--framework", "fsdp2", "--seq-len", "4096"]),
        ("llama-3-8b", ["comm", "--gpus", "16"]),
        ("gpt3-175b", ["memory", "--gpus", "64", "--framework", "megatron", "--model-impl", "megatron"]),
        ("gpt3-175b", ["comm", "--gpus", "64", "--framework", "megatron"]),
    ],
)
def test_a_copy_of_a_preset_gives_the_presets_json(tmp_path: Path, preset: str, args: list[str]) -> None:
    copy = tmp_path / f"{preset}.toml"
    shutil.copy(preset_path("models", preset), copy)
    from_preset = _json([*args, "--model", preset])
    from_file = _json([*args, "--model", str(copy)])
    assert from_file["options"].pop("model") == str(copy)  # the echo carries what was given
    from_preset["options"].pop("model")
    assert from_file == from_preset


def test_the_files_name_names_the_model_whatever_the_files_stem(tmp_path: Path) -> None:
    copy = tmp_path / "model.toml"
    copy.write_text('name = "llama-3-8b"\n' + preset_path("models", "llama-3-8b").read_text())
    from_file = _json(["memory", "--gpus", "8", "--model", str(copy)])
    from_preset = _json(["memory", "--gpus", "8", "--model", "llama-3-8b"])
    assert from_file["model"] == from_preset["model"]
    assert from_file["model"]["name"] == "llama-3-8b" and from_file["model"]["title"] == "Llama-3-8B"


def test_a_megatron_gpt_counts_as_by_hand(tmp_path: Path) -> None:
    """Narayanan et al. 2021 §5.1's V·h + P·h + L·(12h² + 13h), plus the final LayerNorm's 2h: per layer
    q, k, v, o 4h² + 4h, the MLP 8h² + 5h, two LayerNorms 4h; the head tied to the embedding."""
    path = tmp_path / "gpt.toml"
    path.write_text(MEGATRON_GPT)
    v, p, h, layers = 51200, 2048, 1024, 24
    expected = v * h + p * h + layers * (12 * h * h + 13 * h) + 2 * h
    assert expected == 356_837_376 and "= 356,837,376 parameters" in DOCS.read_text()
    data = _json(["memory", "--model", str(path), "--gpus", "8", "--framework", "megatron"])
    assert data["request"]["params"] == expected
    assert data["model"]["name"] == "megatron-gpt-350m" and data["model"]["title"] == "Megatron GPT 350M"
    table = runner.invoke(app, ["memory", "--model", str(path), "--gpus", "8"])
    assert table.exit_code == 0 and "Megatron GPT 350M: 356,837,376 parameters" in table.stdout


def test_a_model_file_without_a_name_is_named_by_its_stem(tmp_path: Path) -> None:
    """V·d + L·(q d² + k, v 2·d·(kv·d/a) + o d² + 3·d·f + 2d) + d + V·d (untied head)."""
    path = tmp_path / "small-llama.toml"
    path.write_text(SMALL_LLAMA)
    v, d, layers, f = 1000, 64, 2, 256
    kv_width = 2 * 64 // 4
    expected = v * d + layers * (2 * d * d + 2 * d * kv_width + 3 * d * f + 2 * d) + d + v * d
    estimate = estimate_memory(model=str(path), gpus=2)
    assert estimate.request.params == expected == 251_200
    assert estimate.model is not None and estimate.model.name == "small-llama"
    assert estimate.options["model"] == str(path)


def test_an_existing_file_is_read_by_its_content(tmp_path: Path) -> None:
    toml_file = tmp_path / "model-description"
    toml_file.write_text(SMALL_LLAMA)
    assert estimate_memory(model=str(toml_file), gpus=2).request.params == 251_200
    config = tmp_path / "hf-config"  # a config.json under another name is still read as one
    config.write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "vocab_size": 1000,
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 128,
            }
        )
    )
    assert estimate_memory(model=str(config), gpus=2).model.title.startswith("GPT2LMHeadModel")


def test_a_scenario_may_name_a_model_file(tmp_path: Path) -> None:
    scenario = load_toml(preset_path("scenarios", "llama-2-7b-8xa100"), Scenario)
    copy = tmp_path / "llama-2-7b.toml"
    shutil.copy(preset_path("models", scenario.model), copy)
    with_file = scenario.model_copy(update={"model": str(copy)})
    for section in (memory_section, comm_section):
        from_file, from_preset = section(with_file), section(scenario)
        assert from_file["options"].pop("model") == str(copy)
        from_preset["options"].pop("model")
        assert from_file == from_preset


def test_presets_show_toml_prints_a_starting_file(tmp_path: Path) -> None:
    shown = runner.invoke(app, ["presets", "show", "gpt3-175b", "--toml"])
    assert shown.exit_code == 0 and shown.stdout == preset_path("models", "gpt3-175b").read_text()
    path = tmp_path / "mine.toml"
    path.write_text(shown.stdout)
    assert estimate_memory(model=str(path), gpus=8).request.params == 174_604_259_328


ARCHITECTURE = "\n".join(SMALL_LLAMA.splitlines()[2:])
"""The ``[architecture]`` table of SMALL_LLAMA."""


LLAMA = SMALL_LLAMA.replace


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (
            'title = "x"\n[architecture\n',
            "not valid TOML (Expected ']' at the end of a table declaration (at line 2",
        ),
        (b"\xff\xfe", "not UTF-8 text (byte 0)"),
        (
            "[architecture]\nvocab_size = 1\n",
            "title is missing; accepted: a file that sets title, architecture",
        ),
        ('title = "x"\n[architecture]\n', "architecture.vocab_size is missing; accepted: a file that sets"),
        (LLAMA("num_layers", "num_layer"), "architecture.num_layer is not a field; did you mean num_layers?"),
        ('title = "x"\nflavor = "8B"\n' + ARCHITECTURE, "flavor is not a field; accepted: name, title,"),
        (LLAMA("hidden_size = 64", "hidden_size = -64"), "architecture.hidden_size = -64: Input should be"),
        (LLAMA('"swiglu"', '"relu"'), "architecture.mlp = 'relu': Input should be 'gelu' or 'swiglu'"),
        (LLAMA("num_kv_heads = 2", "num_kv_heads = 3"), "architecture: num_heads 4 is not a multiple of"),
        (SMALL_LLAMA + 'name = "x"\n', "architecture.name is not a field; accepted: name at the top of"),
        ('name = "a b"\n' + SMALL_LLAMA, "name = 'a b': String should match pattern"),
        (SMALL_LLAMA + "latent_attention = {kv_lora_rank = 4, rank = 1}\n", "latent_attention.rank is not"),
    ],
)
def test_a_bad_model_file_is_refused_in_one_line(tmp_path: Path, content: str | bytes, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    plan = ["plan", "--gpu", "h100-80gb", "--global-batch", "8seq"]
    for command in (["memory"], ["comm", "--gpus", "8"], plan):
        line = one_line_error(runner.invoke(app, [*command, "--model", str(path)]), fragment)
        assert line.startswith(f"zerocalc: error: --model {str(path)!r}: ")


def test_a_missing_model_file_is_refused_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "llama-3-8b.toml"
    one_line_error(
        runner.invoke(app, ["memory", "--model", str(missing)]),
        f"--model {str(missing)!r}: cannot be read (No such file or directory); accepted: a model TOML file "
        "in the schema of the model presets (`zerocalc presets show llama-3-8b --toml`), or the preset name "
        "'llama-3-8b'",
    )
    with pytest.raises(ValueError, match=r"^model '.*mine\.toml': cannot be read"):
        estimate_memory(model=str(tmp_path / "mine.toml"))


def test_a_torchtitan_job_toml_is_pointed_to_its_option(tmp_path: Path) -> None:
    job = tmp_path / "llama3_8b.toml"
    job.write_text('[job]\ndump_folder = "./outputs"\n[model]\nname = "llama3"\nflavor = "8B"\n')
    one_line_error(
        runner.invoke(app, ["memory", "--model", str(job)]),
        f"is a torchtitan job TOML ([job], [model]), not a model file; accepted: --torchtitan {str(job)!r} "
        "for the job, or a model TOML file",
    )


def test_a_model_file_given_as_params_is_named_a_model(tmp_path: Path) -> None:
    one_line_error(
        runner.invoke(app, ["memory", "--params", "mine.toml"]),
        "--params 'mine.toml' is a model, not a parameter count; accepted: --model 'mine.toml'",
    )


def test_every_shipped_model_preset_cites_its_source_and_sets_no_name() -> None:
    """A user's file may leave ``source`` and ``name`` out; a shipped preset cites its source and is named
    by its file."""
    for name in preset_names("models"):
        preset = load_toml(preset_path("models", name), ModelPreset)
        assert preset.source.strip() and preset.name is None, name


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
    reason="needs torch and transformers",
)
def test_validate_fake_builds_a_model_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(SMALL_LLAMA.replace("[architecture]\n", '[architecture]\nfamily = "llama"\n'))
    result = runner.invoke(
        app, ["validate", "fake", "--model", str(path), "--world", "2", "-s", "32", "--json"]
    )
    assert result.exit_code == 0, result.output
    (case,) = json.loads(result.output)["cases"]
    assert case["case"]["world"] == 2
    assert all(line["predicted"] == line["measured"] for line in case["lines"])
