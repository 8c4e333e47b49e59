"""DeepSpeed 0.19.8: ZeRO stages 1-3 (and ZeRO++) as its code issues their collectives, and its own
estimators of model states (``estimate_zero2/zero3_model_states_mem_needs``).

DeepSpeed config docs: ``offload_optimizer`` is valid for ZeRO stages 1, 2 and 3; NVMe offload of
optimizer states and any offload of parameters need stage 3 (ZeRO-Infinity, Rajbhandari et al. 2021).
"""

from __future__ import annotations

from zerocalc.model.activations import CpImpl
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import (
    Calls,
    GradSync,
    Padding,
    Phase,
    Quantization,
    Repeat,
    Select,
    Tensor,
    ZeroPP,
)
from zerocalc.parallel.framework_records.record import (
    CpFamily,
    ExpertParallel,
    FrameworkRecord,
    ModelInit,
    StatesModel,
)
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import TpStyle
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.parallel.strategies import FrameworkSetup, StrategyName, schedule_line

_AR, _RS, _AG, _A2A = (
    Collective.ALL_REDUCE,
    Collective.REDUCE_SCATTER,
    Collective.ALL_GATHER,
    Collective.ALL_TO_ALL,
)
_FWD, _BWD, _STEP = Phase.FORWARD, Phase.BACKWARD, Phase.AFTER_STEP
_G, _P = Tensor.GRADIENTS, Tensor.PARAMETERS
_ONCE, _EACH, _SYNC = Repeat.PER_STEP, Repeat.PER_MICRO_BATCH, Repeat.PER_SYNC
_WORLD, _NODE, _ACROSS = RankGroup.WORLD, RankGroup.NODE, RankGroup.ACROSS_NODES
_EVERY, _LAST = GradSync.EVERY, GradSync.LAST

_DS = "DeepSpeed 0.19.8"
_DS_ALL_REDUCE = (
    "stage_1_and_2.py average_tensor → allreduce_and_scatter → allreduce_bucket: with the default "
    "use_multi_rank_bucket_allreduce=True every reduce bucket is one dist.all_reduce (no reduce_scatter)"
)
_DS_AG_AFTER_STEP = schedule_line(
    _AG,
    _STEP,
    _P,
    _WORLD,
    _ONCE,
    "step → all_gather_dp_groups → all_gather_into_tensor_dp_groups (runtime/utils.py): one "
    "all_gather_into_tensor of the bit16 partitions per param group, aligned to 2N elements (one group)",
    padding=Padding.TWICE_GROUP,
)


OVERLAP_COMM_STRATEGIES = frozenset({StrategyName.ZERO1, StrategyName.ZERO2})
"""The strategies ``zero_optimization.overlap_comm`` (``--overlap-comm``) changes: off by default below
stage 3 (``DeepSpeedZeroConfig.overlap_comm_valid``), ZeRO-1/2's ``average_tensor`` then runs on the
default stream; on, on ``reduction_stream`` beside backward (``runtime/zero/stage_1_and_2.py``). ZeRO-3
overlaps by default."""


def _deepspeed_zero12(stage: int) -> FrameworkSetup:
    when = (
        "stage 1 reduces only at the accumulation boundary (reduce_ready_partitions_and_remove_grads)"
        if stage == 1
        else "stage 2 reduces in the backward hooks of every micro-batch (partition_gradients)"
    )
    return FrameworkSetup(
        schedule=(
            schedule_line(
                _AR, _BWD, _G, _WORLD, _SYNC, f"{_DS_ALL_REDUCE}; {when}", calls=Calls.DEEPSPEED_BUCKET
            ),
            _DS_AG_AFTER_STEP,
        ),
        schedule_source=f"{_DS} runtime/zero/stage_1_and_2.py",
        grad_sync=_LAST if stage == 1 else _EVERY,
        overlaps_backward=False,
    )


_DS_FETCH = (
    "PartitionedParameterCoordinator.fetch_sub_module → all_gather_coalesced: one all_gather_into_tensor "
    "per fetch of a module's partitions (prefetching may merge fetches)"
)
_QWZ = {"quantization": Quantization.INT8_BLOCKS, "quantized_by": ZeroPP.QWZ}
_DS3 = {"calls": Calls.MODULE, "padding": Padding.PER_TENSOR, **_QWZ}
_DEEPSPEED_ZERO3 = FrameworkSetup(
    schedule=(
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
        schedule_line(
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
    needs_architecture="{framework} deepspeed zero3: DeepSpeed's estimator counts 4 × the largest layer, "
    "which needs the architecture; accepted: {model} NAME or config.json",
)

_MIXED = (PrecisionName.BF16_MIXED, PrecisionName.FP16_MIXED)
_MIXED_ADAM = (
    "mixed-precision Adam; accepted: {precision} bf16-mixed or fp16-mixed with {optimizer} adam/adamw (or "
    "{framework} paper)"
)
_DEEPSPEED_MOE = "DeepSpeed deepspeed/moe/sharded_moe.py MOELayer.forward"

DEEPSPEED = FrameworkRecord(
    framework=Framework.DEEPSPEED,
    source="DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs (needs fp16/bf16 mixed Adam)",
    states=StatesModel.DEEPSPEED_ESTIMATOR,
    strategies={
        StrategyName.ZERO1: _deepspeed_zero12(1),
        StrategyName.ZERO2: _deepspeed_zero12(2),
        StrategyName.ZERO3: _DEEPSPEED_ZERO3,
    },
    estimate_covers_states_only=True,
    needs_architecture=False,
    init=ModelInit.META,
    init_source="DeepSpeed docs, Constructing Massive Models: the model built under deepspeed.zero.Init "
    "(ZeRO-3; each parameter partitioned as it is created)",
    fused_optimizer=True,
    precisions=_MIXED,
    optimizers=(OptimizerName.ADAM, OptimizerName.ADAMW),
    fp32_grad_accum=False,
    accepts=_MIXED_ADAM,
    tp_style=TpStyle.MEGATRON,
    cp_impls=(CpImpl.ULYSSES,),
    cp_family=CpFamily.DEEPSPEED,
    keeps_stage_output=True,
    expert_parallel=ExpertParallel(
        dispatch=f"{_DEEPSPEED_MOE}: _AllToAll of dispatched_input",
        combine=f"{_DEEPSPEED_MOE}: _AllToAll of expert_output",
    ),
)
"""DeepSpeed trains Megatron-DeepSpeed's tensor-parallel layers and Ulysses' context parallelism
(``DistributedAttention``); its Adam is ``deepspeed.ops.adam.FusedAdam``; its pipeline engine keeps a
stage's outputs in ``pipe_buffers['outputs']`` (``deepspeed/runtime/pipe/engine.py``) but runs ZeRO-1 at most
("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), so ``--framework deepspeed`` composes no
pipeline here; DeepSpeed-MoE (``ep_size``, ``deepspeed/utils/groups.py``)."""
