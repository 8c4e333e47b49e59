"""The model's code (``--model-impl``): which tensors a model's code allocates and keeps in one training step.

The same architecture trained through different code keeps different tensors for backward. Each code is one
record behind one protocol (:class:`~zerocalc.model.code.base.ModelCode`): :mod:`.hf` (Hugging Face
transformers 5.17.0, measured), :mod:`.megatron` (Megatron-LM's fused kernels in Korthikanti et al. 2022's
accounting), :mod:`.torchtitan` (torchtitan's Llama, derived from the source), in :data:`MODEL_CODES`. The
machinery every code shares, by concept, asks the record what its code does: per decoder layer
(:mod:`.layer`, :mod:`.norms`, :mod:`.attention`, :mod:`.mlp`, :mod:`.excess`, the op-by-op forward of
:mod:`.program`), outside the layers and for the loss (:mod:`.outside`), under parallelism
(:mod:`.parallel`) and torchtitan's op-level checkpointing (:mod:`.op_sac`): the tensors the code keeps
(``saved``, each one storage) and the extra memory it holds for a moment inside a layer
(``forward_excess``, ``backward_excess``). The step timeline (:mod:`zerocalc.peak.timeline`) allocates
and frees them in program order. How a family's transformers code computes is the family's
(:mod:`zerocalc.model.traits`).

Notation: T = b·s tokens, h hidden, f MLP width, a heads, kv key/value heads, d head dimension, V vocabulary,
E experts, k experts per token, S = T·k routed token-expert pairs; ``act`` bytes per activation element
(2 for bf16/fp16 compute, 4 for fp32).

Per rank under tensor parallelism of degree t, sequence parallelism and context parallelism of degree c
(:class:`~zerocalc.model.code.shape.Shape`): every per-token tensor has the rank's L = b·s/c tokens
(:attr:`~zerocalc.model.code.shape.Shape.local_tokens`); the column-parallel outputs (q, k, v, the MLP's
f-wide tensors) and the attention core are /t; the norms, the residual dropout masks and the hidden states
between layers have R rows (:attr:`~zerocalc.model.code.shape.Shape.sequence_tokens`: L, or L/t under
sequence parallelism). Where a code keeps the column-parallel linears' input is in its module.
"""

from __future__ import annotations

from zerocalc.model.code.attention import SDPA_NO_MASK
from zerocalc.model.code.base import (
    FP32,
    INT64,
    AttentionKernel,
    Device,
    LayerSaves,
    ModelCode,
    ModelImplName,
    Transient,
    Ulysses,
)
from zerocalc.model.code.compiled import (
    Compiled,
    compiled_final_saves,
    compiled_loss_saves,
    traced_mask_saves,
)
from zerocalc.model.code.finetune import (
    TUNED_FAMILIES,
    ForwardTuning,
    stream_bytes,
    tuned_embedding_saves,
    tuned_final_saves,
    tuned_shared_saves,
    tuning_unsupported,
)
from zerocalc.model.code.hf import HF, HF_ATTENTION, HF_EAGER_ONLY
from zerocalc.model.code.layer import QUADRATIC_TERMS, compile_unsupported, layer_saves
from zerocalc.model.code.llama_block import OP_SAC_MATMUL_ORDER
from zerocalc.model.code.loss import (
    SHIFTED_LOSS_FAMILIES,
    TORCHTUNE_OUTPUT_CHUNKS,
    LossImpl,
    OutputKept,
    chunked_rows,
    liger_chunk_rows,
    loss_source,
)
from zerocalc.model.code.megatron import MEGATRON
from zerocalc.model.code.norms import norm_backward_excess, norm_saves
from zerocalc.model.code.op_sac import (
    OpSacLayer,
    op_sac_layer,
    op_sac_recomputes,
    op_sac_unsupported,
)
from zerocalc.model.code.outside import (
    VocabShard,
    embedding_saves,
    logits_saves,
    loss_parallel_transients,
    loss_saves,
    vocab_shard,
)
from zerocalc.model.code.parallel import parallel_transients, parallel_unsupported
from zerocalc.model.code.shape import Shape, hidden_bytes
from zerocalc.model.code.torchtitan import TORCHTITAN

MODEL_CODES: dict[ModelImplName, ModelCode] = {code.name: code for code in (HF, MEGATRON, TORCHTITAN)}
"""The model codes by name (``--model-impl``)."""

__all__ = [
    "FP32",
    "HF",
    "HF_ATTENTION",
    "HF_EAGER_ONLY",
    "INT64",
    "MEGATRON",
    "MODEL_CODES",
    "OP_SAC_MATMUL_ORDER",
    "QUADRATIC_TERMS",
    "SDPA_NO_MASK",
    "SHIFTED_LOSS_FAMILIES",
    "TORCHTITAN",
    "TORCHTUNE_OUTPUT_CHUNKS",
    "TUNED_FAMILIES",
    "AttentionKernel",
    "Compiled",
    "Device",
    "ForwardTuning",
    "LayerSaves",
    "LossImpl",
    "ModelCode",
    "ModelImplName",
    "OpSacLayer",
    "OutputKept",
    "Shape",
    "Transient",
    "Ulysses",
    "VocabShard",
    "chunked_rows",
    "compile_unsupported",
    "compiled_final_saves",
    "compiled_loss_saves",
    "embedding_saves",
    "hidden_bytes",
    "layer_saves",
    "liger_chunk_rows",
    "logits_saves",
    "loss_parallel_transients",
    "loss_saves",
    "loss_source",
    "norm_backward_excess",
    "norm_saves",
    "op_sac_layer",
    "op_sac_recomputes",
    "op_sac_unsupported",
    "parallel_transients",
    "parallel_unsupported",
    "stream_bytes",
    "traced_mask_saves",
    "tuned_embedding_saves",
    "tuned_final_saves",
    "tuned_shared_saves",
    "tuning_unsupported",
    "vocab_shard",
]
