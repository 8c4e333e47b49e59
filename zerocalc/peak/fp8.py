"""What FP8 changes of the step's peak (pure): the bytes of FSDP2's gathered weights under the FP8 all-gather.

torchao 0.18 ``float8/fsdp_utils.py``: ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts a
converted weight's shard to fp8 (1 B per element, where FSDP2 would cast it to ``param_dtype``) and
``fsdp_post_all_gather`` wraps the gathered bytes as the ``Float8TrainingTensor`` forward uses and
``Float8Linear`` saves for backward (``ctx.save_for_backward(input_hp, weight_hp_t)``: the unsharded fp8
weight itself, no second copy). torchtitan turns the FP8 all-gather on only where FSDP shards
(``Float8LinearConverter``: ``parallel_dims.dp_shard_enabled and enable_fsdp_float8_all_gather``).

**torchao's eager casts** (:func:`cast_forward_excess`). ``hp_tensor_to_float8_dynamic`` of an n-element
16-bit tensor (``float8_training_tensor.py`` ``_ToFloat8ConstrFunc.forward``: ``tensor_scaled =
tensor.to(torch.float32) * scale``; ``float8_utils.py`` ``to_fp8_saturated``: ``x.clamp(...)`` then
``.to(float8_dtype)``) holds, at its largest moment, the fp32 scaled copy, the fp32 clamped copy and the fp8
result: :data:`CAST_TRANSIENT` = 9 bytes per element (the amax's ``abs`` copy, 2n, comes and goes before).
``Float8Linear``'s forward casts its input, then its weight (the fp8 input alive beside the weight's cast);
a weight all-gathered in fp8 is cast already. Eager only: under ``torch.compile`` the cast is one fused
kernel with no fp32 copies (torchtitan's ``compile.enable``: ``--compile model``, where the timeline asks
for none, :mod:`zerocalc.model.code.compiled`).
"""

from __future__ import annotations

from functools import lru_cache

from zerocalc.base.dtypes import DType
from zerocalc.model.architecture import Architecture, ParamTensor, layer_tensors
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.precision import Fp8Library, Fp8RecipeName
from zerocalc.states.framework import fsdp_units

CAST_TRANSIENT = 4 + 4 + 1
"""Bytes per element a torchao eager cast holds at once: fp32 scaled, fp32 clamped, fp8 result."""
SCALE = 4
"""Bytes of one fp32 scale."""
RESULTS = (" fp8", " scale")


def fp8_gather_bytes(
    arch: Architecture, fp8: Fp8Setting, param_bytes: int, world: int
) -> dict[str, tuple[int, ...]] | None:
    """Per FSDP unit (named as the timeline names them: ``"root"``, ``"0"`` … ``"L−1"``), each parameter's
    bytes per element as FSDP2 gathers it: 1 for a converted weight, ``param_bytes`` for the rest; None
    without the FP8 all-gather (or on one rank, where nothing is sharded)."""
    if not fp8.all_gather or world == 1:
        return None
    return _gather_bytes(arch, fp8, param_bytes)


def _per_parameter(tensors: list[ParamTensor], fp8: Fp8Setting, param_bytes: int) -> tuple[int, ...]:
    return tuple(DType.FP8.bytes if fp8.converts(t) else param_bytes for t in tensors)


@lru_cache(maxsize=64)
def _gather_bytes(arch: Architecture, fp8: Fp8Setting, param_bytes: int) -> dict[str, tuple[int, ...]]:
    return {
        name.removeprefix("layers.") if name != "root" else "root": _per_parameter(
            list(tensors), fp8, param_bytes
        )
        for name, tensors in fsdp_units(arch)
    }


def torchao_casts(fp8: Fp8Setting) -> bool:
    """``fp8`` is a torchao recipe, whose eager casts hold fp32 copies (:data:`CAST_TRANSIENT`)."""
    return fp8.on and fp8.record.library is Fp8Library.TORCHAO


