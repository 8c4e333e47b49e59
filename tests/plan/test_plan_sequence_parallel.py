"""``zerocalc plan --sequence-parallel``: on by default for the TP candidates whose model code runs it,
fixed or searched when given, counted by hand, each row's commands carrying it and reproducing its peak
and step to the bit, and its refusals."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.cli.plan import command
from zerocalc.peak.simulate import flash_attention_used
from zerocalc.plan.search import search
from zerocalc.plan.space import NO_SEQUENCE_PARALLEL, enumerate_groups, plan_options

runner = CliRunner()

SPACE = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=2048, tp="2")
"""Llama 3 8B on one node of 8 H100 at t 2: d = 8/2 = 4 replicas of 16/4 = 4 sequences each."""

ARGS = ["--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--global-batch", "16seq",
        "--seq-len", "2048", "--framework", "megatron", "--tp", "1,2"]  # fmt: skip


def _groups(**space: object) -> list:
    plan = plan_options(**space)
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    return groups


@pytest.mark.parametrize(("given", "values"), [(None, {True}), ("on", {True}), ("off", {False}),
                                               ("on,off", {True, False})])  # fmt: skip
def test_the_candidates_of_each_setting_counted_by_hand(given: str | None, values: set[bool]) -> None:
    """Megatron-LM at t 2: b ∈ {1, 2, 4} (A 4, 2, 1); DDP (no offload) and ZeRO-1 (optimizer on the GPU or
    the host) are 3 configurations, recompute none or full (selective = none under flash attention): 3 × 2
    × 3 = 18 candidates per sequence-parallel value, 36 with on,off. Megatron-LM's code runs it, so the
    default is on, though `memory --framework megatron` leaves it off (Megatron-LM's own default)."""
    space = {**SPACE, "frameworks": "megatron"} | ({} if given is None else {"sequence_parallel": given})
    groups = _groups(**space)
    assert sum(len(g.micro_batches) for g in groups) == 18 * len(values)
    assert {g.sequence_parallel for g in groups} == values


def test_tp_1_candidates_run_none_and_transformers_code_none() -> None:
    """At t 1 there is no TP group to shard over; FSDP2 over transformers' code (its TP plans replicate
    the norms) runs none by default, and asked for on its TP candidates are left out, counted: FSDP2's
    SHARD_GRAD_OP, FULL_SHARD and HYBRID_SHARD (on the node, beside a TP mesh), each with recompute none
    and full, reduce in bf16 or fp32, b ∈ {1, 2, 4} with grad sync every, and last too where A > 1 (b 1
    and 2): 3 × 2 × 2 × (3 + 2) = 60 candidates."""
    space = {**SPACE, "frameworks": "fsdp2", "tp": "1,2"}
    assert not any(g.sequence_parallel for g in _groups(**space))
    plan = plan_options(**space, sequence_parallel="on")
    groups, rejected = enumerate_groups(plan, flash_attention_used(plan.base))
    assert {g.tp for g in groups} == {1}
    assert sum(r.count for r in rejected if r.reason == NO_SEQUENCE_PARALLEL) == 60
    on_tp2 = _groups(**space, model_impl="torchtitan", sequence_parallel="on")
    assert {(g.tp, g.sequence_parallel) for g in on_tp2} == {(1, False), (2, True)}


def test_a_sequence_parallel_rows_commands_reproduce_it_to_the_bit() -> None:
    """The top row at t 2 runs sequence parallelism (JSON, the table's tp2+sp), its memory and comm
    commands carry --sequence-parallel and give its peak and every field of its step."""
    result = runner.invoke(app, ["plan", *ARGS, "--tp", "2", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["top"][0]
    assert top["tp"] == 2 and top["sequence_parallel"] is True
    memory_line, comm_line = command("memory", top["memory_options"]), command("comm", top["comm_options"])
    assert "--sequence-parallel" in memory_line.split() and "--sequence-parallel" in comm_line.split()
    memory = runner.invoke(app, [*memory_line.split()[1:], "--json"])
    assert memory.exit_code == 0, memory.output
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]
    comm = runner.invoke(app, [*comm_line.split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    row = json.loads(comm.stdout)["strategies"][0]
    assert row["time_s"] == top["comm_s"]
    fields = ("compute_s", "elementwise_s", "exposed_comm_s", "step_s", "mfu")
    assert {f: row["step"][f] for f in fields} == {f: top[f] for f in fields}
    text = runner.invoke(app, ["plan", *ARGS, "--tp", "2", "--top", "1"])
    assert text.exit_code == 0 and "tp2+sp" in text.stdout


def test_the_top_row_is_not_beaten_by_its_own_sequence_parallel_twin() -> None:
    """Issue 42: a newcomer found plan's #1 beaten by the same row with --sequence-parallel. Searching
    both, the best row is at least as fast as the best with it off and as the best with it on; every
    row off has its twin on in the space, whose step is comm's for that row's commands with
    --sequence-parallel."""
    space = {**SPACE, "frameworks": "megatron", "tp": "1,2,4"}
    both = search(plan_options(**space, sequence_parallel="on,off", top=1)).top[0]
    off = search(plan_options(**space, sequence_parallel="off", top=1)).top[0]
    on = search(plan_options(**space, top=1)).top[0]
    assert both.step_s <= min(off.step_s, on.step_s)
    assert on.step_s <= off.step_s  # the default never loses to the old default here
    if off.tp > 1:
        from zerocalc.api import estimate_comm

        options = {**off.comm_options, "sequence_parallel": True}
        twin = estimate_comm(**options).strategies[0].step
        assert twin is not None and on.step_s <= twin.step_s


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tp", "2", "--sequence-parallel", "maybe"], "--sequence-parallel 'maybe' is not accepted"),
        (["--tp", "2", "--sequence-parallel", ""], "--sequence-parallel"),
        (["--tp", "1", "--sequence-parallel", "on"], "--tp with degrees of 2 or more"),
    ],
)
def test_bad_sequence_parallel_values_are_one_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["plan", *ARGS[:-2], *args])
    one_line_error(result, needle)
