"""Data-parallel strategies and their sharding rules, defined once.

A strategy says, for each kind of model state, over how many ranks it is partitioned: not at all
(replicated), over all N data-parallel ranks, or over the g ranks of one node (HYBRID_SHARD). The rules
are the ZeRO paper's (Rajbhandari et al. 2020, section 5.1, "P_os", "P_os+g", "P_os+g+p") and the
PyTorch FSDP ``ShardingStrategy`` docs (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD).
The communication schedule of each strategy lives in ``zerocalc.comm``.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict

from zerocalc.errors import InputError


class StrategyName(str, Enum):
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    SHARD_GRAD_OP = "shard_grad_op"
    ZERO3 = "zero3"
    HYBRID_SHARD = "hybrid_shard"


class ShardScope(str, Enum):
    """Over which ranks a state is partitioned."""

    REPLICATED = "replicated"
    WORLD = "world"
    """All N data-parallel ranks."""
    NODE = "node"
    """The g ranks of one node; replicated across nodes (HYBRID_SHARD)."""


class OffloadTarget(str, Enum):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class Strategy(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: StrategyName
    title: str
    """How the framework calls it, for tables."""
    params: ShardScope
    grads: ShardScope
    optimizer: ShardScope
    optimizer_offload: tuple[OffloadTarget, ...] = ()
    """Where this strategy can offload optimizer states (DeepSpeed ``offload_optimizer``)."""
    param_offload: tuple[OffloadTarget, ...] = ()
    """Where it can offload parameters (DeepSpeed ``offload_param``, ZeRO-3 only)."""
    aliases: tuple[str, ...] = ()


def shard_divisor(scope: ShardScope, world_size: int, gpus_per_node: int) -> int:
    """Number of ranks a state with this scope is split over."""
    if scope is ShardScope.WORLD:
        return world_size
    if scope is ShardScope.NODE:
        return min(gpus_per_node, world_size)
    return 1


_CPU, _NVME = OffloadTarget.CPU, OffloadTarget.NVME

# DeepSpeed config docs ("offload_optimizer ... valid for ZeRO stage 1, 2, 3"; NVMe offload of optimizer
# states and any offload of parameters need stage 3, ZeRO-Infinity, Rajbhandari et al. 2021).
STRATEGIES: dict[StrategyName, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name=StrategyName.DDP,
            title="DDP",
            params=ShardScope.REPLICATED,
            grads=ShardScope.REPLICATED,
            optimizer=ShardScope.REPLICATED,
            aliases=("dp", "no_shard", "fsdp_no_shard", "zero0", "zero_0", "stage0"),
        ),
        Strategy(
            name=StrategyName.ZERO1,
            title="ZeRO-1",
            params=ShardScope.REPLICATED,
            grads=ShardScope.REPLICATED,
            optimizer=ShardScope.WORLD,
            optimizer_offload=(_CPU,),
            aliases=("zero_1", "stage1", "p_os"),
        ),
        Strategy(
            name=StrategyName.ZERO2,
            title="ZeRO-2",
            params=ShardScope.REPLICATED,
            grads=ShardScope.WORLD,
            optimizer=ShardScope.WORLD,
            optimizer_offload=(_CPU,),
            aliases=("zero_2", "stage2", "p_os_g"),
        ),
        Strategy(
            name=StrategyName.SHARD_GRAD_OP,
            title="SHARD_GRAD_OP",
            params=ShardScope.REPLICATED,
            grads=ShardScope.WORLD,
            optimizer=ShardScope.WORLD,
            aliases=("fsdp_shard_grad_op", "grad_op"),
        ),
        Strategy(
            name=StrategyName.ZERO3,
            title="ZeRO-3 / FULL_SHARD",
            params=ShardScope.WORLD,
            grads=ShardScope.WORLD,
            optimizer=ShardScope.WORLD,
            optimizer_offload=(_CPU, _NVME),
            param_offload=(_CPU, _NVME),
            aliases=("zero_3", "stage3", "p_os_g_p", "full_shard", "fsdp", "fsdp_full_shard", "fsdp2"),
        ),
        Strategy(
            name=StrategyName.HYBRID_SHARD,
            title="HYBRID_SHARD",
            params=ShardScope.NODE,
            grads=ShardScope.NODE,
            optimizer=ShardScope.NODE,
            aliases=("hybrid", "hsdp", "fsdp_hybrid_shard"),
        ),
    )
}

DEFAULT_STRATEGIES: tuple[StrategyName, ...] = (
    StrategyName.DDP,
    StrategyName.ZERO1,
    StrategyName.ZERO2,
    StrategyName.ZERO3,
    StrategyName.HYBRID_SHARD,
)


def _normalise(text: str) -> str:
    return text.strip().lower().replace("-", "_")


def parse_strategy(text: str) -> Strategy:
    key = _normalise(text)
    for strategy in STRATEGIES.values():
        if key == strategy.name.value or key in strategy.aliases:
            return strategy
    accepted = ", ".join(
        f"{s.name.value} ({', '.join(s.aliases[:3])})" if s.aliases else s.name.value
        for s in STRATEGIES.values()
    )
    raise InputError(f"--strategy {text!r} is not known; accepted: all, {accepted}")


def parse_strategies(text: str | None) -> tuple[Strategy, ...] | None:
    """Parse ``--strategy`` (``all`` or a comma list). None means the default set."""
    if text is None or _normalise(text) in ("", "all"):
        return None
    chosen: list[Strategy] = []
    for part in text.split(","):
        if not part.strip():
            continue
        strategy = parse_strategy(part)
        if strategy not in chosen:
            chosen.append(strategy)
    if not chosen:
        raise InputError(f"--strategy {text!r} names no strategy; accepted: all or a comma list")
    return tuple(chosen)


def parse_offload(text: str | None, what: str) -> OffloadTarget:
    if text is None:
        return OffloadTarget.NONE
    key = text.strip().lower()
    for target in OffloadTarget:
        if key == target.value:
            return target
    raise InputError(f"{what} {text!r} is not accepted; accepted: none, cpu, nvme")
