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
the router input once and each routed copy of a token's MLP activations (k × the MLP terms); its
router logits (fp32, s·b·E·4) are listed apart. Flash attention (Dao et al. 2022) saves Q, K, V, the
output (the projection's input, counted once) and a fp32 log-sum-exp per head and row (4·a·s·b)
instead of the s² terms.

Recomputation (Korthikanti section 4.2) is the step timeline's (:mod:`zerocalc.peak.timeline`): ``selective``
drops the s²-proportional attention terms (:data:`zerocalc.model.model_impl.QUADRATIC_TERMS`) and recomputes
them in the layer's backward; ``full`` keeps only each layer's input. Data parallelism never shards
activations: they are per micro-batch.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.model.architecture import MlpKind

ACTIVATION_BYTES = 2
"""16-bit activations (bf16/fp16), as in Korthikanti et al. 2022."""
MASK_BYTES = 1
"""A dropout mask is one byte per element."""
FP32_BYTES = 4


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class ActivationShape(BaseModel):
    """What one layer's activation count needs to know about the model and the micro-batch."""

    model_config = ConfigDict(frozen=True)

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


def layer_terms(shape: ActivationShape) -> dict[str, int]:
    """Bytes saved by each op of one transformer layer (no recomputation)."""
    s, b, h = shape.seq_len, shape.micro_batch, shape.hidden
    a, f = shape.heads, shape.ffn_hidden
    sb = s * b
    h_q = a * shape.head_dim
    h_kv = shape.kv_heads * shape.head_dim
    act, mask = ACTIVATION_BYTES, MASK_BYTES
    terms: dict[str, int] = {
        "attn_norm_input": act * sb * h,
        "qkv_input": act * sb * h,
        "q": act * sb * h_q,
        "k": act * sb * h_kv,
        "v": act * sb * h_kv,
    }
    if shape.flash_attention:
        # flash attention keeps Q, K, V, its output O (= the projection input below) and the row-wise
        # log-sum-exp, never the s x s probabilities
        terms["softmax_logsumexp_fp32"] = FP32_BYTES * sb * a
    else:
        terms["softmax_output"] = act * a * s * s * b
        if shape.dropout:
            terms["attn_dropout_mask"] = mask * a * s * s * b
            terms["attn_dropout_output"] = act * a * s * s * b
    terms["out_proj_input"] = act * sb * h_q
    if shape.dropout:
        terms["attn_out_dropout_mask"] = mask * sb * h
    terms["mlp_norm_input"] = act * sb * h

    if shape.mlp is MlpKind.GELU:
        mlp = {"mlp_input": act * sb * h, "gelu_input": act * sb * f, "fc2_input": act * sb * f}
    else:
        mlp = {
            "mlp_input": act * sb * h,
            "gate_output": act * sb * f,
            "up_output": act * sb * f,
            "silu_output": act * sb * f,
            "down_input": act * sb * f,
        }
    if shape.dropout:
        mlp["mlp_dropout_mask"] = mask * sb * h
    if shape.experts:
        routed = shape.experts_per_token + shape.shared_experts
        terms["router_input"] = mlp.pop("mlp_input")
        terms["router_logits_fp32"] = FP32_BYTES * sb * shape.experts
        for name, value in mlp.items():
            terms[f"experts_{name}"] = routed * value
    else:
        terms.update(mlp)
    return terms
