"""The comparison (pure): exact model-state lines decide the exit; the GPU peak is a toleranced extra line."""

from __future__ import annotations

import pytest

from zerocalc.errors import InputError
from zerocalc.validate.compare import compare, predictions
from zerocalc.validate.config import PERTURB_ENV, Measured
from zerocalc.validate.run import resolve_architecture


def _measured(strategy: str, peak: int | None = None, extra_grads: int = 0) -> tuple[list, list[Measured]]:
    preds = predictions(resolve_architecture(None, {}), strategy, 2, "bf16-mixed", "adam")
    measured = [
        Measured(
            rank=r,
            params=p.params.bytes,
            grads=p.grads.bytes + extra_grads,
            optimizer=p.optimizer_states.bytes,
            step=p.step.bytes,
            unsharded_after_forward=None if strategy == "ddp" else p.unsharded_after_forward.bytes,
            peak_allocated=peak,
            loss=1.0,
        )
        for r, p in enumerate(preds)
    ]
    return preds, measured


def test_exact_match_and_a_one_byte_difference() -> None:
    preds, measured = _measured("fsdp1-full-shard")
    assert compare("fsdp1-full-shard", "bf16-mixed", preds, measured, 1.0).status == "match"
    preds, measured = _measured("fsdp1-full-shard", extra_grads=1)
    result = compare("fsdp1-full-shard", "bf16-mixed", preds, measured, 1.0)
    assert result.status == "mismatch"
    assert [(line.line, line.difference) for line in result.ranks[0].lines if line.ok is False] == [
        ("grads", 1)
    ]


def test_the_perturbation_hook_is_one_fp32_element(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PERTURB_ENV, "step")
    preds, measured = _measured("fsdp2")
    result = compare("fsdp2", "bf16-mixed", preds, measured, 1.0)
    assert result.status == "mismatch"
    assert {line.difference for r in result.ranks for line in r.lines if line.ok is False} == {-4}


def test_gpu_peak_is_compared_within_the_stated_tolerance_and_never_decides_the_exit() -> None:
    preds, measured = _measured("ddp", peak=10**12)
    result = compare("ddp", "bf16-mixed", preds, measured, 1.0)
    peak = result.ranks[0].lines[-1]
    assert peak.line == "peak_allocated" and peak.ok is False and not peak.model_state
    assert result.status == "match"
    floor = preds[0].model_states + preds[0].grads.bytes  # + DDP's buckets
    assert peak.predicted == floor
    preds, measured = _measured("ddp", peak=floor + 1000)
    assert compare("ddp", "bf16-mixed", preds, measured, 1.0).ranks[1].lines[-1].ok is True


def test_overrides() -> None:
    sizes = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 96}
    arch = resolve_architecture("llama-3-8b", sizes)
    assert (arch.num_layers, arch.hidden_size, arch.kv_heads, arch.dim_per_head) == (2, 64, 2, 16)
    with pytest.raises(InputError, match="key/value heads"):
        resolve_architecture("llama-3-8b", {"num_heads": 6, "hidden_size": 96})
