"""How the model is created (``--init``): the creation phase, the allocator's start, host memory, defaults."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zerocalc.api import estimate_peak
from zerocalc.cli import app
from zerocalc.model.code import Device
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.framework_records.record import ModelInit
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.strategies import StrategyName
from zerocalc.peak.allocator import CachingAllocator
from zerocalc.peak.kinds import StepPhase
from zerocalc.peak.ledger import Ledger
from zerocalc.peak.report import Verdict
from zerocalc.peak.simulate import mechanics_for, runtime_for, step_shape
from zerocalc.peak.timeline import first_start
from zerocalc.request.training import parse_options

runner = CliRunner()
MiB = 2**20
PSI = 6_738_415_616  # Llama-2-7B
ROOT = 2 * 32000 * 4096 + 4096  # embedding + LM head + final norm
PSI_70B = 70_553_706_496  # Llama-3-70B


def _row(model: str, gpus: int, strategy: str, **kwargs):
    (row,) = estimate_peak(model, gpus, strategies=strategy, **kwargs).peak.strategies
    return row


def test_each_framework_defaults_to_its_documented_path() -> None:
    expected = {
        Framework.FSDP2: ModelInit.META,
        Framework.DEEPSPEED: ModelInit.META,
        Framework.PAPER: ModelInit.META,
        Framework.MEGATRON: ModelInit.GPU,
        Framework.FSDP: ModelInit.CPU,
        Framework.TORCH_ZERO1: ModelInit.CPU,
        Framework.DDP: ModelInit.CPU,
    }
    assert {f: p.init for f, p in FRAMEWORKS.items()} == expected
    peak = estimate_peak("llama-2-7b", 8, framework="fsdp2", strategies="zero3").peak
    assert peak.options.init is ModelInit.META and not peak.options.init_given
    assert peak.notes[0] == "model creation: meta (fsdp2's default); attention: flash (the model code's)"
    assert peak.options.init_source.startswith("fully_shard docs and torchtitan: built on the meta device")


def test_meta_creation_holds_only_the_shards() -> None:
    """Llama-2-7B on 8 ranks: every dim 0 divides by 8, so the fp32 shards are 4Ψ/8 exactly."""
    row = _row("llama-2-7b", 8, "zero3", framework="fsdp2", init="meta")
    creation = row.phase(StepPhase.CREATION)
    assert creation.allocated_bytes == 4 * PSI // 8 == 3_369_207_808
    assert creation.event == "model created (meta)"


def test_the_allocator_after_meta_creation_by_hand() -> None:
    """The caching allocator after creating Llama-2-7B's shards at world 8 (each block: q, k, v, o of 8 MiB
    share two 20 MiB segments two by two; gate, up and down of 21.5 MiB take a 22 MiB segment each; the
    embedding's and LM head's 62.5 MiB shards a 64 MiB segment each; norms, ids and buffers one 2 MiB small
    segment): 32 × (40 + 66) + 2 × 64 + 2 = 3,522 MiB."""
    request = parse_options(model="llama-2-7b", gpus=8, framework="fsdp2", strategies="zero3", init="meta")
    mechanics, act = mechanics_for(request, StrategyName.ZERO3)
    led = Ledger()
    step = step_shape(request, act, Device.CUDA)
    first_start(step, mechanics, runtime_for(request), led, ModelInit.META, 4)
    allocator = CachingAllocator()
    allocator.replay(led.log)
    assert allocator.max_reserved == (32 * (40 + 66) + 2 * 64 + 2) * MiB == 3_693_084_672


def test_gpu_creation_is_the_whole_model_in_fp32() -> None:
    row = _row("llama-2-7b", 8, "zero3", framework="fsdp2", init="gpu")
    creation = row.phase(StepPhase.CREATION)
    assert creation.allocated_bytes == 4 * PSI == 26_953_662_464
    assert creation.event == "model created (gpu: whole, fp32)"
    assert row.reserved_bytes >= 4 * PSI  # every whole parameter had its segment
    # the paper's accounting under --init gpu: the whole fp32 model before its 16Ψ/8 of states
    paper = _row("llama-2-7b", 8, "zero3", init="gpu")
    assert paper.phase(StepPhase.CREATION).allocated_bytes == max(4 * PSI, 16 * PSI // 8)


def test_cpu_creation_moves_one_unit_at_a_time() -> None:
    """``fully_shard`` moves each unit whole to the GPU, then shards it: the peak is at the root (the last
    unit), the 32 blocks' shards with the embedding, LM head and final norm whole in fp32."""
    row = _row("llama-2-7b", 8, "zero3", framework="fsdp2", init="cpu")
    creation = row.phase(StepPhase.CREATION)
    assert creation.allocated_bytes == 4 * (PSI - ROOT) // 8 + 4 * ROOT == 4_286_726_144
    assert creation.event == "root moved to the GPU (cpu: whole, fp32)"


