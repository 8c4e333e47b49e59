"""Framework profiles: one declarative record per framework, saying whose accounting the peak follows.

A :class:`Profile` names how the model states are counted (:class:`StatesModel`, implemented in
:mod:`zerocalc.peak.states`), which lines the framework's own estimate covers, what it accepts, and its
source. Which strategies a framework runs, and how, is in the Strategy records
(:mod:`zerocalc.parallel.strategies`); buffers follow each strategy's
:class:`~zerocalc.parallel.strategies.BufferRule`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from zerocalc.parallel.frameworks import TORCH_OPTIMIZERS, TORCH_PRECISIONS, Framework
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName


class Wrap(StrEnum):
    BLOCK = "block"
    """One FSDP/ZeRO-3 unit per transformer block; embeddings and head in the root unit."""
    MODEL = "model"
    """The whole model is one unit: gathered whole, so ZeRO-3 saves nothing at the peak."""


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


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True)

    framework: Framework
    states: StatesModel
    source: str
    estimate_covers_states_only: bool = False
    """The framework's own estimate counts model states (and its own buffer term) only: every other line
    is marked as outside it (DeepSpeed)."""
    precisions: tuple[PrecisionName, ...] = tuple(PrecisionName)
    optimizers: tuple[OptimizerName, ...] = tuple(OptimizerName)
    fp32_grad_accum: bool = True
    offload: bool = True
    wrap_model: bool = True
    moe: bool = True
    accepts: str = ""
    """What the profile accepts, for the message when a request asks for something else."""
    needs_architecture: bool = True
    """Its model states need the architecture (the PyTorch frameworks count each tensor); False: the
    parameter count is enough (its strategies may still need more: :func:`architecture_problem`)."""


PROFILES: dict[Framework, Profile] = {
    p.framework: p
    for p in (
        Profile(
            framework=Framework.PAPER,
            states=StatesModel.PAPER,
            source="ZeRO paper (Rajbhandari et al. 2020) §5; FSDP docs for units",
        ),
        Profile(
            framework=Framework.DEEPSPEED,
            states=StatesModel.DEEPSPEED_ESTIMATOR,
            source="DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs "
            "(needs fp16/bf16 mixed Adam)",
            estimate_covers_states_only=True,
            needs_architecture=False,
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
            precisions=_MIXED,
            optimizers=_ADAM,
            fp32_grad_accum=False,
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
                offload=False,
                wrap_model=False,
                accepts="Adam/AdamW on fp32 parameters and gradients (MixedPrecision keeps them fp32); "
                "accepted: {precision} fp32, bf16-mixed or fp16-mixed, {optimizer} adam or adamw, "
                "no {fp32_grad_accum} (or {framework} paper)",
            )
            for framework, source in (
                (Framework.FSDP, "torch 2.13 FSDP1"),
                (Framework.FSDP2, "torch 2.13 FSDP2 (largest rank)"),
                (Framework.TORCH_ZERO1, "torch 2.13 DDP"),
                (Framework.DDP, "torch 2.13 DDP"),
            )
        ),
    )
}
"""Every framework's profile. The PyTorch ones model exactly what ``zerocalc validate`` measures."""
