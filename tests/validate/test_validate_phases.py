"""``validate cuda``'s comparison (pure), checked on CPU with the shared H100 measurements."""

from __future__ import annotations

import json

import pytest
from helpers import DATA, H100_STEPS, h100_step_row
from typer.testing import CliRunner

from zerocalc.api import estimate_peak
from zerocalc.cli import app
from zerocalc.validate.phases import PhaseMeasurement, compare_phases


@pytest.mark.parametrize("m", H100_STEPS, ids=[f"b{m['b']}-s{m['s']}-{m['recompute']}" for m in H100_STEPS])
def test_the_h100_steps_pass_and_a_larger_peak_fails(m: dict) -> None:
    row = h100_step_row(m)
    report = compare_phases(row, PhaseMeasurement.model_validate(m))
    assert report.ok, [(line.line, line.relative) for line in report.lines if not line.ok]
    worse = PhaseMeasurement.model_validate({**m, "backward_peak": int(m["backward_peak"] * 1.2)})
    off = compare_phases(row, worse)
    assert not off.ok
    assert [line.line for line in off.lines if not line.ok] == ["backward peak"]


def test_device_cuda_without_a_gpu_is_one_line() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    config = DATA / "h100-fsdp2-hf" / "config.json"
    result = CliRunner().invoke(app, ["validate", "cuda", "--model", str(config)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "no CUDA device" in result.stderr


def test_the_device_in_hand_is_matched_to_the_preset_with_its_usable_memory() -> None:
    from zerocalc.request.presets import load_gpu, preset_names
    from zerocalc.validate.phases import matching_gpu_preset

    usable = {n: load_gpu(n).usable_bytes for n in preset_names("gpus")}
    # torch.cuda.mem_get_info() total on the H100 80GB HBM3 of shared/measurements: 79.18 GiB = 81080 MiB
    assert matching_gpu_preset(81080 * 2**20, usable) == "h100-80gb"
    assert matching_gpu_preset(81920 * 2**20, usable) == "a100-80gb"  # 81,920 MiB (1% more) is the A100
    assert matching_gpu_preset(23 * 2**30, usable) is None  # a 24 GB L4: no preset, refused in one line
    assert matching_gpu_preset(0, usable) is None


H200 = DATA / "h200-fsdp2-hf"
H200_STEPS = [
    pytest.param(step, id=f"{step['model']}-b{step['b']}-s{step['s']}-{step['recompute']}")
    for step in map(json.loads, (H200 / "steps.jsonl").read_text().splitlines())
]
ALLOCATED_LINES = ("start (allocated)", "forward peak", "after forward", "backward peak", "after backward")
ALLOCATED_LINES += ("optimizer peak", "max allocated")


@pytest.mark.parametrize("m", H200_STEPS)
def test_held_out_h200_steps_within_2_percent_allocated_and_10_percent_device(m: dict) -> None:
    """Steps of other families, on another GPU, with the validate recipe's flags: every allocated line within
    2% and the device footprint within 10%, the peak in the measured phase (tests/data/h200-fsdp2-hf)."""
    (row,) = estimate_peak(
        str(H200 / f"{m['model']}.json"), 1, framework="fsdp2", strategies="zero3", micro_batch=m["b"],
        seq_len=m["s"], recompute=m["recompute"], reduce_dtype="fp32", model_impl="hf", flash_attention=True,
        gpu="h200-141gb", init="gpu",
    ).peak.strategies  # fmt: skip
    report = compare_phases(row, PhaseMeasurement.model_validate(m))
    lines = {line.line: line.relative for line in report.lines}
    off = {name: f"{lines[name]:+.2%}" for name in ALLOCATED_LINES if abs(lines[name]) > 0.02}
    assert not off, off
    assert abs(lines["device used"]) <= 0.10, f"device used {lines['device used']:+.2%}"
    assert report.predicted_phase == report.measured_phase
