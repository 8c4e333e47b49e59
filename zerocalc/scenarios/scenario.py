"""Scenarios: a model, a GPU, a cluster shape and training options whose outputs are committed.

Each scenario yields named sections (:data:`SECTIONS`): the ``memory`` estimate and the ``comm``
estimate, as JSON-ready dicts. ``zerocalc check`` compares them with ``presets/expected/NAME.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from zerocalc.base.errors import keyword
from zerocalc.request.options import Command, as_given, option
from zerocalc.request.options_model import TrainingOptions
from zerocalc.request.training import parse_request


class PlanScenario(BaseModel):
    """A ``[plan]`` table: the scenario's model, GPU and GPUs searched by ``zerocalc plan``."""

    model_config = ConfigDict(extra="forbid")

    global_batch: str
    frameworks: str | None = None
    objective: str = "time"
    top: int = Field(default=3, ge=1)


class _ScenarioBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    plan: PlanScenario | None = None
    """With a ``[plan]`` table, the expectation has a ``plan`` section too."""


_OPTION_FIELDS = tuple(TrainingOptions.model_fields.keys() - {"estimate", "calibration_name", "calibration"})

Scenario = create_model(
    "Scenario",
    __base__=_ScenarioBase,
    __module__=__name__,
    **{name: (TrainingOptions.model_fields[name].annotation, TrainingOptions.model_fields[name].default)
       for name in _OPTION_FIELDS},
)  # fmt: skip
"""A scenario: its description, an optional ``[plan]`` table, and any option of ``memory`` and ``comm``
by its keyword (:data:`zerocalc.request.options.OPTIONS`), as TOML values."""


def training_options(s: Scenario) -> TrainingOptions:
    """The scenario as the options `zerocalc memory --model ...` would be given."""
    return TrainingOptions(**{name: getattr(s, name) for name in _OPTION_FIELDS})


def memory_section(s: Scenario) -> dict[str, Any]:
    """Model states and the peak of a step, as `zerocalc memory --model ... --json` prints them (notes
    naming options by their keywords, as the library does)."""
    from zerocalc.peak.evaluate import evaluate_peak

    options = training_options(s)
    report = evaluate_peak(parse_request(options))
    return as_given(report, Command.MEMORY, dict(options), keyword).to_json_dict()


def comm_section(s: Scenario) -> dict[str, Any]:
    """Communication per step under the scenario's framework, as `zerocalc comm --model ... --framework
    ... --json` prints it less each collective's per-unit calls (``units``: hundreds of lines per scenario;
    their totals and call counts are checked), and without ``pipeline`` where there are no pipeline
    stages."""
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate

    options = training_options(s).model_copy(
        update={
            "estimate": Estimate.COMM,
            **{
                name: option(Command.MEMORY, name).default for name in ("seq_len", "micro_batch", "recompute")
            },
        }
    )
    left_out: dict[str, Any] = {"strategies": {"__all__": {"collectives": {"__all__": {"units"}}}}}
    estimate = as_given(evaluate_comm(parse_request(options)), Command.COMM, dict(options), keyword)
    if estimate.pipeline is None:
        left_out["pipeline"] = True
    return estimate.model_dump(mode="json", exclude=left_out)


SECTIONS: dict[str, Callable[[Scenario], dict[str, Any]]] = {
    "memory": memory_section,
    "comm": comm_section,
}


def plan_section(s: Scenario) -> dict[str, Any]:
    """`zerocalc plan --json` for the scenario's model, GPU, GPUs and sequence length, less what varies from
    run to run (seconds, rates) and the per-candidate list (its counts are checked)."""
    from zerocalc.plan.search import search
    from zerocalc.plan.space import plan_options

    assert s.plan is not None
    p = s.plan
    result = search(
        plan_options(
            model=s.model, gpu=s.gpu, gpus=s.gpus, gpus_per_node=s.gpus_per_node, seq_len=s.seq_len,
            global_batch=p.global_batch, frameworks=p.frameworks, objective=p.objective, top=p.top,
        )
    )  # fmt: skip
    timing = {"seconds", "search_seconds", "exact_seconds", "candidates_per_second", "candidates"}
    return result.model_dump(mode="json", exclude=timing)


def evaluate_scenario(scenario: Scenario) -> dict[str, Any]:
    """Every section of one scenario, as committed in its expectation file (``plan`` with a [plan] table)."""
    out = {name: section(scenario) for name, section in SECTIONS.items()}
    if scenario.plan is not None:
        out["plan"] = plan_section(scenario)
    return out
