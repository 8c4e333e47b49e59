"""Transformer architectures and their exact parameter counts.

The count is derived from one list of parameter tensors per layer (:func:`layer_tensors`), the way the
Hugging Face implementations (``GPT2Model``, ``LlamaForCausalLM``, ``MistralForCausalLM``,
``MixtralForCausalLM``, ``Qwen2ForCausalLM``) declare them, so totals, the largest module and the
largest block all come from the same fact:

* embeddings V·d (+ P·d learned positions); LM head V·d unless tied to the embedding;
* attention: q d·(a·h_d), k and v d·(kv·h_d) each, o (a·h_d)·d, biases where the family has them
  (GPT-2 all, Qwen2 q/k/v only, Llama/Mistral none);
* MLP: GELU d·f + f·d (+ f + d biases); SwiGLU gate, up d·f and down f·d;
* mixture of experts: a router d·E and E experts (and shared experts) each a full MLP;
* norms: LayerNorm weight and bias, RMSNorm weight only; two per layer plus the final one.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MlpKind(StrEnum):
    GELU = "gelu"
    """Two matrices h → f → h (GPT-2, GPT-3)."""
    SWIGLU = "swiglu"
    """Three matrices: gate and up h → f, down f → h (Llama, Mistral, Qwen2, Mixtral experts)."""


class NormKind(StrEnum):
    LAYERNORM = "layernorm"
    """Weight and bias."""
    RMSNORM = "rmsnorm"
    """Weight only."""


class Architecture(BaseModel):
    """A decoder-only transformer as its config describes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vocab_size: int = Field(gt=0, description="V")
    hidden_size: int = Field(gt=0, description="d")
    num_layers: int = Field(gt=0, description="L")
    num_heads: int = Field(gt=0, description="a")
    num_kv_heads: int | None = Field(default=None, gt=0, description="key/value heads (GQA/MQA); a if unset")
    head_dim: int | None = Field(default=None, gt=0, description="d / a if unset")
    intermediate_size: int = Field(gt=0, description="f: MLP width (per expert for MoE)")
    mlp: MlpKind
    norm: NormKind
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tied_embeddings: bool = False
    max_position_embeddings: int = Field(default=0, ge=0, description="P, for learned position embeddings")
    learned_position_embeddings: bool = False
    num_experts: int = Field(default=0, ge=0, description="routed experts per layer (0: dense)")
    experts_per_token: int = Field(default=0, ge=0)
    num_shared_experts: int = Field(default=0, ge=0)
    shared_expert_intermediate_size: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.kv_heads}")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError("experts_per_token must be between 1 and num_experts")
        if not self.num_experts and (self.experts_per_token or self.num_shared_experts):
            raise ValueError("experts_per_token/num_shared_experts need num_experts > 0")
        if self.learned_position_embeddings and not self.max_position_embeddings:
            raise ValueError("learned_position_embeddings needs max_position_embeddings")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


class ParamTensor(BaseModel):
    """One parameter tensor: its module (as in the HF implementation), name and shape."""

    model_config = ConfigDict(frozen=True)

    module: str
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def _linear(module: str, d_in: int, d_out: int, bias: bool) -> list[ParamTensor]:
    tensors = [ParamTensor(module=module, name="weight", shape=(d_out, d_in))]
    if bias:
        tensors.append(ParamTensor(module=module, name="bias", shape=(d_out,)))
    return tensors


def _norm(module: str, arch: Architecture) -> list[ParamTensor]:
    tensors = [ParamTensor(module=module, name="weight", shape=(arch.hidden_size,))]
    if arch.norm is NormKind.LAYERNORM:
        tensors.append(ParamTensor(module=module, name="bias", shape=(arch.hidden_size,)))
    return tensors


def _mlp(prefix: str, arch: Architecture, width: int) -> list[ParamTensor]:
    d, bias = arch.hidden_size, arch.mlp_bias
    if arch.mlp is MlpKind.GELU:
        return _linear(f"{prefix}.fc_in", d, width, bias) + _linear(f"{prefix}.fc_out", width, d, bias)
    return (
        _linear(f"{prefix}.gate_proj", d, width, bias)
        + _linear(f"{prefix}.up_proj", d, width, bias)
        + _linear(f"{prefix}.down_proj", width, d, bias)
    )


