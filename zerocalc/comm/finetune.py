"""What a fine-tuning run (LoRA, QLoRA, frozen modules: :mod:`zerocalc.parallel.finetune`) changes of the
data-parallel collectives and of the host copies of FSDP's CPU offload (pure, no torch).

Every tensor's kind is :func:`~zerocalc.parallel.finetune.parameter_kinds`' and its dtype per role the
precision record's (:func:`~zerocalc.states.memory.finetune_dtypes`); a rule's calls are then the ones
:mod:`zerocalc.comm.calls` makes over the tensors the rule moves:

* **gradients** (DDP's bucketed all-reduce, FSDP's and ZeRO's reduce-scatter): the trained tensors only
  (adapters, ``modules_to_save`` copies, unfrozen parameters), in their kind's reduce dtype. DDP builds its
  buckets of the parameters that require grad (torch 2.13 ``nn/parallel/distributed.py``
  ``_build_params_for_reducer``: ``if p.requires_grad``); FSDP2 reduce-scatters only the parameters of a
  group that have a gradient and none for a group without one (``_fully_shard/_fsdp_param_group.py``
  ``post_backward``: ``fsdp_params_with_grad``, ``if len(fsdp_params_with_grad) == 0: return``); under FSDP1
  PEFT's ``fsdp_auto_wrap_policy`` (peft 0.21.2 ``utils/other.py`` ``lambda_policy_fn``: every leaf module
  with a trained weight its own unit) keeps each flat parameter all frozen or all trained, so FSDP1 too
  reduces the trained tensors' elements only, one reduce-scatter per trained unit (each adapter Linear's
  flat gradient, padded to a multiple of N; a unit mixing frozen and trained parameters under
  ``use_orig_params=True`` would reduce its whole flat gradient, zeros included: ``_flat_param.py``).
* **parameters gathered for compute** (FSDP1/FSDP2, ZeRO-3, forward and the backward re-gather): every
  tensor, frozen and quantised alike, in its kind's all-gather dtype; a quantised weight as bitsandbytes
  stores it, the packed tensor of ``(n + 1) // (2·s)`` elements of the storage dtype of s bytes
  (bitsandbytes 0.50 ``backends/cuda/ops.py`` ``quantize_4bit``: ``torch.empty(((n + 1) //
  (quant_storage.itemsize * 2), 1), dtype=quant_storage)``; ``bnb_4bit_quant_storage`` bf16 is what FSDP
  gathers) or LLM.int8's int8 weight. Its ``QuantState`` (absmax, code tables) is not a parameter: FSDP
  never sees it, each rank keeps it whole on the module (``nn/modules.py``
  ``fix_4bit_weight_quant_state_from_module``: "the quant state got lost when the parameter got converted.
  This happens for example for fsdp"), so it is not gathered.
* **parameters gathered after the optimizer step** (ZeRO-1/2's updated partitions): the trained tensors
  only: the frozen ones are never updated.

A call of tensors of one dtype is sized in elements of it, as without fine-tuning; a call mixing dtypes
(fp32 adapters beside bf16 copies where no mixed-precision policy casts them) in bytes: FSDP2 gathers a
group of mixed dtypes as uint8 (``_fsdp_collectives.py`` ``_get_all_gather_input_metadatas``:
``all_gather_dtype = torch.uint8``), and a byte layout keeps each tensor's dim 0 (FSDP2's padding) and
bytes exact. DDP's gradient buckets keep one dtype each (torch 2.13 ``reducer.cpp``
``compute_bucket_assignment_by_size``: buckets keyed by dtype and device), so its bucketed all-reduce of
mixed dtypes (bf16 ``modules_to_save`` copies beside fp32 adapters) is one run of buckets per dtype.

**FSDP's CPU offload** (``--offload-params cpu``: FSDP1 ``CPUOffload(offload_params=True)``, FSDP2
``CPUOffloadPolicy``) keeps the sharded parameters, gradients and optimizer on the host: before each
all-gather the rank's shard is copied to the GPU in its stored dtype (FSDP2 ``_fsdp_param.py``
``all_gather_inputs``: ``sharded_param_data.to(self.device, non_blocking=True)``, then cast to the
compute dtype; FSDP1 ``_flat_param.py`` ``_use_low_precision_shard``: ``_local_shard.to(self.device)``),
forward and backward re-gather alike; after each reduce-scatter the gradient shard goes back
(FSDP2 ``_fsdp_collectives.py`` ``foreach_reduce``: ``new_sharded_grad.to(torch.device("cpu"))``; FSDP1
``_runtime_utils.py`` ``_offload_grad``: ``_cpu_grad.copy_``); the optimizer steps on the host.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.comm.calls import Layout
from zerocalc.model.architecture import Architecture, ParamTensor
from zerocalc.model.quantized import QuantMethod
from zerocalc.network.schedule import Phase, ScheduledCollective, Tensor
from zerocalc.parallel.finetune import TRAINED_KINDS, FineTuning, KindedTensor, parameter_kinds
from zerocalc.parallel.precision import ParamKind
from zerocalc.states.framework import fsdp_unit_positions, peft_fsdp1_unit_positions

TRAINED = frozenset(TRAINED_KINDS)
"""The kinds with a gradient (the others keep none: the precision record's ``_UNTRAINED``)."""

GRADIENTS_ONLY_TRAINED = "fine-tuning: the trained tensors' gradients only"
GATHER_EVERY_KIND = "fine-tuning: every parameter, frozen and quantised ones at their stored bytes"
UPDATED_ONLY_TRAINED = "fine-tuning: the trained tensors only (the frozen ones are not updated)"
MIXED_BYTES = "dtypes mixed: counted in bytes, sent as uint8 (FSDP2 _fsdp_collectives.py)"
"""What a fine-tuning run's rule adds to its behaviour."""


class MovedTensors(NamedTuple):
    """The tensors a rule moves in a fine-tuning run: their layout, and the one dtype they share (None:
    mixed, the layout in bytes)."""

    layout: Layout
    dtype: DType | None


def moves_trained_only(line: ScheduledCollective) -> bool:
    """Whether ``line`` moves the trained tensors only: gradients, and parameters gathered after the
    optimizer step (the updated ones); the forward and backward gathers move every parameter."""
    return line.tensor is Tensor.GRADIENTS or line.phase is Phase.AFTER_STEP


def wire_tensor(kinded: KindedTensor, finetune: FineTuning) -> ParamTensor:
    """The tensor FSDP or ZeRO-3 gathers for a parameter: itself, or a quantised weight's packed storage
    (a 4-bit weight's ``(n + 1) // (2·s)`` × 1 tensor of its storage dtype; LLM.int8's int8 weight)."""
    tensor = kinded.tensor
    if kinded.kind is not ParamKind.QUANTIZED:
        return tensor
    assert finetune.quant is not None
    if finetune.quant.method is QuantMethod.INT8:
        return tensor
    storage = finetune.quant.dtypes.storage
    return ParamTensor(
        module=tensor.module, name=tensor.name, shape=((tensor.numel + 1) // (2 * storage.bytes), 1)
    )


@lru_cache(maxsize=256)
def moved_tensors(
    arch: Architecture,
    finetune: FineTuning,
    trained_only: bool,
    dtypes: tuple[tuple[ParamKind, DType | None], ...],
    only: DType | None = None,
    peft_fsdp1: bool = False,
    forward: bool = False,
) -> MovedTensors:
    """The tensors a rule moves (``trained_only``: :func:`moves_trained_only`) in the FSDP units a block
    each (:func:`~zerocalc.states.framework.fsdp_unit_positions`: adapters and copies inside their
    block's unit), ``dtypes`` each kind's dtype in the rule's role; ``only``: those of that dtype alone
    (a DDP bucket's); ``peft_fsdp1``: in FSDP1's units under PEFT's wrap policy instead
    (:func:`~zerocalc.states.framework.peft_fsdp1_unit_positions`: each adapter Linear its own unit,
    its flat parameter padded apart; ``forward``: the forward's gathers, DoRA's adapters twice)."""
    of = dict(dtypes)
    chosen = [
        k
        for k in parameter_kinds(arch, finetune)
        if (not trained_only or k.kind in TRAINED) and (only is None or of[k.kind] is only)
    ]
    tensors = [wire_tensor(k, finetune) for k in chosen]
    kinds = [of[k.kind] for k in chosen]
    assert all(dtype is not None for dtype in kinds)  # the rule's role exists for every tensor it moves
    shared = kinds[0] if kinds and len(set(kinds)) == 1 else None
    if shared is None and tensors:
        tensors = [
            ParamTensor(module=t.module, name=t.name, shape=(*t.shape, dtype.bytes))  # type: ignore[union-attr]
            for t, dtype in zip(tensors, kinds, strict=True)
        ]
    positions = (
        peft_fsdp1_unit_positions(tensors, [k.kind in TRAINED for k in chosen], forward)
        if peft_fsdp1
        else fsdp_unit_positions(tensors)
    )
    units = tuple((name, tuple(unit)) for name, unit in positions if unit)
    layout = Layout(tensors=tuple(tensors), units=units, from_architecture=True)
    return MovedTensors(layout, shared)


def rule_note(line: ScheduledCollective, moved: MovedTensors) -> str:
    """What a fine-tuning run adds to ``line``'s behaviour."""
    if line.tensor is Tensor.GRADIENTS:
        note = GRADIENTS_ONLY_TRAINED
    else:
        note = UPDATED_ONLY_TRAINED if moves_trained_only(line) else GATHER_EVERY_KIND
    return note if moved.dtype is not None else f"{note}; {MIXED_BYTES}"


class OffloadCopies(NamedTuple):
    """FSDP's CPU offload per micro-batch: bytes copied to the GPU per all-gather of every unit (each
    rank's parameter shards in their stored dtype) and back per reduction (the gradient shards)."""

    h2d_per_gather: int
    d2h_per_reduction: int


@lru_cache(maxsize=256)
def offload_copies(
    arch: Architecture,
    finetune: FineTuning,
    shards: int,
    stored: tuple[tuple[ParamKind, DType | None], ...],
    reduced: tuple[tuple[ParamKind, DType | None], ...],
) -> OffloadCopies:
    """One rank's host ↔ GPU bytes of FSDP's CPU offload over ``shards`` ranks: every parameter's shard
    (dim 0 padded, FSDP2's layout; a quantised weight's packed storage) in its stored dtype per all-gather,
    the trained tensors' gradient shards in their reduce dtype per reduction."""
    from zerocalc.states.framework import dim0_padded_numel

    stored_of, reduced_of = dict(stored), dict(reduced)
    h2d = d2h = 0
    for kinded in parameter_kinds(arch, finetune):
        wire = wire_tensor(kinded, finetune)
        shard = dim0_padded_numel(wire.shape, shards) // shards
        dtype = stored_of[kinded.kind]
        assert dtype is not None
        h2d += shard * dtype.bytes
        if kinded.kind in TRAINED:
            grad = reduced_of[kinded.kind]
            assert grad is not None
            d2h += dim0_padded_numel(kinded.tensor.shape, shards) // shards * grad.bytes
    return OffloadCopies(h2d, d2h)
