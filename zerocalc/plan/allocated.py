"""Every candidate's allocated peak, exact, from the step's two parts (pure).

A candidate's steady step is the framework's part plus the model's part, slot by slot
(:mod:`zerocalc.plan.split`): the framework's depends on the configuration (strategy, world, dtypes, offload,
accumulation) and not on the micro-batch or recompute, the model's on the micro-batch and recompute and not on
the configuration. So the search runs the framework's part once per configuration (whatever the micro-batch
and recompute) and the model's once per (micro-batch, recompute), and each candidate's allocated peak is a
maximum over the slots of a sum — the same number :func:`zerocalc.peak.simulate.simulate` gives for its steady
step (tests/plan/). Where the stack is homogeneous both parts are run at a few layers (4 and 5) and
extrapolated to L (:mod:`zerocalc.plan.layers`: exact under every framework, the framework's runs keeping the
whole model's quantities); a stack that is not homogeneous is run at all L layers.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

from zerocalc.base.parts import Part
from zerocalc.model.activations import Recompute
from zerocalc.parallel.strategies import STRATEGIES
from zerocalc.peak.mechanics import Mechanics
from zerocalc.peak.report import StateLine
from zerocalc.peak.simulate import runtime_for
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.peak.timeline import Runtime
from zerocalc.plan.layers import (
    SMALL_LAYERS,
    Extrapolation,
    extrapolation,
    homogeneous,
    with_layers,
    within_edges,
)
from zerocalc.plan.split import (
    HookCall,
    LayerSavesCache,
    ModelRun,
    SlotLedger,
    framework_mechanics,
    framework_run,
    model_run,
    model_values,
    peak_of,
)
from zerocalc.request.training import TrainingRequest

MODEL_READS = (
    "rank_model", "sequence_split", "mesh.ep", "model_code", "activation_dtype", "runtime",
    "activations.seq_len", "activations.flash_attention", "activations.checkpoint_every",
    "activations.capacity_factor", "activations.loss", "activations.loss_chunks", "activations.keep_output",
    "activations.offload", "activations.compile", "finetune", "forward_weights", "fp8",
)  # fmt: skip
"""What the model's part of a step reads but the micro-batch and the recompute: one :class:`StepParts` per
value of them (:data:`MODEL_PART` without its last two paths), which keys the runs by those two itself."""

MODEL_PART = Part(
    "the model's part",
    (*MODEL_READS, "activations.micro_batch", "activations.recompute"),
    lambda request, parts: model_values(request, runtime_for(request)),
)
"""A of the request's step (:func:`~zerocalc.plan.split.model_values`): the model's code's bytes per slot,
its framework ignored."""

MODEL_STEP_PARTS = Part(
    "a model's step parts", MODEL_READS, lambda request, parts: StepParts(runtime_for(request))
)
"""The :class:`StepParts` of the request's model: one per value of what the model's part reads but the
micro-batch and the recompute (a search's candidates of one model share its runs)."""

FRAMEWORK_PART = Part(
    "the framework's part",
    ("rank_model", "mesh", "cluster", "framework", "strategies", "precision", "reduce_dtype",
     "activation_dtype", "optimizer_impl", "offload_optimizer", "offload_params", "accumulates",
     "grad_sync", "zeropp", "buffers.prefetch", "buffers.wrap", "init_asked", "fp8", "finetune", "optimizer",
     "optimizer_in_backward"),
    lambda request, parts, calls: framework_run(framework_mechanics(request, _states(request)), calls),
)  # fmt: skip
"""F of the request's step (:func:`~zerocalc.plan.split.framework_run`): the framework's bytes per slot
given the hook calls of its model's part (``calls``: the same at every micro-batch and recompute), whatever
the micro-batch and recompute (its ``accumulates``, not A); the ``configuration`` a :class:`StepParts` (one
per model) shares it by is its key."""


class ModelParts:
    """The model's part of a search's steps: one run per (recompute, micro-batch, layer count), and the hook
    calls and slots of one run per layer count (the same at every micro-batch and recompute: the timeline
    calls the hooks whatever the activations, tests/plan/test_plan.py; the other runs do not record them,
    :func:`~zerocalc.plan.split.model_values`). Every request is of the search's one model."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._values: dict[tuple[Recompute, int, int], list[int]] = {}
        """A per (recompute, micro-batch, layer count)."""
        self._hooked: dict[int, ModelRun] = {}
        """Per layer count, the run that recorded the hook calls."""
        self._saves: dict[tuple[Recompute, int], LayerSavesCache] = {}
        """The layers' saves per (recompute, micro-batch), shared by the runs at every layer count: the
        search's one model has the same blocks at any depth."""

    def _saves_of(self, request: TrainingRequest) -> LayerSavesCache:
        activations = request.activations
        return self._saves.setdefault((activations.recompute, activations.micro_batch), {})

    @staticmethod
    def _key(request: TrainingRequest) -> tuple[Recompute, int, int]:
        activations = request.activations
        return (activations.recompute, activations.micro_batch, request.architecture.num_layers)

    def values(self, request: TrainingRequest) -> list[int]:
        """A of the request, at its own layer count."""
        key = self._key(request)
        values = self._values.get(key)
        if values is None:
            values = self._values[key] = model_values(request, self.runtime, saves=self._saves_of(request))
        return values

    def hooked(self, request: TrainingRequest) -> ModelRun:
        """A run at the request's layer count, for its hook calls and slots (its values kept for its
        micro-batch and recompute)."""
        layers = request.architecture.num_layers
        run = self._hooked.get(layers)
        if run is None:
            run = self._hooked[layers] = model_run(request, self.runtime, saves=self._saves_of(request))
            self._values.setdefault(self._key(request), run.values)
        return run

    def calls(self, request: TrainingRequest, layers: int) -> tuple[HookCall, ...]:
        """The hook calls of the request's model cut to ``layers`` blocks."""
        run = self._hooked.get(layers)
        if run is None:
            at_depth = request if layers == request.architecture.num_layers else with_layers(request, layers)
            run = self.hooked(at_depth)
        return run.calls


_Built = tuple[TrainingRequest | None, Sequence[StateLine], dict[int | None, Mechanics]]


class FrameworkRuns:
    """The framework's part of a search's steps: one run per mechanics (its
    :meth:`~zerocalc.peak.mechanics.Mechanics.run_identity`) and layer count."""

    def __init__(self, model: ModelParts):
        self._model = model
        self._ids: dict[Hashable, int] = {}
        """Each mechanics identity met, numbered (a number hashes in no time, an identity is long)."""
        self._runs: dict[tuple[int, int], list[int]] = {}
        self._held: dict[int, int | None] = {}
        """:meth:`held` per mechanics."""
        self._built: _Built = (None, (), {})
        """The request :meth:`held` was last asked for, its state lines and the fresh mechanics built (per
        depth) for it, which :meth:`at` runs rather than build again."""

    def at(self, request: TrainingRequest, depths: tuple[int | None, ...]) -> tuple[int, list[list[int]]]:
        """The number of the request's mechanics, and F of them at each depth (``None``: all its L blocks;
        else its first ``blocks`` blocks and the root, every whole-model quantity the request's). The
        mechanics at the first depth identify every depth: a search is of one model, whose blocks are
        alike, so equal units at one depth are equal at any."""
        states, built = self._states_and_built(request)
        if depths[0] not in built:
            built[depths[0]] = framework_mechanics(request, states, depths[0])
        run_id = self._number(built[depths[0]])
        values = []
        for blocks in depths:
            layers = request.architecture.num_layers if blocks is None else blocks
            run = self._runs.get((run_id, layers))
            if run is None:
                mechanics = built[blocks] if blocks in built else framework_mechanics(request, states, blocks)
                run = framework_run(mechanics, self._model.calls(request, layers))
                self._runs[run_id, layers] = run
            values.append(run)
        return run_id, values

    def _number(self, mechanics: Mechanics) -> int:
        """The number of the mechanics' identity (met before or new)."""
        return self._ids.setdefault(mechanics.run_identity(), len(self._ids))

    def held(self, request: TrainingRequest, extrapolated: bool) -> int | None:
        """The bytes of the request's mechanics that no hook of a steady step frees
        (:meth:`~zerocalc.peak.mechanics.Mechanics.held`), at its L: from fresh mechanics of its first 4
        and 5 blocks where its stack is extrapolated (each block's tensors alike, so the bytes are affine
        in L; the whole-model quantities the request's at both depths), else of all L; no hook run. None
        where the mechanics declares none."""
        states = _states(request)
        depths = SMALL_LAYERS if extrapolated else (None,)
        first = framework_mechanics(request, states, depths[0])
        built: dict[int | None, Mechanics] = {depths[0]: first}
        self._built = (request, states, built)
        run_id = self._number(first)
        layers = request.architecture.num_layers
        if all((run_id, layers if n is None else n) in self._runs for n in depths):
            return None  # F costs no run: the exact peak is as cheap
        if run_id not in self._held:
            for n in depths[1:]:
                built[n] = framework_mechanics(request, states, n)
            held = [_held_bytes(built[n]) for n in depths]
            if None in held:
                self._held[run_id] = None
            elif not extrapolated:
                self._held[run_id] = held[0]
            else:
                small, large = held
                self._held[run_id] = small + (large - small) * (layers - SMALL_LAYERS[0])
        return self._held[run_id]

    def _states_and_built(
        self, request: TrainingRequest
    ) -> tuple[Sequence[StateLine], dict[int | None, Mechanics]]:
        """The request's state lines and the fresh mechanics :meth:`held` built for it (none where it was
        last asked for another request), given once: :meth:`at` runs them."""
        asked, states, built = self._built
        self._built = (None, (), {})
        if asked is request:
            return states, built
        return _states(request), {}


def _held_bytes(mechanics: Mechanics) -> int | None:
    led = SlotLedger(framework=True)
    return led.total if mechanics.held(led) else None


class FrameworkPart(NamedTuple):
    """F of one configuration at L."""

    values: list[int]
    extrapolated: bool
    """From the runs at 4 and 5 layers (else run at all L layers)."""
    run: int
    """The number of its mechanics (:meth:`FrameworkRuns.at`): configurations with the same number and way
    of running have the same F."""


class StepParts:
    """The model's parts and the framework's of each configuration, combined into allocated peaks. One per
    search: every request it is given is of the same model (the caches are keyed by options, not by
    architecture)."""

    def __init__(self, runtime: Runtime):
        self.models = ModelParts(runtime)
        self.framework_runs = FrameworkRuns(self.models)
        self._extrapolations: dict[int, Extrapolation | None] = {}
        """Per L (one for a search: one model), the extrapolation from 4 and 5 layers, or None: the stack
        is not homogeneous or its runs' slots do not match."""
        self.frameworks: dict[Hashable, FrameworkPart] = {}
        """F per configuration."""
        self._extrapolated: dict[int, list[int] | None] = {}
        """F at L extrapolated, per mechanics (None: not affine in L)."""
        self._peaks: dict[tuple[int, bool, Recompute, int], int] = {}
        """The allocated peak per mechanics, way of running, recompute and micro-batch."""
        self._model_parts: dict[tuple[Recompute, int, bool], list[int] | None] = {}
        """A at L per (recompute, micro-batch, extrapolated); None: not affine in L."""
        self._held: dict[Hashable, int | None] = {}
        """Per configuration, the bytes its framework's part holds at every slot after the resident hook
        (:meth:`FrameworkRuns.held`)."""

    def _extrapolation(self, request: TrainingRequest) -> Extrapolation | None:
        """The extrapolation of the request's runs at 4 and 5 layers to its L (:mod:`zerocalc.plan.layers`);
        None where the stack is not homogeneous or this request gathers units beyond the edges."""
        if not within_edges(request):
            return None
        big = request.architecture.num_layers
        if big not in self._extrapolations:
            plan = None
            if homogeneous(request):
                slots = tuple(self.models.hooked(with_layers(request, n)).slots for n in SMALL_LAYERS)
                plan = extrapolation(slots, big)  # type: ignore[arg-type]
            self._extrapolations[big] = plan
        return self._extrapolations[big]

    def _framework_part(self, request: TrainingRequest) -> FrameworkPart:
        """F of the request's configuration at L: extrapolated where it can be, else run at all L layers."""
        plan = self._extrapolation(request)
        if plan is not None:
            run, runs = self.framework_runs.at(request, SMALL_LAYERS)
            if run not in self._extrapolated:
                self._extrapolated[run] = plan.apply(tuple(runs))  # type: ignore[arg-type]
            values = self._extrapolated[run]
            if values is not None:
                return FrameworkPart(values, True, run)
        return self._all_layers(request)

    def _all_layers(self, request: TrainingRequest) -> FrameworkPart:
        run, (values,) = self.framework_runs.at(request, (None,))
        return FrameworkPart(values, False, run)

    def _model_part(
        self, requests: Mapping[int, TrainingRequest], b: int, recompute: Recompute, extrapolate: bool
    ) -> list[int] | None:
        """A of the request at micro-batch ``b`` (``requests[b]``, asked for only where not yet known) and its
        L (once per b, recompute and way of running); None where it is not affine in L."""
        key = (recompute, b, extrapolate)
        if key not in self._model_parts:
            at_b = requests[b]
            if not extrapolate:
                self._model_parts[key] = self.models.values(at_b)
            else:
                plan = self._extrapolation(at_b)
                runs = tuple(self.models.values(with_layers(at_b, n)) for n in SMALL_LAYERS)
                self._model_parts[key] = None if plan is None else plan.apply(runs)  # type: ignore[arg-type]
        return self._model_parts[key]

    def peaks_up_to(
        self, requests: Mapping[int, TrainingRequest], above: float, framework_of: TrainingRequest
    ) -> dict[int, int] | None:
        """Each request's allocated peak (as :meth:`allocated_peaks`: ``requests`` b → a request at
        micro-batch b, one recompute; ``framework_of`` the configuration's request) in ascending b up to the
        first above ``above``, whose bound every larger b is given, its parts not run.

        That bound is a floor from the model's part alone where it is above: the largest A at L over the
        slots before any hook and after each, where the framework's part is the bytes its hooks left
        (≥ 0), so F + A there is at least A; else the exact peak. Both are nondecreasing in b: the slots
        are the same at every b (what the extrapolation relies on), each tensor the model's code allocates
        has a size nondecreasing in b (b·s·… elements, expert token counts ⌈b·s·k·c/E⌉, loss chunks of
        b·s/n rows), so A is nondecreasing in b at every slot (tests/plan/test_plan_floors.py checks it on
        every model preset), and F does not depend on b. Before the framework's part is run, a second floor:
        the largest A over the slots after each hook plus the bytes the framework holds there (its resident
        parameters and optimizer states, which no hook frees: :meth:`FrameworkRuns.held`, from its
        mechanics with no hook run; the step's first hook is the resident one,
        :func:`~zerocalc.peak.timeline.steady_start`). The framework's part is run only where the smallest
        b's floors are both within ``above``: none for a group none of whose candidates can fit by them.

        Both parts are extrapolated from 4 and 5 layers where the stack allows it, else run at all L layers;
        None where a part is not affine in L though the stack is homogeneous (the caller runs
        :meth:`allocated_peaks`)."""
        first = requests[next(iter(requests))]
        plan = self._extrapolation(first)
        extrapolated = plan is not None
        recompute = first.activations.recompute
        framework: FrameworkPart | None = None
        peaks: dict[int, int] = {}
        over = None
        for b in sorted(requests):
            if over is not None:
                peaks[b] = over
                continue
            model = self._model_part(requests, b, recompute, extrapolated)
            if model is None:
                return None
            # the slots before any hook and after each: those of the extrapolation, else every other one
            # of an all-L run's (:func:`~zerocalc.plan.split.slots_of`)
            floor = max(map(model.__getitem__, plan.between_hooks)) if plan is not None else max(model[::2])
            if floor > above:
                peaks[b] = over = floor
                continue
            if framework is None:
                configuration = FRAMEWORK_PART.key(framework_of)
                if configuration not in self.frameworks:
                    held = self._held_of(framework_of, configuration, extrapolated)
                    if held is not None:
                        floor = max(map(model.__getitem__, self._after_hooks(plan, len(model)))) + held
                        if floor > above:
                            peaks[b] = over = floor
                            continue
                framework = self._configured(framework_of, configuration)
                if framework.extrapolated is not extrapolated:
                    return None
            key = (framework.run, extrapolated, recompute, b)
            peak = self._peaks.get(key)
            if peak is None:
                peak = self._peaks[key] = peak_of(framework.values, model)
            peaks[b] = peak
            if peak > above:
                over = peak
        return peaks

    def _held_of(self, request: TrainingRequest, configuration: Hashable, extrapolated: bool) -> int | None:
        """:meth:`FrameworkRuns.held` of the request's configuration, once per configuration."""
        if configuration not in self._held:
            self._held[configuration] = self.framework_runs.held(request, extrapolated)
        return self._held[configuration]

    @staticmethod
    def _after_hooks(plan: Extrapolation | None, slots: int) -> range | tuple[int, ...]:
        """The indices of the slots after a hook: the extrapolation's, else every other one of an all-L
        run's from the first hook's on (:func:`~zerocalc.plan.split.slots_of`)."""
        if plan is None:
            return range(2, slots, 2)
        return plan.after_hooks

    def _configured(self, request: TrainingRequest, configuration: Hashable | None = None) -> FrameworkPart:
        """F of the request's configuration (``configuration`` names what it depends on, its key by
        default), once per configuration."""
        if configuration is None:
            configuration = FRAMEWORK_PART.key(request)
        framework = self.frameworks.get(configuration)
        if framework is None:
            framework = self.frameworks[configuration] = self._framework_part(request)
        return framework

    def allocated_peaks(
        self,
        requests: Mapping[int, TrainingRequest],
        configuration: Hashable | None = None,
        framework_of: TrainingRequest | None = None,
    ) -> dict[int, int]:
        """The steady step's allocated peak of each request of ``requests`` (b → a request at micro-batch b:
        one configuration, one recompute; any request that agrees with it on what :data:`MODEL_PART` reads);
        ``framework_of``: the configuration's request, whose framework's part it is (:data:`FRAMEWORK_PART`;
        the first of ``requests`` by default); ``configuration`` names what that part depends on (its key by
        default): runs are shared by it, and peaks by configurations of the same mechanics."""
        request = framework_of or requests[next(iter(requests))]
        if configuration is None:
            configuration = FRAMEWORK_PART.key(request)
        framework = self._configured(request, configuration)
        peaks = self._peaks_of(framework, requests)
        if peaks is None:  # the model's part is not affine in L: all L
            framework = self.frameworks[configuration] = self._all_layers(request)
            peaks = self._peaks_of(framework, requests)
            assert peaks is not None
        return peaks

    def _peaks_of(
        self, framework: FrameworkPart, requests: Mapping[int, TrainingRequest]
    ) -> dict[int, int] | None:
        """F + A's peak at each b, once per mechanics, way of running, recompute and b (a request at b asked
        for only where its peak is not known); None where a model part is not affine in L."""
        peaks = {}
        recompute = requests[next(iter(requests))].activations.recompute  # one recompute
        for b in requests:
            key = (framework.run, framework.extrapolated, recompute, b)
            peak = self._peaks.get(key)
            if peak is None:
                model = self._model_part(requests, b, recompute, framework.extrapolated)
                if model is None:
                    return None
                peak = self._peaks[key] = peak_of(framework.values, model)
            peaks[b] = peak
        return peaks


def _states(request: TrainingRequest) -> list[StateLine]:
    """The accountings' state lines (the PyTorch frameworks' mechanics derive their own)."""
    if request.framework_record.is_torch:
        return []
    states, _ = STATE_BUILDERS[request.framework_record.states](request, STRATEGIES[request.strategies[0]])
    return list(states)
