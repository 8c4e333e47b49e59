"""What a fine-tuning run (:mod:`zerocalc.parallel.finetune`) changes of the operations of a micro-batch
(pure): which products backward runs, the LoRA products, the dequantisation of a quantised base.

* **Frozen weights**: no weight-gradient product (autograd computes no gradient for a tensor that does
  not require one); the input-gradient product remains wherever the gradient flows on, that is after the
  first tensor that requires grad. Before it nothing needs a gradient: a frozen layer there runs no
  backward (and its checkpoint re-runs nothing), and the first layer holding a trained tensor computes no
  gradient of its input — its attention's input projections (every attention matrix but the output
  projection) run no input-gradient product, their adapters' ``lora_A`` neither. The layers' input
  requires grad from the start when the embedding is trained, or when it is turned on:
  ``enable_input_require_grads`` under gradient checkpointing (transformers 5.17
  ``modeling_utils.py`` ``gradient_checkpointing_enable``: for every model whose ``main_input_name`` is
  ``input_ids``, and for a PEFT model) and in ``prepare_model_for_kbit_training`` (peft/utils/other.py,
  ``use_gradient_checkpointing=True``).
* **LoRA** (peft 0.21.2 ``tuners/lora/layer.py`` ``Linear.forward``): per targeted Linear of ``in → out``
  and rank r, ``result + lora_B(lora_A(dropout(x))) * scaling``: two products forward, x·Aᵀ (M × r × in)
  and ·Bᵀ (M × out × r), each with both backward products (the adapters are trained). They run in the
  adapters' GEMM-input dtype (the precision record's ``ADAPTER`` kind: the compute dtype under FSDP's
  mixed precision and autocast, fp32 under bf16-pure, where PEFT's ``autocast_adapter_dtype`` adapters
  stay fp32). Element-wise: the input cast to the adapter weight's dtype as the forward sees it
  (``x = self._cast_input_dtype(x, lora_A.weight.dtype)``: the stored fp32 weight under autocast, whose
  GEMM then casts x back, the gathered compute-dtype weight under FSDP), the dropout where p > 0, the
  scaling and the sum into the result in the promoted dtype, and the cast of the result back
  (``result.to(torch_result_dtype)``).
* **DoRA** (peft 0.21.2 ``tuners/lora/dora.py`` ``DoraLinearLayer.forward``): per adapted layer and forward,
  ``lora_B.weight @ lora_A.weight`` (out × in × r, detached: no backward), the base weight dequantised
  again (``dequantize_module_weight``) and the norm of ``weight + scaling·lora_weight`` over out × in
  (about 6 bytes per element at 16 bits: the scale, the sum, the norm's read), the magnitude's scaling
  of the two results (about 10 bytes per output element at 16 bits); with dropout p > 0 the base product
  runs again on the dropped input (``base_result`` None: ``F.linear(x, weight)``), with its input
  gradient.
* **Dequantisation** (bitsandbytes 0.50.2): a 4-bit weight in training (M > 1536 rows:
  ``backends/cuda/ops.py`` ``gemm_4bit`` → ``_dequant_linear_fallback``) is dequantised to the compute
  dtype before the product, forward and again in backward for the input gradient
  (``autograd/_functions.py`` ``MatMul4Bit.backward``: ``F.dequantize_4bit(B, ctx.state)``, only
  ``if req_gradA``); a memory-bound element-wise kernel priced by its bytes, the storage read (packed,
  absmax, the nested statistics: :mod:`zerocalc.model.quantized`) and n weights written in the compute
  dtype. LLM.int8 is priced the same way (its weight and row scales read, the weight written) with its
  product at the compute dtype's rate: its int8 product and the input's quantisation are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.model.architecture import Architecture
from zerocalc.model.quantized import quantized_modules, weight_storage
from zerocalc.parallel.finetune import TRAINED_KINDS, FineTuning, parameter_kinds
from zerocalc.parallel.precision import ParamKind

_TRAINED = TRAINED_KINDS
DORA_NORM_BYTES = 6
"""DoRA's weight norm, bytes per weight element at 16 bits (the scale, the sum, the norm's read)."""
DORA_COMBINE_BYTES = 10
"""DoRA's combination of the base and LoRA results, bytes per output element at 16 bits."""


class TunedLinear(NamedTuple):
    """How a fine-tuning run runs one Linear."""

    trained: bool
    """Its weight has a gradient (trained in full, or a ``modules_to_save`` copy)."""
    rank: int = 0
    """Its LoRA rank (0: no adapter)."""
    dequant_bytes: int = 0
    """Bytes one dequantisation of its weight reads and writes (0: not quantised)."""


TRAINED_LINEAR = TunedLinear(trained=True)


