"""``megatron``: Megatron-LM's fused kernels, as Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", §4.1, Table 2) account for them, op by op (:mod:`zerocalc.model.activations`).

Under tensor parallelism (Korthikanti et al. 2022 §4.2.2; Megatron-LM ``core/tensor_parallel/layers.py``)
the column-parallel linears keep their s/t-sharded input under sequence parallelism and all-gather it again
in backward.
"""

from __future__ import annotations

from zerocalc.model.activations import ActivationShape, CpImpl, layer_terms
from zerocalc.model.architecture import Architecture, MlpKind, NormKind
from zerocalc.model.code.base import (
    INT64,
    AttentionKernel,
    Device,
    LayerSaves,
    ModelCode,
    ModelImplName,
    Program,
    Saves,
    Transient,
    Ulysses,
)
from zerocalc.model.code.parallel import head_widths
from zerocalc.model.code.shape import Shape


class MegatronCode(ModelCode):
    """Megatron-LM with Transformer Engine, in the paper's accounting: the layers' terms of Table 2, no
    tensors outside them but the final norm's and the LM head's inputs, and no in-layer transients but
    what its parallelism holds."""

    name = ModelImplName.MEGATRON
    title = "Megatron-LM (fused kernels)"
    library = "Megatron-LM"
    source = (
        "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, "
        "§4.1, Table 2"
    )
    norm_fp32_copy = False
    kv_cache_copies = False
    embedding_output_alive = False
    transformers_modules = False
    loss = "fp32_logits"
    """``core/tensor_parallel/cross_entropy.py``: the logits' fp32 copy becomes the softmax and then the
    gradient, in place."""
    loss_savers = False
    """Megatron-LM's vocab-parallel cross-entropy is its own (``--cross-entropy-loss-fusion``: not
    modelled)."""
    transients = False
    """Korthikanti et al. count none."""
    fused_kernels = True
    """Megatron-LM / Transformer Engine's fused norms, ``bias_swiglu``, ``FusedScaleMaskSoftmax`` and the
    bias-dropout-add."""
    sequence_parallel = True
    ulysses = Ulysses.SPLITS_KV
    """Transformer Engine's ``AttnFuncWithCPAndQKVOA2A`` splits k and v by heads too."""
    sharded_logits = True
    """The output layer is a ``ColumnParallelLinear`` over the padded vocabulary, V/t columns, and
    ``core/tensor_parallel/cross_entropy.py``'s ``_VocabParallelCrossEntropy`` works on them."""
    pads_vocab = True
    """``make_vocab_size_divisible_by`` · t, 128·t by default
    (``core/tokenizers/utils/build_tokenizer.py::vocab_size_with_padding``)."""
    loss_parallel_fp32_copies = 0
    """The vocab-parallel cross-entropy works in place on its fp32 copy (``calculate_predicted_logits``,
    ``calculate_gradients``): nothing more."""
    saves_received_input = True
    """``TransformerBlock.set_input_tensor``; the schedule keeps the received tensor for its gradient
    (``schedules.py`` ``input_tensors``)."""
    op_sac_memory = False

    def default_attention(self, arch: Architecture) -> tuple[AttentionKernel, str]:
        """Korthikanti et al. 2022's accounting (Table 2) keeps the softmax and its dropout for GPT
        (LayerNorm + GELU); the gated RMSNorm families run Megatron-LM's fused attention: flash."""
        if arch.mlp is MlpKind.SWIGLU and arch.norm is NormKind.RMSNORM:
            return AttentionKernel.FLASH, "Megatron-LM fused attention (gated RMSNorm families)"
        return AttentionKernel.EAGER, "Korthikanti et al. 2022, Table 2: softmax and dropout kept"

    def layer(
        self,
        arch: Architecture,
        index: int,
        shape: Shape,
        act: int,
        device: Device,
        use_cache: bool,
        flash: bool,
    ) -> LayerSaves:
        """Korthikanti et al. 2022 §4.1, Table 2, op by op (:func:`zerocalc.model.activations.layer_terms`),
        per rank; the paper counts 16-bit activations, scaled to ``act``."""
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
                latent=arch.latent_attention,
            )
        )
        scale = act / 2  # Korthikanti counts 16-bit activations
        return LayerSaves(
            saved=tuple((name, int(b * scale)) for name, b in terms.items()),
            keeps_input=False,
            forward_excess=0,
            backward_excess=0,
        )

    def forward_program(
        self,
        arch: Architecture,
        index: int,
        shape: Shape,
        act: int,
        copies: bool,
        flash: bool,
        saved: tuple[tuple[str, int], ...],
        device: Device,
    ) -> Program:
        """Not written out: the paper's terms at once."""
        return ()

    def shared_saves(
        self, arch: Architecture, shape: Shape, act: int, checkpointed: bool, device: Device
    ) -> Saves:
        """None: the paper counts the layers' activations only."""
        return []

    def final_saves(self, arch: Architecture, shape: Shape, act: int, device: Device) -> Saves:
        """The final norm's input and the LM head's input, R rows each: the LM head is column-parallel and
        keeps its sequence-sharded input under sequence parallelism (gathered again in backward)."""
        R, h = shape.sequence_tokens, arch.hidden_size
        return [("final norm input", act * R * h), ("LM head input", act * R * h)]

    def embedding_excess(self, arch: Architecture, shape: Shape, act: int) -> int:
        """``VocabParallelEmbedding.forward`` (``core/tensor_parallel/layers.py``) keeps the masked ids
        (int64) and the mask (bool) while the L × h partial output exists; under sequence parallelism
        ``transpose(0, 1).contiguous()`` copies it (no copy at b = 1) before the reduce-scatter to R rows;
        without, the all-reduce runs in place on the output itself."""
        if shape.tp == 1:
            return 0
        L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
        ids = (INT64 + 1) * L
        if R == L:
            return ids
        peak_rows = 2 * L if shape.b > 1 else L + R
        return ids + act * (peak_rows - R) * h

    def tensor_parallel_unsupported(self, arch: Architecture, shape: Shape) -> str | None:
        """Megatron-LM's layers split every architecture modelled here."""
        return None

    def tensor_parallel_transients(self, arch: Architecture, shape: Shape, act: int) -> tuple[Transient, ...]:
        """With sequence parallelism (TE ``Linear``/``LayerNormLinear``, Megatron
        ``LinearWithGradAccumulationAndAsyncCommunication``): forward, the all-gathered L × h input of a
        column-parallel linear (the row-parallel partial output before its reduce-scatter is as large, at
        another moment); backward, the input gathered again and the L × h input gradient before its
        reduce-scatter. Without sequence parallelism the all-reduces run in place: nothing. Derived from the
        source, not measured."""
        L, R, h = shape.local_tokens, shape.sequence_tokens, arch.hidden_size
        if R == L:
            return ()
        both = "input gathered again, input gradient before its reduce-scatter"
        return (
            Transient("forward", "all-gathered input of a column-parallel linear", act * L * h),
            Transient("backward", both, 2 * act * L * h),
        )

    def context_parallel_transients(
        self, arch: Architecture, shape: Shape, act: int
    ) -> tuple[Transient, ...]:
        """Transformer Engine ``attention/dot_product_attention/context_parallel.py``, with
        kv = 2·act·L·h_kv/t the rank's K and V: ring (``AttnFuncWithCPAndKVP2P``) keeps every step's K/V
        buffer in ``p2p_comm_buffers`` until the forward returns (c·kv) and in backward two buffers of K/V
        with dK/dV (4·kv) and dq; all-gather (``AttnFuncWithCPAndKVAllGather``) gathers K and V and
        reorders them for causal load balance (3c/2·kv), and in backward adds dK, dV over the whole sequence
        (c·kv) and dq. Derived from the source, not measured."""
        L, c = shape.local_tokens, shape.cp
        q_width, kv_width = head_widths(arch, shape)
        kv = 2 * act * L * kv_width
        dq = act * L * q_width
        if shape.cp_impl is CpImpl.RING:
            return (
                Transient("forward", "K/V buffer of every ring step", c * kv),
                Transient("backward", "two K/V + dK/dV ring buffers, dq", 4 * kv + dq),
            )
        both = "dK/dV over s, all-gathered K/V reordered, dq"
        return (
            Transient("forward", "all-gathered K/V and its causal reordering", 3 * c * kv // 2),
            Transient("backward", both, 5 * c * kv // 2 + dq),
        )


MEGATRON = MegatronCode()
