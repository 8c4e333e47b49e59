"""Model-implementation profiles: which tensors a model's code allocates and keeps in one training step.

The same architecture trained through different code keeps different tensors for backward. A
:class:`ModelImpl` record names the code it describes and its version; the functions below give, per
decoder layer and for the loss, the tensors that code keeps (``saved``, each one storage) and the extra
memory it holds for a moment inside a layer (``forward_excess``, ``backward_excess``). The step timeline
(:mod:`zerocalc.peak.timeline`) allocates and frees them in program order.

* ``hf`` — Hugging Face transformers 5.17.0 (``models/<family>/modeling_<family>.py``,
  ``loss/loss_utils.py::ForCausalLMLoss``, ``integrations/sdpa_attention.py``, ``integrations/moe.py``),
  measured op by op with ``torch.autograd.graph.saved_tensors_hooks`` on CPU for Llama, Qwen2, GPT-2,
  Mixtral and Qwen2-MoE (exact to the byte) and checked against eight H100 runs (every phase exact);
* ``megatron`` — Korthikanti et al. 2022 (Megatron-LM's fused kernels), the paper's accounting;
* ``torchtitan`` — torchtitan's Llama (``models/llama3/model.py``: ``nn.RMSNorm``, SDPA, SwiGLU;
  ``components/loss.py::cross_entropy_loss``), derived from the source.

Notation: T = b·s tokens, h hidden, f MLP width, a heads, kv key/value heads, d head dimension, V vocabulary,
E experts, k experts per token, S = T·k routed token-expert pairs; ``act`` bytes per activation element
(2 for bf16/fp16 compute, 4 for fp32).

Per rank under tensor parallelism of degree t, sequence parallelism and context parallelism of degree c
(:class:`Shape`): every per-token tensor has the rank's L = b·s/c tokens (:attr:`Shape.local_tokens`); the
column-parallel outputs (q, k, v, the MLP's f-wide tensors) and the attention core are /t; the norms, the
residual dropout masks and the hidden states between layers have R rows (:attr:`Shape.sequence_tokens`: L,
or L/t under sequence parallelism). Where the code keeps the column-parallel linears' input:

* ``megatron`` (Korthikanti et al. 2022 §4.2.2; Megatron-LM ``core/tensor_parallel/layers.py``): the
  s/t-sharded input under sequence parallelism, all-gathered again in backward (:mod:`.activations`);
* ``torchtitan`` (v0.2.2 ``models/llama3/infra/parallelize.py::apply_tp``: ``attention_norm`` / ``ffn_norm``
  ``SequenceParallel``, ``PrepareModuleInput`` Shard(1) → Replicate before ``attention`` and
  ``feed_forward``, wq/wk/wv/w1/w3 ``ColwiseParallel``, wo/w2 ``RowwiseParallel(output_layouts=Shard(1))``;
  sequence parallelism always goes with TP): the all-gathered Replicate input, L·h, which the linears save
  and do not gather again;
* ``hf`` (transformers 5.17 ``base_model_tp_plan``: q/k/v, gate/up ``colwise``, o/down ``rowwise``,
  ``distributed/tensor_parallel.py`` DTensor styles; no sequence parallelism, the norms replicated): the
  replicated input, L·h. Families whose plan differs (gathered or packed outputs, mixture-of-experts, no
  plan) are refused by :func:`parallel_unsupported`.

Measured once on CPU (torch 2.13, gloo, world 2, a Llama block under torchtitan's plan with
``saved_tensors_hooks``): the attention and MLP inputs are saved whole ([b·s, h]), q, k, v, the attention
output, log-sum-exp and the f-wide tensors with a/t, kv/t, f/t columns, the norms' tensors with s/t rows.
"""

from __future__ import annotations

from zerocalc.model.code.attention import HF_ATTENTION, SDPA_NO_MASK, default_attention
from zerocalc.model.code.base import (
    FP32,
    INT64,
    AttentionKernel,
    Device,
    LayerSaves,
    ModelImpl,
    ModelImplName,
    Transient,
)
from zerocalc.model.code.layer import QUADRATIC_TERMS, layer_saves
from zerocalc.model.code.norms import norm_backward_excess, norm_saves
from zerocalc.model.code.op_sac import (
    OP_SAC_MATMUL_ORDER,
    OpSacLayer,
    op_sac_layer,
    op_sac_recomputes,
    op_sac_unsupported,
)
from zerocalc.model.code.outside import (
    VocabShard,
    embedding_excess,
    embedding_saves,
    final_saves,
    logits_saves,
    loss_parallel_transients,
    loss_saves,
    shared_saves,
    vocab_shard,
)
from zerocalc.model.code.parallel import parallel_transients, parallel_unsupported
from zerocalc.model.code.shape import Shape, hidden_bytes

MODEL_IMPLS: dict[ModelImplName, ModelImpl] = {
    m.name: m
    for m in (
        ModelImpl(
            name=ModelImplName.HF,
            title="Hugging Face transformers",
            library="transformers 5.17.0",
            source="transformers 5.17.0 modeling_<family>.py, loss_utils.ForCausalLMLoss, sdpa_attention, "
            "moe (measured with saved_tensors_hooks; eight H100 runs reproduced)",
            norm_fp32_copy=True,
            kv_cache_copies=True,
            embedding_output_alive=True,
            loss="hf_upcast",
            transients=True,
        ),
        ModelImpl(
            name=ModelImplName.MEGATRON,
            title="Megatron-LM (fused kernels)",
            library="Megatron-LM",
            source="Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, "
            "§4.1, Table 2",
            norm_fp32_copy=False,
            kv_cache_copies=False,
            embedding_output_alive=False,
            loss="fp32_logits",
            transients=False,
        ),
        ModelImpl(
            name=ModelImplName.TORCHTITAN,
            title="torchtitan Llama",
            library="torchtitan (main, 2026)",
            source="torchtitan models/llama3/model.py (nn.RMSNorm, SDPA, SwiGLU), "
            "components/loss.py cross_entropy_loss (pred.float())",
            norm_fp32_copy=False,
            kv_cache_copies=False,
            embedding_output_alive=False,
            loss="float_cross_entropy",
            transients=True,
        ),
    )
}

__all__ = [
    "FP32",
    "HF_ATTENTION",
    "INT64",
    "MODEL_IMPLS",
    "OP_SAC_MATMUL_ORDER",
    "QUADRATIC_TERMS",
    "SDPA_NO_MASK",
    "AttentionKernel",
    "Device",
    "LayerSaves",
    "ModelImpl",
    "ModelImplName",
    "OpSacLayer",
    "Shape",
    "Transient",
    "VocabShard",
    "annotations",
    "default_attention",
    "embedding_excess",
    "embedding_saves",
    "final_saves",
    "hidden_bytes",
    "layer_saves",
    "logits_saves",
    "loss_parallel_transients",
    "loss_saves",
    "norm_backward_excess",
    "norm_saves",
    "op_sac_layer",
    "op_sac_recomputes",
    "op_sac_unsupported",
    "parallel_transients",
    "parallel_unsupported",
    "shared_saves",
    "vocab_shard",
]
