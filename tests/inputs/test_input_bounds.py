"""Inputs beyond what can be computed or what is physical (tiny buckets, absurd layer counts, bandwidths):
refused in one line, the smallest accepted value runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), stderr
    return lines[0]


# ------------------------------------------------------- tiny buckets with --params: bounded work
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--ddp-bucket", "0", "-s", "ddp", "--framework", "torch-zero1"], "--ddp-bucket from 280000B"),
        (["--framework", "deepspeed", "-s", "zero2", "--reduce-bucket", "1"], "--reduce-bucket from 70,000"),
        (["--gpus", "1048576", "--framework", "torch-zero1", "-s", "zero1"], "--gpus up to 100,000"),
    ],
)
def test_tiny_buckets_of_a_flat_model_are_refused_in_one_line(args: list[str], fragment: str) -> None:
    """7e9 elements cut into 1-element buckets (4-byte fp32 DDP buckets: 7e9 × 4 / 100,000 = 280,000 B)."""
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "8", *args])
    assert result.exit_code == 2, result.output
    assert fragment in _one_line(result.stderr)


@pytest.mark.parametrize(
    ("args", "buckets"),
    [
        # 7e9 fp32 elements in 280,000-byte (70,000-element) buckets: 100,000 of them
        (["--ddp-bucket", "280000B", "-s", "ddp", "--framework", "torch-zero1"], 100_000),
        (["--framework", "deepspeed", "-s", "zero2", "--reduce-bucket", "70000"], 100_000),
    ],
)
def test_the_smallest_accepted_bucket_runs(args: list[str], buckets: int) -> None:
    from zerocalc import estimate_comm

    keywords = {"ddp_bucket": "280000B"} if "--ddp-bucket" in args else {"reduce_bucket": "70000"}
    framework = args[args.index("--framework") + 1]
    strategy = args[args.index("-s") + 1]
    estimate = estimate_comm("7B", 8, framework=framework, strategies=strategy, **keywords)
    reduce = estimate.row(strategy).collectives[0]
    assert reduce.calls_per_step == buckets


# ------------------------------------------------------------- absurd layer counts: one line
@pytest.mark.parametrize("layers", [513, 10_000, 2_147_483_647])
@pytest.mark.parametrize("key", ["num_hidden_layers", "n_layer"])
def test_absurd_layer_counts_are_refused_at_once(tmp_path: Path, layers: int, key: str) -> None:
    config = (
        {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_head": 12, "n_positions": 1024}
        if key == "n_layer"
        else {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "num_attention_heads": 32,
              "intermediate_size": 11008}
    )  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, key: layers}))
    result = runner.invoke(app, ["memory", "--model", str(path), "--gpus", "8"])
    assert result.exit_code == 2
    assert f"{key} {layers} is not accepted; accepted: a whole number of layers from 1 to 512" in _one_line(
        result.stderr
    )


def test_a_model_beyond_the_params_bound_is_refused(tmp_path: Path) -> None:
    big = {"model_type": "llama", "vocab_size": 2**31 - 1, "hidden_size": 2**31 - 1, "num_hidden_layers": 2,
           "num_attention_heads": 1, "intermediate_size": 1}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(big))
    result = runner.invoke(app, ["memory", "--model", str(path)])
    assert result.exit_code == 2
    assert "accepted: a model of at most 10,000,000,000,000,000" in _one_line(result.stderr)


# ---------------------------------------------- bandwidths in a physical range, durations, headers
@pytest.mark.parametrize("rate", ["1e-30GB/s", "0.5MB/s", "7bit/s", "2000TB/s"])
@pytest.mark.parametrize("option", ["--intra-node-bw", "--inter-node-bw"])
def test_bandwidth_outside_the_physical_range_is_refused(option: str, rate: str) -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "16", option, rate])
    assert result.exit_code == 2
    assert "from 1 MB/s to 1 PB/s" in _one_line(result.stderr)
