"""What a ``torch.compile``'d training step saves for backward, measured with real Inductor on the CPU
(imports torch; ``zerocalc validate activations --compile``).

Two models, each as its code compiles it (:mod:`zerocalc.model.code.compiled`):

* ``torchtitan``: :class:`TitanLlama`, torchtitan v0.2.2's Llama 3 written out at tiny size
  (``models/llama3/model/model.py``: ``nn.RMSNorm``, ``wq``/``wk``/``wv``/``wo``, the complex rotary
  ``apply_rotary_emb`` with ``freqs_cis`` a non-persistent buffer, ``F.scaled_dot_product_attention(...,
  is_causal=True, enable_gqa=True)``, SwiGLU ``w2(silu(w1(x)) * w3(x))``; ``components/loss.py::
  cross_entropy_loss``), its blocks wrapped as ``apply_ac`` does (none; ``full``: ``checkpoint_wrapper``;
  ``op``: the op-level policy of :mod:`zerocalc.validate.op_sac`), then each compiled with
  ``fullgraph=True`` (``apply_compile``), the loss compiled where asked;
* ``hf``: the transformers model of a tiny config, ``torch.compile(model)`` whole (the loss inside).

One forward runs under ``saved_tensors_hooks``: every tensor a ``CompiledFunctionBackward`` (or an eager
node) saves passes through the pack hook; storages are deduplicated, parameters and buffers left out (model
states), and what is still held once the forward has returned is counted. torchtitan's storages are
attributed to the region whose forward saved them (per-block compile keeps the blocks' hooks eager):
``embedding``, ``layer <i>``, ``final`` (the eager final norm and head: not compared, CPU's ``nn.RMSNorm``
runs composite where CUDA's is fused) and ``loss``. transformers' whole graph saves everything when it
returns: one region, ``compiled forward``. Under full checkpointing the compiled region also saves the CPU
generator's state (``torch.get_rng_state()``, a host tensor, ``preserve_rng_state``): left out, it holds
no device memory.
"""

from __future__ import annotations

import gc
import weakref
from collections import defaultdict
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zerocalc.model.architecture import Architecture
from zerocalc.model.code import Compiled
from zerocalc.validate.saved import (
    MeasuredStorage,
    SavedCase,
    SavedReport,
    predict_compiled_regions,
    with_regions,
)
from zerocalc.validate.saved_measure import DTYPES

IGNORE_INDEX = -100


