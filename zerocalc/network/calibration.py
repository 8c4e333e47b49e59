"""Bandwidth calibrations written by ``zerocalc bench`` and read by ``zerocalc comm``.

A calibration holds the raw measurements of a sweep and, per collective and kind of process group, the
least-squares fit of nccl-tests' time model ``t = α + factor(n)·S / β``: α is the latency in seconds and β
the bus bandwidth in bytes per second (nccl-tests ``doc/PERFORMANCE.md``; ``factor`` is
:mod:`zerocalc.network.collectives`' single definition). The file is JSON from these pydantic models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from zerocalc.base.atomic import write_text_atomic
from zerocalc.base.errors import InputError, shown, why_not
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective

CALIBRATION_SCHEMA_VERSION = 2
"""2: groups are named as everywhere else (``world``, ``node``, ``across_nodes``)."""
READABLE_SCHEMA_VERSIONS = (1, 2)
_VERSION_1_GROUPS = {"intra_node": RankGroup.NODE.value, "inter_node": RankGroup.ACROSS_NODES.value}
"""Schema 1 called the groups of one node ``intra_node`` and those of one rank per node ``inter_node``."""

MeasuredGroup = Annotated[RankGroup, BeforeValidator(lambda name: _VERSION_1_GROUPS.get(name, name))]
"""The ranks a collective was measured over: all (world), one node's, or one per node (across nodes)."""


class _Finite(BaseModel):
    """Every float is finite: JSON's 1e400 (infinity) and NaN are refused when a file is read."""

    model_config = ConfigDict(allow_inf_nan=False)


class Measurement(_Finite):
    """One row of a sweep, as nccl-tests prints it."""

    collective: Collective
    group_kind: MeasuredGroup
    group_size: int = Field(ge=1)
    size_bytes: int = Field(ge=0, description="S, bytes of the whole array (nccl-tests' convention)")
    count: int = Field(ge=0, description="elements of the whole array")
    dtype: str
    time_s: float = Field(ge=0, description="slowest rank's time per iteration, averaged over iterations")
    algbw_Bps: float = Field(ge=0, description="S / t")
    busbw_Bps: float = Field(ge=0, description="algbw · factor(n)")
    errors: int | None = Field(default=None, description="wrong elements found by --check, None if unchecked")


class CollectiveFit(_Finite):
    """t = α + factor(n)·S / β fitted over a sweep by least squares."""

    collective: Collective
    group_kind: MeasuredGroup
    group_size: int = Field(ge=1)
    latency_s: float = Field(ge=0, description="α")
    bus_bandwidth_Bps: float = Field(gt=0, description="β")
    peak_busbw_Bps: float = Field(ge=0, description="largest measured busbw of the sweep")
    points: int = Field(ge=1)
    beta_from_peak: bool = Field(
        default=False,
        description="the least-squares slope was not positive (times not growing with size, or one point): "
        "β is the peak busbw, not a fit",
    )


class Calibration(_Finite):
    schema_version: int = CALIBRATION_SCHEMA_VERSION
    created_at: str = Field(description="ISO 8601 date and time of the measurement (UTC)")
    backend: str = Field(description="nccl or gloo")
    device_name: str
    torch_version: str
    nccl_version: str | None = None
    world_size: int = Field(ge=1)
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    dtype: str
    measurements: list[Measurement]
    fits: list[CollectiveFit]

    def fit_for(self, collective: Collective, group_kind: MeasuredGroup) -> CollectiveFit | None:
        return next((f for f in self.fits if f.collective is collective and f.group_kind is group_kind), None)

    def measured_range(self, collective: Collective, group_kind: MeasuredGroup) -> tuple[int, int] | None:
        """The smallest and largest S (bytes) the sweep measured for a fit (None: no measurement kept)."""
        sizes = [
            m.size_bytes
            for m in self.measurements
            if m.collective is collective and m.group_kind is group_kind
        ]
        return (min(sizes), max(sizes)) if sizes else None


def save_calibration(calibration: Calibration, path: str | Path, parents: bool = False) -> Path:
    """Write atomically (see :mod:`zerocalc.base.atomic`); ``parents``: create missing folders."""
    return write_text_atomic(path, calibration.model_dump_json(indent=2) + "\n", parents)


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration; any problem is one :class:`InputError` line naming the file.

    Schema 1 files (groups named ``intra_node``/``inter_node``) are read as well.
    """
    accepted = "accepted: a file written by `zerocalc bench`"
    if str(path) == "":
        raise InputError(f"{{calibration}} '' is empty; {accepted}")
    file = Path(path)
    name = shown(str(file))
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{{calibration}} {name} is not UTF-8 text (byte {exc.start}); {accepted}") from exc
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte
        raise InputError(f"{{calibration}} {name} cannot be read ({why_not(exc)}); {accepted}") from exc
    try:
        calibration = Calibration.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise InputError(
            f"{{calibration}} {name} is not a zerocalc calibration ({where}: {shown(first['msg'])[1:-1]}); "
            f"{accepted}"
        ) from exc
    if calibration.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise InputError(
            f"{{calibration}} {name} has schema_version {calibration.schema_version}; "
            f"accepted: {', '.join(map(str, READABLE_SCHEMA_VERSIONS))}"
        )
    return calibration
