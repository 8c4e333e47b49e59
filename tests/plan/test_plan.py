"""``zerocalc plan``: optimal by brute force, the allocated peak exact, the printed commands
reproduce the top row, monotonic in GPUs and GPU memory, a published throughput, bad input."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from functools import cache

import pytest
from helpers import (
    SMALL_PLAN,
    candidate_options,
    candidate_requests_or_error,
    one_line_error,
    parsed_candidate_or_error,
)
from typer.testing import CliRunner

import zerocalc.plan.allocated as allocated_module
import zerocalc.plan.search as search_module
from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.cli.plan import command
from zerocalc.comm.calls import Layout
from zerocalc.comm.collectives import collective_runs, comm_lines, comm_of_lines
from zerocalc.comm.estimate import evaluate_comm, strategy_comm
from zerocalc.comm.step import PhaseComm, comm_time, step_estimate
from zerocalc.model.activations import Recompute
from zerocalc.network.calibration import save_calibration
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import GradSync, Phase
from zerocalc.parallel.framework_records import effective_grad_sync
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.optimizers import OptimizerImpl
from zerocalc.parallel.strategies import OffloadTarget, StrategyName
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.mechanics import Accounting, Accumulation, Ddp, Fsdp1, Fsdp2, Mechanics, Unit
from zerocalc.peak.report import Verdict
from zerocalc.peak.simulate import flash_attention_used, runtime_for, simulate
from zerocalc.peak.timeline import StepHooks
from zerocalc.plan.allocated import StepParts, _states
from zerocalc.plan.candidates import Bases, group_requests, printed_options
from zerocalc.plan.layers import EDGE, extrapolation, with_layers
from zerocalc.plan.search import Status, _exact, search
from zerocalc.plan.space import (
    SEARCHED_RECOMPUTES,
    Group,
    Objective,
    PlanRequest,
    enumerate_groups,
    plan_options,
)
from zerocalc.plan.split import Slot, Where, _SlotMarks, model_run, model_values
from zerocalc.request.options import Command
from zerocalc.request.training import TrainingRequest, parse_options

runner = CliRunner()

SMALL = dict(model="gpt2", gpu="rtx-4090", gpus=4, global_batch="8seq", seq_len=512, frameworks="fsdp2,ddp")
"""A small space: every candidate can be evaluated exactly in a few seconds."""


@cache
def _brute_force() -> list[tuple[tuple, float, int]]:
    """(identity, step time, exact peak) of every candidate that fits, by exact evaluation of all."""
    plan = plan_options(**SMALL)
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    out = []
    for group, candidates in _candidates(plan, groups):
        for candidate in candidates:
            peak = _exact(candidate.memory)
            if peak.verdict is not Verdict.FITS:
                continue
            timing = step_estimate(candidate.comm, plan.compute, "", group.strategy)  # comm's step
            key = (group.framework, group.strategy, group.world, candidate.b)
            out.append((key, timing.step_s, peak.peak_bytes))
    return out


@pytest.mark.parametrize("objective", ["time", "memory"])
def test_the_top_row_is_the_brute_force_optimum(objective: str) -> None:
    fits = _brute_force()
    assert fits, "the small space has configurations that fit"
    result = search(plan_options(**SMALL, objective=objective, top=1))
    top = result.top[0]
    assert top.peak_exact and top.verdict is Verdict.FITS
    if objective == "time":
        assert top.step_s == pytest.approx(min(t for _, t, _ in fits), rel=1e-12)
    else:
        assert top.peak_bytes == min(p for _, _, p in fits)


def test_every_candidates_step_time_is_comms_at_its_own_accumulation() -> None:
    """The search costs each key's schedule once (A = 2, 3) and derives every A: each candidate's comm_s and
    step time equal, to the bit, step_time over strategy_comm run at the candidate's own A."""
    space = {**SMALL, "gpus": 2, "global_batch": "16seq"}
    plan = plan_options(**space)
    result = search(plan, keep_all=True)
    assert result.candidates is not None
    checked = 0
    for row in result.candidates:
        comm_request = parse_options(**row.comm_options, estimate="comm")
        comm = strategy_comm(row.strategy, comm_request, None)
        assert comm.time_s == row.comm_s
        timing = evaluate_comm(comm_request, plan.compute).strategies[0].step
        assert timing is not None
        assert (timing.step_s, timing.exposed_comm_s) == (row.step_s, row.exposed_comm_s), row
        checked += 1
    assert checked >= 50 and any(r.grad_accum > 2 for r in result.candidates)


