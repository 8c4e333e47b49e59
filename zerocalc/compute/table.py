"""Compute tables: what a GPU achieves on the operations of a training step, and the file that holds them.

A table holds measured points (``zerocalc bench --compute`` writes them; the GPU presets ship one per GPU
in ``presets/compute/``) and a *roofline* for what was not measured:

* **GEMMs**: achieved FLOP/s of ``(m × k) · (k × n)`` products per dtype, measured at the model's shapes
  and at a ladder of sizes; an FP8 product on a table that measured only bf16 ones runs at the bf16
  rate of its shape × the roofline's fp8 / bf16 peak (:meth:`_Rates._scaled_from_bf16`);
* **attention**: achieved FLOP/s (executed FLOPs: a causal mask halves them) of the fused SDPA kernel,
  forward and backward, per (batch, heads, query and key lengths, head dimension);
* **memory**: achieved bytes/s (read + written) of an element-wise kernel per tensor size.

A lookup takes the exact shape where measured, else interpolates between the nearest measured points
in log space (inverse-distance weights of the rates, over the four nearest), else the roofline:
Calculon's model (Isaev et al. 2023; ``systems/*.json`` ``gflops_efficiency`` and ``MB_efficiency``,
``calculon/system.py`` ``no_overlap`` processing): a tier of efficiency by the operation's size of the
datasheet's peak, and a GEMM's time its FLOPs at that rate plus its operands' and result's bytes at the
memory tier's bandwidth.

The file is JSON from these pydantic models, written atomically.
"""

from __future__ import annotations

import heapq
import itertools
import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zerocalc.base.atomic import write_text_atomic
from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError, shown, why_not

COMPUTE_SCHEMA_VERSION = 1
NEAREST = 4
"""Measured points a rate is interpolated from."""


class _Record(BaseModel):
    """Finite numbers only (JSON's 1e400 and NaN refused), frozen."""

    model_config = ConfigDict(allow_inf_nan=False, frozen=True)


class GemmPoint(_Record):
    """One measured GEMM: C (m × n) = A (m × k) · B (k × n)."""

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: DType
    seconds: float = Field(gt=0, description="median time of one product")
    tflops: float = Field(gt=0, description="2·m·n·k / seconds, in TFLOP/s")


class AttentionPoint(_Record):
    """One measured fused attention (SDPA): q [batch, heads, seq_q, head_dim], k and v [.., seq_kv, ..]."""

    batch: int = Field(ge=1)
    heads: int = Field(ge=1)
    seq_q: int = Field(ge=1)
    seq_kv: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    causal: bool
    dtype: DType
    forward_s: float = Field(gt=0)
    backward_s: float = Field(gt=0)
    forward_tflops: float = Field(gt=0, description="executed forward FLOPs / forward_s")
    backward_tflops: float = Field(gt=0, description="executed backward FLOPs (2.5 × forward) / backward_s")


class BandwidthPoint(_Record):
    """One measured element-wise kernel: ``bytes`` read and written in ``seconds``."""

    bytes: int = Field(ge=1, description="read + written")
    seconds: float = Field(gt=0)
    bytes_per_s: float = Field(gt=0)


class Tier(_Record):
    """From ``at_least`` (FLOPs or bytes of one operation) up: this fraction of the peak."""

    at_least: float = Field(ge=0)
    efficiency: float = Field(gt=0, le=1)


class Roofline(_Record):
    """What a table falls back on where it measured nothing: datasheet peaks and efficiency tiers."""

    peak_tflops: dict[DType, float] = Field(description="dense tensor-core TFLOP/s per dtype")
    memory_bytes_per_s: float = Field(gt=0, description="the datasheet's HBM bandwidth")
    gemm_tiers: tuple[Tier, ...]
    memory_tiers: tuple[Tier, ...]
    attention_forward: float = Field(gt=0, le=1, description="fused attention forward, fraction of peak")
    attention_backward: float = Field(gt=0, le=1, description="fused attention backward, fraction of peak")
    source: str


class ComputeTable(_Record):
    """A GPU's compute table: measured points, and the roofline for the rest."""

    schema_version: int = COMPUTE_SCHEMA_VERSION
    device_name: str
    source: str = Field(description="where the points come from")
    created_at: str | None = Field(default=None, description="ISO 8601 time of the measurement (UTC)")
    torch_version: str | None = None
    backend: str | None = Field(default=None, description="cuda or cpu: where the points were measured")
    gemm: tuple[GemmPoint, ...] = ()
    attention: tuple[AttentionPoint, ...] = ()
    memory: tuple[BandwidthPoint, ...] = ()
    roofline: Roofline | None = None

    @property
    def prices_fp8(self) -> bool:
        """It prices FP8 GEMMs: FP8 points, or an FP8 peak in its roofline."""
        return any(p.dtype is DType.FP8 for p in self.gemm) or (
            self.roofline is not None and DType.FP8 in self.roofline.peak_tflops
        )

    def _rates(self) -> _Rates:
        rates = _LOOKUPS.get(id(self))
        if rates is None or rates.table is not self:
            rates = _LOOKUPS[id(self)] = _Rates(self)
        return rates

    def gemm_rate(self, m: int, n: int, k: int, dtype: DType) -> float:
        """FLOP/s of one ``m × k · k × n`` product in ``dtype``."""
        return self._rates().gemm(m, n, k, dtype)

    def attention_rates(
        self, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, causal: bool, dtype: DType
    ) -> tuple[float, float]:
        """Executed FLOP/s of fused attention's forward and backward at this shape."""
        return self._rates().attention(batch, heads, seq_q, seq_kv, head_dim, causal, dtype)

    def bandwidth(self, nbytes: float) -> float:
        """Bytes/s of an element-wise kernel moving ``nbytes`` (read + written)."""
        return self._rates().bandwidth(nbytes)


