"""The torch side of ``zerocalc validate activations``: what a real Hugging Face model saves for backward.

One forward of ``AutoModelForCausalLM.from_config(config)`` in train mode with ``labels = input_ids`` (the
model's own loss, ``loss/loss_utils.py::ForCausalLMLoss``) runs under
``torch.autograd.graph.saved_tensors_hooks`` (``torch/autograd/graph.py``): every tensor an autograd node
saves passes through the pack hook. Storages are deduplicated by ``untyped_storage().data_ptr()``;
parameters and views of parameters are left out (they are model states, not activations). What is kept
for backward is what is still held once the forward has returned: a tensor saved by a node the loss does
not reach (the discarded values of a ``topk`` whose indices only are used: DeepSeek-V3's group router)
is freed with that node, so it is not counted, and the address it frees is a new storage when a later
save reuses it (each saved tensor is watched by a weak reference). Each storage is
attributed to the region whose forward first saved it: ``embedding`` (before the first decoder layer),
``layer <i>``, ``final`` (the final norm and the LM head), ``loss`` (after the LM head). Imports torch and
transformers; imported only when the command runs.
"""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerocalc.validate.saved import MeasuredStorage, SavedReport, compare

if TYPE_CHECKING:
    from zerocalc.parallel.finetune import FineTuning

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "int64",
          torch.int32: "int32", torch.bool: "bool"}  # fmt: skip


def build(
    config: dict[str, Any], dtype: str, attention: str, finetune: FineTuning | None = None
) -> nn.Module:
    """The transformers model of ``config`` (a config.json dict), random weights, in train mode, cast to
    ``dtype`` (bf16: the parameters every op sees under FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)``,
    which are leaf parameters as a cast model's are); fine-tuned as ``finetune`` says
    (:func:`tune`)."""
    import transformers

    transformers.logging.set_verbosity_error()
    kw = dict(config)
    cfg = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation=attention
    )
    model.train()
    if dtype == "bf16":
        model.to(torch.bfloat16)
    if finetune is not None:
        model = tune(model, finetune, dtype, attention)
    return model


def tune(model: nn.Module, finetune: FineTuning, dtype: str, attention: str) -> nn.Module:
    """``model`` fine-tuned as its users do: a 4-bit base reloaded through transformers'
    ``BitsAndBytesConfig`` (``from_pretrained`` of the saved model, compute dtype ``dtype``; bitsandbytes
    0.50 runs on the CPU), ``prepare_model_for_kbit_training(use_gradient_checkpointing=False)`` where
    asked, then PEFT's ``get_peft_model(LoraConfig(...))``
    (:func:`zerocalc.validate.peft_model.lora_model`); or, for a full fine-tune, the ``freeze``
    modules' parameters frozen (a module named so or ending with ``.name``)."""
    import tempfile

    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    if finetune.quantized:
        import peft

        assert finetune.quant is not None
        q = finetune.quant
        storage = {"uint8": torch.uint8, "int8": torch.int8, "bf16": torch.bfloat16, "fp16": torch.float16,
                   "fp32": torch.float32}[q.storage.value]  # fmt: skip
        bnb = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=q.method.value,
            bnb_4bit_use_double_quant=q.double_quant,
            bnb_4bit_compute_dtype=torch_dtype,
            bnb_4bit_quant_storage=storage,
            llm_int8_skip_modules=list(q.skip_modules) if q.skip_modules is not None else None,
        )
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, quantization_config=bnb, dtype=torch_dtype, attn_implementation=attention
            )
        if q.kbit_prepare:
            model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if finetune.lora is not None:
        from zerocalc.validate.peft_model import lora_model

        model = lora_model(model, finetune.lora)
    for name in finetune.freeze:
        for key, module in model.named_modules():
            if key == name or key.endswith(f".{name}"):
                for parameter in module.parameters():
                    parameter.requires_grad_(False)
    model.train()
    return model


