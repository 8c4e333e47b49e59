"""`zerocalc validate` with real frameworks on 2 CPU processes (gloo): exact per-rank model states.

Every strategy in fp32 and bf16-mixed with Adam on GPT-2 shrunk to odd sizes (hidden 63, vocabulary
1001: FSDP1 padding, FSDP2 uneven rows and ZeroRedundancyOptimizer's uneven partition all show), a
Llama-family model (SwiGLU, RMSNorm, GQA, untied head) with AdamW, a failing configuration that must not
stop the others, torchrun, and a world of four. Refusals, rendering and exit codes are checked without
processes in test_validate_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from zerocalc.framework_states import STATE_LINES
from zerocalc.validate.config import PERTURB_ENV, STRATEGIES, TEST_FAIL_ENV

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _zerocalc(*args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))
    }
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    return subprocess.run(
        [sys.executable, "-m", "zerocalc", "validate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _state_lines(report: dict) -> list[dict]:
    return [line for c in report["configs"] for r in c["ranks"] for line in r["lines"] if line["model_state"]]


def test_every_strategy_and_precision_matches_exactly_per_rank() -> None:
    result = _zerocalc("--nproc", "2", "--json")
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    progress = result.stderr.splitlines()  # piped: one plain line per configuration
    assert len(progress) == 14 and progress[0].startswith("zerocalc validate: ddp · fp32: match (")
    assert progress[-1].endswith(", 14/14 configurations")
    report = json.loads(result.stdout)
    configs = {(c["strategy"], c["precision"]): c for c in report["configs"]}
    assert set(configs) == {(s, p) for s in STRATEGIES for p in ("fp32", "bf16-mixed")}
    for config in configs.values():
        assert config["status"] == "match", config
        assert [r["rank"] for r in config["ranks"]] == [0, 1]
        for rank in config["ranks"]:
            lines = {line["line"]: line for line in rank["lines"]}
            assert set(STATE_LINES) <= set(lines)
            for name in STATE_LINES:
                assert lines[name]["measured"] == lines[name]["predicted"] > 0, (config["strategy"], name)
            after = lines["unsharded_after_forward"]
            if config["strategy"] in ("ddp", "zero1"):  # nothing sharded: not measured, predicted 0
                assert after["measured"] is None and after["ok"] is None and after["predicted"] == 0
            else:
                assert after["measured"] == after["predicted"]

    # the odd sizes show: uneven FSDP2 rows and ZeRO-1 partitions, FSDP1 padding
    def rank_bytes(strategy: str, line: str) -> list[int]:
        ranks = configs[(strategy, "fp32")]["ranks"]
        return [next(x["measured"] for x in r["lines"] if x["line"] == line) for r in ranks]

    assert len(set(rank_bytes("fsdp2", "params"))) == 2
    assert len(set(rank_bytes("zero1", "optimizer"))) == 2
    total = report["parameters"] * 4
    assert sum(rank_bytes("fsdp1-full-shard", "params")) > total == sum(rank_bytes("fsdp2", "params"))
    # bf16-mixed: the unsharded parameters after forward are half the fp32 bytes
    for strategy in ("fsdp1-shard-grad-op", "fsdp2-no-reshard"):
        fp32 = configs[(strategy, "fp32")]["ranks"][0]["lines"][-1]["measured"]
        bf16 = configs[(strategy, "bf16-mixed")]["ranks"][0]["lines"][-1]["measured"]
        assert fp32 == 2 * bf16 > 0


def test_llama_family_with_adamw_matches_and_renders_a_table() -> None:
    result = _zerocalc(
        "--model", "llama-3-8b", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
        "--ffn", "96", "--vocab", "1001", "--optimizer", "adamw", "--precision", "bf16-mixed",
        "--strategies", "zero1,fsdp1-full-shard",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    assert "2 configurations match, 0 mismatch, 0 failed" in result.stdout
    assert "fsdp1-full-shard · bf16-mixed" in result.stdout
    assert "✗" not in result.stdout
    assert "peak: not measurable on CPU" in result.stdout


def test_a_failing_configuration_is_reported_and_the_others_still_run() -> None:
    extra = {TEST_FAIL_ENV: "ddp", PERTURB_ENV: "params"}
    result = _zerocalc("--strategies", "ddp,fsdp2", "--precision", "fp32", "--json", **extra)
    assert result.returncode == 1, result.stderr + result.stdout
    report = json.loads(result.stdout)
    ddp, fsdp2 = report["configs"]
    assert ddp["status"] == "failed" and ddp["error"].startswith("rank 1 ")
    assert fsdp2["status"] == "mismatch"
    off = [line for line in _state_lines(report) if not line["ok"]]
    assert [(line["line"], line["difference"]) for line in off] == [("params", -4), ("params", -4)]
    assert report["all_match"] is False


def test_under_torchrun_every_configuration_shares_one_world() -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))
    }
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "zerocalc", "validate",
         "--strategies", "fsdp2,zero1", "--precision", "fp32", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)  # rank 0 alone prints
    assert report["world_size"] == 2
    assert [c["status"] for c in report["configs"]] == ["match", "match"]


def test_world_of_four_with_tiny_sizes_where_a_rank_gets_no_rows() -> None:
    # hidden 9 over 4 ranks: torch.chunk gives 3, 3, 3 and 0 rows; ZeRO-1's greedy partition is lopsided
    result = _zerocalc(
        "--nproc", "4", "--hidden", "9", "--heads", "3", "--ffn", "10", "--vocab", "101",
        "--strategies", "fsdp2,zero1", "--precision", "fp32", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    report = json.loads(result.stdout)
    assert report["all_match"] is True
    fsdp2 = [
        next(x["measured"] for x in r["lines"] if x["line"] == "params")
        for r in report["configs"][0]["ranks"]
    ]
    assert len(fsdp2) == 4 and fsdp2[3] < fsdp2[0]
