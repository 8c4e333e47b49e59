"""``zerocalc plan``'s memory savers (``--loss``, ``--optimizer-in-backward``) for a fine-tuning job: searched
by default with fine-tuning, not for full training; each candidate with one refused where memory's parser
refuses it; tried only where the candidate without it does not fit, yet the ranking the one trying every
saver everywhere gives; a saver row's peak ``memory``'s own for its printed options."""

from __future__ import annotations

import random

import pytest
from helpers import assert_row_is_comms, one_line_error, plan_candidates
from typer.testing import CliRunner

from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.model.code import LossImpl
from zerocalc.parallel.frameworks import Framework
from zerocalc.peak.simulate import runtime_for, simulate
from zerocalc.plan.allocated import _states
from zerocalc.plan.search import _exact, search
from zerocalc.plan.space import plain_savers, plan_options, saver_twins
from zerocalc.request.training import parse_options

SAVERS = dict(model="llama-3-8b", gpu="rtx-4090", gpus=1, global_batch="16seq", seq_len=8192, lora_rank=16,
              quantize="nf4")  # fmt: skip
"""QLoRA of Llama 3 8B at 8,192 tokens on one RTX 4090: b = 2 fits only with a saver of the logits."""
TWO = {**SAVERS, "gpus": 2, "global_batch": "8seq", "seq_len": 4096}
"""The same on two GPUs at 4,096 tokens: DDP, FSDP1 and FSDP2 searched."""


def test_full_training_plans_search_no_saver() -> None:
    plan = plan_options(model="gpt2", gpu="rtx-4090", gpus=1, global_batch="8seq", seq_len=1024)
    assert (plan.losses, plan.optimizer_in_backward) == ((LossImpl.FULL,), (False,))


def test_finetuning_plans_search_every_saver_by_default_and_take_lists() -> None:
    plan = plan_options(**SAVERS)
    assert plan.losses == (LossImpl.FULL, LossImpl.CHUNKED, LossImpl.FUSED_LINEAR)
    assert plan.optimizer_in_backward == (False, True)
    assert plain_savers(plan) == (LossImpl.FULL, False)
    asked = plan_options(**SAVERS, loss="chunked, fused-linear", optimizer_in_backward="on")
    assert (asked.losses, asked.optimizer_in_backward) == ((LossImpl.CHUNKED, LossImpl.FUSED_LINEAR), (True,))
    assert plain_savers(asked) == (LossImpl.CHUNKED, True)


@pytest.mark.parametrize(
    ("options", "named"),
    [(dict(loss="bogus"), "--loss 'bogus' is not accepted; accepted: auto"), (dict(loss=","), "--loss"),
     (dict(optimizer_in_backward="maybe"), "--optimizer-in-backward 'maybe'")],
)  # fmt: skip
def test_a_bad_saver_value_is_one_line_naming_it(options: dict, named: str) -> None:
    with pytest.raises(InputError):
        plan_options(**SAVERS, **options)
    assert named in one_line_error(CliRunner().invoke(app, ["plan", *_cli(SAVERS), *_cli(options)]))


def _cli(options: dict) -> list[str]:
    return [part for name, value in options.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def test_a_saver_is_chosen_where_the_plain_candidate_does_not_fit_and_its_row_is_memorys_peak() -> None:
    """The fastest fit is b = 2 with Liger's fused-linear loss (b = 2 with the full loss's logits does not
    fit): faster than the best plan without savers; each row's peak is memory's for the options it prints
    (``--loss fused-linear``), its step comm's."""
    result = search(plan_options(**SAVERS, top=3))
    best = result.top[0]
    assert best.loss is LossImpl.FUSED_LINEAR and best.micro_batch == 2
    assert best.memory_options["loss"] == "fused-linear" and best.comm_options["loss"] == "fused-linear"
    for row in result.top:
        assert row.memory_options.get("loss", "full") == row.loss.value
        assert _exact(parse_options(**row.memory_options)).peak_bytes == row.peak_bytes
        assert_row_is_comms(row)
    plain = search(plan_options(**SAVERS, top=1, loss="full", optimizer_in_backward="off")).top[0]
    assert plain.loss is LossImpl.FULL and plain.step_s > best.step_s


def test_trying_savers_only_where_needed_ranks_as_trying_them_everywhere() -> None:
    """The walk's rows equal those of the search that tries every saver on every candidate (the JSON's
    full list): a saver changes no step time, so it can only rank where the plain candidate does not fit."""
    plan = plan_options(**SAVERS, top=4)
    lazy, every = search(plan), search(plan, keep_all=True)
    assert every.candidates is not None and len(every.candidates) > lazy.candidates_evaluated
    assert [(r.memory_options, r.peak_bytes, r.step_s) for r in lazy.top] == [
        (r.memory_options, r.peak_bytes, r.step_s) for r in every.top
    ]


def test_a_saver_twins_bound_is_its_allocated_peak() -> None:
    """A twin's bound less the context and the communicators is its step's allocated peak to the byte, as
    a plain candidate's (the model's part re-run for its loss, the framework's for the optimizer in
    backward); its requests carry the saver."""
    plan = plan_options(**TWO)
    resolver, candidates = plan_candidates(plan)
    twins = []
    for group in {id(c.group): c.group for c in candidates}.values():
        for twin in saver_twins(plan, group, group.micro_batches):
            members = resolver.candidates(twin)
            if not isinstance(members, InputError):
                twins += members
    assert {(c.group.loss, c.group.optimizer_in_backward) for c in twins} == {
        (loss, v) for loss in LossImpl if loss.saver or loss is LossImpl.FULL for v in (False, True)
    } - {(LossImpl.FULL, False)}  # the shifted loss, older transformers' own, only where --loss names it
    for cand in random.Random(3).sample(twins, 8):
        request = cand.request
        assert request.activations.loss is cand.group.loss
        assert request.optimizer_in_backward is cand.group.optimizer_in_backward
        steady = simulate(
            request, request.strategies[0], runtime_for(request), _states(request), reserve=False
        )
        allocated = max(allocated for _, _, allocated in steady.events)
        assert cand.lower - resolver.outside(request) == allocated, cand.group


def test_the_optimizer_in_backward_is_refused_where_memory_refuses_it() -> None:
    """Asked alone, the optimizer in backward runs under FSDP2 with A = 1 only (torchtune refuses
    accumulation with it; FSDP1's and DDP's code step no optimizer in a gradient hook): the refusals are
    memory's own, counted."""
    result = search(
        plan_options(**TWO, loss="full",
                     optimizer_in_backward="on", top=2),
        keep_all=True,
    )  # fmt: skip
    assert result.candidates
    assert all(r.framework is Framework.FSDP2 and r.grad_accum == 1 for r in result.candidates)
    assert all(r.memory_options["optimizer_in_backward"] == "true" for r in result.candidates)
    reasons = " | ".join(r.reason for r in result.rejections)
    assert "optimizer_in_backward with framework fsdp:" in reasons
    assert "optimizer_in_backward with grad_accum" in reasons
