"""`zerocalc validate frameworks --lora-rank 8` with real frameworks on 2 CPU processes (gloo): PEFT 0.21's
LoRA of validate's Llama shrunk to odd sizes (hidden 33, 3 heads of 11, 1 key/value head, MLP 87,
vocabulary 1001, 2 layers, untied head), trained under DDP and FSDP2 in fp32 and bf16-mixed (the base
loaded in bf16 there, the adapters fp32), every rank's states and every collective exactly as predicted.

Hand counts (PEFT's default Llama targets q_proj and v_proj, r = 8): per layer q's lora_A 8 × 33 and
lora_B 33 × 8 (528) and v's lora_A 8 × 33 and lora_B 11 × 8 (352), 1,760 trained elements in all, 7,040
fp32 bytes; the frozen base 2 × 1001 × 33 (embedding, head) + 33 (final norm) + 2 × 11,583 per layer =
89,265 elements. FSDP2 splits each adapter's rows: rank 0 gets 4, 17, 4 and 6 rows (448 elements a layer),
rank 1 4, 16, 4 and 5 (432). Refusals are checked without processes in test_validate_cli.py."""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from helpers import clean_env, run_zerocalc

pytestmark = pytest.mark.slow

TRAINED = 2 * (8 * 33 + 33 * 8 + 8 * 33 + 11 * 8)
FROZEN = 2 * 1001 * 33 + 33 + 2 * (2 * 33 + 2 * 33 * 33 + 2 * 11 * 33 + 3 * 33 * 87)
FSDP2_TRAINED = (2 * (4 * 33 + 17 * 8 + 4 * 33 + 6 * 8), 2 * (4 * 33 + 16 * 8 + 4 * 33 + 5 * 8))


def _validate(*args: str) -> subprocess.CompletedProcess[str]:
    return run_zerocalc("validate", "frameworks", *args, env=clean_env())


def _line(config: dict, rank: int, name: str) -> int:
    return next(x["measured"] for x in config["ranks"][rank]["lines"] if x["line"] == name)


def test_fsdp2_and_ddp_with_lora_match_every_rank_exactly() -> None:
    result = _validate("--nproc", "2", "--strategies", "fsdp2,ddp", "--lora-rank", "8", "--json")
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads(result.stdout)
    assert report["all_match"] is True
    configs = {(c["strategy"], c["precision"]): c for c in report["configs"]}
    assert set(configs) == {(s, p) for s in ("fsdp2", "ddp") for p in ("fp32", "bf16-mixed")}
    for (strategy, precision), config in configs.items():
        assert config["status"] == "match", config
        for rank in config["ranks"]:
            assert all(x["ok"] for x in rank["lines"] if x["model_state"]), rank
        frozen_bytes = 4 if precision == "fp32" else 2  # the base loaded in bf16 under bf16-mixed
        for r in (0, 1):
            trained = TRAINED if strategy == "ddp" else FSDP2_TRAINED[r]
            assert _line(config, r, "params") == _line(config, r, "grads") == 4 * trained
            assert _line(config, r, "optimizer") == 2 * 4 * trained  # Adam's two fp32 states
            assert _line(config, r, "step") == 8 * 4  # one counter per adapter tensor
            if strategy == "ddp":
                assert _line(config, r, "frozen") == FROZEN * frozen_bytes
        calls = {(c["op"], c["phase"], c["dtype"]): c for c in config["collectives"]}
        assert all(c["ok"] for c in calls.values()), config["collectives"]
        if strategy == "ddp":  # one bucket of the trained gradients, in fp32
            assert set(calls) == {("all_reduce", "backward", "fp32")}
            assert calls[("all_reduce", "backward", "fp32")]["measured_bytes"] == [4 * TRAINED] * 2
        else:  # the 2 blocks and the root gathered; only the blocks hold gradients to reduce-scatter
            ag = "fp32" if precision == "fp32" else "bf16"
            assert calls[("all_gather", "forward", ag)]["measured_calls"] == [3, 3]
            assert calls[("all_gather", "backward", ag)]["measured_calls"] == [2, 2]
            assert calls[("reduce_scatter", "backward", "fp32")]["measured_calls"] == [2, 2]


