"""Inputs that used to be silently wrong: refused in one line (exit 2), or read and said so in a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import DATA
from typer.testing import CliRunner

from zerocalc.api import estimate_peak
from zerocalc.cli import app
from zerocalc.model.architecture import count_parameters
from zerocalc.request.training import parse_options

runner = CliRunner()
CONFIG = json.loads((DATA / "h100-fsdp2-hf" / "config.json").read_text())
"""A Llama 3.2-style config (rotary, max_position_embeddings 131,072)."""


def _one_line_exit_2(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), result.stderr
    assert fragment in lines[0], lines[0]


def _write(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "--model", "gpt2-xl", "--seq-len", "100000"],
        ["memory", "--model", "gpt2-xl", "--seq-len", "1025", "--framework", "fsdp2"],
        ["plan", "--model", "gpt2-xl", "--gpu", "h100-80gb", "--global-batch", "16seq", "--seq-len", "1025"],
    ],
)
def test_a_sequence_beyond_learned_positions_is_refused(args: list[str]) -> None:
    seq = args[args.index("--seq-len") + 1]
    _one_line_exit_2(args, f"--seq-len {int(seq):,} is beyond gpt2-xl's 1,024 learned positions")


def test_the_default_sequence_follows_learned_positions() -> None:
    """2048 tokens by default, GPT-2's 1,024 positions (n_positions) where fewer."""
    assert parse_options(model="gpt2-xl").activations.seq_len == 1024
    assert parse_options(model="llama-3-8b").activations.seq_len == 2048
    assert parse_options(model="gpt2-xl", seq_len=1024).activations.seq_len == 1024


def test_a_sequence_beyond_rotary_positions_is_a_note() -> None:
    long = estimate_peak("llama-3-8b", 8, seq_len=16384)
    assert (
        "--seq-len 16,384 is beyond llama-3-8b's max_position_embeddings (8,192): rotary positions run, past "
        "what the model was trained for"
    ) in long.notes
    assert not any(
        "max_position_embeddings" in note for note in estimate_peak("llama-3-8b", 8, seq_len=8192).notes
    )


@pytest.mark.parametrize(
    ("quantization", "named"),
    [
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 128},
            "quantization_config (gptq) is not modelled",
        ),
        (
            {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
            "quantization_config (fp8)",
        ),
        # bitsandbytes' is read (zerocalc.request.finetune); a quantised base needs adapters
        (
            {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
            "quantization_config (nf4) quantises the base",
        ),
        ({"load_in_4bit": True}, "quantization_config (fp4) quantises the base"),
    ],
)
def test_a_quantization_config_is_refused_naming_it(tmp_path: Path, quantization: dict, named: str) -> None:
    path = _write(tmp_path, {**CONFIG, "quantization_config": quantization})
    _one_line_exit_2(["memory", "--model", path], named)


def test_a_multimodal_config_reads_its_text_model(tmp_path: Path) -> None:
    text = _write(tmp_path, CONFIG)
    plain = parse_options(model=text).model
    (tmp_path / "mm").mkdir()
    multimodal = {"model_type": "llava", "text_config": CONFIG, "vision_config": {"model_type": "clip"}}
    path = tmp_path / "mm" / "config.json"
    path.write_text(json.dumps(multimodal))
    request = parse_options(model=str(path))
    assert request.model.params == plain.params == count_parameters(request.architecture).total
    assert request.notes == (
        "model_type 'llava' is multimodal: its text_config (llama) is the model read; the vision tower and "
        "projector are not counted",
    )
    result = runner.invoke(app, ["memory", "--model", str(path), "--json"])
    assert result.exit_code == 0 and request.notes[0] in json.loads(result.stdout)["notes"]


def test_a_multimodal_config_with_a_quantized_or_unknown_text_model_is_refused(tmp_path: Path) -> None:
    quantized = {
        "model_type": "llava",
        "text_config": {**CONFIG, "quantization_config": {"quant_method": "fp8"}},
    }
    _one_line_exit_2(
        ["memory", "--model", _write(tmp_path, quantized)], "text_config: quantization_config (fp8)"
    )
    unknown = {"model_type": "llava", "text_config": {**CONFIG, "model_type": "mamba"}}
    _one_line_exit_2(["memory", "--model", _write(tmp_path, unknown)], "model_type 'llava' is not supported")
