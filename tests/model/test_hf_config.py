"""The config.json reader refuses what it cannot count in one line (exit 2), never with a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.model.architecture import count_parameters
from zerocalc.model.hf_config import SUPPORTED, architecture_from_hf_config

runner = CliRunner()

QWEN3 = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16}  # fmt: skip
QWEN3_MOE = {**QWEN3, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32}  # fmt: skip
DEEPSEEK = {**QWEN3, "model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32}  # fmt: skip


def _refused(tmp_path: Path, content: bytes | str | Any) -> str:
    """stderr of `zerocalc memory --model config.json`, which must be one line and exit 2."""
    path = tmp_path / "config.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    result = runner.invoke(app, ["memory", "--model", str(path)])
    one_line_error(result, "config.json")
    return result.stderr


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"hidden_size": 10**400}, "hidden_size 100000000000000000000000… (401 characters) is not accepted"),
        (
            {"hidden_size": True},
            "hidden_size true is not accepted; accepted: a whole number from 1 to 2147483647",
        ),
        ({"hidden_size": "4096"}, 'hidden_size "4096" is not accepted'),
        ({"hidden_size": 64.0}, "hidden_size 64.0 is not accepted"),
        ({"hidden_size": -64}, "hidden_size -64 is not accepted"),
        ({"hidden_size": None}, "hidden_size null is not accepted"),
        ({"head_dim": 0}, "head_dim 0 is not accepted; accepted: a whole number from 1"),
        (
            {"num_key_value_heads": 0},
            "num_key_value_heads 0 is not accepted; accepted: null or a whole number",
        ),
        ({"num_key_value_heads": 3}, "4 attention heads are not a multiple of 3 key/value heads"),
        ({"attention_bias": 1}, "attention_bias 1 is not accepted; accepted: true or false"),
        ({"tie_word_embeddings": "false"}, 'tie_word_embeddings "false" is not accepted'),
        ({"mlp_bias": True}, "key 'mlp_bias' is not read by the qwen3 record"),
        ({"num_experts": 8}, "key 'num_experts' is not read by the qwen3 record"),
    ],
)
def test_bad_values_and_unknown_sizing_keys_are_one_line(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    assert fragment in _refused(tmp_path, {**QWEN3, **changes})


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({**QWEN3_MOE, "num_shared_experts": 2}, "'num_shared_experts' is not read by the qwen3_moe record"),
        ({**QWEN3_MOE, "moe_layer_freq": 2}, "'moe_layer_freq' is not read by the qwen3_moe record"),
        ({**QWEN3_MOE, "mlp_only_layers": ["0"]}, 'mlp_only_layers ["0"] is not accepted; accepted: null'),
        ({**QWEN3_MOE, "decoder_sparse_step": 0}, "decoder_sparse_step 0 is not accepted"),
        ({**QWEN3_MOE, "num_local_experts": 4}, "num_experts and num_local_experts disagree (8 vs 4)"),
        ({**QWEN3_MOE, "num_experts_per_tok": 9}, "experts_per_token must be between 1 and num_experts"),
        ({**DEEPSEEK, "moe_layer_freq": 2}, "moe_layer_freq 2 describes a model that transformers'"),
        ({**DEEPSEEK, "moe_layer_freq": True}, "accepted: 1"),
        ({"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16,
          "add_cross_attention": True}, "add_cross_attention true describes a model"),
        ({**QWEN3, "model_type": "gemma2", "num_key_value_heads": None}, "num_key_value_heads null"),
        ({"model_type": "falcon", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 3}, "hidden_size 64 is not a multiple of num_attention_heads 3"),
        ({**QWEN3, "model_type": "falcon"}, "key 'intermediate_size' is not read by the falcon record"),
        ({**QWEN3_MOE, "moe_intermediate_size": None}, "moe_intermediate_size null"),
        ({k: v for k, v in DEEPSEEK.items() if k != "moe_intermediate_size"}, "lacks the key 'moe_inter"),
    ],
)  # fmt: skip
def test_layouts_the_records_do_not_know_are_refused_not_guessed(
    tmp_path: Path, config: dict[str, Any], fragment: str
) -> None:
    assert fragment in _refused(tmp_path, config)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"model_type": "qwen3", "vocab_size": 1000\xff}', "is not UTF-8 text (byte 0xff at offset 42)"),
        ("[1, 2]", "is not a config.json object (it holds an array)"),
        ('"qwen3"', "is not a config.json object (it holds a string)"),
        ("4096", "is not a config.json object (it holds a number)"),
        ("null", "is not a config.json object (it holds null)"),
        ('{"hidden_size": ' + "9" * 5000 + "}", "is not a JSON file this reader accepts"),
        ("[" * 100_000 + "]" * 100_000, "is not a JSON file this reader accepts"),
        ("{", "is not JSON"),
        ({"model_type": "gemma3"}, f"model_type 'gemma3' is not supported; accepted: {', '.join(SUPPORTED)}"),
        ({"vocab_size": 1000}, "model_type null is not supported"),
        ({"model_type": ["qwen3"]}, 'model_type ["qwen3"] is not supported'),
    ],
)
def test_files_that_are_not_a_config_object_are_one_line(tmp_path: Path, content: Any, fragment: str) -> None:
    assert fragment in _refused(tmp_path, content)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["memory", "--model", str(tmp_path / "nowhere" / "config.json")])
    assert result.exit_code == 2 and "cannot be read" in result.stderr


def test_keys_that_do_not_size_the_model_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3))
    plain = count_parameters(architecture_from_hf_config(path)).total
    noisy = {**QWEN3, "my_note": "hello", "foo_dropout": 0.1, "rope_scaling": {"type": "yarn", "factor": 4},
             "torch_dtype": "bfloat16", "max_position_embeddings": 40960, "sliding_window": None,
             "bos_token_id": 1,
             "rms_norm_eps": 1e-6}  # fmt: skip
    path.write_text(json.dumps(noisy))
    assert count_parameters(architecture_from_hf_config(path)).total == plain


def test_a_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(QWEN3).encode())
    assert architecture_from_hf_config(path).qk_norm.value == "per_head"


def test_validate_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3))
    result = runner.invoke(app, ["validate", "frameworks", "--model", str(path)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "q/k norms; zerocalc validate builds dense pre-norm blocks" in result.stderr