@pytest.mark.parametrize("grad_sync", ["every", "last"])
@pytest.mark.parametrize(
    ("framework", "strategy", "zeropp"),
    [("deepspeed", "zero3", "hpz"), ("fsdp2", "hybrid_shard", "none"), ("ddp", "ddp", "none")],
)
def test_a_keys_lines_are_comms_collectives_at_every_accumulation(
    framework: str, strategy: str, zeropp: str, grad_sync: str
) -> None:
    """comm_lines counts each collective's runs at every A from A = 2 and 3 (hpZ's after-first-micro-batch
    gathers included): at A = 1..5 its (phase, times, calls, time_s) are strategy_comm's, to the bit."""
    options = dict(model="gpt2", gpus=16, gpus_per_node=8, framework=framework, strategies=strategy)
    if zeropp != "none":
        options["zeropp"] = zeropp
    if framework != "deepspeed":
        options["grad_sync"] = grad_sync
    request = parse_options(**options)
    layout = Layout.of(request.model.params, request.model.architecture)
    name = StrategyName(strategy)
    sync = effective_grad_sync(request.framework, name, request.grad_sync)
    lines = comm_lines(collective_runs(name, request, layout), sync)
    for accum in range(1, 6):
        comm = strategy_comm(name, request.model_copy(update={"grad_accum": accum}), None)
        expected = [(c.phase, c.times_per_step, c.calls_per_step, c.time_s) for c in comm.collectives]
        assert comm_of_lines(lines, accum) == expected


def test_comm_time_sums_each_phase_apart_from_its_last_micro_batch_only_collectives() -> None:
    """At A = 2 a collective run once is the last micro-batch's (summed apart); at A = 1 every one is
    spread."""
    collectives = [
        (Phase.FORWARD, 2, 8, 0.5),
        (Phase.BACKWARD, 1, 4, 0.25),
        (Phase.BACKWARD, 2, 2, 1.0),
        (Phase.AFTER_STEP, 1, 1, 0.125),
    ]
    at_2 = comm_time(collectives, 2)
    assert at_2.time_s == 1.875
    assert at_2.forward == PhaseComm(spread=0.5, once=0.0, call_spread=0.0625, call_once=0.0)
    assert at_2.backward == PhaseComm(spread=1.0, once=0.25, call_spread=0.5, call_once=0.0625)
    assert at_2.after_step == PhaseComm(spread=0.0, once=0.125, call_spread=0.0, call_once=0.125)
    at_1 = comm_time(collectives, 1, time_s=2.0)
    assert at_1.time_s == 2.0
    assert at_1.backward == PhaseComm(spread=1.25, once=0.0, call_spread=0.5625, call_once=0.0)


def _timeline_peak(request: TrainingRequest) -> int:
    """The steady step's allocated peak from the whole timeline (every layer, every event)."""
    name = request.strategies[0]
    result = simulate(request, name, runtime_for(request), _states(request), reserve=False)
    return max(allocated for _, _, allocated in result.events)


def _candidates(plan: PlanRequest, groups: list[Group]) -> Iterator[tuple[Group, list]]:
    """(group, its candidates' requests) of every group the checks accept."""
    bases = Bases.of(plan)
    for group in groups:
        try:
            yield group, group_requests(plan, group, bases)
        except InputError:
            continue


def _at_batch(candidates: list) -> dict[int, TrainingRequest]:
    """A group's memory requests by micro-batch."""
    return {candidate.b: candidate.memory for candidate in candidates}


