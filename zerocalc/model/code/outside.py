"""Outside the decoder layers: what is saved once per step, the embedding's tensors, the logits per rank,
the final norm's and the LM head's tensors, and the loss's."""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.model.activations import exact_split
from zerocalc.model.architecture import Architecture
from zerocalc.model.code.base import FP32, INT64, Device, ModelImpl, ModelImplName
from zerocalc.model.code.norms import norm_saves
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def shared_saves(
    impl: ModelImpl, arch: Architecture, shape: Shape, act: int, checkpointed: bool, device: Device
) -> list[tuple[str, int]]:
    """Saved once per step and shared by the layers: the rotary cos and sin [1, s, d] (every layer's
    ``q * cos`` keeps them), or GPT-2's position ids (int64 [1, s], kept by ``wpe``) and its embedding
    dropout mask; under checkpointing also the position ids every checkpoint closure keeps. Under context
    parallelism s is the rank's s/c positions (the position ids are sharded with the inputs)."""
    if impl.name is ModelImplName.MEGATRON:
        return []
    s, h = exact_split(shape.s, shape.cp, "the sequence length"), arch.hidden_size
    if not traits(arch).rotary:
        out = [("position ids", INT64 * s)]
        if arch.embedding_dropout > 0:
            mask = (1 if device is Device.CUDA else act) * shape.sequence_tokens * h
            out.append(("embedding dropout mask", mask))
        return out
    t = traits(arch)
    d = arch.latent_attention.qk_rope_head_dim if arch.latent_attention else arch.dim_per_head
    d = int(d * t.rotary_fraction)
    width = FP32 if t.rotary_fp32 else act
    out = []
    for table in ("", " (global)")[: t.rotary_tables]:
        out += [(f"rotary cos{table}", width * s * d), (f"rotary sin{table}", width * s * d)]
    if checkpointed:
        out.append(("position ids (checkpoint inputs)", INT64 * s))
    return out


def embedding_excess(impl: ModelImpl, arch: Architecture, shape: Shape, act: int) -> int:
    """Bytes the vocabulary-parallel embedding holds at its forward peak above its output (the R-row hidden
    state of :func:`hidden_bytes`) and what was alive before it, on one rank; 0 without tensor parallelism.

    * ``torchtitan``: ``tok_embeddings`` is ``RowwiseParallel(input_layouts=Replicate(),
      output_layouts=Shard(1))``: the local lookup gives a partial sum of L × h, which ``Partial`` →
      ``Shard(1)`` reduce-scatters after ``reduce_scatter_single``'s contiguous copy: 2·act·L·h (traced on
      CPU, torch 2.13, gloo, world 2: 32,768 B at b 2, s 64, h 64);
    * ``megatron``: ``VocabParallelEmbedding.forward`` (``core/tensor_parallel/layers.py``) keeps the
      masked ids (int64) and the mask (bool) while the L × h partial output exists; under sequence
      parallelism ``transpose(0, 1).contiguous()`` copies it (no copy at b = 1) before the reduce-scatter
      to R rows; without, the all-reduce runs in place on the output itself;
    * ``hf``: the embedding has no tensor-parallel plan (replicated): nothing.
    """
    if shape.tp == 1 or impl.name is ModelImplName.HF:
        return 0
    L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    if impl.name is ModelImplName.TORCHTITAN:
        return 2 * act * L * h
    ids = (INT64 + 1) * L
    if R == L:
        return ids
    peak_rows = 2 * L if shape.b > 1 else L + R
    return ids + act * (peak_rows - R) * h


def embedding_saves(impl: ModelImpl, arch: Architecture, act: int) -> list[tuple[str, int]]:
    """Saved by the embedding's own ops besides its indices: Gemma's ``hidden * normalizer`` keeps the
    0-dim √h tensor (``Gemma2Model.forward``, ``Gemma3TextModel.forward``)."""
    if impl.name is ModelImplName.HF and traits(arch).embedding_scale:
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


