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

from enum import StrEnum
from typing import NamedTuple

from zerocalc.model.activations import ActivationShape, CpImpl, exact_split, layer_terms, routed_rows
from zerocalc.model.architecture import Architecture, BlockLayout, MlpKind, NormKind, QkNorm, layer_tensors

FP32 = 4
INT64 = 8


class ModelImplName(StrEnum):
    HF = "hf"
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"


class Device(StrEnum):
    """Where the step runs: a few kernels keep other dtypes on the CPU (LayerNorm statistics, dropout)."""

    CUDA = "cuda"
    CPU = "cpu"


class ModelImpl(NamedTuple):
    """The code a model is trained with, and what of it the activation accounting follows."""

    name: ModelImplName
    title: str
    library: str
    source: str
    norm_fp32_copy: bool
    """Norms upcast their input with ``x.to(float32)`` and keep the copy (HF RMSNorm)."""
    kv_cache_copies: bool
    """Training forwards still build a ``DynamicCache`` (``use_cache`` defaults to True): attention keeps
    the cache's ``torch.cat`` copies of k and v (HF)."""
    embedding_output_alive: bool
    """The embedding output lives through the whole base-model forward in a local variable (HF)."""
    loss: str
    """How the loss is computed, for the loss terms."""
    transients: bool
    """In-layer transient peaks are counted (measured for HF, derived for torchtitan; Korthikanti counts
    none)."""


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


class Shape(NamedTuple):
    """One micro-batch: b sequences of s tokens, and how one rank's share of it is split."""

    b: int
    s: int
    tp: int = 1
    """t, the tensor-parallel degree."""
    sequence_parallel: bool = False
    """The norm, dropout and residual regions split along the sequence over the t ranks (Korthikanti
    et al. 2022 §4.2.2; torchtitan's ``SequenceParallel`` norms)."""
    cp: int = 1
    """c, the context-parallel degree: each rank holds s/c tokens of every sequence."""
    cp_impl: CpImpl = CpImpl.RING
    ep: int = 1
    """e, the expert-parallel degree: the rank computes the tokens routed to its E/e experts."""
    capacity_factor: float = 1.0
    """Under expert parallelism, the tokens the rank's experts receive over the balanced k·b·s/c
    (:func:`~zerocalc.model.activations.routed_rows`)."""

    @property
    def tokens(self) -> int:
        """The micro-batch's tokens, b·s."""
        return self.b * self.s

    @property
    def local_tokens(self) -> int:
        """This rank's tokens, b·s/c: the rows of the tensor-parallel region, the logits and the loss."""
        return exact_split(self.tokens, self.cp, "b·s")

    @property
    def sequence_tokens(self) -> int:
        """Rows of the hidden states, norms and residual dropouts on this rank: b·s/c, /t under sequence
        parallelism."""
        if self.sequence_parallel and self.tp > 1:
            return exact_split(self.local_tokens, self.tp, "b·s/c")
        return self.local_tokens

    def split(self, columns: int, what: str) -> int:
        """A column-parallel width on one rank: ``columns`` / t exactly, else ``ValueError``."""
        return exact_split(columns, self.tp, what)

    def expert_rows(self, pairs: int) -> int:
        """The token-expert pairs the rank's experts compute when each rank routes ``pairs``: those pairs
        without expert parallelism; with it, the pairs the EP group routes to the rank's experts
        (:func:`~zerocalc.model.activations.routed_rows`)."""
        return pairs if self.ep == 1 else routed_rows(pairs, self.capacity_factor)


class LayerSaves(NamedTuple):
    """What one decoder layer's forward keeps for backward, and its transient peaks."""

    saved: tuple[tuple[str, int], ...]
    """(name, bytes) per storage kept until the layer's backward."""
    keeps_input: bool
    """An op saves the layer's input hidden state itself (GPT-2's ln_1, fp32 training), so it stays."""
    forward_excess: int
    """Above what is alive plus ``saved``, at the layer's forward peak (its freshly computed outputs)."""
    backward_excess: int
    """Above what is alive at the start of the layer's backward, at its backward peak."""
    program: tuple[tuple[str, str, int], ...] = ()
    """The layer's forward in the code's order, where it is written out (:func:`forward_program`):
    ``("keep", name, bytes)`` allocates a saved tensor of :attr:`saved`, ``("temp", name, bytes)`` an
    intermediate, ``("drop", name, 0)`` frees one, ``("release", name, 0)`` is where the code drops its
    last reference to a saved tensor (freed there when nothing saves it: the forward of a checkpointed
    layer), ``("output", "", 0)`` is where the layer's output is allocated; empty: the saved tensors at
    once, then ``forward_excess``."""


# ---------------------------------------------------------------------------------------- family traits
class Traits(NamedTuple):
    """How a family's transformers code computes what the architecture describes."""

    norm: str
    """``llama`` (x.float(), rsqrt, .to(dtype), weight *), ``gemma`` / ``olmo`` (the product with the
    weight in fp32: the normalised fp32 tensor is kept), ``layernorm`` (input, mean, rstd)."""
    gelu: str
    """``tanh_decomposed`` (GPT-2 ``NewGELUActivation``: four tensors), ``exact`` (``nn.GELU``)."""
    qkv_views_kept: bool
    """A fused q/k/v output whose q is saved as a view, so the whole storage stays (GPT-2 ``c_attn``)."""
    router: str
    """``softmax_topk_norm`` (Mixtral: fp32 routing weights), ``softmax_topk_norm_cast`` (Qwen3-MoE with
    ``norm_topk_prob`` true, as published: the normalised weights cast back to the compute dtype),
    ``softmax_topk`` (Qwen2-MoE), ``sigmoid_group`` (DeepSeek-V3)."""
    rotary: bool
    rotary_fraction: float = 1.0
    """The share of the head dimension the rotary embedding turns (GPT-NeoX ``rotary_pct``, default 0.25
    in ``GPTNeoXConfig``; Pythia's configs keep it): cos and sin are [1, s, fraction·d]."""
    rotary_fp32: bool = False
    """cos and sin stay fp32 (``Olmo2RotaryEmbedding`` returns them uncast; ``apply_rotary_pos_emb`` casts
    its fp32 products back)."""
    rotary_cat: bool = False
    """The rotary output is a ``torch.cat`` (Phi-3's and GPT-NeoX's partial rotary; DeepSeek-V3's
    nope/pe): a contiguous [b, a, s, d] q, so SDPA's output (``empty_like`` in q's layout) is [b, a, s, d]
    too and ``transpose(1, 2).reshape(...).contiguous()`` copies it for the o projection."""
    eager_softmax_fp32: bool = True
    """Eager attention's softmax runs in fp32 and is cast back (``softmax(..., dtype=float32).to(dtype)``);
    GPT-2's runs in the compute dtype (``modeling_gpt2.eager_attention_forward``)."""
    embedding_scale: bool = False
    """The embedding output is multiplied by a 0-dim ``normalizer`` tensor (√h) in the compute dtype,
    which ``mul`` saves (Gemma 2 / Gemma 3)."""
    logit_softcap: bool = False
    """``final_logit_softcapping`` (Gemma 2: 30.0 in ``Gemma2Config`` and its published configs):
    ``tanh(logits / cap) · cap``, and ``tanh`` saves its output [T, V] in the compute dtype."""
    sliding_pattern: int = 0
    """Layer i has sliding-window attention when (i + 1) % pattern ≠ 0 (the configs' default
    ``layer_types``: ``Gemma2Config`` 2, ``Gemma3TextConfig``'s ``sliding_window_pattern`` 6); 0: none.
    Its ``DynamicCache`` layer (``cache_utils.DynamicSlidingWindowLayer``) moves a 0-dim int64
    ``_sliding_window_tensor`` to the device at its first update, alive until the forward's output is
    dropped."""
    rotary_tables: int = 1
    """Rotary tables: Gemma 3 keeps one per attention type (``Gemma3RotaryEmbedding``: ``inv_freq`` and
    ``original_inv_freq`` per layer type; ``Gemma3TextModel.forward``: cos and sin per type), local and
    global once the model has both (from ``sliding_pattern`` layers)."""
    embedding_scale_buffer: bool = False
    """The √h scale is a fp32 0-dim buffer of the embedding (``Gemma2ScaledWordEmbedding.embed_scale``,
    ``Gemma3TextScaledWordEmbedding.embed_scale``), resident like the rotary tables."""


SLIDING_PATTERNS = {"gemma2": 2, "gemma3_text": 6}
"""Layer i is full attention when (i + 1) % pattern == 0, the others sliding-window: the default
``layer_types`` of ``Gemma2Config`` and ``Gemma3TextConfig`` (``sliding_window_pattern``)."""


