"""`zerocalc validate frameworks` with real frameworks on 2 CPU processes (gloo): exact per-rank model states
and collectives.

Every strategy in fp32 and bf16-mixed with Adam on GPT-2 shrunk to odd sizes (hidden 63, vocabulary
1001: FSDP1 padding, FSDP2 uneven rows and ZeroRedundancyOptimizer's uneven partition all show), with 2
micro-batches synchronised only on the last; a Llama-family model (SwiGLU, RMSNorm, GQA, untied head) with
AdamW; a failing configuration that must not stop the others; torchrun with gradients synchronised every
micro-batch; and a world of four, two "nodes" of two, with HYBRID_SHARD (FSDP1) and HSDP (FSDP2). Refusals,
rendering, exit codes and the comparison are checked without processes in test_validate_cli.py and
test_validate_compare.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("torch")

from helpers import BIN, clean_env, run_zerocalc

from zerocalc.states.framework import STATE_LINES
from zerocalc.validate.config import PERTURB_ENV, STRATEGIES, TEST_FAIL_ENV

pytestmark = pytest.mark.slow


def _validate(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_zerocalc("validate", "frameworks", *args, env=clean_env(**extra))


def _state_lines(report: dict) -> list[dict]:
    return [line for c in report["configs"] for r in c["ranks"] for line in r["lines"] if line["model_state"]]


def _collectives(config: dict) -> dict[tuple[str, str, str], tuple[int, list[int]]]:
    """(op, phase, group) → (predicted calls, measured calls per rank), every kind checked call by call."""
    assert config["collectives"] and all(c["ok"] for c in config["collectives"]), config["collectives"]
    return {
        (c["op"], c["phase"], c["group"]): (c["predicted_calls"], c["measured_calls"])
        for c in config["collectives"]
    }


def test_every_strategy_and_precision_matches_exactly_per_rank() -> None:
    result = _validate("--nproc", "2", "--grad-accum", "2", "--grad-sync", "last", "--json")
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    progress = result.stderr.splitlines()  # piped: one plain line per configuration
    assert len(progress) == 14 and progress[0].startswith("zerocalc validate: ddp · fp32 · A=2 last: match (")
    assert progress[-1].endswith(", 14/14 configurations")
    report = json.loads(result.stdout)
    configs = {(c["strategy"], c["precision"]): c for c in report["configs"]}
    hybrid = {"fsdp1-hybrid-shard", "fsdp2-hsdp"}  # one node: left out of all
    assert set(configs) == {(s, p) for s in STRATEGIES if s not in hybrid for p in ("fp32", "bf16-mixed")}
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
    # the collectives of a step of 2 micro-batches, the first under no_sync / set_requires_gradient_sync
    both = [1, 1]  # a call per rank
    assert _collectives(configs[("ddp", "fp32")]) == {("all_reduce", "backward", "world"): (1, both)}
    zero1 = _collectives(configs[("zero1", "bf16-mixed")])
    assert zero1[("all_reduce", "backward", "world")] == (1, both)  # fp32 under autocast
    assert zero1[("broadcast", "after_step", "world")][0] == 36  # one per parameter tensor
    assert _collectives(configs[("fsdp1-shard-grad-op", "fp32")]) == {
        ("all_gather", "forward", "world"): (3, [3, 3]),  # kept gathered under no_sync: once per unit
        ("reduce_scatter", "backward", "world"): (3, [3, 3]),
    }
    assert _collectives(configs[("fsdp1-full-shard", "fp32")]) == {
        ("all_gather", "forward", "world"): (6, [6, 6]),  # 3 units × 2 micro-batches
        ("all_gather", "backward", "world"): (4, [4, 4]),  # not the root
        ("reduce_scatter", "backward", "world"): (3, [3, 3]),
    }
    assert _collectives(configs[("fsdp2-no-reshard", "fp32")])[("all_gather", "forward", "world")] == (
        6,
        [6, 6],
    )
    for config in configs.values():
        _collectives(config)


def test_llama_family_with_adamw_matches_and_renders_a_table() -> None:
    result = _validate(
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
    result = _validate("--strategies", "ddp,fsdp2", "--precision", "fp32", "--json", **extra)
    assert result.returncode == 1, result.stderr + result.stdout
    report = json.loads(result.stdout)
    ddp, fsdp2 = report["configs"]
    assert ddp["status"] == "failed" and ddp["error"].startswith("rank 1 ")
    assert fsdp2["status"] == "mismatch"
    off = [line for line in _state_lines(report) if not line["ok"]]
    assert [(line["line"], line["difference"]) for line in off] == [("params", -4), ("params", -4)]
    assert report["all_match"] is False


def test_under_torchrun_every_configuration_shares_one_world() -> None:
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "zerocalc", "validate",
         "frameworks", "--strategies", "fsdp1-shard-grad-op,zero1", "--precision", "fp32", "-A", "2",
         "--grad-sync", "every", "--json"],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)  # rank 0 alone prints
    assert report["world_size"] == 2
    assert [c["status"] for c in report["configs"]] == ["match", "match"]
    sgo, zero1 = (_collectives(c) for c in report["configs"])
    assert sgo[("all_gather", "forward", "world")] == (6, [6, 6])  # every micro-batch
    assert zero1[("all_reduce", "backward", "world")] == (2, [2, 2])


def test_world_of_four_with_tiny_sizes_where_a_rank_gets_no_rows() -> None:
    # hidden 9 over 4 ranks: torch.chunk gives 3, 3, 3 and 0 rows; ZeRO-1's greedy partition is lopsided;
    # 2 "nodes" of 2 ranks: HYBRID_SHARD and HSDP shard over a node and all-reduce across the 2 nodes
    result = _validate(
        "--nproc", "4", "-g", "2", "--hidden", "9", "--heads", "3", "--ffn", "10", "--vocab", "101",
        "--strategies", "fsdp2,zero1,fsdp1-hybrid-shard,fsdp2-hsdp", "--precision", "fp32", "-A", "2",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    report = json.loads(result.stdout)
    assert report["all_match"] is True
    for config in report["configs"][2:]:
        calls = _collectives(config)
        assert calls[("all_gather", "forward", "node")] == (6, [6] * 4)  # 3 units, 2 micro-batches
        assert calls[("all_reduce", "backward", "across_nodes")] == (6, [6] * 4)  # synchronised every time
    fsdp2 = [
        next(x["measured"] for x in r["lines"] if x["line"] == "params")
        for r in report["configs"][0]["ranks"]
    ]
    assert len(fsdp2) == 4 and fsdp2[3] < fsdp2[0]
