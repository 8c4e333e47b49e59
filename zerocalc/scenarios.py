"""Scenarios: a model, a GPU, a cluster shape and training options whose outputs are committed.

Each scenario yields named sections (:data:`SECTIONS`): the ``memory`` estimate and the ``comm``
estimate, as JSON-ready dicts. ``zerocalc check`` compares them with ``presets/expected/NAME.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    reduce_dtype: str | None = None
    tokens_per_step: str | None = None
    tflops: float | None = None
    seq_len: int = Field(default=2048, ge=1)
    micro_batch: int = Field(default=1, ge=1)
    recompute: str = "none"
    framework: str = "paper"


def memory_section(s: Scenario) -> dict[str, Any]:
    """Model states and the peak of a step, as `zerocalc memory --model ... --json` prints them."""
    from zerocalc.peak import estimate_peak, report_json

    estimate, peak = estimate_peak(
        s.model,
        s.gpus,
        s.gpus_per_node,
        framework=s.framework,
        seq_len=s.seq_len,
        micro_batch=s.micro_batch,
        recompute=s.recompute,
        reduce_dtype=s.reduce_dtype,
        gpu=s.gpu,
        strategies=s.strategies,
        precision=s.precision,
        optimizer=s.optimizer,
        fp32_grad_accum=s.fp32_grad_accum,
        offload_optimizer=s.offload_optimizer,
        offload_params=s.offload_params,
    )
    return report_json(estimate, peak)


def comm_section(s: Scenario) -> dict[str, Any]:
    from zerocalc.comm import estimate_comm

    # communication has no offload: strategies that only exist with offload are the memory section's
    strategies = s.strategies if s.offload_optimizer == "none" and s.offload_params == "none" else "all"
    return estimate_comm(
        None,
        s.gpus,
        s.gpus_per_node,
        model=s.model,
        gpu=s.gpu,
        strategies=strategies,
        precision=s.precision,
        grad_accum=s.grad_accum,
        reduce_dtype=s.reduce_dtype,
        tokens_per_step=s.tokens_per_step,
        tflops=s.tflops,
    ).model_dump(mode="json")


SECTIONS: dict[str, Callable[[Scenario], dict[str, Any]]] = {
    "memory": memory_section,
    "comm": comm_section,
}


def evaluate_scenario(scenario: Scenario) -> dict[str, Any]:
    """Every section of one scenario, as committed in its expectation file."""
    return {name: section(scenario) for name, section in SECTIONS.items()}
