"""A steady step's allocated bytes as the framework's part plus the model's part, slot by slot (pure).

In the step timeline (:mod:`zerocalc.peak.timeline`) the framework allocates and frees only inside its
mechanics' hooks (:mod:`zerocalc.peak.mechanics`), and the model's code only between them. So at every
event the allocated total is ``F + A``: F the framework's bytes, a function of the strategy, the world,
the dtypes, offload and accumulation but not of the micro-batch or recompute (the hooks take no
activation shapes), and A the model's bytes, a function of the micro-batch, the sequence and recompute
but not of the framework (the hooks are called at the same points in the same order whatever the
framework). Each hook call h gives two slots:

* ``in h`` — the events inside the hook: F varies, A is the model's bytes when the hook is entered;
* ``after h`` — the events between it and the next hook: A varies, F is the framework's bytes the hook
  left.

The step's allocated peak is the largest ``F + A`` over the slots (a slot without events counts
:data:`NO_EVENT`). One framework run per configuration and one model run per (micro-batch, recompute)
give every combination's peak: what ``zerocalc plan`` needs for each candidate, without simulating each.
Both runs are the timeline's own code (the model run calls hooks that do nothing; the framework run
replays the model run's hook calls on the real mechanics); tests/plan/test_plan.py checks every candidate
of several spaces against :func:`zerocalc.peak.simulate.simulate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from functools import cached_property
from operator import add
from typing import NamedTuple

from zerocalc.model.code import Device, LayerSaves
from zerocalc.peak.ledger import CUDA_BLOCK, Ledger
from zerocalc.peak.mechanics import Mechanics
from zerocalc.peak.report import StateLine
from zerocalc.peak.simulate import activation_bytes, mechanics_for, step_shape
from zerocalc.peak.timeline import Runtime, StepHooks, run_step, steady_start
from zerocalc.request.training import TrainingRequest

NO_EVENT = -(2**62)
"""A slot's value where it holds no event: below any sum with the other part."""


class HookCall(NamedTuple):
    phase: str
    method: str
    """The :class:`~zerocalc.peak.timeline.StepHooks` method called."""
    args: tuple[object, ...]
    """The arguments after the ledger."""
    unit: str | int | None = None
    """The unit it is called for (``"root"`` or a block's index), if the hook takes one."""
    label: str | None = None
    """The gradient's label of a ``param_grad`` call."""


class Where(StrEnum):
    """Which events of a hook call a slot holds."""

    BEFORE = "before hooks"
    """The events before the step's first hook."""
    IN = "in"
    """The events inside the hook: the framework's bytes vary."""
    AFTER = "after"
    """The events after it and before the next hook: the model's bytes vary."""


class Slot(NamedTuple):
    """One slot of a steady step: a hook call's events (:class:`Where`), named by the call's phase, method,
    unit and gradient label, never by its other arguments' values."""

    phase: str
    where: Where
    method: str | None
    unit: str | int | None
    """``"root"``, a block's index, or None (a hook without a unit)."""
    label: str | None


START = Slot("start", Where.BEFORE, None, None, None)
"""The first slot: before any hook."""


