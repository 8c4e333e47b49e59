"""Latency and bus bandwidth of the links collectives run over, and where each figure came from.

Figures come, in order of preference, from a ``zerocalc bench`` calibration fit (per collective and group,
chosen in :mod:`zerocalc.comm.estimate`), explicit ``--intra-node-bw``/``--inter-node-bw``/``--latency``, a
GPU
preset's typical figures, or the stated defaults below.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_INTRA_NODE_BUSBW = 450e9
"""H100 SXM: NVLink 4 gives 450 GB/s per direction per GPU (NVIDIA H100 datasheet: 900 GB/s
bidirectional); nccl-tests all_reduce busbw on 8×H100 nodes measures about 450–480 GB/s."""
DEFAULT_INTER_NODE_BUSBW = 50e9
"""One 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100 design) = 50 GB/s per GPU."""
DEFAULT_LATENCY_S = 20e-6
"""Order of magnitude of an NCCL ring collective's base latency (nccl-tests small-message times)."""

DEFAULT_DETAIL = {
    "intra-node": (
        "stated default: H100 SXM NVLink 4, 450 GB/s per direction; "
        "set --intra-node-bw, --gpu or --calibration"
    ),
    "inter-node": (
        "stated default: one 400 Gb/s NDR NIC per GPU = 50 GB/s; set --inter-node-bw, --gpu or --calibration"
    ),
}


class BandwidthSource(StrEnum):
    CALIBRATION = "calibration"
    EXPLICIT = "explicit"
    GPU_PRESET = "gpu_preset"
    DEFAULT = "default"


class LinkFigures(BaseModel):
    """Latency α and bus bandwidth β for one kind of group, and where they came from."""

    model_config = ConfigDict(frozen=True)

    latency_s: float = Field(ge=0)
    bus_bandwidth_Bps: float = Field(gt=0)
    source: BandwidthSource
    detail: str


class Bandwidths(BaseModel):
    """Intra-node and inter-node figures used when no calibration fit covers a collective."""

    model_config = ConfigDict(frozen=True)

    intra_node: LinkFigures
    inter_node: LinkFigures
