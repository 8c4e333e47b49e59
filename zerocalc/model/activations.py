"""Activation memory of a transformer training step, from what each op saves for backward.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4.1 and Table 2. With 16-bit activations, s = sequence length, b = micro-batch, h = hidden size,
a = attention heads, one GPT layer (LayerNorm, GELU MLP of 4h, dropout, no flash attention) saves

    attention  11·s·b·h + 5·a·s²·b   (QKV input 2sbh, Q and K 4sbh, softmax 2as²b, its dropout mask as²b,
                                      dropout output 2as²b, V 2sbh, projection input 2sbh, mask sbh)
    MLP        19·s·b·h              (input 2sbh, GELU input 8sbh, fc2 input 8sbh, mask sbh)
    norms       4·s·b·h              (two LayerNorm inputs)
    total      s·b·h·(34 + 5·a·s/h)

This module itemises the same accounting op by op, so other architectures get their own constants
rather than GPT's 34: grouped-query attention saves K and V of h_kv = kv_heads·head_dim columns; a
SwiGLU MLP of width f saves its input 2sbh plus gate, up, SiLU output and product (8·s·b·f, autograd
of ``silu(x W1) * (x W3)`` unfused); RMSNorm saves its input like LayerNorm (per-token statistics are
ignored, O(s·b)); no dropout means no masks. A mixture-of-experts layer with k experts per token saves
the router input once and each routed copy of a token's MLP activations (k × the MLP terms; under
expert parallelism the copies routed to the rank's E/e experts, k·cf × with cf the capacity factor,
:func:`routed_rows`); its router logits (fp32, s·b·E·4) are listed apart. Flash attention (Dao et al.
2022) saves Q, K, V, the output (the projection's input, counted once) and a fp32 log-sum-exp per head
and row (4·a·s·b) instead of the s² terms. Multi-head latent attention (DeepSeek-V3) saves its q/kv latents
on the sequence shard and its q, k (d_nope + d_rope) and v (d_v) per head (:func:`latent_attention_terms`).

Recomputation (Korthikanti section 4.2) is the step timeline's (:mod:`zerocalc.peak.timeline`): ``selective``
drops the s²-proportional attention terms (:data:`zerocalc.model.code.QUADRATIC_TERMS`) and recomputes
them in the layer's backward; ``full`` keeps only each layer's input (:func:`layer_input_bytes`); ``op``
(torchtitan's op-level policy) keeps the input and the outputs of the ops its save list names
(:func:`zerocalc.model.code.op_sac_layer`). Data
parallelism never shards activations: they are per micro-batch.

Per rank under tensor parallelism of degree t (Korthikanti §4.2.2, Table 2; Megatron-LM
``core/tensor_parallel/layers.py``): the column-parallel linears (QKV, fc1) split their output columns and
the row-parallel ones (projection, fc2) their input rows, so Q, K, V, the attention core, the projection
input and the MLP's f-wide tensors are /t; the two norm inputs, the QKV and MLP inputs and the two dropout
masks after the row-parallel linears are replicated — sbh(10 + 24/t + 5as/(ht)). Sequence parallelism
(§4.2.2) splits those replicated regions along s, and ``LinearWithGradAccumulationAndAsyncCommunication``
saves the s/t-sharded input of a column-parallel linear and all-gathers it again in backward:
sbh(34/t + 5as/(ht)). Context parallelism of degree c gives each rank s/c tokens of every per-token tensor;
its attention runs in Transformer Engine's fused kernels (``attention/dot_product_attention/
context_parallel.py``: ``AttnFuncWithCPAndKVP2P`` ring, ``AttnFuncWithCPAndKVAllGather``,
``AttnFuncWithCPAndQKVOA2A`` Ulysses), so only with flash attention: ring and all-gather save the local q,
the local-sized K/V, the output and the log-sum-exp; Ulysses saves q, K, V and the output after its
all-to-all (s × a/c, the same bytes) and the projection saves the output all-to-all'd back, one more
s/c × a tensor.
"""

from __future__ import annotations

from enum import StrEnum
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.model.architecture import LatentAttention, MlpKind

ACTIVATION_BYTES = 2
"""16-bit activations (bf16/fp16), as in Korthikanti et al. 2022."""
MASK_BYTES = 1
"""A dropout mask is one byte per element."""
FP32_BYTES = 4


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    OP = "op"
    """torchtitan's op-level selective checkpointing (``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``): :func:`zerocalc.model.code.op_sac_layer`."""


