"""The operations one rank runs for one micro-batch: GEMMs, attention, element-wise kernels (pure).

**GEMMs** are the layer's matrices: every 2-D weight of :func:`~zerocalc.model.architecture.layer_tensors`
(the rank's shards under tensor parallelism, :class:`~zerocalc.model.architecture.TensorParallelRank`)
is one product per micro-batch with M = L = b·s/c rows (the rank's tokens; under sequence parallelism the
linears see the all-gathered L rows, Korthikanti et al. 2022 §4.2.2), K its input and N its output
columns; latent attention's q/kv down projections run on the b·s/(c·t) rows of the sequence shard under
Megatron-LM's sequence parallelism (:func:`_latent_sequence_sharded`). A routed expert's 3-D weight
[E, out, in] is a grouped product over the rank's E/e experts
(e the expert-parallel degree), each of M = ⌈R/(E/e)⌉ rows: R = L·k token copies reach the rank's
experts under balanced routing (each of the e ranks routes L·k copies, E/e of every E land here), ×
the capacity factor on the busiest rank (:meth:`~zerocalc.model.code.Shape.expert_rows`, the memory
model's count), L·ETP/t in place of L under tensor and sequence parallelism with the experts split over
ETP ranks (:func:`expert_tokens`: each expert's K or N is then its /ETP shard); priced as one product
of the stacked R rows (:mod:`~zerocalc.compute.time`: a grouped GEMM is one kernel over the groups'
tiles: Megatron-LM ``TEGroupedMLP`` / ``GroupedMLP``, torchtitan's ``torch._grouped_mm``), its weight
gradient at the depth of one expert's M rows. The LM head is [V/t, h] (the embedding's matrix when
tied). Backward runs two products per forward one, of equal FLOPs: the input gradient (M × N · N × K)
and the weight gradient (K × M · M × N). So a step's GEMM FLOPs are 6·T·(matrix parameters): the 6·Ψ·T
of Kaplan et al. 2020 over the matrices.

**Attention** per layer: Q·Kᵀ and P·V over the rank's a/t heads, 2·b·(s/c)·s_kv·(a/t)·(d_qk + d_v)
FLOPs forward (``4·b·s²·h`` for one rank of a model of width h = a·d; PaLM's ``12·L·H·Q·T`` counts it
forward and backward). A fused (flash) kernel skips the masked half of a causal product (FlashAttention-2,
Dao 2023 §3.1.1: blocks above the diagonal are not computed) and its backward executes 2.5 times the
forward's FLOPs (five products to the forward's two, Dao 2023 §3.1.2; the forward's recomputation of
P included). Eager attention runs the two products as batched GEMMs over the whole s × s scores (the
mask applied, not skipped) and its softmax, scale, mask and dropout as element-wise kernels over them.

**Element-wise kernels** are bytes read + written (:class:`Traffic`), per layer forward; backward moves
twice the forward's bytes (it reads the output gradient and the saved inputs and writes the input
gradient: Calculon, Isaev et al. 2023, ``calculon/llm/layers.py``, counts an element-wise layer's
backward as two passes of its size). Bytes per element, a 16-bit compute dtype (act = 2):

* norms: RMSNorm as eager code runs it, 36 (``x.float()`` r2 w4, ``pow(2)`` r4 w4, ``mean`` r4,
  ``x·rsqrt`` r4 w4, ``.to(dtype)`` r4 w2, ``weight·`` r2 w2: transformers' ``LlamaRMSNorm`` and
  ATen's composite ``rms_norm``); LayerNorm (one ATen kernel) and fused norms (Megatron-LM / Transformer
  Engine), 4 (r2 w2);
* rotary embedding on q and k: eager 20 (``q·cos`` r2 w2, ``rotate_half``'s negation and ``cat`` r3
  w3, ``·sin`` r2 w2, the sum r4 w2; torchtitan's complex product: ``.float()`` r2 w4, the product r4
  w4, ``type_as`` r4 w2), fused 4;
* the attention output's ``transpose(1, 2).contiguous()`` copy, eager code only: 4;
* residual adds, 6 (r4 w2), two per layer; residual dropout where the model has it: eager 5 (r2 w2,
  a mask w1), fused into the bias-dropout-add 1 (the mask);
* MLP activation per element of f/t: SwiGLU eager 10 (``silu`` r2 w2, ``·up`` r4 w2), fused 6
  (Megatron-LM ``bias_swiglu``); GELU 4;
* mixture of experts: dispatching and combining the L·k routed token copies, 4 each way per element of
  h; the router's softmax over L·E;
* eager attention's s × s scores: scale r2 w2 and mask r2 w2 (fused into Megatron-LM's
  ``FusedScaleMaskSoftmax``), softmax r2 w2 (fp32 where the code upcasts: r2 w4 + r4 w2), dropout 5;
* embedding lookup 4 per element of h; the loss over the rank's L·V/t logits: forward 18 (``.float()``
  r2 w4, ``log_softmax`` two reads and a write in fp32), backward 22 (the gradient's fill, ``log_softmax``
  backward r8 w4, the cast back r4 w2), eager and fused alike.

**Under torch.compile** (``--compile``, :mod:`zerocalc.model.code.compiled`) the element-wise work between
a compiled block's extern kernels (its GEMMs, SDPA) runs as Inductor's fused kernels, each priced by the
buffers it reads and writes once. Measured from Inductor's generated code (torch 2.13, CPU backend: the
scheduler's fusion is the one the CUDA/Triton backend runs for this graph to first order; a torchtitan
v0.2.2 ``TransformerBlock`` at h 256, 4 heads of 64, 2 KV heads, f 768, fullgraph, forward and backward;
transformers' ``LlamaForCausalLM`` whole; docs/model.md, torch.compile): per element of the b·s·h rows,

* the attention norm one kernel r2 w2; the first residual add fused into the MLP norm, r4 w2 (the sum h
  is not written); the block's output, x + attention + MLP recomputed, r6 w2: 18 forward
  (:data:`COMPILED_BLOCK_FORWARD`); backward the MLP norm's kernel (its consumers' two input gradients,
  x, the attention output, the output gradient; w2) and the attention norm's (h's gradient, its three
  consumers' input gradients, x, and the MLP norm's weight gradient's re-reads of its consumers'
  gradients and of the attention output; w2): 16 + 2 per attention input projection + 4 per MLP one, 30
  for Llama (:data:`COMPILED_BLOCK_BACKWARD`); a dense block with two h-wide norms, else each norm a
  fused 4 and the residual adds as eager;
* SwiGLU forward r4 w2 = 6, backward r6 w4 = 10 (:data:`COMPILED_SWIGLU_BACKWARD`); no copy of the
  attention output (the flash kernel's output feeds the o projection as it is);
* rotary: transformers' ``rotate_half``: its ``cat`` into a buffer (w2, read back r2) and the product in
  place (r2 w2), 8 forward (:data:`COMPILED_ROTARY`), backward one kernel r2 w2 (4); torchtitan's complex
  product is not generated ("Torchinductor does not support code generation for complex operators",
  ``torch/_inductor/lowering.py``): its ``.float()`` r2 w4 and ``type_as`` r4 w2 kernels are, the product
  runs as ATen's r4 w4: 20, forward and backward alike;
* torchao's FP8 casts compiled (:mod:`zerocalc.compute.fp8`);
* the loss compiled (torchtitan's ``compile.components`` ``loss``, transformers' whole forward):
  ``cross_entropy(pred.float())`` as one kernel each way, forward one pass over the 16-bit logits (r2:
  Inductor's online softmax on CUDA, ``fx_passes/post_grad.py`` ``prepare_softmax_extra_check``; the CPU
  backend reads them twice), backward r2 w2 (:data:`COMPILED_LOSS_FORWARD`, :data:`COMPILED_LOSS_BACKWARD`);
* torchtitan compiles the blocks alone: its embedding, final norm and LM head stay eager; transformers'
  final norm is fused (4).

Kernel-launch overheads are not modelled, eager or compiled.

**The optimizer step** per parameter the rank's optimizer owns: ``torch.optim`` Adam/AdamW (foreach and
for-loop, ``_multi_tensor_adam``: weight decay ``mul_``, ``lerp_``, ``mul_``, ``addcmul_``, ``sqrt``,
``div_``, ``add_``, ``addcdiv_``) 4·p + 14·s + 2·g bytes (p the master parameter's, s a moment's, g the
gradient's bytes); a fused step (``fused=True``, DeepSpeed's and Megatron-LM's fused Adam) and other
optimizers one pass, reading parameter, gradient and states and writing parameter and states; plus the
16-bit copy of the updated fp32 master (r4 w2) where the framework keeps a separate master copy (the
precision record's ``master``: not under PyTorch's ``MixedPrecision``, whose fp32 parameters are updated in
place and cast on the next all-gather).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.compute.finetune import DORA_COMBINE_BYTES, DORA_NORM_BYTES, FineTuneOps
from zerocalc.compute.fp8 import HIGH_PRECISION, Fp8Gemms, InputFrom, cast_bytes, fp8_gemms
from zerocalc.model.activations import CpImpl
from zerocalc.model.architecture import (
    Architecture,
    MlpKind,
    NormKind,
    ParameterCount,
    QkNorm,
    TensorParallelRank,
    embedding_tensors,
    head_tensors,
    layer_tensors,
)
from zerocalc.model.code import Shape
from zerocalc.model.traits import traits
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.optimizers import OPTIMIZERS, OptimizerImpl, OptimizerName
from zerocalc.parallel.precision import Fp8RecipeName, TensorDtypes

FLASH_BACKWARD_FLOPS = 2.5
"""A fused attention's backward FLOPs over its forward's (Dao 2023, FlashAttention-2, §3.1.2)."""
BACKWARD_TRAFFIC = 2.0
"""An element-wise kernel's backward bytes over its forward's (see the module's doc)."""

EAGER_NORM = 36
FUSED_NORM = 4
EAGER_ROTARY = 20
FUSED_ROTARY = 4
OUTPUT_COPY = 4
RESIDUAL_ADD = 6
EAGER_DROPOUT = 5
FUSED_DROPOUT = 1
EAGER_SWIGLU = 10
FUSED_SWIGLU = 6
GELU = 4
TOKEN_PERMUTE = 4
EMBEDDING_LOOKUP = 4
LOSS_FORWARD = 18
LOSS_BACKWARD = 22
"""Bytes per element of each element-wise kernel (a 16-bit compute dtype; see the module's doc)."""

COMPILED_BLOCK_FORWARD = 18
"""A compiled block's norms and residual adds, forward, per element of the rank's b·s·h rows (see the
module's doc: 4 + 6 + 8)."""
COMPILED_BLOCK_BACKWARD = 16
"""The same backward, before the dgrads it reads: 2 per element of each of the norms' consumers' input
gradients, 4 per element of the MLP's for the second norm's weight gradient (see the module's doc)."""
COMPILED_ROTARY = 8
"""transformers' rotary compiled, forward, per element of q and k: ``rotate_half``'s ``cat`` written and read
back (w2 r2), ``q·cos + cat·sin`` in place (r2 w2); its backward one kernel r2 w2 (:data:`FUSED_ROTARY`)."""
COMPILED_SWIGLU_BACKWARD = 10
"""SwiGLU's compiled backward per element of f/t: r grad, gate, up; w their two gradients."""
COMPILED_LOSS_FORWARD = 2
COMPILED_LOSS_BACKWARD = 4
"""The compiled cross-entropy per logit: forward one online-softmax pass over the 16-bit logits (r2),
backward r2 w2."""


class OpClass(StrEnum):
    """What a step's compute time is broken into."""

    MATMUL = "matmul"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    """Norms, activations, residuals, rotary, dropout, casts, the loss: bound by memory bandwidth."""
    OPTIMIZER = "optimizer"


class Gemm(NamedTuple):
    """``count`` products C (m × n) = A (m × k) · B (k × n) in a forward pass."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1
    dgrad: bool = True
    """Its backward computes the input's gradient (not for an input that needs none: before the first
    tensor that requires grad, :mod:`zerocalc.compute.finetune`)."""
    wgrad: bool = True
    """Its backward computes the weight's gradient (not for a frozen weight)."""
    dtype: DType | None = None
    """Its inputs' dtype where it is not the micro-batch's (PEFT's fp32 adapters under bf16-pure)."""
    fp8: Fp8Gemms = HIGH_PRECISION
    """Which of its products run in FP8 (a weight an FP8 recipe converts: :mod:`zerocalc.compute.fp8`)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def backward_flops(self) -> float:
        """Its backward's products' FLOPs (each of the forward's)."""
        return self.flops * (self.dgrad + self.wgrad)

    def backward(self) -> tuple[Gemm, ...]:
        """The input gradient (m × n · n × k) and the weight gradient (k × m · m × n), those that run, each
        in FP8 where the recipe runs it so."""
        products = []
        if self.dgrad:
            products.append(
                Gemm(f"{self.name} dgrad", self.m, self.k, self.n, self.count, dtype=self.dtype,
                     fp8=Fp8Gemms(self.fp8.input_grad))
            )  # fmt: skip
        if self.wgrad:
            products.append(
                Gemm(f"{self.name} wgrad", self.k, self.n, self.m, self.count, dtype=self.dtype,
                     fp8=Fp8Gemms(self.fp8.weight_grad))
            )  # fmt: skip
        return tuple(products)


class Attention(NamedTuple):
    """One layer's attention core on one rank: ``heads`` query heads of ``seq_q`` queries over ``seq_kv``
    keys."""

    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    qk_dim: int
    v_dim: int
    causal: bool
    fused: bool
    """A flash kernel; else eager products and softmax."""

    @property
    def full_flops(self) -> float:
        """Q·Kᵀ and P·V over every score, forward."""
        return 2.0 * self.batch * self.heads * self.seq_q * self.seq_kv * (self.qk_dim + self.v_dim)

    @property
    def forward_flops(self) -> float:
        """Executed forward FLOPs: a fused causal kernel skips the masked half."""
        return self.full_flops / 2 if self.fused and self.causal else self.full_flops

    @property
    def scores(self) -> int:
        return self.batch * self.heads * self.seq_q * self.seq_kv

    def products(self) -> tuple[Gemm, Gemm]:
        """Eager attention's batched products: Q·Kᵀ (s_q × d · d × s_kv) and P·V (s_q × s_kv · s_kv × d_v)."""
        count = self.batch * self.heads
        return (
            Gemm("Q·Kᵀ", self.seq_q, self.seq_kv, self.qk_dim, count),
            Gemm("P·V", self.seq_q, self.v_dim, self.seq_kv, count),
        )


class Traffic(NamedTuple):
    """An element-wise kernel (or several of one size): ``nbytes`` read + written, ``count`` times."""

    name: str
    nbytes: int
    count: int = 1
    backward_nbytes: int | None = None
    """Its backward's bytes when they are not :data:`BACKWARD_TRAFFIC` × forward (the loss)."""

    @property
    def backward(self) -> int:
        return int(BACKWARD_TRAFFIC * self.nbytes) if self.backward_nbytes is None else self.backward_nbytes


class LayerOps(NamedTuple):
    """One layer's forward on one rank, and how many of the rank's layers are like it."""

    layers: int
    gemms: tuple[Gemm, ...]
    attention: Attention
    traffic: tuple[Traffic, ...]
    """Element-wise kernels outside the attention core."""
    core_traffic: tuple[Traffic, ...]
    """Eager attention's element-wise kernels over the scores (what selective recomputation re-runs)."""
    backward_runs: bool = True
    """False: nothing in or before the layer requires grad (a frozen layer before the first trained
    tensor): autograd runs no backward for it, and recomputation re-runs nothing."""


class MicroBatchOps(NamedTuple):
    """What one rank runs for one micro-batch, forward (backward and recomputation derive from it)."""

    layers: tuple[LayerOps, ...]
    outside_gemms: tuple[Gemm, ...]
    """The LM head."""
    outside_traffic: tuple[Traffic, ...]
    """Embedding, final norm, loss."""
    dtype: DType


class Kernels(NamedTuple):
    """How the model's code runs its element-wise work."""

    fused: bool
    """Fused kernels (Megatron-LM, Transformer Engine); else eager PyTorch ops."""
    flash: bool
    """Attention through a fused (flash) kernel."""
    compiled: bool = False
    """The transformer blocks run under torch.compile (Inductor's fused kernels: see the module's doc)."""
    compiled_head: bool = False
    """The final norm too (transformers' whole-forward compile; torchtitan's stays eager)."""
    compiled_loss: bool = False
    """The loss runs under torch.compile."""
    complex_rotary: bool = False
    """The rotary embedding is a complex product (torchtitan's ``apply_rotary_emb``), which Inductor does
    not generate code for: compiled, it runs as eager."""


def _compiled_region(
    arch: Architecture, index: int, tensors: list, kernels: Kernels, rows: int
) -> tuple[int, int] | None:
    """(forward, backward) bytes of a compiled dense block's two h-wide norms and two residual adds, as
    Inductor fuses them (see the module's doc), at 16-bit; None where the block is not compiled, is a
    mixture-of-experts layer or has other than two such norms (each norm then a fused 4, the residual adds
    as eager)."""
    if not kernels.compiled or arch.is_moe_layer(index):
        return None
    h = arch.hidden_size
    norms = [
        t
        for t in tensors
        if len(t.shape) == 1 and t.name == "weight" and "norm" in t.module and t.shape[0] == h
        and not t.module.rsplit(".", 1)[-1].startswith(("q_norm", "k_norm"))
    ]  # fmt: skip
    if len(norms) != 2:
        return None
    matrices = [t.module for t in tensors if len(t.shape) == 2 and t.name == "weight"]
    attention = [m for m in matrices if ".attn." in m][:-1]  # the norm's consumers: every input projection
    mlp = [m for m in matrices if ".mlp." in m][:-1]
    backward = COMPILED_BLOCK_BACKWARD + 2 * len(attention) + 4 * len(mlp)
    return COMPILED_BLOCK_FORWARD * rows * h, backward * rows * h


def _norm_bytes(arch: Architecture, fused: bool) -> int:
    if fused or arch.norm is NormKind.LAYERNORM:
        return FUSED_NORM
    return EAGER_NORM


_LATENT_SEQUENCE_SHARDED = frozenset({"q_a_proj", "kv_a_proj", "q_a_norm", "kv_a_norm"})


def _latent_sequence_sharded(arch: Architecture) -> frozenset[str]:
    """The latent-attention modules that run on the rank's sequence shard (b·s/(c·t) rows under sequence
    parallelism) rather than on the tensor-parallel region's b·s/c: the q/kv down projections and norms
    under Megatron-LM (``core/transformer/multi_latent_attention.py`` ``MLASelfAttention``, d98e8a6: the
    duplicated ``TELinear`` down projections take the [s/t, b, h] hidden states and
    ``TELayerNormColumnParallelLinear`` norms the latents before it gathers them), the one code whose
    latent attention under TP is modelled (its record's ``latent_attention_tp``; the others are refused)."""
    return _LATENT_SEQUENCE_SHARDED if arch.latent_attention is not None else frozenset()


def _layer_ops(
    arch: Architecture,
    index: int,
    shape: Shape,
    layers: int,
    kernels: Kernels,
    ep: int,
    act: int,
    tuning: FineTuneOps | None = None,
    dtype: DType = DType.BF16,
    fp8: Fp8Setting = NO_FP8,
) -> LayerOps:
    tp = arch.tp if isinstance(arch, TensorParallelRank) else 1
    tokens, rows = shape.local_tokens, shape.sequence_tokens
    h = arch.hidden_size
    heads, kv_heads = math.ceil(arch.num_heads / tp), math.ceil(arch.kv_heads / tp)
    mla = arch.latent_attention
    qk_dim = mla.qk_head_dim if mla is not None else arch.dim_per_head
    v_dim = mla.v_head_dim if mla is not None else arch.dim_per_head
    scale = act / 2  # the byte counts are for a 16-bit compute dtype
    gemms: list[Gemm] = []
    traffic: list[Traffic] = []
    norm = _norm_bytes(arch, kernels.fused or kernels.compiled)
    family = traits(arch)
    tensors = layer_tensors(arch, index)
    matrices = [
        t.module for t in tensors if len(t.shape) == 2 and t.name == "weight" and ".attn." in t.module
    ]
    inputs = set(matrices[:-1])  # the attention's input projections: every matrix but the output one
    grad_in = tuning is None or tuning.grad_in(index)
    latent_rows = _latent_sequence_sharded(arch)
    region = _compiled_region(arch, index, tensors, kernels, rows)
    mlp_inputs = [
        t.module for t in tensors if len(t.shape) == 2 and t.name == "weight" and ".mlp." in t.module
    ]
    # what writes each Linear's input in a compiled block (where an FP8 cast of it runs)
    sources: dict[str, InputFrom] = {}
    # under TP a norm's output is all-gathered before its Linears: torchao casts it first (fused into the
    # norm) with tensorwise scaling (Float8ColwiseParallel), after the all-gather with the others
    gathered = tp > 1 and shape.sequence_parallel and fp8.recipe is not Fp8RecipeName.TENSORWISE
    if region is not None:
        sources = dict.fromkeys(
            inputs | set(mlp_inputs[:-1]), InputFrom.SAVED if gathered else InputFrom.NORM
        )
        if arch.mlp is MlpKind.SWIGLU and mlp_inputs:
            sources[mlp_inputs[-1]] = InputFrom.SWIGLU
    if region is not None:
        traffic.append(Traffic("norms and residual adds (compiled)", int(region[0] * scale), 1,
                               int(region[1] * scale)))  # fmt: skip
    for tensor in tensors:
        leaf = tensor.module.rsplit(".", 1)[-1]
        m = rows if leaf in latent_rows else tokens
        if len(tensor.shape) == 3:  # routed experts [E or E/e, out, in]
            _, out, inner = tensor.shape
            local, received = expert_load(arch, shape, ep)
            if out and inner:
                gemms.append(Gemm(f"experts.{tensor.name}", math.ceil(received / local), out, inner, local))
        elif len(tensor.shape) == 2 and tensor.name == "weight":
            out, inner = tensor.shape
            if out and inner and tuning is not None:
                needs = grad_in or tensor.module not in inputs
                linear = tuned_linear(tuning, tensor.module, leaf, m, out, inner, needs, dtype)
                gemms += linear[0]
                traffic += linear[1]
            elif out and inner:
                gemms.append(
                    _linear(leaf, m, out, inner, fp8 if fp8.converts(tensor) else NO_FP8, traffic,
                            kernels.compiled, sources.get(tensor.module, InputFrom.SAVED), rows)
                )  # fmt: skip
        elif len(tensor.shape) == 1 and tensor.name == "weight" and "norm" in leaf:
            width = tensor.shape[0]
            if leaf in ("q_norm", "k_norm") and arch.qk_norm is QkNorm.PER_HEAD:
                width *= heads if leaf == "q_norm" else kv_heads
            elif leaf in ("q_norm", "k_norm"):
                width = math.ceil(width / tp)
            norm_rows = rows if width == h or leaf in latent_rows else tokens
            if region is None or width != h:
                traffic.append(Traffic(leaf, int(norm * scale * norm_rows * width)))
    if family.rotary:
        rotated = tokens * (heads + kv_heads) * qk_dim * family.rotary_fraction
        if mla is not None:
            rotated = tokens * (heads + 1) * mla.qk_rope_head_dim
        if kernels.compiled:  # the complex product's three eager kernels, or rotate_half's cat and product
            forward = EAGER_ROTARY if kernels.complex_rotary else COMPILED_ROTARY
            backward = EAGER_ROTARY if kernels.complex_rotary else FUSED_ROTARY
            traffic.append(
                Traffic("rotary", int(forward * scale * rotated), 1, int(backward * scale * rotated))
            )
        else:
            per = FUSED_ROTARY if kernels.fused else EAGER_ROTARY
            traffic.append(Traffic("rotary", int(per * scale * rotated)))
    if kernels.flash and not kernels.fused and not kernels.compiled:
        traffic.append(Traffic("attention output copy", int(OUTPUT_COPY * scale * tokens * heads * v_dim)))
    if region is None:
        traffic.append(Traffic("residual add", int(RESIDUAL_ADD * scale * rows * h), 2))
    if arch.residual_dropout > 0:
        per = FUSED_DROPOUT if kernels.fused or kernels.compiled else EAGER_DROPOUT
        traffic.append(Traffic("residual dropout", int(per * scale * rows * h), 2))
    traffic += _mlp_traffic(arch, index, shape, ep, tp, kernels, scale)
    seq_q = tokens // shape.b
    if shape.cp > 1 and shape.cp_impl is CpImpl.ULYSSES:  # heads scattered over the CP ranks, whole sequence
        heads, seq_q = math.ceil(heads / shape.cp), shape.s
    attention = Attention(shape.b, heads, seq_q, shape.s, qk_dim, v_dim, True, kernels.flash)
    backward = tuning is None or tuning.backward_runs(index)
    return LayerOps(
        layers,
        tuple(gemms),
        attention,
        tuple(traffic),
        _core_traffic(arch, attention, kernels, scale),
        backward,
    )


def _linear(
    name: str,
    m: int,
    n: int,
    k: int,
    fp8: Fp8Setting,
    traffic: list[Traffic],
    compiled: bool = False,
    source: InputFrom = InputFrom.SAVED,
    norm_rows: int | None = None,
) -> Gemm:
    """A Linear's product; under an FP8 recipe that converts its weight, its FP8 products and (into
    ``traffic``) the casts feeding them (:mod:`zerocalc.compute.fp8`; ``compiled``: under torch.compile,
    ``source``: what writes its input there, ``norm_rows``: the rows a norm writing it runs on)."""
    if fp8.on:
        forward, backward = cast_bytes(m, n, k, fp8, compiled, source, norm_rows)
        traffic.append(Traffic(f"{name} fp8 casts", forward, 1, backward))
    return Gemm(name, m, n, k, fp8=fp8_gemms(fp8))


def expert_load(arch: Architecture, shape: Shape, ep: int = 1) -> tuple[int, int]:
    """(the rank's routed experts per MoE layer, the token copies they compute per micro-batch): E/e
    experts (e the rank's expert-parallel degree: an expert-parallel rank's own, else ``ep``) and
    :meth:`~zerocalc.model.code.Shape.expert_rows` of the rank's k·L routed copies (L = b·s/c), the
    capacity factor's multiple on the busiest rank under expert parallelism."""
    if isinstance(arch, TensorParallelRank) and arch.ep > 1:
        ep = arch.ep
    local = max(1, arch.num_experts // ep)
    pairs = expert_tokens(arch, shape) * arch.experts_per_token
    return local, shape._replace(ep=ep).expert_rows(pairs)


def expert_tokens(arch: Architecture, shape: Shape) -> int:
    """The tokens whose routed copies reach one rank's expert GEMMs: L = b·s/c, and under tensor and
    sequence parallelism the rank's own L/t gathered over its ETP expert-tensor-parallel ranks, L·ETP/t
    (Megatron-LM core 0.20.0 ``MoEAlltoAllTokenDispatcher``: each TP rank routes its sequence shard, the
    EP all-to-all brings k·L/t copies, ``dispatch_postprocess`` gathers them over ``expt_tp``; L at
    ETP = t, as before)."""
    tokens = shape.local_tokens
    if shape.tp == 1 or not shape.sequence_parallel or not isinstance(arch, TensorParallelRank):
        return tokens
    return tokens // shape.tp * arch.etp


def _mlp_traffic(
    arch: Architecture, index: int, shape: Shape, ep: int, tp: int, kernels: Kernels, scale: float
) -> list[Traffic]:
    """The MLP's activation (and, for experts, the routing and the tokens' dispatch and combine)."""
    tokens = shape.local_tokens
    swiglu = arch.mlp is MlpKind.SWIGLU
    per = (FUSED_SWIGLU if kernels.fused or kernels.compiled else EAGER_SWIGLU) if swiglu else GELU
    back = COMPILED_SWIGLU_BACKWARD if kernels.compiled and swiglu else None

    def activation(name: str, elements: int) -> Traffic:
        backward = None if back is None else int(back * scale * elements)
        return Traffic(name, int(per * scale * elements), 1, backward)

    if not arch.is_moe_layer(index):
        width = math.ceil((arch.dense_intermediate_size or arch.intermediate_size) / tp)
        return [activation("MLP activation", tokens * width)]
    routed = expert_tokens(arch, shape) * arch.experts_per_token
    received = expert_load(arch, shape, ep)[1]
    etp = arch.etp if isinstance(arch, TensorParallelRank) else tp
    out = [
        activation("experts' activation", received * math.ceil(arch.intermediate_size / etp)),
        Traffic("router softmax", int(4 * scale * tokens * arch.num_experts)),
        Traffic("token dispatch and combine", int(TOKEN_PERMUTE * scale * routed * arch.hidden_size), 2),
    ]
    if arch.num_shared_experts:
        width = arch.num_shared_experts * (arch.shared_expert_intermediate_size or arch.intermediate_size)
        out.append(activation("shared experts' activation", tokens * math.ceil(width / tp)))
    return out


def tuned_linear(
    tuning: FineTuneOps,
    module: str,
    leaf: str,
    rows: int,
    out: int,
    inner: int,
    input_grad: bool,
    activation: DType,
) -> tuple[list[Gemm], list[Traffic]]:
    """The products and element-wise kernels of one Linear ``module`` (``rows`` × ``inner`` → ``out``) in a
    fine-tuning run (:mod:`zerocalc.compute.finetune`); ``input_grad``: its input requires grad."""
    how = tuning.linear(module)
    gemms = [Gemm(leaf, rows, out, inner, dgrad=input_grad, wgrad=how.trained)]
    traffic: list[Traffic] = []
    if how.dequant_bytes:
        traffic.append(
            Traffic(f"{leaf} dequantize", how.dequant_bytes, 1, how.dequant_bytes if input_grad else 0)
        )
    if not how.rank:
        return gemms, traffic
    r, dtype, scale = how.rank, tuning.lora_dtype, activation.bytes / 2
    gemms += [
        Gemm(f"{leaf} lora_A", rows, r, inner, dgrad=input_grad, dtype=dtype),
        Gemm(f"{leaf} lora_B", rows, out, r, dtype=dtype),
    ]
    if tuning.lora_cast_bytes:
        traffic.append(Traffic(f"{leaf} LoRA input cast", tuning.lora_cast_bytes * rows * inner))
    if tuning.dropout:
        traffic.append(Traffic(f"{leaf} LoRA dropout", int(EAGER_DROPOUT * dtype.bytes / 2 * rows * inner)))
    b, a = dtype.bytes, activation.bytes
    promoted = max(a, b)
    # ``* scaling`` (r b, w b), ``result + …`` (r a + b, w promoted), ``.to(torch_result_dtype)``
    add = 2 * b + a + b + promoted + (promoted + a if promoted != a else 0)
    traffic.append(Traffic(f"{leaf} LoRA scale and add", add * rows * out))
    if tuning.dora:
        gemms.append(Gemm(f"{leaf} DoRA weight", out, inner, r, dgrad=False, wgrad=False, dtype=dtype))
        norm = int(DORA_NORM_BYTES * scale * out * inner) + how.dequant_bytes
        traffic += [
            Traffic(f"{leaf} DoRA weight norm", norm, 1, 0),
            Traffic(f"{leaf} DoRA combine", int(DORA_COMBINE_BYTES * scale * rows * out)),
        ]
        if tuning.dropout:
            gemms.append(Gemm(f"{leaf} DoRA base", rows, out, inner, dgrad=input_grad, wgrad=False))
    return gemms, traffic


def _core_traffic(
    arch: Architecture, attention: Attention, kernels: Kernels, scale: float
) -> tuple[Traffic, ...]:
    """Eager attention's element-wise kernels over the b·(a/t)·s_q·s_kv scores."""
    if attention.fused:
        return ()
    scores = attention.scores
    fp32_softmax = traits(arch).eager_softmax_fp32 and not kernels.fused
    out = [
        Traffic("scale and mask", int((4 if kernels.fused else 8) * scale * scores)),
        Traffic("softmax", int((12 if fp32_softmax else 4) * scale * scores)),
    ]
    if arch.attention_dropout > 0:
        out.append(Traffic("attention dropout", int(EAGER_DROPOUT * scale * scores)))
    return tuple(out)


def micro_batch_ops(
    arch: Architecture,
    shape: Shape,
    kernels: Kernels,
    dtype: DType,
    ep: int = 1,
    tuning: FineTuneOps | None = None,
    fp8: Fp8Setting = NO_FP8,
) -> MicroBatchOps:
    """The forward of one micro-batch on one rank holding ``arch`` (a pipeline stage's share: its layers,
    the embedding where it holds it, the final norm, LM head and loss where it holds them); ``tuning``: a
    fine-tuning run's frozen, adapted and quantised Linears (:mod:`zerocalc.compute.finetune`);
    ``fp8``: the FP8 recipe its converted Linear weights run."""
    indices = range(arch.num_layers)
    act = dtype.bytes
    groups: dict[tuple, list[int]] = {}
    for index in indices:
        groups.setdefault((arch.is_moe_layer(index), *_tuning_key(arch, index, tuning)), []).append(index)
    layer_ops = tuple(
        _layer_ops(arch, members[0], shape, len(members), kernels, ep, act, tuning, dtype, fp8)
        for members in groups.values()
    )
    tokens, rows, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
    scale = act / 2
    gemms: list[Gemm] = []
    traffic: list[Traffic] = []
    lookups = len(embedding_tensors(arch))
    if lookups:
        traffic.append(Traffic("embedding", int(EMBEDDING_LOOKUP * scale * tokens * h), lookups))
        if arch.learned_position_embeddings:
            traffic.append(Traffic("position add", int(RESIDUAL_ADD * scale * tokens * h)))
    head = head_tensors(arch)
    if head:
        final = _norm_bytes(arch, kernels.fused or kernels.compiled_head)
        traffic.append(Traffic("final norm", int(final * scale * rows * h)))
        matrix = next((t for t in head if t.module == "lm_head"), None)
        if matrix is None:  # tied: the embedding's matrix
            matrix = next(t for t in embedding_tensors(arch) if t.module == "embed_tokens")
        vocab = matrix.shape[0]
        if tuning is not None:
            head_gemms, head_traffic = tuned_linear(
                tuning, matrix.module, "lm_head", tokens, vocab, h, True, dtype
            )
            gemms += head_gemms
            traffic += head_traffic
        else:
            gemms.append(
                _linear("lm_head", tokens, vocab, h, fp8 if fp8.converts(matrix) else NO_FP8, traffic,
                        kernels.compiled_head)
            )  # fmt: skip
        logits = tokens * vocab
        if kernels.compiled_loss:
            loss = Traffic("loss", COMPILED_LOSS_FORWARD * logits, 1, COMPILED_LOSS_BACKWARD * logits)
            traffic.append(loss)
        else:
            traffic.append(Traffic("loss", LOSS_FORWARD * logits, 1, LOSS_BACKWARD * logits))
    return MicroBatchOps(layer_ops, tuple(gemms), tuple(traffic), dtype)


def _tuning_key(arch: Architecture, index: int, tuning: FineTuneOps | None) -> tuple:
    """What sets layer ``index``'s operations apart under ``tuning`` (its layers group by it)."""
    if tuning is None:
        return ()
    linears = tuple(
        tuning.linear(t.module)
        for t in layer_tensors(arch, index)
        if len(t.shape) == 2 and t.name == "weight"
    )
    return linears, tuning.grad_in(index), tuning.backward_runs(index)


def optimizer_bytes_per_param(
    optimizer: OptimizerName, impl: OptimizerImpl, dtypes: TensorDtypes, grad_dtype: DType
) -> int:
    """Bytes read + written per parameter the rank's optimizer owns, per step (see the module's doc), in
    the precision record's dtypes: the parameters it updates (the master copy, else the stored ones), and
    with a separate master copy the 16-bit parameters written back from it."""
    updated = dtypes.master or dtypes.stored
    p, g = updated.bytes, grad_dtype.bytes
    assert dtypes.optimizer_state is not None  # trained parameters
    states = OPTIMIZERS[optimizer].state_bytes(1024, dtypes.optimizer_state)
    s = sum(states.values()) / 1024  # bytes per parameter of every state
    if optimizer in (OptimizerName.ADAM, OptimizerName.ADAMW) and impl is not OptimizerImpl.FUSED:
        moment = s / 2
        total = (4 if optimizer is OptimizerName.ADAMW else 2) * p + 14 * moment + 2 * g
    else:
        total = 2 * p + g + 2 * s
    if dtypes.master is not None:
        total += dtypes.master.bytes + dtypes.stored.bytes
    return math.ceil(total)


MFU_FORMULA = (
    "MFU = tokens/s/GPU × (6·P + 3·L·a·(d_qk + d_v)·s) / the GPU's dense bf16 peak: P the matmul "
    "parameters a token uses, L layers, a heads, s the sequence; causal attention at half its s² work "
    "(Megatron-LM num_floating_point_operations)"
)
"""How the MFU is counted, said under every table that prints it and in the JSON field's description."""


MFU_FINETUNE = (
    "fine-tuning: 6 FLOPs per trained matmul parameter (adapters included), 4 per frozen one (forward and "
    "input gradient, no weight gradient)"
)
"""What a fine-tuning run's model FLOPs count (:func:`model_flops_per_token` with ``frozen`` and
``adapters``), said under its table."""


def model_flops_per_token(
    arch: Architecture, count: ParameterCount, seq_len: int, frozen: float = 0.0, adapters: int = 0
) -> float:
    """Model FLOPs per token, forward and backward, what MFU counts (:data:`MFU_FORMULA`): ``6·P`` for the
    matmuls (PaLM, Chowdhery et al. 2022, app. B: P the parameters a token's matmuls use, active parameters
    for MoE; the input embedding is a lookup, not a matmul, a tied LM head counted once) and the attention
    core of a causal mask at half its s² work, ``3·L·a·(d_qk + d_v)·s`` (Megatron-LM
    ``megatron/training/training.py`` ``num_floating_point_operations``, d98e8a6: the core-attention term
    ``3 · 2 · (a·d) / 2 · 2`` per token and key for MHA, ``/ 2`` for the causal mask; for latent attention
    ``3 · 2 · (a·d_qk/2 + a·d_v/2)``, d_qk the nope and rope dimensions together). For MHA (d_qk = d_v = d)
    that is ``6·L·H·Q·T``, half PaLM's ``12·L·H·Q·T``, which counts the masked half of every product.

    A fine-tuning run counts what its method needs (:data:`MFU_FINETUNE`): ``frozen`` of the matmul
    parameters a token uses are frozen, 4 FLOPs each (forward, input gradient: no weight gradient is
    needed), and its ``adapters`` (LoRA's A and B) 6 each; the input gradients a run skips before its first
    trained tensor and the dequantisation are not model FLOPs (the step time prices what runs)."""
    matmul = count.active_per_token - count.embedding + adapters
    if arch.tied_embeddings:
        matmul += arch.vocab_size * arch.hidden_size
    mla = arch.latent_attention
    qk_dim = mla.qk_head_dim if mla is not None else arch.dim_per_head
    v_dim = mla.v_head_dim if mla is not None else arch.dim_per_head
    return 6.0 * matmul - 2.0 * frozen + 3.0 * arch.num_layers * arch.num_heads * (qk_dim + v_dim) * seq_len
