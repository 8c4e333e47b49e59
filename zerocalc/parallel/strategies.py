"""Data-parallel strategies: one record per strategy, read by memory, comm, peak and validate.

A :class:`Strategy` says everything zerocalc knows about one strategy, once:

* what is sharded over which ranks: not at all (replicated), over all N data-parallel ranks, or over the
  g ranks of one node (HYBRID_SHARD) — the ZeRO paper's rules (Rajbhandari et al. 2020, §5.1, "P_os",
  "P_os+g", "P_os+g+p") and PyTorch FSDP's ``ShardingStrategy`` (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD,
  HYBRID_SHARD);
* where it can offload (DeepSpeed's ``offload_optimizer``/``offload_param``, ZeRO-Offload/ZeRO-Infinity);
* its collective schedule per step by the ZeRO paper's accounting (§7), in the vocabulary of
  :mod:`zerocalc.network.schedule` (split into calls by :mod:`zerocalc.comm.calls`, costed by
  :mod:`zerocalc.comm.estimate`);
* its communication buffers at the peak (:class:`BufferRule`; sized by :mod:`zerocalc.peak.buffers`).

How each framework runs a strategy (:class:`FrameworkSetup`: the collectives it really issues, whether it
fixes when gradients are reduced, its PyTorch set-up) is in that framework's record
(:mod:`zerocalc.parallel.framework_records`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple, TypeVar

from zerocalc.base.errors import InputError, shown
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import (
    GradSync,
    Padding,
    Phase,
    Repeat,
    ScheduledCollective,
    Tensor,
)
from zerocalc.parallel.frameworks import TorchSetup


class StrategyName(StrEnum):
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    SHARD_GRAD_OP = "shard_grad_op"
    ZERO3 = "zero3"
    HYBRID_SHARD = "hybrid_shard"


class OffloadTarget(StrEnum):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class BufferRule(StrEnum):
    """Which communication buffers a strategy holds at the peak (sized in :mod:`zerocalc.peak.buffers`)."""

    DDP_BUCKET = "ddp_bucket"
    """PyTorch DDP: one gradient bucket in flight (``bucket_cap_mb``)."""
    DEEPSPEED_BUCKETS = "deepspeed_buckets"
    """DeepSpeed ZeRO-1/2: ``reduce_bucket_size`` and ``allgather_bucket_size``."""
    UNIT_GRADIENTS = "unit_gradients"
    """Parameters stay gathered (already counted in the states): one unit's unsharded gradients."""
    GATHERED_UNITS = "gathered_units"
    """Parameters are gathered unit by unit: units in flight, the root unit, one unit's gradients."""


class FrameworkSetup(NamedTuple):
    """How one framework runs a strategy."""

    title: str | None = None
    """What the framework calls it, for tables (None: the strategy's title); short, for 80 columns."""
    legend: str | None = None
    """What the short title stands for, printed under tables that show it."""
    torch: TorchSetup | None = None
    """The PyTorch wrapper and options (PyTorch frameworks only)."""
    in_default_set: bool = True
    """Shown when no strategy is named."""
    schedule: tuple[ScheduledCollective, ...] | None = None
    """The collectives this framework issues per step (None: the strategy's, the ZeRO paper's)."""
    schedule_source: str = "ZeRO paper §7 (Rajbhandari et al. 2020)"
    """Whose schedule ``schedule`` is, for tables."""
    grad_sync: GradSync | None = None
    """Fixed by the framework: when gradients are reduced whatever the training loop does. None: the loop
    chooses (``no_sync()`` / ``set_requires_gradient_sync``); PyTorch's default is every micro-batch."""
    zeropp: bool = False
    """Runs DeepSpeed ZeRO++ (``zero_quantized_weights``, ``zero_hpz_partition_size``,
    ``zero_quantized_gradients``)."""
    overlaps_backward: bool = True
    """Its backward collectives run beside backward's compute (DeepSpeed ZeRO-1/2: ``overlap_comm`` off by
    default, so they do not)."""
    needs_architecture: str | None = None
    """Why its memory model needs the architecture even where the framework's does not (None: it does
    not)."""