def test_a_modules_to_save_copy_is_trained_in_bf16_beside_fp32_adapters() -> None:
    # bf16-mixed: PEFT deep-copies lm_head (1001 × 33) as the base was loaded, bf16, and torch's Adam keeps
    # bf16 states of it; the r-4 adapters (per layer q 4·33 + 33·4, v 4·33 + 11·4: 880 elements) stay fp32;
    # DDP's reducer puts each dtype in buckets of its own: one bf16 and one fp32 all-reduce
    result = _validate(
        "--nproc", "2", "--strategies", "fsdp2,ddp", "--precision", "bf16-mixed", "--lora-rank", "4",
        "--modules-to-save", "lm_head", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads(result.stdout)
    assert [c["status"] for c in report["configs"]] == ["match", "match"]
    copy, adapters = 1001 * 33 * 2, 2 * (4 * 33 + 33 * 4 + 4 * 33 + 11 * 4) * 4
    ddp = report["configs"][1]
    for r in (0, 1):
        assert _line(ddp, r, "params") == _line(ddp, r, "grads") == copy + adapters
        assert _line(ddp, r, "optimizer") == 2 * (copy + adapters)
    calls = {(c["op"], c["dtype"]): c["measured_bytes"] for c in ddp["collectives"]}
    assert calls == {("all_reduce", "bf16"): [copy] * 2, ("all_reduce", "fp32"): [adapters] * 2}


# FSDP1 under PEFT's fsdp_auto_wrap_policy at r = 3 (odd adapters, so the padding shows): each adapter
# Linear its own flat parameter (per layer q's lora_A 3 × 33 and lora_B 33 × 3, v's lora_A 3 × 33 and
# lora_B 11 × 3: 99, 99, 99, 33 elements, padded to 100, 100, 100, 34, half on each rank); the frozen
# units the 2 blocks (11,583 elements each, padded to 11,584) and the root (embedding, final norm, head:
# 66,099, padded to 66,100)
ADAPTERS_R3 = [99, 99, 99, 33] * 2
ROOT, BLOCK = 2 * 1001 * 33 + 33, 2 * 33 + 2 * 33 * 33 + 2 * 11 * 33 + 3 * 33 * 87


def _padded(numel: int) -> int:
    return numel + numel % 2


def test_fsdp1_with_peft_wrap_policy_matches_every_rank_and_collective_exactly() -> None:
    result = _validate(
        "--nproc", "2", "--strategies", "fsdp1-full-shard,fsdp1-shard-grad-op,fsdp1-no-shard",
        "--lora-rank", "3", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads(result.stdout)
    assert report["all_match"] is True
    configs = {(c["strategy"], c["precision"]): c for c in report["configs"]}
    trained_shard = sum(_padded(n) for n in ADAPTERS_R3) // 2  # 334 elements a rank
    frozen_shard = (_padded(ROOT) + 2 * _padded(BLOCK)) // 2
    assert (trained_shard, frozen_shard) == (334, 44634)
    for (strategy, precision), config in configs.items():
        assert config["status"] == "match", config
        sharded = strategy != "fsdp1-no-shard"
        trained = trained_shard if sharded else sum(ADAPTERS_R3)
        frozen = frozen_shard if sharded else ROOT + 2 * BLOCK
        base_bytes = 4 if precision == "fp32" else 2
        for r in (0, 1):
            assert _line(config, r, "params") == _line(config, r, "grads") == 4 * trained
            assert _line(config, r, "optimizer") == 2 * 4 * trained
            assert _line(config, r, "step") == 8 * 4  # one counter per adapter flat parameter
            assert _line(config, r, "frozen") == frozen * base_bytes
        calls = {(c["op"], c["phase"]): c for c in config["collectives"]}
        assert all(c["ok"] for c in calls.values()), config["collectives"]
        if not sharded:  # one all-reduce per adapter unit, unpadded, in fp32
            assert calls[("all_reduce", "backward")]["measured_calls"] == [8, 8]
            assert calls[("all_reduce", "backward")]["measured_bytes"] == [4 * sum(ADAPTERS_R3)] * 2
            continue
        gather = 4 if precision == "fp32" else 2  # MixedPrecision's bf16 for adapters and base alike
        everything = sum(_padded(n) for n in ADAPTERS_R3) + _padded(ROOT) + 2 * _padded(BLOCK)
        assert calls[("all_gather", "forward")]["measured_calls"] == [11, 11]  # root, 2 blocks, 8 adapters
        assert calls[("all_gather", "forward")]["measured_bytes"] == [everything // 2 * gather] * 2
        if strategy == "fsdp1-full-shard":  # every unit but the root re-gathered
            assert calls[("all_gather", "backward")]["measured_calls"] == [10, 10]
        else:
            assert ("all_gather", "backward") not in calls
        assert calls[("reduce_scatter", "backward")]["measured_calls"] == [8, 8]  # the adapters only
        assert calls[("reduce_scatter", "backward")]["measured_bytes"] == [4 * trained_shard] * 2
