"""What one decoder layer keeps for backward: the code's layer (:meth:`~zerocalc.model.code.base.ModelCode.
layer`) with tensor, context and expert parallelism's buffers and selective recomputation, and the layer
of the codes built from PyTorch modules (transformers' and torchtitan's), tensor by tensor."""

from __future__ import annotations

from zerocalc.model.architecture import Architecture, BlockLayout
from zerocalc.model.code.attention import attention_saves
from zerocalc.model.code.base import FP32, Device, LayerSaves, ModelCode
from zerocalc.model.code.compiled import compiled_layer_saves
from zerocalc.model.code.excess import backward_excess, forward_excess
from zerocalc.model.code.finetune import ForwardTuning, tuned_layer, tuning_unsupported
from zerocalc.model.code.llama_block import dense_llama_block
from zerocalc.model.code.mlp import mlp_saves, moe_saves
from zerocalc.model.code.norms import norm_saves
from zerocalc.model.code.parallel import parallel_transients, parallel_unsupported
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def layer_saves(
    impl: ModelCode,
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    device: Device = Device.CUDA,
    use_cache: bool = True,
    flash: bool = True,
    selective: bool = False,
    tuning: ForwardTuning | None = None,
    compiled: bool = False,
    fp8_matmuls: bool = False,
) -> LayerSaves:
    """What decoder layer ``index`` keeps for backward under ``impl`` (:mod:`zerocalc.model.code`).

    ``use_cache`` is False under activation checkpointing (HF forces it off); ``flash`` selects SDPA's
    flash kernel (q, k, v, out and an fp32 log-sum-exp per row) over eager attention (fp32 softmax
    probabilities [b, a, s, s] and their cast). ``selective``: Korthikanti et al. §4.2's selective
    recomputation, the attention core's s²-sized tensors (:data:`QUADRATIC_TERMS`) are not kept but
    recomputed in the layer's backward, where they exist for a moment.

    Per rank under ``shape``'s tensor, sequence and context parallelism (:mod:`zerocalc.model.code`); the
    buffers tensor and context parallelism add inside the layer are in ``forward_excess`` and
    ``backward_excess`` (:func:`~zerocalc.model.code.parallel.parallel_transients`). A combination
    :func:`~zerocalc.model.code.parallel.parallel_unsupported` refuses raises ``ValueError``.

    ``tuning``: a fine-tuning run's forward (:mod:`zerocalc.model.code.finetune`: the frozen base keeps no
    input for weight gradients, the adapters their fp32 inputs; transformers' modules, one rank, no
    in-layer transients counted); None: every parameter trained.

    ``compiled``: the block under ``torch.compile`` (:mod:`zerocalc.model.code.compiled`: what Inductor's
    partitioner saves, :func:`~zerocalc.model.code.compiled.compiled_layer_saves`; the dense Llama block
    only, :func:`compile_unsupported`); its transients as eager's (not re-derived for the compiled
    kernels); ``fp8_matmuls``: its linears torchao's ``Float8Linear`` (tensorwise), compiled.
    """
    reason = parallel_unsupported(impl, arch, shape, flash)
    if reason is not None:
        raise ValueError(reason)
    if tuning is not None:
        reason = tuning_unsupported(arch, flash)
        if not impl.transformers_modules or shape.tp * shape.cp * shape.ep > 1:
            reason = (
                "the saved tensors of a fine-tuning forward are written out for transformers' code, one rank"
            )
        if reason is not None:
            raise ValueError(reason)
        return tuned_layer(arch, index, shape, act, device, use_cache, tuning).saves
    saves = impl.layer(arch, index, shape, act, device, use_cache, flash)
    if compiled:
        reason = compile_unsupported(arch, shape, flash)
        if reason is not None:
            raise ValueError(reason)
        a_width = shape.split(arch.num_heads, "attention heads") * arch.dim_per_head
        saved = compiled_layer_saves(
            saves.saved,
            impl.norm_fp32_copy,
            a_width,
            act,
            shape.sequence_tokens,
            arch.hidden_size,
            fp8_matmuls,
        )
        saves = saves._replace(saved=saved, keeps_input=False, program=())
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


def compile_unsupported(arch: Architecture, shape: Shape, flash: bool) -> str | None:
    """Why a compiled block's saves are not modelled, one sentence; None where they are: the dense Llama
    block (:func:`~zerocalc.model.code.llama_block.dense_llama_block`) with RMSNorm and SDPA's flash kernel,
    on one rank or under torchtitan's tensor parallelism with sequence parallelism, one context-parallel
    rank (what was measured, :mod:`zerocalc.validate.compiled` and :mod:`zerocalc.validate.compiled_tp`)."""
    if not dense_llama_block(arch) or traits(arch).norm != "llama":
        return "it is modelled for the dense Llama block (RMSNorm, q, k, v, o, gate, up, down linears)"
    if not flash:
        return "it is modelled with SDPA's flash kernel"
    if shape.cp > 1:
        return "it is not modelled under context parallelism (measured on one context-parallel rank)"
    if shape.tp > 1 and not shape.sequence_parallel:
        return (
            "under tensor parallelism it is modelled with sequence parallelism (torchtitan's plan, what "
            "was measured)"
        )
    return None


QUADRATIC_TERMS = frozenset(
    {
        "softmax probabilities (fp32)",
        "softmax probabilities (with the sink column)",
        "attention soft-capping tanh output",
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
    impl: ModelCode,
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    device: Device,
    use_cache: bool,
    flash: bool,
) -> LayerSaves:
    """Decoder layer ``index`` of a code built from PyTorch modules (``hf``, ``torchtitan``), tensor by
    tensor as its autograd saves them: the norms (:func:`~zerocalc.model.code.norms.norm_saves`), attention
    (:func:`~zerocalc.model.code.attention.attention_saves`), the MLP or the experts (:mod:`.mlp`), the
    residual dropout masks, in the block layout's order; the in-layer transients of :mod:`.excess` where the
    code counts them, and the code's forward program (:meth:`~zerocalc.model.code.base.ModelCode.
    forward_program`)."""
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
        program=impl.forward_program(arch, index, shape, act, copies, flash, tuple(saved), device),
    )
