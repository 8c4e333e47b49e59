"""What a bench run was asked to do (built by the CLI, sent to every worker as JSON), and its bounds."""

from __future__ import annotations

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.harness.procs import MAX_TIMEOUT_S, brief
from zerocalc.network.collectives import Collective

TEST_EXIT_ENV = "ZEROCALC_BENCH_TEST_EXIT_RANK"
"""Tests only: ``RANK:CODE`` makes that rank exit with CODE right after joining the group."""
TEST_HANG_ENV = "ZEROCALC_BENCH_TEST_HANG_RANK"
"""Tests only: that rank sleeps forever right after joining the group."""

MAX_ITERS = 1_000_000
"""``--iters`` and ``--warmup`` are at most a million iterations per size."""
MAX_SIZE_BYTES = 2**40
"""``--min-bytes`` and ``--max-bytes`` are at most 1 TiB (more than any one device holds)."""
MAX_STEP_FACTOR = 1024
"""``--step-factor`` is at most 1024 (2¹⁰: still two sizes between 1 KiB and 1 MiB)."""


class BenchConfig(BaseModel):
    collectives: list[Collective]
    dtype: DType
    min_bytes: int = Field(ge=1, le=MAX_SIZE_BYTES)
    max_bytes: int = Field(ge=1, le=MAX_SIZE_BYTES)
    step_factor: int = Field(ge=2, le=MAX_STEP_FACTOR)
    warmup: int = Field(ge=0, le=MAX_ITERS)
    iters: int = Field(ge=1, le=MAX_ITERS)
    check: bool = False
    backend: str = Field(description="nccl or gloo")
    timeout_s: float = Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    out: str | None = Field(default=None, description="calibration path; None: the default under the cache")
    json_output: bool = False


def check_iterations(warmup: int, iters: int) -> None:
    """0 ≤ warmup ≤ :data:`MAX_ITERS` and 1 ≤ iters ≤ :data:`MAX_ITERS`."""
    if not 0 <= warmup <= MAX_ITERS:
        raise InputError(f"--warmup {brief(warmup)} is not accepted; accepted: 0 to {MAX_ITERS:,} iterations")
    if not 1 <= iters <= MAX_ITERS:
        raise InputError(f"--iters {brief(iters)} is not accepted; accepted: 1 to {MAX_ITERS:,} iterations")


def check_sweep(min_bytes: int, max_bytes: int, step_factor: int) -> None:
    """1 ≤ min ≤ max ≤ :data:`MAX_SIZE_BYTES` and 2 ≤ step factor ≤ :data:`MAX_STEP_FACTOR`."""
    for option, value in (("--min-bytes", min_bytes), ("--max-bytes", max_bytes)):
        if not 1 <= value <= MAX_SIZE_BYTES:
            raise InputError(
                f"{option} {brief(value)} is not accepted; "
                f"accepted: 1 byte to 1TiB ({MAX_SIZE_BYTES:,} bytes)"
            )
    if max_bytes < min_bytes:
        raise InputError(
            f"--max-bytes {brief(max_bytes)} is smaller than --min-bytes {brief(min_bytes)}; "
            "accepted: max ≥ min"
        )
    if not 2 <= step_factor <= MAX_STEP_FACTOR:
        raise InputError(
            f"--step-factor {brief(step_factor)} is not accepted; "
            f"accepted: a whole number from 2 to {MAX_STEP_FACTOR}"
        )
