"""Outside the decoder layers: what is saved once per step, the embedding's tensors, the logits per rank,
the final norm's and the LM head's tensors, and the loss's (the codes' own are their records' methods:
:meth:`~zerocalc.model.code.base.ModelCode.shared_saves`, ``final_saves``, ``embedding_excess``)."""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.model.activations import exact_split
from zerocalc.model.architecture import Architecture
from zerocalc.model.code.base import FP32, INT64, Device, ModelCode
from zerocalc.model.code.norms import norm_saves
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def module_shared_saves(
    arch: Architecture, shape: Shape, act: int, checkpointed: bool, device: Device
) -> list[tuple[str, int]]:
    """Saved once per step and shared by the layers of a code built from PyTorch modules (``hf``,
    ``torchtitan``): the rotary cos and sin [1, s, d] ([1, s, d/2] where the family's tables are half,
    ``rotary_half_tables``; every layer's ``q * cos`` keeps them), or GPT-2's
    position ids (int64 [1, s], kept by ``wpe``) and its embedding dropout mask; under checkpointing also
    the position ids every checkpoint closure keeps. Under context parallelism s is the rank's s/c
    positions (the position ids are sharded with the inputs)."""
    s, h = exact_split(shape.s, shape.cp, "the sequence length"), arch.hidden_size
    if not traits(arch).rotary:
        out = [("position ids", INT64 * s)]
        if arch.embedding_dropout > 0:
            mask = (1 if device is Device.CUDA else act) * shape.sequence_tokens * h
            out.append(("embedding dropout mask", mask))
        return out
    t = traits(arch)
    d = arch.latent_attention.qk_rope_head_dim if arch.latent_attention else arch.dim_per_head
    d = int(d * t.rotary_fraction) // (2 if t.rotary_half_tables else 1)
    width = FP32 if t.rotary_fp32 else act
    out = []
    for table in ("", " (global)")[: t.rotary_tables]:
        out += [(f"rotary cos{table}", width * s * d), (f"rotary sin{table}", width * s * d)]
    if checkpointed:
        out.append(("position ids (checkpoint inputs)", INT64 * s))
    return out


def embedding_saves(impl: ModelCode, arch: Architecture, act: int) -> list[tuple[str, int]]:
    """Saved by the embedding's own ops besides its indices: Gemma's ``hidden * normalizer`` keeps the
    0-dim √h tensor (``Gemma2Model.forward``, ``Gemma3TextModel.forward``), in transformers' modules."""
    if impl.transformers_modules and traits(arch).embedding_scale:
        return [("embedding scale √h (0-dim)", act)]
    return []


class VocabShard(NamedTuple):
    """The logits one rank computes: ``rows`` tokens × ``columns`` vocabulary entries."""

    rows: int
    """The rank's tokens, b·s/c (the LM head's input is all-gathered over the TP group first)."""
    columns: int
    loss_parallel: bool
    """The cross-entropy runs on the vocabulary shard (max, sum of exponentials and target logit
    all-reduced over the TP group) instead of on gathered logits."""


def vocab_shard(impl: ModelCode, arch: Architecture, shape: Shape, vocab: int | None = None) -> VocabShard:
    """Logits per rank: ⌈V/t⌉ columns under tensor parallelism where the code shards them
    (:attr:`~zerocalc.model.code.base.ModelCode.sharded_logits`), else all V. ``vocab``: the vocabulary the
    output layer allocates, ``arch.vocab_size`` unless given (Megatron-LM pads it to a multiple of
    ``make_vocab_size_divisible_by`` · t, 128·t by default:
    ``core/tokenizers/utils/build_tokenizer.py::vocab_size_with_padding``)."""
    rows, t = shape.local_tokens, shape.tp
    V = arch.vocab_size if vocab is None else vocab
    if impl.sharded_logits and t > 1:
        return VocabShard(rows, -(-V // t), loss_parallel=True)
    return VocabShard(rows, V, loss_parallel=False)


def loss_parallel_transients(impl: ModelCode, arch: Architecture, shape: Shape) -> tuple[int, int]:
    """Bytes the vocabulary-parallel cross-entropy holds beyond an unsharded one of the same logits, at the
    loss's forward and backward peaks: the code's fp32 [rows, columns] copies
    (:attr:`~zerocalc.model.code.base.ModelCode.loss_parallel_fp32_copies`) of the rank's shard."""
    shard = vocab_shard(impl, arch, shape)
    copies = impl.loss_parallel_fp32_copies if shard.loss_parallel else 0
    extra = copies * FP32 * shard.rows * shard.columns
    return extra, extra


def logits_saves(impl: ModelCode, arch: Architecture, shape: Shape, act: int) -> list[tuple[str, int]]:
    """Saved between the LM head and the loss: Gemma 2's ``final_logit_softcapping`` keeps ``tanh``'s
    output [T, V] in the compute dtype (``Gemma2ForCausalLM.forward``), on the rank's gathered logits, in
    transformers' modules."""
    if impl.transformers_modules and traits(arch).logit_softcap:
        shard = vocab_shard(impl, arch, shape)
        return [("logit soft-capping tanh output", act * shard.rows * shard.columns)]
    return []


def module_final_saves(
    impl: ModelCode, arch: Architecture, shape: Shape, act: int, device: Device
) -> list[tuple[str, int]]:
    """The final norm's saved tensors and the LM head's input (the norm's output) in a code built from
    PyTorch modules (``hf``, ``torchtitan``). A LayerNorm's input is the last hidden state, which the
    timeline keeps; an HF RMSNorm's fp32 copy is a new tensor (in fp32 it is the last hidden state itself,
    which the timeline then frees as a hidden state).

    Per rank: the norm has R rows (:attr:`Shape.sequence_tokens`); the LM head is column-parallel and keeps
    the all-gathered L-row input (torchtitan's ``ColwiseParallel(input_layouts=Shard(1))``; transformers'
    replicated one)."""
    L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    t = traits(arch)
    parts = norm_saves(t.norm, R, h, act, device, impl.norm_fp32_copy, input_kept=t.norm == "layernorm")
    return [(f"final norm: {name}", b) for name, b in parts] + [("LM head input", act * L * h)]


def loss_saves(impl: ModelCode, arch: Architecture, shape: Shape) -> list[tuple[str, int]]:
    """What the loss keeps for backward (``hf``: ``loss/loss_utils.py::ForCausalLMLoss``, 5.17.0): the
    fp32 ``log_softmax`` output (``logits.float()`` first; saved by ``log_softmax`` and ``nll_loss``), the
    target (``labels[..., 1:].contiguous()``, a copy of 8·T; for b = 1 the slice is contiguous already, so
    the target is a view of the padded labels, 8·b·(s + 1)) and ``nll_loss``'s fp32 ``total_weight``. The
    step timeline (:mod:`zerocalc.peak.timeline`) allocates the same tensors, with the loss's transients.
    Per rank: the logits of :func:`vocab_shard` (Megatron-LM's vocab-parallel cross-entropy keeps its fp32
    softmax of the same size, ``exp_logits``)."""
    shard = vocab_shard(impl, arch, shape)
    T = shard.rows
    unshifted = shape.b > 1 or impl.loss != "hf_upcast" or shape.cp > 1
    target = INT64 * T if unshifted else INT64 * shape.b * (shape.s + 1)
    return [
        ("log_softmax output (fp32)", FP32 * T * shard.columns),
        ("target", target),
        ("total_weight (fp32)", FP32),
    ]
