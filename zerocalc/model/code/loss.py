"""The loss implementations fine-tuning recipes swap in for the full-logits cross-entropy (``--loss``), and
the shifted-logits loss of older transformers.

* ``full``: the model code's own loss (``hf``: transformers 5.17 ``loss_utils.ForCausalLMLoss``; the step
  timeline, :mod:`zerocalc.peak.timeline`).
* ``shifted``: the loss inside ``<Family>ForCausalLM.forward`` from transformers 4.36 to 4.45, before
  4.46 moved it to ``loss_utils`` (4.38.2 and 4.45.2 ``models/llama/modeling_llama.py``; Mistral, Mixtral,
  Qwen2, Qwen2-MoE and Phi-3 the same, :data:`SHIFTED_LOSS_FAMILIES`): ``logits = logits.float()`` in
  the forward, so the output holds fp32 logits (4·T·V) and the 16-bit ones go as the name is rebound;
  ``shift_logits = logits[..., :-1, :].contiguous()`` an fp32 copy of b·(s−1) rows, freed as the forward
  returns; ``labels[..., 1:].contiguous()`` a copy where b > 1 (a view of a one-row batch); then
  ``CrossEntropyLoss``: ``log_softmax``'s fp32 output saved. In backward ``nll_loss_backward`` and
  ``log_softmax_backward`` each make an fp32 b·(s−1)·V gradient, the slice's backward writes it into a
  zero fp32 tensor of the whole logits (``slice_backward``), and ``Tensor.float``'s backward casts that
  to the head's dtype.
* ``chunked``: torchtune's ``CEWithChunkedOutputLoss`` (pytorch/torchtune at v0.6.0-rc1-220-gbd2a0fc7,
  ``torchtune/modules/loss/ce_chunked_output_loss.py``; the model's ``set_num_output_chunks``,
  ``torchtune/modules/transformer.py::TransformerDecoder.chunked_output``). The model applies its output
  projection to each of ``h.tensor_split(num_output_chunks, dim=1)`` (default 8), so every chunk's logits
  exist at once in the model dtype (all of them: 2·T·V in bf16). The loss then runs, chunk by chunk,
  ``F.cross_entropy(logits_chunk.float(), labels_chunk, reduction="sum")``: one chunk's fp32 copy at a
  time (freed when the call returns: ``Tensor.float``'s backward keeps nothing), but ``log_softmax``'s fp32
  output of every chunk is saved for backward, 4·T·V in all, beside ``nll_loss``'s ``total_weight`` per
  chunk. Autograd's engine runs ready nodes by decreasing sequence number, so every chunk's loss backward
  (the last chunk first: d log_softmax and d logits in fp32, a chunk each, then its bf16 cast) runs
  before any chunk's output projection backward; each projection's backward then gives d h of its
  chunk, which ``tensor_split``'s slice backward writes into a zero tensor of the whole [b, s, h]
  (``slice_backward``), summed into the first.
* ``fused-linear``: Liger Kernel's ``LigerFusedLinearCrossEntropyLoss`` (linkedin/Liger-Kernel at
  v0.8.2-7-gead96b61, ``src/liger_kernel/ops/fused_linear_cross_entropy.py::
  fused_linear_cross_entropy_forward``, through ``transformers/model/loss_utils.py::LigerForCausalLMLoss``).
  No logits beyond one chunk of tokens: ``chunk_size = next_power_of_2(cdiv(BT, cdiv(V, H)))``
  (:func:`liger_chunk_rows`); per chunk ``_input_chunk @ weight.t()`` ([chunk, V] in the input dtype), the
  Triton kernel writes the loss and, in place, the logits' gradient; ``grad_logits_chunk @ weight`` goes into
  ``grad_input`` (``zeros_like(_input)``, [BT, H], allocated before the loop) and, where the head is trained,
  ``grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()`` into ``zeros_like(weight)``. The
  function saves only ``grad_input`` (and ``grad_weight``) for backward, which only scales them
  (``element_mul_kernel``, in place) and returns them; ``loss_1d`` (fp32 [BT]) and ``target_mask`` (bool
  [BT]) live until the forward returns.
"""

from __future__ import annotations

from enum import StrEnum


