"""The calls one schedule rule makes in a step: which parameters, split how, padded how (pure, no torch).

A rule (:class:`~zerocalc.schedule.ScheduledCollective`) names its granularity (:class:`Calls`), padding
(:class:`Padding`) and selection (:class:`Select`); this module applies them to the model's parameter
tensors (:func:`zerocalc.architecture.parameter_tensors`, wrapped in FSDP units by
:func:`zerocalc.framework_states.fsdp_units`) and returns each call's element count S (nccl-tests: the
all_gather output, the reduce_scatter input, the all_to_all per-rank send buffer). Each rule below cites the
source it follows.

With ``--params`` alone the tensors are unknown: the model is one flat array of Ψ elements, one unit,
split at any element into DDP and DeepSpeed buckets; bytes stay exact where they depend only on Ψ, and the
notes say which call counts and paddings need ``--model``.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.architecture import Architecture, ParamTensor, parameter_tensors
from zerocalc.collectives import Collective
from zerocalc.framework_states import fsdp_units, padded_unit_numel, zero1_partition
from zerocalc.frameworks import TorchWrapper
from zerocalc.schedule import Calls, Padding, Quantization, ScheduledCollective, Select
from zerocalc.units import ceil_div
from zerocalc.zeropp import qgz_groups, qgz_quantizes, qwz_blocks

ROOT = "root"
"""The FSDP unit holding what no block holds (:func:`zerocalc.framework_states.fsdp_units`)."""
FLAT_MODEL = "model"
"""The one unit of a model known only by Ψ."""

DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed ``stage3_param_persistence_threshold`` default (``runtime/zero/config.py``): parameters of at
most this many elements are never released (``Init._convert_to_zero_parameters``: ``ds_persist``)."""
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000
"""DeepSpeed ``stage3_max_reuse_distance`` default (elements)."""


class Layout(BaseModel):
    """The parameter tensors a schedule moves, in registration order, and their FSDP units."""

    model_config = ConfigDict(frozen=True)

    tensors: tuple[ParamTensor, ...]
    units: tuple[tuple[str, tuple[ParamTensor, ...]], ...]
    unit_by_tensor: dict[str, str]
    from_architecture: bool = Field(description="False: only Ψ is known (one flat tensor, one unit)")

    @classmethod
    def of(cls, params: int, architecture: Architecture | None) -> Layout:
        if architecture is None:
            flat = (ParamTensor(module=FLAT_MODEL, name="parameters", shape=(params,)),)
            units: tuple[tuple[str, tuple[ParamTensor, ...]], ...] = ((FLAT_MODEL, flat),)
            tensors = flat
        else:
            units = tuple((name, tuple(unit)) for name, unit in fsdp_units(architecture))
            tensors = tuple(parameter_tensors(architecture))
        return cls(
            tensors=tensors,
            units=units,
            unit_by_tensor={_key(t): name for name, unit in units for t in unit},
            from_architecture=architecture is not None,
        )

    def unit_of(self, tensor: ParamTensor) -> str:
        return self.unit_by_tensor[_key(tensor)]


def _key(tensor: ParamTensor) -> str:
    return f"{tensor.module}.{tensor.name}"


class CallContext(BaseModel):
    """What sizes a rule's calls besides the tensors: its groups, dtype and the frameworks' buckets."""

    model_config = ConfigDict(frozen=True)

    world_size: int = Field(ge=1, description="N: DeepSpeed pads each parameter to a multiple of it")
    group_size: int = Field(ge=1, description="ranks of the rule's process group")
    shard_size: int = Field(ge=1, description="ranks of the rule's shard_of group (1: none)")
    element_bytes: int = Field(ge=1, description="bytes per element of the rule's dtype")
    ddp_bucket_bytes: int = Field(ge=0)
    ddp_first_bucket_bytes: int = Field(ge=0)
    deepspeed_bucket_elements: int = Field(ge=0)


class Call(NamedTuple):
    """One call: what it moves (for per-unit tables), S in elements, and a broadcast's source rank."""

    unit: str
    elements: int
    root: int | None = None


# -------------------------------------------------------------------------------------------- selection
def _released_modules(layout: Layout) -> set[str]:
    """DeepSpeed ZeRO-3 modules whose parameters are released after their forward.

    ``partitioned_param_coordinator.py`` ``__params_to_release``: after a module's forward, a parameter
    is kept if it reappears in the trace before ``max_reuse_distance`` elements have been traversed. The
    trace runs the modules forward, then backward in reverse, so between a module's forward and its
    backward come the modules after it, twice: it is released when twice their parameters reach the
    distance.
    """
    order: dict[str, int] = {}
    for t in layout.tensors:
        order[t.module] = order.get(t.module, 0) + t.numel
    modules = list(order)
    released = set()
    after = 0
    for module in reversed(modules):
        if 2 * after >= DEEPSPEED_MAX_REUSE_DISTANCE:
            released.add(module)
        after += order[module]
    return released