def _matmul_4bit_saves(record) -> Any:
    """bitsandbytes' ``MatMul4Bit`` keeps its tensors in ``ctx.tensors`` (autograd/_functions.py), which
    ``saved_tensors_hooks`` never sees: its forward is wrapped so that every tensor left there is passed
    to ``record`` (a context manager; nothing without bitsandbytes)."""
    import contextlib

    try:
        from bitsandbytes.autograd import _functions
    except ImportError:
        return contextlib.nullcontext()
    original = _functions.MatMul4Bit.forward

    @contextlib.contextmanager
    def wrapped():
        def forward(ctx, *args, **kwargs):
            out = original(ctx, *args, **kwargs)
            for t in getattr(ctx, "tensors", ()) or ():
                if isinstance(t, torch.Tensor):
                    record(t, "MatMul4Bit (ctx.tensors)")
            return out

        _functions.MatMul4Bit.forward = staticmethod(forward)
        try:
            yield
        finally:
            _functions.MatMul4Bit.forward = staticmethod(original)

    return wrapped()


def decoder_layers(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The decoder's list of blocks: the first ``ModuleList`` of ``num_layers`` modules (``model.layers``,
    ``transformer.h``, ``gpt_neox.layers``)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return module
    raise RuntimeError(f"no list of {num_layers} decoder layers in {type(model).__name__}")


def measure(model: nn.Module, num_layers: int, b: int, s: int, vocab: int) -> list[MeasuredStorage]:
    """Every storage one training forward saves, in the order first saved, with the region saving it."""
    layers = decoder_layers(model, num_layers)
    head = model.get_output_embeddings()
    region = ["embedding"]
    handles = []

    def enter(name: str):
        def hook(module: nn.Module, args: Any) -> None:
            region[0] = name

        return hook

    def leave(name: str):
        def hook(module: nn.Module, args: Any, out: Any) -> None:
            region[0] = name

        return hook

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(f"layer {i}")))
    handles.append(layers[-1].register_forward_hook(leave("final")))
    handles.append(head.register_forward_hook(leave("loss")))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    latest: dict[int, int] = {}  # storage address → its newest entry in out
    out: list[MeasuredStorage] = []
    ptrs: list[int] = []
    holders: list[list[weakref.ref]] = []  # per entry: the saved tensors of that storage

    extra: dict[int, str] = {}  # storage → who keeps it outside saved_tensors_hooks

    def record(t: torch.Tensor, by: str) -> None:
        if t.untyped_storage().data_ptr() not in params:
            extra[t.untyped_storage().data_ptr()] = by
        pack(t)

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in params:
            # a parameter's storage, unless the forward replaced it and freed this address (bitsandbytes'
            # Linear4bit.forward: ``bias.data = bias.data.to(x.dtype)``)
            params.clear()
            params.update(p.untyped_storage().data_ptr() for p in model.parameters())
        if ptr == 0 or ptr in params:
            return t
        entry = latest.get(ptr)
        if entry is not None and any(ref() is not None for ref in holders[entry]):
            holders[entry].append(weakref.ref(t))  # one more save of a storage still held
            return t
        latest[ptr] = len(out)  # new, or an address a storage freed before reuses
        ptrs.append(ptr)
        holders.append([weakref.ref(t)])
        out.append(
            MeasuredStorage(
                region=region[0],
                bytes=storage.nbytes(),
                dtype=DTYPES.get(t.dtype, str(t.dtype).removeprefix("torch.")),
                shape=tuple(t.shape),
            )
        )
        return t

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (b, s), generator=generator)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _matmul_4bit_saves(record):
            loss = model(input_ids=ids, labels=ids).loss
        gc.collect()
        held = [any(ref() is not None for ref in refs) for refs in holders]
        savers = saved_by(loss)
        loss.backward()  # the saved tensors are the ones backward uses: it must run
    finally:
        for handle in handles:
            handle.remove()
    # kept by a node the loss reaches, or by MatMul4Bit's ctx: a graph the loss does not reach (one the
    # forward detached, as DoRA's weight norm) is freed with its last reference, except that a pack hook
    # returning the tensor itself makes a node that saves its own output a reference cycle (the autograd
    # docs' caveat of saved_tensors_hooks), which only that graph's backward would break
    return [
        m.model_copy(
            update={"saved_by": ", ".join(savers.get(ptr, []) + ([extra[ptr]] if ptr in extra else []))}
        )
        for m, ptr, kept in zip(out, ptrs, held, strict=True)
        if kept and (ptr in savers or ptr in extra)
    ]


