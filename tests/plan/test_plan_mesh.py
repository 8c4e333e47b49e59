"""``zerocalc plan`` over tensor, context and pipeline parallelism: each row's degrees and the commands
that reproduce it, the divisibility rules counted per reason, derived requests equal to the parser's, the
bubble and exposed mesh communication in the step time, and the lower bound below the exact peak."""

from __future__ import annotations

import json
import random

import pytest
from helpers import (
    assert_row_is_comms,
    candidate_requests_or_error,
    one_line_error,
    parsed_candidate_or_error,
)
from typer.testing import CliRunner

from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.cli.plan import command
from zerocalc.parallel.strategies import STRATEGIES
from zerocalc.peak.report import Verdict
from zerocalc.peak.simulate import flash_attention_used, runtime_for, simulate
from zerocalc.plan.allocated import _states
from zerocalc.plan.candidates import Bases
from zerocalc.plan.search import Status, _exact, _Resolver, _Setting, search
from zerocalc.plan.space import enumerate_groups, plan_options
from zerocalc.request.training import TrainingRequest, parse_options

runner = CliRunner()

MESH = ["--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--global-batch", "16seq",
        "--seq-len", "2048", "--framework", "megatron,fsdp2"]  # fmt: skip
"""Llama 3 8B on one node of 8 H100, 16 sequences of 2,048 tokens per step."""