def test_every_candidates_allocated_peak_is_the_timelines() -> None:
    """zerocalc.plan.allocated: the framework's part (once per configuration) plus the model's part (once per
    b and recompute) gives, for every candidate of a space with every framework (GPT-2, 12 layers: all L
    layers run), the allocated peak of that candidate's own whole timeline to the byte; and memory's, less
    the remainders of the blocks its allocator replay hands out whole."""
    plan = plan_options(
        model="gpt2", gpu="rtx-4090", gpus=4, global_batch="8seq", seq_len=256,
        frameworks="fsdp2,fsdp,ddp,torch-zero1,deepspeed,paper",
    )  # fmt: skip
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    parts = StepParts(runtime_for(plan.base))
    checked, frameworks = 0, set()
    for group, candidates in _candidates(plan, groups):
        at_b = _at_batch(candidates)
        peaks = parts.allocated_peaks(at_b, group._replace(recompute=None, micro_batches=()))
        for b, request in at_b.items():
            assert peaks[b] == _timeline_peak(request), (group, b)
            checked += 1
        frameworks.add(group.framework)
    assert checked >= 300 and len(frameworks) == 6, (checked, frameworks)
    group, candidates = next(_candidates(plan, groups))
    at_b = _at_batch(candidates)
    b, request = next(iter(at_b.items()))
    exact = _exact(request)
    remainders = exact.term(TensorKind.BLOCK_REMAINDERS)  # memory's replay: blocks handed out whole
    assert parts.allocated_peaks(at_b, "again")[b] == exact.allocated_peak_bytes - remainders


def test_frameworks_searched_together_bound_their_candidates_as_alone() -> None:
    """A data-parallel candidate's step parts are those of the model its framework runs: Megatron-LM its own
    layers over a vocabulary padded to 128 (GPT-2: 50,304 rows), the others transformers' (50,257). Every
    candidate of a search over three frameworks has the bound (its exact allocated peak + context and
    communicators) it has in its framework's search alone; sharing one model's runs across them had put
    Gemma 3 1B's Megatron-LM bounds up to 13 GB above their exact peaks."""
    space = dict(model="gpt2", gpu="rtx-4090", gpus=4, global_batch="16seq", seq_len=512)

    def bounds(frameworks: str) -> dict[tuple, int]:
        rows = search(plan_options(**space, frameworks=frameworks), keep_all=True).candidates
        assert rows is not None
        return {
            (r.framework, r.strategy, r.gpus, r.micro_batch, r.recompute, r.reduce_dtype, r.grad_sync,
             r.offload_optimizer, r.offload_params, r.prefetch): r.peak_lower_bound_bytes
            for r in rows
        }  # fmt: skip

    together = bounds("fsdp2,megatron,paper")
    alone = {k: v for fw in ("fsdp2", "megatron", "paper") for k, v in bounds(fw).items()}
    assert together == alone and len(alone) > 100
    assert {key[0] for key in alone} == {Framework.FSDP2, Framework.MEGATRON, Framework.PAPER}


