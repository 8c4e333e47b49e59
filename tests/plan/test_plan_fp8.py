"""``zerocalc plan --fp8``: none by default (the presets' plans unchanged); ``auto`` searches none and every
recipe each framework's record runs, with its FP8 all-gather where it has one; the candidates counted by
hand, each one's requests the parser's, its bound its allocated peak, its row ``memory``'s peak and
``comm``'s step to the bit; a GPU without FP8 and bad values refused in one line."""

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
from zerocalc.parallel.fp8 import NO_FP8
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.parallel.strategies import StrategyName
from zerocalc.peak.simulate import runtime_for, simulate
from zerocalc.plan.allocated import _states
from zerocalc.plan.candidates import Bases
from zerocalc.plan.search import _exact, search
from zerocalc.plan.space import enumerate_groups, plan_options

runner = CliRunner()

SPACE = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=2048)
"""Llama 3 8B on one node of 8 H100, 16 sequences: b ∈ {1, 2} per GPU (A 2, 1)."""

ARGS = ["plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--global-batch", "16seq",
        "--seq-len", "2048"]  # fmt: skip


def _count(groups: list, **where: object) -> int:
    return sum(len(g.micro_batches) for g in groups if all(getattr(g.fp8, k) == v for k, v in where.items()))


def test_fp8_is_off_by_default() -> None:
    plan = plan_options(**SPACE, frameworks="megatron,fsdp2")
    groups, _ = enumerate_groups(plan, True)
    assert {g.fp8 for g in groups} == {NO_FP8}


def test_auto_candidates_counted_by_hand() -> None:
    """Megatron-LM at 8 GPUs: per FP8 setting DDP has b 1, 2 × recompute none, full = 4 candidates,
    ZeRO-1 (the distributed optimizer) 8 (its optimizer on the GPU or the host). Its record runs four
    Transformer Engine recipes (delayed, current, blockwise, mxfp8), of which an H100 (compute capability
    9.0) runs three (MXFP8 needs 10.0), each able to gather its parameters in FP8 (--fp8-param-gather),
    which needs the distributed optimizer: DDP 1 + 3 settings, ZeRO-1 1 + 3·2. 4·4 + 7·8 = 72, against
    4 + 8 = 12 without FP8; on a B200, 5·4 + 9·8 = 92."""
    plan = plan_options(**SPACE, frameworks="megatron", fp8="auto")
    groups, _ = enumerate_groups(plan, True)
    assert sum(len(g.micro_batches) for g in groups) == 72
    assert Fp8RecipeName.MXFP8 not in {g.fp8.recipe for g in groups}
    blackwell = plan_options(**{**SPACE, "gpu": "b200-180gb"}, frameworks="megatron", fp8="auto")
    assert sum(len(g.micro_batches) for g in enumerate_groups(blackwell, True)[0]) == 92
    assert _count(groups, recipe=Fp8RecipeName.NONE) == 12
    gathered = {g.strategy for g in groups if g.fp8.all_gather}
    assert gathered == {StrategyName.ZERO1}
    assert all(g.fp8.model_init for g in groups if g.fp8.all_gather)  # Megatron-LM keeps fp8 params
    assert {g.fp8.skip for g in groups if g.fp8.on} == {("output",)}  # its record's default


def test_a_list_searches_the_recipes_given_and_counts_those_a_framework_does_not_run() -> None:
    """--fp8 none,tensorwise under FSDP2 and Megatron-LM: FSDP2 (torchao) runs tensorwise, with and
    without its float8 all-gather; Megatron-LM (Transformer Engine) does not: its tensorwise candidates
    (DDP 4 + ZeRO-1 8) are left out under the parser's reason."""
    plan = plan_options(**SPACE, frameworks="megatron,fsdp2", fp8="none,tensorwise")
    groups, rejected = enumerate_groups(plan, True)
    on = {(g.framework.value, g.fp8.all_gather) for g in groups if g.fp8.on}
    assert on == {("fsdp2", False), ("fsdp2", True)}
    reasons = {r.reason for r in rejected if "tensorwise" in r.reason}
    assert len(reasons) == 1 and "--fp8" not in next(iter(reasons))  # concepts, named by the CLI
    assert sum(r.count for r in rejected if r.reason in reasons) == 12


