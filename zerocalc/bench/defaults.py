"""Defaults of ``zerocalc bench``, importable at CLI start-up (no pydantic models, no torch)."""

from __future__ import annotations

DEFAULT_TIMEOUT_S = 300
DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
DEFAULT_MAX_BYTES_GPU = 2**30
DEFAULT_MAX_BYTES_CPU = 64 * 2**20
DEFAULT_COLLECTIVES_TEXT = "all_reduce,reduce_scatter,all_gather"
"""The three collectives ZeRO and FSDP issue (cf. ``zerocalc.bench.sweep.DEFAULT_COLLECTIVES``)."""