def _plan_json(args: list[str]) -> dict:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_mesh_rows_printed_commands_reproduce_it() -> None:
    """tp 2 × pp 2: the top row carries its degrees, its memory command gives its peak, its comm command
    its communication, and its step adds the 1F1B bubble (p−1)/m of the compute (Narayanan et al. 2021)."""
    args = [*MESH, "--tp", "2", "--pp", "2", "--top", "1"]
    plan = _plan_json(args)
    top = plan["top"][0]
    assert (top["tp"], top["pp"], top["cp"], top["vpp"], top["ep"]) == (2, 2, 1, 1, 1)
    assert top["memory_options"]["tp"] == "2" and top["memory_options"]["pp"] == "2"
    assert top["comm_options"]["tp"] == "2" and top["comm_options"]["pp"] == "2"
    # d = 8 / (2·2) = 2 replicas: b·A·2 = 16 sequences
    assert top["micro_batch"] * top["grad_accum"] * 2 == 16
    text = runner.invoke(app, ["plan", *args])
    assert text.exit_code == 0
    assert "tp2" in text.stdout and "pp2" in text.stdout
    memory_line = command("memory", top["memory_options"])
    memory = runner.invoke(app, [*memory_line.split()[1:], "--json"])
    assert memory.exit_code == 0, memory.output
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]
    comm = runner.invoke(app, [*command("comm", top["comm_options"]).split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    row = json.loads(comm.stdout)["strategies"][0]
    assert row["time_s"] == top["comm_s"]
    # the step is comm's own: compute, exposed DP/TP/PP communication, the 1F1B bubble
    assert row["step"]["step_s"] == top["step_s"] and row["step"]["bubble_s"] == top["bubble_s"] > 0
    assert row["step"]["exposed_tp_s"] > 0
    assert top["step_s"] == pytest.approx(
        top["compute_s"] + top["bubble_s"] + top["exposed_comm_s"] + top["offload_s"]
    )


def test_the_interleaved_bubble_is_divided_by_the_virtual_stages() -> None:
    """pp 2 with v 1 and v 2 (interleaved 1F1B, A a multiple of p): at the same b and A the interleaved
    bubble is the 1F1B one over v, (p−1)/(v·m) against (p−1)/m of the slowest stage's compute."""
    args = [*MESH, "--framework", "megatron", "--pp", "2", "--top", "1", "--objective", "memory"]
    one = _plan_json(args)["top"][0]
    two = _plan_json([*args, "--vpp", "2"])["top"][0]
    assert (two["pp"], two["vpp"]) == (2, 2) and two["grad_accum"] % 2 == 0
    assert two["memory_options"]["vpp"] == "2"
    if (one["micro_batch"], one["grad_accum"]) == (two["micro_batch"], two["grad_accum"]):
        assert two["bubble_s"] == pytest.approx(one["bubble_s"] / 2, rel=0.05)
    assert two["bubble_s"] > 0


def test_a_pipeline_of_shorter_end_stages_reproduces() -> None:
    """Llama 3 8B's 32 layers over p 3 do not split evenly: Megatron-LM's uneven split with the first and
    last stages shorter, 10, 12, 10 (32 = 3·12 − 2·2), carried by the row's commands, which reproduce its
    peak and step."""
    args = ["--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "24", "--global-batch", "24seq",
            "--seq-len", "2048", "--framework", "megatron", "--pp", "3", "--top", "1"]  # fmt: skip
    top = _plan_json(args)["top"][0]
    assert top["pp"] == 3
    for options in (top["memory_options"], top["comm_options"]):
        assert (options["pp_first_stage_layers"], options["pp_last_stage_layers"]) == ("10", "10")
    memory_line = command("memory", top["memory_options"])
    assert "--pp-first-stage-layers 10 --pp-last-stage-layers 10" in memory_line
    memory = json.loads(runner.invoke(app, [*memory_line.split()[1:], "--json"]).stdout)
    peak = memory["peak"]["strategies"][0]
    assert peak["peak_bytes"] == top["peak_bytes"]
    assert [s["layers"] for s in peak["stages"]] == [[[0, 9]], [[10, 21]], [[22, 31]]]
    comm = runner.invoke(app, [*command("comm", top["comm_options"]).split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    assert json.loads(comm.stdout)["strategies"][0]["step"]["step_s"] == top["step_s"]


def test_rejected_meshes_are_counted_per_reason() -> None:
    """Llama 3 8B: 32 heads, 8 KV heads, 32 layers. On 8-GPU nodes up to 16 GPUs (8 and 16 searched):
    t 16 spans nodes, t 3 too (3 does not divide 8), p 5 does not divide the layers at 8 GPUs nor does
    it divide 8 or 16 GPUs (t·c·p first), so each is counted once per number of GPUs."""
    plan = _plan_json(
        ["--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--global-batch", "32seq",
         "--seq-len", "2048", "--framework", "megatron", "--tp", "1,3,16", "--pp", "1,5", "--top", "1"]
    )  # fmt: skip
    reasons = {r["reason"]: r["candidates"] for r in plan["rejections"]}
    # (t, p) at 8 and 16 GPUs: (1,5) (3,1) (3,5) (16,1) (16,5) fail t·c·p | N where 8 or 16 is not a
    # multiple of 3 or 5: (1,5)×2, (3,1)×2, (3,5)×2, (16,5)×2; (16,1) at 8 GPUs too. (16,1) at 16 GPUs
    # divides: its TP group spans the nodes.
    assert reasons["mesh: t·c·p does not divide the GPUs (meshes)"] == 9
    assert reasons["mesh: a TP group would span nodes (t does not divide the node) (meshes)"] == 1
    assert all(row["tp"] == 1 and row["pp"] == 1 for row in plan["top"])


def test_every_mesh_candidates_requests_are_the_parsers() -> None:
    """A sample of a TP × PP × CP × v space under every framework: the candidates' requests (the plan's
    base varied by request.with_, the mesh mesh_of's) equal the parsed ones, or both give the same line."""
    plan = plan_options(
        model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="64seq", seq_len=4096, frameworks="all",
        tp="1,2,4,8", pp="auto", cp="1,2", vpp="1,2",
    )  # fmt: skip
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    meshed = [g for g in groups if g.model_parallel]
    assert len(meshed) > 1000
    errors = 0
    bases = Bases.of(plan)  # each group's requests varied from the last accepted one's, as search does
    for group in random.Random(30).sample(meshed, 150):
        parsed = parsed_candidate_or_error(plan, group)
        errors += isinstance(parsed, str)
        assert candidate_requests_or_error(plan, group, bases) == parsed, group
    assert errors > 10  # frameworks without pipeline or context parallelism refused as the parser does


@pytest.mark.parametrize(
    "space",
    [
        dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=2048,
             frameworks="megatron,fsdp2", tp="1,2,4", pp="1,2"),
        dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=8192,
             frameworks="megatron,fsdp2", tp="1,2", pp="2,4"),
        dict(model="qwen1.5-moe-a2.7b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=4096,
             frameworks="megatron,fsdp2", pp="2,4", ep="1,2"),
    ],
    ids=["tp-pp", "pp-long-sequences", "moe-pp"],
)  # fmt: skip
def test_a_mesh_candidates_lower_bound_is_below_its_exact_peak(space: dict) -> None:
    """The walk skips a model-parallel candidate whose lower bound is above the limit: on evaluated
    candidates of TP × PP spaces (pipelined ones without recompute bounded by their first stage's
    in-flight activations) the bound is at most memory's exact peak."""
    plan = plan_options(**space, objective="memory", top=3)
    result = search(plan, keep_all=True)
    assert result.candidates is not None
    meshed = [r for r in result.candidates if r.tp * r.pp * r.ep > 1]
    pipelined = [r for r in meshed if r.pp > 1 and r.recompute.value == "none"]
    assert len(pipelined) >= 8
    rows = random.Random(1).sample(meshed, 8) + random.Random(2).sample(pipelined, 8)
    for row in rows:
        exact = _exact(parse_options(**row.memory_options))
        assert row.peak_lower_bound_bytes <= exact.peak_bytes, row
    assert any(r.status is Status.RANKED for r in result.candidates)


def _tag(row) -> str:  # type: ignore[no-untyped-def]
    names = (("tp", row.tp), ("cp", row.cp), ("pp", row.pp), ("v", row.vpp), ("ep", row.ep))
    return " ".join(f"{name}{degree}" for name, degree in names if degree > 1)


def _group_of(plan, row):  # type: ignore[no-untyped-def]
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    for group in groups:
        same = (
            group.framework is row.framework and group.strategy is row.strategy and group.world == row.gpus
            and group.recompute is row.recompute and group.reduce_dtype == row.reduce_dtype
            and group.grad_sync == row.grad_sync and group.offload_optimizer is row.offload_optimizer
            and group.offload_params is row.offload_params and group.prefetch == row.prefetch
            and group.mesh_tag() == _tag(row)
            and row.micro_batch in group.micro_batches and group.gpus_per_node == row.gpus_per_node
        )  # fmt: skip
        if same:
            return group._replace(micro_batches=(row.micro_batch,))
    raise AssertionError(row)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tp", "two"], "--tp"),
        (["--pp", "0"], "--pp"),
        (["--cp", ""], "--cp"),
    ],
)
def test_bad_degrees_are_one_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["plan", *MESH, *args])
    one_line_error(result, needle)