def cast_forward_excess(arch: Architecture, index: int, fp8: Fp8Setting, tokens: int, act: int) -> int:
    """Bytes above layer ``index``'s saved tensors at its largest forward cast (0: no torchao recipe): per
    converted Linear (n × k) of ``tokens`` rows, its input's cast (9·tokens·k) or its weight's beside the
    fp8 input (tokens·k + 9·n·k; none with the FP8 all-gather); the MLP's beside the mid residual
    (act·tokens·h, held for the residual add)."""
    if not torchao_casts(fp8):  # before the cache: a step asks per layer, and its key hashes the architecture
        return 0
    return _cast_forward_excess(arch, index, fp8, tokens, act)


@lru_cache(maxsize=256)
def _cast_forward_excess(arch: Architecture, index: int, fp8: Fp8Setting, tokens: int, act: int) -> int:
    largest = 0
    for tensor in layer_tensors(arch, index):
        if not fp8.converts(tensor):
            continue
        n, k = tensor.shape
        held = act * tokens * arch.hidden_size if ".mlp." in f".{tensor.module}" else 0
        weight = 0 if fp8.all_gather else tokens * k + CAST_TRANSIENT * n * k
        largest = max(largest, held + max(CAST_TRANSIENT * tokens * k, weight))
    return largest


_PROJECTIONS = (
    ("q projection", "attn.q_proj"),
    ("k projection", "attn.k_proj"),
    ("v projection", "attn.v_proj"),
    ("v", "attn.v_proj"),
    ("o projection output", "attn.o_proj"),
    ("gate output", "mlp.gate_proj"),
    ("up output", "mlp.up_proj"),
    ("down projection output", "mlp.down_proj"),
)
"""The op of :func:`~zerocalc.model.code.program.transformers_program` that writes each Linear's output
(``v`` where SDPA keeps the projected v itself, no ``v projection``), and the Linear."""


def scale_bytes(fp8: Fp8Setting, rows: int) -> int:
    """Bytes of the fp32 scale of a cast tensor of ``rows`` rows (each row its own amax): one element
    tensorwise, one per row rowwise (``tensor_to_amax``: ``torch.amax(..., dim=axiswise_dim,
    keepdim=True)``)."""
    return SCALE if fp8.recipe is Fp8RecipeName.TENSORWISE or rows == 1 else SCALE * rows


def _cast(name: str, elements: int, scale: int) -> list[tuple[str, str, int]]:
    """One ``hp_tensor_to_float8_dynamic`` of a 16-bit tensor: ``abs`` (freed once ``max`` has read it), the
    fp32 scale (``amax_to_scale``; its float64 intermediates come and go), ``.to(float32)`` (freed once
    ``* scale`` exists), the scaled copy, the clamped one, the fp8 result (the two fp32 copies freed when
    the function returns); the result and its scale are left alive (a ``Float8TrainingTensor``)."""
    return [
        ("temp", f"{name}: abs", 2 * elements),
        ("drop", f"{name}: abs", 0),
        ("temp", f"{name} scale", scale),
        ("temp", f"{name}: .float()", 4 * elements),
        ("temp", f"{name}: scaled", 4 * elements),
        ("drop", f"{name}: .float()", 0),
        ("temp", f"{name}: clamped", 4 * elements),
        ("temp", f"{name} fp8", elements),
        ("drop", f"{name}: clamped", 0),
        ("drop", f"{name}: scaled", 0),
    ]


