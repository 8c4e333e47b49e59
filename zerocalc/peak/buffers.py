"""Communication buffers and gathered parameters at the peak, one function per buffer rule.

* ZeRO-3 / FULL_SHARD / HYBRID_SHARD gather parameters unit by unit (FSDP docs, "FSDP Notes"): the current
  block and ``prefetch`` more, the root unit (embeddings, final norm, LM head), which FSDP keeps unsharded
  between forward and backward, and one unit's unsharded gradients before their reduce-scatter;
* SHARD_GRAD_OP keeps parameters gathered (counted in its states) and adds one unit's gradients;
* ZeRO-1/2: DeepSpeed's reduction and all-gather buckets (``reduce_bucket_size``/``allgather_bucket_size``);
* DDP: one gradient bucket in flight (``bucket_cap_mb``).

With a wider reduce dtype (``--reduce-dtype fp32``: FSDP ``MixedPrecision(reduce_dtype)``, DeepSpeed
``communication_data_type``) the gradients being reduced exist in both dtypes at once.
"""

from __future__ import annotations

from collections.abc import Callable

from zerocalc.architecture import ParameterCount
from zerocalc.peak.profiles import Wrap
from zerocalc.peak.report import LineKind, PeakLine
from zerocalc.request import TrainingRequest
from zerocalc.strategies import BufferRule


def casts_for_reduction(b_g: int, b_r: int | None) -> bool:
    """Whether gradients are cast to a wider reduce dtype first, so both copies are alive at once."""
    return b_r is not None and b_r != b_g


def unit_gradients(numel: int, b_g: int, source: str, b_r: int | None = None) -> PeakLine:
    """One unit's unsharded gradients; with a wider reduce dtype also their copy cast for the reduction."""
    if not casts_for_reduction(b_g, b_r):
        return PeakLine(
            kind=LineKind.BUFFERS,
            name="unsharded gradients of one unit",
            bytes=numel * b_g,
            source=f"{source}: a unit's full gradients exist until they are reduced",
        )
    assert b_r is not None
    return PeakLine(
        kind=LineKind.BUFFERS,
        name="unsharded gradients of one unit + their copy in the reduce dtype",
        bytes=numel * (b_g + b_r),
        source=f"{source}: gradients are cast to the reduce dtype before the reduce-scatter",
    )


def units_in_flight(
    block: int,
    root: int,
    b_p: int,
    b_g: int,
    prefetch: int,
    source: str = "FSDP/ZeRO-3",
    copies: str = "gathered",
    b_r: int | None = None,
) -> list[PeakLine]:
    """The current block and ``prefetch`` more, the root unit, and one unit's unsharded gradients.
    ``block`` and ``root`` are elements as gathered (padding included where the framework pads)."""
    return [
        PeakLine(
            kind=LineKind.BUFFERS,
            name=f"{copies} blocks (current + {prefetch} prefetched)",
            bytes=(1 + prefetch) * block * b_p,
            source=f"{source}: a unit is unsharded before use (forward/backward prefetch)",
        ),
        PeakLine(
            kind=LineKind.BUFFERS,
            name=f"{copies} root unit (embeddings, final norm, LM head)",
            bytes=root * b_p,
            source=f"{source}: the root unit is not resharded between forward and backward",
        ),
        unit_gradients(max(block, root), b_g, source, b_r),
    ]


BufferFunction = Callable[[TrainingRequest, ParameterCount, int, int], list[PeakLine]]


def _ddp_bucket(request: TrainingRequest, count: ParameterCount, b_p: int, b_g: int) -> list[PeakLine]:
    return [
        PeakLine(
            kind=LineKind.BUFFERS,
            name="DDP gradient bucket",
            bytes=min(request.buffers.ddp_bucket_bytes, count.total * b_g),
            source="PyTorch DDP bucket_cap_mb=25 (one bucket in flight)",
        )
    ]


def _deepspeed_buckets(request: TrainingRequest, count: ParameterCount, b_p: int, b_g: int) -> list[PeakLine]:
    b_r = request.reduce_dtype.bytes if request.reduce_dtype is not None else None
    cast = casts_for_reduction(b_g, b_r)
    psi = count.total
    return [
        PeakLine(
            kind=LineKind.BUFFERS,
            name="reduce bucket",
            bytes=min(request.buffers.reduce_bucket_elements, psi) * (b_g + (b_r or 0) if cast else b_g),
            source="DeepSpeed reduce_bucket_size (default 5e8 elements)"
            + ("; with its copy cast to communication_data_type" if cast else ""),
        ),
        PeakLine(
            kind=LineKind.BUFFERS,
            name="all-gather bucket",
            bytes=min(request.buffers.allgather_bucket_elements, psi) * b_p,
            source="DeepSpeed allgather_bucket_size (default 5e8 elements)",
        ),
    ]


def _unit_gradients(request: TrainingRequest, count: ParameterCount, b_p: int, b_g: int) -> list[PeakLine]:
    b_r = request.reduce_dtype.bytes if request.reduce_dtype is not None else None
    unit = count.total if request.buffers.wrap is Wrap.MODEL else count.largest_block_params
    return [unit_gradients(unit, b_g, "FSDP", b_r)]


def _gathered_units(request: TrainingRequest, count: ParameterCount, b_p: int, b_g: int) -> list[PeakLine]:
    psi = count.total
    if request.buffers.wrap is Wrap.MODEL:
        return [
            PeakLine(
                kind=LineKind.BUFFERS,
                name="whole model gathered (--wrap model)",
                bytes=psi * b_p + psi * b_g,
                source="one unit = the model: all parameters and gradients unsharded at once, "
                "so ZeRO-3 saves nothing at the peak",
            )
        ]
    b_r = request.reduce_dtype.bytes if request.reduce_dtype is not None else None
    root = count.embedding + count.head
    return units_in_flight(count.largest_block_params, root, b_p, b_g, request.buffers.prefetch, b_r=b_r)


STRATEGY_BUFFERS: dict[BufferRule, BufferFunction] = {
    BufferRule.DDP_BUCKET: _ddp_bucket,
    BufferRule.DEEPSPEED_BUCKETS: _deepspeed_buckets,
    BufferRule.UNIT_GRADIENTS: _unit_gradients,
    BufferRule.GATHERED_UNITS: _gathered_units,
}
"""The buffers of each strategy's rule, for the accountings that do not model their own."""
