"""The calls one schedule rule makes in a step: which parameters, split how, padded how (pure, no torch).

A rule (:class:`~zerocalc.network.schedule.ScheduledCollective`) names its granularity (:class:`Calls`),
padding
(:class:`Padding`) and selection (:class:`Select`); this module applies them to the model's parameter
tensors (:func:`zerocalc.model.architecture.parameter_tensors`, wrapped in FSDP units by
:func:`zerocalc.states.framework.fsdp_units`) and returns each call's element count S (nccl-tests: the
all_gather output, the reduce_scatter input, the all_to_all per-rank send buffer). Each rule below cites the
source it follows.

With ``--params`` alone the tensors are unknown: the model is one flat array of Ψ elements, one unit,
split at any element into DDP and DeepSpeed buckets; bytes stay exact where they depend only on Ψ, and the
notes say which call counts and paddings need ``--model``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from functools import cached_property, lru_cache
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.errors import InputError
from zerocalc.base.units import ceil_div
from zerocalc.model.architecture import Architecture, ParamTensor, is_expert_tensor, parameter_tensors
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import Calls, Padding, Quantization, ScheduledCollective, Select
from zerocalc.parallel.zeropp import aligned_numel, qgz_groups, qgz_quantizes, qwz_blocks
from zerocalc.states.framework import (
    dim0_padded_numel,
    fsdp_unit_positions,
    sharded_dim_first,
    zero1_owners,
)

ROOT = "root"
"""The FSDP unit holding what no block holds (:func:`zerocalc.states.framework.fsdp_units`)."""
FLAT_MODEL = "model"
"""The one unit of a model known only by Ψ."""

DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed ``stage3_param_persistence_threshold`` default (``runtime/zero/config.py``): parameters of at
most this many elements are never released (``Init._convert_to_zero_parameters``: ``ds_persist``)."""
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000
"""DeepSpeed ``stage3_max_reuse_distance`` default (elements)."""

MEGATRON_PARAM_ALIGNMENT = 64
"""Megatron-LM ``pad_param_start``: a parameter's first element in its buffer at a multiple of 64."""
MEGATRON_BUCKET_ALIGNMENT = 128
"""Megatron-LM ``bucket_end_divisor``: a bucket's end at a multiple of lcm(dp, 128) (without
``pad_buckets_for_high_nccl_busbw``, off by default)."""

MAX_FLAT_CALLS = 100_000
"""The most calls one collective may be cut into when only Ψ is known (a flat array split at any element):
each is a row of the per-unit output, and a 7B model in 1-byte buckets would be billions. With ``--model``
the calls follow the tensors and are bounded by them."""

T = TypeVar("T")
Shape = tuple[int, ...]