def test_cpu_host_memory_per_node() -> None:
    """One fp32 copy per node where the framework loads on the node's first rank (FSDP2, accelerate's
    cpu_ram_efficient_loading), one per rank for DDP (each process builds its model)."""
    fsdp2 = estimate_peak("llama-2-7b", 16, 8, framework="fsdp2", strategies="zero3", init="cpu").peak
    assert fsdp2.init_host_bytes_per_node == 4 * PSI
    ddp = estimate_peak("llama-2-7b", 16, 8, framework="ddp", strategies="ddp").peak
    assert ddp.options.init is ModelInit.CPU
    assert ddp.init_host_bytes_per_node == 8 * 4 * PSI
    meta = estimate_peak("llama-2-7b", 8, framework="fsdp2", strategies="zero3").peak
    assert meta.init_host_bytes_per_node is None


def test_deepspeed_zero_init_is_init_meta() -> None:
    """DeepSpeed's ZeRO-3 host estimate: 4 × largest layer × g × 1.5 under zero.Init (init meta), 4Ψ × g × 1.5
    without it (init cpu: every rank builds the whole model on the host)."""
    largest = 32000 * 4096
    meta = _row("llama-2-7b", 16, "zero3", framework="deepspeed", gpus_per_node=8)
    assert meta.host_bytes_per_node == int(largest * 4 * 8 * 1.5)
    host = _row("llama-2-7b", 16, "zero3", framework="deepspeed", gpus_per_node=8, init="cpu")
    assert host.host_bytes_per_node == int(PSI * 4 * 8 * 1.5)


def test_llama_3_70b_on_64_h100_fits_under_fsdp2_by_default() -> None:
    """The issue's command: the reserve below 1.5× allocated; with --init gpu the whole model (4Ψ) must
    exist at creation, and the verdict says it does not fit there."""
    args = dict(framework="fsdp2", gpu="h100-80gb", seq_len=4096, recompute="full")
    row = _row("llama-3-70b", 64, "zero3", **args)
    assert row.verdict is Verdict.FITS
    assert row.reserved_bytes < 1.5 * row.allocated_peak_bytes
    whole = _row("llama-3-70b", 64, "zero3", init="gpu", **args)
    assert whole.verdict is Verdict.DOES_NOT_FIT
    assert (whole.peak_phase, whole.allocated_peak_bytes) == (StepPhase.CREATION, 4 * PSI_70B)


def test_fsdp2_strategies_no_longer_share_one_device_figure() -> None:
    """Created whole, every FSDP2 strategy reserved the fp32 model; created on meta each has its own."""
    peak = estimate_peak("llama-3-8b", 8, framework="fsdp2", gpu="h100-80gb").peak
    figures = {row.strategy: row.peak_bytes for row in peak.strategies}
    assert figures[StrategyName.HYBRID_SHARD] == figures[StrategyName.ZERO3]  # one node: the same mesh
    assert figures[StrategyName.SHARD_GRAD_OP] > figures[StrategyName.ZERO3]