class Strategy(NamedTuple):
    name: StrategyName
    title: str
    """How the ZeRO paper / FSDP calls it, for tables."""
    params: RankGroup | None
    """The ranks the compute parameters are sharded over (None: replicated)."""
    grads: RankGroup | None
    optimizer: RankGroup | None
    schedule: tuple[ScheduledCollective, ...]
    """The collectives of one optimizer step by the ZeRO paper's accounting (§7), which every framework
    without a schedule of its own follows."""
    buffers: BufferRule
    aliases: tuple[str, ...] = ()
    optimizer_offload: tuple[OffloadTarget, ...] = ()
    """Where this strategy can offload optimizer states (DeepSpeed ``offload_optimizer``)."""
    param_offload: tuple[OffloadTarget, ...] = ()
    """Where it can offload parameters (DeepSpeed ``offload_param``, ZeRO-3 only)."""


_CPU, _NVME = OffloadTarget.CPU, OffloadTarget.NVME
_AR, _RS, _AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
_FWD, _BWD, _STEP = Phase.FORWARD, Phase.BACKWARD, Phase.AFTER_STEP
_G, _P = Tensor.GRADIENTS, Tensor.PARAMETERS
_ONCE, _EACH, _SYNC = Repeat.PER_STEP, Repeat.PER_MICRO_BATCH, Repeat.PER_SYNC
_WORLD, _NODE, _ACROSS = RankGroup.WORLD, RankGroup.NODE, RankGroup.ACROSS_NODES