def traits(arch: Architecture) -> Traits:
    """The family's traits: from ``arch.family`` (the transformers model_type), else from the block."""
    family = arch.family or (
        "gpt2" if arch.norm is NormKind.LAYERNORM and arch.mlp is MlpKind.GELU else "llama"
    )
    norm = {"gemma2": "gemma", "gemma3_text": "gemma", "olmo2": "olmo"}.get(family, "llama")
    if arch.norm is NormKind.LAYERNORM:
        norm = "layernorm"
    return Traits(
        norm=norm,
        gelu="tanh_decomposed" if family == "gpt2" else "exact",
        qkv_views_kept=family == "gpt2",
        router={
            "qwen2_moe": "softmax_topk",
            "qwen3_moe": "softmax_topk_norm_cast",
            "deepseek_v3": "sigmoid_group",
        }.get(family, "softmax_topk_norm"),
        rotary=not arch.learned_position_embeddings,
        rotary_fraction=0.25 if family == "gpt_neox" else 1.0,
        rotary_fp32=family == "olmo2",
        rotary_cat=family in ("phi3", "gpt_neox", "deepseek_v3"),
        eager_softmax_fp32=family != "gpt2",
        embedding_scale=family in ("gemma2", "gemma3_text"),
        logit_softcap=family == "gemma2",
        sliding_pattern=SLIDING_PATTERNS.get(family, 0),
        rotary_tables=2 if family == "gemma3_text" and arch.num_layers >= SLIDING_PATTERNS[family] else 1,
        embedding_scale_buffer=family in ("gemma2", "gemma3_text"),
    )


# ---------------------------------------------------------------------------------------------- norms
def norm_saves(
    kind: str, rows: int, width: int, act: int, device: Device, fp32_copy: bool, input_kept: bool = False
) -> list[tuple[str, int]]:
    """Storages a norm over ``rows`` × ``width`` keeps, named (its output, the next op's input, is not
    included). ``input_kept``: the norm reads the layer's input, which the layer keeps anyway
    (:attr:`LayerSaves.keeps_input`), so a storage that *is* that input is not counted again.

    * ``llama`` (``LlamaRMSNorm.forward``): ``x.to(float32)`` (saved by ``pow`` and ``mul``; in fp32 it is
      ``x`` itself), ``rsqrt(var + eps)`` [rows, 1] fp32, ``normalized.to(dtype)`` (saved by ``weight *``);
    * ``gemma`` (``Gemma2RMSNorm`` / ``Gemma3RMSNorm``: ``output * (1.0 + self.weight.float())``): the
      normalised tensor in fp32, and ``1 + weight`` [width] in fp32 (saved by that product);
    * ``olmo`` (``Olmo2RMSNorm``: ``(self.weight * x).to(dtype)``): the normalised tensor in fp32;
    * ``layernorm`` (``native_layer_norm``): its input, and mean and rstd [rows, 1] in fp32 on CUDA (the
      accumulate type) but in the input dtype on the CPU (``aten/src/ATen/native/cpu/layer_norm_kernel.cpp``);
    * fused kernels (megatron, torchtitan ``nn.RMSNorm`` on CUDA: ``_fused_rms_norm``): the input and
      rstd only.
    """
    elements = rows * width
    if kind == "layernorm":
        stats = FP32 if device is Device.CUDA else act
        kept = [("mean", stats * rows), ("rstd", stats * rows)]
        return kept if input_kept else [("input", act * elements), *kept]
    if not fp32_copy:
        return [("input", act * elements), ("rstd (fp32)", FP32 * rows)]
    copy = 0 if act == FP32 and input_kept else FP32 * elements
    normalized = FP32 * elements if kind in ("gemma", "olmo") else act * elements
    parts = [
        ("input in fp32" if act == FP32 else "x.float() copy", copy),
        ("rsqrt (fp32)", FP32 * rows),
        ("normalized (fp32)" if normalized != act * elements or act == FP32 else "normalized", normalized),
    ]
    if kind == "gemma":
        parts.append(("1 + weight (fp32)", FP32 * width))
    return [(name, b) for name, b in parts if b]


# ---------------------------------------------------------------------------------- attention kernel
class AttentionKernel(StrEnum):
    """What attention keeps for backward."""

    FLASH = "flash"
    """SDPA's flash (or memory-efficient) kernel: q, k, v, the output and an fp32 log-sum-exp per row; no
    [b, a, s, s] tensor (dropout is drawn inside the kernel)."""
    EAGER = "eager"
    """Softmax probabilities [b, a, s, s] (and their dropout) kept for backward."""


SDPA_NO_MASK = "SDPA, no mask"
"""``integrations/sdpa_attention.py``: ``is_causal`` with ``attn_mask`` None where ``masking_utils.
_ignore_causal_mask_sdpa`` drops the causal mask (no padding, no sliding window shorter than s): SDPA's
flash kernel on CUDA in bf16/fp16."""
HF_ATTENTION: dict[str, str] = {
    "llama": "models/llama/modeling_llama.py",
    "mistral": "models/mistral/modeling_mistral.py",
    "mixtral": "models/mixtral/modeling_mixtral.py",
    "qwen2": "models/qwen2/modeling_qwen2.py",
    "gpt2": "models/gpt2/modeling_gpt2.py",
    "gemma2": "models/gemma2/modeling_gemma2.py",
    "gemma3_text": "models/gemma3/modeling_gemma3.py",
    "phi3": "models/phi3/modeling_phi3.py",
    "qwen3": "models/qwen3/modeling_qwen3.py",
    "qwen3_moe": "models/qwen3_moe/modeling_qwen3_moe.py",
    "qwen2_moe": "models/qwen2_moe/modeling_qwen2_moe.py",
    "deepseek_v3": "models/deepseek_v3/modeling_deepseek_v3.py",
    "olmo2": "models/olmo2/modeling_olmo2.py",
    "falcon": "models/falcon/modeling_falcon.py",
    "gpt_neox": "models/gpt_neox/modeling_gpt_neox.py",
}
"""The transformers 5.17 modeling file of each family: every one runs attention through SDPA by default
(``_supports_sdpa``; ``ALL_ATTENTION_FUNCTIONS["sdpa"]``, Falcon's ``FalconAttention`` calls
``scaled_dot_product_attention`` itself) with ``create_causal_mask``'s result, None for a causal training
batch without padding: SDPA gets ``is_causal`` and no mask (:data:`SDPA_NO_MASK`)."""


def default_attention(impl: ModelImpl, arch: Architecture) -> tuple[AttentionKernel, str]:
    """The attention kernel the model's code runs when ``--flash-attention`` is not given, and its source.

    * ``hf``: SDPA with no mask for every family of :data:`HF_ATTENTION` (flash); an architecture with no
      transformers family (a GPT-3 preset) has no such code: eager, the softmax kept;
    * ``torchtitan``: ``models/llama3/model.py`` calls ``F.scaled_dot_product_attention(..., is_causal=
      True)``: flash;
    * ``megatron``: Korthikanti et al. 2022's accounting (Table 2) keeps the softmax and its dropout for GPT
      (LayerNorm + GELU); the gated RMSNorm families run Megatron-LM's fused attention: flash.
    """
    if impl.name is ModelImplName.HF:
        source = HF_ATTENTION.get(arch.family or "")
        if source is None:
            return AttentionKernel.EAGER, "no transformers code for this architecture"
        return AttentionKernel.FLASH, f"transformers 5.17 {source}: {SDPA_NO_MASK}"
    if impl.name is ModelImplName.TORCHTITAN:
        return AttentionKernel.FLASH, f"torchtitan models/llama3/model.py: {SDPA_NO_MASK}"
    if arch.mlp is MlpKind.SWIGLU and arch.norm is NormKind.RMSNORM:
        return AttentionKernel.FLASH, "Megatron-LM fused attention (gated RMSNorm families)"
    return AttentionKernel.EAGER, "Korthikanti et al. 2022, Table 2: softmax and dropout kept"


