"""What one decoder layer keeps for backward: the codes' layers, tensor and context parallelism's
buffers, and selective recomputation."""

from __future__ import annotations

from zerocalc.model.activations import ActivationShape, layer_terms
from zerocalc.model.architecture import Architecture, BlockLayout, MlpKind
from zerocalc.model.code.attention import attention_saves
from zerocalc.model.code.base import FP32, Device, LayerSaves, ModelImpl, ModelImplName
from zerocalc.model.code.excess import backward_excess, forward_excess
from zerocalc.model.code.mlp import mlp_saves, moe_saves
from zerocalc.model.code.norms import norm_saves
from zerocalc.model.code.parallel import parallel_transients, parallel_unsupported
from zerocalc.model.code.program import forward_program
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


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
    saves = module_layer(impl, arch, index, shape, act, device, use_cache, flash)
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


def module_layer(
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
        return korthikanti_layer(arch, index, shape, act, flash)
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
    attention_saves(add, norm, arch, t, impl, L, shape, act, device, copies, flash)
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
        moe_saves(add, arch, t, L, act, shape.expert_rows(L * arch.experts_per_token))
    else:
        width = (
            (arch.dense_intermediate_size or arch.intermediate_size)
            if arch.is_moe
            else arch.intermediate_size
        )
        mlp_saves(add, arch, t, L, shape.split(width, "the MLP width"), act)
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
        forward_excess=forward_excess(impl, arch, index, t, shape, act) if impl.transients else 0,
        backward_excess=backward_excess(impl, arch, index, t, shape, act) if impl.transients else 0,
        program=forward_program(impl, arch, index, shape, act, copies, flash, tuple(saved), device),
    )


def korthikanti_layer(arch: Architecture, index: int, shape: Shape, act: int, flash: bool) -> LayerSaves:
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
