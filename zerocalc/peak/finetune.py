"""The peak of a fine-tuning step: how a LoRA, DoRA or QLoRA run holds its tensors through a step (pure).

What each parameter tensor is (trained, frozen, quantised, an adapter) is
:func:`zerocalc.parallel.finetune.parameter_kinds`' alone; its dtypes are the precision record's
(:func:`zerocalc.states.memory.finetune_dtypes`); what the forward saves for backward is the model code's
(:mod:`zerocalc.model.code`). This module builds, per FSDP unit (a block, the root), each tensor's bytes at
rest, as all-gathered and as dequantised, and answers the step timeline's hooks
(:class:`~zerocalc.peak.timeline.StepHooks`) with them:

* **at rest**: each tensor's shard in its stored dtype (the states' own rule: ``ceil(numel / d)`` per
  tensor, a quantised weight's storage parts sharded alike), the optimizer states of the trained tensors
  only (bitsandbytes' 8-bit states; paged states in unified memory, outside the caching allocator);
  under FSDP's CPU offload (FSDP1 ``CPUOffload(offload_params=True)``, FSDP2 ``CPUOffloadPolicy``) none of
  them on the GPU (torch 2.13 ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``
  ``FSDPParam._init_sharded_param``: ``padded_sharded_param.cpu()`` when ``offload_to_cpu``;
  FSDP1 ``_flat_param.py`` ``FlatParamHandle.shard`` keeps the shard on the CPU);
* **a unit's forward and backward**: FSDP gathers the unit, every tensor at its all-gather dtype (a
  quantised weight's packed data at ``bnb_4bit_quant_storage``: the reason it exists; its absmax and code
  tables stay in its ``QuantState``, not a parameter, so not gathered: bitsandbytes 0.50
  ``bitsandbytes/nn/modules.py`` ``Params4bit``); with CPU offload the shard is first copied to the GPU
  (FSDP2 ``FSDPParam.all_gather_inputs``: ``sharded_param_data.to(self.device, non_blocking=True)``;
  FSDP1 ``_runtime_utils._unshard``/``FlatParamHandle.pre_unshard``: ``_mp_shard`` copied from the
  CPU shard). Each FSDP unit's previous unit is prefetched in backward (FSDP2 ``_backward_prefetch``,
  FSDP1 ``BackwardPrefetch.BACKWARD_PRE``);
* **the dequantisation transient**: bitsandbytes' ``Linear4bit.forward`` calls
  ``bnb.matmul_4bit(x, self.weight.t(), quant_state=...)``, whose ``MatMul4Bit.forward``
  (``bitsandbytes/autograd/_functions.py``) dequantises the whole weight to the compute dtype
  (``F.dequantize_4bit(B, quant_state).to(A.dtype).t()``), multiplies and frees it, and whose backward
  dequantises it again for the input's gradient: one [out, in] weight in the compute dtype alive beside
  the layer's tensors during the unit's forward and backward (the largest of the unit's, one at a time).
  ``Linear8bitLt`` (``MatMul8bitLt``) keeps its int8 weight and dequantises likewise for the backward. DoRA
  (``peft/tuners/lora/dora.py`` ``DoraLinearLayer.forward``) builds the identity ``eye(in)`` in the
  input's dtype, ``lora_weight = lora_B(lora_A(eye)).T`` [out, in] in the adapter's dtype, the base weight
  dequantised and cast to the input's dtype, and ``weight + scaling·lora_weight`` for its norm: those
  [out, in] tensors for the largest DoRA-targeted Linear of the unit;
* **gradients**: of the trained tensors only (a frozen tensor has no ``.grad``; FSDP2's
  ``foreach_reduce`` gets only the parameters with a gradient: ``_fsdp_param_group.py``
  ``post_backward``: ``if fsdp_param.unsharded_accumulated_grad is not None or ...``; under FSDP1 PEFT's
  ``fsdp_auto_wrap_policy`` (peft 0.21 ``peft/utils/other.py``: ``lambda_policy_fn``, every leaf module
  with a trained weight its own unit, beside the decoder layers) keeps each flat parameter all frozen or all
  trained, so no flat gradient covers frozen weights, which FSDP1 ``use_orig_params=True`` with mixed
  ``requires_grad`` in one unit would materialise: ``_flat_param.py`` ``_use_sharded_grad_views``, the
  docstring's "higher than expected gradient memory usage"), reduced in
  the reduce dtype and kept sharded in the main-gradient dtype; under CPU offload copied to the host
  (FSDP2 ``foreach_reduce``: ``new_sharded_grad.to(torch.device("cpu"), non_blocking=True)``, FSDP1
  ``_post_backward_hook`` ``_offload_grad``): on the GPU only until then;
* **the optimizer step**: torch's AdamW over the trained tensors (its ``foreach`` temporaries);
  bitsandbytes' 8-bit and paged optimizers run one fused kernel per tensor
  (``optimizer_update_8bit_blockwise``): no temporaries; under CPU offload the step runs on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.units import ceil_div
from zerocalc.model.architecture import Architecture, ParamTensor
from zerocalc.model.quantized import Part, QuantMethod, quantized_modules, weight_storage
from zerocalc.parallel.finetune import FineTuning, parameter_kinds
from zerocalc.parallel.framework_records.record import ModelInit
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchWrapper
from zerocalc.parallel.optimizers import BNB_QMAP_BYTES, OPTIMIZERS, OptimizerImpl
from zerocalc.parallel.precision import ParamKind
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, StrategyName
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.ledger import Ledger
from zerocalc.peak.mechanics import DEFAULT_STREAMS, FSDP1_STREAMS, Accumulation, Mechanics, Unit, UnitStreams
from zerocalc.peak.timeline import GATHERED, GRADS, OPTIMIZER, OPTIMIZER_TEMP, PARAMS, REDUCE, TRANSIENT
from zerocalc.request.training import TrainingRequest
from zerocalc.states.framework import fsdp_unit_positions
from zerocalc.states.memory import (
    QUANT_DATA_PARTS,
    TRAINED_KINDS,
    finetune_dtypes,
    finetune_shard,
    params_group,
)

FP32 = DType.FP32.bytes


_HERE = "zerocalc.peak.finetune"
FINETUNE_SOURCES = {
    TensorKind.PARAMETERS: f"{_HERE}: each tensor's shard in its kind's stored dtype (PEFT 0.21, bnb "
    "0.50 QuantState whole)",
    TensorKind.GATHERED: f"{_HERE}: a unit's tensors at their all-gather dtype (torch 2.13 FSDP)",
    TensorKind.GRADIENTS: f"{_HERE}: the trained tensors' gradients only",
    TensorKind.OPTIMIZER_STATES: f"{_HERE}: the trained tensors' states (torch AdamW, bitsandbytes 8-bit)",
    TensorKind.TRANSIENT: f"{_HERE}: 4-bit weights dequantised (bitsandbytes 0.50 MatMul4Bit), DoRA's "
    "weight norm (peft dora.py); the model code's intermediates",
}
"""Where a fine-tuning step's tensors come from, by kind (the peak's term sources)."""


class FtTensor(NamedTuple):
    """One parameter tensor of a fine-tuning run as the step holds it (bytes)."""

    name: str
    kind: ParamKind
    numel: int
    resident: int
    """Its shard at rest in its stored dtype (a quantised weight: its packed data's shard and its whole
    ``QuantState``)."""
    quant_state: int
    """A quantised weight's ``QuantState`` (absmax, code tables): on the GPU even under CPU offload, which
    moves parameters only (:data:`~zerocalc.states.memory.QUANT_DATA_PARTS`)."""
    gathered: int
    """Unsharded, as all-gathered (a quantised weight: its packed data in the storage dtype)."""
    shard_copy: int
    """Its shard as copied to the GPU before the all-gather (CPU offload)."""
    grad: int
    """Its unsharded gradient (0: not trained)."""
    reduced: int
    """Its gradient as reduced, in the reduce dtype, on this rank (its shard, or whole when replicated)."""
    main_grad: int
    """Its gradient as kept for the optimizer, on this rank."""
    optimizer: tuple[int, ...]
    """Each of its optimizer states held by the caching allocator on this rank, one tensor each (paged
    ones are outside it)."""
    step_temp: int
    """What the optimizer step allocates for it (torch's foreach AdamW: one tensor in the state dtype)."""
    dequantized: int
    """A quantised weight dequantised to the compute dtype (0: not quantised)."""
    dora: int
    """DoRA's transients for this weight's layer (0: no DoRA magnitude for it)."""


class FtUnit(NamedTuple):
    name: str
    tensors: tuple[FtTensor, ...]

    @property
    def trained(self) -> tuple[FtTensor, ...]:
        return tuple(t for t in self.tensors if t.grad)

    @property
    def backward_transient(self) -> int:
        """The largest dequantised weight of the unit's (``MatMul4Bit.backward`` always dequantises)."""
        return max((t.dequantized for t in self.tensors), default=0)


FUSED_4BIT_MAX_TOKENS = 1536
"""bitsandbytes 0.50 ``backends/cuda/ops.py`` ``_gemm_4bit_custom_max_m``: past 1,536 rows of the input
(tokens), ``gemm_4bit`` dequantises the weight and calls ``F.linear`` (``_dequant_linear_fallback``); at
fewer, a per-architecture heuristic (``_gemm_4bit_use_custom_cuda``) may pick the fused kernel, which
dequantises nothing: counted so (the backward dequantises in every case)."""


class FtLayout(NamedTuple):
    """How the request's framework runs a fine-tuning step under one strategy."""

    gather: bool
    """Units are gathered before use and released after (FSDP, ZeRO-3)."""
    world: int
    """Ranks the parameters are sharded over."""
    grad_world: int
    optimizer_world: int
    offload: bool
    """FSDP's CPU offload: parameters, gradients and the optimizer step on the host."""
    keep_root: bool
    """The root stays unsharded from forward to backward (FSDP1's root, ZeRO-3's)."""
    replicated_buckets: bool
    """DDP's reducer keeps a bucket copy of every trained gradient (world > 1)."""
    unit_grad_buffer: bool = False
    """A unit's sharded gradients are views into its one reduce-scatter output (FSDP2
    ``_fsdp_collectives.foreach_reduce``); else each tensor's own (DDP's ``.grad``, FSDP1's flat parameter
    of each adapter Linear under PEFT's wrap policy)."""
    streams: UnitStreams = DEFAULT_STREAMS
    """The streams a unit's shard copy, its unsharded tensors and its gradient reduction allocate on:
    FSDP1's own (:data:`~zerocalc.peak.mechanics.FSDP1_STREAMS`); FSDP2's and DDP's on the default stream,
    as the eight H100 FSDP2 runs' reserved bytes were reproduced."""
    optimizer_extra: int = 0
    """Optimizer bytes not of one tensor: bitsandbytes' two quantisation maps of an 8-bit optimizer
    (:data:`~zerocalc.parallel.optimizers.BNB_QMAP_BYTES`, one pair on the device)."""


def _layout(request: TrainingRequest, name: StrategyName) -> FtLayout:
    strategy = STRATEGIES[name]
    cluster = request.cluster
    setup = request.framework_record.torch_setup(name)
    world = cluster.group_size(params_group(strategy, request))
    offload = setup is not None and request.offload_params is not OffloadTarget.NONE
    if setup is None:  # an accounting: the strategy's rule (ZeRO paper §5)
        return FtLayout(
            gather=strategy.params is not None and world > 1,
            world=world,
            grad_world=cluster.group_size(strategy.grads),
            optimizer_world=cluster.group_size(strategy.optimizer),
            offload=False,
            keep_root=True,
            replicated_buckets=strategy.grads is None and cluster.world_size > 1,
        )
    fsdp = setup.wrapper in (TorchWrapper.FSDP1, TorchWrapper.FSDP2)
    no_shard = setup.sharding is Fsdp1Sharding.NO_SHARD
    return FtLayout(
        gather=fsdp and not no_shard,
        world=world,
        grad_world=cluster.group_size(strategy.grads) if fsdp and not no_shard else 1,
        optimizer_world=cluster.group_size(strategy.optimizer) if fsdp and not no_shard else 1,
        offload=offload,
        keep_root=setup.wrapper is TorchWrapper.FSDP1 or not setup.reshard_after_forward,
        unit_grad_buffer=setup.wrapper is TorchWrapper.FSDP2 and not no_shard,
        replicated_buckets=not fsdp and cluster.world_size > 1,
        **({"streams": FSDP1_STREAMS} if setup.wrapper is TorchWrapper.FSDP1 else {}),
    )


class _Quantized(NamedTuple):
    parts: dict[Part, int]
    """The module's storage, part by part (:func:`zerocalc.model.quantized.weight_storage`)."""
    weights: int
    """The module's weight elements (one Linear: GPT-2's ``c_attn`` holds q, k and v)."""


def _quant_parts(arch: Architecture, finetune: FineTuning) -> dict[ParamTensor, _Quantized]:
    """Each quantised module's storage, on its first weight tensor (the others of a stacked module: none)."""
    quant = finetune.quant
    if quant is None or quant.method is QuantMethod.NONE:
        return {}
    parts: dict[ParamTensor, _Quantized] = {}
    for module in quantized_modules(arch, quant.skip_modules):
        weights = [t for t in module.tensors if t.name == "weight"]
        storage = weight_storage(module, quant.method, quant.double_quant, quant.storage)
        out, columns = module.weight
        parts[weights[0]] = _Quantized({p.part: p.bytes for p in storage}, out * columns)
        for other in weights[1:]:
            parts[other] = _Quantized({}, 0)
    return parts


def _nested_absmax_bytes(parts: dict[Part, int]) -> int:
    """With double quantisation the dequantisation first rebuilds the fp32 absmax, one per 64-weight block
    (bitsandbytes 0.50 ``backends/cuda/ops.py`` ``_dequant_linear_fallback``: ``absmax_dq = torch.empty_like
    (absmax_8bit, dtype=torch.float32)``; ``functional.py`` ``dequantize_4bit`` likewise)."""
    if Part.NESTED_ABSMAX not in parts:
        return 0
    return parts[Part.ABSMAX] * DType.FP32.bytes  # the uint8 absmax's elements, as fp32


def _dora_bytes(tensor: ParamTensor, adapter: DType, compute: DType) -> int:
    """DoRA's transients for a [out, in] weight (``DoraLinearLayer.forward``, peft 0.21
    ``peft/tuners/lora/dora.py``): ``eye(in)`` and the weight cast to the input's dtype (the adapter's:
    the LoRA path casts x to it), ``lora_weight`` and ``weight + scaling·lora_weight`` in the adapter's
    dtype; the dequantised or compute-dtype weight itself is counted by the caller."""
    out, inner = tensor.shape[0], tensor.shape[-1]
    return inner * inner * adapter.bytes + 3 * out * inner * adapter.bytes


def ft_units(request: TrainingRequest, name: StrategyName) -> tuple[FtLayout, dict[str, FtUnit]]:
    """The request's fine-tuning units under strategy ``name``: the blocks (``"0"`` … ``"L−1"``) and the
    root, each with its tensors' bytes (:class:`FtTensor`)."""
    finetune = request.finetune
    assert finetune is not None
    arch = request.architecture
    layout = _layout(request, name)
    kinded = parameter_kinds(arch, finetune)
    quant = _quant_parts(arch, finetune)
    optimizer = OPTIMIZERS[request.optimizer]
    bnb = optimizer.small_tensor_states is not None or optimizer.paged
    foreach = request.optimizer_impl is OptimizerImpl.FOREACH and not bnb
    dora_of: set[str] = set()
    if finetune.lora is not None and finetune.lora.dora:
        dora_of = {k.tensor.module.rsplit(".lora_magnitude_vector", 1)[0] for k in kinded
                   if ".lora_magnitude_vector" in k.tensor.module}  # fmt: skip
    adapter_dtype = finetune_dtypes(request, ParamKind.ADAPTER).stored if finetune.lora else DType.FP32
    d, dg, do = layout.world, layout.grad_world, layout.optimizer_world

    def tensor(t: ParamTensor, kind: ParamKind) -> FtTensor:
        dt = finetune_dtypes(request, kind)
        n = t.numel
        local = finetune_shard(request, t, d)
        padded = local * d
        trained = kind in TRAINED_KINDS
        if kind is ParamKind.QUANTIZED:
            parts, weights = quant[t]
            data = sum(size for part, size in parts.items() if part in QUANT_DATA_PARTS)
            state = sum(size for part, size in parts.items() if part not in QUANT_DATA_PARTS)
            resident = ceil_div(data, d) + state  # the QuantState whole on every rank (states.memory)
            quant_state = state
            gathered, copy = ceil_div(data, d) * d, ceil_div(data, d)
            dequantized = weights * dt.compute.bytes + _nested_absmax_bytes(parts)
        else:
            resident = local * dt.stored.bytes
            gathered, copy = padded * dt.all_gather.bytes, local * dt.stored.bytes
            dequantized = quant_state = 0
        grad = reduced = main = temp = 0
        opt: tuple[int, ...] = ()
        if trained:
            tr = dt.trained
            grad = n * tr.gradient.bytes
            reduced = finetune_shard(request, t, dg) * tr.reduce.bytes
            main = finetune_shard(request, t, dg) * tr.main_gradient.bytes
            shard = finetune_shard(request, t, do)
            assert tr.optimizer_state is not None
            states = optimizer.tensor_state_bytes(shard, tr.optimizer_state)
            opt = tuple(size for key, size in states.items() if not key.endswith("_paged"))
            if tr.master is not None:
                opt += (shard * tr.master.bytes,)
            temp = shard * tr.optimizer_state.bytes if foreach else 0
        dora = 0
        if t.module in dora_of and t.name == "weight" and len(t.shape) == 2:
            dora = _dora_bytes(t, adapter_dtype, dt.compute)
        return FtTensor(f"{t.module}.{t.name}", kind, n, resident, quant_state, gathered, copy, grad,
                        reduced, main, opt, temp, dequantized, dora)  # fmt: skip

    tensors = [k.tensor for k in kinded]
    units: dict[str, FtUnit] = {}
    for unit, positions in fsdp_unit_positions(tensors):
        key = unit.removeprefix("layers.")
        units[key] = FtUnit(key, tuple(tensor(kinded[i].tensor, kinded[i].kind) for i in positions))
    eight_bit = any(
        name.startswith("absmax")
        for k in kinded
        if k.kind in TRAINED_KINDS
        for name in optimizer.tensor_state_bytes(ceil_div(k.tensor.numel, do), DType.FP32)
    )
    if eight_bit and not layout.offload:  # one pair for the whole optimizer (states.memory likewise)
        layout = layout._replace(optimizer_extra=BNB_QMAP_BYTES)
    return layout, units


class FineTune(Mechanics):
    """The timeline's hooks for a fine-tuning step (the module's docstring): per unit its tensors' shards
    resident, gathered around its forward and backward, its dequantisation transient, gradients of its
    trained tensors only, reduced after its backward."""

    def __init__(
        self,
        units: dict[str, FtUnit],
        layout: FtLayout,
        optimizer_impl: OptimizerImpl,
        in_backward: bool = False,
        accumulation: Accumulation = Accumulation.NONE,
    ):
        base = {name: Unit(name, [t.numel for t in u.tensors], [], []) for name, u in units.items()}
        super().__init__(base, 0, optimizer_impl, 0, accumulation)
        self.ft = units
        self.layout = layout
        self.in_backward = in_backward
        """torchtune's ``optimizer_in_bwd``: each trained parameter steps as its gradient is ready
        (``register_post_accumulate_grad_hook``) and its gradient is freed then."""
        self.keeps_all_unsharded = False
        self._gathered: set[str] = set()
        self._grads_done: set[str] = set()

    def run_identity(self) -> tuple[object, ...]:
        return (
            type(self), tuple(self.ft.items()), self.layout, self.optimizer_impl, self.in_backward,
            self.accumulation,
        )  # fmt: skip

    def earlier_micro_batches(self, led: Ledger) -> None:
        """Under accumulation the trained gradients of the earlier micro-batches (kept sharded, or on
        the host under CPU offload); each reduction adds into them."""
        if not self.accumulating or not self.earlier or self.layout.offload or self.in_backward:
            return
        for u in self.ft.values():
            if u.trained and not led.has(f"{u.name}.sharded grad#0"):
                led.alloc_each((f"{u.name}.sharded grad",), self._grad_sizes(u.trained), GRADS)

    # ----------------------------------------------------------------------------- at rest and creation
    def resident(self, led: Ledger, first_step: bool = False) -> None:
        for u in self.ft.values():
            kept = [t.quant_state if self.layout.offload else t.resident for t in u.tensors]
            led.alloc_each((f"{u.name}.shard",), kept, PARAMS)
        trained = [t for u in self.ft.values() for t in u.trained]
        if self.layout.replicated_buckets:
            led.alloc("DDP reducer buckets (trained gradients)", sum(t.reduced for t in trained), REDUCE)
        if not first_step and not self.layout.offload:
            self._optimizer_states(led, trained)

    def _optimizer_states(self, led: Ledger, trained: Sequence[FtTensor]) -> None:
        led.alloc("optimizer quantisation maps", self.layout.optimizer_extra, OPTIMIZER)
        led.alloc_each(("optimizer state",), [size for t in trained for size in t.optimizer], OPTIMIZER)

    def create(self, led: Ledger, init: ModelInit, element_bytes: int = FP32, replaced: int = 0) -> None:
        """The model as loaded for fine-tuning (``from_pretrained``, quantised as it loads), wrapped: what
        the rank keeps at rest; the optimizer states come at the first step."""
        self.resident(led, first_step=True)
        led.event("model loaded and wrapped")

    # ------------------------------------------------------------------------------------ the units
    def _unshard(self, led: Ledger, name: str) -> None:
        u = self.ft.get(name)
        if u is None or not self.layout.gather or name in self._gathered:
            return
        streams = self.layout.streams
        if self.layout.offload:  # the CPU shard copied to the GPU, then all-gathered from there
            copies = [t.shard_copy for t in u.tensors]
            led.alloc_each((f"{name}.shard copy",), copies, GATHERED, streams.pre_unshard)
        led.alloc_each((f"{name}.unsharded",), [t.gathered for t in u.tensors], GATHERED, streams.unshard)
        led.event(f"unshard {name}")
        if self.layout.offload:
            led.free_each(f"{name}.shard copy", len(u.tensors))
        self._gathered.add(name)

    def _reshard(self, led: Ledger, name: str) -> None:
        if name in self._gathered:
            led.free_each(f"{name}.unsharded", len(self.ft[name].tensors))
            self._gathered.discard(name)

    def pre_forward(self, led: Ledger, unit: str | int) -> None:
        name = str(unit)
        self._unshard(led, name)

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        name = str(unit)
        if not (name == "root" and self.layout.keep_root):
            self._reshard(led, name)

    def pre_backward(self, led: Ledger, unit: str | int) -> None:
        name = str(unit)
        self._unshard(led, name)
        if isinstance(unit, int) and unit > 0 and self.layout.world > 1:
            self._unshard(led, str(unit - 1))  # the previous unit prefetched
        u = self.ft.get(name)
        if u is not None and not led.has(f"{name}.dequantised weight"):
            led.alloc(f"{name}.dequantised weight", u.backward_transient, TRANSIENT)

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None:
        """The unit's trained tensors' gradients, at its first weight gradient (a block's adapters' come
        with its backward; a frozen tensor has none)."""
        name = str(unit)
        u = self.ft.get(name)
        if u is None or name in self._grads_done:
            return
        self._grads_done.add(name)
        for i, t in enumerate(u.trained):
            led.alloc(f"{name}.grad#{i}", t.grad, GRADS, group=f"{name}.grads")

    def tied_grad_sum(self, led: Ledger, numel: int) -> None:
        pass  # a frozen tied embedding has no gradient; a trained copy is its own tensor

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        name = str(unit)
        led.free(f"{name}.dequantised weight")
        u = self.ft.get(name)
        self._grads_done.discard(name)
        if u is None:
            return
        trained = u.trained
        layout = self.layout
        if trained and layout.gather:
            # reduce-scatter: the input in the reduce dtype, then the sharded gradient kept
            reduce_input = sum(t.reduced for t in trained) * layout.grad_world
            led.alloc(f"{name}.reduce-scatter input", reduce_input, REDUCE, layout.streams.post_backward)
            led.free_group(f"{name}.grads")
            led.event(f"reduce {name}")
            led.free(f"{name}.reduce-scatter input")
            self._keep_grads(led, name, trained)
        elif trained:
            if layout.replicated_buckets:
                led.event(f"all-reduce {name} (bucket)")
            led.free_group(f"{name}.grads")
            self._keep_grads(led, name, trained)
        self._reshard(led, name)

    def _keep_grads(self, led: Ledger, name: str, trained: Sequence[FtTensor]) -> None:
        if self.in_backward:  # stepped now; the gradient freed
            led.event(f"optimizer step in backward ({name})", max(t.step_temp for t in trained), TRANSIENT)
            return
        if self.layout.offload:  # copied to the host as the reduction finishes
            led.event(f"{name} gradients to the host", sum(t.main_grad for t in trained), GRADS)
            return
        if not led.has(f"{name}.sharded grad#0"):  # else added into the earlier micro-batches'
            sizes = self._grad_sizes(trained)
            led.alloc_each((f"{name}.sharded grad",), sizes, GRADS, self.layout.streams.post_backward)

    def _grad_sizes(self, trained: Sequence[FtTensor]) -> list[int]:
        sizes = [t.main_grad for t in trained]
        return [sum(sizes)] if self.layout.unit_grad_buffer else sizes

    # ------------------------------------------------------------------------------------- the step
    def optimizer_step(self, led: Ledger, first_step: bool) -> None:
        trained = [t for u in self.ft.values() for t in u.trained]
        if self.layout.offload:
            led.event("optimizer step (on the host)")
            return
        if first_step:
            self._optimizer_states(led, trained)
        if self.in_backward:
            led.event("optimizer step (in backward)")
            return
        temps = [t.step_temp for t in trained if t.step_temp]
        if temps:
            led.alloc_each(("foreach sqrt",), temps, OPTIMIZER_TEMP)
            led.event("optimizer step (foreach: sqrt of every exp_avg_sq)")
            led.free_each("foreach sqrt", len(temps))
        else:
            led.event("optimizer step")


def finetune_mechanics(
    request: TrainingRequest, name: StrategyName, accumulation: Accumulation = Accumulation.NONE
) -> FineTune:
    """The request's fine-tuning step under strategy ``name``."""
    layout, units = ft_units(request, name)
    if request.accumulates:
        accumulation = Accumulation.SYNCED
    return FineTune(
        units,
        layout,
        request.optimizer_impl,
        in_backward=request.optimizer_in_backward,
        accumulation=accumulation,
    )


def finetune_note(request: TrainingRequest) -> str:
    """What the fine-tuning step holds beyond its states, in words (for the peak's notes)."""
    finetune = request.finetune
    assert finetune is not None
    parts = ["fine-tuning step: gradients and optimizer states of the trained tensors only"]
    if finetune.quantized:
        parts.append(
            "each quantised Linear dequantised to the compute dtype in forward and again in backward "
            "(bitsandbytes MatMul4Bit/MatMul8bitLt: one out × in weight at a time)"
        )
    if finetune.lora is not None and finetune.lora.dora:
        parts.append("DoRA's weight norm built from the whole weight every forward (peft dora.py)")
    if request.offload_params is not OffloadTarget.NONE and request.framework_record.torch_setup(
        request.strategies[0]
    ):
        parts.append("CPU offload: each unit's shard copied in before its all-gather, its gradients out")
    return "; ".join(parts)


def forward_transients(request: TrainingRequest) -> tuple[int, ...]:
    """Per block of a fine-tuning run, the largest transient one of its Linears makes in forward: its 4-bit
    weight dequantised in the input's dtype (``_dequant_linear_fallback``: ``dtype=A.dtype``, the activation
    dtype) where the forward dequantises (more tokens per micro-batch than :data:`FUSED_4BIT_MAX_TOKENS`),
    and DoRA's weight-norm tensors in the adapters' fp32 (``autocast_adapter_dtype``); () without
    fine-tuning. The model's part of a step holds it: it depends on the tokens, not on the framework."""
    finetune = request.finetune
    if finetune is None:
        return ()
    arch = request.architecture
    a = request.activations
    dequantizes = a.micro_batch * a.seq_len > FUSED_4BIT_MAX_TOKENS
    act = request.activation_dtype
    quant = _quant_parts(arch, finetune)
    kinded = parameter_kinds(arch, finetune)
    dora_of = {
        k.tensor.module.rsplit(".lora_magnitude_vector", 1)[0]
        for k in kinded
        if finetune.lora is not None and finetune.lora.dora and ".lora_magnitude_vector" in k.tensor.module
    }

    def transient(t: ParamTensor) -> int:
        held = quant.get(t)
        nbytes = held.weights * act.bytes + _nested_absmax_bytes(held.parts) if dequantizes and held else 0
        if t.module in dora_of and t.name == "weight" and len(t.shape) == 2:
            nbytes += _dora_bytes(t, DType.FP32, act)
        return nbytes

    tensors = [k.tensor for k in kinded]
    return tuple(
        max((transient(tensors[i]) for i in positions), default=0)
        for unit, positions in fsdp_unit_positions(tensors)
        if unit != "root"
    )
