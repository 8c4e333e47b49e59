"""What a validation run is asked to do, and the per-rank measurements it sends back (pure, no torch)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from zerocalc.architecture import Architecture
from zerocalc.errors import InputError
from zerocalc.framework_states import Framework, Sharding

OUT_ENV = "ZEROCALC_VALIDATE_OUT"
"""Set by the launcher: rank 0 writes the gathered measurements (JSON) to this file."""
PERTURB_ENV = "ZEROCALC_VALIDATE_PERTURB"
"""Tests only (not in ``--help``): ``LINE`` (e.g. ``params``) adds one fp32 element's bytes to that line
of every rank's prediction, so a deliberately wrong prediction must be reported as a mismatch (exit 1)."""
TEST_FAIL_ENV = "ZEROCALC_VALIDATE_TEST_FAIL"
"""Tests only (not in ``--help``): ``STRATEGY`` makes rank 1 of that strategy's worlds exit with code 1
right after joining the process group, to check that the other configurations still run."""

STRATEGIES: dict[str, tuple[Framework, Sharding | None, bool]] = {
    "ddp": (Framework.DDP, None, True),
    "zero1": (Framework.TORCH_ZERO1, None, True),
    "fsdp1-no-shard": (Framework.FSDP1, Sharding.NO_SHARD, True),
    "fsdp1-shard-grad-op": (Framework.FSDP1, Sharding.SHARD_GRAD_OP, True),
    "fsdp1-full-shard": (Framework.FSDP1, Sharding.FULL_SHARD, True),
    "fsdp2": (Framework.FSDP2, None, True),
    "fsdp2-no-reshard": (Framework.FSDP2, None, False),
}
"""Strategy names of ``--strategies`` → (framework, FSDP1 sharding, FSDP2 reshard_after_forward)."""


def check_buildable(arch: Architecture) -> None:
    """Refuse, in one line, an architecture the real model of ``zerocalc/validate/model.py`` cannot build:
    it builds the classic dense pre-norm blocks (separate q/k/v/o projections, one MLP) only."""
    features = arch.beyond_classic_block()
    if features:
        raise InputError(
            f"{arch.name} has {', '.join(features)}; zerocalc validate builds dense pre-norm blocks with "
            "separate q/k/v/o projections only; accepted: a GPT-2/3, Llama, Mistral or Qwen2 model "
            "(gpt2, llama-3-8b, mistral-7b, qwen2.5-7b, ... or their config.json)"
        )


class Job(BaseModel):
    """One configuration: a strategy × precision, run as its own world."""

    arch: Architecture
    strategy: str
    precision: str = Field(description="fp32 or bf16-mixed")
    optimizer: str = Field(description="adam or adamw")
    backend: str = Field(description="gloo or nccl")
    timeout_s: float = Field(gt=0)
    batch: int = 2
    seq: int = 16
    seed: int = 0


class Measured(BaseModel):
    """What one rank held, in bytes (sums of tensor bytes)."""

    rank: int
    params: int
    grads: int
    optimizer: int
    step: int
    unsharded_after_forward: int | None = Field(
        default=None, description="None where nothing is sharded (DDP, ZeRO-1): not measured"
    )
    peak_allocated: int | None = Field(default=None, description="torch.cuda.max_memory_allocated (GPU only)")
    loss: float