def _tier(tiers: tuple[Tier, ...], size: float) -> float:
    """The efficiency of the largest tier ``size`` reaches (the smallest tier below every size)."""
    reached = [t for t in tiers if size >= t.at_least]
    chosen = max(reached, key=lambda t: t.at_least) if reached else min(tiers, key=lambda t: t.at_least)
    return chosen.efficiency


def _log2s(coords: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(math.log2(c) for c in coords)


def _interpolated(points: list[tuple[tuple[float, ...], float]], at: tuple[float, ...]) -> float:
    """Inverse-distance weighting, in log space, of the rates of the :data:`NEAREST` points nearest ``at``;
    an exact match is that point's rate. Rates are averaged as times per unit of work (harmonically), so
    that one slow neighbour weighs as its time does. ``points``: each measured point's coordinates in
    log2 (:func:`_log2s`, taken once per table) and its rate."""
    logs = _log2s(at)
    scored = []
    for point, rate in points:
        distance = math.dist(logs, point)
        if distance == 0:
            return rate
        scored.append((distance, rate))
    nearest = heapq.nsmallest(NEAREST, scored)  # sorted(scored)[:NEAREST], without sorting them all
    weights = [1 / d**2 for d, _ in nearest]
    return sum(weights) / sum(w / r for w, (_, r) in zip(weights, nearest, strict=True))


def no_fp8_problem(asked: str) -> str:
    """Why ``asked`` (an FP8 recipe on a GPU, in words) is refused where the compute table prices no FP8
    GEMM (:attr:`ComputeTable.prices_fp8`)."""
    return (
        f"{asked}: its compute table has no FP8 peak and no FP8 points (no FP8 tensor cores: "
        "torch._scaled_mm and Transformer Engine's FP8 GEMMs need compute capability 8.9 or later); "
        "accepted: a GPU with them (h100-80gb, h200-141gb, b200-180gb, l40s, mi300x, ...), or {fp8} none"
    )


class _Rates:
    """A table's lookups, each shape computed once (a plan asks for the same shapes many times)."""

    def __init__(self, table: ComputeTable):
        self.table = table
        self._gemm: dict[DType, list[tuple[tuple[float, ...], float]]] = {}
        for p in table.gemm:
            self._gemm.setdefault(p.dtype, []).append((_log2s((p.m, p.n, p.k)), p.tflops * 1e12))
        self._attention: dict[tuple[bool, DType], list[tuple[tuple[float, ...], tuple[float, float]]]] = {}
        for a in table.attention:
            key = (a.causal, a.dtype)
            coords = _log2s((a.batch * a.heads, a.seq_q, a.seq_kv, a.head_dim))
            self._attention.setdefault(key, []).append(
                (coords, (a.forward_tflops * 1e12, a.backward_tflops * 1e12))
            )
        self._memory = sorted((p.bytes, p.bytes_per_s) for p in table.memory)
        self._cache: dict[tuple, object] = {}

    def _roofline(self, what: str) -> Roofline:
        if self.table.roofline is None:
            raise InputError(
                f"the compute table of {shown(self.table.device_name)} measured no {what} and has no "
                "roofline; accepted: a table from `zerocalc bench --compute` or a GPU preset's"
            )
        return self.table.roofline

    def _peak(self, dtype: DType) -> float:
        roofline = self._roofline(f"{dtype.value} GEMMs")
        peak = roofline.peak_tflops.get(dtype)
        if peak is None and dtype is DType.FP8:
            raise InputError(no_fp8_problem(f"{{fp8}} on {shown(self.table.device_name)}"))
        if peak is None:
            bf16 = roofline.peak_tflops.get(DType.BF16)
            if bf16 is None:
                raise InputError(f"the compute table has no {dtype.value} peak")
            peak = bf16  # a dtype without its own peak (fp16 on a bf16 table) runs at the 16-bit rate
        return peak * 1e12

    def gemm(self, m: int, n: int, k: int, dtype: DType) -> float:
        key = ("gemm", m, n, k, dtype)
        rate = self._cache.get(key)
        if rate is None:
            points = self._gemm.get(dtype)
            if points:
                rate = _interpolated(points, (m, n, k))
            elif (scaled := self._scaled_from_bf16(m, n, k, dtype)) is not None:
                rate = scaled
            else:
                roofline = self._roofline(f"{dtype.value} GEMMs")
                flops = 2.0 * m * n * k
                moved = dtype.bytes * (m * k + k * n + m * n)
                seconds = flops / (self._peak(dtype) * _tier(roofline.gemm_tiers, flops))
                seconds += moved / (roofline.memory_bytes_per_s * _tier(roofline.memory_tiers, moved))
                rate = flops / seconds
            self._cache[key] = rate
        return rate  # type: ignore[return-value]

    def _scaled_from_bf16(self, m: int, n: int, k: int, dtype: DType) -> float | None:
        """An FP8 product where only bf16 ones were measured: the bf16 rate at that shape × the datasheet's
        fp8 peak / its bf16 peak, the measured efficiency applied to the fp8 peak (an assumption: FP8
        kernels reach the fraction of their peak bf16 ones do at the same shape; ``bench --compute``
        measures FP8 products where ``torch._scaled_mm`` runs). None: not FP8, no bf16 points, or the
        roofline has no fp8 peak."""
        bf16 = self._gemm.get(DType.BF16)
        roofline = self.table.roofline
        if dtype is not DType.FP8 or not bf16 or roofline is None:
            return None
        peaks = roofline.peak_tflops
        if DType.FP8 not in peaks or DType.BF16 not in peaks:
            return None
        return _interpolated(bf16, (m, n, k)) * peaks[DType.FP8] / peaks[DType.BF16]

    def attention(
        self, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, causal: bool, dtype: DType
    ) -> tuple[float, float]:
        key = ("attention", batch * heads, seq_q, seq_kv, head_dim, causal, dtype)
        rates = self._cache.get(key)
        if rates is None:
            points = self._attention.get((causal, dtype)) or self._attention.get((not causal, dtype))
            if points:
                at = (batch * heads, seq_q, seq_kv, head_dim)
                forward = _interpolated([(c, r[0]) for c, r in points], at)
                backward = _interpolated([(c, r[1]) for c, r in points], at)
                rates = (forward, backward)
            else:
                roofline = self._roofline("attention")
                peak = self._peak(dtype)
                rates = (peak * roofline.attention_forward, peak * roofline.attention_backward)
            self._cache[key] = rates
        return rates  # type: ignore[return-value]

    def bandwidth(self, nbytes: float) -> float:
        key = ("memory", nbytes)
        rate = self._cache.get(key)
        if rate is None:
            if self._memory:
                rate = _log_linear(self._memory, nbytes)
            else:
                roofline = self._roofline("memory bandwidth")
                rate = roofline.memory_bytes_per_s * _tier(roofline.memory_tiers, nbytes)
            self._cache[key] = rate
        return rate  # type: ignore[return-value]


_LOOKUPS: dict[int, _Rates] = {}
"""Each table's lookups (by the table's identity; the entry keeps the table alive, so the identity is not
reused while it stands)."""


def _log_linear(points: list[tuple[int, float]], x: float) -> float:
    """Linear in log(size) between the two measured sizes around ``x``; the end's rate beyond them."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            if x1 == x0:
                return y1
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return points[-1][1]  # pragma: no cover - the loop covers every x between the ends


# ------------------------------------------------------------------------------------------------ files
def save_compute_table(table: ComputeTable, path: str | Path, parents: bool = False) -> Path:
    """Write atomically (see :mod:`zerocalc.base.atomic`); ``parents``: create missing folders."""
    return write_text_atomic(path, table.model_dump_json(indent=2) + "\n", parents)


def parse_compute_table(text: str, name: str, what: str = "{compute_calibration}") -> ComputeTable:
    """A table from its JSON text; any problem is one :class:`InputError` line naming ``name``."""
    accepted = "accepted: a file written by `zerocalc bench --compute`"
    try:
        table = ComputeTable.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise InputError(
            f"{what} {name} is not a zerocalc compute table ({where}: {shown(first['msg'])[1:-1]}); "
            f"{accepted}"
        ) from exc
    if table.schema_version != COMPUTE_SCHEMA_VERSION:
        raise InputError(
            f"{what} {name} has schema_version {table.schema_version}; accepted: {COMPUTE_SCHEMA_VERSION}"
        )
    return table


def load_compute_table(path: str | Path, what: str = "{compute_calibration}") -> ComputeTable:
    """Read and validate a compute table; any problem is one :class:`InputError` line naming the file."""
    accepted = "accepted: a file written by `zerocalc bench --compute`"
    if str(path) == "":
        raise InputError(f"{what} '' is empty; {accepted}")
    file = Path(path)
    name = shown(str(file))
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {name} is not UTF-8 text (byte {exc.start}); {accepted}") from exc
    except (OSError, ValueError) as exc:
        raise InputError(f"{what} {name} cannot be read ({why_not(exc)}); {accepted}") from exc
    return parse_compute_table(text, name, what)
