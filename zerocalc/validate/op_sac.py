"""torchtitan's op-level selective activation checkpointing on a real model (imports torch).

The policy is torchtitan v0.2.2's (``distributed/activation_checkpoint.py::_apply_op_sac``, its save list
``models/llama3/infra/parallelize.py::_op_sac_save_list``): each block wrapped in torch's
``checkpoint_wrapper`` with ``create_selective_checkpoint_contexts``, ``MUST_SAVE`` for the ops of the save
list except every second ``aten.mm`` of the block (a counter per forward), ``PREFER_RECOMPUTE`` for the
rest. On CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``, the CPU counterpart of the CUDA
flash kernel in the list (the same output and fp32 log-sum-exp), so it is saved as that kernel would be.

:func:`measure` runs one forward and backward of :mod:`zerocalc.validate.model`'s transformer (the same
linears in the same order as torchtitan's Llama block: q, k, v, o, gate, up, down) and records, per
block, every tensor the policy saves (deduplicated by storage) and the block's input (the checkpoint's
input), the activations alive after forward (torch's ``MemTracker``,
``distributed/_tools/mem_tracker.py``) beside those under full checkpointing, and the output shapes of the
``aten.mm`` calls backward runs beyond those of the same model without checkpointing: the recomputed
matmuls. Compared with :func:`zerocalc.model.code.op_sac_layer` in tests/model/test_op_sac.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import partial
from typing import Any, NamedTuple

import torch
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from zerocalc.model.architecture import Architecture
from zerocalc.validate.model import build_model, loss_fn


def torchtitan_save_ops() -> set[Any]:
    """torchtitan v0.2.2 ``_op_sac_save_list`` (the ops this torch has), and the CPU flash kernel."""
    names = [
        ("aten", "mm"),
        ("aten", "_scaled_dot_product_efficient_attention"),
        ("aten", "_scaled_dot_product_flash_attention"),
        ("aten", "_scaled_dot_product_cudnn_attention"),
        ("aten", "_scaled_dot_product_attention_math"),
        ("aten", "_scaled_dot_product_fused_attention_overrideable"),
        ("_c10d_functional", "reduce_scatter_tensor"),
        ("aten", "max"),
        ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
    ]
    ops = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


class _Block(NamedTuple):
    """What one block's checkpoint kept: the policy's saved outputs and the mm decisions in forward."""

    saved: list[torch.Tensor]
    """Every tensor output of a ``MUST_SAVE`` op (what ``_CachingTorchDispatchMode`` stores, detached)."""
    mm_saved: list[bool]
    """Per ``aten.mm`` of the block's forward, in call order: saved (True) or recomputed."""


def _policy(block: _Block, meta: dict[str, int], save_ops: set[Any], ctx, func, *args, **kwargs):
    """torchtitan v0.2.2 ``_custom_policy`` (no ``per_op_sac_force_recompute_mm_shapes_by_fqns``; the
    CUDA-to-CPU copy rule cannot fire on CPU), recording what it saves."""
    mode = "recompute" if ctx.is_recompute else "forward"
    mm_count_key = f"{mode}_mm_count"
    if func == torch.ops.aten.mm.default:
        meta[mm_count_key] += 1
    to_save = func in save_ops and not (func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0)
    if not ctx.is_recompute:
        if func == torch.ops.aten.mm.default:
            block.mm_saved.append(to_save)
        if to_save:
            out = ctx.op_output
            block.saved.extend(
                t for t in (out if isinstance(out, (tuple, list)) else [out]) if torch.is_tensor(t)
            )
    return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE


class _MmShapes(TorchDispatchMode):
    """The output shapes of the ``aten.mm`` calls that run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: Counter[tuple[int, ...]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func == torch.ops.aten.mm.default:
            self.shapes[tuple(out.shape)] += 1
        return out


class LayerMeasurement(NamedTuple):
    saved_bytes: int
    """Bytes of the distinct storages the policy saved in the block's forward."""
    saved_shapes: tuple[tuple[tuple[int, ...], int], ...]
    """(shape, element bytes) of each saved tensor, in the order saved."""
    input_bytes: int
    """The block's input, which the checkpoint keeps."""
    mm_saved: tuple[bool, ...]


class Measurement(NamedTuple):
    layers: tuple[LayerMeasurement, ...]
    after_forward_op: int
    """Activation bytes alive once forward has returned, under torchtitan's op-level policy."""
    after_forward_full: int
    """The same under full checkpointing (every block's input only)."""
    recomputed_mm_shapes: dict[tuple[int, ...], int]
    """Output shapes (and counts, every block together) of the matmuls backward runs beyond those of the
    same model without checkpointing."""


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
    return sum(seen.values())


class _Step(NamedTuple):
    blocks: list[_Block]
    inputs: list[int]
    backward_mm_shapes: Counter
    after_forward: int


def _step(arch: Architecture, b: int, s: int, policy: str) -> _Step:
    """One step with every block under ``policy``: ``op`` (torchtitan's), ``full`` or ``none``."""
    model = build_model(arch).to(torch.bfloat16)
    save_ops = torchtitan_save_ops()
    blocks: list[_Block] = []
    inputs: list[int] = []

    def context_fn():
        block = _Block([], [])
        blocks.append(block)
        meta: dict[str, int] = defaultdict(int)
        return create_selective_checkpoint_contexts(partial(_policy, block, meta, save_ops))

    if policy != "none":
        for i, layer in enumerate(model.layers):
            # torchtitan's ptd_checkpoint_wrapper arguments (preserve_rng_state, determinism_check and
            # early_stop at their v0.2.2 ActivationCheckpoint defaults)
            contexts = {"context_fn": context_fn} if policy == "op" else {}
            model.layers[i] = checkpoint_wrapper(
                layer, preserve_rng_state=True, determinism_check="default", early_stop=False, **contexts
            )
            # on the wrapper: the recompute calls the wrapped block again, not the wrapper
            model.layers[i].register_forward_pre_hook(
                lambda _m, args: inputs.append(args[0].untyped_storage().nbytes())
            )
    torch.manual_seed(1)
    tokens = torch.randint(0, arch.vocab_size, (b, s))
    tracker = MemTracker()
    with tracker:
        logits = model(tokens)
        (current,) = tracker.get_tracker_snapshot("current").values()
        loss = loss_fn(logits, tokens)
        del logits
        mms = _MmShapes()
        with mms:
            loss.backward()
    return _Step(blocks, inputs, mms.shapes, current[_MemRefType.ACT])


def measure(arch: Architecture, b: int, s: int) -> Measurement:
    """One bf16 step of ``arch`` at micro-batch ``b`` and sequence ``s`` under torchtitan's op-level policy,
    the same step under full checkpointing, and without checkpointing for the backward's own matmuls."""
    op, full, plain = (_step(arch, b, s, policy) for policy in ("op", "full", "none"))
    blocks, inputs = op.blocks, op.inputs
    layers = tuple(
        LayerMeasurement(
            saved_bytes=_storage_bytes(block.saved),
            saved_shapes=tuple((tuple(t.shape), t.element_size()) for t in block.saved),
            input_bytes=nbytes,
            mm_saved=tuple(block.mm_saved),
        )
        for block, nbytes in zip(blocks, inputs, strict=True)
    )
    extra = op.backward_mm_shapes - plain.backward_mm_shapes
    return Measurement(
        layers=layers,
        after_forward_op=op.after_forward,
        after_forward_full=full.after_forward,
        recomputed_mm_shapes=dict(extra),
    )
