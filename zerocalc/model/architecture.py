"""Transformer architectures and their exact parameter counts.

The count is derived from one list of parameter tensors per block (:func:`layer_tensors`), laid out as the
Hugging Face implementations of ``transformers`` 5.17 declare them (``models/<family>/modeling_<family>.py``:
``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``MistralForCausalLM``, ``MixtralForCausalLM``,
``Qwen2ForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``, ``Phi3ForCausalLM``, ``Qwen3ForCausalLM``,
``Qwen3MoeForCausalLM``, ``Qwen2MoeForCausalLM``, ``DeepseekV3ForCausalLM``, ``Olmo2ForCausalLM``,
``FalconForCausalLM``, ``GPTNeoXForCausalLM``, ``GptOssForCausalLM``), so totals, the largest module and the
largest block all come from the same fact:

* embeddings V·d (+ P·d learned positions); LM head V·d unless tied to the embedding;
* attention: q d·(a·h_d), k and v d·(kv·h_d) each, o (a·h_d)·d, biases where the family has them; or one
  fused q/k/v projection of the same rows (Phi-3 ``qkv_proj``, Falcon and GPT-NeoX ``query_key_value``);
  q/k norms per head (Qwen3, Gemma 3) or over all heads (OLMo 2); one sink logit per head (GPT-OSS); or
  multi-head latent attention (DeepSeek-V3, :class:`LatentAttention`);
* MLP: GELU d·f + f·d (+ f + d biases); gated (SwiGLU, Gemma's GeGLU) gate, up d·f and down f·d, or gate and
  up fused in one 2f·d projection (Phi-3 ``gate_up_proj``);
* mixture of experts (transformers 5.x layout): a router E·d (+ E, GPT-OSS), **one** experts module holding
  every expert's weights as 3-D parameters (``gate_up_proj`` E·2f·d, ``down_proj`` E·d·f; GPT-OSS adds
  their biases E·2f and E·d), optional shared experts (one
  MLP of the summed width, Qwen2-MoE's with a 1·d gate), and dense MLP layers where the config says so
  (DeepSeek-V3 ``first_k_dense_replace``, Qwen ``decoder_sparse_step`` / ``mlp_only_layers``);
* norms: LayerNorm weight and bias, RMSNorm weight only; per block as :class:`BlockLayout` places them,
  plus the final one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from functools import lru_cache
from itertools import accumulate

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zerocalc.base.memo import IdentityCache


class MlpKind(StrEnum):
    GELU = "gelu"
    """Two matrices h → f → h (GPT-2, GPT-3, Falcon, GPT-NeoX)."""
    SWIGLU = "swiglu"
    """Gated, three matrices: gate and up h → f, down f → h (Llama, Mistral, Qwen, Phi-3, DeepSeek; Gemma's
    GeGLU has the same tensors)."""


class NormKind(StrEnum):
    LAYERNORM = "layernorm"
    """Weight and bias."""
    RMSNORM = "rmsnorm"
    """Weight only."""


class BlockLayout(StrEnum):
    """Where a block's hidden-size norms sit and how its residual adds up."""

    PRE_NORM = "pre_norm"
    """x + attn(n1(x)), then + mlp(n2(x)): Llama, GPT-2, Falcon with ``parallel_attn`` false."""
    SANDWICH_NORM = "sandwich_norm"
    """A norm before and after attention and before and after the MLP (4): Gemma 2, Gemma 3."""
    POST_NORM = "post_norm"
    """x + n1(attn(x)), then + n2(mlp(x)): OLMo 2."""
    PARALLEL = "parallel"
    """x + attn(n1(x)) + mlp(n2(x)): GPT-NeoX ``use_parallel_residual``, Falcon with two parallel norms."""
    PARALLEL_SHARED_NORM = "parallel_shared_norm"
    """x + attn(n(x)) + mlp(n(x)), one norm: Falcon-7B (``parallel_attn``, one layer norm)."""


# per layout: the norms before attention, after attention, before the MLP, after the MLP
_BLOCK_NORMS: dict[BlockLayout, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    BlockLayout.PRE_NORM: (("input_norm",), (), ("post_attention_norm",), ()),
    BlockLayout.SANDWICH_NORM: (
        ("input_norm",),
        ("post_attention_norm",),
        ("pre_feedforward_norm",),
        ("post_feedforward_norm",),
    ),
    BlockLayout.POST_NORM: ((), ("post_attention_norm",), (), ("post_feedforward_norm",)),
    BlockLayout.PARALLEL: (("attn_norm",), (), ("mlp_norm",), ()),
    BlockLayout.PARALLEL_SHARED_NORM: (("input_norm",), (), (), ()),
}