def with_casts(
    program: tuple[tuple[str, str, int], ...], arch: Architecture, index: int, fp8: Fp8Setting, tokens: int
) -> tuple[tuple[str, str, int], ...]:
    """A layer's forward program (:attr:`~zerocalc.model.code.LayerSaves.program`; empty stays empty) with
    torchao's eager casts before each converted Linear's output (``matmul_with_hp_or_float8_args.forward``:
    the input's cast, then the weight's unless all-gathered in fp8) and their fp8 results freed once the
    output exists (the function returns), with their fp32 scales."""
    if not program:
        return program
    shapes = {
        tensor.module.rsplit(".", 2)[-2] + "." + tensor.module.rsplit(".", 1)[-1]: tensor.shape
        for tensor in layer_tensors(arch, index)
        if fp8.converts(tensor)
    }
    writers = dict(_PROJECTIONS)
    if any(name == "v projection" for _, name, _ in program):
        del writers["v"]
    out: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for op in program:
        written = op[1].rsplit(": ", 1)[-1]  # a kept tensor is "saved name: program name"
        module = writers.get(written) if op[0] in ("temp", "keep") and written not in seen else None
        shape = shapes.get(module) if module is not None else None
        if shape is None:
            out.append(op)
            continue
        seen.add(written)
        n, k = shape
        casts = _cast(f"{module} input", tokens * k, scale_bytes(fp8, tokens))
        if not fp8.all_gather:
            casts += _cast(f"{module} weight", n * k, scale_bytes(fp8, n))
        out += [*casts, op]
        out += [("drop", name, 0) for verb, name, _ in casts if verb == "temp" and name.endswith(RESULTS)]
    return tuple(out)


