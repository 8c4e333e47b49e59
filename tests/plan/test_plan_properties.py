"""Properties of ``zerocalc plan`` over random spaces (hypothesis): every candidate is what its printed
commands give, and its lower bound is below its exact peak.

The search shares work across candidates (step parts per model, pipelines, collectives and compute per
mesh and micro-batch): a cache keyed by less than what it depends on gives some candidate another's
number. ``memory`` and ``comm`` price each request from scratch, so any such sharing shows here as a
difference, whatever space it happens in."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from zerocalc.api import estimate_comm, estimate_peak
from zerocalc.base.errors import InputError
from zerocalc.plan.search import search
from zerocalc.plan.space import plan_options

MODELS = {
    "gpt2": (256, 1024),  # tied embedding, vocabulary padded under Megatron-LM
    "gemma-3-1b": (1024,),  # tied 262,144-row embedding, sliding-window layers
    "qwen1.5-moe-a2.7b": (1024,),  # experts
}
FRAMEWORKS = (
    "megatron,fsdp2",
    "paper,megatron",
    "fsdp2,megatron,paper",
    "paper",
    "deepspeed",
    "fsdp2",
    "torch-zero1",
)
"""Frameworks searched together more often than alone: what one shares with another is what can go wrong."""


@st.composite
def spaces(draw: st.DrawFn) -> dict:
    model = draw(st.sampled_from(sorted(MODELS)))
    space = dict(
        model=model,
        gpu=draw(st.sampled_from(["h100-80gb", "rtx-4090", "a100-80gb"])),
        gpus=draw(st.sampled_from([4, 8])),
        seq_len=draw(st.sampled_from(MODELS[model])),
        global_batch=f"{draw(st.sampled_from([16, 32]))}seq",
        # reduce dtypes, offloads, grad syncs, recompute and micro-batches are searched in every space
        frameworks=draw(st.sampled_from(FRAMEWORKS)),
        objective=draw(st.sampled_from(["time", "memory", "gpus"])),
        top=2,
    )
    for name, values in (("tp", ["1,2", "2"]), ("pp", ["1,2"]), ("cp", ["1,2"]), ("vpp", ["1,2"])):
        if draw(st.booleans()):
            space[name] = draw(st.sampled_from(values))
    if model == "qwen1.5-moe-a2.7b" and draw(st.booleans()):
        space["ep"] = draw(st.sampled_from(["auto", "2"]))
    return space


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # a failure is reported as found: each space takes seconds
    suppress_health_check=[HealthCheck.too_slow],
)
@given(space=spaces(), seed=st.integers(0, 2**16))
def test_every_sampled_candidate_is_its_commands_and_bounded_by_its_peak(space: dict, seed: int) -> None:
    """30 candidates' communication and step (and the top rows'), and the peaks of 3 candidates without
    pipeline stages and of the top row, from their printed options: the same to the bit, and each lower
    bound at most the exact peak."""
    try:
        result = search(plan_options(**space), keep_all=True)
    except InputError:
        return  # a space the parser refuses whole (one line, tested elsewhere)
    rows = result.candidates
    assert rows is not None
    pick = random.Random(seed)
    for row in pick.sample(rows, min(30, len(rows))) + list(result.top):
        comm = estimate_comm(**row.comm_options).strategies[0]
        assert comm.step is not None
        assert (comm.time_s, comm.step.step_s) == (row.comm_s, row.step_s), row.comm_options
    unstaged = [row for row in rows if row.pp == 1]  # one timeline each: their bounds are exact
    for row in pick.sample(unstaged, min(3, len(unstaged))) + result.top[:1]:
        peak = estimate_peak(**row.memory_options).peak.strategies[0]
        assert row.peak_lower_bound_bytes <= peak.peak_bytes, row.memory_options
        assert row.peak_bytes in (None, peak.peak_bytes), row.memory_options
