"""PyTorch 2.13's data parallelism: FSDP1, FSDP2 (torchtitan), DDP with ``ZeroRedundancyOptimizer``, and
DDP alone — each as it really allocates and communicates.

Set-ups: ``torch/nn/parallel/distributed.py``; ``torch/distributed/optim/zero_redundancy_optimizer.py``;
``torch/distributed/fsdp/api.py`` ``ShardingStrategy`` (FSDP1, ``use_orig_params=False``, a unit per
block); ``torch/distributed/fsdp/_fully_shard/_fully_shard.py`` ``fully_shard(mesh,
reshard_after_forward)``. The collectives each issues cite the function they follow.
"""

from __future__ import annotations

from zerocalc.base.dtypes import TensorRole
from zerocalc.model.activations import CpImpl
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import (
    Calls,
    GradSync,
    Padding,
    Phase,
    Repeat,
    ScheduledCollective,
    Select,
    Tensor,
)
from zerocalc.parallel.framework_records.record import (
    CpFamily,
    ExpertParallel,
    Fp8Support,
    FrameworkRecord,
    ModelInit,
    StatesModel,
)
from zerocalc.parallel.frameworks import Framework, Fsdp1Sharding, TorchSetup, TorchWrapper
from zerocalc.parallel.mesh import TpStyle
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import Fp8RecipeName, ParamLayout, PrecisionName
from zerocalc.parallel.strategies import FrameworkSetup, OffloadTarget, StrategyName, schedule_line

_AR, _RS, _AG, _BC = (
    Collective.ALL_REDUCE,
    Collective.REDUCE_SCATTER,
    Collective.ALL_GATHER,
    Collective.BROADCAST,
)
_FWD, _BWD, _STEP = Phase.FORWARD, Phase.BACKWARD, Phase.AFTER_STEP
_G, _P = Tensor.GRADIENTS, Tensor.PARAMETERS
_ONCE, _EACH, _SYNC = Repeat.PER_STEP, Repeat.PER_MICRO_BATCH, Repeat.PER_SYNC
_WORLD, _NODE, _ACROSS = RankGroup.WORLD, RankGroup.NODE, RankGroup.ACROSS_NODES

TORCH_PRECISIONS = (PrecisionName.FP32, PrecisionName.BF16_MIXED, PrecisionName.FP16_MIXED)
"""What PyTorch's frameworks are modelled under: fp32, or ``MixedPrecision``/``MixedPrecisionPolicy``
(autocast for DDP) with fp32 sharded parameters."""
TORCH_OPTIMIZERS = (OptimizerName.ADAM, OptimizerName.ADAMW)
"""What PyTorch's frameworks are modelled with: ``torch.optim.Adam``/``AdamW``."""