# -------------------------------------------------------------------------------------------- the layer
def layer_saves(
    impl: ModelImpl,
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    device: Device = Device.CUDA,
    use_cache: bool = True,
    flash: bool = True,
    selective: bool = False,
) -> LayerSaves:
    """What decoder layer ``index`` keeps for backward under ``impl`` (see the module docstring).

    ``use_cache`` is False under activation checkpointing (HF forces it off); ``flash`` selects SDPA's
    flash kernel (q, k, v, out and an fp32 log-sum-exp per row) over eager attention (fp32 softmax
    probabilities [b, a, s, s] and their cast). ``selective``: Korthikanti et al. §4.2's selective
    recomputation, the attention core's s²-sized tensors (:data:`QUADRATIC_TERMS`) are not kept but
    recomputed in the layer's backward, where they exist for a moment.

    Per rank under ``shape``'s tensor, sequence and context parallelism (module docstring); the buffers
    tensor and context parallelism add inside the layer are in ``forward_excess`` and ``backward_excess``
    (:func:`parallel_transients`). A combination :func:`parallel_unsupported` refuses raises ``ValueError``.
    """
    reason = parallel_unsupported(impl, arch, shape, flash)
    if reason is not None:
        raise ValueError(reason)
    saves = _layer_saves(impl, arch, index, shape, act, device, use_cache, flash)
    moments = parallel_transients(impl, arch, index, shape, act)
    forward = max((m.nbytes for m in moments if m.phase == "forward"), default=0)
    backward = max((m.nbytes for m in moments if m.phase == "backward"), default=0)
    if forward or backward:
        saves = saves._replace(
            forward_excess=max(saves.forward_excess, forward),
            backward_excess=max(saves.backward_excess, backward),
        )
    if not selective:
        return saves
    dropped = sum(b for name, b in saves.saved if name in QUADRATIC_TERMS)
    return saves._replace(
        saved=tuple((name, b) for name, b in saves.saved if name not in QUADRATIC_TERMS),
        backward_excess=saves.backward_excess + dropped,
    )


QUADRATIC_TERMS = frozenset(
    {
        "softmax probabilities (fp32)",
        "probabilities cast",
        "attention dropout mask",
        "attention dropout output",
        "softmax_output",
        "attn_dropout_mask",
        "attn_dropout_output",
    }
)
"""The attention core's [b, a, s, s] tensors (eager attention; Korthikanti's softmax and dropout terms),
which selective recomputation does not keep."""


OP_SAC_MATMUL_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The order torchtitan's Llama block calls its linears (``models/llama3/model/model.py``:
``Attention.forward`` ``self.wq(x), self.wk(x), self.wv(x)`` … ``self.wo(output)``; ``FeedForward.forward``
``self.w2(F.silu(self.w1(x)) * self.w3(x))``), under zerocalc's names of its weights (wq … wo, w1 gate,
w3 up, w2 down). Each is one ``aten.mm`` (``nn.Linear`` without bias on a [b, s, in] input folds to a 2-D
``mm``)."""


def op_sac_recomputes(name: str) -> bool:
    """Whether torchtitan's op-level selective checkpointing recomputes linear ``name``
    (:data:`OP_SAC_MATMUL_ORDER`) in backward rather than keeping its output: its policy counts the
    block's ``aten.mm`` calls and saves all but every second one (``meta["forward_mm_count"] % 2 == 0``:
    the 2nd, 4th and 6th, wk, wo and w3). False for a name the order does not hold."""
    return name in OP_SAC_MATMUL_ORDER and (OP_SAC_MATMUL_ORDER.index(name) + 1) % 2 == 0


def op_sac_unsupported(
    arch: Architecture, shape: Shape, flash: bool, impl: ModelImpl | None = None
) -> str | None:
    """Why ``--recompute op`` is not modelled, one sentence; None when it is. The policy counts a block's
    matmuls in the order its code calls them, so it is modelled for the dense Llama block
    (:data:`OP_SAC_MATMUL_ORDER`: torchtitan's and transformers' ``LlamaAttention`` / ``LlamaMLP`` call
    their linears in that order) with SDPA's flash kernel and without context parallelism (torch's ring
    attention calls the kernel once per K/V chunk); its memory (``impl`` given) for torchtitan's code, the
    code the policy was written for."""
    if impl is not None and impl.name is not ModelImplName.TORCHTITAN:
        return "its memory is modelled for torchtitan's Llama code"
    if (
        arch.is_moe
        or arch.latent_attention is not None
        or arch.fused_qkv
        or arch.fused_gate_up
        or arch.qk_norm is not QkNorm.NONE
        or arch.mlp is not MlpKind.SWIGLU
        or arch.block_layout is not BlockLayout.PRE_NORM
        or {
            t.module.rsplit(".", 1)[-1]
            for t in layer_tensors(arch, 0)
            if t.name == "weight" and len(t.shape) == 2
        }
        != set(OP_SAC_MATMUL_ORDER)
    ):
        return "it is modelled for the dense Llama block (q, k, v, o, gate, up and down linears)"
    if not flash:
        return "it is modelled with SDPA's flash kernel, whose outputs the policy saves"
    if shape.cp > 1:
        return "it is not modelled under context parallelism (the flash kernel runs once per K/V chunk)"
    return None


class OpSacLayer(NamedTuple):
    """One decoder layer under torchtitan's op-level selective checkpointing (:func:`op_sac_layer`)."""

    kept: tuple[tuple[str, int], ...]
    """The outputs the policy saves (``MUST_SAVE``), held by torch's SAC storage from the layer's forward
    to its recompute in backward; the layer's input (the checkpoint's input) is kept besides them."""
    recomputed: tuple[tuple[str, int], ...]
    """The tensors the layer's backward saves that the recompute allocates again (the rest alias kept
    outputs or the layer's input)."""
    consumed: tuple[str, ...]
    """Kept outputs backward does not save: freed once the recompute has read them."""
    forward_excess: int
    """Above the kept outputs and ``recomputed`` at the forward's and the recompute's peak."""
    backward_excess: int


def op_sac_layer(impl: ModelImpl, arch: Architecture, index: int, shape: Shape, act: int) -> OpSacLayer:
    """What decoder layer ``index`` keeps under torchtitan's op-level selective activation checkpointing
    (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``), per rank.

    Source: torchtitan v0.2.2 ``distributed/activation_checkpoint.py::_apply_op_sac`` and
    ``models/llama3/infra/parallelize.py::_op_sac_save_list`` (the policy of the 2024 releases behind
    ``docs/performance.md``, ``parallelisms/parallelize_llama.py::_save_list``, and of the 2026
    ``SelectiveAC`` alike): each block is wrapped in ``checkpoint_wrapper`` with
    ``create_selective_checkpoint_contexts``, whose policy returns ``MUST_SAVE`` for ``aten.mm`` except
    every second one (:func:`op_sac_recomputes`), the SDPA flash / efficient / cuDNN kernels,
    ``_c10d_functional.reduce_scatter_tensor`` and ``aten.max``, else ``PREFER_RECOMPUTE``. torch 2.13
    ``utils/checkpoint.py``: ``_CachingTorchDispatchMode`` keeps each ``MUST_SAVE`` op's outputs (detached,
    the same storage) until ``_CachedTorchDispatchMode`` hands them to the recompute; every other tensor
    autograd would save is dropped and recomputed from the block's input.

    Kept per rank (L = b·s tokens, t the TP degree, R the sequence-parallel rows): the outputs of wq
    (L·a/t·d), wv (L·kv/t·d), w1 (L·f/t) and w2 (L·h, the row-parallel partial sum under TP); the flash
    kernel's output (L·a/t·d) and fp32 log-sum-exp (L·a/t); under sequence parallelism the R·h outputs of
    the reduce-scatters after wo and w2. Of these, the output, log-sum-exp, wv's (SDPA's v) and w1's (the
    SiLU's input) are tensors backward saves too; wq's (the rotary embedding copies it), w2's and the
    reduce-scatters' are not. The recompute re-runs the norms, wk, the rotary embedding, the output's
    copy, wo, w3, the SiLU and product, the residual adds and the all-gathers of the sequence-parallel
    inputs. Derived from the source; the kept bytes and the recomputed matmuls are measured on CPU for
    one rank (:mod:`zerocalc.validate.op_sac`)."""
    reason = op_sac_unsupported(arch, shape, True, impl)
    if reason is not None:
        raise ValueError(reason)
    saves = layer_saves(impl, arch, index, shape, act)
    L, R, h, d = shape.local_tokens, shape.sequence_tokens, arch.hidden_size, arch.dim_per_head
    a = shape.split(arch.num_heads, "attention heads")
    kv = shape.split(arch.kv_heads, "key/value heads")
    f = shape.split(arch.intermediate_size, "the MLP width")
    widths = {"q_proj": a * d, "k_proj": kv * d, "v_proj": kv * d, "o_proj": h, "gate_proj": f,
              "up_proj": f, "down_proj": h}  # fmt: skip
    kept = [
        (f"{name} output", act * L * widths[name])
        for name in OP_SAC_MATMUL_ORDER
        if not op_sac_recomputes(name)
    ]
    kept += [
        ("flash attention output", act * L * a * d),
        ("flash attention log-sum-exp (fp32)", FP32 * L * a),
    ]
    scattered: list[tuple[str, int]] = []
    if shape.tp > 1 and R < L:
        scattered = [
            ("o_proj reduce-scatter output", act * R * h),
            ("down_proj reduce-scatter output", act * R * h),
        ]
    kept += scattered
    aliases = {
        "v": "v_proj output",
        "gate output": "gate_proj output",
        "attention output (o projection input)": "flash attention output",
        "softmax log-sum-exp": "flash attention log-sum-exp (fp32)",
        "attention norm: input": "the layer's input",
    }
    recomputed = tuple(
        (name, b) for name, b in saves.saved if name.split(":")[0] not in aliases and name not in aliases
    )
    consumed = ("q_proj output", "down_proj output", *(name for name, _ in scattered))
    # the forward's moment around w2 holds its output and, under sequence parallelism, the reduce-scatter's
    # result besides the mid residual and the new hidden state: those two are kept outputs here
    in_moment = act * L * h + (act * R * h if scattered else 0)
    return OpSacLayer(
        kept=tuple(kept),
        recomputed=recomputed,
        consumed=consumed,
        forward_excess=max(0, saves.forward_excess - in_moment),
        backward_excess=saves.backward_excess,
    )