def vocab_shard(impl: ModelImpl, arch: Architecture, shape: Shape, vocab: int | None = None) -> VocabShard:
    """Logits per rank. ``vocab``: the vocabulary the output layer allocates, ``arch.vocab_size`` unless
    given (Megatron-LM pads it to a multiple of ``make_vocab_size_divisible_by`` · t, 128·t by default:
    ``core/tokenizers/utils/build_tokenizer.py::vocab_size_with_padding``).

    * ``megatron``: the output layer is a ``ColumnParallelLinear`` over the padded vocabulary, V/t
      columns, and ``core/tensor_parallel/cross_entropy.py``'s ``_VocabParallelCrossEntropy`` works on
      them;
    * ``torchtitan``: ``output`` is ``ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))``
      under ``loss_parallel`` (v0.2.2 ``apply_tp``; the default unless ``disable_loss_parallel``): a
      Shard(-1) chunk, ⌈V/t⌉ columns on the first ranks;
    * ``hf``: ``lm_head`` is ``colwise_gather_output`` (``LlamaForCausalLM._tp_plan``): every rank holds
      all V columns.
    """
    rows, t = shape.local_tokens, shape.tp
    V = arch.vocab_size if vocab is None else vocab
    if impl.name is ModelImplName.MEGATRON or (impl.name is ModelImplName.TORCHTITAN and t > 1):
        return VocabShard(rows, -(-V // t), loss_parallel=t > 1)
    return VocabShard(rows, V, loss_parallel=False)


def loss_parallel_transients(impl: ModelImpl, arch: Architecture, shape: Shape) -> tuple[int, int]:
    """Bytes torchtitan's ``loss_parallel`` holds beyond an unsharded cross-entropy of the same logits, at
    the loss's forward and backward peaks: one more fp32 [rows, columns] tensor in each (torch
    ``distributed/tensor/parallel/loss.py``: ``_log_softmax`` keeps ``shifted = x - max`` while it computes
    ``exp(shifted)`` and then ``shifted - logsumexp``; ``_nll_loss_and_log_softmax_backward`` computes
    ``(zeros_like(x) + exp(x)) * grad_output`` beside the saved ``x``). Megatron-LM's vocab-parallel
    cross-entropy works in place on its fp32 copy (``calculate_predicted_logits``,
    ``calculate_gradients``): nothing more. Traced on CPU (torch 2.13, gloo, world 2): the bf16 logits
    and 3 fp32 shards at the forward peak, 4 at the backward peak, against 2 and 3 without
    ``loss_parallel``."""
    shard = vocab_shard(impl, arch, shape)
    if impl.name is not ModelImplName.TORCHTITAN or not shard.loss_parallel:
        return 0, 0
    extra = FP32 * shard.rows * shard.columns
    return extra, extra


def logits_saves(impl: ModelImpl, arch: Architecture, shape: Shape, act: int) -> list[tuple[str, int]]:
    """Saved between the LM head and the loss: Gemma 2's ``final_logit_softcapping`` keeps ``tanh``'s
    output [T, V] in the compute dtype (``Gemma2ForCausalLM.forward``), on the rank's gathered logits."""
    if impl.name is ModelImplName.HF and traits(arch).logit_softcap:
        shard = vocab_shard(impl, arch, shape)
        return [("logit soft-capping tanh output", act * shard.rows * shard.columns)]
    return []


def final_saves(
    impl: ModelImpl, arch: Architecture, shape: Shape, act: int, device: Device
) -> list[tuple[str, int]]:
    """The final norm's saved tensors and the LM head's input (the norm's output). A LayerNorm's input is
    the last hidden state, which the timeline keeps; an HF RMSNorm's fp32 copy is a new tensor (in fp32 it
    is the last hidden state itself, which the timeline then frees as a hidden state).

    Per rank: the norm has R rows (:attr:`Shape.sequence_tokens`); the LM head is column-parallel, so it
    keeps its R-row input under Megatron-LM's sequence parallelism (gathered again in backward) and the
    all-gathered L-row input under torchtitan's ``ColwiseParallel(input_layouts=Shard(1))``."""
    L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    t = traits(arch)
    if impl.name is ModelImplName.MEGATRON:
        return [("final norm input", act * R * h), ("LM head input", act * R * h)]
    parts = norm_saves(t.norm, R, h, act, device, impl.norm_fp32_copy, input_kept=t.norm == "layernorm")
    return [(f"final norm: {name}", b) for name, b in parts] + [("LM head input", act * L * h)]


def loss_saves(impl: ModelImpl, arch: Architecture, shape: Shape) -> list[tuple[str, int]]:
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
