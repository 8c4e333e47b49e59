"""The bounds by which the search runs no part for a group's micro-batches beyond the first whose allocated
peak is above the fit limit, and no framework's part where none can fit by the model's part and the bytes
the framework holds (zerocalc.plan.allocated.StepParts.peaks_up_to)."""

from __future__ import annotations

import itertools

import pytest
from helpers import plan_candidates

from zerocalc.model.code.loss import LossImpl
from zerocalc.peak.simulate import runtime_for
from zerocalc.plan.allocated import FRAMEWORK_PART, MODEL_STEP_PARTS
from zerocalc.plan.candidates import AtBatch, group_requests
from zerocalc.plan.layers import with_layers
from zerocalc.plan.search import search
from zerocalc.plan.space import SEARCHED_RECOMPUTES, enumerate_groups, plan_options
from zerocalc.plan.split import model_values
from zerocalc.request.presets import preset_names
from zerocalc.request.training import parse_options

MOE = dict(model="qwen3-30b-a3b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=4096,
           frameworks="megatron,fsdp2", ep="auto")  # fmt: skip


GPT2 = dict(model="gpt2", gpu="rtx-4090", gpus=16, global_batch="512seq", seq_len=1024)
"""Twelve layers: both parts run at all L (no extrapolation)."""
DEFAULTS = dict(model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=8192)
"""The default frameworks: FSDP2, ZeroRedundancyOptimizer under DDP, DeepSpeed's accounting."""
SPACES = pytest.mark.parametrize(
    "space", [MOE, GPT2, DEFAULTS], ids=["qwen3-30b-a3b ep", "gpt2", "llama-3-8b defaults"]
)


@SPACES
def test_peaks_up_to_a_limit_are_exact_below_it_and_bounds_above_it(space: dict) -> None:
    """At limits between a group's exact allocated peaks: every micro-batch up to the first above the limit
    gets its exact peak, every later one a bound above the limit and at most its exact peak."""
    plan = plan_options(**space)
    resolver, _ = plan_candidates(plan)
    groups, _ = enumerate_groups(plan, resolver.setting.flash)
    checked = bounded = 0
    for group in groups:
        if group.pp > 1:
            continue
        requests = group_requests(plan, group, resolver.bases)
        parts = resolver.parts.get(MODEL_STEP_PARTS, requests[0].memory)
        at_b = AtBatch(requests)
        exact = parts.allocated_peaks(at_b, framework_of=requests[0].memory)
        for above in sorted({*exact.values(), min(exact.values()) - 1}):
            fresh = MODEL_STEP_PARTS.run(requests[0].memory, resolver.parts)  # nothing run yet
            peaks = fresh.peaks_up_to(at_b, above=above, framework_of=requests[0].memory)
            assert peaks is not None and peaks.keys() == exact.keys()
            over = False
            for b in sorted(exact):
                if over:
                    assert above < peaks[b] <= exact[b]
                    bounded += peaks[b] < exact[b]
                else:
                    assert peaks[b] == exact[b] or above < peaks[b] <= exact[b]
                    over = peaks[b] > above
                checked += 1
    assert checked > 1000 and bounded > 0


@SPACES
def test_framework_holds_its_resident_bytes_at_every_slot_after_the_first_hook(space: dict) -> None:
    """What the second floor of peaks_up_to relies on: the bytes FrameworkRuns.held gives (the resident
    parameters and optimizer states, from mechanics whose hooks were not run, extrapolated where the stack
    is) are at most the framework's part at L at every slot after a hook, for every configuration of the
    space (exact F, extrapolated or all-L as the search runs it)."""
    plan = plan_options(**space)
    resolver, _ = plan_candidates(plan)
    groups, _ = enumerate_groups(plan, resolver.setting.flash)
    checked = set()
    for group in groups:
        if group.pp > 1:
            continue
        first = group_requests(plan, group, resolver.bases)[0].memory
        configuration = FRAMEWORK_PART.key(first)
        if configuration in checked:
            continue
        checked.add(configuration)
        parts = MODEL_STEP_PARTS.run(first, resolver.parts)  # nothing run yet
        plan_l = parts._extrapolation(first)
        held = parts.framework_runs.held(first, plan_l is not None)
        framework = parts._configured(first)
        if framework.extrapolated is not (plan_l is not None):
            continue
        after = parts._after_hooks(plan_l, len(framework.values))
        assert held is not None and 0 < held <= min(framework.values[i] for i in after)
    assert len(checked) > 5


@SPACES
def test_search_skipping_framework_runs_ranks_and_rejects_as_listing_every_candidate(space: dict) -> None:
    plan = plan_options(**space)
    fast, listed = search(plan), search(plan, keep_all=True)
    assert [r.model_dump() for r in fast.top] == [r.model_dump() for r in listed.top]
    assert fast.rejections == listed.rejections
    assert (fast.exact_peaks, fast.lower_bound_peaks) == (listed.exact_peaks, listed.lower_bound_peaks)


LOSSES = {"fsdp2": (LossImpl.FULL, LossImpl.CHUNKED), "megatron": (LossImpl.FULL,)}
"""The losses each model code runs (Megatron-LM's replaces neither head nor loss)."""


@pytest.mark.parametrize("framework", ["fsdp2", "megatron"])
def test_models_part_is_nondecreasing_in_the_micro_batch_at_every_slot(framework: str) -> None:
    """What peaks_up_to relies on to give a larger micro-batch the bound of the first one above the limit:
    on every model preset, under both model codes, every recompute the plan searches and with transformers'
    chunked loss, the model's part at b + 1 is at least that at b, slot by slot (an odd
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
