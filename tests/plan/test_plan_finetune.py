"""``zerocalc plan`` for a fine-tuning job (LoRA, QLoRA): the method given, fixed for every candidate;
the frameworks that run it, FSDP's CPU offload, recompute and the batch searched; the candidates counted
by hand, each one's requests the parser's, its bound its allocated peak, its row ``memory``'s peak and
``comm``'s step to the bit; the single-GPU QLoRA question answered; refusals in one line."""

from __future__ import annotations

import json
import random

import pytest
from helpers import (
    assert_row_is_comms,
    candidate_requests_or_error,
    one_line_error,
    parsed_candidate_or_error,
    plan_candidates,
)
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.cli.plan import command
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.strategies import OffloadTarget, StrategyName
from zerocalc.peak.simulate import runtime_for, simulate
from zerocalc.plan.allocated import _states
from zerocalc.plan.candidates import Bases
from zerocalc.plan.search import _exact, search
from zerocalc.plan.space import FINETUNE_FRAMEWORKS, enumerate_groups, plan_options
from zerocalc.request.training import parse_options

runner = CliRunner()

LORA = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=2048, lora_rank=16)
QLORA = dict(
    model="llama-3-8b", gpu="rtx-4090", gpus=2, global_batch="16seq", seq_len=2048, lora_rank=16,
    quantize="nf4", double_quant=True, quant_storage="bf16",
)  # fmt: skip
"""LoRA of Llama 3 8B on 8 H100; QLoRA (NF4, double quantisation, bf16 storage for FSDP) on 2 RTX 4090."""

QUESTION = ["plan", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--gpus", "1", "--global-batch", "16seq",
            "--seq-len", "2048", "--lora-rank", "16", "--quantize", "nf4"]  # fmt: skip
"""Issue 40's question: can I QLoRA Llama 3 8B on one 24 GB card, and how?"""


def test_the_frameworks_searched_are_those_whose_records_model_fine_tuning() -> None:
    """Without --framework: FSDP1, FSDP2 and DDP (PyTorch's accountings with PEFT); torch-zero1's partition,
    DeepSpeed's estimators and Megatron-LM (no PEFT) do not model it."""
    assert set(FINETUNE_FRAMEWORKS) == {Framework.FSDP, Framework.FSDP2, Framework.DDP}
    assert plan_options(**LORA).frameworks == FINETUNE_FRAMEWORKS
    every = plan_options(**LORA, frameworks="all").frameworks  # the ZeRO paper's accounting too
    assert set(every) == {Framework.PAPER, *FINETUNE_FRAMEWORKS}


def test_the_candidates_of_a_lora_plan_counted_by_hand() -> None:
    """2 RTX 4090, 16 sequences: b ∈ {1, 2, 4, 8} (A 8, 4, 2, 1); recompute none or full (selective =
    none under flash attention). FSDP1's NO_SHARD, SHARD_GRAD_OP and FULL_SHARD and FSDP2's SHARD_GRAD_OP
    and FULL_SHARD, FULL_SHARD with and without FSDP's CPU offload: 7 configurations, each reducing in
    bf16 or fp32, at b 8 (A 1) and at b 1, 2, 4 with grad sync every or last: 2 × 2 × (1 + 3·2) = 28
    candidates each. DDP reduces the autocast's fp32 gradients: 2 × (1 + 3·2) = 14. HYBRID_SHARD has no
    shard group below 2 GPUs. 7 · 28 + 14 = 210, every one running the LoRA given."""
    plan = plan_options(**{**QLORA, "quantize": None, "double_quant": None, "quant_storage": None})
    groups, rejected = enumerate_groups(plan, True)
    assert sum(len(g.micro_batches) for g in groups) == 210
    offloaded = {(g.framework, g.strategy) for g in groups if g.offload_params is OffloadTarget.CPU}
    assert offloaded == {(Framework.FSDP, StrategyName.ZERO3), (Framework.FSDP2, StrategyName.ZERO3)}
    assert all(g.offload_optimizer is OffloadTarget.NONE for g in groups)
    assert any(r.reason.startswith("hybrid_shard") for r in rejected)


@pytest.mark.parametrize("space", [LORA, QLORA], ids=["lora", "qlora"])
def test_every_finetune_candidates_requests_are_the_parsers(space: dict) -> None:
    """Every group's requests (the base varied by request.with_, the method the base's) equal those the
    parser gives the candidate's options, the fine-tuning options as given among them."""
    plan = plan_options(**space)
    groups, _ = enumerate_groups(plan, True)
    bases = Bases.of(plan)
    for group in groups:
        parsed = parsed_candidate_or_error(plan, group)
        assert not isinstance(parsed, str), parsed
        requests = candidate_requests_or_error(plan, group, bases)
        assert requests == parsed, group
        assert all(m.finetune == plan.base.finetune is not None for m, _ in requests.values())


