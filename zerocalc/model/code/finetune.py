"""What the forward of a fine-tuning step saves for backward (``hf`` code: PEFT 0.21.2 LoRA/DoRA on
transformers 5.17 modules, bitsandbytes 0.50.2 4-bit bases), tensor by tensor, from which tensors require
grad.

A frozen base changes what autograd saves, because torch 2.13's generated autograd code saves an input only
where a gradient that needs it will be computed (``tools/autograd/gen_variable_type.py``: a saved variable
is guarded by ``grad_fn->should_compute_output(i)`` of the outputs whose formula reads it; measured with
``saved_tensors_hooks``):

* ``mm``/``addmm``/``linear`` of a frozen weight keep no input (it is needed for the weight's gradient
  only); ``weight * x`` of a frozen norm weight keeps no ``x``; ``mul(a, b)`` keeps ``b`` only where ``a``
  requires grad and ``a`` only where ``b`` does; an op none of whose inputs requires grad records no node
  and keeps nothing. Formulas that compute several gradients at once (SDPA's flash backward,
  ``native_layer_norm``) keep all their inputs once any of them requires grad.
* Nothing requires grad before the first trained tensor: the frozen embedding's output does not (its
  indices are kept only when its weight is trained), unless ``enable_input_require_grads`` (transformers
  ``PreTrainedModel``: a forward hook calling ``output.requires_grad_(True)`` on the input embeddings;
  ``prepare_model_for_kbit_training`` and PEFT's gradient-checkpointing preparation turn it on) makes it.
* A LoRA layer (peft/tuners/lora/layer.py ``Linear.forward``; bnb.py ``Linear4bit.forward`` the same after
  ``result.clone()``): ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` (an fp32 copy of a 16-bit
  input: every adapted layer keeps its own, q, k and v do not share it; in fp32 it is ``x`` itself, shared),
  ``lora_dropout`` (p > 0: CUDA's ``native_dropout`` keeps a bool mask, 1 B per element; on the CPU
  ``_dropout`` keeps its noise in the input's dtype, fp32; only where x requires grad), ``lora_A`` keeps its
  input, ``lora_B`` keeps lora_A's [T, r] fp32 output; ``* scaling`` and the add into the base output keep
  nothing (the sum is promoted to fp32, then ``result.to(torch_result_dtype)``).
* DoRA (peft/tuners/lora/dora.py ``DoraLinearLayer.forward``, variants.py ``DoraLinearVariant.forward``):
  ``magnitude / weight_norm`` keeps the [out] weight norm (of the whole base weight, detached);
  ``(mag_norm_scale - 1) * base_result`` keeps the base result and, where it requires grad,
  ``mag_norm_scale - 1`` [1, out]; ``mag_norm_scale * lora_result`` keeps the lora result and
  ``mag_norm_scale``, each in the adapters' dtype (x's after the cast). With dropout the base result is
  ``F.linear(dropout(x), weight.to(x.dtype))``: the [T, out] result, and the copy of the (dequantised)
  weight where dropout's output requires grad. A Conv1D's weight already in x's dtype is the Parameter
  itself, which ``transpose`` (peft/utils/other.py) wraps in a new ``nn.Parameter``: the dropout path's base
  result then requires grad (the norm's graph, of ``weight + scaling * lora_weight``, is detached: freed
  in forward). The identity ``lora_B(lora_A(eye))`` of the weight norm is reached by nothing the loss
  needs: freed.
* bitsandbytes 0.50.2 4-bit (bitsandbytes/nn/modules.py ``Linear4bit.forward``: ``x.to(compute_dtype)``,
  ``matmul_4bit``, ``.to(inp_dtype)``; autograd/_functions.py ``MatMul4Bit.forward``: ``ctx.tensors =
  (None, B)``, the packed weight only): no activation.
* ``prepare_model_for_kbit_training`` (peft/utils/other.py) casts every non-``Params4bit`` parameter to fp32:
  the embedding's output, the norms' (``weight * x.to(input_dtype)``), every ``Linear4bit``'s output (cast
  back to its fp32 input's dtype), attention and the logits are fp32 — the whole stream at 4 B per element,
  and the adapters read fp32 ``x`` itself.

Only transformers' code for the families of :data:`TUNED_FAMILIES` with SDPA (flash) attention is written
out here; :func:`tuning_unsupported` says why another case is not.
"""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.model.architecture import Architecture, QkNorm
from zerocalc.model.code.base import FP32, INT64, Device, LayerSaves
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits

TUNED_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gpt2"})
"""The transformers 5.17 families whose fine-tuning forward is written out (measured on CPU against PEFT
0.21.2 and bitsandbytes 0.50.2: ``zerocalc validate activations --lora-rank``)."""

BOOL = 1


class ForwardTuning(NamedTuple):
    """What a fine-tuning run changes in the forward (the activation model's input; built from a
    ``FineTuning`` by :func:`zerocalc.parallel.finetune.forward_tuning`). Modules by zerocalc's names
    (:attr:`~zerocalc.model.architecture.ParamTensor.module`)."""

    trained: frozenset[str] = frozenset()
    """Modules whose own parameters require grad: a full fine-tune's unfrozen ones, ``modules_to_save``'s
    copies (the forward runs through the copy)."""
    adapted: tuple[tuple[str, int], ...] = ()
    """lora.Linear adapters: module → rank r."""
    dropout: float = 0.0
    dora: bool = False
    quantized: frozenset[str] = frozenset()
    """Modules whose weight is bitsandbytes 4-bit (``MatMul4Bit``)."""
    fp32_stream: bool = False
    """``prepare_model_for_kbit_training``: every non-4-bit parameter fp32, so every activation too."""
    input_requires_grad: bool = False
    """``enable_input_require_grads``: the input embeddings' output requires grad."""
    adapter_bytes: int = FP32
    """The adapters' dtype (fp32 under PEFT's ``autocast_adapter_dtype=True``)."""

    def rank(self, module: str) -> int:
        return dict(self.adapted).get(module, 0)


def tuning_unsupported(arch: Architecture, flash: bool) -> str | None:
    """Why the fine-tuning forward of ``arch`` is not modelled (None: it is)."""
    if arch.family not in TUNED_FAMILIES:
        return (
            "the saved tensors of a fine-tuning forward are written out for "
            f"{', '.join(sorted(TUNED_FAMILIES))} (transformers' code), not "
            f"{arch.family or 'this architecture'}"
        )
    if arch.qk_norm is QkNorm.FULL or arch.is_moe:
        return (
            "the saved tensors of a fine-tuning forward are written out for dense models without a full "
            "q/k norm"
        )
    if not flash:
        return "the saved tensors of a fine-tuning forward are written out for SDPA (flash) attention only"
    return None


class _T:
    """One tensor of the forward: its bytes, whether it requires grad, its element size."""

    __slots__ = ("grad", "nbytes", "size")

    def __init__(self, nbytes: int, grad: bool, size: int) -> None:
        self.nbytes, self.grad, self.size = nbytes, grad, size


