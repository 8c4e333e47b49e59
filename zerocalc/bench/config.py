"""What a bench run was asked to do (built by the CLI, sent to every worker as JSON)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from zerocalc.collectives import Collective
from zerocalc.dtypes import DType

DEFAULT_TIMEOUT_S = 300
DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
DEFAULT_MIN_BYTES = 1024
DEFAULT_MAX_BYTES_GPU = 2**30
DEFAULT_MAX_BYTES_CPU = 64 * 2**20


class BenchConfig(BaseModel):
    collectives: list[Collective]
    dtype: DType
    min_bytes: int = Field(ge=1)
    max_bytes: int = Field(ge=1)
    step_factor: int = Field(ge=2)
    warmup: int = Field(ge=0)
    iters: int = Field(ge=1)
    check: bool = False
    backend: str = Field(description="nccl or gloo")
    timeout_s: float = Field(gt=0)
    out: str | None = Field(default=None, description="calibration path; None: the default under the cache")
    json_output: bool = False
    max_bytes_given: bool = Field(default=True, description="False: the default max, which depends on device")