def saved_by(loss: torch.Tensor) -> dict[int, list[str]]:
    """Storage address → the autograd nodes that saved a tensor of it (``node._saved_<name>`` attributes,
    ``torch/csrc/autograd/generated/python_functions.cpp``), walking the graph from the loss."""
    found: dict[int, list[str]] = {}
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:  # freed, or not a tensor
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    names = found.setdefault(t.untyped_storage().data_ptr(), [])
                    label = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1")
                    if label not in names:
                        names.append(label)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def run_cases(
    models: list[tuple[str, dict[str, Any]]],
    dtypes: list[str],
    attentions: list[str],
    shapes: list[tuple[int, int]],
    finetune: FineTuning | None = None,
) -> SavedReport:
    """Every model × dtype × attention × (b, s): measured and compared with the ``hf`` profile (SDPA
    only for families whose code has it: not :data:`~zerocalc.model.code.HF_EAGER_ONLY`); fine-tuned as
    ``finetune`` says, against :func:`zerocalc.parallel.finetune.forward_tuning`'s forward."""
    import transformers

    from zerocalc.base.dtypes import DType
    from zerocalc.model.code import HF_EAGER_ONLY, Shape
    from zerocalc.model.hf_config import architecture_from_hf_dict
    from zerocalc.parallel.finetune import forward_tuning, peft_alone

    cases = []
    for name, config in models:
        arch = architecture_from_hf_dict(config, f"--model {name!r}", name)
        for dtype in dtypes:
            for attention in attentions:
                if attention == "sdpa" and arch.family in HF_EAGER_ONLY:
                    continue  # its transformers code refuses attn_implementation="sdpa"
                model = build(config, dtype, attention, finetune)
                tuning = None
                if finetune is not None:
                    tuning = forward_tuning(arch, finetune, weights=peft_alone(finetune, DType(dtype)))
                label = "" if finetune is None else tuning_label(finetune)
                for b, s in shapes:
                    measured = measure(model, arch.num_layers, b, s, arch.vocab_size)
                    cases.append(compare(name, arch, Shape(b, s), dtype, attention, measured, tuning, label))
                del model
    return SavedReport(
        torch=torch.__version__,
        transformers=transformers.__version__,
        peft=_version("peft") if finetune is not None else "",
        bitsandbytes=_version("bitsandbytes") if finetune is not None and finetune.quantized else "",
        cases=tuple(cases),
        all_match=all(c.ok for c in cases),
    )


def tuning_label(finetune: FineTuning) -> str:
    """A short name of the fine-tuning measured: ``lora r8 all-linear dropout 0.1 dora nf4 kbit``."""
    parts = []
    if finetune.lora is not None:
        lora = finetune.lora
        targets = lora.targets if isinstance(lora.targets, str) else ",".join(lora.targets or ("default",))
        parts += [f"lora r{lora.rank} {targets}"]
        parts += [f"dropout {lora.dropout:g}"] if lora.dropout else []
        parts += ["dora"] if lora.dora else []
        parts += [] if lora.autocast_adapter_dtype else ["adapters in the base's dtype"]
        parts += [f"save {','.join(lora.modules_to_save)}"] if lora.modules_to_save else []
    if finetune.quantized and finetune.quant is not None:
        parts += [finetune.quant.method.value + (" dq" if finetune.quant.double_quant else "")]
        parts += ["kbit"] if finetune.quant.kbit_prepare else []
    if finetune.freeze:
        parts += [f"freeze {','.join(finetune.freeze)}"]
    return " ".join(parts)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
