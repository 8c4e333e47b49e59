"""The torch side of ``zerocalc validate pipeline``: one rank of a pipeline of real
``torch.distributed.pipelining`` stages (imports torch).

Run as ``python -m zerocalc.validate.pipeline_worker JOB_JSON...`` by
:func:`zerocalc.harness.procs.spawn_series`. Every rank builds the whole model of
:mod:`zerocalc.validate.model` from the same seed and keeps its stage's modules
(:func:`zerocalc.validate.pipeline.stage_layers`); the ranks form a (pp, dp) device mesh, pipeline
outermost. The stage module is wrapped for its data-parallel group (bare, DDP, or FSDP2 with
``fully_shard`` per block then the stage root) and given to ``PipelineStage`` with its input and output
shapes (static: no shape inference over the wire; a later stage's input requires grad, so its gradient
goes back), run by ``Schedule1F1B`` (m micro-batches of b sequences, ``loss_fn`` on the last stage), then
``optimizer.step``. Under bf16-mixed, FSDP2 computes in bf16 (``MixedPrecisionPolicy``); the bare and DDP
stages run their forward under ``torch.autocast``.

The step after ``WARMUP_STEPS`` steps is measured: the stage's parameters, gradients, optimizer states and
step counters (sums of tensor bytes; DTensor: ``to_local()``), and every ``c10d::send`` / ``c10d::recv_``
the rank issues (the pipeline's point-to-point calls; torch 2.13 ``schedules.py`` ``_batch_p2p`` →
``dist.isend`` / ``dist.irecv``), in order, with the peer's global rank, dtype and elements, and the
data-parallel collectives (:class:`~zerocalc.validate.measure.CollectiveRecorder`). The rest of a rank
(the jobs, the world, the hand-back, the tear-down) is :mod:`zerocalc.validate.rank_main`'s.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from typing import Any

from zerocalc.harness import procs

if __name__ == "__main__":
    procs.exit_quietly_on_ctrl_c()  # before torch's slow import

import torch
from torch import nn

from zerocalc.bench.topology import Placement
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate.config import WARMUP_STEPS
from zerocalc.validate.measure import (
    CollectiveRecorder,
    dtype_name,
    group_ranks,
    nbytes,
    numel,
    optimizer_bytes,
)
from zerocalc.validate.model import build_model, loss_fn
from zerocalc.validate.pipeline import BACKWARD, FORWARD, P2PCall, PipelineJob, StageMeasured
from zerocalc.validate.pipeline_stage import StageModule, build_stage, stage_shapes
from zerocalc.validate.rank_main import rank_main


class P2PRecorder(CollectiveRecorder):
    """:class:`CollectiveRecorder` that also records every ``c10d::send`` and ``c10d::recv_``, in order: a
    send to a later stage or a receive from an earlier one carries activations (forward), the others their
    gradients (backward)."""

    def __init__(self, stage: int, dp: int) -> None:
        super().__init__()
        self.stage, self.dp = stage, dp
        self.p2p: list[P2PCall] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if getattr(func, "namespace", None) != "c10d" or name not in ("send", "recv_"):
            return super().__torch_dispatch__(func, types, args, kwargs)
        out = func(*args, **(kwargs or {}))
        tensors, group, peer_in_group = args[0], args[1], int(args[2])
        peer = group_ranks(group)[peer_in_group]
        later = peer // self.dp > self.stage
        op = "send" if name == "send" else "recv"
        phase = FORWARD if later == (op == "send") else BACKWARD
        self.p2p.append(
            P2PCall(op=op, peer=peer, phase=phase, dtype=dtype_name(tensors), elements=numel(tensors))
        )
        return out


def _wrap(job: PipelineJob, module: StageModule, dp_mesh: Any) -> tuple[nn.Module, Any]:
    """(the stage's module as its data-parallel ranks run it, the optimizer)."""
    opt_class = torch.optim.AdamW if job.optimizer is OptimizerName.ADAMW else torch.optim.Adam
    if job.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped: nn.Module = DDP(module, process_group=dp_mesh.get_group())
        return wrapped, opt_class(wrapped.parameters(), lr=1e-3)
    if job.strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        bf16 = job.precision is PrecisionName.BF16_MIXED
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else MixedPrecisionPolicy()
        )
        for layer in module.layers:
            fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
        fully_shard(module, mesh=dp_mesh, mp_policy=policy)
    return module, opt_class(module.parameters(), lr=1e-3)


def _phased(recorder: CollectiveRecorder, method: Any, phase: str) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        recorder.phase = phase
        return method(*args, **kwargs)

    return run


def _measure(job: PipelineJob, placement: Placement, device: Any) -> StageMeasured:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dp = placement.world_size // job.pp
    stage, dp_index = divmod(placement.rank, dp)
    mesh = init_device_mesh(device.type, (job.pp, dp), mesh_dim_names=("pp", "dp"))
    model = build_model(job.arch, job.seed)
    module = build_stage(model, job, stage).to(device)
    del model
    wrapped, optimizer = _wrap(job, module, mesh["dp"])
    inputs, outputs = stage_shapes(job, stage)
    pipe = PipelineStage(
        wrapped, stage, job.pp, device, input_args=inputs, output_args=outputs, group=mesh["pp"].get_group()
    )
    schedule = Schedule1F1B(pipe, job.microbatches, loss_fn=loss_fn)
    recorder = P2PRecorder(stage, dp)
    pipe.forward_one_chunk = _phased(recorder, pipe.forward_one_chunk, "forward")  # type: ignore[method-assign]
    pipe.backward_one_chunk = _phased(recorder, pipe.backward_one_chunk, "backward")  # type: ignore[method-assign]
    first, last = stage == 0, stage == job.pp - 1
    losses: list[torch.Tensor] = []
    for step in range(WARMUP_STEPS + 1):
        measured = step == WARMUP_STEPS
        gen = torch.Generator().manual_seed(job.seed + 1000 * dp_index + 10 * step)
        shape = (job.batch * job.microbatches, job.seq)
        tokens = torch.randint(0, job.arch.vocab_size, shape, generator=gen).to(device)
        losses = []
        with recorder if measured else contextlib.nullcontext():
            recorder.phase = "forward"
            args = (tokens,) if first else ()
            schedule.step(*args, target=tokens if last else None, losses=losses if last else None)
            recorder.phase = "after_step"
            optimizer.step()
        if not measured:
            optimizer.zero_grad()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    opt_bytes, step_bytes = optimizer_bytes(optimizer)
    figures = StageMeasured(
        rank=placement.rank,
        stage=stage,
        params=sum(nbytes(p) for p in params),
        grads=sum(nbytes(p.grad) for p in params if p.grad is not None),
        optimizer=opt_bytes,
        step=step_bytes,
        loss=float(torch.stack([x.detach().float() for x in losses]).mean()) if losses else None,
        p2p=recorder.p2p,
        collectives=recorder.calls,
    )
    del losses, schedule, pipe, wrapped, optimizer, params, module
    gc.collect()
    return figures


def main(argv: list[str] | None = None) -> int:
    """A spawned rank: every pipeline configuration given (one JSON job per argument) in one world."""
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed.pipelining")
    return rank_main(PipelineJob, _measure, argv)


if __name__ == "__main__":
    procs.exit_now(main())