def _selected(rule: ScheduledCollective, layout: Layout, world_size: int) -> list[ParamTensor]:
    tensors = list(layout.tensors)
    if not layout.from_architecture:
        if rule.select is Select.PERSISTENT:
            return []  # unknown without --model: the flat model is taken as one large parameter
        return tensors
    persistent = {_key(t) for t in tensors if t.numel <= DEEPSPEED_PERSISTENCE_THRESHOLD}
    match rule.select:
        case Select.ALL:
            return tensors
        case Select.NON_ROOT:
            return [t for t in tensors if layout.unit_of(t) != ROOT]
        case Select.NON_PERSISTENT:
            return [t for t in tensors if _key(t) not in persistent]
        case Select.PERSISTENT:
            return [t for t in tensors if _key(t) in persistent]
        case Select.RELEASED_AFTER_FORWARD:
            released = _released_modules(layout)
            return [t for t in tensors if _key(t) not in persistent and t.module in released]
        case Select.QUANTIZABLE_GRADIENTS:
            return [t for t in tensors if qgz_quantizes(t.shape, world_size)]
        case Select.UNQUANTIZABLE_GRADIENTS:
            return [t for t in tensors if not qgz_quantizes(t.shape, world_size)]


# ---------------------------------------------------------------------------------------------- padding
def _padded(tensors: list[ParamTensor], padding: Padding, ranks: int, world_size: int) -> int:
    """Elements of the array ``tensors`` make once padded for ``ranks`` ranks."""
    numel = sum(t.numel for t in tensors)
    match padding:
        case Padding.NONE:
            return numel
        case Padding.FLAT:  # FSDP1 FlatParamHandle; the paper's ceil(Ψ/n)·n
            return padded_unit_numel(tensors, ranks, TorchWrapper.FSDP1)
        case Padding.DIM0:  # FSDP2: each dim 0 to ranks·ceil(d0/ranks)
            return padded_unit_numel(tensors, ranks, TorchWrapper.FSDP2)
        case Padding.PER_TENSOR:  # DeepSpeed ZeRO-3 _aligned_size: each parameter to a multiple of N
            return sum(ceil_div(t.numel, world_size) * world_size for t in tensors)
        case Padding.TWICE_GROUP:  # DeepSpeed ZeRO-1/2: flatten_dense_tensors_aligned(2·N)
            return ceil_div(numel, 2 * ranks) * 2 * ranks


def _elements(rule: ScheduledCollective, tensors: list[ParamTensor], ctx: CallContext) -> int:
    """S of one call: the padded array, or one rank's shard of it (``shard_of``)."""
    if rule.shard_of is not None:
        return _padded(tensors, rule.padding, ctx.shard_size, ctx.world_size) // ctx.shard_size
    return _padded(tensors, rule.padding, ctx.group_size, ctx.world_size)


# ------------------------------------------------------------------------------------------------ calls
def _ddp_buckets(tensors: list[ParamTensor], ctx: CallContext, exact: bool) -> list[list[ParamTensor] | int]:
    """DDP's rebuilt buckets, in reduction order.

    ``reducer.cpp`` ``Reducer::rebuild_buckets`` → ``compute_bucket_assignment_by_size`` with limits
    ``[first_bucket_bytes_cap, bucket_bytes_cap]``: tensors in gradient-ready order (reverse registration
    order), a bucket closed as soon as its bytes reach its limit (the first bucket's limit, then the
    other). ``_BucketCapacityConfig.create``: the first limit is ``_DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB)
    only when ``bucket_cap_mb`` is left at its default. (The first iteration runs one bucket of every
    parameter; this is every later one.) Without the tensors, the array is cut at the limits.
    """
    b = ctx.element_bytes
    limits = [ctx.ddp_first_bucket_bytes, ctx.ddp_bucket_bytes]
    if not exact:
        left = sum(t.numel for t in tensors)
        sizes: list[list[ParamTensor] | int] = []
        while left > 0:
            cap = max(1, ceil_div(limits[min(len(sizes), 1)], b))
            sizes.append(min(cap, left))
            left -= sizes[-1]
        return sizes
    buckets: list[list[ParamTensor] | int] = []
    current: list[ParamTensor] = []
    size = 0
    for t in reversed(tensors):
        current.append(t)
        size += t.numel * b
        if size >= limits[min(len(buckets), 1)]:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def _deepspeed_buckets(tensors: list[ParamTensor], bucket: int, exact: bool) -> list[list[ParamTensor] | int]:
    """DeepSpeed's reduce (IPG) buckets, in reduction order: gradients in ready order (reverse registration),
    the bucket reduced before a gradient that would take it past ``reduce_bucket_size`` elements
    (``stage_1_and_2.py`` / ``stage3.py`` ``reduce_independent_p_g_buckets_and_remove_grads``); 0 reduces
    every gradient on its own. Without the tensors, the array is cut every ``reduce_bucket_size``."""
    if not exact:
        left = sum(t.numel for t in tensors)
        cap = bucket or left
        return [min(cap, left - start) for start in range(0, left, cap)]
    buckets: list[list[ParamTensor] | int] = []
    current: list[ParamTensor] = []
    elements = 0
    for t in reversed(tensors):
        if current and elements + t.numel > bucket:
            buckets.append(current)
            current, elements = [], 0
        current.append(t)
        elements += t.numel
    if current:
        buckets.append(current)
    return buckets