class Layout(BaseModel):
    """The parameter tensors a schedule moves, in registration order, and their FSDP units; what is derived
    from them is computed once per layout (:meth:`cached`)."""

    model_config = ConfigDict(frozen=True)

    tensors: tuple[ParamTensor, ...]
    units: tuple[tuple[str, tuple[int, ...]], ...] = Field(
        description="each unit's tensors, as positions in tensors"
    )
    from_architecture: bool = Field(description="False: only Ψ is known (one flat tensor, one unit)")

    @classmethod
    def of(cls, params: int, architecture: Architecture | None) -> Layout:
        if architecture is None:
            flat = ParamTensor(module=FLAT_MODEL, name="parameters", shape=(params,))
            return cls(tensors=(flat,), units=((FLAT_MODEL, (0,)),), from_architecture=False)
        return _architecture_layout(architecture)

    @classmethod
    def expert_parallel_parts(cls, architecture: Architecture, expert_dim: int) -> tuple[Layout, Layout]:
        """An expert-parallel rank's tensors as its two groups move them: everything but the routed experts
        (over the dp × cp ranks, in its FSDP units), and the routed experts (over the expert-data-parallel
        ranks), each layer's a unit of its own (torchtitan ``apply_fsdp``: ``fully_shard`` of
        ``moe.experts`` on the ``dp_shard_mod_ep`` mesh), its shape with the dimension FSDP2 shards
        (``expert_dim``, :func:`~zerocalc.states.framework.expert_shard_dim`) first. Built once per
        architecture and dimension, so their derived values (:meth:`cached`) are shared too."""
        return _expert_parallel_layouts(architecture, expert_dim)

    @cached_property
    def numels(self) -> tuple[int, ...]:
        """Each tensor's elements, in registration order."""
        return tuple(t.numel for t in self.tensors)

    @cached_property
    def shapes(self) -> tuple[Shape, ...]:
        """Each tensor's shape, in registration order."""
        return tuple(t.shape for t in self.tensors)

    @cached_property
    def numel_of_shape(self) -> dict[Shape, int]:
        """The elements of a tensor of each of the layout's shapes."""
        return dict(zip(self.shapes, self.numels, strict=True))

    @cached_property
    def tensor_units(self) -> tuple[str, ...]:
        """Each tensor's unit, in registration order."""
        unit_of = {i: name for name, unit in self.units for i in unit}
        return tuple(unit_of[i] for i in range(len(self.tensors)))

    def cached(self, function: Callable[..., T], *args: Hashable) -> T:
        """``function(self, *args)``, computed once per layout and arguments: what a rule's calls derive
        from the tensors (their padded sizes, their costs)."""
        key = (function, *args)
        try:
            return self._cache[key]
        except KeyError:
            value = self._cache[key] = function(self, *args)
            return value

    @cached_property
    def _cache(self) -> dict[Hashable, Any]:
        return {}


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
    megatron_bucket_elements: int = Field(default=0, ge=0, description="0: one bucket per buffer")


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
    for t, numel in zip(layout.tensors, layout.numels, strict=True):
        order[t.module] = order.get(t.module, 0) + numel
    modules = list(order)
    released = set()
    after = 0
    for module in reversed(modules):
        if 2 * after >= DEEPSPEED_MAX_REUSE_DISTANCE:
            released.add(module)
        after += order[module]
    return released


_SELECTED_BY_N = frozenset({Select.QUANTIZABLE_GRADIENTS, Select.UNQUANTIZABLE_GRADIENTS})
"""The selections that depend on N (qgZ's divisibility by 2N); the others, and their parts, are the same at
every N."""


def _selection(select: Select, world_size: int) -> tuple[Select, int | None]:
    """``select`` with the N its tensors depend on (None: none): the key of its tensors and parts."""
    return select, world_size if select in _SELECTED_BY_N else None


def _selected(layout: Layout, select: Select, world_size: int | None) -> tuple[int, ...]:
    """The positions in ``layout.tensors`` of the tensors ``select`` picks, in registration order
    (``world_size``: :func:`_selection`'s)."""
    every = range(len(layout.tensors))
    if not layout.from_architecture:
        if select is Select.PERSISTENT:
            return ()  # unknown without --model: the flat model is taken as one large parameter
        return tuple(every)
    tensors, numels = layout.tensors, layout.numels
    persistent = [numel <= DEEPSPEED_PERSISTENCE_THRESHOLD for numel in numels]
    match select:
        case Select.ALL:
            return tuple(every)
        case Select.NON_ROOT:
            return tuple(i for i in every if layout.tensor_units[i] != ROOT)
        case Select.NON_PERSISTENT:
            return tuple(i for i in every if not persistent[i])
        case Select.PERSISTENT:
            return tuple(i for i in every if persistent[i])
        case Select.RELEASED_AFTER_FORWARD:
            released = _released_modules(layout)
            return tuple(i for i in every if not persistent[i] and tensors[i].module in released)
        case Select.QUANTIZABLE_GRADIENTS if world_size is not None:
            return tuple(i for i in every if qgz_quantizes(tensors[i].shape, world_size))
        case Select.UNQUANTIZABLE_GRADIENTS if world_size is not None:
            return tuple(i for i in every if not qgz_quantizes(tensors[i].shape, world_size))
    raise AssertionError(f"{select} needs N")


# ---------------------------------------------------------------------------------------------- padding
class _Sizing(NamedTuple):
    """How a rule sizes a call from its tensors: its padding for ``ranks`` ranks (N = ``world_size``), and
    ``shard``, how many shards the padded array is cut into, S being one (the rule's ``shard_of`` group;
    1: S is the whole array)."""

    padding: Padding
    ranks: int
    world_size: int
    shard: int


