"""What people type is accepted as they mean it (dtypes, k as 1024, µ and μ, a model as a folder or
standard input), and options that would be ignored are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import LLAMA_2_7B, LLAMA_2_7B_CONFIG, ROOT
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), stderr
    return lines[0]


# ------------------------------------------------------------------- what people type, accepted
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--reduce-dtype", "bf16", "--precision", "fp32"], "accepted: fp32"),
        (["--reduce-dtype", "fp16", "--precision", "bf16-mixed"], "accepted: fp32, bf16"),
    ],
)
def test_accepted_dtypes_are_named_once(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "8", *args])
    assert result.exit_code == 2
    line = _one_line(result.stderr)
    assert line.endswith(fragment)


@pytest.mark.parametrize(("typed", "tokens"), [("8k", 8192), ("8K", 8192), ("128k", 131_072), ("1M", 2**20),
                                               ("1.5k", 1536), ("4096", 4096)])  # fmt: skip
def test_seq_len_takes_k_as_1024(typed: str, tokens: int) -> None:
    from zerocalc.request.training import parse_options

    assert parse_options(model="llama-3-8b", seq_len=typed).activations.seq_len == tokens


@pytest.mark.parametrize("typed", ["1.0001k", "0k", "100000k", "8kb"])
def test_seq_len_refuses_what_is_not_a_whole_token_count(typed: str) -> None:
    result = runner.invoke(app, ["memory", "--model", "gpt2", "--seq-len", typed])
    assert result.exit_code == 2
    assert f"--seq-len {typed!r} is not accepted; accepted: a whole number of tokens" in _one_line(
        result.stderr
    )


@pytest.mark.parametrize("latency", ["20µs", "20μs", "20us"])  # U+00B5, U+03BC, ASCII
def test_micro_sign_and_greek_mu_are_both_microseconds(latency: str) -> None:
    from zerocalc import estimate_comm

    assert estimate_comm("7B", 8, latency=latency).request.bandwidths.intra_node.latency_s == pytest.approx(
        20e-6
    )


@pytest.mark.parametrize("spelling", ["folder", "config-without-suffix", "stdin-dash", "stdin-path"])
def test_model_as_a_folder_a_plain_file_or_standard_input(tmp_path: Path, spelling: str) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_2_7B_CONFIG))
    (folder / "config").write_text(json.dumps(LLAMA_2_7B_CONFIG))
    model, stdin = {
        "folder": (str(folder), None),
        "config-without-suffix": (str(folder / "config"), None),
        "stdin-dash": ("-", json.dumps(LLAMA_2_7B_CONFIG)),
        "stdin-path": ("/dev/stdin", json.dumps(LLAMA_2_7B_CONFIG)),
    }[spelling]
    result = subprocess.run(
        [sys.executable, "-m", "zerocalc", "memory", "--model", model, "--json"],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"]["parameter_count"]["total"] == LLAMA_2_7B
    assert data["model"]["title"].startswith("LlamaForCausalLM, ")  # not "cfg"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "-"], "reads config.json from standard input, which is empty"),
        (["--model", "EMPTY_FOLDER"], "is a folder without a readable config.json"),
        (["--params", "7B", "--reserve", "1GiB"], "--reserve '1GiB' changes nothing here"),
    ],
)
def test_options_that_would_be_ignored_are_refused(tmp_path: Path, args: list[str], fragment: str) -> None:
    args = [str(tmp_path) if a == "EMPTY_FOLDER" else a for a in args]
    result = runner.invoke(app, ["memory", *args], input="")
    assert result.exit_code == 2, result.output
    assert fragment in _one_line(result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["--params", "7B", "--reserve", "1GiB", "--gpu", "h100-80gb"],
        ["--model", "gpt2", "--reserve", "1GiB"],
    ],
)
def test_the_same_options_where_they_apply_are_accepted(args: list[str]) -> None:
    result = runner.invoke(app, ["memory", *args])
    assert result.exit_code == 0, result.output


def test_model_dash_at_a_terminal_is_refused_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from zerocalc.base.errors import InputError
    from zerocalc.request import presets

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    presets._load_hf_stdin.cache_clear()
    with pytest.raises(InputError, match=r"reads config\.json from standard input, which is a terminal"):
        presets.load_model("-")


@pytest.mark.parametrize("path", ["~0", "~no-such-user-here/model.toml"])
@pytest.mark.parametrize("command", [["memory", "--gpus", "2"], ["validate", "frameworks"]])
def test_a_home_that_names_no_user_is_refused_in_one_line(command: list[str], path: str) -> None:
    """``Path.expanduser`` raises for ``~0`` (no such user); the path is kept as typed and refused as a
    model that is neither a preset nor a file."""
    from helpers import one_line_error

    result = CliRunner().invoke(app, [*command, "--model", path])
    one_line_error(result, repr(path))
