"""The torch side of ``zerocalc validate pipeline --fake``: one stage of a real pipelining 1F1B step
(``torch.distributed.pipelining``), with FSDP2 over the stage's data-parallel ranks, under fake tensors,
tracked by PyTorch's ``FSDPMemTracker`` (imports torch).

The process plays one rank of a fake world of p × d ranks (``init_process_group("fake")``,
``torch/testing/_internal/distributed/fake_pg.py``: every collective and every send or receive returns at
once): the first data-parallel rank of the stage measured (the largest dim-0 shards), one case per stage.
The (pp, dp) mesh is built on real tensors; then, under ``FakeTensorMode``, the whole model of
:mod:`zerocalc.validate.model` is built, the stage's modules kept
(:class:`~zerocalc.validate.pipeline_stage.StageModule`), ``fully_shard`` applied per block and then on the
stage (``MixedPrecisionPolicy`` with bf16 parameters and fp32 reduction under bf16-mixed), Adam created,
and ``Schedule1F1B`` runs three steps of m micro-batches (``optimizer.step`` after each; the third is
measured, without ``zero_grad``).

What makes the pipeline run under fake tensors:

* the stages are built on fake CPU tensors, not on "meta" and then ``to_empty``: a stage's modules are
  taken from the whole model, and ``to_empty`` cannot swap the embedding's storage in place;
* the schedule's first step votes, over the pipeline, whether every stage's shapes are static
  (``Schedule._warmup_p2p``: a 1-element send, receive and ``.item()``, which a fake receive cannot
  answer): the vote is answered statically (every stage is given its input and output shapes and has no
  DTensor input, so every stage would vote STATIC);
* the tracker refuses a module's second forward without ``reset_mod_stats()``, and a stage runs m
  forwards per step: its module statistics are cleared before each micro-batch's forward;
* a later stage's static input requires grad (as in the real run), so its gradient is computed and sent.

The tracker's figures are made comparable with a CUDA step as in :mod:`zerocalc.validate.fake_step`: every
storage is rounded to 512 B, and Adam's ``step`` counters (host tensors on a GPU) are untracked after each
``optimizer.step``. The last stage is run a second time with ``step(return_outputs=False)``: the default
keeps every micro-batch's output until the step returns.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Any

import torch

from zerocalc.model.architecture import Architecture
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate.config import WARMUP_STEPS
from zerocalc.validate.measure import nbytes
from zerocalc.validate.model import build_model, loss_fn
from zerocalc.validate.pipeline import (
    FakePipelineCase,
    FakePipelineReport,
    FakeStageFigures,
    FakeStageResult,
    PipelineJob,
    compare_fake_stage,
    rounded,
)
from zerocalc.validate.pipeline_stage import build_stage, stage_shapes


@contextlib.contextmanager
def _rounded_storages() -> Iterator[None]:
    """The tracker counts every storage rounded to 512 B (it rounds only CUDA ones)."""
    from torch.distributed._tools import mem_tracker

    saved = mem_tracker._WeakRefInfo._calculate_mem_consumed

    def allocated(info: Any) -> int:
        return rounded(info.size * info.element_size)

    mem_tracker._WeakRefInfo._calculate_mem_consumed = allocated
    try:
        yield
    finally:
        mem_tracker._WeakRefInfo._calculate_mem_consumed = saved


def run_cases(
    arch: Architecture, cases: list[FakePipelineCase], optimizer: OptimizerName
) -> FakePipelineReport:
    """Every case run and compared with its prediction."""
    results: list[FakeStageResult] = []
    for case in cases:
        started = time.perf_counter()
        figures = run(arch, case, optimizer, keep_outputs=True)
        if case.stage == case.pp - 1:
            without = run(arch, case, optimizer, keep_outputs=False)
            update = {
                "peak_without_outputs": without.peak,
                "after_schedule_without_outputs": without.after_schedule,
            }
            figures = figures.model_copy(update=update)
        results.append(compare_fake_stage(arch, case, figures, optimizer, time.perf_counter() - started))
    return FakePipelineReport(model=arch.name, architecture=arch, torch=torch.__version__, stages=results)


def run(
    arch: Architecture, case: FakePipelineCase, optimizer: OptimizerName, keep_outputs: bool
) -> FakeStageFigures:
    """One stage's third step under fake tensors and the fake process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=case.rank, world_size=case.world)
    try:
        mesh = init_device_mesh("cpu", (case.pp, case.dp), mesh_dim_names=("pp", "dp"))
        with _rounded_storages():
            return _steps(arch, case, optimizer, mesh, keep_outputs)
    finally:
        gc.collect()
        dist.destroy_process_group()


