"""The sizes of a sweep and the memory it needs (pure, no torch).

S is the size in bytes of the whole array, as in nccl-tests (see :mod:`zerocalc.network.collectives`). For the
collectives whose per-rank buffer is a shard of S (reduce_scatter, all_gather) or that send one block of
S/n to each rank (all_to_all), the element count is rounded down to a multiple of the group size n, as
nccl-tests does, so every rank holds the same whole number of elements.
"""

from __future__ import annotations

import contextlib
import os

from pydantic import BaseModel, Field

from zerocalc.base.units import ByteUnit, format_bytes
from zerocalc.bench.config import check_sweep
from zerocalc.network.collectives import COLLECTIVES, Collective

DEFAULT_COLLECTIVES: tuple[Collective, ...] = (
    Collective.ALL_REDUCE,
    Collective.REDUCE_SCATTER,
    Collective.ALL_GATHER,
)
"""The three collectives ZeRO and FSDP issue."""


class SweepPoint(BaseModel):
    size_bytes: int = Field(ge=0, description="S, bytes of the whole array")
    count: int = Field(ge=1, description="elements of the whole array")


def splits_evenly(collective: Collective) -> bool:
    """The whole array is cut into n equal blocks (one per rank)."""
    spec = COLLECTIVES[collective]
    return spec.input_is_shard or spec.output_is_shard or collective is Collective.ALL_TO_ALL


def sweep_points(
    collective: Collective,
    group_size: int,
    dtype_bytes: int,
    min_bytes: int,
    max_bytes: int,
    step_factor: int,
) -> list[SweepPoint]:
    """Sizes min, min·f, min·f², ... ≤ max, each rounded down to whole elements (and to a multiple of n
    elements where the array is split over ranks); at least one element (n elements) per point."""
    check_sweep(min_bytes, max_bytes, step_factor)
    multiple = group_size if splits_evenly(collective) else 1
    points: list[SweepPoint] = []
    size = min_bytes
    while size <= max_bytes:
        count = max(size // dtype_bytes // multiple * multiple, multiple)
        if not points or points[-1].count != count:
            points.append(SweepPoint(size_bytes=count * dtype_bytes, count=count))
        size *= step_factor
    return points


def buffer_bytes(collective: Collective, size_bytes: int, group_size: int) -> int:
    """Bytes one rank allocates for one point: input + output (+ the expected result of ``--check``).

    all_reduce and broadcast work in place (S); reduce_scatter holds S in and S/n out; all_gather S/n in
    and S out; all_to_all S in and S out. ``--check`` adds one more output-sized buffer.
    """
    spec = COLLECTIVES[collective]
    shard = size_bytes // group_size
    if collective in (Collective.ALL_REDUCE, Collective.BROADCAST):
        return 2 * size_bytes  # the buffer and the expected result
    input_bytes = shard if spec.input_is_shard else size_bytes
    output_bytes = shard if spec.output_is_shard else size_bytes
    return input_bytes + 2 * output_bytes


def memory_problem(
    collectives: list[Collective],
    dtype_bytes: int,
    min_bytes: int,
    max_bytes: int,
    step_factor: int,
    ranks_sharing: int,
    free_bytes: int | None,
    where: str,
) -> str | None:
    """Why the sweep's largest point does not fit in ``free_bytes`` shared by ``ranks_sharing`` ranks
    (None: it fits, or the free memory is unknown). Buffers are largest for the smallest group (shards of
    S/n), so they are sized for n = 2."""
    points = {c: sweep_points(c, 2, dtype_bytes, min_bytes, max_bytes, step_factor)[-1] for c in collectives}
    need = max(buffer_bytes(c, p.size_bytes, 2) for c, p in points.items()) * ranks_sharing
    if free_bytes is None or need <= free_bytes:
        return None
    largest = max(p.size_bytes for p in points.values())
    return (
        f"--max-bytes {max_bytes}: the largest size S = {largest:,} bytes needs "
        f"{format_bytes(need, ByteUnit.GiB)} GiB of buffers on {where} "
        f"but only {format_bytes(free_bytes, ByteUnit.GiB)} GiB is free; accepted: a smaller --max-bytes"
    )


def host_available_bytes() -> int | None:
    """The node's MemAvailable (Linux), else the free physical pages, else None."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="utf-8") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None
