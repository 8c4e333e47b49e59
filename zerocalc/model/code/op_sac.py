"""torchtitan's op-level selective activation checkpointing (``--recompute op``): where it is modelled, and
what one decoder layer keeps under it."""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.model.architecture import Architecture
from zerocalc.model.code.base import FP32, ModelCode
from zerocalc.model.code.compiled import compiled_op_kept
from zerocalc.model.code.layer import layer_saves
from zerocalc.model.code.llama_block import OP_SAC_MATMUL_ORDER, dense_llama_block
from zerocalc.model.code.shape import Shape


def op_sac_recomputes(name: str) -> bool:
    """Whether torchtitan's op-level selective checkpointing recomputes linear ``name``
    (:data:`OP_SAC_MATMUL_ORDER`) in backward rather than keeping its output: its policy counts the
    block's ``aten.mm`` calls and saves all but every second one (``meta["forward_mm_count"] % 2 == 0``:
    the 2nd, 4th and 6th, wk, wo and w3). False for a name the order does not hold."""
    return name in OP_SAC_MATMUL_ORDER and (OP_SAC_MATMUL_ORDER.index(name) + 1) % 2 == 0


def op_sac_unsupported(
    arch: Architecture, shape: Shape, flash: bool, impl: ModelCode | None = None
) -> str | None:
    """Why ``--recompute op`` is not modelled, one sentence; None when it is. The policy counts a block's
    matmuls in the order its code calls them, so it is modelled for the dense Llama block
    (:data:`OP_SAC_MATMUL_ORDER`: torchtitan's and transformers' ``LlamaAttention`` / ``LlamaMLP`` call
    their linears in that order) with SDPA's flash kernel and without context parallelism (torch's ring
    attention calls the kernel once per K/V chunk); its memory (``impl`` given) where the code's record says
    so (:attr:`~zerocalc.model.code.base.ModelCode.op_sac_memory`: torchtitan's, the code the policy was
    written for)."""
    if impl is not None and not impl.op_sac_memory:
        return "its memory is modelled for torchtitan's Llama code"
    if not dense_llama_block(arch):
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


def op_sac_layer(
    impl: ModelCode,
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    compiled: bool = False,
    fp8_matmuls: bool = False,
) -> OpSacLayer:
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
    one rank (:mod:`zerocalc.validate.op_sac`).

    ``compiled``: the block under ``torch.compile`` (torchtitan's ``apply_compile`` wraps the checkpointed
    block): the partitioner keeps the policy's outputs that the backward reads
    (:func:`~zerocalc.model.code.compiled.compiled_op_kept`: not w2's), and the recompute, fused into the
    backward graph, materialises what a compiled block saves (:func:`~zerocalc.model.code.layer_saves`'s
    ``compiled``); measured on CPU (torch 2.13 Inductor, :mod:`zerocalc.validate.compiled`). With
    ``fp8_matmuls`` (torchao's tensorwise ``Float8Linear``, compiled) the kept outputs are the same (the
    policy sees ``aten.mm`` on the fp8 tensors), the recompute materialises less
    (:data:`~zerocalc.model.code.compiled.COMPILED_FP8_RECOMPUTED`)."""
    reason = op_sac_unsupported(arch, shape, True, impl)
    if reason is not None:
        raise ValueError(reason)
    saves = layer_saves(impl, arch, index, shape, act, compiled=compiled, fp8_matmuls=fp8_matmuls)
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
    if compiled:
        kept = list(compiled_op_kept(tuple(kept)))
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
    kept_names = {n for n, _ in kept}
    consumed = ("q_proj output", *(n for n in ("down_proj output", *(n for n, _ in scattered))
                                   if n in kept_names))  # fmt: skip
    # the forward's moment around w2 holds its output and, under sequence parallelism, the reduce-scatter's
    # result besides the mid residual and the new hidden state: those two are kept outputs here (eager)
    in_moment = 0 if compiled else act * L * h + (act * R * h if scattered else 0)
    return OpSacLayer(
        kept=tuple(kept),
        recomputed=recomputed,
        consumed=consumed,
        forward_excess=max(0, saves.forward_excess - in_moment),
        backward_excess=saves.backward_excess,
    )