@pytest.mark.parametrize("framework", ["megatron", "fsdp2"])
def test_every_fp8_candidates_requests_are_the_parsers(framework: str) -> None:
    """Every group's requests (the FP8 setting varied by request.with_) equal those the parser gives the
    candidate's options (--fp8 RECIPE [--fp8-all-gather]), the framework's skipped modules and kept FP8
    parameters its own."""
    plan = plan_options(**SPACE, frameworks=framework, fp8="auto")
    groups, _ = enumerate_groups(plan, True)
    bases = Bases.of(plan)
    for group in groups:
        parsed = parsed_candidate_or_error(plan, group)
        assert not isinstance(parsed, str), parsed
        assert candidate_requests_or_error(plan, group, bases) == parsed, group


def test_an_fp8_candidates_bound_is_its_allocated_peak() -> None:
    """FSDP2 with torchao's recipes, the float8 all-gather on and off: the search's bound less the context
    and the communicators is the whole step's allocated peak to the byte (the all-gather's scales taken
    from the whole timeline), and at most memory's exact peak."""
    plan = plan_options(**SPACE, frameworks="fsdp2", fp8="tensorwise,rowwise")
    resolver, cands = plan_candidates(plan)
    sample = [c for c in cands if c.request.fp8.all_gather][:4] + random.Random(3).sample(cands, 6)
    for cand in sample:
        request = cand.request
        name = request.strategies[0]
        steady = simulate(request, name, runtime_for(request), _states(request), reserve=False)
        assert cand.lower - resolver.outside(request) == max(a for _, _, a in steady.events), cand.group
    for cand in sample[:3]:
        assert cand.lower <= _exact(cand.request).peak_bytes


@pytest.mark.parametrize("framework", ["megatron", "fsdp2"])
def test_fp8_rows_are_memory_and_comm_to_the_bit(framework: str) -> None:
    """The top rows of --fp8 auto: memory's peak_bytes for their options; a sample of every candidate
    with an FP8 recipe (each recipe, gathered in FP8 or not): comm's time and every field of its step."""
    from zerocalc.request.training import parse_options

    result = search(plan_options(**SPACE, frameworks=framework, fp8="auto", top=2), keep_all=True)
    assert result.candidates is not None
    for row in result.top:
        assert _exact(parse_options(**row.memory_options)).peak_bytes == row.peak_bytes
    fp8 = [r for r in result.candidates if r.fp8 is not Fp8RecipeName.NONE]
    assert {r.fp8_all_gather for r in fp8} == {False, True}
    for row in random.Random(11).sample(fp8, 16):
        assert row.comm_options["fp8"] == row.fp8.value
        assert ("fp8_all_gather" in row.comm_options) is row.fp8_all_gather
        assert_row_is_comms(row)


def test_an_fp8_rows_commands_reproduce_it_through_the_cli() -> None:
    """The best Megatron-LM row with an FP8 recipe: the table names it (fp8 delayed+ag), its commands
    carry --fp8 and --fp8-all-gather and give its peak and step."""
    args = [*ARGS, "--framework", "megatron", "--fp8", "delayed", "--top", "1"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["top"][0]
    assert top["fp8"] == "delayed"
    memory_line, comm_line = command("memory", top["memory_options"]), command("comm", top["comm_options"])
    assert "--fp8 delayed" in memory_line and "--fp8 delayed" in comm_line
    assert ("--fp8-all-gather" in comm_line.split()) is top["fp8_all_gather"]
    memory = runner.invoke(app, [*memory_line.split()[1:], "--json"])
    assert memory.exit_code == 0, memory.output
    assert json.loads(memory.stdout)["peak"]["strategies"][0]["peak_bytes"] == top["peak_bytes"]
    comm = runner.invoke(app, [*comm_line.split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    assert json.loads(comm.stdout)["strategies"][0]["step"]["step_s"] == top["step_s"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and "fp8 delayed" in text.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--gpu", "a100-80gb", "--fp8", "auto"],
            "--fp8 'auto' on 'a100-80gb': its compute table has no FP8",
        ),
        (["--fp8", "float8"], "--fp8 'float8' is not accepted"),
        (["--fp8", ","], "--fp8"),
        (["--fp8", "tensorwise", "--lora-rank", "8"], "not modelled with fine-tuning"),
        (["--fp8", "delayed", "--framework", "fsdp2"], "fsdp2: it runs other recipes here"),
    ],
)
def test_bad_fp8_plans_are_one_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, [*ARGS, *args])
    one_line_error(result, needle)
