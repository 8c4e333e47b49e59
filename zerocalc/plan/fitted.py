"""Every candidate's allocated peak, from the step's two parts (pure).

A candidate's steady step is the framework's part plus the model's part, slot by slot
(:mod:`zerocalc.peak.split`): the framework's depends on the configuration (strategy, world, dtypes, offload,
accumulation) and not on the micro-batch or recompute, the model's on the micro-batch and recompute and not on
the configuration. So the search runs the framework's part once per configuration (whatever the micro-batch
and recompute) and the model's once per (micro-batch, recompute), and each candidate's allocated peak is a
maximum over the slots of a sum — the same number :func:`zerocalc.peak.simulate.simulate` gives for its steady
step (tests/test_plan.py). Where the stack is homogeneous both parts are run at a few layers (4 and 5) and
extrapolated to L (:mod:`zerocalc.plan.layers`: exact under every framework, the framework's runs keeping the
whole model's quantities); a stack that is not homogeneous is run at all L layers.
"""

from __future__ import annotations

from collections.abc import Hashable

from zerocalc.model.activations import Recompute
from zerocalc.parallel.frameworks import TORCH_FRAMEWORKS
from zerocalc.parallel.profiles import PROFILES
from zerocalc.parallel.strategies import STRATEGIES
from zerocalc.peak.report import StateLine
from zerocalc.peak.split import (
    HookCall,
    ModelRun,
    fingerprint,
    framework_mechanics,
    framework_run,
    model_run,
    model_values,
    peak_of,
)
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.peak.timeline import Runtime
from zerocalc.plan.layers import (
    SMALL_LAYERS,
    Extrapolation,
    NotAffine,
    extrapolation,
    homogeneous,
    with_layers,
    within_edges,
)
from zerocalc.request.training import TrainingRequest


def with_batch(request: TrainingRequest, b: int, accum: int) -> TrainingRequest:
    """The same request at micro-batch ``b`` and accumulation ``accum``."""
    activations = request.activations.model_copy(update={"micro_batch": b})
    return request.model_copy(update={"activations": activations, "grad_accum": accum})


def with_recompute(request: TrainingRequest, recompute: Recompute) -> TrainingRequest:
    """The same request with another recompute (the parser puts it in the activations and nowhere else:
    tests/test_plan.py compares with parsing)."""
    if request.activations.recompute is recompute:
        return request
    activations = request.activations.model_copy(update={"recompute": recompute})
    return request.model_copy(update={"activations": activations})


