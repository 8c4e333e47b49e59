"""``zerocalc validate tp``: DTensor TP + FSDP2 on a dp × tp mesh, against a hand calculation per rank.

The default model of ``validate tp --tp 2`` is Llama shrunk to 2 layers, hidden 66 (6 heads of 11, 2 key/value
heads), MLP 174, vocabulary 1001, untied. torchtitan's plan shards over tp = 2: the embedding and the LM head
over the vocabulary (1001 → 501 | 500 rows, torch.chunk), q and k, v over their rows (66 → 33, 22 → 11),
gate and up over theirs (174 → 87), o and down over their columns (66 → 33, 174 → 87); the norms are
replicated. FSDP2 then chunks each tp-local tensor's dim 0 over dp = 2: 501 → 251 | 250, 500 → 250 | 250,
33 → 17 | 16, 11 → 6 | 5, 87 → 44 | 43, and o [66, 33], down [66, 87], the norms [66] → 33 | 33 rows.
Ranks: TP innermost, rank = 2·dp_rank + tp_rank.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import clean_env, run_zerocalc

from zerocalc.model.architecture import parameter_tensors
from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate.compare import compare
from zerocalc.validate.config import STRATEGIES, Job, Measured, TpPlan
from zerocalc.validate.run import resolve_architecture
from zerocalc.validate.tp import predicted_tp_calls, predicted_tp_states, tp_predictions

ARCH = resolve_architecture(None, {}, tp=2)
PLAN = TpPlan(dp=2, tp=2)
FSDP2 = STRATEGIES["fsdp2"][2]
NO_RESHARD = STRATEGIES["fsdp2-no-reshard"][2]

# Elements each rank holds, tensor by tensor (embedding, per block: input norm, q, k, v, o, post norm, gate,
# up, down; final norm, LM head).
BLOCK_DP0 = 33 + 17 * 66 + 6 * 66 + 6 * 66 + 33 * 33 + 33 + 44 * 66 + 44 * 66 + 33 * 87  # 11,748
BLOCK_DP1 = 33 + 16 * 66 + 5 * 66 + 5 * 66 + 33 * 33 + 33 + 43 * 66 + 43 * 66 + 33 * 87  # 11,418
LOCAL = [
    251 * 66 + 2 * BLOCK_DP0 + 33 + 251 * 66,  # rank 0: dp 0, tp 0 (vocab rows 0-250 of 501)
    250 * 66 + 2 * BLOCK_DP0 + 33 + 250 * 66,  # rank 1: dp 0, tp 1 (250 of 500)
    250 * 66 + 2 * BLOCK_DP1 + 33 + 250 * 66,  # rank 2: dp 1, tp 0 (250 of 501)
    250 * 66 + 2 * BLOCK_DP1 + 33 + 250 * 66,  # rank 3: dp 1, tp 1
]
HAND_PARAMS = [4 * n for n in LOCAL]
"""fp32 bytes per rank: 226,644, 226,116, 223,476, 223,476."""
TENSORS = 1 + 2 * 9 + 2
# The all-gather output of each FSDP2 unit: tp-local tensors with dim 0 padded to a multiple of dp = 2.
ROOT_GATHERED = [502 * 66 + 66 + 502 * 66, 500 * 66 + 66 + 500 * 66]  # by tp rank: 66,330, 66,066
BLOCK_GATHERED = 66 + 34 * 66 + 12 * 66 + 12 * 66 + 66 * 33 + 66 + 88 * 66 + 88 * 66 + 66 * 87  # 23,496
TOKENS = 2 * 16 * 66
"""b·s·h of the validate step (b 2, s 16): the activations a TP collective moves."""


def test_the_hand_calculation_per_rank() -> None:
    assert HAND_PARAMS == [226_644, 226_116, 223_476, 223_476]
    for rank in range(4):
        for precision, forward_bytes in ((PrecisionName.FP32, 4), (PrecisionName.BF16_MIXED, 2)):
            states = predicted_tp_states(ARCH, FSDP2, PLAN, rank, precision, "adam")
            assert states.params.bytes == states.grads.bytes == HAND_PARAMS[rank]
            assert states.optimizer_states.bytes == 2 * HAND_PARAMS[rank]  # exp_avg, exp_avg_sq
            assert states.step.bytes == 4 * TENSORS
            root = ROOT_GATHERED[rank % 2]
            assert states.unsharded_after_forward.bytes == forward_bytes * root
            kept_all = predicted_tp_states(ARCH, NO_RESHARD, PLAN, rank, precision, "adamw")
            assert kept_all.unsharded_after_forward.bytes == forward_bytes * (root + 2 * BLOCK_GATHERED)


def test_the_local_shards_cover_the_model_once_per_dp_replica() -> None:
    """Over the two ranks of a dp replica's tp group the shards are the model, the five norms (66 each)
    once per tp rank; FSDP2 splits each over the two dp ranks."""
    total = sum(t.numel for t in parameter_tensors(ARCH))
    assert total == 224_598
    assert sum(LOCAL) == total + 5 * 66


def _calls(rank: int, plan: TpPlan, precision: str = "fp32", setup=FSDP2) -> list[tuple]:
    return [
        (c.op, c.phase, c.dtype, c.group, c.elements)
        for c in predicted_tp_calls(ARCH, setup, plan, rank, PrecisionName(precision), 2, 16)
    ]


def test_the_collectives_of_sequence_parallel_and_loss_parallel_in_order() -> None:
    """Per block in forward: all-gather the attention input, reduce-scatter o_proj's output, the same for
    the MLP; in backward the reverse, then an all-reduce of each norm weight's gradient (h = 66) before the
    block's reduce-scatter over dp. The cross entropy all-reduces b·(s−1) = 30 fp32 three times."""
    block_fwd = [
        ("all_gather", "forward", "fp32", "dp", BLOCK_GATHERED),
        ("all_gather", "forward", "fp32", "tp", TOKENS),
        ("reduce_scatter", "forward", "fp32", "tp", TOKENS),
        ("all_gather", "forward", "fp32", "tp", TOKENS),
        ("reduce_scatter", "forward", "fp32", "tp", TOKENS),
    ]
    block_bwd = [
        ("all_gather", "backward", "fp32", "tp", TOKENS),
        ("reduce_scatter", "backward", "fp32", "tp", TOKENS),
        ("all_gather", "backward", "fp32", "tp", TOKENS),
        ("reduce_scatter", "backward", "fp32", "tp", TOKENS),
        ("all_reduce", "backward", "fp32", "tp", 66),
        ("all_reduce", "backward", "fp32", "tp", 66),
        ("reduce_scatter", "backward", "fp32", "dp", BLOCK_GATHERED),
    ]
    gather_block = ("all_gather", "backward", "fp32", "dp", BLOCK_GATHERED)
    for rank in range(4):
        root = ROOT_GATHERED[rank % 2]
        assert _calls(rank, PLAN) == [
            ("all_gather", "forward", "fp32", "dp", root),
            ("reduce_scatter", "forward", "fp32", "tp", TOKENS),  # the embedding's vocab-partial output
            *block_fwd,
            *block_fwd,
            ("all_gather", "forward", "fp32", "tp", TOKENS),  # the LM head's input
            *[("all_reduce", "forward", "fp32", "tp", 30)] * 3,
            gather_block,  # the root's pre-backward prefetches the last block
            ("reduce_scatter", "backward", "fp32", "tp", TOKENS),
            gather_block,  # the last block's pre-backward prefetches the first
            *block_bwd,
            *block_bwd,
            ("all_gather", "backward", "fp32", "tp", TOKENS),  # the embedding output's gradient
            ("all_reduce", "backward", "fp32", "tp", 66),  # the final norm's
            ("reduce_scatter", "backward", "fp32", "dp", root),
        ]