class QkNorm(StrEnum):
    NONE = "none"
    PER_HEAD = "per_head"
    """q_norm and k_norm over h_d, shared by the heads (Qwen3, Qwen3-MoE, Gemma 3)."""
    FULL = "full"
    """q_norm over a·h_d and k_norm over kv·h_d (OLMo 2)."""


class LatentAttention(BaseModel):
    """Multi-head latent attention (``DeepseekV3Attention``, models/deepseek_v3/modeling_deepseek_v3.py).

    q: ``q_proj`` d → a·(nope + rope), or with a q rank ``q_a_proj`` d → r_q, ``q_a_layernorm`` r_q and
    ``q_b_proj`` r_q → a·(nope + rope); k/v: ``kv_a_proj_with_mqa`` d → r_kv + rope, ``kv_a_layernorm``
    r_kv, ``kv_b_proj`` r_kv → a·(nope + v); out: ``o_proj`` a·v → d. ``attention_bias`` adds biases to
    ``q_a_proj``, ``kv_a_proj_with_mqa`` (``qkv_bias``) and ``o_proj`` (``out_bias``) only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    q_lora_rank: int | None = Field(default=None, gt=0, description="r_q; None: a plain q_proj")
    kv_lora_rank: int = Field(gt=0, description="r_kv")
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


MAX_LAYERS = 512
"""The deepest model accepted: four times the deepest published decoder (Llama 3.1 405B, 126 layers; PaLM
540B, 118). A step's simulation grows faster than the layers (10 s at 512 layers on two cores)."""


class Architecture(BaseModel):
    """A decoder-only transformer as its config describes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vocab_size: int = Field(gt=0, description="V")
    hidden_size: int = Field(gt=0, description="d")
    num_layers: int = Field(gt=0, le=MAX_LAYERS, description="L")
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
    max_position_embeddings: int = Field(
        default=0,
        ge=0,
        description="P: the learned position table's rows, or the positions a rotary model was trained for "
        "(its config's max_position_embeddings; 0: not known)",
    )
    learned_position_embeddings: bool = False
    num_experts: int = Field(default=0, ge=0, description="routed experts per MoE layer (0: dense)")
    experts_per_token: int = Field(default=0, ge=0)
    num_shared_experts: int = Field(
        default=0, ge=0, description="one MLP of the shared experts' summed width"
    )
    shared_expert_intermediate_size: int | None = Field(
        default=None, gt=0, description="width of one shared expert; f if unset"
    )
    shared_expert_gate: bool = Field(default=False, description="a d → 1 gate on the shared experts")
    router_bias: bool = Field(default=False, description="the router has a bias of E (GPT-OSS)")
    expert_bias: bool = Field(
        default=False,
        description="each routed expert's projections have biases (GPT-OSS: gate_up_proj_bias E·2f, "
        "down_proj_bias E·d)",
    )
    attention_sinks: bool = Field(
        default=False, description="one learned logit per query head joins each softmax (GPT-OSS sinks, a)"
    )
    dense_layers: tuple[int, ...] = Field(default=(), description="MoE models: the layers with a dense MLP")
    dense_intermediate_size: int | None = Field(
        default=None, gt=0, description="width of the dense layers' MLP in an MoE model; f if unset"
    )
    block_layout: BlockLayout = BlockLayout.PRE_NORM
    fused_qkv: bool = Field(default=False, description="one (a + 2·kv)·h_d × d projection")
    fused_gate_up: bool = Field(default=False, description="gated MLP: gate and up as one 2f × d projection")
    qk_norm: QkNorm = QkNorm.NONE
    latent_attention: LatentAttention | None = None
    family: str | None = Field(
        default=None,
        description="the transformers model_type whose modeling code this follows (what its forward saves)",
    )
    residual_dropout: float = Field(default=0.0, ge=0, lt=1, description="after attention and the MLP")
    embedding_dropout: float = Field(default=0.0, ge=0, lt=1)
    attention_dropout: float = Field(default=0.0, ge=0, lt=1, description="on the attention probabilities")

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.kv_heads}")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError("experts_per_token must be between 1 and num_experts")
        if not self.num_experts and (
            self.experts_per_token
            or self.num_shared_experts
            or self.dense_layers
            or self.shared_expert_gate
            or self.router_bias
            or self.expert_bias
        ):
            raise ValueError(
                "experts_per_token, shared experts, dense_layers, router_bias and expert_bias need "
                "num_experts > 0"
            )
        if self.num_experts and self.mlp_bias:
            raise ValueError(
                "mlp_bias is a dense MLP's; the routed experts' biases are expert_bias (GPT-OSS)"
            )
        if self.shared_expert_gate and not self.num_shared_experts:
            raise ValueError("shared_expert_gate needs num_shared_experts > 0")
        if len(set(self.dense_layers)) != len(self.dense_layers) or any(
            not 0 <= i < self.num_layers for i in self.dense_layers
        ):
            raise ValueError(f"dense_layers must be distinct layer indices from 0 to {self.num_layers - 1}")
        if self.num_experts and len(self.dense_layers) == self.num_layers:
            raise ValueError("every layer is dense: set num_experts to 0")
        if self.learned_position_embeddings and not self.max_position_embeddings:
            raise ValueError("learned_position_embeddings needs max_position_embeddings")
        if self.fused_gate_up and self.mlp is not MlpKind.SWIGLU:
            raise ValueError("fused_gate_up needs a gated (swiglu) MLP")
        if self.latent_attention is not None and (
            self.fused_qkv or self.qk_norm is not QkNorm.NONE or self.attention_sinks
        ):
            raise ValueError(
                "latent_attention has its own projections and norms (no fused_qkv, qk_norm, attention_sinks)"
            )
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

    @property
    def etp(self) -> int:
        """ETP: ``expert_tp``, else t."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def local_experts(self) -> int:
        """The routed experts of one MoE layer that this description's parameters hold: all E."""
        return self.num_experts

    def is_moe_layer(self, index: int) -> bool:
        """Whether block ``index`` routes its tokens to experts (else it has a dense MLP)."""
        return self.is_moe and index not in self.dense_layers

    def beyond_classic_block(self) -> list[str]:
        """What this architecture has beyond the blocks of GPT-2/3, Llama, Mistral and Qwen2 (pre-norm,
        separate q/k/v/o, one dense MLP): the features ``zerocalc validate`` does not build."""
        features = []
        if self.is_moe:
            features.append("mixture-of-experts layers")
        if self.latent_attention is not None:
            features.append("multi-head latent attention")
        if self.block_layout is not BlockLayout.PRE_NORM:
            features.append(f"{self.block_layout.value} block")
        if self.qk_norm is not QkNorm.NONE:
            features.append("q/k norms")
        if self.fused_qkv:
            features.append("fused q/k/v projection")
        if self.fused_gate_up:
            features.append("fused gate/up projection")
        if self.attention_sinks:
            features.append("attention sinks")
        return features


