"""Scenarios: a model, a GPU, a cluster shape and training options whose outputs are committed.

Each scenario yields named sections (:data:`SECTIONS`): the ``memory`` estimate and the ``comm``
estimate, as JSON-ready dicts. ``zerocalc check`` compares them with ``presets/expected/NAME.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.errors import keyword, with_names
from zerocalc.request.training import TrainingOptions, parse_request


class PlanScenario(BaseModel):
    """A ``[plan]`` table: the scenario's model, GPU and GPUs searched by ``zerocalc plan``."""

    model_config = ConfigDict(extra="forbid")

    global_batch: str
    frameworks: str | None = None
    objective: str = "time"
    top: int = Field(default=3, ge=1)
    mfu: float = 0.4


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    model: str
    gpu: str
    gpus: int = Field(ge=1)
    gpus_per_node: int | None = Field(default=None, ge=1)
    strategies: str = "all"
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    fp32_grad_accum: bool = False
    offload_optimizer: str = "none"
    offload_params: str = "none"
    grad_accum: int = Field(default=1, ge=1)
    grad_sync: str | None = None
    zeropp: str | None = None
    reduce_dtype: str | None = None
    tokens_per_step: str | None = None
    tflops: float | None = None
    seq_len: int = Field(default=2048, ge=1)
    micro_batch: int = Field(default=1, ge=1)
    recompute: str = "none"
    framework: str = "paper"
    plan: PlanScenario | None = None
    """With a ``[plan]`` table, the expectation has a ``plan`` section too."""


def training_options(s: Scenario) -> TrainingOptions:
    """The scenario as the options `zerocalc memory --model ...` would be given."""
    return TrainingOptions(
        model=s.model,
        gpus=s.gpus,
        gpus_per_node=s.gpus_per_node,
        gpu=s.gpu,
        strategies=s.strategies,
        framework=s.framework,
        precision=s.precision,
        optimizer=s.optimizer,
        fp32_grad_accum=s.fp32_grad_accum,
        offload_optimizer=s.offload_optimizer,
        offload_params=s.offload_params,
        seq_len=s.seq_len,
        micro_batch=s.micro_batch,
        recompute=s.recompute,
        reduce_dtype=s.reduce_dtype,
        grad_accum=s.grad_accum,
        grad_sync=s.grad_sync,
        zeropp=s.zeropp,
        tokens_per_step=s.tokens_per_step,
        tflops=s.tflops,
    )


def memory_section(s: Scenario) -> dict[str, Any]:
    """Model states and the peak of a step, as `zerocalc memory --model ... --json` prints them (notes
    naming options by their keywords, as the library does)."""
    from zerocalc.peak.evaluate import evaluate_peak

    return with_names(evaluate_peak(parse_request(training_options(s))), keyword).to_json_dict()


def comm_section(s: Scenario) -> dict[str, Any]:
    """Communication per step under the scenario's framework, as `zerocalc comm --model ... --framework
    ... --json` prints it less each collective's per-unit calls (``units``: hundreds of lines per scenario;
    their totals and call counts are checked). comm has no offload: a scenario that offloads shows all its
    framework's strategies."""
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate

    offloads = s.offload_optimizer != "none" or s.offload_params != "none"
    options = training_options(s).model_copy(
        update={
            "estimate": Estimate.COMM,
            "strategies": "all" if offloads else s.strategies,
            "offload_optimizer": None,
            "offload_params": None,
            "seq_len": 2048,
            "micro_batch": 1,
            "recompute": "none",
        }
    )
    per_unit = {"strategies": {"__all__": {"collectives": {"__all__": {"units"}}}}}
    estimate = with_names(evaluate_comm(parse_request(options)), keyword)
    return estimate.model_dump(mode="json", exclude=per_unit)


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
            global_batch=p.global_batch, frameworks=p.frameworks, objective=p.objective, top=p.top, mfu=p.mfu,
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