def schedule_line(
    op: Collective,
    phase: Phase,
    tensor: Tensor,
    group: RankGroup,
    repeat: Repeat,
    behaviour: str,
    shard_of: RankGroup | None = None,
    **rule: object,
) -> ScheduledCollective:
    """One rule of a collective schedule, in the order its fields are read out loud."""
    return ScheduledCollective(
        op=op,
        phase=phase,
        tensor=tensor,
        group=group,
        repeat=repeat,
        behaviour=behaviour,
        shard_of=shard_of,
        **rule,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------------------- the ZeRO paper's schedule
_FLAT = {"padding": Padding.FLAT}
_AG_AFTER_STEP = schedule_line(
    _AG, _STEP, _P, _WORLD, _ONCE, "updated parameter shards gathered after the step (ZeRO §7.2.1)", **_FLAT
)


STRATEGIES: dict[StrategyName, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name=StrategyName.DDP,
            title="DDP",
            aliases=("dp", "no_shard", "fsdp_no_shard", "zero0", "zero_0", "stage0"),
            params=None,
            grads=None,
            optimizer=None,
            schedule=(
                schedule_line(
                    _AR,
                    _BWD,
                    _G,
                    _WORLD,
                    _SYNC,
                    "all_reduce of the gradients once per step (ZeRO §7.1; no_sync() on the first A-1 "
                    "micro-batches)",
                ),
            ),
            buffers=BufferRule.DDP_BUCKET,
        ),
        Strategy(
            name=StrategyName.ZERO1,
            title="ZeRO-1",
            aliases=("zero_1", "stage1", "p_os"),
            params=None,
            grads=None,
            optimizer=_WORLD,
            optimizer_offload=(_CPU,),
            schedule=(
                schedule_line(
                    _RS,
                    _BWD,
                    _G,
                    _WORLD,
                    _SYNC,
                    "gradients reduce-scattered once per step (ZeRO §7.2.1)",
                    **_FLAT,
                ),
                _AG_AFTER_STEP,
            ),
            buffers=BufferRule.DEEPSPEED_BUCKETS,
        ),
        Strategy(
            name=StrategyName.ZERO2,
            title="ZeRO-2",
            aliases=("zero_2", "stage2", "p_os_g"),
            params=None,
            grads=_WORLD,
            optimizer=_WORLD,
            optimizer_offload=(_CPU,),
            schedule=(
                schedule_line(
                    _RS,
                    _BWD,
                    _G,
                    _WORLD,
                    _SYNC,
                    "partitioned gradients reduce-scattered every micro-batch (ZeRO §7.2.1)",
                    **_FLAT,
                ),
                _AG_AFTER_STEP,
            ),
            buffers=BufferRule.DEEPSPEED_BUCKETS,
        ),
        Strategy(
            name=StrategyName.SHARD_GRAD_OP,
            title="SHARD_GRAD_OP",
            aliases=("fsdp_shard_grad_op", "grad_op"),
            params=None,
            grads=_WORLD,
            optimizer=_WORLD,
            schedule=(
                schedule_line(
                    _AG,
                    _FWD,
                    _P,
                    _WORLD,
                    _EACH,
                    "gathered in forward, kept through backward (FSDP SHARD_GRAD_OP)",
                    **_FLAT,
                ),
                schedule_line(
                    _RS, _BWD, _G, _WORLD, _SYNC, "gradients reduce-scattered every micro-batch", **_FLAT
                ),
            ),
            buffers=BufferRule.UNIT_GRADIENTS,
        ),
        Strategy(
            name=StrategyName.ZERO3,
            title="ZeRO-3 / FULL_SHARD",
            aliases=("zero_3", "stage3", "p_os_g_p", "full_shard", "fsdp", "fsdp_full_shard", "fsdp2"),
            params=_WORLD,
            grads=_WORLD,
            optimizer=_WORLD,
            optimizer_offload=(_CPU, _NVME),
            param_offload=(_CPU, _NVME),
            schedule=(
                schedule_line(_AG, _FWD, _P, _WORLD, _EACH, "gathered in forward (ZeRO §7.2.2)", **_FLAT),
                schedule_line(
                    _AG,
                    _BWD,
                    _P,
                    _WORLD,
                    _EACH,
                    "re-gathered in backward after resharding (ZeRO §7.2.2)",
                    **_FLAT,
                ),
                schedule_line(
                    _RS, _BWD, _G, _WORLD, _SYNC, "gradients reduce-scattered every micro-batch", **_FLAT
                ),
            ),
            buffers=BufferRule.GATHERED_UNITS,
        ),
        Strategy(
            name=StrategyName.HYBRID_SHARD,
            title="HYBRID_SHARD",
            aliases=("hybrid", "hsdp", "fsdp_hybrid_shard"),
            params=_NODE,
            grads=_NODE,
            optimizer=_NODE,
            schedule=(
                schedule_line(
                    _AG, _FWD, _P, _NODE, _EACH, "FULL_SHARD within the node (FSDP HYBRID_SHARD)", **_FLAT
                ),
                schedule_line(
                    _AG, _BWD, _P, _NODE, _EACH, "re-gathered in backward within the node", **_FLAT
                ),
                schedule_line(
                    _RS, _BWD, _G, _NODE, _SYNC, "gradients reduce-scattered within the node", **_FLAT
                ),
                schedule_line(
                    _AR,
                    _BWD,
                    _G,
                    _ACROSS,
                    _SYNC,
                    "each gradient shard all-reduced across nodes",
                    _NODE,
                    **_FLAT,
                ),
            ),
            buffers=BufferRule.GATHERED_UNITS,
        ),
    )
}


def find_strategy(text: str) -> Strategy | None:
    """The strategy ``text`` names: its name or one of its aliases (FSDP names, DeepSpeed stages), case and
    ``-``/``_`` forgiven; None when it names none. ``strategies=``, ``--strategy`` and a result's ``row``
    all look names up here."""
    key = str(text).strip().lower().replace("-", "_")
    return next((s for s in STRATEGIES.values() if key == s.name.value or key in s.aliases), None)


RowT = TypeVar("RowT")


def row_named(rows: Sequence[RowT], name: StrategyName | str) -> RowT:
    """The row of ``rows`` (each with a ``strategy``) for the strategy ``name`` names, by any of its
    names; a KeyError naming the rows there when it has none, an InputError when ``name`` is no strategy."""
    strategy = find_strategy(name)
    if strategy is None:
        known = ", ".join(s.name.value for s in STRATEGIES.values())
        raise InputError(f"{shown(str(name))} is not a strategy; accepted: {known} or one of their aliases")
    for row in rows:
        if row.strategy is strategy.name:  # type: ignore[attr-defined]
            return row
    present = ", ".join(row.strategy.value for row in rows) or "none"  # type: ignore[attr-defined]
    raise KeyError(f"no {strategy.name.value} row in this result; its rows: {present}")
