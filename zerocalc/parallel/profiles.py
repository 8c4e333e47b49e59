"""Framework profiles: one declarative record per framework, saying whose accounting the peak follows.

A :class:`Profile` names how the model states are counted (:class:`StatesModel`, implemented in
:mod:`zerocalc.peak.states`), which lines the framework's own estimate covers, what it accepts, and its
source. Which strategies a framework runs, and how, is in the Strategy records
(:mod:`zerocalc.parallel.strategies`); buffers follow each strategy's
:class:`~zerocalc.parallel.strategies.BufferRule`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.parallel.frameworks import TORCH_OPTIMIZERS, TORCH_PRECISIONS, Framework
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.parallel.strategies import OffloadTarget


class Wrap(StrEnum):
    BLOCK = "block"
    """One FSDP/ZeRO-3 unit per transformer block; embeddings and head in the root unit."""
    MODEL = "model"
    """The whole model is one unit: gathered whole, so ZeRO-3 saves nothing at the peak."""


class ModelInit(StrEnum):
    """How the model is created on each rank before its first step (``--init``)."""

    META = "meta"
    """Built on the meta device, sharded, then ``to_empty`` and each rank's shard initialised (FSDP2's
    large-model path, torchtitan; DeepSpeed ``zero.Init``): no whole-model tensor on the GPU."""
    GPU = "gpu"
    """The whole model materialised on every GPU in fp32 (``from_config``), then sharded."""
    CPU = "cpu"
    """Built or loaded on the host (``from_pretrained``), then moved to the GPU unit by unit as it is
    sharded, or whole where nothing is sharded."""


class StatesModel(StrEnum):
    """How a profile counts model states (and which buffers come with them)."""

    PAPER = "paper"
    """ZeRO paper §5 (:mod:`zerocalc.states.memory`), plus each strategy's buffer rule."""
    DEEPSPEED_ESTIMATOR = "deepspeed_estimator"
    """DeepSpeed's ``estimate_zero2/zero3_model_states_mem_needs`` (:mod:`zerocalc.states.deepspeed`)."""
    MEGATRON_DISTRIBUTED_OPTIMIZER = "megatron_distributed_optimizer"
    """Megatron-LM: bf16 params + fp32 main grads + 12/d bytes of optimizer state (no buffers counted;
    :mod:`zerocalc.states.megatron`)."""
    TORCH_EXACT = "torch_exact"
    """PyTorch's real per-rank allocations (:mod:`zerocalc.states.framework`) and its own buffers."""


_ADAM = (OptimizerName.ADAM, OptimizerName.ADAMW)
_MIXED = (PrecisionName.BF16_MIXED, PrecisionName.FP16_MIXED)


class Profile(NamedTuple):
    framework: Framework
    states: StatesModel
    source: str
    init: ModelInit
    """How a sharded job of this framework creates its model when ``--init`` is not given: its documented
    path (:attr:`init_source`)."""
    init_source: str
    estimate_covers_states_only: bool = False
    """The framework's own estimate counts model states (and its own buffer term) only: every other line
    is marked as outside it (DeepSpeed)."""
    precisions: tuple[PrecisionName, ...] = tuple(PrecisionName)
    optimizers: tuple[OptimizerName, ...] = tuple(OptimizerName)
    fp32_grad_accum: bool = True
    offload_optimizer: tuple[OffloadTarget, ...] = tuple(OffloadTarget)
    """Where its memory model can put the optimizer (``--offload-optimizer``; the strategy's rule applies
    too)."""
    offload_params: tuple[OffloadTarget, ...] = tuple(OffloadTarget)
    """Where its memory model can put the parameters (``--offload-params``)."""
    offload_source: str = "ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity for NVMe"
    """Whose offload it models."""
    offload_moves: str = (
        "master copy and optimizer states move off the GPU, and so do partitioned gradients, which the "
        "host-side optimizer step consumes"
    )
    """What an offloaded optimizer takes off the GPU, and what stays."""
    wrap_model: bool = True
    moe: bool = True
    accepts: str = ""
    """What the profile accepts, for the message when a request asks for something else."""
    needs_architecture: bool = True
    """Its model states need the architecture (the PyTorch frameworks count each tensor); False: the
    parameter count is enough (its strategies may still need more: :func:`architecture_problem`)."""
    init_in_param_dtype: bool = False
    """``--init gpu`` allocates the parameters in the compute dtype, not fp32 (Megatron-LM's
    ``params_dtype``)."""
    host_copy_per_node: bool = False
    """``--init cpu`` holds one host copy of the model per node (the node's first rank loads it, the others
    receive it: accelerate's ``cpu_ram_efficient_loading``, FSDP ``sync_module_states``); else every rank
    builds its own."""