def test_the_printed_commands_reproduce_the_top_row() -> None:
    args = ["plan", "--model", "gpt2", "--gpu", "rtx-4090", "--gpus", "4", "--global-batch", "8seq",
            "--seq-len", "512", "--framework", "fsdp2,ddp", "--top", "2"]  # fmt: skip
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["schema_version"] == 2
    assert plan["exact_peaks"] + plan["lower_bound_peaks"] == plan["candidates_evaluated"]
    top = plan["top"][0]
    text = runner.invoke(app, args)
    assert text.exit_code == 0
    memory_line = command("memory", top["memory_options"])
    comm_line = command("comm", top["comm_options"])
    assert memory_line in text.stdout.replace("\n", " ") or memory_line.split(" --")[0] in text.stdout
    memory = runner.invoke(app, [*memory_line.split()[1:], "--json"])
    assert memory.exit_code == 0, memory.output
    peak = json.loads(memory.stdout)["peak"]["strategies"][0]
    assert peak["peak_bytes"] == top["peak_bytes"]
    comm = runner.invoke(app, [*comm_line.split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    assert json.loads(comm.stdout)["strategies"][0]["time_s"] == top["comm_s"]
    # the step time is compute + exposed communication + offload, the communication being comm's
    assert top["step_s"] == pytest.approx(top["compute_s"] + top["exposed_comm_s"] + top["offload_s"])


def _best_peak(gpus: int) -> int:
    plan = plan_options(
        model="gpt2", gpu="rtx-4090", gpus=gpus, global_batch="8seq", seq_len=256, frameworks="fsdp2",
        objective="memory", top=1,
    )  # fmt: skip
    result = search(plan)
    rows = [r for r in result.top if r.gpus == gpus]
    return rows[0].peak_bytes if rows else 1 << 62


def test_more_gpus_never_raise_the_best_peak() -> None:
    peaks = [_best_peak(n) for n in (2, 8)]
    assert peaks == sorted(peaks, reverse=True), peaks


def test_a_larger_gpu_keeps_every_configuration_that_fits() -> None:
    """The top rows on a 24 GB RTX 4090 all fit on a 48 GB L40S (their own memory commands, --gpu l40s)."""
    small = search(plan_options(**SMALL, top=5))
    assert small.top
    for row in small.top:
        request = parse_options(**{**row.memory_options, "gpu": "l40s"})
        assert _exact(request).verdict is Verdict.FITS


def test_the_plans_rows_are_comms_step_times() -> None:
    """A row's step time is ``zerocalc comm``'s for the row's own command (its options, the sequence
    length, micro-batch and recompute included): one step-time model for both."""
    from zerocalc.api import estimate_comm

    result = search(plan_options(**SMALL, top=3))
    for row in result.top:
        options = {k: v for k, v in row.comm_options.items() if k not in ("gpus", "gpus_per_node")}
        comm = estimate_comm(
            gpus=row.comm_options["gpus"], gpus_per_node=row.comm_options["gpus_per_node"], **options
        )
        step = comm.strategies[0].step
        assert step is not None
        assert step.step_s == pytest.approx(row.step_s, rel=1e-9)
        assert step.matmul_s == pytest.approx(row.matmul_s, rel=1e-12)


def test_json_counts_every_candidate() -> None:
    result = search(plan_options(**SMALL), keep_all=True)
    assert result.candidates is not None
    assert len(result.candidates) == result.candidates_evaluated
    assert result.exact_peaks + result.lower_bound_peaks == result.candidates_evaluated
    ranked = [c for c in result.candidates if c.status is Status.RANKED]
    assert len(ranked) == len(result.top)
    assert all(c.peak_exact for c in ranked)
    assert plan_options(**SMALL).objective is Objective.TIME


@pytest.mark.parametrize("enabled", [True, False])
def test_the_search_leaves_the_garbage_collector_as_it_found_it(enabled: bool) -> None:
    """The search pauses the cyclic collector (zerocalc.plan.search._collector_paused), and restores it
    after a search and after one that raises."""
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        paused: list[bool] = []
        search(plan_options(**SMALL), on_progress=lambda done, total: paused.append(gc.isenabled()))
        assert paused and not any(paused)
        assert gc.isenabled() is enabled

        def fail(done: int, total: int) -> None:
            raise RuntimeError("interrupted")

        with pytest.raises(RuntimeError):
            search(plan_options(**SMALL), on_progress=fail)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--global-batch", "1000"], "--global-batch"),
        (["--global-batch", "8seq", "--objective", "fast"], "--objective"),
        (["--global-batch", "8seq", "--top", "0"], "--top"),
        (["--global-batch", "8seq", "--framework", "jax"], "--framework"),
        (["--global-batch", "8seq", "--gpus", "0"], "--gpus"),
    ],
)
def test_bad_input_is_one_line(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["plan", "--model", "gpt2", "--gpu", "h100-80gb", "--seq-len", "512", *args])
    assert "accepted" in one_line_error(result, needle)


def test_no_gpu_or_model_is_one_line() -> None:
    for args in (["--model", "gpt2"], ["--gpu", "h100-80gb"]):
        result = runner.invoke(app, ["plan", *args, "--global-batch", "8seq"])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "gpt2-xl"])
def test_layer_extrapolation_equals_the_all_layer_timeline(model: str) -> None:
    """zerocalc.plan.layers: each candidate's allocated peak at L from runs of both parts at 4 and 5
    layers equals its all-layer timeline's to the byte under every framework, over strategies, recompute,
    offload, reduce dtype, accumulation and grad sync: the framework's runs at a few blocks keep the
    whole model's quantities (simulate.mechanics_for). GPT-2 XL (48 layers, 1.6 B parameters) is the case
    that needs it: DeepSpeed's reduce bucket (5e8 elements) is capped at L but not at 4 or 5 layers, and
    DDP's reducer buffer is one tensor rounded once; so is ZeroRedundancyOptimizer's greedy partition."""
    plan = plan_options(
        model=model,
        gpu="h100-80gb",
        gpus=16,
        global_batch="64seq",
        seq_len=256,
        frameworks="fsdp2,fsdp,ddp,torch-zero1,deepspeed,paper",
    )
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    sample = groups[:: 7 if model == "llama-3-8b" else 29]
    firsts = {(g.framework, g.strategy): g for g in reversed(groups)}  # each configuration's first group
    sample += [g for g in firsts.values() if g not in sample]
    parts = StepParts(runtime_for(plan.base))
    covered: set[tuple[Framework, str]] = set()
    for group, candidates in _candidates(plan, sample):
        at_b = _at_batch(candidates)
        b = max(at_b)
        allocated = parts.allocated_peaks({b: at_b[b]}, group)[b]
        full = _timeline_peak(at_b[b])
        assert allocated == full, (group, allocated - full)
        assert parts.frameworks[group].extrapolated
        covered.add((group.framework, group.strategy.value))
    frameworks = {framework for framework, _ in covered}
    assert (Framework.TORCH_ZERO1, "zero1") in covered and len(frameworks) >= 5, covered


