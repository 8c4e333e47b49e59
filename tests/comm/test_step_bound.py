"""The step's lower bound plan walks by (zerocalc.comm.step.compute_bound_s): the slowest stage's A
micro-batches, below the step that adds the optimizer, the framework's kernels, the exposed communication,
the bubble and the offload to them."""

from __future__ import annotations

import pytest

from zerocalc.comm.step import compute_bound_s, step_time
from zerocalc.request.compute import compute_table
from zerocalc.request.training import parse_options

CASES = [
    dict(framework="megatron", tp=2, pp=2, micro_batch=1, grad_accum=4, recompute="none"),
    dict(framework="megatron", tp=2, pp=1, micro_batch=2, grad_accum=2, recompute="full"),
    dict(framework="fsdp2", micro_batch=2, grad_accum=3, recompute="selective"),
    dict(framework="deepspeed", micro_batch=1, grad_accum=1, recompute="none", offload_optimizer="cpu"),
]


@pytest.mark.parametrize("options", CASES, ids=lambda o: f"{o['framework']}-b{o['micro_batch']}")
def test_the_bound_is_the_micro_batches_below_the_step(options: dict) -> None:
    request = parse_options(model="llama-3-8b", gpu="h100-80gb", gpus=8, seq_len=4096, **options)
    named = compute_table(None, "h100-80gb")
    assert named is not None
    table = named.table
    strategy = request.strategies[0]
    step = step_time(request, table, strategy)
    bound = compute_bound_s(request, table)
    assert bound <= step.compute_s <= step.step_s
    if options["framework"] != "fsdp2":  # no framework kernels: the compute is the passes + the optimizer
        assert bound == pytest.approx(step.compute_s - step.optimizer_s, rel=1e-8)
