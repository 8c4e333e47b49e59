"""Data-parallel strategies: one record per strategy, read by memory, comm, peak and validate.

A :class:`Strategy` says everything zerocalc knows about one strategy, once:

* what is sharded over which ranks: not at all (replicated), over all N data-parallel ranks, or over the
  g ranks of one node (HYBRID_SHARD) — the ZeRO paper's rules (Rajbhandari et al. 2020, §5.1, "P_os",
  "P_os+g", "P_os+g+p") and PyTorch FSDP's ``ShardingStrategy`` (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD,
  HYBRID_SHARD);
* where it can offload (DeepSpeed's ``offload_optimizer``/``offload_param``, ZeRO-Offload/ZeRO-Infinity);
* its collective schedule per step (:mod:`zerocalc.schedule`; costed by :mod:`zerocalc.comm`);
* its communication buffers at the peak (:class:`BufferRule`; sized by :mod:`zerocalc.peak.buffers`);
* which frameworks implement it and how PyTorch sets it up (:class:`FrameworkSetup`; the exact per-rank
  states of :mod:`zerocalc.framework_states` and the configurations ``zerocalc validate`` runs).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from zerocalc.cluster import RankGroup
from zerocalc.collectives import Collective
from zerocalc.frameworks import Framework, Fsdp1Sharding, TorchSetup, TorchWrapper
from zerocalc.schedule import Phase, Repeat, ScheduledCollective, Tensor


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


class FrameworkSetup(BaseModel):
    """How one framework runs a strategy."""

    model_config = ConfigDict(frozen=True)

    title: str | None = None
    """What the framework calls it, for tables (None: the strategy's title); short, for 80 columns."""
    legend: str | None = None
    """What the short title stands for, printed under tables that show it."""
    torch: TorchSetup | None = None
    """The PyTorch wrapper and options (PyTorch frameworks only)."""
    in_default_set: bool = True
    """Shown when no strategy is named."""


class Strategy(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: StrategyName
    title: str
    """How the ZeRO paper / FSDP calls it, for tables."""
    aliases: tuple[str, ...] = ()
    params: RankGroup | None
    """The ranks the compute parameters are sharded over (None: replicated)."""
    grads: RankGroup | None
    optimizer: RankGroup | None
    optimizer_offload: tuple[OffloadTarget, ...] = ()
    """Where this strategy can offload optimizer states (DeepSpeed ``offload_optimizer``)."""
    param_offload: tuple[OffloadTarget, ...] = ()
    """Where it can offload parameters (DeepSpeed ``offload_param``, ZeRO-3 only)."""
    schedule: tuple[ScheduledCollective, ...]
    """The collectives of one optimizer step (ZeRO paper §7; PyTorch FSDP and DDP docs)."""
    buffers: BufferRule
    frameworks: dict[Framework, FrameworkSetup]
    """The frameworks that implement this strategy, and how."""

    def legend_under(self, framework: Framework) -> str | None:
        setup = self.frameworks.get(framework)
        return setup.legend if setup else None

    def title_under(self, framework: Framework) -> str:
        setup = self.frameworks.get(framework)
        return (setup.title if setup and setup.title else None) or self.title


_CPU, _NVME = OffloadTarget.CPU, OffloadTarget.NVME
_AR, _RS, _AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
_FWD, _BWD, _STEP = Phase.FORWARD, Phase.BACKWARD, Phase.AFTER_STEP
_G, _P = Tensor.GRADIENTS, Tensor.PARAMETERS
_ONCE, _EACH = Repeat.PER_STEP, Repeat.PER_MICRO_BATCH
_WORLD, _NODE, _ACROSS = RankGroup.WORLD, RankGroup.NODE, RankGroup.ACROSS_NODES


def _line(
    op: Collective,
    phase: Phase,
    tensor: Tensor,
    group: RankGroup,
    repeat: Repeat,
    behaviour: str,
    shard_of: RankGroup | None = None,
) -> ScheduledCollective:
    return ScheduledCollective(
        op=op, phase=phase, tensor=tensor, group=group, repeat=repeat, behaviour=behaviour, shard_of=shard_of
    )


_PAPER = FrameworkSetup()
_AG_AFTER_STEP = _line(
    _AG, _STEP, _P, _WORLD, _ONCE, "updated parameter shards gathered after the step (ZeRO §7.2.1)"
)

# DeepSpeed config docs ("offload_optimizer ... valid for ZeRO stage 1, 2, 3"; NVMe offload of optimizer
# states and any offload of parameters need stage 3, ZeRO-Infinity, Rajbhandari et al. 2021).
# Torch setups: torch/nn/parallel/distributed.py; torch/distributed/optim/zero_redundancy_optimizer.py;
# torch/distributed/fsdp/api.py ShardingStrategy (FSDP1, use_orig_params=False, a unit per block);
# torch/distributed/fsdp/_fully_shard/_fully_shard.py fully_shard(mesh, reshard_after_forward).
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
                _line(
                    _AR,
                    _BWD,
                    _G,
                    _WORLD,
                    _ONCE,
                    "PyTorch DDP: bucketed all_reduce; no_sync() skips A-1 micro-batches",
                ),
            ),
            buffers=BufferRule.DDP_BUCKET,
            frameworks={
                Framework.PAPER: _PAPER,
                Framework.MEGATRON: _PAPER,
                Framework.FSDP: FrameworkSetup(
                    title="FSDP NO_SHARD",
                    torch=TorchSetup(
                        wrapper=TorchWrapper.FSDP1,
                        sharding=Fsdp1Sharding.NO_SHARD,
                        validate_name="fsdp1-no-shard",
                    ),
                ),
                Framework.TORCH_ZERO1: FrameworkSetup(
                    title="DDP",
                    torch=TorchSetup(wrapper=TorchWrapper.DDP, shard_group=None, validate_name="ddp"),
                ),
            },
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
                _line(
                    _RS,
                    _BWD,
                    _G,
                    _WORLD,
                    _ONCE,
                    "DeepSpeed ZeRO-1: gradients reduced once per step (ZeRO §7.2.1)",
                ),
                _AG_AFTER_STEP,
            ),
            buffers=BufferRule.DEEPSPEED_BUCKETS,
            frameworks={
                Framework.PAPER: _PAPER,
                Framework.MEGATRON: _PAPER,
                Framework.TORCH_ZERO1: FrameworkSetup(
                    title="DDP + ZeRO-1",
                    legend="DistributedDataParallel with torch's ZeroRedundancyOptimizer",
                    torch=TorchSetup(wrapper=TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER, validate_name="zero1"),
                ),
            },
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
                _line(
                    _RS,
                    _BWD,
                    _G,
                    _WORLD,
                    _EACH,
                    "DeepSpeed ZeRO-2: partitioned gradients reduced every micro-batch",
                ),
                _AG_AFTER_STEP,
            ),
            buffers=BufferRule.DEEPSPEED_BUCKETS,
            frameworks={Framework.PAPER: _PAPER, Framework.DEEPSPEED: _PAPER},
        ),
        Strategy(
            name=StrategyName.SHARD_GRAD_OP,
            title="SHARD_GRAD_OP",
            aliases=("fsdp_shard_grad_op", "grad_op"),
            params=None,
            grads=_WORLD,
            optimizer=_WORLD,
            schedule=(
                _line(
                    _AG,
                    _FWD,
                    _P,
                    _WORLD,
                    _EACH,
                    "FSDP SHARD_GRAD_OP: gathered in forward, kept through backward",
                ),
                _line(_RS, _BWD, _G, _WORLD, _EACH, "FSDP: reduce_scatter of gradients every micro-batch"),
            ),
            buffers=BufferRule.UNIT_GRADIENTS,
            frameworks={
                Framework.PAPER: FrameworkSetup(in_default_set=False),
                Framework.FSDP: FrameworkSetup(
                    title="FSDP SHARD_GRAD_OP",
                    torch=TorchSetup(
                        wrapper=TorchWrapper.FSDP1,
                        sharding=Fsdp1Sharding.SHARD_GRAD_OP,
                        validate_name="fsdp1-shard-grad-op",
                    ),
                ),
                Framework.FSDP2: FrameworkSetup(
                    title="FSDP2 no reshard",
                    legend="fully_shard(reshard_after_forward=False): gathered once per step",
                    torch=TorchSetup(
                        wrapper=TorchWrapper.FSDP2,
                        reshard_after_forward=False,
                        validate_name="fsdp2-no-reshard",
                    ),
                ),
            },
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
                _line(_AG, _FWD, _P, _WORLD, _EACH, "ZeRO-3 / FULL_SHARD: gathered in forward (ZeRO §7.2.2)"),
                _line(_AG, _BWD, _P, _WORLD, _EACH, "re-gathered in backward after resharding (ZeRO §7.2.2)"),
                _line(_RS, _BWD, _G, _WORLD, _EACH, "reduce_scatter of gradients every micro-batch"),
            ),
            buffers=BufferRule.GATHERED_UNITS,
            frameworks={
                Framework.PAPER: _PAPER,
                Framework.DEEPSPEED: _PAPER,
                Framework.FSDP: FrameworkSetup(
                    title="FSDP FULL_SHARD",
                    torch=TorchSetup(
                        wrapper=TorchWrapper.FSDP1,
                        sharding=Fsdp1Sharding.FULL_SHARD,
                        validate_name="fsdp1-full-shard",
                    ),
                ),
                Framework.FSDP2: FrameworkSetup(
                    title="FSDP2 reshard",
                    legend="fully_shard(reshard_after_forward=True), the default: gathered again in backward",
                    torch=TorchSetup(wrapper=TorchWrapper.FSDP2, validate_name="fsdp2"),
                ),
            },
        ),
        Strategy(
            name=StrategyName.HYBRID_SHARD,
            title="HYBRID_SHARD",
            aliases=("hybrid", "hsdp", "fsdp_hybrid_shard"),
            params=_NODE,
            grads=_NODE,
            optimizer=_NODE,
            schedule=(
                _line(_AG, _FWD, _P, _NODE, _EACH, "FSDP HYBRID_SHARD: FULL_SHARD within the node"),
                _line(_AG, _BWD, _P, _NODE, _EACH, "re-gathered in backward within the node"),
                _line(_RS, _BWD, _G, _NODE, _EACH, "reduce_scatter within the node"),
                _line(_AR, _BWD, _G, _ACROSS, _EACH, "all_reduce of each gradient shard across nodes", _NODE),
            ),
            buffers=BufferRule.GATHERED_UNITS,
            frameworks={
                Framework.PAPER: _PAPER,
                Framework.FSDP: FrameworkSetup(
                    title="FSDP HYBRID_SHARD",
                    torch=TorchSetup(
                        wrapper=TorchWrapper.FSDP1, sharding=Fsdp1Sharding.FULL_SHARD, shard_group=_NODE
                    ),
                ),
                Framework.FSDP2: FrameworkSetup(
                    title="FSDP2 HSDP",
                    legend="fully_shard on a 2-D mesh: sharded in the node, replicated across nodes",
                    torch=TorchSetup(wrapper=TorchWrapper.FSDP2, shard_group=_NODE),
                ),
            },
        ),
    )
}