@pytest.mark.parametrize(
    "space",
    [
        dict(model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="32seq", seq_len=4096,
             frameworks="megatron,fsdp2", tp="2,4", cp="1,2"),
        dict(model="qwen1.5-moe-a2.7b", gpu="h100-80gb", gpus=8, global_batch="32seq", seq_len=2048,
             frameworks="megatron,fsdp2", ep="2,4"),
    ],
    ids=["tp-cp", "ep"],
)  # fmt: skip
def test_without_pipeline_stages_a_mesh_candidates_bound_is_its_allocated_peak(space: dict) -> None:
    """A tensor-, context- or expert-parallel rank's steady step is one timeline: the search's bound for
    it, less the context and the communicators, is that timeline's allocated peak to the byte (the whole
    rank's simulation, every layer and event), from the step's parts of its rank's model."""
    plan = plan_options(**space)
    setting = _Setting.of(plan)
    groups, _ = enumerate_groups(plan, setting.flash)
    resolver = _Resolver(plan, setting)
    candidates = []
    for group in groups:
        if group.model_parallel:
            members = resolver.candidates(group)
            if not isinstance(members, InputError):
                candidates += members
    assert len(candidates) > 50
    for cand in random.Random(2).sample(candidates, 8):
        request = cand.request
        name = request.strategies[0]
        steady = simulate(request, name, runtime_for(request), _states(request), reserve=False)
        allocated = max(allocated for _, _, allocated in steady.events)
        assert cand.lower - resolver.outside(cand.request) == allocated, cand.group


def test_unpriced_candidates_change_no_row() -> None:
    """Without the list of every candidate a model-parallel candidate whose bound is above the fit limit
    gets no step time (it cannot be ranked); the rows and the rejections are those of the search that
    prices every candidate, and that search gives every candidate a step time."""
    plan = plan_options(
        model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="32seq", seq_len=8192,
        frameworks="megatron,fsdp2", tp="1,2,4", cp="1,2", pp="1,2",
    )  # fmt: skip
    pruned, listed = search(plan), search(plan, keep_all=True)
    assert listed.candidates is not None
    assert [r.model_dump() for r in pruned.top] == [r.model_dump() for r in listed.top]
    assert pruned.rejections == listed.rejections
    limit = 0.95 * plan.base.gpu_memory_bytes
    above = [r for r in listed.candidates if r.tp * r.cp * r.pp > 1 and r.peak_lower_bound_bytes > limit]
    assert len(above) > 100 and all(r.step_s > 0 for r in listed.candidates)