_TORCH = "torch 2.13"
_DDP_ALL_REDUCE = schedule_line(
    _AR,
    _BWD,
    _G,
    _WORLD,
    _SYNC,
    "DDP: one all_reduce per gradient bucket in every synchronised backward, in the parameters' dtype "
    "(reducer.cpp Reducer::rebuild_buckets, compute_bucket_assignment_by_size)",
    dtype=TensorRole.STORED,
    calls=Calls.DDP_BUCKET,
)
_ZERO1_BROADCASTS = schedule_line(
    _BC,
    _STEP,
    _P,
    _WORLD,
    _ONCE,
    "ZeroRedundancyOptimizer.step → _sync_params: each rank broadcasts the parameters it updated, one "
    "call per parameter (zero_redundancy_optimizer.py _broadcast_params_from_rank)",
    dtype=TensorRole.STORED,
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
    rules = [schedule_line(_AG, _FWD, _P, shard, forward_repeat, gather, **unit)]
    if reshard:
        rules.append(schedule_line(_AG, _BWD, _P, shard, _EACH, regather, select=Select.NON_ROOT, **unit))
    rules.append(schedule_line(_RS, _BWD, _G, shard, _SYNC, reduce, **unit))
    if shard is _NODE:
        rules.append(schedule_line(_AR, _BWD, _G, _ACROSS, _SYNC, across, shard_of=_NODE, **unit))
    return tuple(rules)


def _fsdp1(
    sharding: Fsdp1Sharding, shard: RankGroup, title: str, validate_name: str | None
) -> FrameworkSetup:
    if sharding is Fsdp1Sharding.NO_SHARD:
        schedule: tuple[ScheduledCollective, ...] = (
            schedule_line(
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


_DDP_TORCH = TorchSetup(wrapper=TorchWrapper.DDP, shard_group=None, validate_name="ddp")
_DDP_SOURCE = f"{_TORCH} DDP (torch/csrc/distributed/c10d/reducer.cpp)"
_DDP = FrameworkSetup(title="DDP", torch=_DDP_TORCH, schedule=(_DDP_ALL_REDUCE,), schedule_source=_DDP_SOURCE)
_TORCH_ACCEPTS = (
    "Adam/AdamW on fp32 parameters and gradients (MixedPrecision keeps them fp32); accepted: {precision} "
    "fp32, bf16-mixed or fp16-mixed, {optimizer} adam or adamw, no {fp32_grad_accum} (or {framework} paper)"
)
_DDP_INIT = "DDP tutorial: the model built on the host, then .to(rank) whole"


def _torch_record(framework: Framework, **fields: object) -> FrameworkRecord:
    """What every PyTorch framework shares: its states are PyTorch's real allocations, Adam/AdamW under
    fp32 or ``MixedPrecision``, no offload modelled, the per-block wrapping ``zerocalc validate`` runs."""
    return FrameworkRecord(
        framework=framework,
        states=StatesModel.TORCH_EXACT,
        precisions=TORCH_PRECISIONS,
        optimizers=TORCH_OPTIMIZERS,
        fp32_grad_accum=False,
        offload_optimizer=(OffloadTarget.NONE,),
        offload_params=(OffloadTarget.NONE,),
        wrap_model=False,
        accepts=_TORCH_ACCEPTS,
        **fields,  # type: ignore[arg-type]
    )


FSDP = _torch_record(
    Framework.FSDP,
    source="torch 2.13 FSDP1",
    param_layout=ParamLayout.CAST_FOR_COMPUTE,
    strategies={
        StrategyName.DDP: _fsdp1(Fsdp1Sharding.NO_SHARD, _WORLD, "FSDP NO_SHARD", "fsdp1-no-shard"),
        StrategyName.SHARD_GRAD_OP: _fsdp1(
            Fsdp1Sharding.SHARD_GRAD_OP, _WORLD, "FSDP SHARD_GRAD_OP", "fsdp1-shard-grad-op"
        ),
        StrategyName.ZERO3: _fsdp1(Fsdp1Sharding.FULL_SHARD, _WORLD, "FSDP FULL_SHARD", "fsdp1-full-shard"),
        StrategyName.HYBRID_SHARD: _fsdp1(
            Fsdp1Sharding.FULL_SHARD, _NODE, "FSDP HYBRID_SHARD", "fsdp1-hybrid-shard"
        ),
    },
    init=ModelInit.CPU,
    init_source="FullyShardedDataParallel docs (device_id, sync_module_states): the model on the host, "
    "moved to the GPU unit by unit as it is sharded",
    host_copy_per_node=True,
)

FSDP2 = _torch_record(
    Framework.FSDP2,
    source="torch 2.13 FSDP2 (largest rank)",
    param_layout=ParamLayout.CAST_FOR_COMPUTE,
    strategies={
        StrategyName.SHARD_GRAD_OP: _fsdp2(
            False,
            _WORLD,
            "FSDP2 no reshard",
            "fsdp2-no-reshard",
            "fully_shard(reshard_after_forward=False): gathered once per step",
        ),
        StrategyName.ZERO3: _fsdp2(
            True,
            _WORLD,
            "FSDP2 reshard",
            "fsdp2",
            "fully_shard(reshard_after_forward=True), the default: gathered again in backward",
        ),
        StrategyName.HYBRID_SHARD: _fsdp2(
            True,
            _NODE,
            "FSDP2 HSDP",
            "fsdp2-hsdp",
            "fully_shard on a 2-D mesh: sharded in the node, replicated across nodes",
        ),
    },
    init=ModelInit.META,
    init_source="fully_shard docs and torchtitan: built on the meta device, sharded, to_empty, each shard "
    "initialised",
    host_copy_per_node=True,
    tp_style=TpStyle.DTENSOR,
    sequence_parallel_default=True,
    cp_impls=(CpImpl.ALLGATHER, CpImpl.RING),
    cp_family=CpFamily.TORCH,
    pipeline=True,
    keeps_stage_output=True,
    pipeline_grad_sync=GradSync.LAST,
    fp8=Fp8Support(
        recipes=(Fp8RecipeName.TENSORWISE, Fp8RecipeName.ROWWISE, Fp8RecipeName.ROWWISE_GW_HP),
        model_code=None,
        converts="torchao 0.18 convert_to_float8_training (torchtitan v0.2.2 components/quantization/"
        "float8.py Float8LinearConverter): every nn.Linear but those whose name contains a filter_fqns entry "
        "or with a dimension not divisible by 16 (components/quantization/utils.py module_filter_fn); any "
        "model code's nn.Linear",
        all_gather="torchao 0.18 Float8LinearConfig.enable_fsdp_float8_all_gather (tensorwise only; "
        "torchtitan: not with recipe_name): FSDP2 all-gathers the fp8 weights",
        precompute_scales=True,
    ),
    optimizer_in_backward="torch 2.13 FSDP2 foreach_reduce (_fully_shard/_fsdp_collectives.py): after the "
    "reduce-scatter each sharded parameter's .grad is set and its _post_accumulate_grad_hooks called; "
    "torchtune's optimizer_in_bwd (training/memory.py register_optim_in_bwd_hooks: one optimizer per "
    "parameter, step() then zero_grad() in the hook; recipes/full_finetune_distributed.py)",
    activation_offloading="torchtune v0.6.0-rc1-220-gbd2a0fc7 recipes/full_finetune_distributed.py, "
    "lora_finetune_distributed.py and the single-device recipes (FSDP2 fully_shard, or one GPU): "
    "enable_activation_offloading wraps the model's forward in training/_activation_offloading.py "
    "OffloadActivations (get_act_offloading_ctx_manager), only with enable_activation_checkpointing",
    expert_parallel=ExpertParallel(
        dispatch="torchtitan distributed/expert_parallel.py ExpertParallel._token_dispatch: "
        "all_to_all_single_autograd",
        combine="torchtitan distributed/expert_parallel.py ExpertParallel._token_combine: "
        "all_to_all_single_autograd",
        takes_all_cp=True,
        shards_experts_on_dim1=True,
    ),
)
"""torchtitan's FSDP2: its plan always shards the norms' sequence (``SequenceParallel``); torch's
``context_parallel`` (``allgather`` the default rotate method, ``alltoall`` a ring);
torch.distributed.pipelining keeps a stage's output in its ``fwd_cache`` for ``stage_backward``
(``torch/distributed/pipelining/stage.py``) and turns FSDP2's gradient sync off for every micro-batch's
backward, reducing after the last (``backward_maybe_with_nosync``); its stages are separate modules, so a
tied embedding's two copies are not kept equal; experts over ``expert_parallel_degree``
(``distributed/parallel_dims.py``)."""

TORCH_ZERO1 = _torch_record(
    Framework.TORCH_ZERO1,
    source="torch 2.13 DDP",
    param_layout=ParamLayout.AUTOCAST,
    strategies={
        StrategyName.DDP: _DDP,
        StrategyName.ZERO1: FrameworkSetup(
            title="DDP + ZeRO-1",
            legend="DistributedDataParallel with torch's ZeroRedundancyOptimizer",
            torch=TorchSetup(wrapper=TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER, validate_name="zero1"),
            schedule=(_DDP_ALL_REDUCE, _ZERO1_BROADCASTS),
            schedule_source=f"{_TORCH} DDP + ZeroRedundancyOptimizer",
        ),
    },
    init=ModelInit.CPU,
    init_source=_DDP_INIT,
)

DDP = _torch_record(
    Framework.DDP,
    source="torch 2.13 DDP",
    param_layout=ParamLayout.AUTOCAST,
    strategies={StrategyName.DDP: _DDP._replace(torch=_DDP_TORCH._replace(validate_name=None))},
    init=ModelInit.CPU,
    init_source=_DDP_INIT,
)
