"""The model's part's floor of a candidate's allocated peak (zerocalc.plan.allocated.StepParts.model_floors),
by which the search skips the framework's runs of a group none of whose candidates can fit."""

from __future__ import annotations

import itertools

import pytest
from helpers import plan_candidates

from zerocalc.model.code.loss import LossImpl
from zerocalc.peak.simulate import runtime_for
from zerocalc.plan.allocated import MODEL_STEP_PARTS
from zerocalc.plan.candidates import AtBatch, group_requests
from zerocalc.plan.layers import with_layers
from zerocalc.plan.search import search
from zerocalc.plan.space import SEARCHED_RECOMPUTES, enumerate_groups, plan_options
from zerocalc.plan.split import model_values
from zerocalc.request.presets import preset_names
from zerocalc.request.training import parse_options

MOE = dict(model="qwen3-30b-a3b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=4096,
           frameworks="megatron,fsdp2", ep="auto")  # fmt: skip


def test_model_floor_is_at_most_every_candidates_allocated_peak():
    plan = plan_options(**MOE)
    resolver, _ = plan_candidates(plan)
    groups, _ = enumerate_groups(plan, resolver.setting.flash)
    checked = 0
    for group in groups:
        if group.pp > 1:
            continue
        requests = group_requests(plan, group, resolver.bases)
        parts = resolver.parts.get(MODEL_STEP_PARTS, requests[0].memory)
        at_b = AtBatch(requests)
        floors = parts.model_floors(at_b)
        assert floors is not None  # Qwen3-30B-A3B's stack is homogeneous
        peaks = parts.allocated_peaks(at_b, framework_of=requests[0].memory)
        for b, floor in floors.items():
            assert 0 < floor <= peaks[b]
            checked += 1
    assert checked > 1000


def test_search_skipping_framework_runs_ranks_and_rejects_as_listing_every_candidate():
    plan = plan_options(**MOE)
    fast, listed = search(plan), search(plan, keep_all=True)
    assert [r.model_dump() for r in fast.top] == [r.model_dump() for r in listed.top]
    assert fast.rejections == listed.rejections
    assert (fast.exact_peaks, fast.lower_bound_peaks) == (listed.exact_peaks, listed.lower_bound_peaks)


LOSSES = {"fsdp2": (LossImpl.FULL, LossImpl.CHUNKED), "megatron": (LossImpl.FULL,)}
"""The losses each model code runs (Megatron-LM's replaces neither head nor loss)."""


@pytest.mark.parametrize("framework", ["fsdp2", "megatron"])
def test_models_part_is_nondecreasing_in_the_micro_batch_at_every_slot(framework: str) -> None:
    """What model_floors(above=…) relies on to give a larger micro-batch the floor of the first one above
    the limit: on every model preset, under both model codes, every recompute the plan searches and
    with transformers' chunked loss, the model's part at b + 1 is at least that at b, slot by slot (an odd
    sequence length and b, where rounding to 512 bytes is not linear)."""
    checked = 0
    for model in preset_names("models"):
        base = parse_options(model=model, gpus=8, framework=framework, seq_len=300)
        cut = with_layers(base, min(4, base.architecture.num_layers))
        runtime = runtime_for(cut)
        for recompute in SEARCHED_RECOMPUTES:
            for loss in LOSSES[framework]:
                runs = []
                for b in (1, 2, 3):
                    activations = cut.activations.model_copy(
                        update={"micro_batch": b, "recompute": recompute, "loss": loss}
                    )
                    request = cut.with_(activations=activations, grad_accum=1)
                    runs.append(model_values(request, runtime))
                for smaller, larger in itertools.pairwise(runs):
                    assert len(smaller) == len(larger)
                    assert all(a <= b for a, b in zip(smaller, larger, strict=True)), (model, recompute, loss)
                checked += 1
    assert checked >= 39 * len(SEARCHED_RECOMPUTES) * len(LOSSES[framework])
