"""Communication buffers an accounting keeps resident through the step, one function per buffer rule.

* ZeRO-1/2: DeepSpeed's reduction and all-gather buckets (``reduce_bucket_size``/``allgather_bucket_size``,
  DeepSpeed config docs), with the reduction bucket's copy in ``communication_data_type`` when gradients
  are reduced in a wider dtype;
* DDP: one gradient bucket in flight (``bucket_cap_mb``, PyTorch DDP docs).

Gathered units and one unit's unsharded gradients (ZeRO-3, FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD) are not
resident: the step timeline allocates and frees them unit by unit (:class:`~zerocalc.peak.mechanics.
Accounting`), so those rules keep nothing here. PyTorch's own frameworks model their buffers tensor by
tensor (:mod:`zerocalc.peak.mechanics`).
"""

from __future__ import annotations

from collections.abc import Callable

from zerocalc.parallel.strategies import BufferRule
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.report import StateLine
from zerocalc.request.training import TrainingRequest


def casts_for_reduction(b_g: int, b_r: int | None) -> bool:
    """Whether gradients are cast to a wider reduce dtype first, so both copies are alive at once."""
    return b_r is not None and b_r != b_g


BufferFunction = Callable[[TrainingRequest, int, int, int], list[StateLine]]
"""(request, Ψ, bytes per parameter element, bytes per gradient element) → the resident buffers."""


def _ddp_bucket(request: TrainingRequest, psi: int, b_p: int, b_g: int) -> list[StateLine]:
    return [
        StateLine(
            kind=TensorKind.BUFFERS,
            name="DDP gradient bucket",
            bytes=min(request.buffers.ddp_bucket_bytes, psi * b_g),
            source=f"PyTorch DDP bucket_cap_mb={request.buffers.ddp_bucket_bytes / 2**20:g} (one bucket in "
            "flight)",
        )
    ]


def _deepspeed_buckets(request: TrainingRequest, psi: int, b_p: int, b_g: int) -> list[StateLine]:
    b_r = request.reduce_dtype.bytes if request.reduce_dtype is not None else None
    cast = casts_for_reduction(b_g, b_r)
    return [
        StateLine(
            kind=TensorKind.BUFFERS,
            name="reduce bucket",
            bytes=min(request.buffers.reduce_bucket_elements, psi) * (b_g + (b_r or 0) if cast else b_g),
            source=f"DeepSpeed reduce_bucket_size={request.buffers.reduce_bucket_elements:,} elements"
            + ("; with its copy cast to communication_data_type" if cast else ""),
        ),
        StateLine(
            kind=TensorKind.BUFFERS,
            name="all-gather bucket",
            bytes=min(request.buffers.allgather_bucket_elements, psi) * b_p,
            source=f"DeepSpeed allgather_bucket_size={request.buffers.allgather_bucket_elements:,} elements",
        ),
    ]


def _in_timeline(request: TrainingRequest, psi: int, b_p: int, b_g: int) -> list[StateLine]:
    return []


STRATEGY_BUFFERS: dict[BufferRule, BufferFunction] = {
    BufferRule.DDP_BUCKET: _ddp_bucket,
    BufferRule.DEEPSPEED_BUCKETS: _deepspeed_buckets,
    BufferRule.UNIT_GRADIENTS: _in_timeline,
    BufferRule.GATHERED_UNITS: _in_timeline,
}
"""The resident buffers of each strategy's rule, for the accountings."""