@pytest.mark.parametrize("model", ["gemma-3-1b", "pythia-1.4b", "qwen1.5-moe-a2.7b", "gpt3-175b"])
def test_every_candidates_extrapolated_bound_is_its_all_layer_bound(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate of a 64-GPU space under every framework: its lower bound from runs at 4 and 5
    layers equals the one from runs at all L layers (what the search does where a stack is not homogeneous:
    the timeline's, test_every_candidates_allocated_peak_is_the_timelines). Extrapolating the cut models'
    own state lines had put gemma-3-1b's paper ZeRO-2 bound (fp32 reduce) 4.0 GB too high."""
    plan = plan_options(
        model=model, gpu="h100-80gb", gpus=64, global_batch="512seq", seq_len=1024, frameworks="all"
    )
    monkeypatch.setattr(search_module, "_walk", lambda *args: [])  # the bounds alone
    extrapolated = search(plan, keep_all=True).candidates
    monkeypatch.setattr(allocated_module, "homogeneous", lambda request: False)
    every_layer = search(plan, keep_all=True).candidates
    assert extrapolated is not None and every_layer is not None and len(extrapolated) > 1000
    for fast, full in zip(extrapolated, every_layer, strict=True):
        assert (fast.framework, fast.strategy, fast.gpus, fast.micro_batch) == (
            full.framework, full.strategy, full.gpus, full.micro_batch
        )  # fmt: skip
        assert fast.peak_lower_bound_bytes == full.peak_lower_bound_bytes, fast


def test_capped_buckets_are_exact_where_the_cut_model_is_below_the_cap() -> None:
    """DeepSpeed ZeRO-2's reduce bucket is min(5e8, Ψ) elements: GPT-2 XL cut to 4 or 5 blocks is below
    it (≈ 0.2 B parameters), the whole model above (1.56 B). Extrapolating the cut models' own lines put
    the allocated peak 8.46 GB above the timeline's (measured with the runs then at 6 and 7 layers); with the
    whole model's lines at every depth it is the timeline's to the byte."""
    plan = plan_options(
        model="gpt2-xl", gpu="h100-80gb", gpus=16, global_batch="128seq", seq_len=1024,
        frameworks="deepspeed",
    )  # fmt: skip
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    parts = StepParts(runtime_for(plan.base))
    checked = 0
    for group, candidates in _candidates(plan, groups):
        if group.strategy.value != "zero2" or group.reduce_dtype is None:
            continue
        at_b = _at_batch(candidates)
        b = min(at_b)
        allocated = parts.allocated_peaks({b: at_b[b]}, group)[b]
        assert allocated == _timeline_peak(at_b[b]), group
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("model", ["gpt2", "llama-3-8b", "mixtral-8x7b"])
def test_the_hook_calls_are_the_same_at_every_micro_batch_and_recompute(model: str) -> None:
    """StepParts runs the framework's part on the hook calls of one model run per layer count: the timeline
    calls the hooks with the same arguments, in the same order, whatever the micro-batch and the
    recompute the plan searches."""
    request = parse_options(model=model, gpus=8, framework="fsdp2", strategies="full_shard", seq_len=512)
    runtime = runtime_for(request)
    runs = [
        model_run(_at(request, b, recompute), runtime) for b in (1, 3, 8) for recompute in SEARCHED_RECOMPUTES
    ]
    assert len(runs[0].calls) > 3 * request.architecture.num_layers
    assert all(run.calls == runs[0].calls and run.slots == runs[0].slots for run in runs)
    assert len({tuple(run.values) for run in runs}) >= 3  # the model's bytes do differ (3 micro-batches)
    # the runs that do not record the calls (the search's, after the first per layer count) give the same
    assert [
        model_values(_at(request, b, recompute), runtime)
        for b in (1, 3, 8)
        for recompute in SEARCHED_RECOMPUTES
    ] == [run.values for run in runs]


@pytest.mark.parametrize("model", ["gpt2-xl", "llama-3-8b", "mixtral-8x7b", "gemma-3-1b"])
def test_runs_at_every_depth_may_share_their_layers_saves(model: str) -> None:
    """The search's model runs at 4, 5 and all L layers of one micro-batch and recompute (those it searches)
    share their layers' saves (StepShape.saves): each run's values equal those of a run that derives its
    own."""
    request = parse_options(model=model, gpus=8, framework="fsdp2", seq_len=512)
    runtime = runtime_for(request)
    for recompute in SEARCHED_RECOMPUTES:
        for b in (1, 3):
            at_b = _at(request, b, recompute)
            shared: dict = {}
            for layers in (4, 5, request.architecture.num_layers):
                cut = with_layers(at_b, layers)
                assert model_values(cut, runtime, saves=shared) == model_values(cut, runtime)
            assert shared  # the saves were kept for the next depth


def _at(request: TrainingRequest, b: int, recompute: Recompute) -> TrainingRequest:
    """The request at micro-batch b (A = 1) and recompute."""
    activations = request.activations.model_copy(update={"micro_batch": b, "recompute": recompute})
    return request.with_(activations=activations, grad_accum=1)


UNITS = {"0": Unit("0", [6, 4], [3, 2], [6, 4]), "root": Unit("root", [10], [5], [10])}
OTHER_UNITS = {"0": Unit("0", [6, 4], [3, 2], [6, 4]), "root": Unit("root", [12], [6], [12])}
ADAM = {"optimizer_states": 2, "optimizer_impl": OptimizerImpl.FOREACH}
MECHANICS: dict[type[Mechanics], dict[str, object]] = {
    Fsdp2: dict(
        units=UNITS, world=2, param_bytes=2, reduce_bytes=4, reshard=True, root_reshard=True, **ADAM,
        accumulation=Accumulation.NONE,
    ),
    Fsdp1: dict(
        units=UNITS, world=2, no_shard=False, param_bytes=2, reduce_bytes=4, reshard=True, **ADAM,
        accumulation=Accumulation.NONE,
    ),
    Ddp: dict(
        units=UNITS, reducer_elements=20, autocast_bytes=2, **ADAM, owned=(3, 2),
        accumulation=Accumulation.NONE,
    ),
    Accounting: dict(
        units=UNITS, states=[("params", "parameters", 64)], gather=True, unit_grads=True, param_bytes=2,
        grad_bytes=2, reduce_bytes=4, prefetch=1, keep_root=True, optimizer_elements=10,
        optimizer_impl=OptimizerImpl.FOREACH,
    ),
}  # fmt: skip


def _another(value: object) -> object:
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, (OptimizerImpl, Accumulation)):
        return next(member for member in type(value) if member is not value)
    if value is UNITS:
        return OTHER_UNITS
    if isinstance(value, tuple):
        return (*value, 1)
    assert isinstance(value, list)
    return [*value, ("buffers", "buffers", 8)]


@pytest.mark.parametrize("kind", list(MECHANICS), ids=lambda kind: kind.__name__)
def test_a_mechanics_run_identity_names_every_argument(kind: type[Mechanics]) -> None:
    """A plan shares one framework run among the configurations whose mechanics have equal identities:
    equal for equal arguments, different where any argument differs (each class declares its fields)."""
    arguments = MECHANICS[kind]
    identity = kind(**arguments).run_identity()  # type: ignore[arg-type]
    assert kind(**arguments).run_identity() == identity  # type: ignore[arg-type]
    for name, value in arguments.items():
        changed = kind(**{**arguments, name: _another(value)}).run_identity()  # type: ignore[arg-type]
        assert changed != identity, name
        hash(changed)


def test_the_slot_marker_implements_exactly_the_step_hooks() -> None:
    """The model run's marker and every mechanics answer the same hooks: the timeline's StepHooks."""
    hooks = {name for name in vars(StepHooks) if not name.startswith("_")}
    assert {name for name in vars(_SlotMarks) if not name.startswith("_")} == hooks
    assert len(hooks) == 12 and all(callable(getattr(Mechanics, name)) for name in hooks)


def test_every_candidate_has_a_peak() -> None:
    """Every candidate gets a peak: memory's exact one (the walk's) or the lower bound."""
    result = search(plan_options(**SMALL), keep_all=True)
    assert result.candidates is not None
    assert result.lower_bound_peaks + result.exact_peaks == result.candidates_evaluated
    assert all(c.peak_lower_bound_bytes is not None for c in result.candidates)
    exact = [c for c in result.candidates if c.peak_exact]
    assert all(c.peak_bytes >= c.peak_lower_bound_bytes for c in exact)  # type: ignore[operator]


@pytest.mark.parametrize(
    "space",
    [
        {**SMALL, "gpus": 16, "frameworks": "all"},
        dict(model="mixtral-8x7b", gpu="h100-80gb", gpus=24, gpus_per_node=4, global_batch="96seq",
             seq_len=4096, frameworks="all"),
        dict(model="llama-3-8b", gpu="h100-80gb", gpus=32, global_batch="1048576", seq_len=8192),
    ],
)  # fmt: skip
def test_every_candidates_requests_are_the_parsers(space: dict) -> None:
    """search builds each candidate's memory and comm requests from the plan's base (request.with_: the
    checks of what changed) instead of parsing them: for every group of three spaces (every framework, a
    shard group below the node, MoE, errors included) the requests equal those parsing the candidate's
    options gives, or both give the same InputError line; and the options the rows print are those
    options."""
    plan = plan_options(**space)
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    assert len(groups) > 100
    bases = Bases.of(plan)  # each group's requests varied from the last accepted group's, as search does
    for group in groups:
        built = candidate_requests_or_error(plan, group, bases)
        assert built == parsed_candidate_or_error(plan, group), group
        if isinstance(built, dict):
            b, (memory, comm) = next(iter(built.items()))
            assert printed_options(plan, group, memory, Command.MEMORY) == candidate_options(
                plan, group, b, Command.MEMORY
            )
            assert printed_options(plan, group, comm, Command.COMM) == candidate_options(
                plan, group, b, Command.COMM
            )


def test_a_candidates_requests_fail_as_the_parser_does() -> None:
    """Options the space never pairs (the parser would refuse them) give the parser's own line."""
    plan = plan_options(**{**SMALL, "gpus": 8, "global_batch": "32seq", "frameworks": "all"})
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    fsdp2 = next(g for g in groups if g.framework is Framework.FSDP2 and g.accumulates)
    hybrid = next(g for g in groups if g.strategy is StrategyName.HYBRID_SHARD)
    torch_zero1 = next(g for g in groups if g.framework is Framework.TORCH_ZERO1)
    refused = [
        fsdp2._replace(offload_optimizer=OffloadTarget.CPU),
        fsdp2._replace(grad_sync=GradSync.EVERY, strategy=StrategyName.ZERO3),
        hybrid._replace(gpus_per_node=3),
        torch_zero1._replace(reduce_dtype=DType.BF16),
    ]
    bases = Bases.of(plan)
    built = [candidate_requests_or_error(plan, group, bases) for group in [groups[0], *refused]][1:]
    assert built == [parsed_candidate_or_error(plan, group) for group in refused]
    assert all(isinstance(built[i], str) for i in (0, 2, 3))


def test_a_candidates_requests_keep_the_calibration(tmp_path, calibration_of) -> None:
    """With ``--calibration FILE`` a candidate's comm request carries the calibration and its name as
    parsed; its memory request (memory takes no calibration) none."""
    cal = calibration_of(Collective.ALL_GATHER)
    path = tmp_path / "cal.json"
    save_calibration(cal, path)
    plan = plan_options(**{**SMALL, "gpus": 16, "calibration": str(path)})
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    for group in groups[:40]:
        assert candidate_requests_or_error(plan, group) == parsed_candidate_or_error(plan, group)
    candidate = group_requests(plan, groups[0], Bases.of(plan))[0]
    assert candidate.comm.calibration == cal and candidate.comm.calibration_name == str(path)
    assert candidate.memory.calibration is None


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_units_gathered_beyond_the_edges_are_run_at_all_layers(prefetch: int) -> None:
    """The paper's ZeRO-3 gathers k units ahead: k blocks at each end are edges. Deeper than layers.EDGE
    the runs at 4 and 5 layers are all edge (at k = 3 every block's window reaches past the stack, and the
    plane through them was 11.7 GB off the timeline's peak): all L layers are run, and the peak is the
    timeline's. The refusal is that request's, not the search's (the model's extrapolation is kept)."""
    request = parse_options(
        model="llama-3-8b", gpus=16, framework="paper", strategies="zero3", seq_len=512, prefetch=prefetch
    )
    parts = StepParts(runtime_for(request))
    allocated = parts.allocated_peaks({1: request}, prefetch)[1]
    assert allocated == _timeline_peak(request)
    assert parts.frameworks[prefetch].extrapolated is (prefetch <= EDGE)
    # the refusal is this request's: the same search's next request, one unit ahead, is extrapolated
    ahead = request.with_(buffers=request.buffers.model_copy(update={"prefetch": 1}))
    assert parts.allocated_peaks({1: ahead}, "one ahead")[1] == _timeline_peak(ahead)
    assert parts.frameworks["one ahead"].extrapolated


def test_an_extrapolation_follows_the_plane_and_refuses_blocks_off_it() -> None:
    """layers.extrapolation: v(L, i) = p + q·i + r·L from blocks 1 and 2 at L' = 4 and block 1 at L' = 5
    (hand-computed at L = 32); the other inner blocks (2 and 3 at L' = 5) must lie on that plane."""
    slots = tuple(
        tuple(Slot("backward", Where.IN, "post_backward", i, None) for i in range(n)) for n in (4, 5)
    )
    plan = extrapolation(slots, 32)  # type: ignore[arg-type]
    assert plan is not None

    def values(n: int) -> list[int]:
        return [100 + 7 * i + 1000 * n for i in range(n)]

    # the edges in key order (blocks 0 and L−1), then blocks 1 and L−2 of the inner slot
    expected = [32100, 32100 + 7 * 31, 32100 + 7 * 1, 32100 + 7 * 30]
    assert plan.apply((values(4), values(5))) == expected
    assert [slot.unit for slot in plan.slots] == [0, 31, 1, 30]
    for block in (2, 3):
        bent = values(5)
        bent[block] += 1
        assert plan.apply((values(4), bent)) is None  # a byte off the plane


@pytest.mark.parametrize(("gpus", "tp"), [(1, "1"), (2, "2")])
def test_no_reduce_dtype_is_searched_where_nothing_is_reduced(gpus: int, tp: str) -> None:
    """One data-parallel rank (one GPU, or every GPU in the TP group) reduces no gradients: an fp32 reduce
    dtype changes nothing there, so the plan does not list rows that differ by it alone."""
    plan = plan_options(
        model="gpt2",
        gpu="rtx-4090",
        gpus=gpus,
        global_batch="8seq",
        seq_len=512,
        frameworks="fsdp2,ddp",
        tp=tp,
    )
    groups, _ = enumerate_groups(plan, flash_attention_used(plan.base))
    assert groups and all(group.reduce_dtype is None for group in groups)
    more = plan_options(
        model="gpt2", gpu="rtx-4090", gpus=2, global_batch="8seq", seq_len=512, frameworks="fsdp2"
    )
    assert any(
        g.reduce_dtype is DType.FP32 for g in enumerate_groups(more, flash_attention_used(more.base))[0]
    )


def test_plan_json_lists_every_candidate_only_when_asked() -> None:
    """``plan --json`` carries the top rows (``candidates`` null); ``--all-candidates`` adds every
    candidate searched; without --json it is refused in one line."""
    small = runner.invoke(app, [*SMALL_PLAN, "--json"])
    assert small.exit_code == 0, small.output
    assert json.loads(small.stdout)["candidates"] is None
    every = runner.invoke(app, [*SMALL_PLAN, "--json", "--all-candidates"])
    data = json.loads(every.stdout)
    assert len(data["candidates"]) == data["candidates_evaluated"] > 1
    assert len(small.stdout) * 4 < len(every.stdout)
    one_line_error(runner.invoke(app, [*SMALL_PLAN, "--all-candidates"]), "accepted: --json --all-candidates")


def test_plan_prints_no_progress_lines_where_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture) -> None:
    """A search that has run past a second shows a bar on a terminal; on a pipe or a log, nothing."""
    from zerocalc.cli.plan import _Progress

    progress = _Progress()
    progress.start -= 5.0
    for done in range(1, 4):
        progress.update(done, 10)
    progress.close()
    assert progress.bar is None and capsys.readouterr().err == ""