def _steps(
    arch: Architecture, case: FakePipelineCase, optimizer: OptimizerName, mesh: Any, keep_outputs: bool
) -> FakeStageFigures:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _UpdateType
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.pipelining._utils import InferenceMode

    cpu = torch.device("cpu")
    job = PipelineJob(
        arch=arch,
        pp=case.pp,
        strategy="fsdp2",
        precision=case.precision,
        optimizer=optimizer,
        backend="fake",
        timeout_s=1.0,
        microbatches=case.microbatches,
        batch=case.micro_batch,
        seq=case.seq_len,
    )
    first, last = case.stage == 0, case.stage == case.pp - 1
    with FakeTensorMode():
        module = build_stage(build_model(arch, job.seed), job, case.stage)
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if case.precision is PrecisionName.BF16_MIXED
            else MixedPrecisionPolicy()
        )
        for layer in module.layers:
            fully_shard(layer, mesh=mesh["dp"], mp_policy=policy, reshard_after_forward=case.reshard)
        fully_shard(module, mesh=mesh["dp"], mp_policy=policy, reshard_after_forward=case.reshard)
        opt_class = torch.optim.AdamW if optimizer is OptimizerName.ADAMW else torch.optim.Adam
        opt = opt_class(module.parameters(), lr=1e-3)
        inputs, outputs = stage_shapes(job, case.stage)
        pipe = PipelineStage(
            module,
            case.stage,
            case.pp,
            cpu,
            input_args=inputs,
            output_args=outputs,
            group=mesh["pp"].get_group(),
        )
        schedule = Schedule1F1B(pipe, case.microbatches, loss_fn=loss_fn)

        def static_vote(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
            for stage in stages:
                stage._inference_mode = InferenceMode.STATIC

        schedule._warmup_p2p = static_vote  # type: ignore[method-assign]
        tracker = FSDPMemTracker(module, opt)
        forward_one_chunk = pipe.forward_one_chunk

        def cleared_forward(*args: Any, **kwargs: Any) -> Any:
            tracker.reset_mod_stats()
            return forward_one_chunk(*args, **kwargs)

        pipe.forward_one_chunk = cleared_forward  # type: ignore[method-assign]
        tokens = torch.randint(0, arch.vocab_size, (case.micro_batch * case.microbatches, case.seq_len))

        def untrack_step_counters() -> None:
            for state in opt.state.values():
                step = state.get("step")
                info, _ = (
                    tracker._WINFO.get(step.untyped_storage(), (None, None))
                    if step is not None
                    else (None, 0)
                )
                if info is not None and info.mem_consumed > 0:
                    tracker._update_snap(_UpdateType.DEL, info)
                    info.mem_consumed = 0

        with tracker:
            for step in range(WARMUP_STEPS + 1):
                current = tracker.get_tracker_snapshot("current")
                start = current.get(cpu, {})
                tracker._peak_mem = {cpu: current.get(cpu, {}).get("Total", 0)}
                tracker._peak_mem_snap = current
                args = (tokens,) if first else ()
                schedule.step(*args, target=tokens if last else None, return_outputs=keep_outputs)
                after_schedule = tracker.get_tracker_snapshot("current").get(cpu, {}).get("Total", 0)
                opt.step()
                untrack_step_counters()
                if step < WARMUP_STEPS:
                    opt.zero_grad()
            at_peak = tracker.get_tracker_snapshot("peak").get(cpu, {})
        params = [p for group in opt.param_groups for p in group["params"]]
        states = [(key, value) for state in opt.state.values() for key, value in state.items()]
        figures = FakeStageFigures(
            start=start.get("Total", 0),
            at_start={str(getattr(k, "value", k)): v for k, v in start.items() if v},
            peak=tracker._peak_mem.get(cpu, 0),
            after_schedule=after_schedule,
            at_peak={str(getattr(k, "value", k)): v for k, v in at_peak.items() if v},
            params=sum(nbytes(p) for p in params),
            grads=sum(nbytes(p.grad) for p in params if p.grad is not None),
            optimizer=sum(nbytes(v) for k, v in states if torch.is_tensor(v) and k != "step"),
            step=sum(nbytes(v) for k, v in states if torch.is_tensor(v) and k == "step"),
        )
    return figures
