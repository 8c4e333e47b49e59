"""transformers 5.17's decoder layers op by op (the ``hf`` code's forward program, :attr:`~zerocalc.model.
code.base.LayerSaves.program`): the order decides which cached blocks the caching allocator can reuse."""

from __future__ import annotations

from zerocalc.model.architecture import Architecture, BlockLayout, MlpKind, QkNorm
from zerocalc.model.code.base import FP32, Device, Program
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def rms_norm_program(prefix: str, rows: int, width: int, act: int, output: str) -> list[tuple[str, str, int]]:
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


def rotary_program(name: str, width: int, T: int, act: int, kept: bool) -> list[tuple[str, str, int]]:
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


def transformers_program(
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    copies: bool,
    flash: bool,
    saved: tuple[tuple[str, int], ...],
    device: Device,
) -> Program:
    """The decoder layer's forward op by op (:attr:`LayerSaves.program`) for the transformers 5.17 Llama
    family (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ``Qwen3DecoderLayer``: pre-norm RMSNorm, rotary
    q and k, SDPA's flash kernel, a SwiGLU MLP) and GPT-2 on CUDA (:func:`gpt2_program`) in a 16- or 8-bit
    compute dtype; empty for other architectures, dtypes and meshes.
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
        act != FP32
        and flash
        and device is Device.CUDA
        and arch.family == "gpt2"
        and arch.block_layout is BlockLayout.PRE_NORM
        and arch.residual_dropout > 0
        and not arch.is_moe
    ):
        return matched(gpt2_program(arch, shape, act, copies), saved)
    if not (
        act != FP32
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
    ops = rms_norm_program("attention norm", T, h, act, "keep:attention input (norm output)")
    sources = {}
    for name, width, heads in (("q", a * d, a), ("k", kv * d, kv), ("v", kv * d, kv)):
        ops.append(("temp", f"{name} projection", act * T * width))
        sources[name] = f"{name} projection"
        if arch.qk_norm is QkNorm.PER_HEAD and name != "v":
            ops += rms_norm_program(f"{name} norm", T * heads, d, act, f"{name} norm output")
            ops.append(("drop", f"{name} projection", 0))
            sources[name] = f"{name} norm output"
    ops += rotary_program("q", a * d, T, act, kept=True)
    ops += rotary_program("k rotated", kv * d, T, act, kept=False)
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
    ops += rms_norm_program("MLP norm", T, h, act, "keep:MLP input (norm output)")
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
    return matched(ops, saved)


def gpt2_program(arch: Architecture, shape: Shape, act: int, copies: bool) -> list[tuple[str, str, int]]:
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


def matched(
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