class LossImpl(StrEnum):
    """``--loss``: how the step computes its cross-entropy."""

    FULL = "full"
    """The model code's loss on the full logits."""
    CHUNKED = "chunked"
    """torchtune's ``CEWithChunkedOutputLoss``."""
    FUSED_LINEAR = "fused-linear"
    """Liger Kernel's ``LigerFusedLinearCrossEntropyLoss``."""
    SHIFTED = "shifted"
    """transformers 4.36-4.45's loss in the model's forward: fp32 logits, their shifted copy."""

    @property
    def saver(self) -> bool:
        """A fine-tuning recipe's memory saver, standing in for transformers' LM head and loss (torchtune's,
        Liger's); the plan searches these beside ``full``."""
        return self in (LossImpl.CHUNKED, LossImpl.FUSED_LINEAR)


SHIFTED_LOSS_FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "phi3"})
"""The families whose ``ForCausalLM.forward`` in transformers 4.45.2 upcasts the logits and shifts them
(``logits = logits.float()``, ``logits[..., :-1, :].contiguous()``); GPT-2's, Falcon's and GPT-NeoX's
shift 16-bit logits, Gemma 2's caps them first."""


class OutputKept(StrEnum):
    """``--keep-output``: how long the training loop holds the model's output (a ``CausalLMOutputWithPast``:
    its logits), which the full-logits loss otherwise frees before backward."""

    NONE = "none"
    """Only the loss is kept: transformers' ``Trainer.compute_loss`` returns the loss alone (5.17
    ``trainer.py``), torchtune ``del outputs``, torchtitan ``del pred``."""
    STEP = "step"
    """Until the micro-batch's backward (and the optimizer step after the last) ends, the loop then
    dropping it: AnswerDotAI/fsdp_qlora ``train.py`` (05ed9f2): ``output = None`` after the step."""
    NEXT = "next"
    """Until the next forward returns and rebinds the name: ``outputs = model(**batch); loss =
    outputs.loss; loss.backward()`` in a loop (accelerate's ``examples/nlp_example.py``, transformers'
    "Training in native PyTorch"); the previous micro-batch's logits alive through this one's forward."""


TORCHTUNE_OUTPUT_CHUNKS = 8
"""``CEWithChunkedOutputLoss(num_output_chunks=8)``'s default, the recipes' too."""


def chunked_rows(b: int, s: int, chunks: int) -> tuple[int, ...]:
    """The rows (tokens) of each of torchtune's output chunks: ``h.tensor_split(chunks, dim=1)`` of a
    [b, s, h] hidden state, so the first ``s mod chunks`` chunks hold ⌈s/chunks⌉ positions of every
    sequence and the others ⌊s/chunks⌋ (``torch.tensor_split``: sections of an indivisible size); b of
    each."""
    small, extra = divmod(s, chunks)
    return tuple(b * (small + (1 if j < extra else 0)) for j in range(chunks))


def _next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the least power of two ≥ n (1 for n ≤ 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> tuple[int, ...]:
    """The rows of each of Liger's chunks (``fused_linear_cross_entropy_forward``): ``inc_factor =
    cdiv(V, H)``, ``chunk_size = next_power_of_2(cdiv(BT, inc_factor))``, ``num_chunks = cdiv(BT,
    chunk_size)``; the last chunk holds what is left."""
    inc_factor = -(-vocab // hidden)
    size = _next_power_of_2(-(-tokens // inc_factor))
    full, rest = divmod(tokens, size)
    return (size,) * full + ((rest,) if rest else ())


def loss_source(loss: LossImpl, chunks: int) -> str | None:
    """Where a saver's loss tensors come from, for the peak's sources (None: the model code's loss)."""
    if loss is LossImpl.CHUNKED:
        return (
            "torchtune CEWithChunkedOutputLoss (v0.6.0-rc1-220, modules/loss/ce_chunked_output_loss.py): "
            f"the logits in {chunks} output chunks, one fp32 copy at a time, every chunk's log-softmax saved"
        )
    if loss is LossImpl.FUSED_LINEAR:
        return (
            "Liger Kernel LigerFusedLinearCrossEntropyLoss (v0.8.2, ops/fused_linear_cross_entropy.py): the "
            "LM head and the loss per chunk of tokens, the input's (and head's) gradient made in forward"
        )
    if loss is LossImpl.SHIFTED:
        return (
            "transformers 4.36-4.45 <Family>ForCausalLM.forward (4.45.2 models/llama/modeling_llama.py): "
            "logits.float() held by the output, their shifted fp32 copy, CrossEntropyLoss"
        )
    return None
