"""The model's part's floor of a candidate's allocated peak (zerocalc.plan.allocated.StepParts.model_floors),
by which the search skips the framework's runs of a group none of whose candidates can fit."""

from __future__ import annotations

from helpers import plan_candidates

from zerocalc.plan.allocated import MODEL_STEP_PARTS
from zerocalc.plan.candidates import AtBatch, group_requests
from zerocalc.plan.search import search
from zerocalc.plan.space import enumerate_groups, plan_options

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
