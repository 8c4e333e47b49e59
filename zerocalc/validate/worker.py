"""The torch side of ``zerocalc validate``: one rank running configurations one after the other (imports
torch).

Run as ``python -m zerocalc.validate.worker JOB_JSON...`` by :func:`zerocalc.harness.procs.spawn_series`
(rank 0 hands each configuration's gathered figures back as soon as it has them), or called in-process
under torchrun (:func:`run_many`). Every configuration runs in the one process group. Each rank builds the
model from the same seed, wraps it in the real framework and runs ``WARMUP_STEPS`` steps, then the measured
step (A micro-batches of forward and backward, the first A-1 under ``no_sync()`` /
``set_requires_gradient_sync(False)`` with ``grad_sync`` last, then ``optimizer.step``; no ``zero_grad``
after it) on random tokens, and measures:

* collectives: every c10d collective of the measured step, in order, DDP's reducer's and DTensor's
  included (:class:`~zerocalc.validate.measure.CollectiveRecorder`);

* params / grads: bytes of the parameters the optimizer sees (those that require a gradient) and their
  ``.grad`` (DTensor: ``to_local()``; FSDP1: the sharded ``FlatParameter`` s);
* frozen (``Job.finetune``: PEFT's LoRA of the model, :func:`build`): bytes of the wrapped model's
  parameters that require no gradient (DTensor: ``to_local()``);
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

What is around the measurement (the jobs read, the world joined once, rank 0 gathering every rank's
figures, the tear-down, the exit codes) is :mod:`zerocalc.validate.rank_main`'s, shared with the pipeline
and expert-parallel workers; this module declares how one rank measures one configuration
(:func:`_measure`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable
from typing import Any

from zerocalc.harness import procs

if __name__ == "__main__":
    procs.exit_quietly_on_ctrl_c()  # before torch's slow import

import torch
import torch.distributed as dist

from zerocalc.bench.topology import Placement, placement_from_env
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
    TpPlan,
)
from zerocalc.validate.measure import CollectiveRecorder, local, nbytes, optimizer_bytes, storage_bytes
from zerocalc.validate.model import Block, build_model, loss_fn
from zerocalc.validate.rank_main import gathered, init_world, rank_main, tear_down


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
            optimizer = opt_class(_trained(wrapped), lr=lr)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(_trained(wrapped), optimizer_class=opt_class, lr=lr)
        return wrapped, optimizer, lambda: None  # DDP shards nothing: nothing to measure
    if wrapper is TorchWrapper.FSDP1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

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
            auto_wrap_policy=_fsdp1_policy(job, model),
            mixed_precision=mp,
            device_id=device,
            use_orig_params=False,
            **hybrid,
        )
        optimizer = opt_class(_trained(wrapped), lr=lr)

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
            return storage_bytes(held)

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
    optimizer = opt_class(_trained(model), lr=lr)

    def unsharded2() -> int:
        held = []
        for module in model.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                if group is not None and group.is_unsharded:
                    for fsdp_param in group.fsdp_params:
                        held.extend(fsdp_param.all_gather_outputs)
        return storage_bytes(held)

    return model, optimizer, unsharded2


def _fsdp1_policy(job: Job, model: Any) -> Any:
    """FSDP1's auto-wrap policy: a unit per block; under LoRA PEFT's own (peft 0.21.2 ``utils/other.py``
    ``fsdp_auto_wrap_policy``, as PEFT's FSDP examples set it on accelerate's plugin:
    ``fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)``): every leaf module with a trained
    ``weight`` its own unit (each adapter Linear, a DoRA magnitude, a ``modules_to_save`` copy), and the
    blocks, named as transformers names its decoder layer (``_no_split_modules``, which PEFT reads)."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    if job.finetune is None:
        return ModuleWrapPolicy({Block})
    from peft.utils.other import fsdp_auto_wrap_policy

    model._no_split_modules = [Block.__name__]
    return fsdp_auto_wrap_policy(model)


def _trained(model: Any) -> list[Any]:
    """The parameters the optimizer is given: those that require a gradient (every one in full training;
    PEFT's adapters under LoRA, as fine-tuning scripts pass them)."""
    return [p for p in model.parameters() if p.requires_grad]