class CpImpl(StrEnum):
    """How attention gets the keys and values of the other context-parallel ranks."""

    RING = "ring"
    """K/V chunks passed around the ring, one neighbour's chunk per step (Megatron-LM with Transformer
    Engine ``AttnFuncWithCPAndKVP2P``; torch ``_context_parallel`` with the ``alltoall`` rotater)."""
    ALLGATHER = "allgather"
    """The whole K/V all-gathered once per layer (TE ``AttnFuncWithCPAndKVAllGather``; torch's default
    ``allgather`` rotater, torchtitan's default ``context_parallel_rotate_method``)."""
    ULYSSES = "ulysses"
    """All-to-all of q, k, v from s/c × a to s × a/c heads and back (DeepSpeed ``sequence/layer.py``
    ``DistributedAttention``, ``runtime/sequence_parallel/ulysses_sp.py``; TE
    ``AttnFuncWithCPAndQKVOA2A``)."""


def routed_rows(pairs: int, capacity_factor: float) -> int:
    """Token-expert pairs one expert-parallel rank's E/e experts compute when the EP group's ranks route
    ``pairs`` each (k·b·s/c): as many under balanced routing, ``capacity_factor`` times as many on the
    busiest rank (Megatron-LM ``--moe-expert-capacity-factor``; DeepSpeed-MoE ``capacity_factor``,
    ``deepspeed/moe/sharded_moe.py`` ``_capacity``: ceil(k·T/E · factor) per expert), rounded up."""
    factor = Fraction(capacity_factor).limit_denominator(1_000_000)
    return -(-pairs * factor.numerator // factor.denominator)


def exact_split(total: int, parts: int, what: str) -> int:
    """``total / parts`` when it divides exactly; else ``ValueError`` naming ``what``."""
    if total % parts:
        raise ValueError(f"{what} ({total}) is not divisible by {parts}")
    return total // parts


class ActivationShape(BaseModel):
    """What one layer's activation count needs to know about the model and the micro-batch."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    seq_len: int = Field(gt=0, description="s")
    micro_batch: int = Field(gt=0, description="b")
    hidden: int = Field(gt=0, description="h")
    heads: int = Field(gt=0, description="a")
    kv_heads: int = Field(gt=0, description="key/value heads (a for MHA, 1 for MQA)")
    head_dim: int = Field(gt=0, description="h / a unless the model says otherwise")
    ffn_hidden: int = Field(gt=0, description="f, the MLP intermediate size (per expert for MoE)")
    mlp: MlpKind = MlpKind.GELU
    dropout: bool = True
    """GPT-style dropout after attention probabilities, attention output, MLP and embeddings."""
    flash_attention: bool = False
    experts: int = Field(default=0, ge=0, description="routed experts (0: dense)")
    experts_per_token: int = Field(default=0, ge=0, description="k")
    shared_experts: int = Field(default=0, ge=0)
    capacity_factor: float = Field(
        default=1.0, gt=0, description="routed tokens a rank's experts compute over k·b·s/c (routed_rows)"
    )
    tp: int = Field(default=1, gt=0, description="t, tensor-parallel degree")
    sequence_parallel: bool = False
    """Megatron sequence parallelism: the norm and dropout regions split along s over the t ranks."""
    cp: int = Field(default=1, gt=0, description="c, context-parallel degree")
    cp_impl: CpImpl = CpImpl.RING
    latent: LatentAttention | None = None
    """Multi-head latent attention (DeepSeek-V3): :func:`latent_attention_terms` in place of q, k, v."""

    @property
    def local_rows(self) -> int:
        """Tokens of this rank's sequence chunk, b·s/c: the rows of the tensor-parallel region."""
        return exact_split(self.seq_len * self.micro_batch, self.cp, "b·s")

    @property
    def sequence_rows(self) -> int:
        """Rows of the norms, dropouts and residual adds: b·s/c, and /t under sequence parallelism."""
        if self.sequence_parallel and self.tp > 1:
            return exact_split(self.local_rows, self.tp, "b·s/c")
        return self.local_rows


def layer_terms(shape: ActivationShape) -> dict[str, int]:
    """Bytes saved by each op of one transformer layer on one rank (no recomputation)."""
    s, b, h = shape.seq_len, shape.micro_batch, shape.hidden
    t = shape.tp
    rows, local = shape.sequence_rows, shape.local_rows
    a = exact_split(shape.heads, t, "attention heads")
    kv = exact_split(shape.kv_heads, t, "key/value heads")
    f = exact_split(shape.ffn_hidden, t, "the MLP width")
    h_q = a * shape.head_dim
    h_kv = kv * shape.head_dim
    act, mask = ACTIVATION_BYTES, MASK_BYTES
    terms: dict[str, int] = {
        "attn_norm_input": act * rows * h,
        "qkv_input": act * rows * h,
        "q": act * local * h_q,
        "k": act * local * h_kv,
        "v": act * local * h_kv,
    }
    if shape.latent is not None:
        terms = {**terms, **latent_attention_terms(shape.latent, rows, local, a)}
        h_q = a * shape.latent.v_head_dim  # the output's width, the projection's input
    if shape.flash_attention:
        # flash attention keeps Q, K, V, its output O (= the projection input below) and the row-wise
        # log-sum-exp, never the s x s probabilities
        terms["softmax_logsumexp_fp32"] = FP32_BYTES * local * a
    elif shape.cp > 1:
        raise ValueError("context parallelism runs only in fused (flash) attention kernels")
    else:
        terms["softmax_output"] = act * a * s * s * b
        if shape.dropout:
            terms["attn_dropout_mask"] = mask * a * s * s * b
            terms["attn_dropout_output"] = act * a * s * s * b
    if shape.cp > 1 and shape.cp_impl is CpImpl.ULYSSES:
        # the kernel's output over s × a/c heads, before the all-to-all back to s/c × a
        terms["attn_output_before_all_to_all"] = act * local * h_q
    terms["out_proj_input"] = act * local * h_q
    if shape.dropout:
        terms["attn_out_dropout_mask"] = mask * rows * h
    terms["mlp_norm_input"] = act * rows * h

    if shape.mlp is MlpKind.GELU:
        mlp = {"mlp_input": act * rows * h, "gelu_input": act * local * f, "fc2_input": act * local * f}
    else:
        mlp = {
            "mlp_input": act * rows * h,
            "gate_output": act * local * f,
            "up_output": act * local * f,
            "silu_output": act * local * f,
            "down_input": act * local * f,
        }
    if shape.dropout:
        mlp["mlp_dropout_mask"] = mask * rows * h
    if shape.experts:
        # the router reads the (sequence-parallel) hidden states; the experts, tensor-parallel over the
        # same t ranks (Megatron-LM's expert_tensor_parallel_size defaults to the TP size), get every
        # token of the local chunk, with f/t columns; over ETP < t ranks (--expert-tp) they get the
        # L·ETP/t tokens of their expert-tensor-parallel group with f/ETP columns: the same L·f/t
        # elements (Megatron-LM core 0.20.0 MoEAlltoAllTokenDispatcher.dispatch_postprocess)
        routed, shared = shape.experts_per_token, shape.shared_experts
        terms["router_input"] = mlp.pop("mlp_input")
        terms["router_logits_fp32"] = FP32_BYTES * rows * shape.experts
        for name, value in mlp.items():
            terms[f"experts_{name}"] = routed_rows(routed * value, shape.capacity_factor) + shared * value
    else:
        terms.update(mlp)
    return terms


def latent_attention_terms(mla: LatentAttention, rows: int, local: int, a: int) -> dict[str, int]:
    """What Megatron-LM's multi-head latent attention saves beyond the layer's input and norm (16-bit;
    ``core/transformer/multi_latent_attention.py`` ``MLASelfAttention``, d98e8a6, with the Transformer
    Engine spec): the duplicated down projections read the norm's output that ``qkv_input`` counts, on
    the ``rows`` of the sequence shard; each ``TELayerNormColumnParallelLinear`` up projection keeps its
    input for the norm's backward and its normed output, both on ``rows`` (Transformer Engine
    ``LayerNormLinear`` saves the local ``ln_out`` and all-gathers it again in backward) — for kv the
    input is the r_kv split of the down projection's [rows, r_kv + d_rope] output, which stays whole;
    the fused attention keeps q and k of the ``local`` gathered rows' a/t heads at d_nope + d_rope and v
    at d_v (``query``, ``key``, ``value`` made contiguous), its output (d_v per head) the projection's
    input. Without a q rank ``linear_q_proj`` reads the layer's normed input, ``qkv_input``."""
    act = ACTIVATION_BYTES
    terms: dict[str, int] = {}
    if mla.q_lora_rank is not None:
        terms["q_latent_norm_input"] = act * rows * mla.q_lora_rank
        terms["q_up_input"] = act * rows * mla.q_lora_rank
    terms["kv_down_output"] = act * rows * (mla.kv_lora_rank + mla.qk_rope_head_dim)
    terms["kv_up_input"] = act * rows * mla.kv_lora_rank
    terms["q"] = act * local * a * mla.qk_head_dim
    terms["k"] = act * local * a * mla.qk_head_dim
    terms["v"] = act * local * a * mla.v_head_dim
    return terms


def layer_input_bytes(shape: ActivationShape) -> int:
    """What full recomputation keeps of a layer: its input hidden state, 2·s·b·h (Korthikanti Table 2),
    b·s/c rows per rank and /t under sequence parallelism (the hidden states between Megatron-LM's layers
    are [s/t, b, h] then)."""
    return ACTIVATION_BYTES * shape.sequence_rows * shape.hidden