def _padding(layout: Layout, padding: Padding, ranks: int, world_size: int) -> tuple[dict[Shape, int], int]:
    """How ``padding`` pads an array of the layout's tensors for ``ranks`` ranks: the elements of a tensor of
    each shape once padded, and the multiple the array is then padded to."""
    numels = layout.numel_of_shape
    match padding:
        case Padding.NONE:
            return numels, 1
        case Padding.FLAT:  # FSDP1 FlatParamHandle (padded_unit_numel); the paper's ceil(Ψ/n)·n
            return numels, ranks
        case Padding.DIM0:  # FSDP2: each dim 0 to ranks·ceil(d0/ranks)
            return {shape: dim0_padded_numel(shape, ranks) for shape in numels}, 1
        case Padding.PER_TENSOR:  # DeepSpeed ZeRO-3 _aligned_size: each parameter to a multiple of N
            return {shape: aligned_numel(n, world_size) for shape, n in numels.items()}, 1
        case Padding.TWICE_GROUP:  # DeepSpeed ZeRO-1/2: flatten_dense_tensors_aligned(2·N)
            return numels, 2 * ranks
        case Padding.MEGATRON_BUFFER:  # Megatron-LM core/optimizer/param_layout.py
            # pad_param_start: each parameter at a multiple of 64; pad_bucket_end: lcm(dp, 128)
            aligned = {
                shape: ceil_div(n, MEGATRON_PARAM_ALIGNMENT) * MEGATRON_PARAM_ALIGNMENT
                for shape, n in numels.items()
            }
            return aligned, math.lcm(ranks, MEGATRON_BUCKET_ALIGNMENT)


# ------------------------------------------------------------------------------------------------ calls
_Part = tuple[str, tuple[int, ...] | int, int | None]
"""What one call carries: its unit, the positions of its tensors (or S itself, without the tensors) and a
broadcast's source rank."""


def _whole_parts(layout: Layout, select: Select, world_size: int | None) -> tuple[_Part, ...]:
    """One call carrying every selected parameter."""
    unit = "all parameters" if layout.from_architecture else FLAT_MODEL
    return ((unit, layout.cached(_selected, select, world_size), None),)


def _unit_parts(layout: Layout, select: Select, world_size: int | None) -> tuple[_Part, ...]:
    """One call per unit holding selected tensors, in unit order."""
    chosen = set(layout.cached(_selected, select, world_size))
    parts = ((name, tuple(i for i in unit if i in chosen)) for name, unit in layout.units)
    return tuple((name, part, None) for name, part in parts if part)


def _module_parts(layout: Layout, select: Select, world_size: int | None) -> tuple[_Part, ...]:
    """One call per module holding selected tensors, in order (each with its unit)."""
    modules: dict[str, list[int]] = {}
    for i in layout.cached(_selected, select, world_size):
        modules.setdefault(layout.tensors[i].module, []).append(i)
    return tuple((layout.tensor_units[part[0]], tuple(part), None) for part in modules.values())


def _tensor_parts(layout: Layout, select: Select, world_size: int | None) -> tuple[_Part, ...]:
    """One call per selected tensor."""
    return tuple((layout.tensor_units[i], (i,), None) for i in layout.cached(_selected, select, world_size))


