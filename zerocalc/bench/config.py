"""What a bench run was asked to do (built by the CLI, sent to every worker as JSON)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from zerocalc.collectives import Collective
from zerocalc.dtypes import DType

ERROR_DIR_ENV = "ZEROCALC_BENCH_ERROR_DIR"
"""Set by the launcher: a rank writes its one-line error to ``<dir>/rank<N>.err`` for the launcher to
report (one message for the whole job) instead of printing it."""
TEST_EXIT_ENV = "ZEROCALC_BENCH_TEST_EXIT_RANK"
"""Tests only: ``RANK:CODE`` makes that rank exit with CODE right after joining the group."""
TEST_HANG_ENV = "ZEROCALC_BENCH_TEST_HANG_RANK"
"""Tests only: that rank sleeps forever right after joining the group."""


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