def test_without_sequence_parallel_two_all_reduces_per_block_each_way() -> None:
    """Megatron-LM's f and g: o_proj's and down_proj's outputs all-reduced in forward, the attention's and
    the MLP's input gradients in backward; the logits gathered over the padded vocabulary 2 × 501; bf16
    activations and all-gathers, fp32 reduce-scatters; no resharding: no all-gather in backward."""
    plan = TpPlan(dp=2, tp=2, sequence_parallel=False, loss_parallel=False)
    calls = _calls(3, plan, "bf16-mixed", NO_RESHARD)
    tp = [c for c in calls if c[3] == "tp"]
    assert tp == [
        ("all_reduce", "forward", "bf16", "tp", TOKENS),  # the embedding
        *[("all_reduce", "forward", "bf16", "tp", TOKENS)] * 4,
        ("all_gather", "forward", "bf16", "tp", 2 * 16 * 1002),
        ("all_reduce", "backward", "bf16", "tp", TOKENS),  # the LM head's input gradient
        *[("all_reduce", "backward", "bf16", "tp", TOKENS)] * 4,
    ]
    dp = [c for c in calls if c[3] == "dp"]
    assert dp == [
        ("all_gather", "forward", "bf16", "dp", 66_066),
        *[("all_gather", "forward", "bf16", "dp", BLOCK_GATHERED)] * 2,
        *[("reduce_scatter", "backward", "fp32", "dp", BLOCK_GATHERED)] * 2,
        ("reduce_scatter", "backward", "fp32", "dp", 66_066),
    ]


