"""Exact per-rank model-state bytes of a fine-tuning run (LoRA) under the real PyTorch frameworks (pure:
no torch): what ``zerocalc validate frameworks --lora-rank R`` compares rank by rank.

Every tensor and its kind is :func:`~zerocalc.parallel.finetune.parameter_kinds`' (the base model's
tensors frozen, PEFT 0.21's adapters trained), every dtype the precision record's
(:func:`~zerocalc.states.memory.finetune_dtypes`); each tensor is held as
:mod:`zerocalc.states.framework` holds it (DDP: whole; FSDP2: its dim-0 chunk,
:func:`~zerocalc.states.framework.dim0_shard_numel`). Lines per rank:

* ``params``: the trained tensors (the parameters the optimizer is given: ``p.requires_grad``) in their
  stored dtype (fp32 adapters: ``autocast_adapter_dtype``);
* ``frozen``: the frozen base in its stored dtype (the recipe's parameter dtype: bf16 under bf16-mixed,
  the base loaded in bf16 as LoRA recipes load it);
* ``grads``: ``.grad`` of the trained tensors only, in their main-gradient dtype (a frozen tensor has none:
  torch 2.13 autograd accumulates no gradient into a leaf that does not require it; DDP's reducer and
  FSDP2's ``FSDPParam`` keep the gradient in the sharded parameter's dtype);
* ``optimizer``/``step``: Adam's two states and one step counter per trained tensor (the optimizer sees no
  other; FSDP2 a counter for a DTensor whose local chunk is empty too);
* ``unsharded_after_forward`` (FSDP2): the groups left unsharded after the forward (the root;
  every group without ``reshard_after_forward``), frozen and trained tensors alike, dim 0 padded, in their
  all-gather dtype (``MixedPrecisionPolicy.param_dtype`` casts every parameter of a group before the
  all-gather: ``_fsdp_param.py`` ``init_dtype_attrs``).
"""

from __future__ import annotations

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.parallel.finetune import TRAINED_KINDS, parameter_kinds
from zerocalc.parallel.frameworks import TorchSetup, TorchWrapper
from zerocalc.parallel.optimizers import OPTIMIZERS
from zerocalc.request.training import TrainingRequest
from zerocalc.states.framework import (
    STEP_BYTES,
    Line,
    RankStates,
    dim0_padded_numel,
    dim0_shard_numel,
    fsdp_unit_positions,
)
from zerocalc.states.memory import finetune_dtypes

FINETUNE_WRAPPERS = (TorchWrapper.DDP, TorchWrapper.FSDP2)
"""The wrappers whose fine-tuning states are modelled rank by rank here."""


def finetune_rank_states(
    request: TrainingRequest, setup: TorchSetup, world_size: int, rank: int
) -> RankStates:
    """Exact bytes rank ``rank`` of the ``world_size`` ranks a parameter is sharded over holds after a
    fine-tuning step of ``request`` (its ``finetune`` set) under ``setup`` (DDP or FSDP2)."""
    finetune = request.finetune
    assert finetune is not None
    if setup.wrapper not in FINETUNE_WRAPPERS:
        raise InputError(
            f"{setup.wrapper.value}'s fine-tuning states are not modelled rank by rank; accepted: "
            + ", ".join(w.value for w in FINETUNE_WRAPPERS)
        )
    fsdp2 = setup.wrapper is TorchWrapper.FSDP2
    kinded = parameter_kinds(request.architecture, finetune)
    dtypes = {k.kind: finetune_dtypes(request, k.kind) for k in kinded}

    def local(shape: tuple[int, ...]) -> int:
        return dim0_shard_numel(shape, world_size, rank) if fsdp2 else _numel(shape)

    trained = [k for k in kinded if k.kind in TRAINED_KINDS]
    frozen = [k for k in kinded if k.kind not in TRAINED_KINDS]
    params = sum(local(k.tensor.shape) * dtypes[k.kind].stored.bytes for k in trained)
    frozen_bytes = sum(local(k.tensor.shape) * dtypes[k.kind].stored.bytes for k in frozen)
    grads = sum(local(k.tensor.shape) * _dtype(dtypes[k.kind].main_gradient).bytes for k in trained)
    rule = OPTIMIZERS[request.optimizer]
    states = len(rule.states)
    optimizer = sum(
        sum(rule.state_bytes(local(k.tensor.shape), _dtype(dtypes[k.kind].optimizer_state)).values())
        for k in trained
    )
    elements = sum(local(k.tensor.shape) for k in trained)
    held = "dim-0 chunks" if fsdp2 else "whole, replicated"
    if fsdp2:
        kept = 0
        tensors = [k.tensor for k in kinded]
        for name, unit in fsdp_unit_positions(tensors):
            if not setup.reshard_after_forward or name == "root":
                kept += sum(
                    dim0_padded_numel(kinded[i].tensor.shape, world_size)
                    * dtypes[kinded[i].kind].all_gather.bytes
                    for i in unit
                )
        which = "every group" if not setup.reshard_after_forward else "the root group"
        unsharded = Line(
            bytes=kept,
            explanation=f"{which}'s padded unsharded parameters, frozen ones too (all-gather dtype)",
        )
    else:
        unsharded = Line(bytes=0, explanation="none: DDP never shards parameters")
    return RankStates(
        setup=setup,
        world_size=world_size,
        rank=rank,
        precision=request.precision,
        optimizer=request.optimizer,
        params=Line(
            bytes=params, explanation=f"{len(trained)} trained tensors ({elements:,} elements, {held})"
        ),
        frozen=Line(
            bytes=frozen_bytes, explanation=f"{len(frozen)} frozen base tensors ({held}), stored dtype"
        ),
        grads=Line(bytes=grads, explanation="the trained tensors' .grad only"),
        optimizer_states=Line(bytes=optimizer, explanation=f"{states} states of the trained tensors only"),
        step=Line(
            bytes=len(trained) * STEP_BYTES, explanation=f"{len(trained)} step counters (trained only)"
        ),
        unsharded_after_forward=unsharded,
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _dtype(dtype: DType | None) -> DType:
    assert dtype is not None  # a trained tensor has a gradient and optimizer states
    return dtype
