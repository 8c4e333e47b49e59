"""The torch side of ``zerocalc validate``: one rank running configurations one after the other (imports
torch).

Run as ``python -m zerocalc.validate.worker JOB_JSON...`` by :func:`zerocalc.harness.procs.spawn_series`
(rank 0 hands each configuration's gathered figures back as soon as it has them), or called in-process
under torchrun (:func:`run_many`). Every configuration runs in the one process group. Each rank builds the
model from the same seed, wraps it in the real framework and runs ``WARMUP_STEPS`` steps, then the measured
step (A micro-batches of forward and backward, the first A-1 under ``no_sync()`` /
``set_requires_gradient_sync(False)`` with ``grad_sync`` last, then ``optimizer.step``; no ``zero_grad``
after it) on random tokens, and measures:

* collectives: every c10d collective of the measured step, seen by a ``TorchDispatchMode``
  (:class:`CollectiveRecorder`): the C++ ``ProcessGroup`` methods, DDP's reducer included, dispatch to the
  ``c10d::allreduce_`` ... ops (``torch/csrc/distributed/c10d/ProcessGroup.hpp``), so the Python mode
  sees them all, and DTensor's from inside its dispatch too; per call, in order, its operation, dtype, S,
  process group (global ranks) and broadcast source;

* params / grads: bytes of the parameters the optimizer sees and their ``.grad`` (DTensor: ``to_local()``;
  FSDP1: the sharded ``FlatParameter`` s);
* optimizer / step: ``optimizer.state`` tensors (``ZeroRedundancyOptimizer``: its local ``optim.state``),
  the ``step`` counters apart;
* unsharded_after_forward (FSDP only; DDP shards nothing, so it is not measured): right after the forward
  (before backward), the storage bytes of full parameters the framework still holds: FSDP1
  ``FlatParameter._full_param_padded`` (and the low-precision ``_mp_shard`` under NO_SHARD) whose storage
  is allocated; FSDP2 the ``all_gather_outputs`` of every ``FSDPParamGroup`` still ``is_unsharded``;
* on GPU also ``torch.cuda.max_memory_allocated``.

Under a ``dp × tp`` mesh (``Job.tp_plan``) the model gets torchtitan's TP plan on the tp sub-mesh
(:func:`parallelize`) before ``fully_shard`` over the dp sub-mesh, the ranks of a TP group take the same
tokens, and the loss runs under ``loss_parallel()`` when the plan keeps the logits vocab-sharded.

Rank 0 gathers every rank's figures with ``all_gather_object`` before tear-down; the model and optimizer
are freed (``gc.collect()``) before ``destroy_process_group`` (torch 2.13 can abort at exit otherwise).
Exit codes (:mod:`zerocalc.harness.procs`): 0 done, 1 failed (one line), 2 bad input, 3 timeout.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from zerocalc.harness import procs

if __name__ == "__main__":
    procs.exit_quietly_on_ctrl_c()  # before torch's slow import

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.bench.topology import Placement, placement_from_env, rendezvous_env
from zerocalc.network.cluster import RankGroup
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchWrapper
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate.config import (
    STRATEGIES,
    TEST_FAIL_ENV,
    WARMUP_STEPS,
    Job,
    Measured,
    RecordedCall,
    TpPlan,
)
from zerocalc.validate.model import Block, build_model, loss_fn

_C10D_OPS: dict[str, tuple[str, int, int, int, int | None]] = {
    "allreduce_": ("all_reduce", 0, 0, 1, None),
    "allreduce_coalesced_": ("all_reduce", 0, 0, 1, None),
    "broadcast_": ("broadcast", 0, 0, 1, 2),
    "reduce_": ("reduce", 0, 0, 1, 3),
    "allgather_": ("all_gather", 1, 0, 2, None),
    "allgather_coalesced_": ("all_gather", 1, 0, 2, None),
    "_allgather_base_": ("all_gather", 1, 0, 2, None),
    "allgather_into_tensor_coalesced_": ("all_gather", 1, 0, 2, None),
    "reduce_scatter_": ("reduce_scatter", 1, 0, 2, None),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 0, 2, None),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 0, 2, None),
    "alltoall_": ("all_to_all", 1, 0, 2, None),
    "alltoall_base_": ("all_to_all", 1, 0, 2, None),
    "gather_": ("gather", 1, 0, 2, 3),
    "scatter_": ("scatter", 1, 0, 2, 3),
}
"""torch 2.13 ``c10d`` op schemas (``torch/csrc/distributed/c10d/Ops.cpp``): the collective, and the argument
positions of its input, output, process group and root (a rank of the group)."""
_FUNCTIONAL_OPS: dict[str, tuple[str, int]] = {
    "all_reduce": ("all_reduce", 2),
    "all_reduce_": ("all_reduce", 2),
    "all_reduce_coalesced": ("all_reduce", 2),
    "all_gather_into_tensor": ("all_gather", 2),
    "all_gather_into_tensor_out": ("all_gather", 2),
    "all_gather_into_tensor_coalesced": ("all_gather", 2),
    "reduce_scatter_tensor": ("reduce_scatter", 3),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 3),
    "all_to_all_single": ("all_to_all", 3),
    "broadcast": ("broadcast", 2),
    "broadcast_": ("broadcast", 2),
}
"""``_c10d_functional`` ops (traceable collectives): the collective and the position of the group name."""
_DTYPES = {f"torch.{d.torch_name}": d.value for d in DType}


def _flat_tensors(x: Any) -> list[Any]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat_tensors(y)]
    return []


def _numel(x: Any) -> int:
    return sum(t.numel() for t in _flat_tensors(x))


def _dtype(x: Any) -> str:
    tensors = _flat_tensors(x)
    name = str(tensors[0].dtype) if tensors else "?"
    return _DTYPES.get(name, name.replace("torch.", ""))


def _ranks(group: Any) -> list[int]:
    if isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    return list(dist.get_process_group_ranks(group))


class CollectiveRecorder(TorchDispatchMode):
    """Every c10d collective dispatched while the mode is active, with the phase the runner sets."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[RecordedCall] = []
        self.phase = "forward"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(issubclass(t, DTensor) for t in types):
            # A mode runs before a tensor subclass and is off while its handler runs: handing a DTensor op
            # back lets DTensor run first, so the collectives it issues inside its dispatch (loss_parallel's
            # all-reduces, implicit redistributions) come here as plain-tensor ops
            # (``torch/distributed/tensor/debug/_comm_mode.py`` ``CommDebugMode`` does the same).
            return NotImplemented
        namespace = getattr(func, "namespace", None)
        name = func._schema.name.split("::")[-1]
        out = func(*args, **(kwargs or {}))
        if namespace == "c10d" and name in _C10D_OPS:
            op, i_in, i_out, i_group, i_root = _C10D_OPS[name]
            source, ranks = args[i_in], _ranks(args[i_group])
            elements = _numel(args[i_out]) if op == "all_gather" else _numel(source)
            root = int(args[i_root]) if i_root is not None else None
        elif namespace == "_c10d_functional" and name in _FUNCTIONAL_OPS:
            op, i_group = _FUNCTIONAL_OPS[name]
            source = args[0]
            ranks = _ranks(torch._C._distributed_c10d._resolve_process_group(args[i_group]))
            elements = _numel(out) if op == "all_gather" else _numel(source)
            root = None
        else:
            return out
        self.calls.append(
            RecordedCall(
                op=op, phase=self.phase, dtype=_dtype(source), elements=elements, group_ranks=ranks, root=root
            )
        )
        return out


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t: Any) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _storages(tensors: list[Any]) -> int:
    """Bytes of the distinct allocated storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() > 0:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _mesh(device: Any, job: Job) -> Any:
    """HYBRID_SHARD's 2-D mesh: replicate across the nodes, shard over the ranks of a node."""
    from torch.distributed.device_mesh import init_device_mesh

    nodes = dist.get_world_size() // job.gpus_per_node
    return init_device_mesh(device.type, (nodes, job.gpus_per_node), mesh_dim_names=("replicate", "shard"))