def precompute_freqs_cis(dim: int, end: int, theta: float = 500000.0) -> torch.Tensor:
    """torchtitan ``precompute_freqs_cis`` (no scaling): complex64 [end, dim/2]."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """torchtitan ``apply_rotary_emb`` (``reshape_for_broadcast`` for [s, d/2] tables)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        h, d = arch.hidden_size, arch.dim_per_head
        self.head_dim = d
        self.wq = nn.Linear(h, arch.num_heads * d, bias=False)
        self.wk = nn.Linear(h, arch.kv_heads * d, bias=False)
        self.wv = nn.Linear(h, arch.kv_heads * d, bias=False)
        self.wo = nn.Linear(arch.num_heads * d, h, bias=False)
        self.enable_gqa = arch.kv_heads < arch.num_heads

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        output = F.scaled_dot_product_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True,
            enable_gqa=self.enable_gqa,
        ).transpose(1, 2).contiguous()  # fmt: skip
        return self.wo(output.view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        h, f = arch.hidden_size, arch.intermediate_size
        self.w1 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)
        self.w3 = nn.Linear(h, f, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        self.attention = Attention(arch)
        self.feed_forward = FeedForward(arch)
        self.attention_norm = nn.RMSNorm(arch.hidden_size, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(arch.hidden_size, eps=1e-5)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    """torchtitan v0.2.2's ``Transformer`` (Llama 3) at ``arch``'s sizes."""

    def __init__(self, arch: Architecture, max_seq_len: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(arch.dim_per_head, max_seq_len), persistent=False
        )
        self.layers = nn.ModuleDict({str(i): TransformerBlock(arch) for i in range(arch.num_layers)})
        self.norm = nn.RMSNorm(arch.hidden_size, eps=1e-5)
        self.output = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[: tokens.shape[1]]
        for layer in self.layers.values():
            h = layer(h, freqs_cis)
        return self.output(self.norm(h))


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan v0.2.2 ``components/loss.py::cross_entropy_loss``."""
    return F.cross_entropy(
        pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=IGNORE_INDEX
    )


def titan_model(
    arch: Architecture,
    s: int,
    dtype: str,
    recompute: str,
    compile_model: bool,
    fp8: bool = False,
    parallelize: Any = None,
) -> TitanLlama:
    """The model of ``arch`` in ``dtype``, its blocks checkpointed as ``recompute`` says (torchtitan
    ``apply_ac``: ``ptd_checkpoint_wrapper`` with ``preserve_rng_state=True``, ``determinism_check=
    "default"``, ``early_stop=False``; ``op``: torchtitan's op-level policy) and then compiled
    (``apply_compile``: each block, ``fullgraph=True``) where ``compile_model``. ``parallelize``: called
    on the model before checkpointing and compile, as torchtitan's ``parallelize_llama`` applies TP
    first (:func:`zerocalc.validate.compiled_tp.apply_tp`)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    from zerocalc.validate.op_sac import _Block, _policy, torchtitan_save_ops

    torch.manual_seed(0)
    model = TitanLlama(arch, s)
    freqs_cis = model.freqs_cis
    delattr(model, "freqs_cis")  # complex64 whatever the dtype (Module.to would cast it to real)
    model.to({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype])
    model.register_buffer("freqs_cis", freqs_cis, persistent=False)
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(
            model, config=Float8LinearConfig(), module_filter_fn=lambda _m, fqn: fqn != "output"
        )
    if parallelize is not None:
        parallelize(model)
    save_ops = torchtitan_save_ops()

    def context_fn():
        return create_selective_checkpoint_contexts(
            partial(_policy, _Block([], []), defaultdict(int), save_ops)
        )

    for name, block in list(model.layers.named_children()):
        if recompute != "none":
            contexts = {"context_fn": context_fn} if recompute == "op" else {}
            block = checkpoint_wrapper(
                block, preserve_rng_state=True, determinism_check="default", early_stop=False, **contexts
            )
        if compile_model:
            block = torch.compile(block, fullgraph=True)
        model.layers.register_module(name, block)
    return model


def measure_titan(
    arch: Architecture,
    b: int,
    s: int,
    dtype: str,
    recompute: str,
    compile_model: bool,
    compile_loss: bool,
    fp8: bool = False,
) -> list[MeasuredStorage]:
    """Every storage one training forward of :func:`titan_model` and its loss saves, with its region; one
    step runs first, so that the compiled regions are built (and the measured step finds them cached).
    ``fp8``: every block linear torchao's ``Float8Linear`` (``convert_to_float8_training`` with the
    default tensorwise config, the output layer left out as torchtitan's ``filter_fqns=["output"]``),
    before checkpointing and compile as torchtitan's converters run; the casts' 0-dim amax and scales
    left out (:data:`~zerocalc.model.code.compiled.COMPILED_FP8_RECOMPUTED`)."""
    model = titan_model(arch, s, dtype, recompute, compile_model, fp8)
    loss_fn = torch.compile(cross_entropy_loss) if compile_loss else cross_entropy_loss
    out = step_saves(model, loss_fn, arch.vocab_size, b, s)
    return [m for m in out if m.shape != ()] if fp8 else out


def step_saves(model: Any, loss_fn: Any, vocab: int, b: int, s: int) -> list[MeasuredStorage]:
    """Every storage one training forward of a torchtitan-layout ``model`` and ``loss_fn`` saves, by region
    (``embedding``, ``layer <i>``, ``final``, ``loss``), on random tokens of ``vocab``; one step runs
    first, so that the compiled regions are built (and the measured step finds them cached)."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (b, s), generator=generator)
    labels = torch.randint(0, vocab, (b, s), generator=generator)
    loss_fn(model(tokens), labels).backward()
    model.zero_grad(set_to_none=True)
    region = ["embedding"]
    handles = [
        layer.register_forward_pre_hook(partial(_enter, region, f"layer {i}"))
        for i, layer in enumerate(model.layers.values())
    ]
    handles.append(model.norm.register_forward_pre_hook(partial(_enter, region, "final")))
    held = _Saved(model)
    try:
        with torch.autograd.graph.saved_tensors_hooks(held.pack(region), lambda t: t):
            logits = model(tokens)
            region[0] = "loss"
            loss = loss_fn(logits, labels)
            del logits
        gc.collect()
        out = held.kept()
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return out


def measure_hf(config: dict[str, Any], b: int, s: int, dtype: str) -> list[MeasuredStorage]:
    """Every storage one training forward of ``torch.compile(model)`` (transformers, the loss inside)
    saves, in one region (``compiled forward``); one step runs first to build the graph."""
    from zerocalc.validate.saved_measure import build

    model = build(config, dtype, "sdpa")
    compiled = torch.compile(model)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(config["vocab_size"]), (b, s), generator=generator)
    compiled(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    region = ["compiled forward"]
    held = _Saved(model)
    with torch.autograd.graph.saved_tensors_hooks(held.pack(region), lambda t: t):
        loss = compiled(input_ids=ids, labels=ids).loss
    gc.collect()
    out = held.kept()
    loss.backward()
    return out


def _enter(region: list[str], name: str, module: nn.Module, args: Any) -> None:
    region[0] = name


class _Saved:
    """The storages saved through the pack hook, first save of each, parameters, buffers and the CPU
    generator's state left out; :meth:`kept` those still held (weak references)."""

    def __init__(self, model: nn.Module) -> None:
        self.states = {
            _local(t).untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())
        }
        self.rng_bytes = torch.get_rng_state().numel()
        self.entries: dict[int, tuple[MeasuredStorage, list[weakref.ref]]] = {}

    def pack(self, region: list[str]):
        def hook(saved: torch.Tensor) -> torch.Tensor:
            t = _local(saved)
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0 or ptr in self.states:
                return saved
            if t.dtype == torch.uint8 and storage.nbytes() == self.rng_bytes:
                return saved  # preserve_rng_state's torch.get_rng_state(): host memory
            entry = self.entries.get(ptr)
            if entry is not None and any(ref() is not None for ref in entry[1]):
                entry[1].append(weakref.ref(t))
                return saved
            stored = MeasuredStorage(
                region=region[0], bytes=storage.nbytes(),
                dtype=DTYPES.get(t.dtype, str(t.dtype).removeprefix("torch.")), shape=tuple(t.shape),
            )  # fmt: skip
            self.entries[ptr] = (stored, [weakref.ref(t)])
            return saved

        return hook

    def kept(self) -> list[MeasuredStorage]:
        return [m for m, refs in self.entries.values() if any(ref() is not None for ref in refs)]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor a rank's memory holds: a DTensor's local shard, a functional collective's pending
    result (``AsyncCollectiveTensor.elem``), any other tensor itself."""
    while type(t) is not torch.Tensor and type(t) is not nn.Parameter:
        inner = getattr(t, "_local_tensor", None)
        if inner is None:
            inner = getattr(t, "elem", None)
        if inner is None:
            return t
        t = inner
    return t


COMPILED_FAMILIES = ("llama", "mistral", "qwen2")
"""The tiny configs (:data:`~zerocalc.validate.saved.TINY_CONFIGS`) of the dense Llama block the compiled
saves are modelled for (:func:`~zerocalc.model.code.compile_unsupported`): RMSNorm, SwiGLU, no q/k norm,
no fused projections (Qwen2's q/k/v biases are saved by no one: a bias's gradient needs no input)."""


def run_cases(
    models: list[tuple[str, dict[str, Any]]],
    codes: list[str],
    dtypes: list[str],
    recomputes: list[str],
    compiled: Compiled,
    shapes: list[tuple[int, int]],
    fp8: bool = False,
) -> SavedReport:
    """Every model × code × dtype × recompute × (b, s) compiled as ``compiled`` says, measured and
    compared with :func:`~zerocalc.validate.saved.predict_compiled_regions` (transformers' code under
    recompute none only: its whole-graph compile is not modelled with checkpointing); ``fp8``:
    torchtitan's blocks with torchao's tensorwise ``Float8Linear``."""
    import transformers

    from zerocalc.model.code import Shape
    from zerocalc.model.hf_config import architecture_from_hf_dict

    cases = []
    for name, config in models:
        arch = architecture_from_hf_dict(config, f"--model {name!r}", name)
        for code in codes:
            for dtype in dtypes:
                for recompute in recomputes if code == "torchtitan" else ["none"]:
                    for b, s in shapes:
                        if code == "torchtitan":
                            measured = measure_titan(
                                arch, b, s, dtype, recompute, compiled.model, compiled.loss, fp8
                            )
                        else:
                            measured = measure_hf(config, b, s, dtype)
                        predicted = predict_compiled_regions(
                            code, arch, Shape(b, s), dtype, recompute, compiled, fp8
                        )
                        if code == "torchtitan":
                            measured = [m for m in measured if m.region != "final"]  # eager, CPU-composite
                        case = SavedCase(
                            model=name, family=arch.family or "", dtype=dtype, attention="sdpa",
                            micro_batch=b, seq_len=s, regions=(),
                            compiled=f"{code} --compile {compiled.value} --recompute {recompute}"
                            + (" --fp8 tensorwise" if fp8 else ""),
                        )  # fmt: skip
                        cases.append(with_regions(case, predicted, measured))
                        torch._dynamo.reset()
    return SavedReport(
        torch=torch.__version__,
        transformers=transformers.__version__,
        cases=tuple(cases),
        all_match=all(c.ok for c in cases),
    )