class StepParts:
    """The model's parts (cached per micro-batch, recompute and layer count) and the framework's of each
    configuration, combined into allocated peaks. One per search: every request it is given is of the same
    model (the caches are keyed by options, not by architecture)."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._runs: dict[tuple[Recompute, int, int], list[int]] = {}
        """A's values per (recompute, micro-batch, layer count)."""
        self._hooks_at: dict[int, ModelRun] = {}
        """Per layer count, a model run: its hook calls and slot names, the same at every micro-batch and
        recompute (the timeline calls the hooks whatever the activations: tests/test_plan.py), so the
        other runs do not record them (:func:`model_values`)."""
        self._extrapolation: Extrapolation | NotAffine | None = None
        """The search's extrapolation, or why there is none (built at the first request)."""
        self._models: dict[tuple[Recompute, int, bool], list[int]] = {}
        self._frameworks: dict[Hashable, tuple[list[int], bool]] = {}
        self._framework_runs: dict[tuple[Hashable, int], list[int]] = {}

    @staticmethod
    def _key(request: TrainingRequest) -> tuple[Recompute, int, int]:
        activations = request.activations
        return (activations.recompute, activations.micro_batch, request.architecture.num_layers)

    def _model_values(self, request: TrainingRequest) -> list[int]:
        key = self._key(request)
        if key not in self._runs:
            self._runs[key] = model_values(request, self.runtime)
        return self._runs[key]

    def _hooks(self, request: TrainingRequest) -> ModelRun:
        """A model run at the request's layer count, for its hook calls and slot names (its values kept
        for its micro-batch and recompute)."""
        layers = request.architecture.num_layers
        if layers not in self._hooks_at:
            run = self._hooks_at[layers] = model_run(request, self.runtime)
            self._runs.setdefault(self._key(request), run.values)
        return self._hooks_at[layers]

    def _calls(self, request: TrainingRequest, layers: int) -> tuple[HookCall, ...]:
        """The hook calls of the request's model cut to ``layers`` blocks (recorded once per depth)."""
        run = self._hooks_at.get(layers)
        if run is None:
            at_depth = request if layers == request.architecture.num_layers else with_layers(request, layers)
            run = self._hooks(at_depth)
        return run.calls

    def _framework_runs_at(self, request: TrainingRequest, depths: tuple[int | None, ...]) -> list[list[int]]:
        """F of the request's mechanics at each depth (``None``: all its L blocks; else its first ``blocks``
        blocks and the root, every whole-model quantity the request's), run once per distinct mechanics
        (:func:`fingerprint`). The mechanics at the first depth fingerprint every depth: a search is of one
        model, whose blocks are alike, so equal units at one depth are equal at any."""
        states = _states(request)
        first = framework_mechanics(request, states, depths[0])
        identity = fingerprint(first)
        values = []
        for blocks in depths:
            layers = request.architecture.num_layers if blocks is None else blocks
            key = (identity, layers)
            run = self._framework_runs.get(key)
            if run is None:
                mechanics = first if blocks == depths[0] else framework_mechanics(request, states, blocks)
                run = self._framework_runs[key] = framework_run(mechanics, self._calls(request, layers))
            values.append(run)
        return values

    def _plan(self, request: TrainingRequest) -> Extrapolation:
        """The extrapolation of the request's runs at 4 and 5 layers to its L (:mod:`zerocalc.plan.layers`;
        the same for every request of the search: one model); :class:`NotAffine` where the stack is not
        homogeneous, or this request gathers units beyond the edges."""
        if not within_edges(request):
            raise NotAffine
        if self._extrapolation is None:
            try:
                if not homogeneous(request):
                    raise NotAffine
                names = tuple(self._hooks(with_layers(request, n)).names for n in SMALL_LAYERS)
                self._extrapolation = extrapolation(names, request.architecture.num_layers)  # type: ignore[arg-type]
            except NotAffine as refused:
                self._extrapolation = refused
        if isinstance(self._extrapolation, NotAffine):
            raise NotAffine
        return self._extrapolation

    def _extrapolated_model(self, request: TrainingRequest) -> list[int]:
        """A at the request's L from the model cut to 4 and 5 layers."""
        plan = self._plan(request)
        runs = tuple(self._model_values(with_layers(request, n)) for n in SMALL_LAYERS)
        return plan.apply(runs)  # type: ignore[arg-type]

    def _model(self, request: TrainingRequest, b: int, accum: int, extrapolate: bool) -> list[int]:
        """A of the request at micro-batch ``b`` (once per b, recompute and way of running)."""
        key = (request.activations.recompute, b, extrapolate)
        if key not in self._models:
            at_b = with_batch(request, b, accum)
            self._models[key] = self._extrapolated_model(at_b) if extrapolate else self._model_values(at_b)
        return self._models[key]

    def allocated_peaks(
        self, request: TrainingRequest, batches: dict[int, int], configuration: Hashable
    ) -> dict[int, int]:
        """The steady step's allocated peak at each micro-batch b of ``batches`` (b → accumulation) for
        the request (at any of them, any recompute); ``configuration`` names what the framework's part
        depends on (the request's options but the micro-batch and recompute): runs are shared by it."""
        if configuration not in self._frameworks:
            try:
                plan = self._plan(request)
                runs = tuple(self._framework_runs_at(request, SMALL_LAYERS))
                self._frameworks[configuration] = (plan.apply(runs), True)  # type: ignore[arg-type]
            except NotAffine:
                self._frameworks[configuration] = (self._framework_runs_at(request, (None,))[0], False)
        framework, extrapolated = self._frameworks[configuration]
        try:
            models = {b: self._model(request, b, a, extrapolated) for b, a in batches.items()}
        except NotAffine:  # the model's part is not affine in L: both at all L layers
            framework, extrapolated = self._framework_runs_at(request, (None,))[0], False
            self._frameworks[configuration] = (framework, extrapolated)
            models = {b: self._model(request, b, a, False) for b, a in batches.items()}
        return {b: peak_of(framework, model) for b, model in models.items()}


def _states(request: TrainingRequest) -> list[StateLine]:
    """The accountings' state lines (the PyTorch frameworks' mechanics derive their own)."""
    if request.framework in TORCH_FRAMEWORKS:
        return []
    states, _ = STATE_BUILDERS[PROFILES[request.framework].states](request, STRATEGIES[request.strategies[0]])
    return list(states)
