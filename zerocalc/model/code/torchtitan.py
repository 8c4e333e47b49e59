"""``torchtitan``: torchtitan's Llama (``models/llama3/model.py``: ``nn.RMSNorm``, SDPA, SwiGLU;
``components/loss.py::cross_entropy_loss``), derived from the source.

Under tensor parallelism (v0.2.2 ``models/llama3/infra/parallelize.py::apply_tp``: ``attention_norm`` /
``ffn_norm`` ``SequenceParallel``, ``PrepareModuleInput`` Shard(1) → Replicate before ``attention`` and
``feed_forward``, wq/wk/wv/w1/w3 ``ColwiseParallel``, wo/w2 ``RowwiseParallel(output_layouts=Shard(1))``;
sequence parallelism always goes with TP) the column-parallel linears keep the all-gathered Replicate input,
L·h, and do not gather it again. Measured once on CPU (torch 2.13, gloo, world 2, a Llama block under this
plan with ``saved_tensors_hooks``): the attention and MLP inputs are saved whole ([b·s, h]), q, k, v, the
attention output, log-sum-exp and the f-wide tensors with a/t, kv/t, f/t columns, the norms' tensors with
s/t rows.
"""

from __future__ import annotations

from zerocalc.model.architecture import Architecture
from zerocalc.model.code.attention import SDPA_NO_MASK
from zerocalc.model.code.base import (
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
from zerocalc.model.code.layer import module_layer
from zerocalc.model.code.outside import module_final_saves, module_shared_saves
from zerocalc.model.code.parallel import dense_plan_unsupported, torch_context_parallel_transients
from zerocalc.model.code.shape import Shape


class TorchtitanCode(ModelCode):
    """torchtitan's Llama, its parallelisms applied by ``parallelize_llama``."""

    name = ModelImplName.TORCHTITAN
    title = "torchtitan Llama"
    library = "torchtitan (main, 2026)"
    source = (
        "torchtitan models/llama3/model.py (nn.RMSNorm, SDPA, SwiGLU), "
        "components/loss.py cross_entropy_loss (pred.float())"
    )
    norm_fp32_copy = False
    """``nn.RMSNorm`` on CUDA is the fused ``_fused_rms_norm``: its input and rstd only."""
    kv_cache_copies = False
    embedding_output_alive = False
    transformers_modules = False
    loss = "float_cross_entropy"
    """``cross_entropy_loss``: ``pred.float()``, then cross-entropy."""
    loss_savers = False
    """torchtitan builds its own head and loss (``cross_entropy_loss``): modelled with its own only."""
    transients = True
    """Derived from the source, as transformers' measured ones (the same aten ops)."""
    fused_kernels = False
    sequence_parallel = True
    ulysses = Ulysses.NONE
    """``context_parallel_rotate_method``: ring (``alltoall``) or all-gather K/V only."""
    sharded_logits = True
    """``output`` is ``ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))`` under
    ``loss_parallel`` (v0.2.2 ``apply_tp``; the default unless ``disable_loss_parallel``): a Shard(-1)
    chunk, ⌈V/t⌉ columns on the first ranks."""
    pads_vocab = False
    loss_parallel_fp32_copies = 1
    """torch ``distributed/tensor/parallel/loss.py``: ``_log_softmax`` keeps ``shifted = x - max`` while it
    computes ``exp(shifted)`` and then ``shifted - logsumexp``; ``_nll_loss_and_log_softmax_backward``
    computes ``(zeros_like(x) + exp(x)) * grad_output`` beside the saved ``x``. Traced on CPU (torch 2.13,
    gloo, world 2): the bf16 logits and 3 fp32 shards at the forward peak, 4 at the backward peak, against 2
    and 3 without ``loss_parallel``."""
    saves_received_input = False
    op_sac_memory = True
    """The policy (``distributed/activation_checkpoint.py::_apply_op_sac``) was written for this code."""

    def default_attention(self, arch: Architecture) -> tuple[AttentionKernel, str]:
        """``models/llama3/model.py`` calls ``F.scaled_dot_product_attention(..., is_causal=True)``:
        flash."""
        return AttentionKernel.FLASH, f"torchtitan models/llama3/model.py: {SDPA_NO_MASK}"

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
        """The modules' saved tensors (:func:`~zerocalc.model.code.layer.module_layer`)."""
        return module_layer(self, arch, index, shape, act, device, use_cache, flash)

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
        """Not written out: the saved tensors at once, then the layer's excess."""
        return ()

    def shared_saves(
        self, arch: Architecture, shape: Shape, act: int, checkpointed: bool, device: Device
    ) -> Saves:
        """The rotary tables (:func:`~zerocalc.model.code.outside.module_shared_saves`)."""
        return module_shared_saves(arch, shape, act, checkpointed, device)

    def final_saves(self, arch: Architecture, shape: Shape, act: int, device: Device) -> Saves:
        """The final norm's tensors and the LM head's all-gathered input (``ColwiseParallel(input_layouts=
        Shard(1))``; :func:`~zerocalc.model.code.outside.module_final_saves`)."""
        return module_final_saves(self, arch, shape, act, device)

    def embedding_excess(self, arch: Architecture, shape: Shape, act: int) -> int:
        """``tok_embeddings`` is ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``: the
        local lookup gives a partial sum of L × h, which ``Partial`` → ``Shard(1)`` reduce-scatters after
        ``reduce_scatter_single``'s contiguous copy: 2·act·L·h (traced on CPU, torch 2.13, gloo, world 2:
        32,768 B at b 2, s 64, h 64)."""
        if shape.tp == 1:
            return 0
        return 2 * act * shape.local_tokens * arch.hidden_size

    def tensor_parallel_unsupported(self, arch: Architecture, shape: Shape) -> str | None:
        """The dense plan of ``apply_tp`` only (:func:`~zerocalc.model.code.parallel.
        dense_plan_unsupported`)."""
        return dense_plan_unsupported(self, arch)

    def tensor_parallel_transients(self, arch: Architecture, shape: Shape, act: int) -> tuple[Transient, ...]:
        """None beyond the layer's excess, which holds the reductions' buffers (measured op by op on CPU:
        :func:`~zerocalc.model.code.excess.tensor_parallel_forward_excess`)."""
        return ()

    def context_parallel_transients(
        self, arch: Architecture, shape: Shape, act: int
    ) -> tuple[Transient, ...]:
        """torch's context parallelism (:func:`~zerocalc.model.code.parallel.
        torch_context_parallel_transients`)."""
        return torch_context_parallel_transients(arch, shape, act)


TORCHTITAN = TorchtitanCode()