PAPER_DEFAULT_STRATEGIES: tuple[StrategyName, ...] = tuple(
    name for name, s in STRATEGIES.items() if s.frameworks[Framework.PAPER].in_default_set
)
"""What ``all`` means for the paper's accounting: the ZeRO stages, DDP and HYBRID_SHARD."""


def framework_strategies(framework: Framework) -> tuple[StrategyName, ...]:
    """The strategies a framework implements, in :class:`StrategyName` order."""
    return tuple(name for name, s in STRATEGIES.items() if framework in s.frameworks)


def default_strategies(framework: Framework) -> tuple[StrategyName, ...]:
    """What ``all`` stands for under a framework."""
    return tuple(
        name
        for name, s in STRATEGIES.items()
        if framework in s.frameworks and s.frameworks[framework].in_default_set
    )


def torch_setup(framework: Framework, strategy: StrategyName) -> TorchSetup | None:
    """How PyTorch runs ``strategy`` under ``framework`` (None for the non-PyTorch accountings)."""
    setup = STRATEGIES[strategy].frameworks.get(framework)
    return setup.torch if setup else None


def validated_setups() -> dict[str, tuple[Framework, StrategyName, TorchSetup]]:
    """``zerocalc validate``'s configurations by name, by wrapper then strategy."""
    found = [
        (setup.torch.validate_name, (framework, name, setup.torch))
        for name, strategy in STRATEGIES.items()
        for framework, setup in strategy.frameworks.items()
        if setup.torch is not None and setup.torch.validate_name
    ]
    wrappers, names = list(TorchWrapper), list(StrategyName)
    found.sort(key=lambda item: (wrappers.index(item[1][2].wrapper), names.index(item[1][1])))
    return {validate_name: value for validate_name, value in found if validate_name}