def _by_module(tensors: list[ParamTensor]) -> list[list[ParamTensor]]:
    modules: dict[str, list[ParamTensor]] = {}
    for t in tensors:
        modules.setdefault(t.module, []).append(t)
    return list(modules.values())


def _split(
    rule: ScheduledCollective, tensors: list[ParamTensor], layout: Layout, ctx: CallContext
) -> list[Call]:
    exact = layout.from_architecture
    if not tensors:
        return []

    def call(unit: str, part: list[ParamTensor], root: int | None = None) -> Call:
        return Call(unit=unit, elements=_elements(rule, part, ctx), root=root)

    match rule.calls:
        case Calls.WHOLE:
            return [call("all parameters" if exact else FLAT_MODEL, tensors)]
        case Calls.UNIT:
            chosen = {_key(t) for t in tensors}
            parts = [(name, [t for t in unit if _key(t) in chosen]) for name, unit in layout.units]
            return [call(name, part) for name, part in parts if part]
        case Calls.MODULE:
            return [call(layout.unit_of(part[0]), part) for part in _by_module(tensors)]
        case Calls.PARAMETER:
            if rule.op is Collective.BROADCAST:  # ZeroRedundancyOptimizer: from the rank that owns it
                if not exact:
                    total, n = tensors[0].numel, ctx.group_size
                    return [
                        Call(unit=f"rank {r}", elements=total // n + (r < total % n), root=r)
                        for r in range(n)
                        if total // n + (r < total % n)
                    ]
                owned = zero1_partition(tensors, ctx.group_size)
                return [call(f"rank {r}", [t], r) for r, part in enumerate(owned) for t in part]
            return [call(layout.unit_of(t), [t]) for t in tensors]
        case Calls.DDP_BUCKET | Calls.DEEPSPEED_BUCKET:
            buckets = (
                _ddp_buckets(tensors, ctx, exact)
                if rule.calls is Calls.DDP_BUCKET
                else _deepspeed_buckets(tensors, ctx.deepspeed_bucket_elements, exact)
            )
            calls = []
            for i, bucket in enumerate(buckets, start=1):
                if isinstance(bucket, int):
                    calls.append(Call(unit=f"bucket {i}", elements=bucket))
                else:
                    calls.append(call(f"bucket {i}", bucket))
            return calls


def rule_calls(
    rule: ScheduledCollective, layout: Layout, ctx: CallContext, quantized: bool = False
) -> tuple[list[Call], list[Call]]:
    """The calls ``rule`` makes each time it runs: (data calls, scale calls). Scale calls exist only for a
    rule running quantized (ZeRO++), as their own collectives after the data's.

    Data of a quantized call: int8 elements (qwZ: one per value; qgZ: two int4 values per int8). Scales:
    qwZ, one fp32 per block of the rank's partition, all-gathered (``_all_gather_coalesced``); qgZ, the
    ``max(rows, cols, N)`` groups of each gradient, and 1/g of them on the second hop.
    """
    tensors = _selected(rule, layout, ctx.world_size)
    calls = _split(rule, tensors, layout, ctx)
    if not quantized or rule.quantization is Quantization.NONE:
        return calls, []
    if rule.quantization is Quantization.INT8_BLOCKS:
        scales = [
            Call(unit=c.unit, elements=qwz_blocks(c.elements // ctx.group_size) * ctx.group_size)
            for c in calls
        ]
        return calls, scales
    # INT4: one call per quantizable gradient (Calls.PARAMETER), in the selection's order
    data, scales = [], []
    for tensor, c in zip(tensors, calls, strict=True):
        groups = qgz_groups(tensor.shape, ctx.world_size)
        data.append(c._replace(elements=ceil_div(c.elements, 2)))
        scales.append(Call(unit=c.unit, elements=groups // ctx.shard_size))
    return data, scales