class _Walk:
    """A layer's forward op by op, keeping what each op's autograd node saves (once per tensor)."""

    def __init__(self, tuning: ForwardTuning, device: Device, act: int) -> None:
        self.tuning, self.device, self.act = tuning, device, act
        self.saved: list[tuple[str, int]] = []
        self._kept: list[_T] = []  # held, so that no id is reused
        self.kept_inputs: list[_T] = []
        """Tensors saved that are not this walk's (the layer's input): listed apart."""
        self.inputs: set[int] = set()
        self.fan_in_fan_out = False
        """The layer's Linears are Conv1D ([in, out] weights: GPT-2's), which PEFT reads through
        ``transpose(weight, fan_in_fan_out)``."""

    def keep(self, name: str, t: _T) -> None:
        if any(k is t for k in self._kept):
            return
        self._kept.append(t)
        if id(t) in self.inputs:
            self.kept_inputs.append(t)
        else:
            self.saved.append((name, t.nbytes))

    def new(self, elements: int, grad: bool, size: int | None = None) -> _T:
        size = self.act if size is None else size
        return _T(size * elements, grad, size)

    def cast(self, x: _T, size: int) -> _T:
        """``x.to(dtype)``: ``x`` itself in its dtype, else a copy (``ToCopy`` keeps nothing)."""
        return x if x.size == size else _T(x.nbytes // x.size * size, x.grad, size)

    def rms_norm(self, name: str, x: _T, rows: int, module: str) -> _T:
        """transformers' ``LlamaRMSNorm.forward``: ``x.to(float32)`` kept by ``pow`` and ``mul`` and
        ``rsqrt`` [rows, 1] (where x requires grad), ``normalized.to(input_dtype)`` by ``weight *`` (where
        the weight is trained); the output in the promotion of the weight's and the input's dtypes."""
        xf = self.cast(x, FP32)
        weight = module in self.tuning.trained
        if xf.grad:
            self.keep(f"{name}: x.float()", xf)
            self.keep(f"{name}: rsqrt (fp32)", _T(FP32 * rows, True, FP32))
        normalized = self.cast(_T(xf.nbytes, xf.grad, FP32), x.size)
        if weight:
            self.keep(f"{name}: normalized", normalized)
        size = FP32 if self.tuning.fp32_stream else x.size
        return _T(normalized.nbytes // normalized.size * size, x.grad or weight, size)

    def layer_norm(self, name: str, x: _T, rows: int, module: str) -> _T:
        """``native_layer_norm``: its input, mean and rstd (fp32 on CUDA, the input's dtype on the CPU:
        ``aten/src/ATen/native/cpu/layer_norm_kernel.cpp``) once the input or the weight needs a gradient."""
        weight = module in self.tuning.trained
        grad = x.grad or weight
        if grad:
            stats = FP32 if self.device is Device.CUDA else x.size
            self.keep(f"{name}: input", x)
            self.keep(f"{name}: mean", _T(stats * rows, True, stats))
            self.keep(f"{name}: rstd", _T(stats * rows, True, stats))
        return _T(x.nbytes, grad, x.size)

    def linear(self, name: str, x: _T, rows: int, out: int, module: str, in_features: int) -> _T:
        """A Linear (or Conv1D) with what PEFT and bitsandbytes put on it."""
        tuning = self.tuning
        trained = module in tuning.trained
        if trained:
            self.keep(f"{name} input", x)  # mm keeps its input for the weight's gradient
        result = _T(x.size * rows * out, x.grad or trained, x.size)
        r = tuning.rank(module)
        if not r:
            return result
        ad = tuning.adapter_bytes
        xc = self.cast(x, ad)
        xd = xc
        if tuning.dropout > 0:
            if xc.grad:
                mask = BOOL if self.device is Device.CUDA else ad
                self.keep(f"{name} LoRA dropout mask", _T(mask * rows * in_features, True, mask))
            xd = _T(xc.nbytes, xc.grad, ad)
        self.keep(f"{name} LoRA input ({'fp32' if ad == FP32 else 'adapter dtype'})", xd)
        self.keep(f"{name} lora_A output", _T(ad * rows * r, True, ad))
        if tuning.dora:
            # in the adapters' dtype: x's after the cast (peft 0.21.2 tuners/lora/dora.py ``forward``:
            # ``weight.to(x.dtype)``, the norm ``.to(weight.dtype)``, the magnitude an adapter parameter)
            self.keep(f"{name} DoRA weight norm", _T(ad * out, True, ad))
            uncast = x.size == ad and module not in tuning.quantized  # weight.to(x.dtype) is the Parameter
            if tuning.dropout > 0:
                if xd.grad and (x.size != ad or module in tuning.quantized):
                    self.keep(f"{name} DoRA weight.to(x.dtype)", _T(ad * out * in_features, True, ad))
                # F.linear(dropout(x), transpose(weight)): peft 0.21.2 utils/other.py ``transpose`` wraps a
                # Conv1D Parameter's ``.T`` in a new ``nn.Parameter`` (requires_grad), so it requires grad
                base = _T(ad * rows * out, xd.grad or (self.fan_in_fan_out and uncast), ad)
            else:
                base = result
            self.keep(f"{name} DoRA base result", base)
            if base.grad:
                self.keep(f"{name} DoRA mag_norm_scale - 1", _T(ad * out, True, ad))
            self.keep(f"{name} DoRA lora result", _T(ad * rows * out, True, ad))
            self.keep(f"{name} DoRA mag_norm_scale", _T(ad * out, True, ad))
        return _T(result.nbytes, True, result.size)

    def mul(self, name_a: str, a: _T, name_b: str, b: _T) -> _T:
        """``a * b``: ``b`` kept where ``a`` requires grad, ``a`` where ``b`` does."""
        if a.grad:
            self.keep(name_b, b)
        if b.grad:
            self.keep(name_a, a)
        return _T(max(a.nbytes, b.nbytes), a.grad or b.grad, max(a.size, b.size))


def stream_bytes(tuning: ForwardTuning | None, act: int) -> int:
    """Bytes per element of the hidden states between layers (fp32 after ``prepare_model_for_kbit_
    training``)."""
    return FP32 if tuning is not None and tuning.fp32_stream else act


def _stream_grad(arch: Architecture, tuning: ForwardTuning, index: int) -> bool:
    """Whether the input hidden state of layer ``index`` (``arch.num_layers``: the final norm's) requires
    grad: the embedding's output does when it is trained or ``enable_input_require_grads`` is on; a layer's
    output does once its input or any of its modules is trained or adapted."""
    if tuning.input_requires_grad or {"embed_tokens", "embed_positions"} & tuning.trained:
        return True
    modules = [*(m for m, _ in tuning.adapted), *tuning.trained]
    touched = [int(m.split(".")[1]) for m in modules if m.startswith("layers.")]
    return bool(touched) and min(touched) < index


class TunedLayer(NamedTuple):
    saves: LayerSaves
    rotary_grad: bool
    """The rotary embedding's ``q * cos`` (or ``k * cos``) records a node: cos and sin are kept."""


def tuned_layer(
    arch: Architecture,
    index: int,
    shape: Shape,
    act: int,
    device: Device,
    use_cache: bool,
    tuning: ForwardTuning,
) -> TunedLayer:
    """What decoder layer ``index`` of a fine-tuning run keeps for backward (the module docstring's
    rules), per the transformers 5.17 layer of its family (``LlamaDecoderLayer``, its Mistral, Qwen2 and
    Qwen3 copies; ``GPT2Block``), SDPA attention."""
    t = traits(arch)
    T, h = shape.tokens, arch.hidden_size
    size = stream_bytes(tuning, act)
    walk = _Walk(tuning, device, size)
    walk.fan_in_fan_out = t.norm == "layernorm"  # GPT-2's Conv1D
    x = _T(size * T * h, _stream_grad(arch, tuning, index), size)
    walk.inputs.add(id(x))
    p = f"layers.{index}."
    a, kv, d = arch.num_heads, arch.kv_heads, arch.dim_per_head
    gpt2 = t.norm == "layernorm"
    if gpt2:
        hn = walk.layer_norm("attention norm", x, T, p + "input_norm")
        qkv_width = (a + 2 * kv) * d
        qkv = walk.linear("qkv_proj", hn, T, qkv_width, p + "attn.qkv_proj", h)
        q = k = v = qkv  # views of c_attn's output: SDPA keeps it whole
        rotary = False
    else:
        hn = walk.rms_norm("attention norm", x, T, p + "input_norm")
        q = walk.linear("q_proj", hn, T, a * d, p + "attn.q_proj", h)
        k = walk.linear("k_proj", hn, T, kv * d, p + "attn.k_proj", h)
        v = walk.linear("v_proj", hn, T, kv * d, p + "attn.v_proj", h)
        if arch.qk_norm is QkNorm.PER_HEAD:  # Qwen3: over d, per head
            q = walk.rms_norm("q norm", q, T * a, p + "attn.q_norm")
            k = walk.rms_norm("k norm", k, T * kv, p + "attn.k_norm")
        rotary = q.grad or k.grad  # q * cos keeps cos, rotate_half(q) * sin keeps sin (shared_saves)
        q = walk.new(T * a * d, q.grad)
        k = walk.new(T * kv * d, k.grad)
    if use_cache:  # DynamicLayer.update: torch.cat copies of k and v, which SDPA keeps
        k = walk.new(T * kv * d, k.grad)
        v = walk.new(T * kv * d, v.grad)
    out = walk.new(T * a * d, q.grad or k.grad or v.grad)
    if out.grad:  # the flash backward's one formula reads q, k, v, out and the log-sum-exp
        walk.keep("q/k/v projection output (q is a view of it)" if gpt2 else "q", q)
        walk.keep("k", k)
        walk.keep("v", v)
        walk.keep("attention output", out)
        walk.keep("softmax log-sum-exp", _T(FP32 * T * a, True, FP32))
    o = walk.linear("o_proj", out, T, h, p + "attn.o_proj", a * d)
    mid = _T(x.nbytes, x.grad or o.grad, size)
    if gpt2:
        hn2 = walk.layer_norm("MLP norm", mid, T, p + "post_attention_norm")
        f = arch.intermediate_size
        g = walk.linear("fc_in", hn2, T, f, p + "mlp.fc_in", h)
        if g.grad:  # NewGELUActivation: x, tanh(...), 0.5x and 1 + tanh
            for part in ("GELU input", "tanh", "0.5x", "1 + tanh"):
                walk.keep(part, g if part == "GELU input" else walk.new(T * f, True, g.size))
        gelu = walk.new(T * f, g.grad, g.size)
        down = walk.linear("fc_out", gelu, T, h, p + "mlp.fc_out", f)
    else:
        hn2 = walk.rms_norm("MLP norm", mid, T, p + "post_attention_norm")
        f = arch.intermediate_size
        gate = walk.linear("gate_proj", hn2, T, f, p + "mlp.gate_proj", h)
        up = walk.linear("up_proj", hn2, T, f, p + "mlp.up_proj", h)
        if gate.grad:
            walk.keep("gate output", gate)  # silu keeps its input
        act_out = walk.new(T * f, gate.grad, gate.size)
        product = walk.mul("activation output", act_out, "up output", up)
        down = walk.linear("down_proj", product, T, h, p + "mlp.down_proj", f)
    del down
    saves = LayerSaves(
        saved=tuple(walk.saved), keeps_input=bool(walk.kept_inputs), forward_excess=0, backward_excess=0
    )
    return TunedLayer(saves, rotary)


def tuned_embedding_saves(arch: Architecture, shape: Shape, tuning: ForwardTuning) -> list[tuple[str, int]]:
    """The embedding's saves: ``embedding`` keeps its indices only for its weight's gradient (int64 [b, s];
    GPT-2's ``wpe`` its position ids [1, s])."""
    out = []
    if "embed_tokens" in tuning.trained:
        out.append(("input ids (embedding indices)", INT64 * shape.tokens))
    if "embed_positions" in tuning.trained:
        out.append(("position ids", INT64 * shape.s))
    return out


def tuned_shared_saves(
    arch: Architecture, shape: Shape, act: int, device: Device, tuning: ForwardTuning
) -> tuple[int | None, list[tuple[str, int]]]:
    """The rotary cos and sin, kept from the first layer whose ``q * cos`` or ``k * cos`` records a node
    (its index; None and nothing where none does); [1, s, d] in the stream's dtype."""
    if not traits(arch).rotary:
        return None, []
    for i in range(arch.num_layers):
        if tuned_layer(arch, i, shape, act, device, True, tuning).rotary_grad:
            size = stream_bytes(tuning, act)
            d = arch.dim_per_head
            return i, [("rotary cos", size * shape.s * d), ("rotary sin", size * shape.s * d)]
    return None, []


def tuned_final_saves(
    arch: Architecture, shape: Shape, act: int, device: Device, tuning: ForwardTuning
) -> tuple[list[tuple[str, int]], bool]:
    """The final norm's saves and the LM head's input (kept only when the head is trained: a
    ``modules_to_save`` copy); and whether the last hidden state itself is kept (a LayerNorm's input, or
    the fp32 RMSNorm's ``x.to(float32)``)."""
    T, h = shape.tokens, arch.hidden_size
    size = stream_bytes(tuning, act)
    walk = _Walk(tuning, device, size)
    x = _T(size * T * h, _stream_grad(arch, tuning, arch.num_layers), size)
    walk.inputs.add(id(x))
    if traits(arch).norm == "layernorm":
        y = walk.layer_norm("final norm", x, T, "final_norm")
    else:
        y = walk.rms_norm("final norm", x, T, "final_norm")
    if "lm_head" in tuning.trained:
        walk.keep("LM head input", y)
    return walk.saved, bool(walk.kept_inputs)
