"""What ``zerocalc bench --compute`` measures (pure): the GEMM, attention and bandwidth points, from a
ladder of sizes and the shapes of the models asked for.

A model's shapes are its rank's products forward and backward (:mod:`zerocalc.compute.ops`: every layer
matrix and the LM head at M = b·s/c rows, their input- and weight-gradient products) and its attention
core, so that the estimate for that model looks its own shapes up instead of interpolating.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.compute.ops import Gemm, MicroBatchOps

GEMM_ROWS = {"cuda": (1024, 4096, 16384), "cpu": (64, 256)}
GEMM_COLUMNS = {"cuda": (512, 2048, 8192, 32768), "cpu": (64, 256)}
"""The ladder of GEMMs: every (m, n, k) with m from the rows and n, k from the columns."""
ATTENTION_LADDER = {
    "cuda": ((32, 16, 512), (8, 32, 2048), (2, 32, 8192), (1, 32, 32768), (2, 8, 8192), (1, 64, 4096)),
    "cpu": ((1, 4, 64), (1, 4, 128)),
}
"""(batch, heads, sequence) of the causal attention ladder, each at head dimensions 64 and 128."""
HEAD_DIMS = (64, 128)
BANDWIDTH_BYTES = {
    "cuda": tuple(2**p for p in range(20, 33, 2)),
    "cpu": (2**16, 2**20, 2**22),
}
"""Bytes read + written by the bandwidth kernel (``torch.mul(x, 2, out=y)``): 1 MiB to 4 GiB on a GPU."""
MIN_SECONDS = {"cuda": 0.05, "cpu": 0.01}
"""Each point is timed until this long has passed (or ``iters`` ran): long enough for the clocks a
sustained load runs at."""


class GemmShape(NamedTuple):
    m: int
    n: int
    k: int


class AttentionShape(NamedTuple):
    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool = True


class ComputeBenchConfig(BaseModel):
    """What one ``bench --compute`` run measures (built by the CLI, run by the worker)."""

    device: str = Field(description="cuda or cpu")
    dtypes: list[DType]
    gemms: list[GemmShape]
    attention: list[AttentionShape]
    bandwidth_bytes: list[int]
    warmup: int = Field(ge=0)
    iters: int = Field(ge=1, description="at most this many timed iterations per point")
    min_seconds: float = Field(gt=0)
    source: str = Field(description="what the table's source line says")
    out: str | None = None
    json_output: bool = False


def _shapes(gemm: Gemm) -> list[GemmShape]:
    """A product's shapes forward and backward, as the estimate looks them up (count products of one
    shape as one of their stacked rows, :func:`zerocalc.compute.time.micro_batch_time`)."""
    return [GemmShape(g.m * g.count, g.n, g.k) for g in (gemm, *gemm.backward())]


def model_shapes(ops: MicroBatchOps) -> tuple[list[GemmShape], list[AttentionShape]]:
    """A micro-batch's GEMMs (forward, input- and weight-gradient) and fused attention shapes."""
    gemms: list[GemmShape] = []
    attention: list[AttentionShape] = []
    for layer in ops.layers:
        for gemm in layer.gemms:
            gemms += _shapes(gemm)
        a = layer.attention
        if a.fused:
            attention.append(
                AttentionShape(a.batch, a.heads, a.seq_q, a.seq_kv, max(a.qk_dim, a.v_dim), a.causal)
            )
        else:
            for product in a.products():
                gemms += _shapes(product)
    for gemm in ops.outside_gemms:
        gemms += _shapes(gemm)
    return list(dict.fromkeys(gemms)), list(dict.fromkeys(attention))


def ladder(device: str) -> tuple[list[GemmShape], list[AttentionShape]]:
    """The generic points measured on every run."""
    rows, columns = GEMM_ROWS[device], GEMM_COLUMNS[device]
    gemms = [GemmShape(m, n, k) for m in rows for n in columns for k in columns]
    attention = [
        AttentionShape(batch, heads, seq, seq, d)
        for batch, heads, seq in ATTENTION_LADDER[device]
        for d in HEAD_DIMS
    ]
    return gemms, attention