class SlotLedger(Ledger):
    """A ledger that keeps each slot's values: F (``framework``: the events inside hooks) or A (the events
    between them). It records no allocation log (no allocator replay) and no bytes by kind. A framework
    run makes every operation inside a hook (it replays only the hook calls) and a model run calls no hook
    (it marks where each is called: :class:`_SlotMarks`), so each run's operations are its part's alone."""

    def __init__(self, framework: bool, block: int = CUDA_BLOCK):
        super().__init__(block, record=False)
        self.inside: list[int] = []
        """Per hook, the largest total at an event inside it."""
        self.entered: list[int] = []
        """Per hook, the total when it is entered."""
        self.left: list[int] = []
        """Per hook, the total when it returns."""
        self.between: list[int] = [NO_EVENT]
        """Per hook, the largest total at an event after it and before the next (first: before any hook)."""
        self._group_totals: dict[tuple[tuple[str, int], ...], int] = {}
        """The rounded total of each tuple of entries :meth:`alloc_group` has been given."""
        self._slots = self.inside if framework else self.between
        """Where an event counts: every event of a framework run is inside a hook, of a model run between."""

    def alloc(
        self, name: str, nbytes: int, kind: str, stream: str = "default", group: str | None = None
    ) -> None:
        """:meth:`Ledger.alloc` without the log (a search allocates ~10⁴ tensors in its slot ledgers)."""
        if nbytes > 0:
            live = self.live
            if name in live:
                raise KeyError(f"{name} is already allocated")
            if group is not None:
                self.groups.setdefault(group, []).append(name)
            block = self.block
            live[name] = size = -(-nbytes // block) * block
            self.kinds[name] = kind
            self.total += size

    def free(self, name: str) -> None:
        """:meth:`Ledger.free` without the log."""
        size = self.live.pop(name, None)
        if size is not None:
            del self.kinds[name]
            self.total -= size

    def alloc_each(
        self, prefixes: tuple[str, ...], sizes: Sequence[int], kind: str, stream: str = "default"
    ) -> None:
        """The tensors of each prefix as one entry named by the prefix: their sizes, each rounded, summed
        (nothing is read between them, and :meth:`free_each` frees them together)."""
        try:  # a unit's Sizes whose total is known (the rest of a search's calls)
            size = sizes.totals[self.block]  # type: ignore[attr-defined]
        except (AttributeError, KeyError):
            size = self.rounded_total(sizes)
        if size > 0:
            live, kinds = self.live, self.kinds
            for prefix in prefixes:  # each as :meth:`alloc` (inline: a search calls this ~10³ times)
                if prefix in live:
                    raise KeyError(f"{prefix} is already allocated")
                live[prefix] = size
                kinds[prefix] = kind
                self.total += size

    def alloc_group(self, group: str, entries: Iterable[tuple[str, int]], kind: str) -> None:
        """The entries as one tensor of the group (their sizes, each rounded, summed)."""
        name = f"{group}.*"
        if name in self.live:  # a second bundle of the group: its tensors one by one
            super().alloc_group(group, entries, kind)
            return
        if isinstance(entries, tuple):  # a layer's saves: the same tuple for every layer of a run
            total = self._group_totals.get(entries)
            if total is None:
                total = self._group_totals[entries] = self.rounded_total(nbytes for _, nbytes in entries)
        else:
            total = self.rounded_total(nbytes for _, nbytes in entries)
        self.alloc(name, total, kind, group=group)

    def free_each(self, prefix: str, count: int) -> None:
        size = self.live.pop(prefix, None)
        if size is not None:  # as :meth:`free`
            del self.kinds[prefix]
            self.total -= size
        else:  # allocated one by one
            super().free_each(prefix, count)

    def event(self, name: str, transient: int = 0, transient_kind: str = "transient") -> None:
        value = self.total + (self.rounded(transient) if transient else 0)
        slots = self._slots
        if value > slots[-1]:
            slots[-1] = value


class _SlotMarks(StepHooks):
    """The hooks of a model run: each call marks its slot (the bytes entering it; the events after it count
    towards the next) and allocates nothing, the framework's part being another run's; it is recorded in
    ``calls`` unless None. Every call is given ``led``, the run's one ledger, whose slot lists it holds
    (a search's model runs call the hooks ~10⁵ times)."""

    def __init__(self, calls: list[HookCall] | None, led: SlotLedger):
        self._calls = calls
        self._entered = led.entered
        self._between = led.between

    def _mark(
        self,
        led: Ledger,
        method: str,
        args: tuple[object, ...],
        unit: str | int | None = None,
        label: str | None = None,
    ) -> None:
        if self._calls is not None:
            self._calls.append(HookCall(led.phase, method, args, unit, label))
        self._entered.append(led.total)
        self._between.append(NO_EVENT)

    def resident(self, led: Ledger, first_step: bool = False) -> None:
        self._mark(led, "resident", (first_step,))

    def pre_forward(self, led: Ledger, unit: str | int) -> None:
        self._mark(led, "pre_forward", (unit,), unit)

    def forward_started(self, led: Ledger, runtime_extra: int) -> None:
        self._mark(led, "forward_started", (runtime_extra,))

    def post_forward(self, led: Ledger, unit: str | int) -> None:
        self._mark(led, "post_forward", (unit,), unit)

    def pre_backward(self, led: Ledger, unit: str | int) -> None:
        self._mark(led, "pre_backward", (unit,), unit)

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None:
        if self._calls is None:  # :meth:`_mark` inline: most hook calls are a parameter's gradient
            self._entered.append(led.total)
            self._between.append(NO_EVENT)
        else:
            self._mark(led, "param_grad", (unit, label, numel), unit, label)

    def tied_grad_sum(self, led: Ledger, numel: int) -> None:
        self._mark(led, "tied_grad_sum", (numel,))

    def post_backward(self, led: Ledger, unit: str | int) -> None:
        self._mark(led, "post_backward", (unit,), unit)

    def backward_finished(self, led: Ledger) -> None:
        self._mark(led, "backward_finished", ())

    def pipeline_backward(self, led: Ledger, final: bool) -> None:
        self._mark(led, "pipeline_backward", (final,))

    def optimizer_step(self, led: Ledger, first_step: bool) -> None:
        self._mark(led, "optimizer_step", (first_step,))

    def zero_grad(self, led: Ledger) -> None:
        self._mark(led, "zero_grad", ())


class ModelRun:
    """The model's part of a steady step."""

    def __init__(self, values: list[int], calls: tuple[HookCall, ...]):
        self.values = values
        """A per slot (:func:`slots_of`): the bytes entering each hook, the largest between hooks."""
        self.calls = calls
        """The hook calls in order (the same for every framework)."""

    @cached_property
    def slots(self) -> tuple[Slot, ...]:
        """The slots (:func:`slots_of`)."""
        return slots_of(self.calls)


def slots_of(calls: tuple[HookCall, ...]) -> tuple[Slot, ...]:
    """The slots in the step's order: :data:`START`, then in and after each hook call."""
    slots = [START]
    for call in calls:
        phase, method, unit, label = call.phase, call.method, call.unit, call.label
        slots += (Slot(phase, Where.IN, method, unit, label), Slot(phase, Where.AFTER, method, unit, label))
    return tuple(slots)


def _values(inside: list[int], after: list[int], before: int) -> list[int]:
    """``before``, then each hook's value in it and after it."""
    assert len(inside) == len(after)
    values = [before] * (2 * len(inside) + 1)
    values[1::2] = inside
    values[2::2] = after
    return values


LayerSavesCache = dict[tuple, LayerSaves]
"""A step's layers' saves (:attr:`~zerocalc.peak.timeline.StepShape.saves`)."""


def model_run(
    request: TrainingRequest,
    runtime: Runtime | None,
    device: Device = Device.CUDA,
    saves: LayerSavesCache | None = None,
) -> ModelRun:
    """The model's part of the request's steady step (its framework ignored), and its hook calls;
    ``saves``: its layers' saves, shared with steps of the same micro-batch and recompute whose blocks are
    alike (the same model cut to other layer counts)."""
    calls: list[HookCall] = []
    return ModelRun(_model_step(request, runtime, device, calls, saves), tuple(calls))


def model_values(
    request: TrainingRequest,
    runtime: Runtime | None,
    device: Device = Device.CUDA,
    saves: LayerSavesCache | None = None,
) -> list[int]:
    """:func:`model_run`'s values alone: the hook calls are the same at every micro-batch and recompute
    (tests/plan/test_plan.py), so a search records them once per layer count."""
    return _model_step(request, runtime, device, None, saves)


def _model_step(
    request: TrainingRequest,
    runtime: Runtime | None,
    device: Device,
    calls: list[HookCall] | None,
    saves: LayerSavesCache | None,
) -> list[int]:
    step = step_shape(request, activation_bytes(request), device)._replace(saves=saves)
    led = SlotLedger(framework=False, block=CUDA_BLOCK if device is Device.CUDA else 1)
    hooked = _SlotMarks(calls, led)
    steady_start(step, hooked, runtime, led)
    run_step(step, hooked, runtime, led)
    return _values(led.entered, led.between[1:], led.between[0])


def framework_mechanics(
    request: TrainingRequest, states: Sequence[StateLine], blocks: int | None = None
) -> Mechanics:
    """The request's mechanics (``states``: the accountings' state lines; PyTorch's derive their own);
    with ``blocks``, those of its first ``blocks`` blocks and the root only, the whole-model quantities
    the request's (:func:`~zerocalc.peak.simulate.mechanics_for`)."""
    return mechanics_for(request, request.strategies[0], states, blocks)[0]


def framework_run(
    mechanics: Mechanics, calls: tuple[HookCall, ...], device: Device = Device.CUDA
) -> list[int]:
    """F per slot (:func:`slots_of`) of a steady step: fresh ``mechanics`` given the model run's hook
    calls."""
    led = SlotLedger(framework=True, block=CUDA_BLOCK if device is Device.CUDA else 1)
    inside, left = led.inside, led.left  # every operation is inside a hook (none reads the phase)
    enter, leave = inside.append, left.append  # bound once: a search replays ~10⁴ calls
    hooks: dict[str, Callable[..., None]] = {}
    for _, method, args, _, _ in calls:
        hook = hooks.get(method)
        if hook is None:
            hook = hooks[method] = getattr(mechanics, method)
        enter(NO_EVENT)
        hook(led, *args)
        leave(led.total)
    return _values(inside, left, 0)


def peak_of(framework: list[int], model: list[int]) -> int:
    """The step's allocated peak: the largest F + A over the slots (the same slots, in the same order)."""
    return max(map(add, framework, model))  # operator.add: twice as fast as int.__add__ here