def test_an_end_stage_over_the_memory_settles_a_pipelined_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk rejects a pipelined candidate whose first or last stage alone exceeds the GPU's memory
    without evaluating its other stages, first from the stages' allocated peaks alone (no allocator
    replay), then from their exact rows: the rows and the rejections are those of evaluating every stage,
    and wherever the allocated peaks reject a candidate its end stages' exact rows do."""
    plan = plan_options(
        model="llama-3-8b", gpu="a100-40gb", gpus=8, global_batch="64seq", seq_len=4096,
        frameworks="megatron", tp="2", pp="2,4",
    )  # fmt: skip
    import zerocalc.plan.search as plan_search

    ends, allocated_over = plan_search._end_stages, plan_search._allocated_over
    settled: list[bool] = []
    over: list[TrainingRequest] = []

    def counted(request: TrainingRequest) -> dict:
        rows = ends(request)
        settled.append(any(row.verdict is Verdict.DOES_NOT_FIT for row in rows.values()))
        return rows

    def seen(request: TrainingRequest) -> bool:
        if allocated_over(request):
            over.append(request)
            return True
        return False

    monkeypatch.setattr(plan_search, "_end_stages", counted)
    monkeypatch.setattr(plan_search, "_allocated_over", seen)
    quick = search(plan)
    assert len(over) >= 3 and len(settled) >= 1  # rejected by allocated peaks alone; then exact rows
    for request in over:
        assert any(row.verdict is Verdict.DOES_NOT_FIT for row in ends(request).values())
    monkeypatch.setattr(plan_search, "_allocated_over", lambda request: False)
    monkeypatch.setattr(plan_search, "_end_stages", lambda request: {})
    whole = search(plan)
    assert [r.model_dump() for r in quick.top] == [r.model_dump() for r in whole.top]
    assert quick.rejections == whole.rejections


def test_a_mesh_candidates_step_pays_its_offload() -> None:
    """A model-parallel candidate that offloads its optimizer pays what its rank moves and updates on the
    host (Megatron-Core's optimizer CPU offload: its fp32 main gradients to the host, 4 bytes, and the bf16
    parameters back, 2, over PCIe; CPU Adam; docs/planner.md's assumptions): its twin without offload, less
    the optimizer step the GPU no longer runs, plus the offload seconds of its rank's parameters over its
    dp × cp ranks, CPU Adam's over the host memory that every GPU of its node (tensor- and
    pipeline-parallel ranks too) steps its own shard in."""
    plan = plan_options(
        model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="32seq", seq_len=4096,
        frameworks="megatron", tp="2,4", pp="1,2",
    )  # fmt: skip
    rows = search(plan, keep_all=True).candidates
    assert rows is not None
    twins = {}
    for row in rows:
        key = (row.strategy, row.gpus, row.tp, row.pp, row.micro_batch, row.recompute, row.reduce_dtype,
               row.grad_sync, row.prefetch)  # fmt: skip
        twins.setdefault(key, {})[row.offload_optimizer.value] = row
    pairs = [(t["none"], t["cpu"]) for t in twins.values() if {"none", "cpu"} <= t.keys()]
    assert len(pairs) > 5
    for plain, offloaded in pairs[:5]:
        request = parse_options(**offloaded.memory_options)
        owned = request.rank_model.params / request.cluster.group_size(
            STRATEGIES[offloaded.strategy].optimizer
        )
        by_hand = owned * (4 + 2) / 25e9 + owned * 8 * 30 / 100e9  # the node's 8 GPUs share its host
        assert offloaded.offload_s == pytest.approx(by_hand) and by_hand > 0
        assert offloaded.optimizer_s == 0 < plain.optimizer_s
        assert offloaded.step_s == pytest.approx(plain.step_s - plain.optimizer_s + offloaded.offload_s)


