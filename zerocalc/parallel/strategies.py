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
* its communication buffers at the peak (:class:`BufferRule`; sized by :mod:`zerocalc.peak.buffers`);
* which frameworks implement it and how (:class:`FrameworkSetup`): the collectives each framework really
  issues (PyTorch 2.13's DDP, ZeroRedundancyOptimizer, FSDP1 and FSDP2, DeepSpeed 0.19.8's stages 1-3
  and ZeRO++, each rule citing the source function it follows), whether the framework fixes when
  gradients are reduced, and how PyTorch sets it up (the exact per-rank states of
  :mod:`zerocalc.states.framework` and the configurations ``zerocalc validate`` runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from functools import cache
from typing import NamedTuple, TypeVar

from zerocalc.base.errors import InputError, shown
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import (
    Calls,
    DtypeRole,
    GradSync,
    Padding,
    Phase,
    Quantization,
    Repeat,
    ScheduledCollective,
    Select,
    Tensor,
    ZeroPP,
)
from zerocalc.parallel.frameworks import Estimate, Framework, Fsdp1Sharding, TorchSetup, TorchWrapper


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
    memory: bool = True
    """``zerocalc memory`` models it under this framework (DeepSpeed has no stage-1 estimator)."""
    zeropp: bool = False
    """Runs DeepSpeed ZeRO++ (``zero_quantized_weights``, ``zero_hpz_partition_size``,
    ``zero_quantized_gradients``)."""


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
    frameworks: dict[Framework, FrameworkSetup]
    """The frameworks that implement this strategy, and how."""
    aliases: tuple[str, ...] = ()
    optimizer_offload: tuple[OffloadTarget, ...] = ()
    """Where this strategy can offload optimizer states (DeepSpeed ``offload_optimizer``)."""
    param_offload: tuple[OffloadTarget, ...] = ()
    """Where it can offload parameters (DeepSpeed ``offload_param``, ZeRO-3 only)."""

    def legend_under(self, framework: Framework) -> str | None:
        setup = self.frameworks.get(framework)
        return setup.legend if setup else None

    def title_under(self, framework: Framework) -> str:
        setup = self.frameworks.get(framework)
        return (setup.title if setup and setup.title else None) or self.title

    def schedule_under(self, framework: Framework) -> tuple[ScheduledCollective, ...]:
        """The collectives ``framework`` issues for this strategy."""
        setup = self.frameworks[framework]
        return self.schedule if setup.schedule is None else setup.schedule


_CPU, _NVME = OffloadTarget.CPU, OffloadTarget.NVME
_AR, _RS, _AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
_BC, _A2A = Collective.BROADCAST, Collective.ALL_TO_ALL
_FWD, _BWD, _STEP = Phase.FORWARD, Phase.BACKWARD, Phase.AFTER_STEP
_G, _P = Tensor.GRADIENTS, Tensor.PARAMETERS
_ONCE, _EACH, _SYNC = Repeat.PER_STEP, Repeat.PER_MICRO_BATCH, Repeat.PER_SYNC
_WORLD, _NODE, _ACROSS = RankGroup.WORLD, RankGroup.NODE, RankGroup.ACROSS_NODES
_EVERY, _LAST = GradSync.EVERY, GradSync.LAST


def _line(
    op: Collective,
    phase: Phase,
    tensor: Tensor,
    group: RankGroup,
    repeat: Repeat,
    behaviour: str,
    shard_of: RankGroup | None = None,
    **rule: object,
) -> ScheduledCollective:
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
_AG_AFTER_STEP = _line(
    _AG, _STEP, _P, _WORLD, _ONCE, "updated parameter shards gathered after the step (ZeRO §7.2.1)", **_FLAT
)


def _paper(grad_sync: GradSync, **fields: object) -> FrameworkSetup:
    """The ZeRO paper's accounting, which fixes when gradients are reduced."""
    return FrameworkSetup(grad_sync=grad_sync, **fields)  # type: ignore[arg-type]


_MEGATRON_SOURCE = "ZeRO paper §7 (Megatron-LM's own schedule is not modelled separately)"

# ------------------------------------------------------------------------------------ PyTorch 2.13
_TORCH = "torch 2.13"
_DDP_ALL_REDUCE = _line(
    _AR,
    _BWD,
    _G,
    _WORLD,
    _SYNC,
    "DDP: one all_reduce per gradient bucket in every synchronised backward, in the parameters' dtype "
    "(reducer.cpp Reducer::rebuild_buckets, compute_bucket_assignment_by_size)",
    dtype=DtypeRole.STORED,
    calls=Calls.DDP_BUCKET,
)
_ZERO1_BROADCASTS = _line(
    _BC,
    _STEP,
    _P,
    _WORLD,
    _ONCE,
    "ZeroRedundancyOptimizer.step → _sync_params: each rank broadcasts the parameters it updated, one "
    "call per parameter (zero_redundancy_optimizer.py _broadcast_params_from_rank)",
    dtype=DtypeRole.STORED,
    calls=Calls.PARAMETER,
)


def _fsdp_schedule(fsdp2: bool, shard: RankGroup, reshard: bool) -> tuple[ScheduledCollective, ...]:
    """FSDP1 (``torch/distributed/fsdp/_runtime_utils.py``) or FSDP2 (``_fully_shard/_fsdp_param_group.py``)
    sharding over ``shard``: one call per unit (flat parameter / parameter group), padded as each pads."""
    unit = {"calls": Calls.UNIT, "padding": Padding.DIM0 if fsdp2 else Padding.FLAT}
    if fsdp2:
        gather = "FSDPParamGroup.unshard → foreach_all_gather: one all_gather per group, every forward"
        if not reshard:
            gather += (
                " (post_backward reshards after backward, so also under set_requires_gradient_sync(False))"
            )
        regather = (
            "FSDPParamGroup.pre_backward re-gathers resharded groups; the root is never resharded after "
            "forward (FSDPState._lazy_init: post_forward_mesh_info None)"
        )
        reduce = "foreach_reduce: one reduce_scatter per group; set_requires_gradient_sync(False) skips it"
        across = "foreach_reduce: all_reduce of each group's reduce_scatter output over the replicas"
        forward_repeat = _EACH
    else:
        gather = "FlatParamHandle._all_gather_flat_param: one all_gather per unit in forward"
        if not reshard:
            gather += (
                "; units stay unsharded until a synchronised backward frees them "
                "(_should_free_in_backward), so no_sync() micro-batches skip it"
            )
        regather = (
            "_pre_backward_hook re-gathers the units _post_forward_reshard freed; the root unit is "
            "never freed after forward"
        )
        reduce = "_reduce_grad: reduce_scatter of each unit's padded flat gradient; skipped under no_sync()"
        across = "_reduce_grad: all_reduce of each reduce_scatter output over _inter_node_pg"
        forward_repeat = _EACH if reshard else _SYNC
    rules = [_line(_AG, _FWD, _P, shard, forward_repeat, gather, **unit)]
    if reshard:
        rules.append(_line(_AG, _BWD, _P, shard, _EACH, regather, select=Select.NON_ROOT, **unit))
    rules.append(_line(_RS, _BWD, _G, shard, _SYNC, reduce, **unit))
    if shard is _NODE:
        rules.append(_line(_AR, _BWD, _G, _ACROSS, _SYNC, across, shard_of=_NODE, **unit))
    return tuple(rules)


def _fsdp1(
    sharding: Fsdp1Sharding, shard: RankGroup, title: str, validate_name: str | None
) -> FrameworkSetup:
    if sharding is Fsdp1Sharding.NO_SHARD:
        schedule: tuple[ScheduledCollective, ...] = (
            _line(
                _AR,
                _BWD,
                _G,
                _WORLD,
                _SYNC,
                "_reduce_grad_no_shard: one all_reduce per unit's flat gradient, unpadded; skipped under "
                "no_sync()",
                calls=Calls.UNIT,
            ),
        )
    else:
        reshard = sharding is Fsdp1Sharding.FULL_SHARD
        schedule = _fsdp_schedule(fsdp2=False, shard=shard, reshard=reshard)
    return FrameworkSetup(
        title=title,
        torch=TorchSetup(
            wrapper=TorchWrapper.FSDP1,
            sharding=sharding,
            shard_group=shard if sharding is not Fsdp1Sharding.NO_SHARD else _WORLD,
            validate_name=validate_name,
        ),
        schedule=schedule,
        schedule_source=f"{_TORCH} FSDP1 (torch/distributed/fsdp/_runtime_utils.py)",
    )


def _fsdp2(
    reshard: bool, shard: RankGroup, title: str, validate_name: str | None, legend: str
) -> FrameworkSetup:
    return FrameworkSetup(
        title=title,
        legend=legend,
        torch=TorchSetup(
            wrapper=TorchWrapper.FSDP2,
            reshard_after_forward=reshard,
            shard_group=shard,
            validate_name=validate_name,
        ),
        schedule=_fsdp_schedule(fsdp2=True, shard=shard, reshard=reshard),
        schedule_source=f"{_TORCH} FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py)",
    )


# ------------------------------------------------------------------------------------ DeepSpeed 0.19.8
_DS = "DeepSpeed 0.19.8"
_DS_ALL_REDUCE = (
    "stage_1_and_2.py average_tensor → allreduce_and_scatter → allreduce_bucket: with the default "
    "use_multi_rank_bucket_allreduce=True every reduce bucket is one dist.all_reduce (no reduce_scatter)"
)
_DS_AG_AFTER_STEP = _line(
    _AG,
    _STEP,
    _P,
    _WORLD,
    _ONCE,
    "step → all_gather_dp_groups → all_gather_into_tensor_dp_groups (runtime/utils.py): one "
    "all_gather_into_tensor of the bit16 partitions per param group, aligned to 2N elements (one group)",
    padding=Padding.TWICE_GROUP,
)


def _deepspeed_zero12(stage: int) -> FrameworkSetup:
    when = (
        "stage 1 reduces only at the accumulation boundary (reduce_ready_partitions_and_remove_grads)"
        if stage == 1
        else "stage 2 reduces in the backward hooks of every micro-batch (partition_gradients)"
    )
    return FrameworkSetup(
        schedule=(
            _line(_AR, _BWD, _G, _WORLD, _SYNC, f"{_DS_ALL_REDUCE}; {when}", calls=Calls.DEEPSPEED_BUCKET),
            _DS_AG_AFTER_STEP,
        ),
        schedule_source=f"{_DS} runtime/zero/stage_1_and_2.py",
        grad_sync=_LAST if stage == 1 else _EVERY,
        memory=stage == 2,
    )


_DS_FETCH = (
    "PartitionedParameterCoordinator.fetch_sub_module → all_gather_coalesced: one all_gather_into_tensor "
    "per fetch of a module's partitions (prefetching may merge fetches)"
)
_QWZ = {"quantization": Quantization.INT8_BLOCKS, "quantized_by": ZeroPP.QWZ}
_DS3 = {"calls": Calls.MODULE, "padding": Padding.PER_TENSOR, **_QWZ}
_DEEPSPEED_ZERO3 = FrameworkSetup(
    schedule=(
        _line(
            _AG,
            _FWD,
            _P,
            _WORLD,
            _EACH,
            _DS_FETCH,
            select=Select.NON_PERSISTENT,
            replaced_by=ZeroPP.HPZ,
            **_DS3,
        ),
        _line(
            _AG,
            _FWD,
            _P,
            _WORLD,
            _ONCE,
            f"{_DS_FETCH}; hpZ: the first forward after the step gathers the primary partitions across the "
            "world (_post_step → invalidate_secondary_tensor)",
            select=Select.NON_PERSISTENT,
            requires=ZeroPP.HPZ,
            **_DS3,
        ),
        _line(
            _AG,
            _FWD,
            _P,
            _NODE,
            Repeat.AFTER_FIRST_MICRO_BATCH,
            f"{_DS_FETCH}; hpZ: later forwards gather the secondary partitions inside the node "
            "(all_gather_coalesced: use_secondary_tensor → zero_param_process_group)",
            select=Select.NON_PERSISTENT,
            requires=ZeroPP.HPZ,
            **_DS3,
        ),
        _line(
            _AG,
            _BWD,
            _P,
            _WORLD,
            _EACH,
            f"{_DS_FETCH}; parameters reused within max_reuse_distance (1e9 elements) are not released after "
            "forward (__params_to_release) and not re-gathered",
            select=Select.RELEASED_AFTER_FORWARD,
            replaced_by=ZeroPP.HPZ,
            **_DS3,
        ),
        _line(
            _AG,
            _BWD,
            _P,
            _NODE,
            _EACH,
            f"{_DS_FETCH}; hpZ: released parameters are re-gathered from the secondary partition inside the "
            "node (_partition_param_sec)",
            select=Select.RELEASED_AFTER_FORWARD,
            requires=ZeroPP.HPZ,
            **_DS3,
        ),
        _line(
            _RS,
            _BWD,
            _G,
            _WORLD,
            _SYNC,
            "__reduce_and_partition_ipg_grads → __avg_scatter_grads → reduce_scatter_coalesced: one "
            "reduce_scatter per reduce bucket, each gradient padded to a multiple of N, every micro-batch",
            calls=Calls.DEEPSPEED_BUCKET,
            padding=Padding.PER_TENSOR,
            replaced_by=ZeroPP.QGZ,
        ),
        _line(
            _A2A,
            _BWD,
            _G,
            _NODE,
            _SYNC,
            "qgZ all_to_all_quant_reduce: int4 gradients (swizzle_quant) exchanged inside the node, then "
            "their scales",
            calls=Calls.PARAMETER,
            select=Select.QUANTIZABLE_GRADIENTS,
            quantization=Quantization.INT4_GROUPS,
            requires=ZeroPP.QGZ,
        ),
        _line(
            _A2A,
            _BWD,
            _G,
            _ACROSS,
            _SYNC,
            "qgZ all_to_all_quant_reduce: the node's reduced, requantized 1/g (quantized_reduction) "
            "exchanged across nodes, then its scales",
            shard_of=_NODE,
            calls=Calls.PARAMETER,
            select=Select.QUANTIZABLE_GRADIENTS,
            quantization=Quantization.INT4_GROUPS,
            requires=ZeroPP.QGZ,
        ),
        _line(
            _RS,
            _BWD,
            _G,
            _WORLD,
            _SYNC,
            "qgZ all_to_all_quant_reduce: 1-D gradients and those whose numel is not a multiple of 2N fall "
            "back to reduce_scatter_coalesced, one call each",
            calls=Calls.PARAMETER,
            padding=Padding.PER_TENSOR,
            select=Select.UNQUANTIZABLE_GRADIENTS,
            requires=ZeroPP.QGZ,
        ),
        _line(
            _AG,
            _STEP,
            _P,
            _WORLD,
            _ONCE,
            "_post_step: persistent parameters (≤ param_persistence_threshold = 1e5 elements) are "
            "all-gathered after every step, one all_gather_into_tensor each (_allgather_params_coalesced)",
            calls=Calls.PARAMETER,
            padding=Padding.PER_TENSOR,
            select=Select.PERSISTENT,
        ),
    ),
    schedule_source=f"{_DS} runtime/zero/stage3.py, partition_parameters.py",
    grad_sync=_EVERY,
    zeropp=True,
)

# DeepSpeed config docs ("offload_optimizer ... valid for ZeRO stage 1, 2, 3"; NVMe offload of optimizer
# states and any offload of parameters need stage 3, ZeRO-Infinity, Rajbhandari et al. 2021).
# Torch setups: torch/nn/parallel/distributed.py; torch/distributed/optim/zero_redundancy_optimizer.py;
# torch/distributed/fsdp/api.py ShardingStrategy (FSDP1, use_orig_params=False, a unit per block);
# torch/distributed/fsdp/_fully_shard/_fully_shard.py fully_shard(mesh, reshard_after_forward).
_DDP_TORCH = TorchSetup(wrapper=TorchWrapper.DDP, shard_group=None, validate_name="ddp")
_DDP_SOURCE = f"{_TORCH} DDP (torch/csrc/distributed/c10d/reducer.cpp)"
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
                    _SYNC,
                    "all_reduce of the gradients once per step (ZeRO §7.1; no_sync() on the first A-1 "
                    "micro-batches)",
                ),
            ),
            buffers=BufferRule.DDP_BUCKET,
            frameworks={
                Framework.PAPER: _paper(_LAST),
                Framework.MEGATRON: _paper(_LAST, schedule_source=_MEGATRON_SOURCE),
                Framework.FSDP: _fsdp1(Fsdp1Sharding.NO_SHARD, _WORLD, "FSDP NO_SHARD", "fsdp1-no-shard"),
                Framework.TORCH_ZERO1: FrameworkSetup(
                    title="DDP", torch=_DDP_TORCH, schedule=(_DDP_ALL_REDUCE,), schedule_source=_DDP_SOURCE
                ),
                Framework.DDP: FrameworkSetup(
                    title="DDP",
                    torch=_DDP_TORCH._replace(validate_name=None),
                    schedule=(_DDP_ALL_REDUCE,),
                    schedule_source=_DDP_SOURCE,
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
                    _SYNC,
                    "gradients reduce-scattered once per step (ZeRO §7.2.1)",
                    **_FLAT,
                ),
                _AG_AFTER_STEP,
            ),
            buffers=BufferRule.DEEPSPEED_BUCKETS,
            frameworks={
                Framework.PAPER: _paper(_LAST),
                Framework.MEGATRON: _paper(_LAST, schedule_source=_MEGATRON_SOURCE),
                Framework.DEEPSPEED: _deepspeed_zero12(1),
                Framework.TORCH_ZERO1: FrameworkSetup(
                    title="DDP + ZeRO-1",
                    legend="DistributedDataParallel with torch's ZeroRedundancyOptimizer",
                    torch=TorchSetup(wrapper=TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER, validate_name="zero1"),
                    schedule=(_DDP_ALL_REDUCE, _ZERO1_BROADCASTS),
                    schedule_source=f"{_TORCH} DDP + ZeroRedundancyOptimizer",
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
                    _SYNC,
                    "partitioned gradients reduce-scattered every micro-batch (ZeRO §7.2.1)",
                    **_FLAT,
                ),
                _AG_AFTER_STEP,
            ),
            buffers=BufferRule.DEEPSPEED_BUCKETS,
            frameworks={Framework.PAPER: _paper(_EVERY), Framework.DEEPSPEED: _deepspeed_zero12(2)},
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
                    "gathered in forward, kept through backward (FSDP SHARD_GRAD_OP)",
                    **_FLAT,
                ),
                _line(_RS, _BWD, _G, _WORLD, _SYNC, "gradients reduce-scattered every micro-batch", **_FLAT),
            ),
            buffers=BufferRule.UNIT_GRADIENTS,
            frameworks={
                Framework.PAPER: _paper(_EVERY, in_default_set=False),
                Framework.FSDP: _fsdp1(
                    Fsdp1Sharding.SHARD_GRAD_OP, _WORLD, "FSDP SHARD_GRAD_OP", "fsdp1-shard-grad-op"
                ),
                Framework.FSDP2: _fsdp2(
                    False,
                    _WORLD,
                    "FSDP2 no reshard",
                    "fsdp2-no-reshard",
                    "fully_shard(reshard_after_forward=False): gathered once per step",
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
                _line(_AG, _FWD, _P, _WORLD, _EACH, "gathered in forward (ZeRO §7.2.2)", **_FLAT),
                _line(
                    _AG,
                    _BWD,
                    _P,
                    _WORLD,
                    _EACH,
                    "re-gathered in backward after resharding (ZeRO §7.2.2)",
                    **_FLAT,
                ),
                _line(_RS, _BWD, _G, _WORLD, _SYNC, "gradients reduce-scattered every micro-batch", **_FLAT),
            ),
            buffers=BufferRule.GATHERED_UNITS,
            frameworks={
                Framework.PAPER: _paper(_EVERY),
                Framework.DEEPSPEED: _DEEPSPEED_ZERO3,
                Framework.FSDP: _fsdp1(
                    Fsdp1Sharding.FULL_SHARD, _WORLD, "FSDP FULL_SHARD", "fsdp1-full-shard"
                ),
                Framework.FSDP2: _fsdp2(
                    True,
                    _WORLD,
                    "FSDP2 reshard",
                    "fsdp2",
                    "fully_shard(reshard_after_forward=True), the default: gathered again in backward",
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
                _line(_AG, _FWD, _P, _NODE, _EACH, "FULL_SHARD within the node (FSDP HYBRID_SHARD)", **_FLAT),
                _line(_AG, _BWD, _P, _NODE, _EACH, "re-gathered in backward within the node", **_FLAT),
                _line(_RS, _BWD, _G, _NODE, _SYNC, "gradients reduce-scattered within the node", **_FLAT),
                _line(
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
            frameworks={
                Framework.PAPER: _paper(_EVERY),
                Framework.FSDP: _fsdp1(
                    Fsdp1Sharding.FULL_SHARD, _NODE, "FSDP HYBRID_SHARD", "fsdp1-hybrid-shard"
                ),
                Framework.FSDP2: _fsdp2(
                    True,
                    _NODE,
                    "FSDP2 HSDP",
                    "fsdp2-hsdp",
                    "fully_shard on a 2-D mesh: sharded in the node, replicated across nodes",
                ),
            },
        ),
    )
}


def _modelled(setup: FrameworkSetup, estimate: Estimate) -> bool:
    return estimate is Estimate.COMM or setup.memory


@cache
def framework_strategies(
    framework: Framework, estimate: Estimate = Estimate.MEMORY
) -> tuple[StrategyName, ...]:
    """The strategies a framework implements (for this kind of estimate), in :class:`StrategyName` order
    (once per pair: :data:`STRATEGIES` is a constant table; a plan's search asks hundreds of times)."""
    return tuple(
        name
        for name, s in STRATEGIES.items()
        if framework in s.frameworks and _modelled(s.frameworks[framework], estimate)
    )


def default_strategies(
    framework: Framework, estimate: Estimate = Estimate.MEMORY
) -> tuple[StrategyName, ...]:
    """What ``all`` stands for under a framework."""
    return tuple(
        name
        for name in framework_strategies(framework, estimate)
        if STRATEGIES[name].frameworks[framework].in_default_set
    )


PIPELINE_GRAD_SYNC: dict[Framework, GradSync] = {Framework.FSDP2: GradSync.LAST}
"""When a framework's pipeline schedule reduces gradients, whatever the training loop: torch.distributed.
pipelining turns FSDP2's gradient sync off for every micro-batch's backward and reduces after the last
(``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``)."""


def effective_grad_sync(
    framework: Framework, strategy: StrategyName, asked: GradSync | None, pipelined: bool = False
) -> GradSync:
    """When ``strategy`` reduces gradients under ``framework``: fixed by the framework where it is
    (DeepSpeed's stages, the paper's accounting; a pipeline schedule, :data:`PIPELINE_GRAD_SYNC`), else what
    the training loop was said to do (``asked``), else PyTorch's default, every micro-batch."""
    fixed = STRATEGIES[strategy].frameworks[framework].grad_sync
    if fixed is None and pipelined:
        fixed = PIPELINE_GRAD_SYNC.get(framework)
    return fixed or asked or GradSync.EVERY


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