def _layer_saves(
    impl: ModelImpl,
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    device: Device,
    use_cache: bool,
    flash: bool,
) -> LayerSaves:
    if impl.name is ModelImplName.MEGATRON:
        return _korthikanti_layer(arch, index, shape, act, flash)
    t = traits(arch)
    # L: the rank's tokens (the tensor-parallel region); R: the rows of the norms and residual dropouts
    L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    copies = impl.kv_cache_copies and use_cache
    saved: list[tuple[str, int]] = []

    def add(name: str, nbytes: int | list[int] | list[tuple[str, int]]) -> None:
        if not isinstance(nbytes, list):
            nbytes = [(name, nbytes)]
        for i, part in enumerate(nbytes):
            part_name, b = part if isinstance(part, tuple) else (f"{name}#{i}", part)
            if b:
                saved.append((f"{name}: {part_name}" if isinstance(part, tuple) else part_name, b))

    def norm(name: str, width: int = h, rows: int = R, input_kept: bool = False) -> None:
        add(name, norm_saves(t.norm, rows, width, act, device, impl.norm_fp32_copy, input_kept))

    layout = arch.block_layout
    layernorm = t.norm == "layernorm"

    def norm_on_input(name: str) -> None:
        """A norm reading the layer input, which the layer keeps (``keeps_input``) where an op saves it
        itself: a LayerNorm, and an HF RMSNorm in fp32 (``x.to(float32)`` is ``x``)."""
        norm(name, input_kept=True)

    # ---- attention -----------------------------------------------------------------------------------
    if layout is not BlockLayout.POST_NORM:
        norm_on_input("attention norm")
        add("attention input (norm output)", act * L * h)  # replicated, or all-gathered under SP
    _attention(add, norm, arch, t, impl, L, shape, act, device, copies, flash)
    if layout in (BlockLayout.SANDWICH_NORM, BlockLayout.POST_NORM):
        norm("post-attention norm")
    if arch.residual_dropout > 0:
        add("attention residual dropout mask", (1 if device is Device.CUDA else act) * R * h)

    # ---- MLP ---------------------------------------------------------------------------------------
    if layout in (BlockLayout.PRE_NORM, BlockLayout.SANDWICH_NORM):
        norm("MLP norm")  # its input is the mid residual, a tensor of this layer
        add("MLP input (norm output)", act * L * h)
    elif layout is BlockLayout.PARALLEL:
        norm_on_input("MLP norm")
        add("MLP input (norm output)", act * L * h)
    elif layout is BlockLayout.POST_NORM:
        add("MLP input (mid residual)", act * L * h)
    # PARALLEL_SHARED_NORM: the MLP reads the attention norm's output, kept already
    if arch.is_moe_layer(index):
        _moe(add, arch, t, L, act, shape.expert_rows(L * arch.experts_per_token))
    else:
        width = (
            (arch.dense_intermediate_size or arch.intermediate_size)
            if arch.is_moe
            else arch.intermediate_size
        )
        _mlp(add, arch, t, L, shape.split(width, "the MLP width"), act)
    if layout in (BlockLayout.SANDWICH_NORM, BlockLayout.POST_NORM):
        norm("post-MLP norm")
    if arch.residual_dropout > 0:
        add("MLP residual dropout mask", (1 if device is Device.CUDA else act) * R * h)

    keeps_input = (
        (layernorm and layout is not BlockLayout.POST_NORM)
        or layout is BlockLayout.POST_NORM  # q/k/v read the raw input
        or (act == FP32 and impl.norm_fp32_copy)  # x.to(float32) is x itself: the norm keeps the input
    )
    return LayerSaves(
        saved=tuple(saved),
        keeps_input=keeps_input,
        forward_excess=_forward_excess(impl, arch, index, t, shape, act) if impl.transients else 0,
        backward_excess=_backward_excess(impl, arch, index, t, shape, act) if impl.transients else 0,
        program=forward_program(impl, arch, index, shape, act, copies, flash, tuple(saved), device),
    )


def _rms_norm_program(
    prefix: str, rows: int, width: int, act: int, output: str
) -> list[tuple[str, str, int]]:
    """``LlamaRMSNorm.forward`` (transformers 5.17, and its copies in Qwen2/Qwen3) op by op:
    ``x.to(float32)`` (kept), ``pow(2)`` freed once ``mean`` has read it, ``variance + eps`` freed once
    ``rsqrt`` (kept) has read it, ``x * rsqrt`` (fp32) freed when the function returns, after
    ``.to(dtype)`` (kept) and ``weight *`` (the output, ``output``: kept by the caller or an intermediate)."""
    elements = rows * width
    return [
        ("keep", f"{prefix}: x.float() copy", FP32 * elements),
        ("temp", f"{prefix}: pow(2)", FP32 * elements),
        ("temp", f"{prefix}: variance", FP32 * rows),
        ("drop", f"{prefix}: pow(2)", 0),
        ("temp", f"{prefix}: variance + eps", FP32 * rows),
        ("keep", f"{prefix}: rsqrt (fp32)", FP32 * rows),
        ("drop", f"{prefix}: variance + eps", 0),
        ("temp", f"{prefix}: x · rsqrt (fp32)", FP32 * elements),
        ("release", f"{prefix}: x.float() copy", 0),
        ("release", f"{prefix}: rsqrt (fp32)", 0),
        ("keep", f"{prefix}: normalized", act * elements),
        ("keep" if output.startswith("keep:") else "temp", output.removeprefix("keep:"), act * elements),
        ("release", f"{prefix}: normalized", 0),
        ("drop", f"{prefix}: x · rsqrt (fp32)", 0),
        ("drop", f"{prefix}: variance", 0),
    ]