PROFILES: dict[Framework, Profile] = {
    p.framework: p
    for p in (
        Profile(
            framework=Framework.PAPER,
            states=StatesModel.PAPER,
            source="ZeRO paper (Rajbhandari et al. 2020) §5; FSDP docs for units",
            init=ModelInit.META,
            init_source="the ZeRO paper counts model states only: creation allocates no more than them",
        ),
        Profile(
            framework=Framework.DEEPSPEED,
            states=StatesModel.DEEPSPEED_ESTIMATOR,
            source="DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs "
            "(needs fp16/bf16 mixed Adam)",
            estimate_covers_states_only=True,
            needs_architecture=False,
            init=ModelInit.META,
            init_source="DeepSpeed docs, Constructing Massive Models: the model built under "
            "deepspeed.zero.Init (ZeRO-3; each parameter partitioned as it is created)",
            precisions=_MIXED,
            optimizers=_ADAM,
            fp32_grad_accum=False,
            accepts="mixed-precision Adam; accepted: {precision} bf16-mixed or fp16-mixed with "
            "{optimizer} adam/adamw (or {framework} paper)",
        ),
        Profile(
            framework=Framework.MEGATRON,
            states=StatesModel.MEGATRON_DISTRIBUTED_OPTIMIZER,
            source="Megatron-LM distributed optimizer (bf16 params, fp32 main grads, Adam)",
            needs_architecture=False,
            init=ModelInit.GPU,
            init_source="Megatron-LM initialises each rank's parameters on its GPU in params_dtype "
            "(its CPU initialisation option off by default)",
            init_in_param_dtype=True,
            precisions=_MIXED,
            optimizers=_ADAM,
            fp32_grad_accum=False,
            offload_optimizer=(OffloadTarget.NONE, OffloadTarget.CPU),
            offload_params=(OffloadTarget.NONE,),
            offload_source="Megatron-Core optimizer CPU offload (optimizer_cpu_offload, "
            "optimizer_offload_fraction 1.0, use_precision_aware_optimizer; "
            "megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py)",
            offload_moves="the fp32 master copy, Adam's m and v and a copy of the main gradients on the "
            "host; the 16-bit parameters and the fp32 main gradients stay on the GPU (the peak; this table "
            "is the paper's)",
            accepts="mixed-precision Adam; accepted: {precision} bf16-mixed or fp16-mixed with "
            "{optimizer} adam/adamw (or {framework} paper)",
        ),
        *(
            Profile(
                framework=framework,
                states=StatesModel.TORCH_EXACT,
                source=source,
                precisions=TORCH_PRECISIONS,
                optimizers=TORCH_OPTIMIZERS,
                fp32_grad_accum=False,
                offload_optimizer=(OffloadTarget.NONE,),
                offload_params=(OffloadTarget.NONE,),
                wrap_model=False,
                accepts="Adam/AdamW on fp32 parameters and gradients (MixedPrecision keeps them fp32); "
                "accepted: {precision} fp32, bf16-mixed or fp16-mixed, {optimizer} adam or adamw, "
                "no {fp32_grad_accum} (or {framework} paper)",
                init=init,
                init_source=init_source,
                host_copy_per_node=framework in (Framework.FSDP, Framework.FSDP2),
            )
            for framework, source, init, init_source in (
                (
                    Framework.FSDP,
                    "torch 2.13 FSDP1",
                    ModelInit.CPU,
                    "FullyShardedDataParallel docs (device_id, sync_module_states): the model on the host, "
                    "moved to the GPU unit by unit as it is sharded",
                ),
                (
                    Framework.FSDP2,
                    "torch 2.13 FSDP2 (largest rank)",
                    ModelInit.META,
                    "fully_shard docs and torchtitan: built on the meta device, sharded, to_empty, "
                    "each shard initialised",
                ),
                (
                    Framework.TORCH_ZERO1,
                    "torch 2.13 DDP",
                    ModelInit.CPU,
                    "DDP tutorial: the model built on the host, then .to(rank) whole",
                ),
                (
                    Framework.DDP,
                    "torch 2.13 DDP",
                    ModelInit.CPU,
                    "DDP tutorial: the model built on the host, then .to(rank) whole",
                ),
            )
        ),
    )
}
"""Every framework's profile. The PyTorch ones model exactly what ``zerocalc validate`` measures."""