def test_init_through_the_cli() -> None:
    args = ["memory", "--model", "llama-2-7b", "--gpus", "8", "--framework", "fsdp2", "-s", "zero3"]
    result = runner.invoke(app, [*args, "--init", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    peak = json.loads(result.stdout)["peak"]
    assert peak["options"]["init"] == "cpu" and peak["options"]["init_given"] is True
    assert peak["init_host_bytes_per_node"] == 4 * PSI
    assert peak["strategies"][0]["phases"][0]["phase"] == "creation"
    text = runner.invoke(app, [*args, "--init", "cpu"]).stdout
    assert "host memory per node at creation (--init cpu): 25.10 GiB" in text
    assert "model creation: --init cpu (built on the host, moved as it is sharded)" in text


def test_plan_takes_init_and_repeats_it() -> None:
    args = ["plan", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--gpus", "8", "--global-batch", "16seq"]
    result = runner.invoke(app, [*args, "--framework", "fsdp2", "--init", "gpu", "--top", "1"])
    assert result.exit_code == 0, result.output
    assert "--init gpu" in result.stdout


@pytest.mark.parametrize("command", ["memory", "plan"])
def test_an_unknown_init_is_one_line(command: str) -> None:
    args = [command, "--model", "llama-2-7b", "--gpu", "h100-80gb", "--init", "disk"]
    if command == "plan":
        args += ["--global-batch", "16seq"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--init 'disk' is not accepted; accepted: meta, gpu, cpu" in lines[0]


def test_comm_does_not_take_init() -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "8", "--init", "meta"])
    assert result.exit_code == 2


def test_plan_finds_fsdp2_configurations_for_llama_3_70b_on_64_h100() -> None:
    """The issue's plan: 'No configuration fits' while every FSDP2 run was created whole on the GPU."""
    from zerocalc.plan.search import search
    from zerocalc.plan.space import plan_options

    plan = plan_options(
        model="llama-3-70b", gpu="h100-80gb", gpus=64, global_batch="512seq", seq_len=4096, frameworks="fsdp2"
    )
    result = search(plan)
    assert result.top and all(row.framework is Framework.FSDP2 for row in result.top)
    limit = 0.95 * 81080 * MiB  # the H100's usable memory less the fit margin
    assert all(row.peak_exact and row.peak_bytes is not None and row.peak_bytes < limit for row in result.top)


def test_the_accountings_create_nothing_beyond_their_states_by_default() -> None:
    """paper (meta) and Megatron-LM (gpu: its parameters allocated whole in bf16, 2Ψ, below its 6 + 12/8
    bytes per parameter of states): the creation holds the state lines alone."""
    for framework, event in (("paper", "model created (meta)"), ("megatron", "model created (gpu)")):
        row = _row("llama-2-7b", 8, "zero1", framework=framework)
        creation = row.phase(StepPhase.CREATION)
        assert creation.allocated_bytes == sum(line.bytes for line in row.states), framework
        assert creation.event == event
    megatron = _row("llama-2-7b", 8, "zero1", framework="megatron")
    assert sum(line.bytes for line in megatron.states) > 2 * PSI


@pytest.mark.parametrize(("flag", "init"), [("true", ModelInit.META), ("false", ModelInit.CPU)])
def test_accelerates_zero3_init_flag_is_init(tmp_path, flag: str, init: ModelInit) -> None:
    """accelerate's ``deepspeed_config.zero3_init_flag``: the model built under ``deepspeed.zero.Init``
    (meta), or on every rank's host (cpu), which DeepSpeed's ZeRO-3 host estimate then counts whole."""
    path = tmp_path / "accelerate.yaml"
    path.write_text(
        f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: {flag}\n"
        "num_processes: 16\nnum_machines: 2\n"
    )
    peak = estimate_peak("llama-2-7b", accelerate=str(path)).peak
    assert peak.options.init is init
    largest = 32000 * 4096
    expected = largest * 4 * 8 * 1.5 if init is ModelInit.META else PSI * 4 * 8 * 1.5
    assert peak.row("zero3").host_bytes_per_node == int(expected)