def _job(**plan: bool) -> Job:
    return Job(arch=ARCH, strategy="fsdp2", precision="fp32", optimizer="adam", backend="gloo",
               timeout_s=60.0, tp_plan=TpPlan(dp=2, tp=2, **plan))  # fmt: skip


def _perfect(job: Job) -> list[Measured]:
    from conftest import perfect_tp_run

    return perfect_tp_run(job)


def test_calls_are_matched_in_order_and_by_kind() -> None:
    job = _job()
    states, calls = tp_predictions(job)
    good = _perfect(job)
    result = compare(job, states, calls, good, 1.0)
    assert (result.status, result.call_order_ok, result.call_order_note) == ("match", True, None)
    kinds = {(c.op, c.phase, c.group): (c.predicted_calls, c.predicted_bytes) for c in result.collectives}
    # an all-gather sends (n−1)/n of S·4 B per rank, S the root's (by tp rank) and two blocks'
    sent = [(root + 2 * BLOCK_GATHERED) * 4 // 2 for root in ROOT_GATHERED]
    assert kinds[("all_gather", "forward", "dp")] == (3, sent * 2)
    assert kinds[("all_reduce", "forward", "tp")] == (3, [3 * 30 * 4] * 4)  # 2(n−1)/n·S = S at n = 2
    # two calls of rank 2 swapped: the same multiset per kind, out of order
    swapped = list(good[2].collectives)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    moved = [*good[:2], good[2].model_copy(update={"collectives": swapped}), good[3]]
    result = compare(job, states, calls, moved, 1.0)
    assert result.status == "mismatch" and result.call_order_ok is False
    assert all(c.ok for c in result.collectives)
    assert result.call_order_note == (
        "rank 2 call 2: predicted reduce_scatter forward fp32 over tp, S 2,112, measured all_gather forward "
        "fp32 over dp, S 23,496"
    )
    # a call over the wrong group is off
    wrong = list(good[0].collectives)
    wrong[0] = wrong[0].model_copy(update={"group_ranks": [0, 1]})
    result = compare(job, states, calls, [good[0].model_copy(update={"collectives": wrong}), *good[1:]], 1.0)
    assert result.status == "mismatch"
    off = {(c.op, c.phase, c.group) for c in result.collectives if not c.ok}
    assert ("all_gather", "forward", "tp") in off


@pytest.mark.parametrize(
    ("sizes", "says"),
    [
        ({"num_heads": 3, "hidden_size": 66, "num_kv_heads": 1}, "--heads 3 is not a multiple of --tp 2"),
        ({"num_kv_heads": 1}, "--kv-heads 1 is not a multiple of --tp 2"),
        ({"intermediate_size": 175}, "--ffn 175 is not a multiple of --tp 2"),
    ],
)
def test_sizes_tp_cannot_split_are_refused(sizes: dict[str, int], says: str) -> None:
    from zerocalc.base.errors import InputError
    from zerocalc.validate.tp import check_tp

    with pytest.raises(InputError, match=says):
        check_tp(resolve_architecture(None, sizes, tp=2), PLAN, ["fsdp2"], 1)


# ---------------------------------------------------------------------------------- real processes


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch")
    return run_zerocalc("validate", "tp", "--nproc", "4", "--tp", "2", *args, "--json", env=clean_env())


@pytest.mark.slow
def test_a_real_2x2_mesh_matches_the_hand_calculation_to_the_byte() -> None:
    result = _run()
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    report = json.loads(result.stdout)
    assert report["tp_plan"] == {"dp": 2, "tp": 2, "sequence_parallel": True, "loss_parallel": True}
    titles = [(c["strategy"], c["precision"]) for c in report["configs"]]
    assert titles == [(s, p) for s in ("fsdp2-no-reshard", "fsdp2") for p in ("fp32", "bf16-mixed")]
    for config in report["configs"]:
        assert config["status"] == "match" and config["call_order_ok"] is True, config
        forward_bytes = 4 if config["precision"] == "fp32" else 2
        for rank in config["ranks"]:
            lines = {line["line"]: line["measured"] for line in rank["lines"]}
            r = rank["rank"]
            root = ROOT_GATHERED[r % 2]
            kept = root if config["strategy"] == "fsdp2" else root + 2 * BLOCK_GATHERED
            assert lines == {
                "params": HAND_PARAMS[r], "grads": HAND_PARAMS[r], "optimizer": 2 * HAND_PARAMS[r],
                "step": 4 * TENSORS, "unsharded_after_forward": forward_bytes * kept,
            }  # fmt: skip
        calls = {(c["op"], c["phase"], c["group"]): (c["predicted_calls"], c["measured_calls"])
                 for c in config["collectives"]}  # fmt: skip
        assert calls[("all_gather", "forward", "tp")] == (5, [5] * 4)  # 2 per block + the LM head's input
        assert calls[("reduce_scatter", "forward", "tp")] == (5, [5] * 4)  # 2 per block + the embedding
        assert calls[("all_reduce", "backward", "tp")] == (5, [5] * 4)  # the 5 norm weights
        assert calls[("all_reduce", "forward", "tp")] == (3, [3] * 4)  # loss_parallel's cross entropy


@pytest.mark.slow
def test_a_real_2x2_mesh_without_sequence_or_loss_parallel() -> None:
    result = _run("--no-sequence-parallel", "--no-loss-parallel", "--strategies", "fsdp2",
                  "--precision", "bf16-mixed")  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    (config,) = json.loads(result.stdout)["configs"]
    assert config["status"] == "match" and config["call_order_ok"] is True
    calls = {
        (c["op"], c["phase"], c["dtype"], c["group"]): c["measured_calls"] for c in config["collectives"]
    }
    assert calls == {
        ("all_gather", "forward", "bf16", "dp"): [3] * 4,
        ("all_reduce", "forward", "bf16", "tp"): [5] * 4,  # the embedding + 2 per block
        ("all_gather", "forward", "bf16", "tp"): [1] * 4,  # the logits
        ("all_gather", "backward", "bf16", "dp"): [2] * 4,
        ("all_reduce", "backward", "bf16", "tp"): [5] * 4,  # the LM head's input + 2 per block
        ("reduce_scatter", "backward", "fp32", "dp"): [3] * 4,
    }
    params = [next(x["measured"] for x in r["lines"] if x["line"] == "params") for r in config["ranks"]]
    assert params == HAND_PARAMS  # the norms stay plain tensors, sharded over dp only: the same bytes


def test_the_validate_schedule_is_the_cores_tensor_parallel_collectives() -> None:
    """The TP calls validate matches the real run against, summed by collective and phase, are the analytic
    core's (``zerocalc comm``'s mesh collectives for the same model, mesh, b and s) but for the loss: the
    validate model's cross-entropy scores the s − 1 shifted positions, torchtitan's the s pre-shifted
    labels, so loss_parallel's three all-reduces carry b·(s − 1) values in one and b·s in the other."""
    from collections import Counter

    from zerocalc.api import estimate_comm

    b, s = 2, 16
    validate: Counter = Counter()
    for call in predicted_tp_calls(ARCH, FSDP2, PLAN, 0, PrecisionName.FP32, b, s):
        if call.group == "tp":
            validate[(call.op, call.phase)] += call.elements
    estimate = estimate_comm(
        model=ARCH, gpus=4, tp=2, framework="fsdp2", strategies="zero3", precision="fp32", micro_batch=b,
        seq_len=s, sequence_parallel=True,
    )  # fmt: skip
    core: Counter = Counter()
    for row in estimate.strategies[0].mesh_collectives:
        if row.dimension.value == "tp":
            core[(row.op.value, row.phase.value)] += sum(row.elements) * row.times_per_step
    assert core[("all_reduce", "forward")] - validate[("all_reduce", "forward")] == 3 * b
    core[("all_reduce", "forward")] -= 3 * b
    assert core == validate