def _wrap(job: Job, model: Any, device: Any) -> tuple[Any, Any, Any]:
    """(wrapped model, optimizer, a function measuring the unsharded bytes after forward)."""
    setup = STRATEGIES[job.strategy][2]
    wrapper, sharding, reshard = setup.wrapper, setup.sharding, setup.reshard_after_forward
    bf16 = job.precision is PrecisionName.BF16_MIXED
    opt_class = torch.optim.AdamW if job.optimizer is OptimizerName.ADAMW else torch.optim.Adam
    lr = 1e-3
    if wrapper in (TorchWrapper.DDP, TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER):
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = model.to(device)
        wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if wrapper is TorchWrapper.DDP:
            optimizer = opt_class(wrapped.parameters(), lr=lr)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=opt_class, lr=lr)
        return wrapped, optimizer, lambda: None  # DDP shards nothing: nothing to measure
    if wrapper is TorchWrapper.FSDP1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        strategy = {
            Fsdp1Sharding.NO_SHARD: ShardingStrategy.NO_SHARD,
            Fsdp1Sharding.SHARD_GRAD_OP: ShardingStrategy.SHARD_GRAD_OP,
            Fsdp1Sharding.FULL_SHARD: ShardingStrategy.FULL_SHARD,
        }[sharding or Fsdp1Sharding.FULL_SHARD]
        hybrid = {}
        if setup.shard_group is RankGroup.NODE:  # FULL_SHARD inside a node, replicated across nodes
            strategy = ShardingStrategy.HYBRID_SHARD
            hybrid["device_mesh"] = _mesh(device, job)
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        wrapped = FSDP(
            model,
            sharding_strategy=strategy,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            mixed_precision=mp,
            device_id=device,
            use_orig_params=False,
            **hybrid,
        )
        optimizer = opt_class(wrapped.parameters(), lr=lr)

        def unsharded() -> int:
            held = []
            for unit in FSDP.fsdp_modules(wrapped):
                handle = unit._handle
                if handle is None:
                    continue
                flat = handle.flat_param
                for attr in ("_full_param_padded", "_mp_shard"):
                    t = getattr(flat, attr, None)
                    if t is not None and (attr == "_full_param_padded" or not handle.uses_sharded_strategy):
                        held.append(t)
            return _storages(held)

        return wrapped, optimizer, unsharded
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if job.tp_plan is not None:  # torchtitan's order: the TP plan on the tp mesh, then FSDP2 on the dp mesh
        plan = job.tp_plan
        mesh_2d = init_device_mesh(device.type, (plan.dp, plan.tp), mesh_dim_names=("dp", "tp"))
        model = parallelize(model.to(device), mesh_2d["tp"], plan)
        mesh = mesh_2d["dp"]
    elif setup.shard_group is RankGroup.NODE:
        mesh = _mesh(device, job)
    else:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    model = model.to(device)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    # The root with the default (None: "auto"), which keeps the root unsharded after forward; with
    # reshard=False every group stays unsharded anyway.
    fully_shard(model, mesh=mesh, mp_policy=policy, **({} if reshard else {"reshard_after_forward": False}))
    optimizer = opt_class(model.parameters(), lr=lr)

    def unsharded2() -> int:
        held = []
        for module in model.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                if group is not None and group.is_unsharded:
                    for fsdp_param in group.fsdp_params:
                        held.extend(fsdp_param.all_gather_outputs)
        return _storages(held)

    return model, optimizer, unsharded2