@pytest.mark.parametrize(
    ("model", "code"),
    [("llama-3-8b", ["--framework", "fsdp2", "--model-impl", "torchtitan"]),
     ("gpt2", ["--framework", "megatron", "--model-impl", "megatron", "--tp", "2", "--flash-attention"])],
    ids=["torchtitan", "megatron-flash"],
)  # fmt: skip
def test_the_model_code_and_kernel_given_to_plan_reach_the_printed_commands(
    model: str, code: list[str]
) -> None:
    """``--model-impl`` and ``--flash-attention`` shape every candidate's activations and compute (GPT-2
    under Megatron-LM's code is eager by default); the rows' memory and comm options carry them, and the
    printed commands give the row's peak and step."""
    args = ["--model", model, "--gpu", "h100-80gb", "--gpus", "8", "--global-batch", "16seq",
            "--seq-len", "1024", "--top", "1", *code]  # fmt: skip
    top = _plan_json(args)["top"][0]
    default = _plan_json(args[: -2 if "torchtitan" in code else -1])["top"][0]
    assert (top["peak_bytes"], top["step_s"]) != (default["peak_bytes"], default["step_s"])
    expected = {"model_impl": "torchtitan"} if "torchtitan" in code else {"flash_attention": "true"}
    for options in (top["memory_options"], top["comm_options"]):
        assert expected.items() <= options.items()
    memory = runner.invoke(app, [*command("memory", top["memory_options"]).split()[1:], "--json"])
    assert memory.exit_code == 0, memory.output
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]
    comm = runner.invoke(app, [*command("comm", top["comm_options"]).split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    assert json.loads(comm.stdout)["strategies"][0]["step"]["step_s"] == top["step_s"]


@pytest.mark.parametrize(
    "space",
    [
        dict(model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="64seq", seq_len=4096,
             frameworks="megatron,fsdp2", tp="1,2,4", cp="1,2", pp="1,2,4", vpp="1,2"),
        dict(model="qwen1.5-moe-a2.7b", gpu="h100-80gb", gpus=8, global_batch="32seq", seq_len=2048,
             frameworks="megatron,fsdp2", tp="1,2", ep="2,4", pp="1,2"),
        dict(model="gemma-3-1b", gpu="rtx-4090", gpus=16, global_batch="32seq", seq_len=4096,
             frameworks="paper", cp="1,2", pp="1,2"),
    ],
    ids=["tp-cp-pp-vpp", "ep", "tied-embedding-pp"],
)  # fmt: skip
def test_every_mesh_candidates_step_is_comms_to_the_bit(space: dict) -> None:
    """A sample of every priced model-parallel candidate (its strategies, micro-batches, accumulations,
    reduce dtypes, grad syncs, offloads): comm's time and step for the candidate's own command, every
    field equal to the bit (the search shares parts of the pricing across candidates; ``comm`` prices
    each request from scratch). Gemma 3 1B's tied embedding is synchronised between the first and the last
    pipeline stage in the reduce dtype (its 262,144-row table: the pipeline's largest message)."""

    rows = search(plan_options(**space), keep_all=True).candidates
    assert rows is not None
    meshed = [r for r in rows if r.tp * r.cp * r.pp * r.ep > 1]
    assert len(meshed) > 100
    kinds = {(r.framework, r.strategy, r.reduce_dtype, r.grad_sync, r.offload_optimizer) for r in meshed}
    assert len(kinds) > 4
    for row in random.Random(7).sample(meshed, 40):
        assert_row_is_comms(row)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--gpus", "8", "--global-batch", "64seq", "--tp", "3"],
         "--tp 3 leaves nothing to search on 8 GPUs (8 a node): t·c·p does not divide the GPUs"),
        (["--gpus", "16", "--global-batch", "64seq", "--tp", "3", "--pp", "3"],
         "--tp 3 --pp 3 leave nothing to search on 8, 16 GPUs"),
        (["--gpus", "8", "--global-batch", "3seq"],
         "--global-batch 3 sequences leaves nothing to search on 8 GPUs (8 a node): GPU counts not dividing "
         "the global batch"),
    ],
)  # fmt: skip
def test_options_that_leave_nothing_to_search_are_refused(args: list[str], fragment: str) -> None:
    """``plan --tp 3`` on nodes of 8: no number of GPUs searched takes a TP group of 3, so there is no
    candidate at all; one line naming the degree and why, exit 2 (never 'No configuration fits', exit 0)."""
    result = runner.invoke(app, ["plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", *args])
    one_line_error(result, fragment)