def layer_tensors(arch: Architecture, index: int = 0) -> list[ParamTensor]:
    """The parameter tensors of transformer block ``index`` (all blocks are alike)."""
    p = f"layers.{index}"
    d, q_width, kv_width = (
        arch.hidden_size,
        arch.num_heads * arch.dim_per_head,
        arch.kv_heads * arch.dim_per_head,
    )
    tensors = _norm(f"{p}.input_norm", arch)
    tensors += _linear(f"{p}.attn.q_proj", d, q_width, arch.qkv_bias)
    tensors += _linear(f"{p}.attn.k_proj", d, kv_width, arch.qkv_bias)
    tensors += _linear(f"{p}.attn.v_proj", d, kv_width, arch.qkv_bias)
    tensors += _linear(f"{p}.attn.o_proj", q_width, d, arch.out_bias)
    tensors += _norm(f"{p}.post_attention_norm", arch)
    if arch.is_moe:
        tensors += _linear(f"{p}.moe.router", d, arch.num_experts, False)
        for e in range(arch.num_experts):
            tensors += _mlp(f"{p}.moe.experts.{e}", arch, arch.intermediate_size)
        shared_width = arch.shared_expert_intermediate_size or arch.intermediate_size
        for e in range(arch.num_shared_experts):
            tensors += _mlp(f"{p}.moe.shared_experts.{e}", arch, shared_width)
    else:
        tensors += _mlp(f"{p}.mlp", arch, arch.intermediate_size)
    return tensors


def embedding_tensors(arch: Architecture) -> list[ParamTensor]:
    tensors = [ParamTensor(module="embed_tokens", name="weight", shape=(arch.vocab_size, arch.hidden_size))]
    if arch.learned_position_embeddings:
        tensors.append(
            ParamTensor(
                module="embed_positions",
                name="weight",
                shape=(arch.max_position_embeddings, arch.hidden_size),
            )
        )
    return tensors


def head_tensors(arch: Architecture) -> list[ParamTensor]:
    """Final norm and, unless tied to the embedding, the LM head."""
    tensors = _norm("final_norm", arch)
    if not arch.tied_embeddings:
        tensors.append(
            ParamTensor(module="lm_head", name="weight", shape=(arch.vocab_size, arch.hidden_size))
        )
    return tensors


def parameter_tensors(arch: Architecture) -> list[ParamTensor]:
    """Every parameter tensor of the model, in module order (shared tensors once)."""
    tensors = embedding_tensors(arch)
    for i in range(arch.num_layers):
        tensors += layer_tensors(arch, i)
    return tensors + head_tensors(arch)


class ParameterCount(BaseModel):
    total: int = Field(description="all parameters (memory uses this)")
    active_per_token: int = Field(description="parameters a token passes through (MoE: k of E experts)")
    embedding: int
    per_layer: int
    layers: int = Field(description="all transformer blocks")
    head: int = Field(description="final norm + untied LM head")
    largest_layer_params: int = Field(
        description="most parameters held directly by one module (DeepSpeed's model_to_params definition)"
    )
    largest_layer_name: str
    largest_block_params: int = Field(description="one transformer block: the default FSDP/ZeRO-3 unit")


def _numel(tensors: list[ParamTensor]) -> int:
    return sum(t.numel for t in tensors)


def count_parameters(arch: Architecture) -> ParameterCount:
    """Exact parameter count of ``arch`` and its largest module and block."""
    block = layer_tensors(arch)
    embedding, head = embedding_tensors(arch), head_tensors(arch)
    per_layer = _numel(block)
    inactive = 0
    if arch.is_moe:
        expert = _numel(_mlp("expert", arch, arch.intermediate_size))
        inactive = (arch.num_experts - arch.experts_per_token) * expert * arch.num_layers
    modules: dict[str, int] = {}
    for t in embedding + block + head:
        modules[t.module] = modules.get(t.module, 0) + t.numel
    largest_name = max(modules, key=lambda m: modules[m])
    total = _numel(embedding) + per_layer * arch.num_layers + _numel(head)
    return ParameterCount(
        total=total,
        active_per_token=total - inactive,
        embedding=_numel(embedding),
        per_layer=per_layer,
        layers=per_layer * arch.num_layers,
        head=_numel(head),
        largest_layer_params=modules[largest_name],
        largest_layer_name=largest_name.replace("layers.0.", "layers.*."),
        largest_block_params=per_layer,
    )