@pytest.mark.parametrize("space", [LORA, QLORA], ids=["lora", "qlora"])
def test_a_finetune_candidates_bound_is_its_allocated_peak(space: dict) -> None:
    """The search's bound for a fine-tuning candidate, less the context and the communicators, is its
    whole step's allocated peak to the byte (the fine-tuning timeline: adapters, frozen and quantised
    weights, dequantisation transients), so it is at most memory's exact peak."""
    plan = plan_options(**space)
    resolver, candidates = plan_candidates(plan)
    for cand in random.Random(4).sample(candidates, 10):
        request = cand.request
        name = request.strategies[0]
        steady = simulate(request, name, runtime_for(request), _states(request), reserve=False)
        allocated = max(allocated for _, _, allocated in steady.events)
        assert cand.lower - resolver.outside(request) == allocated, cand.group
    for cand in random.Random(5).sample(candidates, 3):
        assert cand.lower <= _exact(cand.request).peak_bytes


@pytest.mark.parametrize("space", [LORA, QLORA], ids=["lora", "qlora"])
def test_lora_and_qlora_rows_are_memory_and_comm_to_the_bit(space: dict) -> None:
    """The top rows' peaks are memory's peak_bytes for their own options, and a sample of every priced
    candidate (frameworks, strategies, CPU offload, recompute, b, A, reduce dtypes, grad syncs) has comm's
    time and every field of its step to the bit."""

    result = search(plan_options(**space, top=3), keep_all=True)
    assert result.candidates is not None and len(result.top) == 3
    for row in result.top:
        assert row.memory_options["lora_rank"] == "16"
        assert _exact(parse_options(**row.memory_options)).peak_bytes == row.peak_bytes
    kinds = {(r.framework, r.strategy, r.offload_params) for r in result.candidates}
    assert len(kinds) == 8 if space is QLORA else len(kinds) >= 8
    for row in random.Random(9).sample(result.candidates, 20):
        assert_row_is_comms(row)


def test_the_single_gpu_qlora_question_prints_fitting_rows() -> None:
    """QLoRA of Llama 3 8B on one RTX 4090 (24 GB): the plan prints fitting rows, its heading names the
    method, each row's commands carry it, and the first row's memory command gives its peak (below the
    card's memory), its comm command its step."""
    text = runner.invoke(app, QUESTION)
    assert text.exit_code == 0, text.output
    assert "LoRA r 16 on an nf4 base" in text.stdout and "No configuration fits" not in text.stdout
    result = runner.invoke(app, [*QUESTION, "--json"])
    plan = json.loads(result.stdout)
    assert plan["request"]["method"] == "LoRA r 16 on an nf4 base"
    top = plan["top"][0]
    assert top["status"] == "ranked" and top["peak_bytes"] < plan["request"]["gpu_memory_bytes"]
    memory_line, comm_line = command("memory", top["memory_options"]), command("comm", top["comm_options"])
    assert "--lora-rank 16 --quantize nf4" in memory_line and "--lora-rank 16 --quantize nf4" in comm_line
    memory = runner.invoke(app, [*memory_line.split()[1:], "--json"])
    assert memory.exit_code == 0, memory.output
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]
    comm = runner.invoke(app, [*comm_line.split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    assert json.loads(comm.stdout)["strategies"][0]["step"]["step_s"] == top["step_s"]


def test_a_dora_rows_command_gives_its_flag() -> None:
    """--dora is a flag: the row's command gives it bare, and reproduces the row's peak."""
    result = runner.invoke(app, [*QUESTION[:-2], "--dora", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["top"][0]
    line = command("memory", top["memory_options"])
    assert line.endswith("--lora-rank 16 --dora") or " --dora " in line + " "
    memory = runner.invoke(app, [*line.split()[1:], "--json"])
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]


@pytest.mark.parametrize("switch", ["--no-kbit-prepare", "--no-autocast-adapter-dtype"])
def test_a_switch_turned_off_is_planned_off_and_its_rows_command_gives_it(switch: str) -> None:
    """A switch's off is given, not its default: the plan searches with it, the row's command gives it,
    and the command reproduces the row's peak, below the same row's with the switch left on."""
    result = runner.invoke(app, [*QUESTION, switch, "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["top"][0]
    line = command("memory", top["memory_options"])
    assert f" {switch}" in f"{line} "
    memory = runner.invoke(app, [*line.split()[1:], "--json"])
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]
    on = runner.invoke(app, [*line.replace(f" {switch}", "").split()[1:], "--json"])
    assert json.loads(on.stdout)["peak"]["strategies"][0]["peak_bytes"] > top["peak_bytes"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--lora-rank", "16", "--framework", "megatron,fsdp2"], "--framework megatron does not model"),
        (["--lora-rank", "16", "--framework", "torch-zero1"], "--framework torch-zero1 does not model"),
        (["--lora-rank", "16", "--tp", "1,2"], "--tp '1,2' with fine-tuning"),
        (["--quantize", "nf4"], "trained through adapters"),
        (["--lora-rank", "-1"], "--lora-rank"),
    ],
)
def test_bad_finetune_plans_are_one_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, [*QUESTION[:-4], *args])
    one_line_error(result, needle)