class ParamTensor(BaseModel):
    """One parameter tensor: its module (as in the HF implementation), name and shape."""

    model_config = ConfigDict(frozen=True, defer_build=True)  # built where first made: not at start-up

    module: str
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


class TensorParallelRank(Architecture):
    """An architecture as one of its t tensor-parallel ranks holds it: the same description, and
    :func:`parameter_tensors` gives that rank's local shards (:func:`tensor_parallel_shape`).

    Sources: Megatron-LM ``core/tensor_parallel/layers.py`` (``ColumnParallelLinear`` splits the output
    dimension and its bias, ``RowParallelLinear`` the input dimension with the bias replicated,
    ``VocabParallelEmbedding`` the vocabulary; ``training/tokenizer`` pads the vocabulary to a multiple
    of ``make_vocab_size_divisible_by`` (128) × t); torchtitan ``models/llama3/infra/parallelize.py``
    ``apply_tp`` (``ColwiseParallel`` q/k/v, w1/w3 and the output, ``RowwiseParallel`` wo, w2 and the
    embedding over its vocabulary, norms replicated), whose DTensor shards follow ``torch.chunk``: the
    first ranks hold ceil(n/t). Routers, norms, position tables and the low-rank ``q_a``/``kv_a``
    projections of latent attention are replicated; each routed expert's width is split like a dense
    MLP's over the ETP expert-tensor-parallel ranks (``expert_tp``; Megatron-LM core 0.20.0
    ``expert_tensor_parallel_size``, the TP degree by default, ``training/arguments.py``; at ETP = 1 each
    expert is whole: ``core/transformer/moe/experts.py`` ``TEGroupedMLP`` builds its linears over
    ``pg_collection.expt_tp``).

    With expert parallelism of degree e the rank holds E/e of each layer's routed experts: the experts'
    3-D tensors are cut on dim 0 (torchtitan ``distributed/expert_parallel.py`` ``ExpertParallel``:
    ``distribute_tensor(param, ep_mesh, [Shard(0)])``; Megatron-LM ``num_local_experts = E /
    expert_model_parallel_size``; DeepSpeed-MoE ``num_local_experts = num_experts // ep_size``). The
    router and the shared experts stay whole.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # PipelineStage's too: built
    # where one is first made (a request without --model makes none), not at start-up

    tp: int = Field(ge=1, description="t: tensor-parallel ranks")
    ep: int = Field(default=1, ge=1, description="e: expert-parallel ranks; E/e routed experts on this rank")
    expert_tp: int | None = Field(
        default=None, ge=1, description="ETP: the ranks a routed expert's width is split over (null: t)"
    )
    vocab_multiple: int = Field(
        default=1, ge=1, description="the vocabulary is padded to a multiple of this × t (Megatron: 128)"
    )
    tp_index: int = Field(
        default=0, ge=0, description="which tensor-parallel rank (0: the largest, which the estimates count)"
    )

    @property
    def etp(self) -> int:
        """ETP: ``expert_tp``, else t."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def local_experts(self) -> int:
        """E/e: the routed experts of one MoE layer on this rank."""
        return self.num_experts // self.ep

    @property
    def padded_vocab(self) -> int:
        """V padded as Megatron-LM's ``_vocab_size_with_padding`` does (unpadded for DTensor plans, whose
        ``torch.chunk`` leaves the last ranks fewer rows)."""
        if self.vocab_multiple == 1:
            return self.vocab_size
        multiple = self.vocab_multiple * self.tp
        return -(-self.vocab_size // multiple) * multiple


class PipelineStage(TensorParallelRank):
    """What one pipeline rank holds of an architecture (of one tensor-parallel rank's share at t > 1): its
    layers, numbered 0 … n − 1 here in the order its chunks hold them (``global_layers`` gives each one's
    index in the whole model), the embedding where it holds the first stage, the final norm and the LM
    head where it holds the last. :func:`pipeline_stage` builds it; :func:`parameter_tensors` gives that
    rank's tensors. A tied LM head is a weight of its own on the last stage (Megatron-LM
    ``LanguageModule.setup_embeddings_and_output_layer``: the last stage allocates ``output_layer.weight``,
    kept equal to the first stage's embedding by an all-reduce of their gradients; torch.distributed.
    pipelining's stages are separate modules)."""

    tp: int = Field(default=1, ge=1, description="t: tensor-parallel ranks")
    pp: int = Field(ge=2, description="p: pipeline ranks")
    vpp: int = Field(default=1, ge=1, description="v: model chunks per pipeline rank")
    stage: int = Field(ge=0, description="i: this pipeline rank, 0 … p − 1")
    global_layers: tuple[int, ...] = Field(description="the whole model's index of each layer held")
    holds_embedding: bool = Field(description="the first stage: the embedding (and learned positions)")
    holds_head: bool = Field(description="the last stage: the final norm, the LM head and the loss")
    chunk_sizes: tuple[int, ...] = Field(description="the layers of each of its v model chunks, in order")

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        """The index here of each model chunk's first layer."""
        return tuple(accumulate(self.chunk_sizes[:-1], initial=0))


def stage_kind(stage: PipelineStage) -> tuple[int, tuple[int, ...], bool, bool]:
    """What tells apart the stages of one model's split (:func:`pipeline_stage`'s inputs less the stage's
    place: its index, its layers' global indices, its chunks): its layers, which of them are dense, the
    embedding and the head it holds. Stages of one kind hold the same parameters and run the same
    operations."""
    return stage.num_layers, stage.dense_layers, stage.holds_embedding, stage.holds_head


def pipeline_stage(
    arch: Architecture,
    pp: int,
    vpp: int,
    stage: int,
    layers: tuple[int, ...],
    chunk_sizes: tuple[int, ...] | None = None,
) -> PipelineStage:
    """Pipeline rank ``stage``'s share of ``arch`` (a :class:`TensorParallelRank` keeps its t): the layers
    ``layers`` (global indices, chunk by chunk), ``chunk_sizes`` of them in each of its v chunks (None: a
    v-th each), the embedding on rank 0, the head on rank p − 1. Dense
    layers of a mixture-of-experts model keep their place; a stage whose layers are all dense is a dense
    model of their width."""
    fields = dict(arch)
    dense = tuple(k for k, index in enumerate(layers) if index in arch.dense_layers)
    fields.update(num_layers=len(layers), dense_layers=dense, tied_embeddings=False)
    if arch.is_moe and len(dense) == len(layers):
        fields.update(
            num_experts=0,
            experts_per_token=0,
            num_shared_experts=0,
            shared_expert_intermediate_size=None,
            shared_expert_gate=False,
            dense_layers=(),
            intermediate_size=arch.dense_intermediate_size or arch.intermediate_size,
            dense_intermediate_size=None,
        )
    return PipelineStage(
        **fields,
        pp=pp,
        vpp=vpp,
        stage=stage,
        global_layers=layers,
        holds_embedding=stage == 0,
        holds_head=stage == pp - 1,
        chunk_sizes=chunk_sizes or (len(layers) // vpp,) * vpp,
    )


def global_layer(arch: Architecture, index: int) -> int:
    """The whole model's index of layer ``index`` of ``arch`` (itself but on a pipeline stage)."""
    return arch.global_layers[index] if isinstance(arch, PipelineStage) else index


_COLUMN_PARALLEL = frozenset(
    {"q_proj", "k_proj", "v_proj", "qkv_proj", "q_b_proj", "kv_b_proj", "fc_in", "gate_proj", "up_proj",
     "gate_up_proj"}
)  # fmt: skip
_ROW_PARALLEL = frozenset({"o_proj", "fc_out", "down_proj"})
_VOCAB_PARALLEL = frozenset({"embed_tokens", "lm_head"})


def is_expert_tensor(tensor: ParamTensor) -> bool:
    """Whether ``tensor`` holds routed experts' weights ([E, out, in], the ``experts`` module): the tensors
    expert parallelism splits and whose states are sharded over the expert-data-parallel ranks."""
    return tensor.module.rsplit(".", 1)[-1] == "experts"


def tensor_parallel_dim(tensor: ParamTensor) -> int | None:
    """The dimension tensor parallelism splits (:class:`TensorParallelRank`), None where replicated."""
    if tensor.module in _VOCAB_PARALLEL:
        return 0
    leaf = tensor.module.rsplit(".", 1)[-1]
    if leaf == "experts":  # 3-D [E, out, in] expert weights: fc_in / gate_up split out, fc_out / down in
        if tensor.name.endswith("_bias"):  # 2-D [E, out]: split with a column-parallel output, else whole
            return 1 if tensor.name.removesuffix("_bias") in _COLUMN_PARALLEL else None
        return 1 if tensor.name in _COLUMN_PARALLEL else 2
    if tensor.name == "sinks":  # one per query head: each rank holds its heads' (GptOssAttention.sinks)
        return 0
    if leaf in _COLUMN_PARALLEL:
        return 0
    if leaf in _ROW_PARALLEL and tensor.name == "weight":
        return 1
    return None


def tensor_parallel_shape(tensor: ParamTensor, arch: TensorParallelRank) -> tuple[int, ...]:
    """Rank ``arch.tp_index``'s local shape of ``tensor``: its ``torch.chunk`` of the split dimension
    (ceil(n/t) on the first ranks, fewer or none on the last), the vocabulary padded first."""
    dim = tensor_parallel_dim(tensor)
    ranks, index = arch.tp, arch.tp_index
    if is_expert_tensor(tensor):  # over the expert-tensor-parallel group (its ETP consecutive ranks)
        ranks, index = arch.etp, arch.tp_index % arch.etp
    if dim is None or ranks == 1:
        return tensor.shape
    shape = list(tensor.shape)
    if tensor.module in _VOCAB_PARALLEL:
        shape[0] = arch.padded_vocab
    chunk = -(-shape[dim] // ranks)
    shape[dim] = max(0, min(chunk, shape[dim] - index * chunk))
    return tuple(shape)


def _rank_shape(tensor: ParamTensor, arch: TensorParallelRank) -> tuple[int, ...]:
    """The rank's local shape: its tensor-parallel shard, and E/e experts of an expert tensor."""
    shape = tensor_parallel_shape(tensor, arch)
    if arch.ep > 1 and is_expert_tensor(tensor):
        shape = (arch.local_experts, *shape[1:])
    return shape


def _rank_local(arch: Architecture, tensors: list[ParamTensor]) -> list[ParamTensor]:
    if not isinstance(arch, TensorParallelRank):
        return tensors
    return [ParamTensor(module=t.module, name=t.name, shape=_rank_shape(t, arch)) for t in tensors]


def _linear(module: str, d_in: int, d_out: int, bias: bool) -> list[ParamTensor]:
    tensors = [ParamTensor(module=module, name="weight", shape=(d_out, d_in))]
    if bias:
        tensors.append(ParamTensor(module=module, name="bias", shape=(d_out,)))
    return tensors


def _norm(module: str, arch: Architecture, dim: int | None = None) -> list[ParamTensor]:
    width = dim or arch.hidden_size
    tensors = [ParamTensor(module=module, name="weight", shape=(width,))]
    if arch.norm is NormKind.LAYERNORM:
        tensors.append(ParamTensor(module=module, name="bias", shape=(width,)))
    return tensors


def _mlp(prefix: str, arch: Architecture, width: int) -> list[ParamTensor]:
    d, bias = arch.hidden_size, arch.mlp_bias
    if arch.mlp is MlpKind.GELU:
        return _linear(f"{prefix}.fc_in", d, width, bias) + _linear(f"{prefix}.fc_out", width, d, bias)
    if arch.fused_gate_up:
        up = _linear(f"{prefix}.gate_up_proj", d, 2 * width, bias)
    else:
        up = _linear(f"{prefix}.gate_proj", d, width, bias) + _linear(f"{prefix}.up_proj", d, width, bias)
    return up + _linear(f"{prefix}.down_proj", width, d, bias)


def _experts(module: str, arch: Architecture) -> list[ParamTensor]:
    """Every routed expert of one layer as one module of 3-D parameters (transformers 5.x
    ``MixtralExperts``, ``Qwen3MoeExperts``, ``Qwen2MoeExperts``, ``DeepseekV3Experts``, ``GptOssExperts``:
    the last stores them [E, in, out], the same elements), each followed by its 2-D bias with
    ``expert_bias`` (``GptOssExperts.gate_up_proj_bias``, ``down_proj_bias``)."""
    e, d, f = arch.num_experts, arch.hidden_size, arch.intermediate_size
    up, down, width = (
        ("fc_in", "fc_out", f) if arch.mlp is MlpKind.GELU else ("gate_up_proj", "down_proj", 2 * f)
    )
    tensors = [ParamTensor(module=module, name=up, shape=(e, width, d))]
    if arch.expert_bias:
        tensors.append(ParamTensor(module=module, name=f"{up}_bias", shape=(e, width)))
    tensors.append(ParamTensor(module=module, name=down, shape=(e, d, f)))
    if arch.expert_bias:
        tensors.append(ParamTensor(module=module, name=f"{down}_bias", shape=(e, d)))
    return tensors


def _attention(prefix: str, arch: Architecture) -> list[ParamTensor]:
    d, hd = arch.hidden_size, arch.dim_per_head
    mla = arch.latent_attention
    if mla is not None:
        q_width = arch.num_heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            tensors = _linear(f"{prefix}.q_proj", d, q_width, False)
        else:
            tensors = _linear(f"{prefix}.q_a_proj", d, mla.q_lora_rank, arch.qkv_bias)
            tensors += _norm(f"{prefix}.q_a_norm", arch, mla.q_lora_rank)
            tensors += _linear(f"{prefix}.q_b_proj", mla.q_lora_rank, q_width, False)
        tensors += _linear(f"{prefix}.kv_a_proj", d, mla.kv_lora_rank + mla.qk_rope_head_dim, arch.qkv_bias)
        tensors += _norm(f"{prefix}.kv_a_norm", arch, mla.kv_lora_rank)
        kv_width = arch.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        tensors += _linear(f"{prefix}.kv_b_proj", mla.kv_lora_rank, kv_width, False)
        return tensors + _linear(f"{prefix}.o_proj", arch.num_heads * mla.v_head_dim, d, arch.out_bias)
    q_width, kv_width = arch.num_heads * hd, arch.kv_heads * hd
    if arch.fused_qkv:
        tensors = _linear(f"{prefix}.qkv_proj", d, q_width + 2 * kv_width, arch.qkv_bias)
    else:
        tensors = _linear(f"{prefix}.q_proj", d, q_width, arch.qkv_bias)
        tensors += _linear(f"{prefix}.k_proj", d, kv_width, arch.qkv_bias)
        tensors += _linear(f"{prefix}.v_proj", d, kv_width, arch.qkv_bias)
    if arch.qk_norm is QkNorm.PER_HEAD:
        tensors += _norm(f"{prefix}.q_norm", arch, hd) + _norm(f"{prefix}.k_norm", arch, hd)
    elif arch.qk_norm is QkNorm.FULL:
        tensors += _norm(f"{prefix}.q_norm", arch, q_width) + _norm(f"{prefix}.k_norm", arch, kv_width)
    tensors += _linear(f"{prefix}.o_proj", q_width, d, arch.out_bias)
    if arch.attention_sinks:
        tensors.append(ParamTensor(module=prefix, name="sinks", shape=(arch.num_heads,)))
    return tensors


def _feed_forward(prefix: str, arch: Architecture, moe: bool) -> list[ParamTensor]:
    d = arch.hidden_size
    if not moe:
        return _mlp(f"{prefix}.mlp", arch, arch.dense_intermediate_size or arch.intermediate_size)
    tensors = _linear(f"{prefix}.moe.router", d, arch.num_experts, arch.router_bias)
    tensors += _experts(f"{prefix}.moe.experts", arch)
    if arch.num_shared_experts:
        width = arch.num_shared_experts * (arch.shared_expert_intermediate_size or arch.intermediate_size)
        tensors += _mlp(f"{prefix}.moe.shared_experts", arch, width)
    if arch.shared_expert_gate:
        tensors += _linear(f"{prefix}.moe.shared_expert_gate", d, 1, False)
    return tensors


def layer_tensors(arch: Architecture, index: int = 0) -> list[ParamTensor]:
    """The parameter tensors of transformer block ``index``, every module named ``layers.<index>.…``: the
    first block of its kind's (MoE or dense, :func:`_block_tensors`, once per architecture object) under
    its own prefix, the only place the index is read besides the kind."""
    kind = arch.is_moe_layer(index)
    block = _BLOCKS.get(arch, kind)
    if block is None:
        block = _BLOCKS.put(arch, kind, (index, tuple(_block_tensors(arch, index))))
    first, tensors = block
    if first == index:
        return list(tensors)
    cut, own = len(f"layers.{first}"), f"layers.{index}"
    return [_renamed(t, own + t.module[cut:]) for t in tensors]


_BLOCKS: IdentityCache[tuple[int, tuple[ParamTensor, ...]]] = IdentityCache(limit=1024)
"""Per architecture object and kind of block (MoE or not), the first block met's index and tensors (the
architecture's tensors never change: it is frozen)."""


def _block_tensors(arch: Architecture, index: int) -> list[ParamTensor]:
    """The parameter tensors of block ``index``, built."""
    p = f"layers.{index}"
    before_attn, after_attn, before_mlp, after_mlp = _BLOCK_NORMS[arch.block_layout]
    tensors: list[ParamTensor] = []
    for name in before_attn:
        tensors += _norm(f"{p}.{name}", arch)
    tensors += _attention(f"{p}.attn", arch)
    for name in after_attn + before_mlp:
        tensors += _norm(f"{p}.{name}", arch)
    tensors += _feed_forward(p, arch, arch.is_moe_layer(index))
    for name in after_mlp:
        tensors += _norm(f"{p}.{name}", arch)
    return _rank_local(arch, tensors)


def embedding_tensors(arch: Architecture) -> list[ParamTensor]:
    """The embedding's tensors (none on a pipeline stage without it), once per architecture object."""
    return _outside_tensors(arch, "embedding", _embedding_tensors)


def head_tensors(arch: Architecture) -> list[ParamTensor]:
    """Final norm and, unless tied to the embedding, the LM head; once per architecture object."""
    return _outside_tensors(arch, "head", _head_tensors)


_OUTSIDE: IdentityCache[tuple[ParamTensor, ...]] = IdentityCache(limit=1024)
"""The embedding's and the head's tensors per architecture object (a step's timeline asks for them per
run)."""


def _outside_tensors(
    arch: Architecture, part: str, build: Callable[[Architecture], list[ParamTensor]]
) -> list[ParamTensor]:
    tensors = _OUTSIDE.get(arch, part)
    if tensors is None:
        tensors = _OUTSIDE.put(arch, part, tuple(build(arch)))
    return list(tensors)


def _embedding_tensors(arch: Architecture) -> list[ParamTensor]:
    if isinstance(arch, PipelineStage) and not arch.holds_embedding:
        return []
    tensors = [ParamTensor(module="embed_tokens", name="weight", shape=(arch.vocab_size, arch.hidden_size))]
    if arch.learned_position_embeddings:
        tensors.append(
            ParamTensor(
                module="embed_positions",
                name="weight",
                shape=(arch.max_position_embeddings, arch.hidden_size),
            )
        )
    return _rank_local(arch, tensors)


def _head_tensors(arch: Architecture) -> list[ParamTensor]:
    if isinstance(arch, PipelineStage) and not arch.holds_head:
        return []
    tensors = _norm("final_norm", arch)
    if not arch.tied_embeddings:
        tensors.append(
            ParamTensor(module="lm_head", name="weight", shape=(arch.vocab_size, arch.hidden_size))
        )
    return _rank_local(arch, tensors)


def parameter_tensors(arch: Architecture) -> list[ParamTensor]:
    """Every parameter tensor of the model, in module order (shared tensors once)."""
    return list(_parameter_tensors(arch))


@lru_cache(maxsize=64)
def _parameter_tensors(arch: Architecture) -> tuple[ParamTensor, ...]:
    """:func:`parameter_tensors`, built once per architecture (a plan's search asks for them per world and
    per layer count)."""
    tensors = embedding_tensors(arch)
    for i in range(arch.num_layers):
        tensors += layer_tensors(arch, i)
    return tuple(tensors + head_tensors(arch))


def _renamed(tensor: ParamTensor, module: str) -> ParamTensor:
    """``tensor`` in another module, unvalidated (its fields are a validated tensor's: a model's blocks
    repeat one block's tensors under their own prefixes, tens of thousands for a plan's ranks)."""
    copied = ParamTensor.__new__(ParamTensor)
    object.__setattr__(copied, "__dict__", {"module": module, "name": tensor.name, "shape": tensor.shape})
    object.__setattr__(copied, "__pydantic_fields_set__", tensor.__pydantic_fields_set__)
    object.__setattr__(copied, "__pydantic_extra__", None)
    object.__setattr__(copied, "__pydantic_private__", None)
    return copied


@lru_cache(maxsize=256)
def expert_parameters(arch: Architecture) -> int:
    """The routed experts' parameter elements this description holds (:func:`is_expert_tensor`): every
    MoE layer's E experts, or a rank's E/e (0 for a dense model); counted once per architecture."""
    if not arch.is_moe:
        return 0
    moe = [index for index in range(arch.num_layers) if arch.is_moe_layer(index)]
    if not moe:
        return 0
    # only blocks hold experts, and every MoE block the same tensors (:func:`layer_tensors`)
    return len(moe) * sum(t.numel for t in layer_tensors(arch, moe[0]) if is_expert_tensor(t))


class ParameterCount(BaseModel):
    total: int = Field(description="all parameters (memory uses this)")
    active_per_token: int = Field(
        description="parameters a token passes through: MoE layers count k of E routed experts (the router, "
        "the shared experts and everything else in full); of one expert-parallel rank's E/e experts, at "
        "most k"
    )
    embedding: int
    per_layer: int = Field(description="one transformer block (the largest, where blocks differ)")
    layers: int = Field(description="all transformer blocks")
    head: int = Field(description="final norm + untied LM head")
    largest_layer_params: int = Field(
        description="most parameters held directly by one module (DeepSpeed's model_to_params, "
        "recurse=False), in transformers 5.17's module layout: an MoE layer's experts are one module holding "
        "every expert's weights as 3-D parameters (4.x held each expert's projections as modules of its own)"
    )
    largest_layer_name: str
    largest_block_params: int = Field(description="one transformer block: the default FSDP/ZeRO-3 unit")


def _numel(tensors: list[ParamTensor]) -> int:
    return sum(t.numel for t in tensors)


def count_parameters(arch: Architecture) -> ParameterCount:
    """Exact parameter count of ``arch`` and its largest module and block."""
    embedding, head = embedding_tensors(arch), head_tensors(arch)
    first: dict[bool, int] = {}  # one block of each kind (dense / MoE) stands for the others
    layers_of: dict[bool, int] = {}
    for i in range(arch.num_layers):
        kind = arch.is_moe_layer(i)
        first.setdefault(kind, i)
        layers_of[kind] = layers_of.get(kind, 0) + 1
    blocks = {kind: layer_tensors(arch, i) for kind, i in sorted(first.items(), key=lambda item: item[1])}
    sizes = {kind: _numel(block) for kind, block in blocks.items()}
    layers = sum(sizes[kind] * layers_of[kind] for kind in blocks)
    inactive = 0
    if arch.is_moe:
        local = arch.local_experts
        expert = _numel(_rank_local(arch, _experts("moe.experts", arch))) // local
        inactive = (local - min(arch.experts_per_token, local)) * expert * layers_of[True]
    modules: dict[str, int] = {}
    for t in embedding + [t for block in blocks.values() for t in block] + head:
        modules[t.module] = modules.get(t.module, 0) + t.numel
    largest_name = max(modules, key=lambda m: modules[m])
    total = _numel(embedding) + layers + _numel(head)
    return ParameterCount(
        total=total,
        active_per_token=total - inactive,
        embedding=_numel(embedding),
        per_layer=max(sizes.values()),
        layers=layers,
        head=_numel(head),
        largest_layer_params=modules[largest_name],
        largest_layer_name=re.sub(r"^layers\.\d+\.", "layers.*.", largest_name),
        largest_block_params=max(sizes.values()),
    )