def _lora_targets(job: Job, model: Any) -> list[str] | str | None:
    """The ``target_modules`` given to PEFT for validate's model (no ``model_type`` of its own): the names
    asked for; by default PEFT's own for the architecture's family
    (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``); ``all-linear``: every ``nn.Linear`` but the
    LM head, as PEFT's ``_maybe_include_all_linear_layers`` picks them on a transformers model (whose
    output embedding it leaves out; on another module it would keep it)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    from zerocalc.model.adapters import ALL_LINEAR

    assert job.finetune is not None and job.finetune.lora is not None
    targets = job.finetune.lora.targets
    if targets is None:
        return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[job.arch.family or ""])
    if targets == ALL_LINEAR:
        return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    return None  # lora.targets: the names asked for


def build(job: Job) -> Any:
    """Validate's model from the job's seed; under ``job.finetune`` the base loaded in the recipe's
    parameter dtype (bf16 under bf16-mixed, as LoRA recipes load it), then PEFT's LoRA
    (:func:`zerocalc.validate.peft_model.lora_model`), returned as the adapted model itself (PEFT injects
    its layers in place), which the framework wraps."""
    model = build_model(job.arch, job.seed)
    if job.finetune is None or job.finetune.lora is None:
        return model
    from zerocalc.validate.peft_model import lora_model

    if job.precision is PrecisionName.BF16_MIXED:
        model = model.to(torch.bfloat16)
    return lora_model(model, job.finetune.lora, _lora_targets(job, model)).base_model.model


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
    model = build(job)
    wrapped, optimizer, unsharded = _wrap(job, model, device)
    wrapper = STRATEGIES[job.strategy][2].wrapper
    # DDP's bf16-mixed is autocast; FSDP1 under LoRA runs its forward in autocast too, as accelerate's
    # prepare_model wraps it (accelerate 1.x accelerator.py: native_amp), since PEFT casts a LoRA input to
    # the adapter's stored fp32 (peft 0.21.2 tuners/lora/layer.py _cast_input_dtype) before the adapter's
    # FSDP unit gathers it in MixedPrecision's bf16
    autocast_dtype = (
        torch.bfloat16
        if job.precision is PrecisionName.BF16_MIXED
        and (
            wrapper in (TorchWrapper.DDP, TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER)
            or (wrapper is TorchWrapper.FSDP1 and job.finetune is not None)
        )
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
    opt_bytes, step_bytes = optimizer_bytes(local_optim)
    frozen = (
        None if job.finetune is None else sum(nbytes(p) for p in wrapped.parameters() if not p.requires_grad)
    )
    measured_figures = Measured(
        rank=placement.rank,
        params=sum(nbytes(p) for p in params),
        grads=sum(nbytes(p.grad) for p in params if p.grad is not None),
        optimizer=opt_bytes,
        step=step_bytes,
        unsharded_after_forward=after_forward,
        frozen=frozen,
        peak_allocated=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        loss=float(local(loss.detach()).float().item()),
        collectives=recorder.calls,
    )
    del logits, loss, wrapped, optimizer, local_optim, params, model
    gc.collect()
    return measured_figures


def _gathered(job: Job, placement: Placement, device: Any) -> list[Measured] | None:
    everyone = gathered(_measure(job, placement, device), placement)
    return None if everyone is None else [Measured.model_validate(m) for m in everyone]


def _failure_for_tests(job: Job, placement: Placement) -> None:
    """Rank 1 dies before measuring the strategy :data:`~zerocalc.validate.config.TEST_FAIL_ENV` names."""
    if os.environ.get(TEST_FAIL_ENV) == job.strategy and placement.rank == 1:
        procs.exit_now(procs.EXIT_FAILED)


Outcome = list[Measured] | str | None
"""Of one configuration: rank 0's gathered figures, None on other ranks, or a failure's one line."""


def run_many(jobs: list[Job], on_done: Callable[[int, Outcome, float], None] | None = None) -> list[Outcome]:
    """Under torchrun/srun: every configuration in one process group (initialised once: re-creating the
    default group in one process can hang on stale rendezvous keys). Per job: rank 0's figures, None on
    other ranks, or the one-line error of a configuration that failed (the others still run, though a
    failure inside a collective can leave the world unusable). ``on_done(index, outcome, seconds)`` is
    called after each job."""
    placement = placement_from_env()
    device = init_world(jobs[0], placement)
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
        tear_down()
    return results


def main(argv: list[str] | None = None) -> int:
    """A spawned rank: every configuration given (one JSON job per argument) in one world."""
    return rank_main(Job, _measure, argv, before=_failure_for_tests)


if __name__ == "__main__":
    procs.exit_now(main())
