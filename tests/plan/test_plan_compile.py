"""``zerocalc plan --compile``: carried into every candidate's requests and its commands, priced with the
compiled kernels (each row's step comm's to the bit, its commands carrying --compile), and shorter steps
than eager."""

from __future__ import annotations

import random

from helpers import assert_row_is_comms, candidate_requests_or_error

from zerocalc.model.code import Compiled
from zerocalc.plan.candidates import Bases
from zerocalc.plan.search import search
from zerocalc.plan.space import enumerate_groups, plan_options

SPACE = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch="16seq", seq_len=2048,
             frameworks="fsdp2", model_impl="torchtitan")  # fmt: skip


def test_every_compiled_candidates_requests_compile_as_asked() -> None:
    plan = plan_options(**SPACE, compile="model,loss")
    groups, _ = enumerate_groups(plan, True)
    bases = Bases.of(plan)
    for group in groups:
        requests = candidate_requests_or_error(plan, group, bases)
        assert not isinstance(requests, str), requests
        assert {r.activations.compile for pair in requests.values() for r in pair} == {Compiled.MODEL_LOSS}


def test_compiled_rows_carry_compile_and_are_comms_step_to_the_bit() -> None:
    compiled = search(plan_options(**SPACE, compile="model", top=2), keep_all=True)
    eager = search(plan_options(**SPACE, top=2), keep_all=True)
    assert compiled.candidates is not None
    for row in compiled.top:
        assert row.memory_options["compile"] == row.comm_options["compile"] == "model"
    for row in random.Random(5).sample(compiled.candidates, 8):
        assert_row_is_comms(row)
    assert compiled.top[0].step_s < eager.top[0].step_s