def _rotary_program(name: str, width: int, T: int, act: int, kept: bool) -> list[tuple[str, str, int]]:
    """``apply_rotary_pos_emb``'s ``x * cos + rotate_half(x) * sin`` for one of q, k (transformers 5.17
    ``modeling_llama.py``): ``rotate_half`` is ``cat((-x2, x1))`` (the negated half freed after the
    ``cat``); each product is freed once the sum exists (the rotated tensor is ``name``)."""
    full = act * T * width
    result = ("keep" if kept else "temp", name, full)
    return [
        ("temp", f"{name} · cos", full),
        ("temp", f"{name}: -x2", full // 2),
        ("temp", f"{name}: rotate_half", full),
        ("drop", f"{name}: -x2", 0),
        ("temp", f"{name}: rotate_half · sin", full),
        ("drop", f"{name}: rotate_half", 0),
        result,
        ("drop", f"{name} · cos", 0),
        ("drop", f"{name}: rotate_half · sin", 0),
    ]


def forward_program(
    impl: ModelImpl,
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    copies: bool,
    flash: bool,
    saved: tuple[tuple[str, int], ...],
    device: Device = Device.CUDA,
) -> tuple[tuple[str, str, int], ...]:
    """The decoder layer's forward op by op (:attr:`LayerSaves.program`) for the transformers 5.17 Llama
    family (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ``Qwen3DecoderLayer``: pre-norm RMSNorm, rotary
    q and k, SDPA's flash kernel, a SwiGLU MLP) and GPT-2 on CUDA (:func:`_gpt2_program`) in a 16- or 8-bit
    compute dtype; empty for other code.
    The order decides which cached blocks the caching allocator can reuse, not what is allocated: the
    saved tensors are :attr:`LayerSaves.saved`, and at the output (the new hidden state being written) the
    mid residual and the down projection's output are the layer's ``forward_excess``.

    ``LlamaAttention.forward``: q, k, v projections (Qwen3: ``q_norm``/``k_norm`` over the head dimension
    on the projections), the rotary embedding, the cache's ``torch.cat`` copies of k and v (which then
    replace the rotated k and the projected v), SDPA's output and log-sum-exp, ``o_proj``; the residual
    add; the MLP norm; ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``; the residual add."""
    t = traits(arch)
    if shape.tp > 1 or shape.cp > 1:
        return ()  # written for one rank holding the whole micro-batch
    if (
        impl.name is ModelImplName.HF
        and impl.transients
        and act != FP32
        and flash
        and device is Device.CUDA
        and arch.family == "gpt2"
        and arch.block_layout is BlockLayout.PRE_NORM
        and arch.residual_dropout > 0
        and not arch.is_moe
    ):
        return _matched(_gpt2_program(arch, shape, act, copies), saved)
    if not (
        impl.name is ModelImplName.HF
        and impl.transients
        and impl.norm_fp32_copy
        and act != FP32
        and flash
        and t.norm == "llama"
        and t.rotary
        and not (t.rotary_cat or t.rotary_fp32 or t.qkv_views_kept or t.embedding_scale)
        and t.rotary_fraction == 1.0
        and arch.block_layout is BlockLayout.PRE_NORM
        and arch.latent_attention is None
        and arch.qk_norm in (QkNorm.NONE, QkNorm.PER_HEAD)
        and arch.mlp is MlpKind.SWIGLU
        and not (arch.fused_qkv or arch.fused_gate_up or arch.is_moe_layer(index))
        and arch.residual_dropout == 0
    ):
        return ()
    T, h, a, kv, d = shape.tokens, arch.hidden_size, arch.num_heads, arch.kv_heads, arch.dim_per_head
    f = arch.dense_intermediate_size or arch.intermediate_size if arch.is_moe else arch.intermediate_size
    ops = _rms_norm_program("attention norm", T, h, act, "keep:attention input (norm output)")
    sources = {}
    for name, width, heads in (("q", a * d, a), ("k", kv * d, kv), ("v", kv * d, kv)):
        ops.append(("temp", f"{name} projection", act * T * width))
        sources[name] = f"{name} projection"
        if arch.qk_norm is QkNorm.PER_HEAD and name != "v":
            ops += _rms_norm_program(f"{name} norm", T * heads, d, act, f"{name} norm output")
            ops.append(("drop", f"{name} projection", 0))
            sources[name] = f"{name} norm output"
    ops += _rotary_program("q", a * d, T, act, kept=True)
    ops += _rotary_program("k rotated", kv * d, T, act, kept=False)
    ops += [("drop", sources["q"], 0), ("drop", sources["k"], 0)]
    if copies:
        ops += [("keep", "k", act * T * kv * d), ("keep", "v", act * T * kv * d)]
        ops += [("drop", "k rotated", 0), ("drop", sources["v"], 0)]
    else:  # SDPA keeps the rotated k and the projected v themselves
        ops = [
            (verb, {"k rotated": "k", sources["v"]: "v"}.get(name, name), nbytes)
            for verb, name, nbytes in ops
        ]
        ops = [
            ("keep", name, nbytes) if name in ("k", "v") and verb == "temp" else (verb, name, nbytes)
            for verb, name, nbytes in ops
        ]
    ops += [
        ("keep", "attention output (o projection input)", act * T * a * d),
        ("keep", "softmax log-sum-exp", FP32 * T * a),
        ("release", "softmax log-sum-exp", 0),
        ("temp", "o projection output", act * T * h),
        *[("release", name, 0) for name in ("q", "k", "v", "attention output (o projection input)")],
        ("release", "attention input (norm output)", 0),
        ("temp", "mid residual", act * T * h),
        ("drop", "o projection output", 0),
    ]
    ops += _rms_norm_program("MLP norm", T, h, act, "keep:MLP input (norm output)")
    ops += [
        ("keep", "gate output", act * T * f),
        ("keep", "activation output", act * T * f),
        ("release", "gate output", 0),
        ("keep", "up output", act * T * f),
        ("keep", "activation × up (down input)", act * T * f),
        ("release", "activation output", 0),
        ("release", "up output", 0),
        ("temp", "down projection output", act * T * h),
        ("release", "activation × up (down input)", 0),
        ("release", "MLP input (norm output)", 0),
        ("output", "", 0),
        ("drop", "down projection output", 0),
        ("drop", "mid residual", 0),
    ]
    return _matched(ops, saved)


def _gpt2_program(arch: Architecture, shape: Shape, act: int, copies: bool) -> list[tuple[str, str, int]]:
    """``GPT2Block.forward`` (transformers 5.17, on CUDA: dropout is one fused kernel giving its output and
    a bool mask): ``ln_1``, ``c_attn`` (one [3h] output that q, k and v view), the cache copies of k and
    v, SDPA (flash, dropout inside), ``c_proj`` and ``resid_dropout``, the residual add (kept by
    ``ln_2``), ``ln_2``, ``c_fc``, ``NewGELUActivation`` (``0.5 * x`` first, then ``pow(x, 3)``,
    ``0.044715 *``, ``x +``, ``√(2/π) *``, ``tanh``, ``1 +``, the product), ``c_proj``, the MLP's
    dropout, the residual add. Under checkpointing the attention's tensors are released when it returns,
    the norms' outputs when the block rebinds ``hidden_states``, GELU's operands when their products
    exist."""
    T, h, f = shape.tokens, arch.hidden_size, arch.intermediate_size
    kv, qkv = arch.kv_heads * arch.dim_per_head, arch.num_heads * arch.dim_per_head
    full, mask, wide, stats = act * T * h, T * h, act * T * f, FP32 * T
    gelu = "GELU input, tanh, 0.5x, 1 + tanh"
    ops = [
        ("keep", "attention norm: mean", stats),
        ("keep", "attention norm: rstd", stats),
        ("keep", "attention input (norm output)", full),
        ("keep", "q/k/v projection output (q is a view of it)", act * T * (qkv + 2 * kv)),
    ]
    if copies:
        ops += [("keep", "k", act * T * kv), ("keep", "v", act * T * kv)]
    ops += [
        ("keep", "attention output (o projection input)", act * T * qkv),
        ("keep", "softmax log-sum-exp", FP32 * T * arch.num_heads),
        ("release", "softmax log-sum-exp", 0),
        ("temp", "o projection output", full),
        ("release", "attention output (o projection input)", 0),
        ("keep", "attention residual dropout mask", mask),
        ("temp", "attention dropout output", full),
        ("release", "attention residual dropout mask", 0),
        ("drop", "o projection output", 0),
        ("release", "q/k/v projection output (q is a view of it)", 0),
        *([("release", "k", 0), ("release", "v", 0)] if copies else []),
        ("keep", "MLP norm: input", full),
        ("release", "attention input (norm output)", 0),
        ("release", "attention norm: mean", 0),
        ("release", "attention norm: rstd", 0),
        ("keep", "MLP norm: mean", stats),
        ("keep", "MLP norm: rstd", stats),
        ("keep", "MLP input (norm output)", full),
        ("release", "MLP norm: mean", 0),
        ("release", "MLP norm: rstd", 0),
        ("keep", f"{gelu}#0", wide),
        ("keep", f"{gelu}#2", wide),
        ("temp", "GELU pow(x, 3)", wide),
        ("temp", "GELU 0.044715 · x³", wide),
        ("drop", "GELU pow(x, 3)", 0),
        ("temp", "GELU x + 0.044715 · x³", wide),
        ("drop", "GELU 0.044715 · x³", 0),
        ("temp", "GELU √(2/π) · (…)", wide),
        ("drop", "GELU x + 0.044715 · x³", 0),
        ("keep", f"{gelu}#1", wide),
        ("drop", "GELU √(2/π) · (…)", 0),
        ("keep", f"{gelu}#3", wide),
        ("release", f"{gelu}#1", 0),
        ("keep", "GELU output (down input)", wide),
        ("release", f"{gelu}#2", 0),
        ("release", f"{gelu}#3", 0),
        ("release", f"{gelu}#0", 0),
        ("temp", "down projection output", full),
        ("release", "GELU output (down input)", 0),
        ("keep", "MLP residual dropout mask", mask),
        ("temp", "MLP dropout output", full),
        ("release", "MLP residual dropout mask", 0),
        ("drop", "down projection output", 0),
        ("output", "", 0),
        ("release", "MLP input (norm output)", 0),
        ("release", "MLP norm: input", 0),
        ("drop", "attention dropout output", 0),
        ("drop", "MLP dropout output", 0),
    ]
    return ops


def _matched(
    ops: list[tuple[str, str, int]], saved: tuple[tuple[str, int], ...]
) -> tuple[tuple[str, str, int], ...]:
    """The program with each kept tensor under its name in ``saved`` (``add`` names a single tensor
    ``"{name}: {name}"``), provided the kept tensors are exactly the saved ones; else empty."""
    by_short = {}
    for full, nbytes in saved:
        head, _, tail = full.partition(": ")
        by_short[full] = (full, nbytes)
        if head == tail:
            by_short[head] = (full, nbytes)
    renamed: list[tuple[str, str, int]] = []
    kept: list[tuple[str, int]] = []
    for verb, name, nbytes in ops:
        if verb == "keep":
            if name not in by_short or by_short[name][1] != nbytes:
                return ()
            name = by_short[name][0]
            kept.append((name, nbytes))
        elif verb == "release":
            name = by_short[name][0] if name in by_short else name
        renamed.append((verb, name, nbytes))
    return tuple(renamed) if sorted(kept) == sorted(saved) else ()


def _attention(add, norm, arch, t, impl, T, shape, act, device, copies, flash) -> None:
    """q, k, v as attention keeps them, its output (the o projection's input) and its softmax statistics,
    for the rank's T tokens and its a/t heads and kv/t key/value heads.

    SDPA with GQA is not expanded (``sdpa_attention.use_gqa_in_sdpa``: ``enable_gqa=True``); q and k are
    kept after the rotary embedding (``q * cos`` keeps only ``cos``); with ``use_cache`` k and v are the
    ``DynamicLayer.update`` copies. GPT-2's q, k, v are views of ``c_attn``'s output, which therefore stays
    whole, next to the k/v cache copies.

    Ulysses context parallelism (DeepSpeed ``runtime/sequence_parallel/ulysses_sp.py``
    ``UlyssesSPAttentionHF``): SDPA keeps q, k, v and its output all-to-all'd to s × a/c heads (the same
    bytes; k and v repeated to c heads where fewer, ``kv_replication_factor``), and the o projection keeps
    the output all-to-all'd back; the cache's k and v copies are the local ones.
    """
    a = shape.split(arch.num_heads, "attention heads")
    kv = shape.split(arch.kv_heads, "key/value heads")
    d = arch.dim_per_head
    ulysses = shape.cp > 1 and shape.cp_impl is CpImpl.ULYSSES
    mla = arch.latent_attention
    if mla is not None:
        # DeepseekV3Attention: q_a_proj → q_a_layernorm → q_b_proj; kv_a_proj_with_mqa → kv_a_layernorm →
        # kv_b_proj; q/k as cat(nope, roped pe); v padded to the qk head dim only for flash-attn-2
        q_width = a * mla.qk_head_dim
        if mla.q_lora_rank is not None:
            norm("q_a norm", mla.q_lora_rank, T)
            add("q_b_proj input", act * T * mla.q_lora_rank)
        add("kv_a_proj output", act * T * (mla.kv_lora_rank + mla.qk_rope_head_dim))
        norm("kv_a norm", mla.kv_lora_rank, T)
        add("kv_b_proj input", act * T * mla.kv_lora_rank)
        add("q", act * T * q_width)
        add("k", act * T * q_width)
        add("v", act * T * a * mla.v_head_dim)
        out = a * mla.v_head_dim
    else:
        q_width, kv_width = a * d, kv * d
        if t.qkv_views_kept and not flash and shape.b > 1:
            # eager matmul(q, kᵀ) folds q [b, a, s, d] (a view of c_attn's output) into [b·a, s, d]: a copy
            # when b > 1, saved by bmm; c_attn's output is then kept by nothing
            add("q (matmul's contiguous copy)", act * T * q_width)
        elif (t.qkv_views_kept and arch.fused_qkv) or (t.qkv_views_kept and not t.rotary):
            add("q/k/v projection output (q is a view of it)", act * T * (q_width + 2 * kv_width))
        if arch.qk_norm is QkNorm.PER_HEAD:
            norm("q norm", d, T * a)
            norm("k norm", d, T * kv)
        elif arch.qk_norm is QkNorm.FULL:
            norm("q norm", q_width, T)
            norm("k norm", kv_width, T)
        if not t.qkv_views_kept:
            add("q", act * T * q_width)
        if ulysses:
            all_to_all_width = max(kv, shape.cp) * d  # this rank's s × kv/c heads, as many bytes as T × kv
            if copies:
                add("k", act * T * kv_width)
                add("v", act * T * kv_width)
            add("k after the all-to-all", act * T * all_to_all_width)
            add("v after the all-to-all", act * T * all_to_all_width)
        elif copies or not t.qkv_views_kept:
            add("k", act * T * kv_width)
            add("v", act * T * kv_width)
        out = q_width
    if ulysses:
        add("attention output before the all-to-all", act * T * out)
    if flash and t.rotary_cat:
        add("attention output", act * T * out)
        add("o projection input (a copy of the [b, a, s, d] output)", act * T * out)
    else:
        add("attention output (o projection input)", act * T * out)
    b, s = shape.b, shape.s
    if flash:
        add("softmax log-sum-exp", FP32 * T * a)
    else:
        probs = b * a * s * s
        if t.eager_softmax_fp32:
            add("softmax probabilities (fp32)", FP32 * probs)
            add("probabilities cast", act * probs if act != FP32 else 0)
        else:
            add("softmax probabilities", act * probs)
        if arch.attention_dropout > 0:
            add("attention dropout mask", (1 if device is Device.CUDA else act) * probs)
            add("attention dropout output", act * probs)
        if kv != a:  # eager repeats k and v to every head (repeat_kv)
            add("k, v repeated", 2 * act * T * (a - kv) * d)


def _mlp(add, arch, t, T, width, act) -> None:
    """Gated (SwiGLU, GeGLU): gate output, activation output, up output, their product (the down
    projection's input), 4·act·T·f; fused gate/up (Phi-3) keeps its 2f output whole, the same bytes.
    GELU: GPT-2's ``NewGELUActivation`` keeps x, tanh(...), 0.5x and 1 + tanh, plus the output;
    ``nn.GELU`` keeps its input and the output."""
    if arch.mlp is MlpKind.SWIGLU:
        if arch.fused_gate_up:
            add("gate/up output", 2 * act * T * width)
        else:
            add("gate output", act * T * width)
            add("up output", act * T * width)
        add("activation output", act * T * width)
        add("activation × up (down input)", act * T * width)
        return
    if t.gelu == "tanh_decomposed":
        add("GELU input, tanh, 0.5x, 1 + tanh", [act * T * width] * 4)
    else:
        add("GELU input", act * T * width)
    add("GELU output (down input)", act * T * width)


def _moe(add, arch, t, T, act, R) -> None:
    """A mixture-of-experts layer under transformers 5.17's default ``grouped_mm`` experts
    (``integrations/moe.py::grouped_mm_experts_forward``): the router's fp32 softmax, top-k indices and
    weights, the permutation indices (3 × int64 [S]), the sentinel mask, per-expert offsets (int32 [E]),
    the gathered tokens, gate/up output [S, 2f], activation, product, routing weights and the down
    output; plus the shared experts (Qwen2-MoE: with a sigmoid gate).

    Under expert parallelism (derived from torchtitan ``distributed/expert_parallel.py`` ``ExpertParallel``,
    not measured) the rank's E/e experts compute the R pairs the dispatch all-to-all brings them
    (:meth:`Shape.expert_rows`): the gathered tokens become the all-to-all's output [R, h] and the experts'
    tensors have R rows, offsets E/e; the routing and permutation stay on the rank's own S pairs, and the
    down output the weights multiply is the combine all-to-all's [S, h] (``all_to_all_single_autograd``
    saves nothing itself)."""
    E, k, f, h = arch.num_experts, arch.experts_per_token, arch.intermediate_size, arch.hidden_size
    S = T * k
    router = [("softmax (fp32)", FP32 * T * E), ("top-k indices", INT64 * T * k)]
    if t.router == "softmax_topk":
        weights = act * S
    else:
        router += [("top-k sum (fp32)", FP32 * T), ("top-k weights (fp32)", FP32 * T * k)]
        weights = act * S if t.router == "softmax_topk_norm_cast" else FP32 * S
    add("router", router)
    # named parts: the experts' backward (zerocalc.peak.layer_nodes) frees them where their nodes run
    add(
        "experts",
        [
            ("perm // k", INT64 * S),
            ("perm", INT64 * S),
            ("inverse perm", INT64 * S),
            ("sentinel mask", S),
            ("offsets", FP32 * arch.local_experts),
            ("gathered tokens", act * R * h),
            ("gate/up output", 2 * act * R * f),
            ("activation output", act * R * f),
            ("activation × up (down input)", act * R * f),
            ("routing weights (sorted)", weights),
            ("down output", act * S * h),
        ],
    )
    if arch.num_shared_experts:
        width = arch.num_shared_experts * (arch.shared_expert_intermediate_size or f)
        add("shared experts", [act * T * width] * 4)
        if arch.shared_expert_gate:
            add("shared expert gate, its output", [act * T, act * T * h])


def _forward_excess(impl, arch, index, t, shape, act) -> int:
    """Above the saved tensors at the layer's forward peak: the mid residual, the down projection's output
    and the new hidden (3·act·T·h; measured on CPU op by op); Mixtral's fp32 routing weights promote the
    combined expert output to fp32 [T, h] and its [S, h] gather.

    Under tensor parallelism (:func:`_tensor_parallel_forward_excess`) the peak is the down projection's
    row-parallel reduction instead."""
    if shape.tp > 1:
        return _tensor_parallel_forward_excess(impl, arch, shape, act)
    T, h = shape.local_tokens, arch.hidden_size
    extra = 3 * act * T * h
    if t.norm == "layernorm" and arch.residual_dropout > 0:
        extra += act * T * h  # the dropout output before the residual add
    if arch.is_moe_layer(index) and t.router == "softmax_topk_norm":  # fp32 routing weights
        S = T * arch.experts_per_token  # the fp32 weighted output [S, h], its gather, the fp32 sum [T, h]
        extra = max(extra, act * T * h + 2 * FP32 * S * h + FP32 * T * h)
    return extra


def _tensor_parallel_forward_excess(impl: ModelImpl, arch: Architecture, shape: Shape, act: int) -> int:
    """The down projection's reduction, per rank: its row-parallel partial output (L × h) and the reduced
    result (R rows), out of place (``funcol.all_reduce`` for ``Partial`` → ``Replicate``; torch 2.13
    ``distributed/_functional_collectives.py::reduce_scatter_single`` makes the Shard(1) scatter dimension
    contiguous first, one more L × h copy, under sequence parallelism, while the MLP norm's R-row output
    stays alive as the call argument of ``feed_forward``); the mid residual counts where the norm keeps an
    fp32 copy rather than the residual itself (``hf``). Measured op by op on CPU (torch 2.13, gloo,
    world 2, a torchtitan Llama block with a norm saving its input and rstd as the fused CUDA kernel
    does): b 2, s 64, h 64, f 512 and 64, t 2 with sequence parallelism: 2·act·(L + R)·h."""
    L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    rows = L + R
    if R < L:
        rows += L + R
    if impl.norm_fp32_copy:
        rows += R
    return act * rows * h


def _backward_excess(impl, arch, index, t, shape, act) -> int:
    """Above the state at the start of a layer's backward: the down projection's weight gradient (act·h·f,
    plus its bias) and the two f-wide gradients of the activation product (2·act·T·f); measured on CPU
    op by op (the same aten ops run on CUDA). MoE: the combine backward's [S, h] gradients (fp32 for
    Mixtral's fp32 routing weights, 14·S·h; 7·S·h for Qwen2-MoE).

    Per rank under tensor parallelism, f/t columns of L tokens, and the moment the reductions add, where
    larger (measured op by op on CPU as :func:`_tensor_parallel_forward_excess`, b 1 and 2, f 512 and 64):

    * sequence parallelism: the output gradient all-gathered to L rows (``funcol``'s gather on dim 1 is a
      staging buffer and a ``cat`` copy unless b = 1, ``_maybe_view_chunk_cat``); then beside it the down
      projection's input and weight gradients. The input gradient's reduce-scatter comes after the MLP's
      saved tensors are freed, and is smaller;
    * without: the up projection's input gradient (L × h) and its out-of-place all-reduce, beside the
      weight gradients of the down and up projections and the activation's pending gradient, once the
      product, activation output and up output are freed (autograd runs the up projection's backward
      before the activation's)."""
    L, h, f = shape.local_tokens, arch.hidden_size, arch.intermediate_size
    if arch.is_moe_layer(index):
        S = L * arch.experts_per_token
        moe = (14 if t.router == "softmax_topk_norm" else 7) * S * h * act // 2
        shared = 0
        if arch.num_shared_experts:
            fs = arch.num_shared_experts * (arch.shared_expert_intermediate_size or f)
            shared = act * h * fs + 2 * act * L * fs
        return max(moe, shared)
    width = shape.split(arch.dense_intermediate_size or f if arch.is_moe else f, "the MLP width")
    bias = act * h if arch.mlp_bias else 0
    mlp = act * h * width + 2 * act * L * width + ((bias + 511) // 512 * 512 if bias else 0)
    if shape.tp == 1:
        return mlp
    if shape.sequence_tokens < L:
        gather = act * L * h * (2 if shape.b > 1 else 1)
        return max(mlp, gather, act * (L * h + L * width + h * width))
    return max(mlp, act * (2 * h * width + 2 * L * h - 2 * L * width))


def norm_backward_excess(impl: ModelImpl, arch: Architecture, shape: Shape, act: int) -> int:
    """The final norm's backward transient: RMSNorm's fp32 input gradient accumulates through pow, mean
    and mul (3 · fp32 · T·h, measured); LayerNorm's: the input gradient (act·T·h); T is the norm's rows
    on the rank (:attr:`Shape.sequence_tokens`)."""
    if not impl.transients:
        return 0
    T, h = shape.sequence_tokens, arch.hidden_size
    if traits(arch).norm == "layernorm":
        return act * T * h
    return 3 * FP32 * T * h if impl.norm_fp32_copy else act * T * h


def hidden_bytes(arch: Architecture, shape: Shape, act: int) -> int:
    """One hidden state between layers on one rank (the embedding output, each layer's output, the input
    full recomputation keeps): act · R · h, R = :attr:`Shape.sequence_tokens` (Megatron-LM's hidden
    states are [s/t, b, h] under sequence parallelism; torchtitan's ``tok_embeddings``
    ``RowwiseParallel(output_layouts=Shard(1))`` hands the layers Shard(1) hidden states)."""
    return act * shape.sequence_tokens * arch.hidden_size


# ------------------------------------------------------------------------------- outside the layers
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


# ------------------------------------------------------------------------------ vocabulary per rank
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


# ------------------------------------------------------------------------- parallel limits, buffers
def parallel_unsupported(impl: ModelImpl, arch: Architecture, shape: Shape, flash: bool) -> str | None:
    """Why the model code cannot run ``arch`` under ``shape``'s tensor and context parallelism, as one
    sentence; None when it can.

    * heads, key/value heads and the MLP width divide by t (Megatron-LM ``num_query_groups % t``;
      ``ColwiseParallel`` splits whole heads), s by c, and s/c by t under sequence parallelism;
    * context parallelism runs in fused attention only (TE's ``attn_forward_func_with_cp``, torch's
      ``_context_parallel`` dispatch of SDPA's flash and efficient kernels);
    * torchtitan's context parallelism rotates K/V (ring or all-gather), it has no Ulysses;
    * ``hf`` has no sequence parallelism (``base_model_tp_plan`` leaves the norms replicated);
    * ``hf`` and ``torchtitan`` under TP: the dense plan of the module docstring only (transformers' other
      plans gather or pack their outputs: Phi-3, OLMo 2, GPT-NeoX; GPT-2 and Falcon have none; MoE and
      latent attention plans are not modelled here).
    """
    t, c = shape.tp, shape.cp
    checks = [
        (arch.num_heads, t, "attention heads"),
        (arch.kv_heads, t, "key/value heads"),
        (arch.intermediate_size, t, "the MLP width"),
        (shape.s, c, "the sequence length"),
    ]
    for total, parts, what in checks:
        if total % parts:
            return f"{what} ({total}) is not divisible by {parts}"
    if shape.sequence_parallel and shape.local_tokens % t:
        return f"b·s/c ({shape.local_tokens}) is not divisible by {t} for sequence parallelism"
    if c > 1 and not flash:
        return "context parallelism needs flash attention (fused kernels keep no s × s tensor)"
    if c > 1 and shape.cp_impl is CpImpl.ULYSSES:
        a, kv = arch.num_heads // t, arch.kv_heads // t
        if a % c:
            return f"Ulysses needs the {a} attention heads per tensor-parallel rank divisible by {c}"
        if impl.name is ModelImplName.MEGATRON and kv % c:
            # TE's AttnFuncWithCPAndQKVOA2A splits k and v by heads too (DeepSpeed repeats them instead)
            return f"Ulysses needs the {kv} key/value heads per tensor-parallel rank divisible by {c}"
        if impl.name is ModelImplName.TORCHTITAN:
            return "torchtitan's context parallelism is ring or all-gather attention, not Ulysses"
    if t > 1 and shape.sequence_parallel and impl.name is ModelImplName.HF:
        return "transformers' tensor-parallel plans have no sequence parallelism (the norms are replicated)"
    if t > 1 and impl.name is not ModelImplName.MEGATRON:
        tr = traits(arch)
        if arch.is_moe:
            return f"{impl.name.value} code's tensor parallelism of mixture-of-experts layers is not modelled"
        if (
            arch.latent_attention is not None
            or arch.fused_qkv
            or arch.fused_gate_up
            or arch.qk_norm is QkNorm.FULL
            or tr.qkv_views_kept
            or arch.mlp is not MlpKind.SWIGLU
        ):
            return (
                f"{impl.name.value} code's tensor-parallel plan for this architecture is not the dense "
                "colwise q/k/v, gate/up and rowwise o/down plan that is modelled"
            )
    return None


class Transient(NamedTuple):
    """Buffers tensor or context parallelism holds together at one moment inside a layer."""

    phase: str
    """``forward`` or ``backward``."""
    name: str
    nbytes: int


def parallel_transients(
    impl: ModelImpl, arch: Architecture, index: int, shape: Shape, act: int
) -> tuple[Transient, ...]:
    """The moments inside one layer where tensor or context parallelism holds buffers above the layer's
    saved tensors, on one rank; :func:`layer_saves` takes the largest of each phase into
    ``forward_excess`` / ``backward_excess`` (the timeline counts them above all of the layer's saved
    tensors: at most the MLP's saved tensors more than the moment holds). ``hf`` and ``torchtitan``'s
    tensor-parallel buffers are in their measured excess instead (:func:`_forward_excess`,
    :func:`_backward_excess`). Derived from the source, not measured. With kv = 2·act·L·h_kv/t, the rank's
    K and V:

    * ``megatron`` tensor parallelism with sequence parallelism (TE ``Linear``/``LayerNormLinear``, Megatron
      ``LinearWithGradAccumulationAndAsyncCommunication``): forward, the all-gathered L × h input of a
      column-parallel linear (the row-parallel partial output before its reduce-scatter is as large, at
      another moment); backward, the input gathered again and the L × h input gradient before its
      reduce-scatter. Without sequence parallelism the all-reduces run in place: nothing.
    * ``megatron`` context parallelism, Transformer Engine ``attention/dot_product_attention/
      context_parallel.py``: ring (``AttnFuncWithCPAndKVP2P``) keeps every step's K/V buffer in
      ``p2p_comm_buffers`` until the forward returns (c·kv) and in backward two buffers of K/V with dK/dV
      (4·kv) and dq; all-gather (``AttnFuncWithCPAndKVAllGather``) gathers K and V and reorders them for
      causal load balance (3c/2·kv), and in backward adds dK, dV over the whole sequence (c·kv) and dq;
      Ulysses (``AttnFuncWithCPAndQKVOA2A``) keeps the caller's q, k, v from before the all-to-all beside
      the ones after it, and in backward the gradients before their all-to-all back.
    * ``hf`` (accelerate's torch context parallelism) and ``torchtitan``, torch
      ``distributed/tensor/experimental/_context_parallel/_attention.py`` (``_templated_ring_attention``,
      ``convert_to_f32``): the ``alltoall`` rotater (ring) holds the chunk in use, the copy it sends and
      the one it receives (min(c, 3)·kv), the ``allgather`` rotater the local copy and all of K/V
      ((c + 1)·kv); both merge the output in fp32 (4·L·a/t·d); in backward the same K/V, fp32
      accumulators for dq, dk, dv and the fp32 dK/dV chunk sent and received. DeepSpeed Ulysses (``hf``):
      q, k, v before the all-to-all (``UlyssesSPAttentionHF`` holds them), as for Megatron.
    * expert parallelism, in a mixture-of-experts layer (Megatron-LM ``core/transformer/moe/
      token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``, torchtitan ``ExpertParallel``; derived, not
      measured): forward, the rank's S = k·L permuted tokens while the dispatch all-to-all sends them (what
      it receives is the experts' saved input); backward, the combine's output gradient sent (S rows) and
      received (:meth:`Shape.expert_rows`).
    """
    L, R, h, c = shape.local_tokens, shape.sequence_tokens, arch.hidden_size, shape.cp
    out: list[Transient] = []
    if shape.ep > 1 and arch.is_moe_layer(index):
        pairs = L * arch.experts_per_token
        out.append(Transient("forward", "dispatch all-to-all: the permuted tokens sent", act * pairs * h))
        both = act * (pairs + shape.expert_rows(pairs)) * h
        out.append(Transient("backward", "combine all-to-all backward: the gradient sent and received", both))
    megatron = impl.name is ModelImplName.MEGATRON
    if megatron and shape.tp > 1 and R < L:
        out.append(Transient("forward", "all-gathered input of a column-parallel linear", act * L * h))
        both = "input gathered again, input gradient before its reduce-scatter"
        out.append(Transient("backward", both, 2 * act * L * h))
    if c == 1:
        return tuple(out)
    d = arch.dim_per_head
    q_width = shape.split(arch.num_heads, "attention heads") * d
    kv_width = shape.split(arch.kv_heads, "key/value heads") * d
    kv = 2 * act * L * kv_width
    qkv = act * L * (q_width + 2 * kv_width)
    if shape.cp_impl is CpImpl.ULYSSES:
        out.append(Transient("forward", "q, k, v before the all-to-all", qkv))
        out.append(Transient("backward", "q, k, v gradients before the all-to-all back", qkv))
    elif megatron and shape.cp_impl is CpImpl.RING:
        out.append(Transient("forward", "K/V buffer of every ring step", c * kv))
        out.append(Transient("backward", "two K/V + dK/dV ring buffers, dq", 4 * kv + act * L * q_width))
    elif megatron:
        out.append(Transient("forward", "all-gathered K/V and its causal reordering", 3 * c * kv // 2))
        dq = act * L * q_width
        both = "dK/dV over s, all-gathered K/V reordered, dq"
        out.append(Transient("backward", both, 5 * c * kv // 2 + dq))
    else:
        held = min(c, 3) * kv if shape.cp_impl is CpImpl.RING else (c + 1) * kv
        merged = FP32 * L * q_width
        accumulators = FP32 * L * (q_width + 2 * kv_width)
        dkv_in_flight = 2 * FP32 * 2 * L * kv_width
        out.append(Transient("forward", "K/V in flight, fp32 merged output", held + merged))
        backward = held + accumulators + dkv_in_flight
        out.append(Transient("backward", "K/V in flight, fp32 dq/dk/dv, dK/dV in flight", backward))
    return tuple(out)


# ------------------------------------------------------------------------------------------ Korthikanti
def _korthikanti_layer(arch: Architecture, index: int, shape: Shape, act: int, flash: bool) -> LayerSaves:
    """Korthikanti et al. 2022 §4.1, Table 2, op by op (:mod:`zerocalc.model.activations`), per rank."""
    moe = arch.is_moe_layer(index)
    terms = layer_terms(
        ActivationShape(
            seq_len=shape.s,
            micro_batch=shape.b,
            hidden=arch.hidden_size,
            heads=arch.num_heads,
            kv_heads=arch.kv_heads,
            head_dim=arch.dim_per_head,
            ffn_hidden=arch.intermediate_size,
            mlp=arch.mlp,
            dropout=arch.residual_dropout > 0 or (arch.mlp is MlpKind.GELU and arch.family is None),
            flash_attention=flash,
            experts=arch.num_experts if moe else 0,
            experts_per_token=arch.experts_per_token if moe else 0,
            shared_experts=arch.num_shared_experts if moe else 0,
            capacity_factor=shape.capacity_factor if shape.ep > 1 else 1.0,
            tp=shape.tp,
            sequence_parallel=shape.sequence_parallel,
            cp=shape.cp,
            cp_impl=shape.cp_impl,
        )
    )
    scale = act / 2  # Korthikanti counts 16-bit activations
    return LayerSaves(
        saved=tuple((name, int(b * scale)) for name, b in terms.items()),
        keeps_input=False,
        forward_excess=0,
        backward_excess=0,
    )