@dataclass(frozen=True)
class FineTuneOps:
    """What a fine-tuning run changes of a micro-batch's operations (hashable: a key of the caches)."""

    linears: tuple[tuple[str, TunedLinear], ...]
    """Every Linear's (by its module name), the LM head's included."""
    trained_layers: frozenset[int]
    """The layers holding a trained tensor (adapters included)."""
    input_grad: bool
    """The layers' input requires grad from the start (see the module's doc)."""
    lora_dtype: DType
    """The LoRA products' input dtype."""
    lora_cast_bytes: int
    """Bytes the casts of a LoRA layer's input move per input element."""
    dropout: bool
    dora: bool
    by_module: dict[str, TunedLinear] = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_module", dict(self.linears))

    def linear(self, module: str) -> TunedLinear:
        return self.by_module.get(module, TRAINED_LINEAR)

    def grad_in(self, index: int) -> bool:
        """Whether layer ``index``'s input requires grad."""
        return self.input_grad or any(i < index for i in self.trained_layers)

    def backward_runs(self, index: int) -> bool:
        """Whether layer ``index`` runs a backward (it, or a layer before it, requires grad)."""
        return self.grad_in(index) or index in self.trained_layers


def _base_module(module: str) -> str:
    """The base module an adapter or a ``modules_to_save`` copy belongs to."""
    return module.split(".lora_")[0].split(".modules_to_save")[0]


@lru_cache(maxsize=64)
def finetune_ops(
    arch: Architecture,
    finetune: FineTuning,
    input_grad: bool,
    lora_dtype: DType,
    lora_seen: DType,
    activation: DType,
    compute: DType,
) -> FineTuneOps:
    """The fine-tuning's :class:`FineTuneOps` (``lora_seen``: the adapter weight's dtype as the forward
    sees it; ``compute``: the dtype a quantised weight is dequantised to)."""
    kinded = parameter_kinds(arch, finetune)
    trained_modules = {_base_module(k.tensor.module) for k in kinded if k.kind in _TRAINED}
    ranks = {
        _base_module(k.tensor.module): k.tensor.shape[0]
        for k in kinded
        if k.kind is ParamKind.ADAPTER and ".lora_A." in f"{k.tensor.module}."
    }
    dequant: dict[str, int] = {}
    if finetune.quantized:
        assert finetune.quant is not None
        quant = finetune.quant
        for module in quantized_modules(arch, quant.skip_modules):
            stored = sum(
                p.bytes for p in weight_storage(module, quant.method, quant.double_quant, quant.storage)
            )
            out, inner = module.weight
            for tensor in module.tensors:
                if tensor.name == "weight":
                    dequant[tensor.module] = stored + out * inner * compute.bytes
    base_weights = {k.tensor.module: k.kind for k in kinded if k.tensor.name == "weight"}
    linears = tuple(
        (
            module,
            TunedLinear(
                trained=kind in (ParamKind.TRAINABLE, ParamKind.SAVED_COPY)
                or (module in trained_modules and module not in ranks),
                rank=ranks.get(module, 0),
                dequant_bytes=dequant.get(module, 0),
            ),
        )
        for module, kind in base_weights.items()
        if ".lora_" not in module and ".modules_to_save" not in module
    )
    trained_layers = frozenset(
        int(k.tensor.module.split(".")[1])
        for k in kinded
        if k.kind in _TRAINED and k.tensor.module.startswith("layers.")
    )
    embedding_trained = any(k.kind in _TRAINED and k.tensor.module.startswith("embed_") for k in kinded)
    cast = 0
    if lora_seen is not activation:
        cast += activation.bytes + lora_seen.bytes
    if lora_dtype is not lora_seen:
        cast += lora_seen.bytes + lora_dtype.bytes
    lora = finetune.lora
    return FineTuneOps(
        linears=linears,
        trained_layers=trained_layers,
        input_grad=input_grad or embedding_trained,
        lora_dtype=lora_dtype,
        lora_cast_bytes=cast,
        dropout=lora is not None and lora.dropout > 0,
        dora=lora is not None and lora.dora,
    )


@lru_cache(maxsize=64)
def matmul_split(arch: Architecture, finetune: FineTuning) -> tuple[float, int]:
    """(frozen matrix parameters a token uses, adapter matrix parameters): the frozen Linear weights
    outside the embedding (a routed expert's at k of its E experts), and LoRA's A and B matrices."""
    frozen = 0.0
    adapters = 0
    share = arch.experts_per_token / arch.num_experts if arch.is_moe else 1.0
    for k in parameter_kinds(arch, finetune):
        t = k.tensor
        if k.kind is ParamKind.ADAPTER and len(t.shape) == 2:
            adapters += t.numel
        elif k.kind not in _TRAINED and t.name == "weight" and not t.module.startswith("embed_"):
            if len(t.shape) == 2:
                frozen += t.numel
            elif len(t.shape) == 3:
                frozen += t.numel * share
    return frozen, adapters
