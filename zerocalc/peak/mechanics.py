"""How each framework holds parameters, gradients and optimizer states through a step (pure).

A mechanics object answers the step timeline's (:mod:`zerocalc.peak.timeline`) hooks: what model creation
allocates (``--init``: :class:`~zerocalc.parallel.framework_records.record.ModelInit`), what is
resident at a step's start, what a unit allocates before its forward and backward and frees after them,
how a parameter's gradient is produced, reduced and kept, and what the optimizer step allocates. Units are the
FSDP units: ``"root"`` (embeddings, final norm, LM head) and the blocks ``0 … L−1``.

* :class:`Fsdp` — what both FSDPs share: the fp32 shards resident, a unit gathered around its forward and
  backward, the unsharded gradients in the parameters' dtype.
* :class:`Fsdp2` — ``fully_shard`` per block, then the root, torch 2.13 (``torch/distributed/fsdp/
  _fully_shard/``). At world size 1 (``FSDPParamGroup`` fast path, torch ≥ 2.9): per parameter a bf16 cast
  of the fp32 shard, then the unsharded storage; no all-gather buffers, no prefetch. At world N
  (``_fsdp_collectives.foreach_all_gather``): the casts, a copy-in buffer of the unit's padded shard, the
  all-gather output (kept until the next unit's copy-out), the per-parameter unsharded storages; in
  backward the unit that ran forward before the current one prefetched (the last block from the root's
  pre-backward, before the loss backward). Reduction (``foreach_reduce``): the reduce-scatter input in the
  reduce dtype (one kept until the next unit reduces) while the unsharded gradients still exist, then its
  output, which becomes the sharded fp32 gradient (on the reduce-scatter stream). The root follows
  ``reshard_after_forward`` like the blocks when it is given explicitly.
* :class:`Fsdp1` — ``FullyShardedDataParallel`` (``use_orig_params=False``): one padded flat parameter per
  unit, ``_mp_shard`` and ``_full_param_padded`` under ``MixedPrecision``, the root kept unsharded after
  forward, one unit prefetched in backward (``BACKWARD_PRE``), the flat gradient cast to the reduce dtype
  and reduce-scattered into ``_saved_grad_shard``.
* :class:`Ddp` — ``DistributedDataParallel`` (and ``ZeroRedundancyOptimizer``): fp32 parameters, the
  reducer's bucket copy of every gradient (``gradient_as_bucket_view=False``), fp32 ``.grad``; under
  bf16 autocast the weights' bf16 copies live from their first use to their layer's backward.
* :class:`Accounting` — the paper's, DeepSpeed's and Megatron's accounting: their model-state lines are
  resident through the step; gathered units and buckets follow the strategy's buffer rule.

The optimizer step (``torch/optim/adam.py``): ``foreach`` (``_multi_tensor_adam``) allocates one fp32 tensor
per parameter for ``_foreach_sqrt(exp_avg_sq)``, all alive together; the for-loop path two temporaries of
the largest parameter; ``fused`` none. Adam's ``step`` counters are CPU tensors unless ``fused`` or
``capturable`` (then one device scalar per parameter).
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Literal, NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.units import ceil_div
from zerocalc.parallel.framework_records.record import ModelInit
from zerocalc.parallel.frameworks import Fsdp1Sharding
from zerocalc.parallel.optimizers import OptimizerImpl
from zerocalc.peak.ledger import Ledger, Sizes
from zerocalc.peak.timeline import (
    BUFFERS,
    GATHERED,
    GRADS,
    OPTIMIZER,
    OPTIMIZER_TEMP,
    PARAMS,
    REDUCE,
    RUNTIME,
    TRANSIENT,
)
from zerocalc.states.framework import STEP_BYTES, fsdp1_padded_numel, fsdp1_shard_numel

FP32 = DType.FP32.bytes
FP8_BYTES = DType.FP8.bytes


class Accumulation(StrEnum):
    """Which micro-batch of an accumulation the timeline is (the last one: the step's peak is there)."""

    NONE = "none"
    """One micro-batch per step."""
    SYNCED = "synced"
    """Gradients are reduced every micro-batch: the sharded (or DDP's) gradients of the earlier ones are
    resident, the new ones are added into them."""
    UNSYNCED = "unsynced"
    """Only the last micro-batch reduces (``no_sync`` / ``set_requires_gradient_sync(False)``): the
    unsharded gradients of the earlier ones are resident and accumulate in place."""


class UnitLabels:
    """The names a unit's tensors and events have in the ledger."""

    __slots__ = (
        "accumulated_grads",
        "all_gather",
        "all_gather_input",
        "all_gather_output",
        "cast",
        "fp32_grad",
        "fp32_shard",
        "grads",
        "mp_shard",
        "prefetch",
        "prefetched",
        "reduce_cast",
        "reduce_copy_in",
        "reduce_input",
        "reduce_output",
        "reduce_output_event",
        "unshard",
        "unshard_copy_out",
        "unsharded",
        "unsharded_0",
    )

    def __init__(self, unit: str):
        self.cast = f"{unit}.cast"
        self.fp32_shard = f"{unit}.fp32 shard"
        self.all_gather_input = f"{unit}.all-gather input"
        self.all_gather_output = f"{unit}.all-gather output"
        self.all_gather = f"all-gather {unit}"
        self.prefetched = f"{unit}.prefetched all-gather"
        self.prefetch = f"prefetch {unit}"
        self.unsharded = f"{unit}.unsharded"
        self.unsharded_0 = f"{unit}.unsharded#0"
        self.unshard = f"unshard {unit}"
        self.unshard_copy_out = f"unshard {unit} (copy-out)"
        self.mp_shard = f"{unit}.mp shard"
        self.grads = f"{unit}.grads"
        self.accumulated_grads = f"{unit}.accumulated unsharded grads"
        self.fp32_grad = f"{unit}.fp32 grad"
        self.reduce_input = f"{unit}.reduce-scatter input"
        self.reduce_output = f"{unit}.reduce-scatter output"
        self.reduce_copy_in = f"reduce {unit} (copy-in)"
        self.reduce_cast = f"reduce {unit} (cast)"
        self.reduce_output_event = f"reduce {unit} output"


class Unit:
    """One FSDP unit (or, for DDP, one block's parameters): the elements of each parameter. Not mutated:
    units are shared by every request of a model and world (:func:`zerocalc.peak.simulate._units_of`)."""

    def __init__(self, name: str, params: list[int], local: list[int], padded: list[int], last: int = 0):
        self.name = name
        self.params = params
        """Elements of each parameter, unsharded."""
        self.last = last
        """Elements of the parameter the model's code registers last in the unit (0: not known), the last
        of FSDP2's gradient list (:meth:`Fsdp2._reduce`)."""
        self.local = local
        """Elements of each parameter on the largest rank (its shard)."""
        self.padded = padded
        """Elements of each parameter as gathered, padding included."""
        self.numel = sum(params)
        self.local_numel = sum(local)
        self.padded_numel = sum(padded)
        self.key = (name, tuple(params), tuple(local), tuple(padded), last)
        """What the unit is (equal keys: the same unit)."""
        self._bytes: dict[tuple[str, int], Sizes] = {}

    @cached_property
    def labels(self) -> UnitLabels:
        """Its tensors' and events' names, formatted once (a plan runs each unit's hooks thousands of
        times)."""
        return UnitLabels(self.name)

    def bytes_each(self, elements: Literal["params", "local", "padded"], element_bytes: int) -> Sizes:
        """Each parameter's bytes at ``element_bytes`` per element: unsharded (``params``), its shard
        (``local``) or as gathered (``padded``); computed once per unit."""
        key = (elements, element_bytes)
        sizes = self._bytes.get(key)
        if sizes is None:
            sizes = self._bytes[key] = Sizes(element_bytes * n for n in getattr(self, elements))
        return sizes


_NO_SIZES = Sizes()
"""No tensors (shared: nothing mutates it but its rounded total, 0)."""


@lru_cache(maxsize=256)
def _fp32_sizes(elements: tuple[int, ...]) -> Sizes:
    """fp32 bytes of tensors of these elements (shared: every configuration of a world steps the same
    shards, and :class:`Sizes` keeps their rounded total)."""
    return Sizes(FP32 * n for n in elements)


def _model_created(led: Ledger, event: str, replaced: int) -> None:
    """The event that ends the model's construction, with ``replaced`` bytes (a tied LM head's own weight,
    allocated last by the construction) alive at it and freed after it (``tie_weights``)."""
    head = "init LM head (replaced by the tied embedding)"
    led.alloc(head, replaced, PARAMS)
    led.event(event)
    led.free(head)


class Mechanics:
    """The hooks the step timeline calls (:class:`~zerocalc.peak.timeline.CreationHooks`); the base keeps
    parameters whole and does nothing."""

    keeps_all_unsharded = False
    """Blocks stay unsharded from forward to backward (FSDP2 ``reshard_after_forward=False``)."""

    def __init__(
        self,
        units: dict[str, Unit],
        optimizer_states: int,
        optimizer_impl: OptimizerImpl,
        grad_bytes: int,
        accumulation: Accumulation = Accumulation.NONE,
    ):
        self.units = units
        self.optimizer_states = optimizer_states
        """fp32 states per parameter element (Adam: exp_avg, exp_avg_sq)."""
        self.optimizer_impl = optimizer_impl
        self.grad_bytes = grad_bytes
        """Bytes per element of the gradients backward produces (the unsharded parameters' dtype)."""
        self.accumulation = accumulation
        self.final_micro_batch = True
        """A pipeline rank's backward pass is of the last micro-batch (:meth:`pipeline_backward`)."""
        self.earlier = True
        """Under accumulation, micro-batches ran before the timeline's (:meth:`earlier_micro_batches`); a
        pipeline rank that holds the step's every micro-batch in flight has none."""

    def run_identity(self) -> tuple[object, ...]:
        """Everything a fresh object's hooks depend on, declared by each class for the fields it adds:
        two objects with equal identities allocate the same on the same hook calls, so a plan runs one of
        them (:mod:`zerocalc.plan.allocated`). What the hooks change as they run is not part of it."""
        return (
            type(self),
            tuple(unit.key for unit in self.units.values()),
            self.optimizer_states,
            self.optimizer_impl,
            self.grad_bytes,
            self.accumulation,
        )

    @property
    def accumulating(self) -> bool:
        """Gradients of earlier micro-batches are resident and this backward accumulates into them."""
        return self.accumulation is not Accumulation.NONE

    # model creation (the allocator replay's start) and the state at a step's start
    def create(self, led: Ledger, init: ModelInit, element_bytes: int = FP32, replaced: int = 0) -> None:
        """Model creation and wrapping, up to the first step: what is resident before the optimizer
        states exist (the whole parameters, each created where ``init`` says, are what the rank keeps);
        ``replaced``: bytes the model's construction on the GPU allocates and frees (a tied LM head's own
        weight)."""
        self.resident(led, first_step=True)
        _model_created(led, f"model created ({init.value})", replaced if init is ModelInit.GPU else 0)

    def resident(self, led: Ledger, first_step: bool = False) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def held(self, led: Ledger) -> bool:
        """Allocate on ``led`` what :meth:`resident` allocates in a steady step that no hook frees, in its
        order: F is at least those bytes at every slot after the resident hook (zerocalc.plan.allocated's
        bound of a step that cannot fit; tests/plan/test_plan_floors.py checks it on every framework
        run of its spaces). False where a mechanics declares none (nothing allocated)."""
        return False

    def earlier_micro_batches(self, led: Ledger) -> None:
        """What the step's earlier micro-batches leave behind under gradient accumulation (nothing
        without it): the timeline is the last micro-batch."""

    def forward_started(self, led: Ledger, runtime_extra: int) -> None:
        """After the root's pre-forward: with every block kept unsharded, the runtime's extra (measured
        from forward to the end of backward, :data:`~zerocalc.peak.timeline.NO_RESHARD_EXTRA`)."""
        if self.keeps_all_unsharded:
            led.alloc("no-reshard runtime extra", runtime_extra, RUNTIME)

    def backward_finished(self, led: Ledger) -> None:
        """After the root's post-backward."""
        led.free("no-reshard runtime extra")

    def pipeline_backward(self, led: Ledger, final: bool) -> None:
        """A pipeline rank's backward pass begins, of the step's last micro-batch (``final``) or of an
        earlier one."""
        self.final_micro_batch = final

    def pre_forward(self, led: Ledger, unit: str | int) -> None:
        pass

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        pass

    def pre_backward(self, led: Ledger, unit: str | int) -> None:
        pass

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None:
        """Backward has produced the gradient of ``numel`` elements of ``unit``'s parameters."""
        if not self.accumulating:
            led.alloc(f"{unit}.grad {label}", self.grad_bytes * numel, GRADS, group=f"{unit}.grads")

    def tied_grad_sum(self, led: Ledger, numel: int) -> None:
        """A tied embedding: the LM head's and the embedding's gradients are summed out of place."""
        if self.accumulating:
            return
        led.alloc("root.grad tied sum", self.grad_bytes * numel, GRADS, group="root.grads")
        led.event("tied embedding gradient sum")
        led.free("root.grad embedding dense")
        led.free("root.grad embedding")
        led.rename("root.grad tied sum", "root.grad embedding")

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        pass

    def _optimizer_elements(self) -> tuple[int, ...]:
        """Elements of each tensor the local optimizer steps (the shards this rank updates)."""
        return tuple(n for u in self.units.values() for n in u.local)

    @cached_property
    def _optimizer_bytes(self) -> Sizes:
        """fp32 bytes of each tensor the local optimizer steps: one of its states, or foreach's sqrt."""
        return _fp32_sizes(self._optimizer_elements())

    def optimizer_step(self, led: Ledger, first_step: bool) -> None:
        if first_step:  # Adam._init_group: zeros_like exp_avg then exp_avg_sq, parameter by parameter
            self._alloc_optimizer_states(led)
        if self.optimizer_impl is OptimizerImpl.FOREACH and self.optimizer_states:
            led.alloc_each(("foreach sqrt",), self._optimizer_bytes, OPTIMIZER_TEMP)
            led.event("optimizer step (foreach: sqrt of every exp_avg_sq)")
            led.free_each("foreach sqrt", len(self._optimizer_bytes))
        elif self.optimizer_impl is OptimizerImpl.FOR_LOOP and self.optimizer_states:
            led.event(
                "optimizer step (for-loop: two temporaries of the largest tensor)",
                2 * max(self._optimizer_bytes, default=0),
                OPTIMIZER_TEMP,
            )
        else:
            led.event("optimizer step (fused)")

    def zero_grad(self, led: Ledger) -> None:
        """``zero_grad(set_to_none=True)``: the gradients are freed."""
        for name in [n for n in led.live if led.kinds[n] == GRADS]:
            led.free(name)

    def _alloc_optimizer_states(self, led: Ledger) -> None:
        """The fp32 states of each tensor stepped (Adam: exp_avg, exp_avg_sq), tensor by tensor."""
        names = tuple(f"optimizer state {state}" for state in range(self.optimizer_states))
        led.alloc_each(names, self._optimizer_bytes, OPTIMIZER)

    def _resident_optimizer(self, led: Ledger) -> None:
        self._alloc_optimizer_states(led)
        if self.optimizer_impl is OptimizerImpl.FUSED:
            led.alloc_each(("adam step counter",), [STEP_BYTES] * len(self._optimizer_bytes), OPTIMIZER)


class KeptParameters(Mechanics):
    """A framework whose rank keeps its parameters (:meth:`_parameters`, its own layout) from creation
    on and, after the first step, the optimizer's states: both allocated by :meth:`resident` and freed
    by no hook, so they are what it :meth:`held`."""

    def _parameters(self, led: Ledger) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def resident(self, led: Ledger, first_step: bool = False) -> None:
        if first_step:
            self._parameters(led)
            return
        self.held(led)
        self.earlier_micro_batches(led)

    def held(self, led: Ledger) -> bool:
        self._parameters(led)
        self._resident_optimizer(led)
        return True


# ---------------------------------------------------------------------------------------------------- FSDP
class Fsdp(KeptParameters):
    """What FSDP1 and FSDP2 share: each unit's fp32 shard resident from creation, the unit gathered before
    its forward and backward (:meth:`_unshard`, the framework's own) and released after (:meth:`_reshard`),
    the unsharded gradients in the parameters' dtype until the unit's reduction."""

    def __init__(
        self,
        units: dict[str, Unit],
        world: int,
        param_bytes: int,
        reduce_bytes: int,
        reshard: bool,
        optimizer_states: int,
        optimizer_impl: OptimizerImpl,
        accumulation: Accumulation = Accumulation.NONE,
    ):
        super().__init__(units, optimizer_states, optimizer_impl, param_bytes, accumulation)
        self.world = world
        self.param_bytes = param_bytes
        """The unsharded parameters' dtype (MixedPrecisionPolicy.param_dtype, else fp32)."""
        self.reduce_bytes = reduce_bytes
        self.reshard = reshard
        self.keeps_all_unsharded = not reshard
        self._gathered: set[str] = set()

    def run_identity(self) -> tuple[object, ...]:
        return (*super().run_identity(), self.world, self.param_bytes, self.reduce_bytes, self.reshard)

    def _parameters(self, led: Ledger) -> None:
        """Each unit's fp32 shard (the hooks free gathered copies and gradients only)."""
        for unit in self.units.values():
            led.alloc_each((unit.labels.fp32_shard,), unit.bytes_each("local", FP32), PARAMS)

    def earlier_micro_batches(self, led: Ledger) -> None:
        """Unsynced: each unit's unsharded gradients, accumulated in place; synced: the sharded fp32
        gradients the earlier reductions produced."""
        if not self.accumulating or not self.earlier:
            return
        for unit in self.units.values():
            if self.accumulation is Accumulation.UNSYNCED:
                led.alloc(unit.labels.accumulated_grads, self.param_bytes * unit.numel, GRADS)
            else:
                led.alloc(unit.labels.fp32_grad, FP32 * unit.local_numel, GRADS, stream="reduce_scatter")

    def create(self, led: Ledger, init: ModelInit, element_bytes: int = FP32, replaced: int = 0) -> None:
        """Model creation, then ``fully_shard`` per block and the root; each parameter's fp32 shard is what
        the rank keeps.

        * ``meta``: the shards are allocated by ``to_empty`` and initialised in place (FSDP2 docs,
          torchtitan): nothing whole;
        * ``gpu``: ``from_config`` in fp32 allocates every parameter whole (then ``replaced``, a tied LM
          head's own weight, allocated last and freed by ``tie_weights``); ``fully_shard`` then makes each
          parameter's shard a new tensor and frees the original;
        * ``cpu``: ``fully_shard`` moves each unit's parameters to the GPU whole
          (``_fully_shard/_fsdp_init.py::_move_states_to_device``), then shards them: one unit whole at a
          time (FSDP1 with ``device_id`` likewise)."""
        if init is ModelInit.META:
            super().create(led, init, element_bytes)
            return
        if init is ModelInit.GPU:
            for unit in self.units.values():
                for i, n in enumerate(unit.params):
                    led.alloc(f"init {unit.name}#{i}", element_bytes * n, PARAMS)
            _model_created(led, "model created (gpu: whole, fp32)", replaced)
        for unit in self.units.values():
            if init is ModelInit.CPU:
                for i, n in enumerate(unit.params):
                    led.alloc(f"init {unit.name}#{i}", element_bytes * n, PARAMS)
                led.event(f"{unit.name} moved to the GPU (cpu: whole, fp32)")
            for i, n in enumerate(unit.local):
                led.alloc(f"{unit.name}.fp32 shard#{i}", FP32 * n, PARAMS)
                led.free(f"init {unit.name}#{i}")
        led.event("model sharded")

    def _unshard(self, led: Ledger, unit: Unit, backward: bool) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reshard(self, led: Ledger, unit: Unit) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def pre_forward(self, led: Ledger, unit: str | int) -> None:
        self._unshard(led, self.units[str(unit)], backward=False)

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None:
        if self.accumulation is not Accumulation.UNSYNCED:  # else added in place into the kept gradients
            led.alloc(f"{unit}.grad {label}", self.param_bytes * numel, GRADS, group=f"{unit}.grads")
        elif not self.earlier:  # the step's first backward of the unit: its gradients, kept unsharded
            u = self.units[str(unit)]
            if not led.has(u.labels.accumulated_grads):
                led.alloc(u.labels.accumulated_grads, self.param_bytes * u.numel, GRADS)

    def tied_grad_sum(self, led: Ledger, numel: int) -> None:
        if self.accumulation is not Accumulation.UNSYNCED:
            super().tied_grad_sum(led, numel)


# --------------------------------------------------------------------------------------------------- FSDP2
class Fsdp2(Fsdp):
    def __init__(
        self,
        units: dict[str, Unit],
        world: int,
        param_bytes: int,
        reduce_bytes: int,
        reshard: bool,
        root_reshard: bool,
        optimizer_states: int,
        optimizer_impl: OptimizerImpl,
        accumulation: Accumulation = Accumulation.NONE,
        pipelined: bool = False,
        chunk_starts: tuple[int, ...] | None = None,
        gather_bytes: dict[str, tuple[int, ...]] | None = None,
        in_backward: bool = False,
    ):
        super().__init__(
            units, world, param_bytes, reduce_bytes, reshard, optimizer_states, optimizer_impl, accumulation
        )
        self.in_backward = in_backward
        """The optimizer steps in backward (``--optimizer-in-backward``, torchtune's ``optimizer_in_bwd``):
        ``foreach_reduce`` sets each sharded parameter's gradient and calls its post-accumulate-grad hooks
        (torch 2.13 ``_fully_shard/_fsdp_collectives.py``), where torchtune's hook steps that parameter's
        own optimizer and zeroes its gradient (``training/memory.py::register_optim_in_bwd_hooks``): the
        unit's sharded gradients are freed as its reduction ends; no step runs after backward."""
        self.gather_bytes = gather_bytes
        """Per unit, each parameter's bytes per element as all-gathered and unsharded where they are not all
        ``param_bytes`` (an FP8 all-gather: :func:`zerocalc.peak.fp8.fp8_gather_bytes`); None: all are."""
        self.root_reshard = root_reshard
        self.pipelined = pipelined
        """A torch.distributed.pipelining stage (:meth:`post_backward`)."""
        self.chunk_starts = chunk_starts
        """The first block of each model chunk of a pipeline rank that holds several, each chunk its own
        ``fully_shard`` root whose prefetch stays within it; None: one."""
        self._last_reduce_input: str | None = None
        self._all_gather_state: str | None = None
        self._deferred: list[str | int] = []
        self._scales: dict[str, Sizes] = {}
        """:meth:`_fp8_scales` per unit."""

    def run_identity(self) -> tuple[object, ...]:
        gather = None if self.gather_bytes is None else tuple(self.gather_bytes.items())
        return (
            *super().run_identity(),
            self.root_reshard,
            self.pipelined,
            self.chunk_starts,
            gather,
            self.in_backward,
        )

    def resident(self, led: Ledger, first_step: bool = False) -> None:
        super().resident(led, first_step)
        if not first_step and self.gather_bytes is not None:
            # the previous step's last all-gather left each fp8 weight its scale
            for unit in self.units.values():
                led.alloc_each((f"{unit.name}.fp8 scale",), self._fp8_scales(unit), BUFFERS)

    def optimizer_step(self, led: Ledger, first_step: bool) -> None:
        if not self.in_backward:
            super().optimizer_step(led, first_step)
            return
        if first_step:
            self._alloc_optimizer_states(led)
        led.event("optimizer step (in backward)")

    def _fp8_scales(self, unit: Unit) -> Sizes:
        """One fp32 scale per fp8 weight of ``unit`` (torchao ``fsdp_pre_all_gather``'s metadata, which the
        unsharded ``Float8TrainingTensor`` keeps until the next all-gather's copy-out replaces it); built
        once per unit (each unshard asks)."""
        if self.gather_bytes is None:
            return _NO_SIZES
        scales = self._scales.get(unit.name)
        if scales is None:
            per = self.gather_bytes.get(unit.name)
            scales = self._scales[unit.name] = Sizes(FP32 for b in (per or ()) if b == FP8_BYTES)
        return scales

    def _gathered_sizes(self, unit: Unit, elements: Literal["local", "padded"]) -> Sizes:
        """Each parameter's bytes as cast (``local``) or unsharded (``padded``)."""
        per = None if self.gather_bytes is None else self.gather_bytes.get(unit.name)
        if per is None:
            return unit.bytes_each(elements, self.param_bytes)
        return Sizes(b * n for b, n in zip(per, getattr(unit, elements), strict=True))

    def _unshard(self, led: Ledger, unit: Unit, backward: bool) -> None:
        if unit.name in self._gathered:
            return
        if self.world == 1:
            # FSDPParamGroup.wait_for_unshard, world-1 fast path: per parameter a cast of the shard to
            # param_dtype (FSDPParam.all_gather_inputs), then the unsharded storage (alloc_storage + copy)
            previous = None
            for i, n in enumerate(unit.params):
                if self.param_bytes != FP32:
                    led.alloc(f"{unit.name}.cast#{i}", self.param_bytes * n, GATHERED)
                led.event(f"unshard {unit.name}")
                if previous is not None:
                    led.free(previous)
                led.alloc(f"{unit.name}.unsharded#{i}", self.param_bytes * n, GATHERED)
                led.event(f"unshard {unit.name}")
                previous = f"{unit.name}.cast#{i}" if self.param_bytes != FP32 else None
            if previous is not None:
                led.free(previous)
        else:
            # FSDPParamGroup.unshard → foreach_all_gather: casts of the local shards to param_dtype, the
            # copy-in buffer (the padded shard), the flat all-gather output. A unit prefetched in backward
            # has done this already.
            labels = unit.labels
            output = labels.all_gather_output
            if labels.prefetched in led.live:
                led.rename(labels.prefetched, output)
            else:
                self._all_gather(led, unit, output)
            # wait_for_unshard (_fsdp_param_group.py): the copy-out into each parameter's unsharded
            # storage, then the previous forward all-gather's result (comm_ctx.all_gather_state, kept so
            # that its copy-out could overlap this all-gather) is released: the method's local
            # `prev_all_gather_state` holds it until the method returns, after the copy-out. In forward
            # this result is kept in turn, in backward freed.
            led.alloc_each((labels.unsharded,), self._gathered_sizes(unit, "padded"), GATHERED)
            led.event(labels.unshard_copy_out)
            scales = self._fp8_scales(unit)
            if scales:  # fsdp_post_all_gather: the new scales replace the previous all-gather's
                if f"{unit.name}.fp8 scale#0" in led.live and backward and unit.name != "root":
                    # out._scale = scale: the unsharded weight takes the new scale, but the forward's saved
                    # weights (Float8Linear's weight_hp_t, a transposed Float8TrainingTensor) keep theirs
                    # until the block's backward has run (freed with its saved tensors: the timeline)
                    for i in range(len(scales)):
                        led.rename(f"{unit.name}.fp8 scale#{i}", f"{unit.name}.fp8 saved scale#{i}")
                elif f"{unit.name}.fp8 scale#0" in led.live:
                    led.free_each(f"{unit.name}.fp8 scale", len(scales))
                for i in range(len(scales)):
                    led.rename(f"{unit.name}.fp8 new scale#{i}", f"{unit.name}.fp8 scale#{i}")
            if self._all_gather_state is not None:
                led.free(self._all_gather_state)
                self._all_gather_state = None
            if backward:
                led.free(output)
            else:
                self._all_gather_state = output
        self._gathered.add(unit.name)

    def _all_gather(self, led: Ledger, unit: Unit, output: str) -> None:
        labels = unit.labels
        if self.param_bytes != FP32 or self.gather_bytes is not None:
            led.alloc_each((labels.cast,), self._gathered_sizes(unit, "local"), GATHERED)
        scales = self._fp8_scales(unit)
        if scales:  # an fp8 all-gather's new scales
            led.alloc_each((f"{unit.name}.fp8 new scale",), scales, BUFFERS)
        if self.gather_bytes is None:
            gathered = self.param_bytes * unit.padded_numel
            shard = self.param_bytes * ceil_div(unit.padded_numel, self.world)
        else:  # each parameter's padded shard at its own bytes, gathered as bytes (_fsdp_collectives.py)
            gathered = sum(self._gathered_sizes(unit, "padded"))
            shard = ceil_div(gathered, self.world)
        led.alloc(labels.all_gather_input, shard, BUFFERS)
        led.free_each(labels.cast, len(unit.local))
        led.alloc(output, gathered, BUFFERS)
        led.event(labels.all_gather)
        led.free(labels.all_gather_input)

    def _reshard(self, led: Ledger, unit: Unit) -> None:
        if unit.name not in self._gathered:
            return
        led.free_each(unit.labels.unsharded, len(unit.params))
        self._gathered.discard(unit.name)

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        reshard = self.root_reshard if unit == "root" else self.reshard
        if reshard:
            self._reshard(led, self.units[str(unit)])
        if unit == "root" and self.world > 1 and self._all_gather_state is not None:
            led.free(self._all_gather_state)  # forward is over: nothing waits on it any more
            self._all_gather_state = None

    def pre_backward(self, led: Ledger, unit: str | int) -> None:
        self._unshard(led, self.units[str(unit)], backward=True)
        following = self._backward_prefetch_target(unit)
        if self.world > 1 and following is not None and following.name not in self._gathered:
            # FSDPParamGroup.pre_backward → _backward_prefetch (_fsdp_param_group.py): the unit that ran
            # forward just before this one is all-gathered now, before this unit's gradients. The root's
            # pre-backward hook sits on the forward's output (FSDPState._pre_backward, _fsdp_state.py), so
            # the last block is gathered before the loss backward. World 1: its unshard allocates nothing.
            self._all_gather(led, following, following.labels.prefetched)
            led.event(following.labels.prefetch)

    def _backward_prefetch_target(self, unit: str | int) -> Unit | None:
        """The unit before ``unit`` in forward order (``comm_ctx.post_forward_order``): the previous
        block, and for the root (whose forward ends last) the last block. Model chunks are roots of their
        own: none across them (the root's is left out)."""
        starts = self.chunk_starts
        if not isinstance(unit, int):
            blocks = [name for name in self.units if name != "root"]
            return self.units[blocks[-1]] if blocks and starts is None else None
        if unit == 0 or (starts is not None and unit in starts):
            return None
        return self.units[str(unit - 1)]

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        """A unit's reduction after its backward. A torch.distributed.pipelining stage turns every unit's
        own off (``stage.py`` ``backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``,
        ``set_reshard_after_backward(False)``) and, after the last micro-batch's backward, runs each unit's
        ``post_backward`` itself: the units stay unsharded and their gradients whole until then."""
        if not self.pipelined:
            self._reduce(led, unit)
            return
        if not self.final_micro_batch:
            return
        if unit != "root":
            self._deferred.append(unit)
            return
        for deferred in [*self._deferred, "root"]:
            self._reduce(led, deferred)
        self._deferred = []

    def _reduce(self, led: Ledger, unit: str | int) -> None:
        u = self.units[str(unit)]
        labels = u.labels
        self._reshard(led, u)
        if self._last_reduce_input is not None:
            led.free(self._last_reduce_input)
        padded = u.padded_numel if self.world > 1 else u.numel
        name = labels.reduce_input
        led.alloc(name, self.reduce_bytes * padded, REDUCE)
        led.event(labels.reduce_copy_in)
        # foreach_reduce (_fsdp_collectives.py) clears its list of the unit's gradients after the copy-in,
        # but at world > 1 its loop over (parameter, gradient) pairs (the shard-dim check) has left the last
        # one bound to `unsharded_grad` until it returns: the last registered parameter's gradient lives on
        # through the reduce-scatter output and its cast
        held = led.free_group_but(labels.grads, self.param_bytes * u.last) if self.world > 1 else None
        if held is None:
            led.free_group(labels.grads)
        led.free(labels.accumulated_grads)
        shard = ceil_div(padded, self.world) if self.world > 1 else padded
        output = labels.reduce_output
        led.alloc(output, self.reduce_bytes * shard, REDUCE, stream="reduce_scatter")
        if self.reduce_bytes != FP32 or self.accumulation is Accumulation.SYNCED:
            # the sharded gradient is fp32: the output is cast (or added) into it, then freed
            if labels.fp32_grad not in led.live:
                led.alloc(labels.fp32_grad, FP32 * u.local_numel, GRADS, stream="reduce_scatter")
            led.event(labels.reduce_output_event)
            led.free(output)
        else:
            led.rename(output, labels.fp32_grad, GRADS)
            led.event(labels.reduce_output_event)
        if held is not None:
            led.free(held)
        if self.in_backward:
            # one optimizer per parameter: each step's temporaries are of one shard (foreach's sqrt of its
            # exp_avg_sq; the for-loop's two), then zero_grad(set_to_none) drops the gradient
            largest = FP32 * max(u.local, default=0)
            temp = {OptimizerImpl.FOREACH: largest, OptimizerImpl.FOR_LOOP: 2 * largest}.get(
                self.optimizer_impl, 0
            )
            led.event(
                f"optimizer step in backward ({u.name})", temp if self.optimizer_states else 0, OPTIMIZER_TEMP
            )
            led.free(labels.fp32_grad)
        self._last_reduce_input = name
        if unit == "root":  # the end of backward: nothing waits on the last buffers any more
            led.free(name)
            self._last_reduce_input = None
            if self._all_gather_state is not None:
                led.free(self._all_gather_state)
                self._all_gather_state = None


# --------------------------------------------------------------------------------------------------- FSDP1
class UnitStreams(NamedTuple):
    """The CUDA streams a sharded wrapper allocates a unit's buffers on; the caching allocator keeps each
    stream's freed blocks for that stream alone. FSDP1's own (:data:`FSDP1_STREAMS`, torch 2.13
    ``torch/distributed/fsdp/_runtime_utils.py``), or all on the default stream (:data:`DEFAULT_STREAMS`)."""

    pre_unshard: str
    """``_unshard``: ``handle.pre_unshard()`` under ``_pre_unshard_stream``: the low-precision shard
    (``_mp_shard``), a CPU-offloaded shard's copy to the GPU."""
    unshard: str
    """``handle.unshard()`` under ``_unshard_stream``: the padded unsharded flat parameter."""
    post_backward: str
    """``_post_backward_hook`` under ``_post_backward_stream``: the gradient cast to the reduce dtype, the
    reduce-scatter's output, the sharded gradient kept."""


FSDP1_STREAMS = UnitStreams("pre_unshard", "unshard", "post_backward")
DEFAULT_STREAMS = UnitStreams("default", "default", "default")


class Fsdp1(Fsdp):
    """FSDP1 with one flat parameter per unit (``FlatParamHandle``): the shard is ``ceil(P/N)`` elements of
    the flat parameter padded to a multiple of N; the root is not resharded after forward (``_runtime_
    utils._post_forward_reshard``); ``NO_SHARD`` keeps the whole flat parameter and all-reduces."""

    def __init__(
        self,
        units: dict[str, Unit],
        world: int,
        no_shard: bool,
        param_bytes: int,
        reduce_bytes: int,
        reshard: bool,
        optimizer_states: int,
        optimizer_impl: OptimizerImpl,
        accumulation: Accumulation = Accumulation.NONE,
    ):
        sharding = Fsdp1Sharding.NO_SHARD if no_shard else Fsdp1Sharding.FULL_SHARD
        flat = {
            name: Unit(
                name,
                [u.numel],
                [fsdp1_shard_numel(u.numel, world, sharding)],
                [u.numel if no_shard else fsdp1_padded_numel(u.numel, world)],
            )
            for name, u in units.items()
        }
        super().__init__(
            flat,
            1 if no_shard else world,
            param_bytes,
            reduce_bytes,
            reshard,
            optimizer_states,
            optimizer_impl,
            accumulation,
        )
        self.no_shard = no_shard

    def run_identity(self) -> tuple[object, ...]:
        return (*super().run_identity(), self.no_shard)

    def _unshard(self, led: Ledger, unit: Unit, backward: bool) -> None:
        if unit.name in self._gathered:
            return
        if self.param_bytes == FP32 and self.no_shard:
            self._gathered.add(unit.name)  # the flat parameter is used in place
            return
        # _mp_shard: the local shard cast to param_dtype; _full_param_padded: the all-gather output
        labels = unit.labels
        led.alloc(labels.mp_shard, self.param_bytes * unit.local[0], GATHERED, FSDP1_STREAMS.pre_unshard)
        led.alloc(labels.unsharded_0, self.param_bytes * unit.padded[0], GATHERED, FSDP1_STREAMS.unshard)
        led.event(labels.unshard)
        if not self.no_shard:
            led.free(labels.mp_shard)
        self._gathered.add(unit.name)

    def _reshard(self, led: Ledger, unit: Unit) -> None:
        if unit.name not in self._gathered:
            return
        led.free(unit.labels.unsharded_0)
        self._gathered.discard(unit.name)

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        if unit != "root" and self.reshard and not self.no_shard:
            self._reshard(led, self.units[str(unit)])

    def pre_backward(self, led: Ledger, unit: str | int) -> None:
        self._unshard(led, self.units[str(unit)], backward=True)
        if isinstance(unit, int) and unit > 0 and not self.no_shard and self.reshard:
            following = self.units[str(unit - 1)]  # BACKWARD_PRE prefetch
            self._unshard(led, following, backward=True)

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        u = self.units[str(unit)]
        labels = u.labels
        if self.no_shard:
            # _reduce_grad_no_shard: the gradient cast to reduce_dtype is all-reduced, then cast back to
            # the flat parameter's dtype (fp32) and kept as .grad; a later micro-batch's reduced gradient,
            # cast the same way, is added to the .grad the earlier ones left (gradient accumulation)
            led.free_group(labels.grads)
            stream = FSDP1_STREAMS.post_backward
            if labels.fp32_grad in led.live:
                led.alloc(f"{u.name}.fp32 grad (cast)", FP32 * u.numel, GRADS, stream)
                led.event(f"accumulate {u.name}")
                led.free(f"{u.name}.fp32 grad (cast)")
            else:
                led.alloc(labels.fp32_grad, FP32 * u.numel, GRADS, stream)
            led.free(labels.mp_shard)
            self._reshard(led, u)
            return
        name = labels.reduce_input
        led.alloc(name, self.reduce_bytes * u.padded[0], REDUCE, FSDP1_STREAMS.post_backward)
        led.event(labels.reduce_cast)
        led.free_group(labels.grads)
        led.free(labels.accumulated_grads)
        if labels.fp32_grad not in led.live:
            led.alloc(labels.fp32_grad, FP32 * u.local[0], GRADS, FSDP1_STREAMS.post_backward)
        led.event(labels.reduce_output_event)
        led.free(name)
        self._reshard(led, u)


# ----------------------------------------------------------------------------------------------------- DDP
class Ddp(KeptParameters):
    """DDP, optionally with ZeroRedundancyOptimizer (``owned``: the elements of the tensors the largest
    rank steps). fp32 parameters; the reducer's buckets are a second copy of every gradient (allocated at
    construction, ``gradient_as_bucket_view=False``); ``.grad`` is fp32. Under bf16 autocast each block's
    weights are cast once and the copies are kept for its backward (autocast's weight cache and the
    linear layers' saved tensors)."""

    def __init__(
        self,
        units: dict[str, Unit],
        reducer_elements: int,
        autocast_bytes: int | None,
        optimizer_states: int,
        optimizer_impl: OptimizerImpl,
        owned: tuple[int, ...] | None = None,
        accumulation: Accumulation = Accumulation.NONE,
    ):
        super().__init__(units, optimizer_states, optimizer_impl, FP32, accumulation)
        self.reducer_elements = reducer_elements
        """Elements of every gradient the reducer's buckets copy (the whole model's)."""
        self.autocast_bytes = autocast_bytes
        self.owned = owned

    def run_identity(self) -> tuple[object, ...]:
        return (*super().run_identity(), self.reducer_elements, self.autocast_bytes, self.owned)

    def _optimizer_elements(self) -> tuple[int, ...]:
        if self.owned is not None:
            return self.owned
        return tuple(n for u in self.units.values() for n in u.params)

    def _parameters(self, led: Ledger) -> None:
        """The fp32 parameters and the reducer's buckets (the hooks free autocast copies and gradients
        only)."""
        for unit in self.units.values():
            led.alloc_each((f"{unit.name}.fp32 param",), unit.bytes_each("params", FP32), PARAMS)
        led.alloc("DDP reducer buckets (a copy of every gradient)", FP32 * self.reducer_elements, REDUCE)

    def earlier_micro_batches(self, led: Ledger) -> None:
        """The fp32 ``.grad`` of every parameter, accumulated (synced or under ``no_sync``)."""
        if self.accumulating:
            for unit in self.units.values():
                led.alloc(f"{unit.name}.accumulated grads", FP32 * unit.numel, GRADS)

    def pre_forward(self, led: Ledger, unit: str | int) -> None:
        if self.autocast_bytes is not None and unit != "root":
            u = self.units[str(unit)]
            led.alloc(f"{u.name}.autocast weight copies", self.autocast_bytes * u.numel, GATHERED)

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        if self.autocast_bytes is not None and unit == "root":
            head = self.units["root"].params[0]
            led.alloc("root.autocast weight copies", self.autocast_bytes * head, GATHERED)

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        led.free(f"{unit}.autocast weight copies")

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None:
        if self.accumulating:
            return
        if self.autocast_bytes is not None:
            led.event(f"{unit} {label} gradient (autocast cast back)", self.autocast_bytes * numel, TRANSIENT)
        led.alloc(f"{unit}.grad {label}", FP32 * numel, GRADS, group=f"{unit}.grads")


# ------------------------------------------------------------------------------------------- accountings
class Accounting(Mechanics):
    """An accounting (the ZeRO paper, DeepSpeed's or Megatron's estimators): its model-state lines and
    resident buffers (``states``: name, kind, bytes) stay from start to end; with ``gather`` units are
    gathered before use (``prefetch`` more ahead) and freed after, the root kept from forward to backward;
    with ``unit_grads`` a unit's unsharded gradients exist until its reduction. ``units`` with only
    ``"root"`` is one unit for the whole model (``--wrap model``)."""

    def __init__(
        self,
        units: dict[str, Unit],
        states: list[tuple[str, str, int]],
        gather: bool,
        unit_grads: bool,
        param_bytes: int,
        grad_bytes: int,
        reduce_bytes: int,
        prefetch: int,
        keep_root: bool,
        optimizer_elements: int,
        optimizer_impl: OptimizerImpl,
    ):
        super().__init__(units, 0, optimizer_impl, grad_bytes)
        self.states = states
        self.gather = gather
        self.unit_grads = unit_grads
        self.param_bytes = param_bytes
        self.reduce_bytes = reduce_bytes
        self.prefetch = prefetch
        self.keep_root = keep_root
        self.elements = optimizer_elements

    def run_identity(self) -> tuple[object, ...]:
        return (
            *super().run_identity(),
            tuple(self.states),
            self.gather,
            self.unit_grads,
            self.param_bytes,
            self.reduce_bytes,
            self.prefetch,
            self.keep_root,
            self.elements,
        )

    def resident(self, led: Ledger, first_step: bool = False) -> None:
        self.held(led)

    def held(self, led: Ledger) -> bool:
        """Every state line: they stay from start to end."""
        for name, kind, nbytes in self.states:
            led.alloc(name, nbytes, kind)
        return True

    def create(self, led: Ledger, init: ModelInit, element_bytes: int = FP32, replaced: int = 0) -> None:
        """``gpu``: the whole model on the GPU in ``element_bytes`` per parameter (and ``replaced``, a tied
        LM head's own weight until ``tie_weights``) before the framework builds its states from it (the
        whole model must fit once); ``meta`` and ``cpu`` put nothing on the GPU beyond the states."""
        if init is ModelInit.GPU:
            elements = sum(unit.numel for unit in self.units.values())
            led.alloc("whole model at creation", element_bytes * elements, PARAMS)
            _model_created(led, f"model created (gpu: whole, {element_bytes} bytes per parameter)", replaced)
            led.free("whole model at creation")
        super().create(led, init, element_bytes)

    def _gather(self, led: Ledger, unit: str | int) -> None:
        u = self.units.get(str(unit))
        if u is not None and not led.has(f"{u.name}.gathered"):
            led.alloc(f"{u.name}.gathered", self.param_bytes * u.numel, GATHERED)

    def pre_forward(self, led: Ledger, unit: str | int) -> None:
        if not self.gather:
            return
        self._gather(led, unit)
        if isinstance(unit, int):
            for ahead in range(1, self.prefetch + 1):
                if str(unit + ahead) in self.units:
                    self._gather(led, unit + ahead)

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        if self.gather and not (unit == "root" and self.keep_root):
            led.free(f"{unit}.gathered")

    def pre_backward(self, led: Ledger, unit: str | int) -> None:
        if not self.gather:
            return
        self._gather(led, unit)
        if isinstance(unit, int):
            for behind in range(1, self.prefetch + 1):
                if unit - behind >= 0:
                    self._gather(led, unit - behind)

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None:
        if self.unit_grads:
            owner = unit if str(unit) in self.units else "root"  # one unit for the whole model
            led.alloc(f"{unit}.grad {label}", self.grad_bytes * numel, GRADS, group=f"{owner}.grads")

    def tied_grad_sum(self, led: Ledger, numel: int) -> None:
        if self.unit_grads:
            super().tied_grad_sum(led, numel)

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        u = self.units.get(str(unit))
        if not self.unit_grads or u is None:
            return
        if self.reduce_bytes != self.grad_bytes:
            led.event(f"reduce {u.name} (cast)", self.reduce_bytes * u.numel, REDUCE)
        led.free_group(f"{u.name}.grads")
        if self.gather:
            led.free(f"{u.name}.gathered")

    def _optimizer_elements(self) -> tuple[int, ...]:
        return (self.elements,)

    def optimizer_step(self, led: Ledger, first_step: bool) -> None:
        if self.optimizer_impl is OptimizerImpl.FOREACH and self.elements:
            led.event(
                "optimizer step (foreach: sqrt of every exp_avg_sq)", FP32 * self.elements, OPTIMIZER_TEMP
            )
        else:
            led.event("optimizer step")

    def zero_grad(self, led: Ledger) -> None:
        pass  # the accountings count gradient buffers as resident
