"""Exact per-rank model-state bytes of a fine-tuning run (LoRA) under the real PyTorch frameworks (pure:
no torch): what ``zerocalc validate frameworks --lora-rank R`` compares rank by rank.

Every tensor and its kind is :func:`~zerocalc.parallel.finetune.parameter_kinds`' (the base model's
tensors frozen, PEFT 0.21's adapters trained), every dtype the precision record's
(:func:`~zerocalc.states.memory.finetune_dtypes`); each tensor is held as
:mod:`zerocalc.states.framework` holds it (DDP: whole; FSDP2: its dim-0 chunk,
:func:`~zerocalc.states.framework.dim0_shard_numel`; FSDP1, ``use_orig_params=False``: its unit's flat
parameter, one per unit of PEFT's ``fsdp_auto_wrap_policy``
(:func:`~zerocalc.states.framework.peft_fsdp1_unit_positions`: each adapter Linear its own unit, so a
flat parameter is all trained or all frozen), padded to a multiple of N, rank r holding its
``ceil(numel / N)`` chunk, :func:`~zerocalc.states.framework.fsdp1_shard_numel`; the optimizer is given
the trained flat parameters and keeps one state set and step per flat parameter). Lines per rank:

* ``params``: the trained tensors (the parameters the optimizer is given: ``p.requires_grad``) in their
  stored dtype (fp32 adapters: ``autocast_adapter_dtype``);
* ``frozen``: the frozen base in its stored dtype (the recipe's parameter dtype: bf16 under bf16-mixed,
  the base loaded in bf16 as LoRA recipes load it);
* ``grads``: ``.grad`` of the trained tensors only, in their main-gradient dtype (a frozen tensor has none:
  torch 2.13 autograd accumulates no gradient into a leaf that does not require it; DDP's reducer and
  FSDP2's ``FSDPParam`` keep the gradient in the sharded parameter's dtype);
* ``optimizer``/``step``: Adam's two states and one step counter per trained tensor (the optimizer sees no
  other; FSDP2 a counter for a DTensor whose local chunk is empty too);
* ``unsharded_after_forward`` (FSDP1): the root unit's padded flat parameter under FULL_SHARD (torch 2.13
  ``_runtime_utils.py`` ``_post_forward_reshard``: the root is not resharded), every unit's under
  SHARD_GRAD_OP, none under NO_SHARD, in the unit's all-gather dtype (``MixedPrecision.param_dtype``);
* ``unsharded_after_forward`` (FSDP2): the groups left unsharded after the forward (the root;
  every group without ``reshard_after_forward``), frozen and trained tensors alike, dim 0 padded, in their
  all-gather dtype (``MixedPrecisionPolicy.param_dtype`` casts every parameter of a group before the
  all-gather: ``_fsdp_param.py`` ``init_dtype_attrs``).
"""

from __future__ import annotations

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.parallel.finetune import TRAINED_KINDS, parameter_kinds
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchSetup, TorchWrapper
from zerocalc.parallel.optimizers import OPTIMIZERS
from zerocalc.request.training import TrainingRequest
from zerocalc.states.framework import (
    STEP_BYTES,
    Line,
    RankStates,
    dim0_padded_numel,
    dim0_shard_numel,
    fsdp1_padded_numel,
    fsdp1_shard_numel,
    fsdp_unit_positions,
    peft_fsdp1_unit_positions,
)
from zerocalc.states.memory import finetune_dtypes

FINETUNE_WRAPPERS = (TorchWrapper.DDP, TorchWrapper.FSDP1, TorchWrapper.FSDP2)
"""The wrappers whose fine-tuning states are modelled rank by rank here."""


def finetune_rank_states(
    request: TrainingRequest, setup: TorchSetup, world_size: int, rank: int
) -> RankStates:
    """Exact bytes rank ``rank`` of the ``world_size`` ranks a parameter is sharded over holds after a
    fine-tuning step of ``request`` (its ``finetune`` set) under ``setup`` (DDP, FSDP1 or FSDP2)."""
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
    if setup.wrapper is TorchWrapper.FSDP1:
        return _fsdp1_rank_states(request, setup, world_size, rank)

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


