"""What FP8 changes of the data-parallel collectives (pure, no torch): the weights' all-gather in FP8 and the
amax all-reduces their scales need.

* **The FP8 all-gather** (``--fp8-all-gather``). torchao 0.18 ``float8/fsdp_utils.py``
  ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts each converted weight's padded shard to
  fp8 and hands FSDP2 its 1-byte data (the scale goes as metadata, not over the wire); FSDP2 all-gathers a
  group whose inputs differ in dtype as bytes (torch 2.13 ``_fully_shard/_fsdp_collectives.py``
  ``_get_param_all_gather_inputs_dtypes_and_numels``: ``all_gather_dtype = torch.uint8``). So one call
  moves each converted weight's padded shard at 1 B per element and every other parameter at its own
  all-gather dtype's bytes: :func:`fp8_wire_layout` counts a call's elements as those bytes. The
  reduce-scatter of gradients is untouched (high precision). Megatron-LM ``--fp8-param-gather`` gathers
  its fp8 parameters the same way (``core/distributed/param_and_grad_buffer.py``: an fp8 parameter's
  buffer is ``torch.uint8``).
* **The amax all-reduce.** Without precomputed scales each converted weight's cast computes its amax over
  the shard group before its all-gather (``hp_tensor_to_float8_dynamic(..., reduce_amax=True,
  device_mesh=mesh)`` → ``float8_utils.py`` ``tensor_to_amax``: ``all_reduce(amax, "MAX", group)``): one
  fp32 all-reduce per weight per all-gather. With them (``precompute_float8_dynamic_scale_for_fsdp``, after
  the optimizer step) one all-reduce of the stacked amaxes, one fp32 element per weight
  (``torch.stack(max_weights)`` then ``torch.clamp``: "it will issue a single all-reduce").
"""

from __future__ import annotations

from zerocalc.comm.calls import Layout
from zerocalc.model.architecture import ParamTensor
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import Calls, Padding, Phase, Repeat, ScheduledCollective, Tensor
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.precision import Fp8Library

FP8_GATHER = (
    "fp8 weights at 1 B per element, the other parameters' bytes beside them (a group of mixed dtypes "
    "gathered as uint8: _fsdp_collectives.py)"
)
"""What an FP8 all-gather rule's behaviour adds."""
AMAX = "amax"
"""The name of the one-element tensor each converted weight's amax is (in :func:`amax_layout`)."""


def gathers_fp8(line: ScheduledCollective, fp8: Fp8Setting) -> bool:
    """Whether ``line`` all-gathers parameters, in FP8 for the converted weights under ``fp8``."""
    return fp8.all_gather and line.op is Collective.ALL_GATHER and line.tensor is Tensor.PARAMETERS


def _wire_layout(layout: Layout, fp8: Fp8Setting, element_bytes: int) -> Layout:
    tensors = tuple(
        t if fp8.converts(t) else ParamTensor(module=t.module, name=t.name, shape=(*t.shape, element_bytes))
        for t in layout.tensors
    )
    return Layout(tensors=tensors, units=layout.units, from_architecture=layout.from_architecture)


def fp8_wire_layout(layout: Layout, fp8: Fp8Setting, element_bytes: int) -> Layout:
    """``layout`` with every tensor's elements as the bytes an FP8 all-gather moves of it: a converted weight
    unchanged (1 B each), any other parameter with a last dimension of ``element_bytes`` (its all-gather
    dtype's), so dim 0 and FSDP2's dim-0 padding are the tensor's own. Built once per layout."""
    return layout.cached(_wire_layout, fp8, element_bytes)


def _amax_layout(layout: Layout, fp8: Fp8Setting) -> Layout:
    positions = {i: n for n, i in enumerate(i for i, t in enumerate(layout.tensors) if fp8.converts(t))}
    tensors = tuple(ParamTensor(module=layout.tensors[i].module, name=AMAX, shape=(1,)) for i in positions)
    units = tuple(
        (name, tuple(positions[i] for i in unit if i in positions))
        for name, unit in layout.units
        if any(i in positions for i in unit)
    )
    return Layout(tensors=tensors, units=units, from_architecture=layout.from_architecture)


def amax_layout(layout: Layout, fp8: Fp8Setting) -> Layout:
    """One one-element tensor per converted weight of ``layout``, in its units."""
    return layout.cached(_amax_layout, fp8)


def amax_line(gather: ScheduledCollective, fp8: Fp8Setting) -> ScheduledCollective | None:
    """The amax all-reduces an FP8 all-gather rule needs before it (torchao's; Transformer Engine reduces
    its amaxes inside its own forward, not modelled here): one per weight beside each all-gather, over its
    group; with precomputed scales none (:func:`stacked_amax_line`)."""
    if fp8.precompute_scales or fp8.record.library is not Fp8Library.TORCHAO:
        return None
    return gather._replace(
        op=Collective.ALL_REDUCE, calls=Calls.PARAMETER, padding=Padding.NONE,
        behaviour="torchao 0.18 float8/fsdp_utils.py WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather: "
        f"each fp8 weight's amax all-reduced (MAX, fp32) over the shard group before its all-gather "
        f"({gather.phase.value})",
    )  # fmt: skip


def stacked_amax_line(gather: ScheduledCollective, fp8: Fp8Setting) -> ScheduledCollective | None:
    """With precomputed scales, the one all-reduce of every weight's amax after the step, over the group of
    the first FP8 all-gather rule ``gather``; None without."""
    if not fp8.precompute_scales or fp8.record.library is not Fp8Library.TORCHAO:
        return None
    return ScheduledCollective(
        op=Collective.ALL_REDUCE, phase=Phase.AFTER_STEP, tensor=Tensor.PARAMETERS, group=gather.group,
        repeat=Repeat.PER_STEP, calls=Calls.WHOLE, padding=Padding.NONE,
        behaviour="torchao 0.18 float8/fsdp_utils.py precompute_float8_dynamic_scale_for_fsdp: one "
        "all-reduce of every fp8 weight's amax, stacked (fp32), after the optimizer step",
    )  # fmt: skip