def parallelize(model: Any, tp_mesh: Any, plan: TpPlan) -> Any:
    """torchtitan's TP plan (:mod:`zerocalc.validate.tp`) applied to the validate model on ``tp_mesh``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    between = Shard(1) if plan.sequence_parallel else Replicate()  # the activations between blocks
    root: dict[str, Any] = {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "lm_head": ColwiseParallel(
            input_layouts=between,
            output_layouts=Shard(-1) if plan.loss_parallel else Replicate(),
            use_local_output=not plan.loss_parallel,
        ),
    }
    if plan.sequence_parallel:
        root["final_norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, root)
    for block in model.layers:
        mlp = ("fc_in", "fc_out") if block.mlp.gelu else ("gate_proj", "up_proj", "down_proj")
        layer: dict[str, Any] = {
            "attn": PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),)),
            "mlp": PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),)),
            "attn.o_proj": RowwiseParallel(output_layouts=between),
            f"mlp.{mlp[-1]}": RowwiseParallel(output_layouts=between),
        }
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", *(f"mlp.{m}" for m in mlp[:-1])):
            layer[name] = ColwiseParallel()
        if plan.sequence_parallel:
            layer["input_norm"] = SequenceParallel()
            layer["post_attention_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, layer)
    return model


def _loss_context(job: Job) -> Any:
    """``loss_parallel()`` around the loss and its backward when the logits stay vocab-sharded."""
    if job.tp_plan is not None and job.tp_plan.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def _sync(wrapped: Any, wrapper: TorchWrapper, sync: bool) -> Any:
    """The context a micro-batch runs in: gradients synchronised, or not (DDP and FSDP1 ``no_sync()`` on
    the root; FSDP2 ``set_requires_gradient_sync``)."""
    if wrapper is TorchWrapper.FSDP2:
        wrapped.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if sync else wrapped.no_sync()


def _measure(job: Job, placement: Placement, device: Any) -> Measured:
    model = build_model(job.arch, job.seed)
    wrapped, optimizer, unsharded = _wrap(job, model, device)
    wrapper = STRATEGIES[job.strategy][2].wrapper
    autocast_dtype = (
        torch.bfloat16
        if job.precision is PrecisionName.BF16_MIXED
        and wrapper in (TorchWrapper.DDP, TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER)
        else None
    )
    recorder = CollectiveRecorder()
    after_forward: int | None = None
    for step in range(WARMUP_STEPS + 1):
        measured = step == WARMUP_STEPS
        if measured and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with recorder if measured else contextlib.nullcontext():
            for micro in range(job.grad_accum):
                # the ranks of a TP group take the same tokens: the batch is split over dp only
                replica = placement.rank // job.tp_plan.tp if job.tp_plan is not None else placement.rank
                gen = torch.Generator().manual_seed(job.seed + 1000 * replica + 10 * step + micro)
                tokens = torch.randint(0, job.arch.vocab_size, (job.batch, job.seq), generator=gen).to(device)
                sync = job.grad_sync is GradSync.EVERY or micro == job.grad_accum - 1
                with _sync(wrapped, wrapper, sync):
                    recorder.phase = "forward"
                    with torch.autocast(
                        device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
                    ):
                        logits = wrapped(tokens)
                    if measured and micro == 0:
                        after_forward = unsharded()
                    with _loss_context(job):
                        loss = loss_fn(logits, tokens) / job.grad_accum
                        recorder.phase = "backward"
                        loss.backward()
            recorder.phase = "after_step"
            optimizer.step()
        if not measured:
            optimizer.zero_grad()
    zero = wrapper is TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER
    local_optim = optimizer.optim if zero else optimizer
    params = [p for group in local_optim.param_groups for p in group["params"]]
    if zero:  # every rank holds every parameter and gradient
        params = list(wrapped.parameters())
    opt_bytes = step_bytes = 0
    for state in local_optim.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                if key == "step":
                    step_bytes += _nbytes(value)
                else:
                    opt_bytes += _nbytes(value)
    measured_figures = Measured(
        rank=placement.rank,
        params=sum(_nbytes(p) for p in params),
        grads=sum(_nbytes(p.grad) for p in params if p.grad is not None),
        optimizer=opt_bytes,
        step=step_bytes,
        unsharded_after_forward=after_forward,
        peak_allocated=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        loss=float(_local(loss.detach()).float().item()),
        collectives=recorder.calls,
    )
    del logits, loss, wrapped, optimizer, local_optim, params, model
    gc.collect()
    return measured_figures


def _init(job: Job, placement: Placement) -> Any:
    os.environ.update(rendezvous_env())
    if job.backend == "nccl":
        device = torch.device("cuda", placement.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        job.backend,
        rank=placement.rank,
        world_size=placement.world_size,
        timeout=timedelta(seconds=job.timeout_s),
        **({"device_id": device} if device.type == "cuda" else {}),
    )
    return device


def _teardown() -> None:
    gc.collect()  # the model and optimizer are gone before destroy_process_group (torch 2.13 aborts)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _gathered(job: Job, placement: Placement, device: Any) -> list[Measured] | None:
    mine = _measure(job, placement, device)
    everyone: list[Any] = [None] * placement.world_size
    dist.all_gather_object(everyone, mine.model_dump())
    return [Measured.model_validate(m) for m in everyone] if placement.rank == 0 else None


def run_spawned(jobs: list[Job], placement: Placement, watchdog: procs.Watchdog) -> None:
    """This rank's part of every configuration in the spawned world; rank 0 hands each one's figures back
    (:func:`zerocalc.harness.procs.hand_back`) before the next starts. Any failure ends the world: the
    parent reports it as the configuration's and runs the rest in a fresh world."""
    device = _init(jobs[0], placement)
    try:
        for index, job in enumerate(jobs):
            watchdog.restart()
            if os.environ.get(TEST_FAIL_ENV) == job.strategy and placement.rank == 1:
                procs.exit_now(procs.EXIT_FAILED)
            figures = _gathered(job, placement, device)
            if figures is not None:
                procs.hand_back(json.dumps([m.model_dump() for m in figures]), index)
            gc.collect()
            dist.barrier()
    finally:
        _teardown()