def _fsdp1_rank_states(request: TrainingRequest, setup: TorchSetup, world_size: int, rank: int) -> RankStates:
    """:func:`finetune_rank_states` under FSDP1 (``use_orig_params=False``, PEFT's wrap policy): every
    line per flat parameter, each unit's tensors of one kind (one dtype: FSDP1 flattens one dtype and one
    ``requires_grad`` per flat parameter, ``_flat_param.py`` ``_validate_tensors_to_flatten``)."""
    assert request.finetune is not None
    kinded = parameter_kinds(request.architecture, request.finetune)
    dtypes = {k.kind: finetune_dtypes(request, k.kind) for k in kinded}
    trained_of = [k.kind in TRAINED_KINDS for k in kinded]
    units = peft_fsdp1_unit_positions([k.tensor for k in kinded], trained_of)
    sharding = setup.sharding or Fsdp1Sharding.FULL_SHARD
    rule = OPTIMIZERS[request.optimizer]
    params = frozen = grads = optimizer = kept = elements = 0
    n_trained = n_frozen = 0
    kept_units = 0
    for name, unit in units:
        kinds = {kinded[i].kind for i in unit}
        if len(kinds) != 1 or len({dtypes[k].stored for k in kinds}) != 1:
            raise InputError(
                f"FSDP1's unit {name} would flatten tensors of kinds "
                f"{', '.join(sorted(k.value for k in kinds))} "
                "into one flat parameter (use_orig_params=False needs one dtype and one requires_grad); "
                "accepted: LoRA targets and modules_to_save that PEFT's fsdp_auto_wrap_policy separates"
            )
        dt = dtypes[kinds.pop()]
        numel = sum(kinded[i].tensor.numel for i in unit)
        local = fsdp1_shard_numel(numel, world_size, sharding)
        if trained_of[unit[0]]:
            n_trained += 1
            elements += local
            params += local * dt.stored.bytes
            grads += local * _dtype(dt.main_gradient).bytes
            optimizer += sum(rule.state_bytes(local, _dtype(dt.optimizer_state)).values())
        else:
            n_frozen += 1
            frozen += local * dt.stored.bytes
        if sharding is Fsdp1Sharding.SHARD_GRAD_OP or (
            sharding is Fsdp1Sharding.FULL_SHARD and name == "root"
        ):
            kept += fsdp1_padded_numel(numel, world_size) * dt.all_gather.bytes
            kept_units += 1
    pad = "" if sharding is Fsdp1Sharding.NO_SHARD else ", padded to a multiple of N"
    if sharding is Fsdp1Sharding.NO_SHARD:
        kept_text = "none: NO_SHARD keeps whole flat parameters"
    elif sharding is Fsdp1Sharding.FULL_SHARD:
        kept_text = "the root unit's padded flat parameter (all-gather dtype); the other units resharded"
    else:
        kept_text = f"all {kept_units} padded flat parameters (all-gather dtype): SHARD_GRAD_OP"
    return RankStates(
        setup=setup,
        world_size=world_size,
        rank=rank,
        precision=request.precision,
        optimizer=request.optimizer,
        params=Line(
            bytes=params,
            explanation=f"{n_trained} trained flat parameters ({elements:,} elements on this rank{pad})",
        ),
        frozen=Line(bytes=frozen, explanation=f"{n_frozen} frozen flat parameters{pad}, stored dtype"),
        grads=Line(bytes=grads, explanation="the trained flat parameters' sharded .grad only"),
        optimizer_states=Line(
            bytes=optimizer, explanation=f"{len(rule.states)} states of the trained flat parameters only"
        ),
        step=Line(
            bytes=n_trained * STEP_BYTES,
            explanation=f"{n_trained} step counters (one per trained flat param)",
        ),
        unsharded_after_forward=Line(bytes=kept, explanation=kept_text),
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _dtype(dtype: DType | None) -> DType:
    assert dtype is not None  # a trained tensor has a gradient and optimizer states
    return dtype