def _backward_moments(m: int, n: int, k: int, fp8: Fp8Setting, act: int, block: int) -> int:
    """The most a converted Linear's backward (``matmul_with_hp_or_float8_args.backward``) holds above the
    moment it starts (its output gradient alive), each tensor rounded up to the allocator's ``block``: the
    output gradient's cast (and its scale); the weight's beside that fp8 gradient (none all-gathered in
    fp8: the saved weight is fp8); the input-gradient product's act·m·k result beside both; then, where
    the weight gradient runs in fp8, the output gradient cast again, the saved input cast beside it, and
    their product's act·n·k result (in high precision: the product alone). No operand is copied into
    another layout (traced: the casts' results already have the strides ``preprocess_addmm`` asks for)."""

    def size(nbytes: int) -> int:
        return -(-nbytes // block) * block

    def cast(elements: int, rows: int) -> int:  # its fp32 copies, fp8 result and scale at once
        return 2 * size(4 * elements) + size(elements) + size(scale_bytes(fp8, rows))

    def fp8_tensor(elements: int, rows: int) -> int:
        return size(elements) + size(scale_bytes(fp8, rows))

    # the scales' rows: the output gradient's per row (m), the weight's for the input gradient per input
    # column (k; tensorwise under rowwise-gw-hp: cast_config_weight_for_grad_input), the weight gradient's
    # operands per output (n) and input (k) column (axiswise_dim 0)
    w_rows = 1 if fp8.recipe is Fp8RecipeName.ROWWISE_GW_HP else k
    weight = 0 if fp8.all_gather else fp8_tensor(n * k, w_rows)
    g0 = fp8_tensor(m * n, m)
    moments = [cast(m * n, m)]
    if weight:
        moments.append(g0 + cast(n * k, w_rows))
    held = g0 + weight + size(act * m * k)
    moments.append(held)
    if not fp8.record.weight_grad_fp8:
        return max(*moments, held + size(act * n * k))
    g1 = fp8_tensor(m * n, n)
    moments.append(held + cast(m * n, n))
    moments.append(held + g1 + cast(m * k, k))
    moments.append(held + g1 + fp8_tensor(m * k, k) + size(act * n * k))
    return max(moments)


_MLP_ORDER = ("mlp.down_proj", "mlp.up_proj", "mlp.gate_proj")
"""A SwiGLU MLP's Linears in the order autograd runs their backward: ``down(silu(gate(x)) * up(x))``,
the later node first (transformers ``LlamaMLP``, torchtitan ``FeedForward`` ``w2(silu(w1(x)) * w3(x))``)."""


def _mlp_anchors(tokens: int, h: int, f: int, act: int) -> tuple[int, int, int]:
    """Above the layer's backward start, where each of the MLP's Linears begins its backward (traced op by
    op on the CPU, torch 2.13, torchao 0.18, transformers 5.17's ``LlamaDecoderLayer``): the down
    projection at the start; the up projection once the product's backward has run: the down
    projection's weight gradient (act·h·f) and the product's two gradients (2·act·T·f), its saved input
    and the product's two saved operands and its output gradient freed (4·act·T·f): act·h·f − act·T·f;
    the gate projection once the up projection's weight gradient (act·h·f) and input gradient (act·T·h)
    exist, its output gradient is freed and SiLU's backward has replaced the activation's gradient and its
    saved input by the gate's output gradient: act·T·f less again."""
    up = act * h * f - act * tokens * f
    return 0, up, up + act * h * f + act * tokens * h - 2 * act * tokens * f


def cast_backward_excess(
    arch: Architecture, index: int, fp8: Fp8Setting, tokens: int, act: int, block: int = 1
) -> int:
    """Bytes above the state at layer ``index``'s backward start at its largest backward cast (0: no torchao
    recipe, or a layer without a SwiGLU MLP's three Linears; ``block``: the allocator's, each tensor
    rounded up to it): each converted MLP Linear's backward
    (:func:`_backward_moments`) where it begins (:func:`_mlp_anchors`). The attention's Linears come later,
    with smaller weights and inputs, and are not written."""
    if not torchao_casts(fp8):  # before the cache: a step asks per layer, and its key hashes the architecture
        return 0
    return _cast_backward_excess(arch, index, fp8, tokens, act, block)


@lru_cache(maxsize=256)
def _cast_backward_excess(
    arch: Architecture, index: int, fp8: Fp8Setting, tokens: int, act: int, block: int
) -> int:
    mlp = {}
    for tensor in layer_tensors(arch, index):
        for name in _MLP_ORDER:
            if tensor.module.endswith(name) and len(tensor.shape) == 2:
                mlp[name] = tensor
    if len(mlp) != len(_MLP_ORDER):
        return 0
    h, f = mlp["mlp.down_proj"].shape
    largest = 0
    for name, anchor in zip(_MLP_ORDER, _mlp_anchors(tokens, h, f, act), strict=True):
        tensor = mlp[name]
        if fp8.converts(tensor):
            n, k = tensor.shape
            largest = max(largest, anchor + _backward_moments(tokens, n, k, fp8, act, block))
    return largest


_TE_LINEAR_INPUTS = (
    ("qkv_input", ("attn.q_proj", "attn.qkv_proj")),
    ("out_proj_input", ("attn.o_proj",)),
    ("mlp_input", ("mlp.gate_proj", "mlp.up_proj", "mlp.fc_in", "mlp.gate_up_proj")),
    ("fc2_input", ("mlp.down_proj", "mlp.fc_out")),
    ("down_input", ("mlp.down_proj",)),
)
"""The terms of :func:`~zerocalc.model.activations.layer_terms` that are a Linear's input, and its modules."""


def te_saved(
    saved: tuple[tuple[str, int], ...], arch: Architecture, index: int, fp8: Fp8Setting, act: int, flash: bool
) -> tuple[tuple[str, int], ...]:
    """A Megatron-LM layer's saved tensors (Korthikanti et al.'s terms) under a Transformer Engine recipe
    (unchanged otherwise): a converted Linear saves its input only as the fp8 columnwise copy its
    weight-gradient GEMM reads (TE 2.x ``module/linear.py`` and ``layernorm_linear.py``: the quantised
    input's ``update_usage(rowwise_usage=False)`` before ``save_for_backward``), 1 byte per element in place
    of ``act``. The attention's output under a flash kernel is saved by the kernel too (its ``out``): the
    fp8 copy comes beside it. A recipe's per-block scales of these inputs are not counted."""
    if not fp8.on or fp8.record.library is not Fp8Library.TRANSFORMER_ENGINE:
        return saved
    converted = {t.module.split(".", 2)[-1] for t in layer_tensors(arch, index) if fp8.converts(t)}
    linears = {term: any(m in converted for m in modules) for term, modules in _TE_LINEAR_INPUTS}
    out: list[tuple[str, int]] = []
    for name, nbytes in saved:
        if not linears.get(name):
            out.append((name, nbytes))
        elif name == "out_proj_input" and flash:
            out += [(name, nbytes), (f"{name} (fp8 copy)", nbytes // act)]
        else:
            out.append((f"{name} (fp8)", nbytes // act))
    return tuple(out)
