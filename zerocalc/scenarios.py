"""Scenarios: a model, a GPU, a cluster shape and training options whose outputs are committed.

Each scenario yields named sections (:data:`SECTIONS`): the ``memory`` estimate and the ``comm``
estimate, as JSON-ready dicts. ``zerocalc check`` compares them with ``presets/expected/NAME.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.request import TrainingOptions, parse_request


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
    """Model states and the peak of a step, as `zerocalc memory --model ... --json` prints them."""
    from zerocalc.peak.evaluate import evaluate_peak

    return evaluate_peak(parse_request(training_options(s))).to_json_dict()


def comm_section(s: Scenario) -> dict[str, Any]:
    """Communication per step under the scenario's framework, as `zerocalc comm --model ... --framework
    ... --json` prints it less each collective's per-unit calls (``units``: hundreds of lines per scenario;
    their totals and call counts are checked). comm has no offload: a scenario that offloads shows all its
    framework's strategies."""
    from zerocalc.comm import evaluate_comm
    from zerocalc.frameworks import Estimate

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
    return evaluate_comm(parse_request(options)).model_dump(mode="json", exclude=per_unit)


SECTIONS: dict[str, Callable[[Scenario], dict[str, Any]]] = {
    "memory": memory_section,
    "comm": comm_section,
}


def evaluate_scenario(scenario: Scenario) -> dict[str, Any]:
    """Every section of one scenario, as committed in its expectation file."""
    return {name: section(scenario) for name, section in SECTIONS.items()}