Outcome = list[Measured] | str | None
"""Of one configuration: rank 0's gathered figures, None on other ranks, or a failure's one line."""


def run_many(jobs: list[Job], on_done: Callable[[int, Outcome, float], None] | None = None) -> list[Outcome]:
    """Under torchrun/srun: every configuration in one process group (initialised once: re-creating the
    default group in one process can hang on stale rendezvous keys). Per job: rank 0's figures, None on
    other ranks, or the one-line error of a configuration that failed (the others still run, though a
    failure inside a collective can leave the world unusable). ``on_done(index, outcome, seconds)`` is
    called after each job."""
    placement = placement_from_env()
    device = _init(jobs[0], placement)
    results: list[Outcome] = []
    try:
        for index, job in enumerate(jobs):
            start = time.monotonic()
            outcome: Outcome
            try:
                outcome = _gathered(job, placement, device)
            except Exception as exc:
                outcome = f"rank {placement.rank}: {type(exc).__name__}: {procs.first_line(exc)}"
            gc.collect()
            dist.barrier()
            results.append(outcome)
            if on_done is not None:
                on_done(index, outcome, time.monotonic() - start)
    finally:
        _teardown()
    return results


def main(argv: list[str] | None = None) -> int:
    """A spawned rank: every configuration given (one JSON job per argument) in one world."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # e.g. NO_SHARD's deprecation notice
    argv = sys.argv[1:] if argv is None else argv
    jobs = [Job.model_validate_json(text) for text in argv]
    placement = placement_from_env()
    watchdog = procs.Watchdog(jobs[0].timeout_s, placement.rank)

    def body() -> None:
        try:
            run_spawned(jobs, placement, watchdog)
        except InputError:
            raise
        except Exception as exc:
            procs.fail_rank(placement.rank, exc, jobs[0].timeout_s)
        watchdog.disarm()

    return procs.run_rank(body)


if __name__ == "__main__":
    procs.exit_now(main())
