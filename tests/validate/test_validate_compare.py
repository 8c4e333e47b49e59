"""The comparison (pure): exact model-state lines decide the exit; the GPU peak is a toleranced extra line."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from zerocalc.base.errors import InputError
from zerocalc.validate.compare import ConfigResult, compare, predicted_comm, predictions
from zerocalc.validate.config import PERTURB_ENV, Job, Measured, RecordedCall
from zerocalc.validate.run import resolve_architecture

ARCH = resolve_architecture(None, {})
Perfect = Callable[[Job, int], list[Measured]]
"""conftest's ``perfect`` fixture: every rank's figures when the prediction is exactly right."""


def _job(strategy: str, **fields: object) -> Job:
    values = {"precision": "bf16-mixed", "optimizer": "adam", "backend": "gloo", "timeout_s": 60.0, **fields}
    return Job(arch=ARCH, strategy=strategy, gpus_per_node=values.pop("gpus_per_node", 2), **values)  # type: ignore[arg-type]


def _compare(job: Job, measured: list[Measured], world: int = 2) -> ConfigResult:
    preds = predictions(ARCH, job.strategy, world, job.precision, job.optimizer, job.gpus_per_node)
    return compare(job, preds, predicted_comm(job, world), measured, 1.0)


def test_exact_match_and_a_one_byte_difference(perfect: Perfect) -> None:
    job = _job("fsdp1-full-shard")
    assert _compare(job, perfect(job, 2)).status == "match"
    measured = [m.model_copy(update={"grads": m.grads + 1}) for m in perfect(job, 2)]
    result = _compare(job, measured)
    assert result.status == "mismatch"
    assert [(line.line, line.difference) for line in result.ranks[0].lines if line.ok is False] == [
        ("grads", 1)
    ]


def test_the_perturbation_hook_is_one_fp32_element(monkeypatch: pytest.MonkeyPatch, perfect: Perfect) -> None:
    monkeypatch.setenv(PERTURB_ENV, "step")
    job = _job("fsdp2")
    result = _compare(job, perfect(job, 2))
    assert result.status == "mismatch"
    assert {line.difference for r in result.ranks for line in r.lines if line.ok is False} == {-4}


def test_gpu_peak_is_compared_within_the_stated_tolerance_and_never_decides_the_exit(
    perfect: Perfect,
) -> None:
    job = _job("ddp")
    measured = [m.model_copy(update={"peak_allocated": 10**12}) for m in perfect(job, 2)]
    result = _compare(job, measured)
    peak = result.ranks[0].lines[-1]
    assert peak.line == "peak_allocated" and peak.ok is False and not peak.model_state
    assert result.status == "match"
    preds = predictions(ARCH, "ddp", 2, "bf16-mixed", "adam")
    floor = preds[0].model_states + preds[0].grads.bytes  # + DDP's buckets
    assert peak.predicted == floor
    measured = [m.model_copy(update={"peak_allocated": floor + 1000}) for m in perfect(job, 2)]
    assert _compare(job, measured).ranks[1].lines[-1].ok is True


def test_collectives_are_compared_call_by_call_on_every_rank(perfect: Perfect) -> None:
    job = _job("fsdp1-full-shard", precision="fp32", grad_accum=2, grad_sync="last")
    good = perfect(job, 2)
    result = _compare(job, good)
    assert result.status == "match"
    # root 127,702, blocks 48,448 (padded to 2): forward 3 gathers × 2 micro-batches, backward the blocks
    # × 2, one reduce_scatter per unit on the last micro-batch
    table = {
        (c.op, c.phase): (c.predicted_calls, c.predicted_bytes, c.measured_calls) for c in result.collectives
    }
    assert table == {
        ("all_gather", "forward"): (6, [898_392] * 2, [6, 6]),  # 2 × 224,598 × 4 B × 1/2
        ("all_gather", "backward"): (4, [387_584] * 2, [4, 4]),  # 2 × 96,896 × 2 B
        ("reduce_scatter", "backward"): (3, [449_196] * 2, [3, 3]),
    }
    # one call of rank 1 a few elements larger: that kind of collective is off, the others still match
    calls = list(good[1].collectives)
    calls[-1] = calls[-1].model_copy(update={"elements": calls[-1].elements + 2})
    bad = [good[0], good[1].model_copy(update={"collectives": calls})]
    result = _compare(job, bad)
    assert result.status == "mismatch"
    assert [(c.op, c.phase, c.ok) for c in result.collectives if not c.ok] == [
        ("reduce_scatter", "backward", False)
    ]
    # a collective the schedule does not have, and a call over one rank (moves nothing, left out)
    extra = RecordedCall(
        op="broadcast", phase="forward", dtype="int32", elements=37, group_ranks=[0, 1], root=0
    )
    alone = RecordedCall(op="all_reduce", phase="backward", dtype="fp32", elements=9, group_ranks=[1])
    odd = [m.model_copy(update={"collectives": [*m.collectives, extra, alone]}) for m in good]
    result = _compare(job, odd)
    (unexpected,) = [c for c in result.collectives if not c.ok]
    assert (unexpected.op, unexpected.predicted_calls, unexpected.measured_calls) == ("broadcast", 0, [1, 1])
    assert unexpected.explanation.startswith("not predicted")


def test_ddp_buckets_under_autocast_compare_calls_and_elements(perfect: Perfect) -> None:
    psi = resolve_architecture(None, {"intermediate_size": 3072, "vocab_size": 5607})
    job = Job(
        arch=psi, strategy="ddp", precision="bf16-mixed", optimizer="adam", backend="gloo", timeout_s=60.0,
        gpus_per_node=2,
    )  # fmt: skip
    good = perfect(job, 2)
    assert [(c.op, c.dtype, c.elements) for c in good[0].collectives] == [
        ("all_reduce", "fp32", 390_333),  # autocast keeps fp32 parameters, so fp32 gradients
        ("all_reduce", "fp32", 840_720),
    ]

    def run(*sizes: int) -> str:
        calls = [good[0].collectives[0].model_copy(update={"elements": n}) for n in sizes]
        measured = [m.model_copy(update={"collectives": calls}) for m in good]
        preds = predictions(psi, "ddp", 2, job.precision, job.optimizer)
        return compare(job, preds, predicted_comm(job, 2), measured, 1.0).status

    assert run(400_000, 831_053) == "match"  # the ready order moved a boundary: same calls and elements
    assert run(1_231_053) == "mismatch"  # one bucket fewer
    assert run(400_000, 831_054) == "mismatch"  # one element more


def test_overrides() -> None:
    sizes = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 96}
    arch = resolve_architecture("llama-3-8b", sizes)
    assert (arch.num_layers, arch.hidden_size, arch.kv_heads, arch.dim_per_head) == (2, 64, 2, 16)
    with pytest.raises(InputError, match="key/value heads"):
        resolve_architecture("llama-3-8b", {"num_heads": 6, "hidden_size": 96})


def test_fsdp1_lora_states_are_per_flat_parameter_of_peft_wrap_policy_padded_to_the_world() -> None:
    # Llama shrunk (hidden 33, kv 11, MLP 87, vocab 1001, 2 layers), LoRA r 3 on q and v: eight adapter
    # flat parameters of 99, 99, 99, 33 elements a layer, each padded to even (100, 100, 100, 34), half a
    # rank: 334 fp32 elements; frozen: the root 66,099 → 66,100 and two blocks 11,583 → 11,584, halved:
    # 44,634 bf16 elements (the base loaded in bf16 under bf16-mixed)
    from zerocalc.parallel.finetune import FineTuning, LoraConfig
    from zerocalc.parallel.optimizers import OptimizerName
    from zerocalc.parallel.precision import PrecisionName

    arch = resolve_architecture(None, {}, lora=True)
    finetune = FineTuning(lora=LoraConfig(rank=3))
    # after the forward FULL_SHARD keeps the root unsharded, SHARD_GRAD_OP every unit (668 + 89,268), bf16
    for strategy, kept in (("fsdp1-full-shard", 66_100 * 2), ("fsdp1-shard-grad-op", (668 + 89_268) * 2)):
        states = predictions(arch, strategy, 2, PrecisionName.BF16_MIXED, OptimizerName.ADAM, 2, finetune)
        for rank in states:
            assert (rank.params.bytes, rank.grads.bytes, rank.optimizer_states.bytes) == (1_336, 1_336, 2_672)
            assert (rank.step.bytes, rank.frozen.bytes) == (8 * 4, 44_634 * 2)
            assert rank.unsharded_after_forward.bytes == kept
