"""`zerocalc validate pipeline`, `validate expert` and `validate pipeline --fake` with real torch (gloo on
CPU processes, or fake tensors): every stage's model states, every send and receive in 1F1B order, every
all-to-all of the expert-parallel layer, exactly, and the figures against hand calculations.

The default model of `validate pipeline` is GPT-2 shrunk to hidden 63 (3 heads), MLP 252, vocabulary 1,001,
learned positions 1,024, its head untied: a block is 2 × 126 (LayerNorms) + 4 × (63 × 63 + 63) (q, k, v, o
with biases) + 63 × 252 + 252 + 252 × 63 + 63 = 48,447 elements; the embeddings 1,001 × 63 + 1,024 × 63 =
127,575; the final norm 126 and the head 1,001 × 63 = 63,063. Micro-batches of b = 2 × s = 16.
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("torch")

from helpers import clean_env, run_zerocalc

pytestmark = pytest.mark.slow

BLOCK, EMBEDDINGS, HEAD = 48_447, 127_575, 126 + 63_063
HIDDEN_STATES = 2 * 16 * 63  # one micro-batch crossing a stage boundary


def _validate(*args: str) -> subprocess.CompletedProcess[str]:
    return run_zerocalc("validate", *args, "--json", env=clean_env(), timeout=900)


def _report(*args: str) -> dict:
    result = _validate(*args)
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    return json.loads(result.stdout)


def _line(stage: dict, name: str) -> int:
    (line,) = [x for x in stage["lines"] if x["line"] == name]
    assert line["measured"] == line["predicted"], (stage["rank"], line)
    return line["measured"]


def test_two_stages_on_two_ranks_hold_their_tensors_and_send_each_micro_batch_once() -> None:
    report = _report("pipeline", "--nproc", "2", "--pp", "2")
    assert [(c["strategy"], c["precision"]) for c in report["configs"]] == [
        (s, p) for s in ("none", "ddp", "fsdp2") for p in ("fp32", "bf16-mixed")
    ]
    for config in report["configs"]:
        assert config["status"] == "match" and config["microbatches"] == 4, config
        first, last = config["stages"]
        assert _line(first, "params") == _line(first, "grads") == (EMBEDDINGS + BLOCK) * 4 == 704_088
        assert _line(last, "params") == (BLOCK + HEAD) * 4 == 446_544
        assert _line(first, "optimizer") == 2 * 704_088
        assert _line(first, "step") == (2 + 16) * 4 and _line(last, "step") == (16 + 3) * 4  # one per tensor
        bf16 = config["strategy"] == "fsdp2" and config["precision"] == "bf16-mixed"
        each = HIDDEN_STATES * (2 if bf16 else 4)  # FSDP2 sends bf16 blocks' output; autocast keeps fp32
        for stage in config["stages"]:
            assert stage["p2p_in_order"]
            assert {(c["op"], c["phase"]): c["measured_calls"] for c in stage["p2p"]} == (
                {("send", "forward"): 4, ("recv", "backward"): 4}
                if stage["stage"] == 0
                else {("recv", "forward"): 4, ("send", "backward"): 4}
            )
            assert {c["bytes_per_call"] for c in stage["p2p"]} == {each}
            assert all(c["measured_bytes"] == 4 * each for c in stage["p2p"])
            assert stage["reduction_ok"] is None  # one rank per stage
        assert last["loss"] is not None and first["loss"] is None


def test_two_stages_of_two_data_parallel_ranks_reduce_their_gradients_once() -> None:
    report = _report("pipeline", "--nproc", "4", "--pp", "2", "--strategies", "ddp,fsdp2", "-A", "3")
    for config in report["configs"]:
        assert config["status"] == "match", config
        ranks = {stage["rank"]: stage for stage in config["stages"]}
        assert [ranks[r]["stage"] for r in range(4)] == [0, 0, 1, 1]  # pp outermost
        assert {c["peer"] for c in ranks[1]["p2p"]} == {3} and {c["peer"] for c in ranks[2]["p2p"]} == {0}
        assert all(stage["reduction_ok"] is True for stage in config["stages"])
        assert all(c["measured_calls"] == 3 for stage in config["stages"] for c in stage["p2p"])
        if config["strategy"] == "fsdp2":
            # dim 0 split in chunks of ceil(d0/2): the embeddings' 1,001 rows 501 / 500 and 1,024 rows
            # 512 / 512; in the block every 63 rows 32 / 31 and fc_in's 252 rows 126 / 126, so rank 0 holds
            # 4 × 32 (norms) + 4 × 32 × 63 + 4 × 32 (q, k, v, o) + 126 × 63 + 126 + 32 × 252 + 32 of it
            block = [4 * 32 + 4 * 32 * 63 + 4 * 32 + 126 * 63 + 126 + 32 * 252 + 32,
                     4 * 31 + 4 * 31 * 63 + 4 * 31 + 126 * 63 + 126 + 31 * 252 + 31]  # fmt: skip
            assert _line(ranks[0], "params") == (501 * 63 + 512 * 63 + block[0]) * 4 == 353_196
            assert _line(ranks[1], "params") == (500 * 63 + 512 * 63 + block[1]) * 4 == 350_892
        else:
            assert _line(ranks[0], "params") == _line(ranks[1], "params") == 704_088


def test_four_stages_order_the_middle_stages_sends_as_1f1b_does() -> None:
    report = _report(
        "pipeline", "--nproc", "4", "--pp", "4", "--layers", "4", "--strategies", "none", "--precision",
        "fp32",
    )  # fmt: skip
    (config,) = report["configs"]
    assert config["status"] == "match" and config["microbatches"] == 8
    middle = config["stages"][1]
    assert middle["p2p_in_order"] and sum(c["measured_calls"] for c in middle["p2p"]) == 4 * 8
    assert _line(middle, "params") == BLOCK * 4


def test_uneven_stages_hold_the_blocks_megatron_gives_them() -> None:
    # 3 blocks over 2 stages, the first given 1: the last holds the other 2 (Megatron-LM
    # get_num_layers_to_build); fp32, DDP over one rank per stage
    report = _report(
        "pipeline", "--nproc", "2", "--pp", "2", "--layers", "3", "--pp-first-stage-layers", "1",
        "--strategies", "ddp", "--precision", "fp32",
    )  # fmt: skip
    (config,) = report["configs"]
    assert config["status"] == "match" and report["stage_blocks"] == [1, 2]
    first, last = config["stages"]
    assert _line(first, "params") == (EMBEDDINGS + BLOCK) * 4 == 704_088
    assert _line(last, "params") == (2 * BLOCK + HEAD) * 4 == 640_332
    assert all(c["measured_bytes"] == 4 * HIDDEN_STATES * 4 for s in config["stages"] for c in s["p2p"])


@pytest.mark.parametrize(("nproc", "ep"), [(4, 4), (4, 2)])
def test_expert_parallel_all_to_alls_send_what_the_fixed_router_says(nproc: int, ep: int) -> None:
    report = _report("expert", "--nproc", str(nproc), "--ep", str(ep))
    assert [c["status"] for c in report["configs"]] == ["match", "match"]
    balanced, skewed = report["configs"]
    tokens, hidden = 2 * 64, 64
    for rank in balanced["ranks"]:
        counts, dispatch, combine, combine_back, dispatch_back = rank["calls"]
        rows = 2 * tokens // ep  # k·b·s choices, a round robin over the experts
        assert dispatch["measured_splits"] == [rows * hidden] * ep
        out = (ep - 1) * rows * hidden * 4  # = k·b·s·h·4·(e − 1)/e
        assert dispatch["measured_bytes"] == combine["measured_bytes"] == out
        assert out == 2 * tokens * hidden * 4 * (ep - 1) // ep
        assert combine_back["measured_bytes"] == dispatch_back["measured_bytes"] == out
        assert counts["measured_bytes"] == (ep - 1) * 2 * 8  # E/e int64 counts to each other rank
        assert rank["params"]["measured"] == 2 * 2 * 64 * 96 * 4
    for rank in skewed["ranks"]:  # every token to the first rank of its group
        dispatch = rank["calls"][1]
        first = rank["rank"] % ep == 0
        assert dispatch["measured_bytes"] == (0 if first else 2 * tokens * hidden * 4)


def test_fake_stages_hold_exactly_their_states_and_buffers() -> None:
    report = _report("pipeline", "--fake", "--pp", "2", "--world", "2,8", "-b", "2", "-s", "16")
    assert len(report["stages"]) == 2 * 2 * 2  # worlds × precisions × stages
    for stage in report["stages"]:
        assert all(line["ok"] for line in stage["lines"]), stage
        case, figures = stage["case"], stage["figures"]
        bf16 = case["precision"] == "bf16-mixed"
        buffer = -(-HIDDEN_STATES * (2 if bf16 else 4) // 512) * 512
        logits = -(-2 * 16 * 1_001 * (2 if bf16 else 4) // 512) * 512
        tokens = 4 * 2 * 16 * 8  # 1,024 B: two blocks
        if case["stage"] == 0:
            assert figures["at_start"]["Activation"] == 4 * buffer + tokens
            assert stage["outputs_kept"] is None
        else:
            assert figures["at_start"]["Activation"] == 4 * buffer + tokens + 4 * logits
            assert stage["outputs_kept"]["measured"] == 4 * logits  # every output kept when step returns
        assert figures["peak"] > figures["start"] > figures["params"] + figures["optimizer"]


def test_fake_four_stages() -> None:
    report = _report("pipeline", "--fake", "--pp", "4", "--world", "8", "--layers", "4", "--precision",
                     "fp32", "-b", "2", "-s", "16")  # fmt: skip
    assert [s["case"]["stage"] for s in report["stages"]] == [0, 1, 2, 3]
    assert all(line["ok"] for s in report["stages"] for line in s["lines"])
    # 1F1B: stage i has min(m, P − i) micro-batches in flight at its peak; stages 1 and 2 hold one block
    # each, so beyond their receive buffers they hold 3 and 2 micro-batches' activations of that block
    held = [
        s["figures"]["at_peak"]["Activation"] - s["figures"]["at_start"]["Activation"]
        for s in report["stages"]
    ]
    assert held[1] * 2 == held[2] * 3 > 0
    middle = report["stages"][1]["figures"]
    assert middle["at_start"]["Activation"] == 2 * 8 * 8_192  # m = 8 buffers each way, 8,064 B → 8,192
    block = 4 * 32 + 4 * 32 * 63 + 4 * 32 + 126 * 63 + 126 + 32 * 252 + 32  # rank 2: dp rank 0's shard
    assert middle["params"] == block * 4 == 97_920