def _owner_parts(layout: Layout, select: Select, world_size: int | None, ranks: int) -> tuple[_Part, ...]:
    """ZeroRedundancyOptimizer's broadcasts: one call per parameter, from the rank that owns it."""
    selected = layout.cached(_selected, select, world_size)
    if not layout.from_architecture:
        total = layout.numels[selected[0]]
        if min(ranks, total) > MAX_FLAT_CALLS:
            raise InputError(
                f"{{gpus}} {ranks:,}: ZeroRedundancyOptimizer broadcasts a model known only by {{params}} in "
                f"one call per rank, {min(ranks, total):,} calls; accepted: {{gpus}} up to "
                f"{MAX_FLAT_CALLS:,}, or {{model}} NAME or config.json (one call per parameter)"
            )
        shares = ((r, total // ranks + (r < total % ranks)) for r in range(ranks))
        return tuple((f"rank {r}", share, r) for r, share in shares if share)
    owned = zero1_owners([layout.numels[i] for i in selected], ranks)
    return tuple((f"rank {r}", (selected[i],), r) for r, part in enumerate(owned) for i in part)


def _ddp_parts(
    layout: Layout,
    select: Select,
    world_size: int | None,
    element_bytes: int,
    first_bytes: int,
    bucket_bytes: int,
) -> tuple[_Part, ...]:
    """DDP's rebuilt buckets, in reduction order.

    ``reducer.cpp`` ``Reducer::rebuild_buckets`` → ``compute_bucket_assignment_by_size`` with limits
    ``[first_bucket_bytes_cap, bucket_bytes_cap]``: tensors in gradient-ready order (reverse registration
    order), a bucket closed as soon as its bytes reach its limit (the first bucket's limit, then the
    other). ``_BucketCapacityConfig.create``: the first limit is ``_DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB)
    only when ``bucket_cap_mb`` is left at its default. (The first iteration runs one bucket of every
    parameter; this is every later one.) Without the tensors, the array is cut at the limits.
    """
    selected = layout.cached(_selected, select, world_size)
    b = element_bytes
    limits = [first_bytes, bucket_bytes]
    numels = layout.numels
    buckets: list[tuple[int, ...] | int] = []
    if not layout.from_architecture:
        left = sum(numels[i] for i in selected)
        first, rest = (max(1, ceil_div(limit, b)) for limit in limits)
        count = 1 if left <= first else 1 + ceil_div(left - first, rest)
        if count > MAX_FLAT_CALLS:
            smallest = ceil_div(left, MAX_FLAT_CALLS) * b
            raise InputError(
                f"{{ddp_bucket}} {bucket_bytes:,} bytes cuts a model known only by {{params}} ({left:,} "
                f"elements of {b} bytes) into {count:,} buckets; accepted: {{ddp_bucket}} from {smallest}B "
                f"(at most {MAX_FLAT_CALLS:,} buckets), or {{model}} NAME or config.json (buckets of "
                "its tensors)"
            )
        while left > 0:
            size = min(max(1, ceil_div(limits[min(len(buckets), 1)], b)), left)
            buckets.append(size)
            left -= size
        return _buckets(buckets)
    current: list[int] = []
    size = 0
    for i in reversed(selected):
        current.append(i)
        size += numels[i] * b
        if size >= limits[min(len(buckets), 1)]:
            buckets.append(tuple(current))
            current, size = [], 0
    if current:
        buckets.append(tuple(current))
    return _buckets(buckets)


def _deepspeed_parts(
    layout: Layout, select: Select, world_size: int | None, bucket: int
) -> tuple[_Part, ...]:
    """DeepSpeed's reduce (IPG) buckets, in reduction order: gradients in ready order (reverse registration),
    the bucket reduced before a gradient that would take it past ``reduce_bucket_size`` elements
    (``stage_1_and_2.py`` / ``stage3.py`` ``reduce_independent_p_g_buckets_and_remove_grads``); 0 reduces
    every gradient on its own. Without the tensors, the array is cut every ``reduce_bucket_size``."""
    selected = layout.cached(_selected, select, world_size)
    numels = layout.numels
    if not layout.from_architecture:
        left = sum(numels[i] for i in selected)
        cap = bucket or left
        if ceil_div(left, cap) > MAX_FLAT_CALLS:
            raise InputError(
                f"{{reduce_bucket}} {bucket:,} elements cuts a model known only by {{params}} ({left:,} "
                f"elements) into {ceil_div(left, cap):,} buckets; accepted: {{reduce_bucket}} from "
                f"{ceil_div(left, MAX_FLAT_CALLS):,} elements (at most {MAX_FLAT_CALLS:,} buckets), 0 (one "
                "bucket), or {model} NAME or config.json (buckets of its tensors)"
            )
        return _buckets([min(cap, left - start) for start in range(0, left, cap)])
    buckets: list[tuple[int, ...] | int] = []
    current: list[int] = []
    elements = 0
    for i in reversed(selected):
        if current and elements + numels[i] > bucket:
            buckets.append(tuple(current))
            current, elements = [], 0
        current.append(i)
        elements += numels[i]
    if current:
        buckets.append(tuple(current))
    return _buckets(buckets)


def _buckets(buckets: list[tuple[int, ...] | int]) -> tuple[_Part, ...]:
    return tuple((f"bucket {i}", bucket, None) for i, bucket in enumerate(buckets, start=1))


class _Carried(NamedTuple):
    """What a rule's calls carry, in order, before sizing: each call's unit and broadcast root, and which of
    the distinct parts it carries (parts of the same shapes pad alike: a model's blocks)."""

    units: tuple[str, ...]
    roots: tuple[int | None, ...]
    kinds: tuple[int, ...]
    """Each call's position in ``parts``."""
    parts: tuple[tuple[Shape, ...] | int, ...]
    """Each distinct part: its tensors' shapes, or S itself (without the tensors)."""
    calls: tuple[int, ...]
    """How many calls carry each part."""


def _carried(layout: Layout, parts: Callable[..., tuple[_Part, ...]], args: tuple[Hashable, ...]) -> _Carried:
    """``parts(layout, *args)``, each part as its tensors' shapes."""
    split = layout.cached(parts, *args)
    shapes = layout.shapes
    distinct: dict[tuple[Shape, ...] | int, int] = {}
    kinds = tuple(
        distinct.setdefault(
            part if isinstance(part, int) else tuple(map(shapes.__getitem__, part)), len(distinct)
        )
        for _, part, _ in split
    )
    calls = Counter(kinds)
    units, _, roots = zip(*split, strict=True)
    return _Carried(units, roots, kinds, tuple(distinct), tuple(calls[kind] for kind in range(len(distinct))))


class RuleCalls(NamedTuple):
    """Calls in order, call i carrying ``carried.units[i]`` (from rank ``carried.roots[i]``) with S =
    ``sizes[carried.kinds[i]]`` elements: a model's thousands of calls have a few sizes."""

    carried: _Carried
    sizes: tuple[int, ...]
    """S of the calls carrying each distinct part."""

    @property
    def count(self) -> int:
        return len(self.carried.kinds)

    def each(self) -> tuple[Call, ...]:
        """Every call, in order."""
        sizes, carried = self.sizes, self.carried
        return tuple(
            Call(unit, sizes[kind], root)
            for unit, kind, root in zip(carried.units, carried.kinds, carried.roots, strict=True)
        )

    def by_size(self) -> Iterator[tuple[int, int]]:
        """(S, how many calls) of each distinct part."""
        return zip(self.sizes, self.carried.calls, strict=True)

    def resized(self, size: Callable[[int], int]) -> RuleCalls:
        """The same calls, each with S = ``size(S)``."""
        return self._replace(sizes=tuple(map(size, self.sizes)))


def _sized_calls(
    layout: Layout, parts: Callable[..., tuple[_Part, ...]], args: tuple[Hashable, ...], sizing: _Sizing
) -> RuleCalls:
    """The calls carrying ``parts(layout, *args)``: S the padded array of each part's tensors, or one
    rank's shard of it."""
    carried = layout.cached(_carried, parts, args)
    padded, multiple = _padding(layout, sizing.padding, sizing.ranks, sizing.world_size)

    def size(part: tuple[Shape, ...] | int) -> int:
        if isinstance(part, int):
            return part
        return ceil_div(sum(map(padded.__getitem__, part)), multiple) * multiple // sizing.shard

    return RuleCalls(carried, tuple(map(size, carried.parts)))


def _split(rule: ScheduledCollective, layout: Layout, ctx: CallContext) -> RuleCalls | None:
    """The calls of ``rule`` in ``ctx``, before quantization (once per layout, split and sizing); None when
    it selects no tensor."""
    selection = _selection(rule.select, ctx.world_size)
    if not layout.cached(_selected, *selection):
        return None
    sharded = rule.shard_of is not None
    ranks = ctx.shard_size if sharded else ctx.group_size
    sizing = _Sizing(rule.padding, ranks, ctx.world_size, ranks if sharded else 1)
    extra: tuple[int, ...] = ()
    match rule.calls:
        case Calls.WHOLE:
            parts = _whole_parts
        case Calls.UNIT:
            parts = _unit_parts
        case Calls.MODULE:
            parts = _module_parts
        case Calls.PARAMETER if rule.op is Collective.BROADCAST:
            parts, extra = _owner_parts, (ctx.group_size,)
        case Calls.PARAMETER:
            parts = _tensor_parts
        case Calls.DDP_BUCKET:
            parts, extra = _ddp_parts, (ctx.element_bytes, ctx.ddp_first_bucket_bytes, ctx.ddp_bucket_bytes)
        case Calls.DEEPSPEED_BUCKET:
            parts, extra = _deepspeed_parts, (ctx.deepspeed_bucket_elements,)
        case Calls.MEGATRON_BUCKET if ctx.megatron_bucket_elements:
            # Megatron-LM param_and_grad_buffer.py _compute_default_per_buffer_param_layout (and
            # param_layout.py for the distributed optimizer): parameters in reverse order, a bucket closed
            # once its elements reach bucket_size: DDP's rule with one-byte elements and one limit
            bucket = ctx.megatron_bucket_elements
            parts, extra = _ddp_parts, (1, bucket, bucket)
        case Calls.MEGATRON_BUCKET:
            parts = _whole_parts
    return layout.cached(_sized_calls, parts, (*selection, *extra), sizing)


def rule_calls(
    rule: ScheduledCollective, layout: Layout, ctx: CallContext, quantized: bool = False
) -> tuple[RuleCalls, RuleCalls | None] | None:
    """The calls ``rule`` makes each time it runs: (data calls, scale calls); None when it makes none. Scale
    calls exist only for a rule running quantized (ZeRO++), as their own collectives after the data's.

    Data of a quantized call: int8 elements (qwZ: one per value; qgZ: two int4 values per int8). Scales:
    qwZ, one fp32 per block of the rank's partition, all-gathered (``_all_gather_coalesced``); qgZ, the
    ``max(rows, cols, N)`` groups of each gradient, and 1/g of them on the second hop.
    """
    calls = _split(rule, layout, ctx)
    if calls is None:
        return None
    if not quantized or rule.quantization is Quantization.NONE:
        return calls, None
    group = ctx.group_size
    if rule.quantization is Quantization.INT8_BLOCKS:
        return calls, calls.resized(lambda elements: qwz_blocks(elements // group) * group)
    # INT4: one call per quantizable gradient (Calls.PARAMETER): each part is one tensor
    groups = (qgz_groups(shape, ctx.world_size) for (shape,) in calls.carried.parts)
    scales = calls._replace(sizes=tuple(g // ctx.shard_size for g in groups))
    return calls.resized(lambda elements: ceil_div(elements, 2)), scales


@lru_cache(maxsize=256)
def _architecture_layout(architecture: Architecture) -> Layout:
    """:meth:`Layout.of` a model's architecture, once per architecture: its derived values
    (:meth:`Layout.cached`) are then shared by every request of that model (a plan's candidates)."""
    tensors = parameter_tensors(architecture)
    units = tuple((name, tuple(unit)) for name, unit in fsdp_unit_positions(tensors))
    return Layout(tensors=tuple(tensors), units=units, from_architecture=True)


@lru_cache(maxsize=256)
def _expert_parallel_layouts(architecture: Architecture, expert_dim: int) -> tuple[Layout, Layout]:
    """:meth:`Layout.expert_parallel_parts`, once per architecture and expert dimension."""
    tensors = parameter_tensors(architecture)
    rest = [t for t in tensors if not is_expert_tensor(t)]
    experts = [
        ParamTensor(module=t.module, name=t.name, shape=sharded_dim_first(t.shape, expert_dim))
        for t in tensors
        if is_expert_tensor(t)
    ]
    units: dict[str, list[int]] = {}
    for i, t in enumerate(experts):
        units.setdefault(t.module, []).append(i)
    rest_units = tuple((name, tuple(unit)) for name, unit in fsdp_unit_positions(rest))
    return (
        Layout(tensors=tuple(rest), units=rest_units, from_architecture=True),
        Layout(
            tensors=tuple(experts),
            units=tuple((name, tuple(unit)) for name, unit in units.items()),
            from_architecture=True,
        ),
    )
