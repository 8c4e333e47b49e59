"""Megatron-LM's distributed optimizer: bf16 parameters, fp32 main gradients, 12/d bytes of fp32 master
and Adam state per parameter (``megatron/core/optimizer/distrib_optimizer.py``), its own layers,
Transformer Engine's context parallelism, its pipeline schedules and token dispatcher."""

from __future__ import annotations

from zerocalc.base.dtypes import DType
from zerocalc.model.activations import CpImpl
from zerocalc.model.code import ModelImplName
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import Calls, GradSync, Padding, Phase, Repeat, Tensor
from zerocalc.parallel.framework_records.paper import MEGATRON_EXPERT_PARALLEL, MEGATRON_LATENT_ATTENTION
from zerocalc.parallel.framework_records.record import (
    CpFamily,
    Fp8Support,
    FrameworkRecord,
    ModelInit,
    StatesModel,
)
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import TpStyle
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import Fp8RecipeName, PrecisionName
from zerocalc.parallel.strategies import FrameworkSetup, OffloadTarget, StrategyName, schedule_line

_AR, _RS, _AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER
_BUFFER = "core/distributed/param_and_grad_buffer.py"
_SCHEDULE_SOURCE = f"Megatron-LM {_BUFFER}"
_ONE_BUCKET = (
    "one bucket per buffer without --overlap-grad-reduce (distributed_data_parallel.py: bucket_size None), "
    "the dense parameters' buffer and the experts' apart; with it buckets of max(40M, 1M·dp) parameters"
)

BUCKET_ELEMENTS_LEAST = 40_000_000
BUCKET_ELEMENTS_PER_RANK = 1_000_000
"""Megatron-LM ``core/distributed/distributed_data_parallel.py`` ``DistributedDataParallel.__init__``: with
``overlap_grad_reduce`` and no ``bucket_size`` given, ``bucket_size = max(40000000, 1000000 *
dp_group.size())`` elements (larger buckets on larger groups keep NCCL's ring chunks bandwidth-bound);
without it ``bucket_size = None``, one bucket per buffer."""


def bucket_elements(overlap_grad_reduce: bool, group_size: int) -> int:
    """Elements per gradient bucket of a data-parallel group of ``group_size`` ranks (0: one bucket)."""
    return max(BUCKET_ELEMENTS_LEAST, BUCKET_ELEMENTS_PER_RANK * group_size) if overlap_grad_reduce else 0


OVERLAP_GRAD_REDUCE = (
    "--overlap-grad-reduce: each bucket's reduction issued on the last micro-batch as soon as backward has "
    "produced its gradients (param_and_grad_buffer.py _ParamAndGradBucketGroup.register_grad_ready -> "
    "start_grad_sync, async_op on the communication stream), waited for after backward "
    "(finish_grad_sync): it hides behind the rest of that backward; the last bucket's is exposed"
)
OVERLAP_PARAM_GATHER = (
    "--overlap-param-gather (with --overlap-grad-reduce and the distributed optimizer, arguments.py): no "
    "all-gather after the step; the next forward's first module's pre-hook dispatches its bucket's "
    "all-gather and, once it has arrived, the next bucket's (distributed_data_parallel.py "
    "_make_forward_pre_hook, param_and_grad_buffer.py finish_param_sync: next_param_gather_bucket_group): "
    "the first bucket's gather is exposed, each other hides behind the forward of the bucket before it"
)
TP_COMM_OVERLAP = (
    "--tp-comm-overlap (with --sequence-parallel, arguments.py): Transformer Engine's userbuffers "
    "(transformer_engine/pytorch/module/base.py initialize_ub) run each layer's tensor-parallel "
    "collectives beside its GEMMs: ring_exchange for qkv_fprop, fc1_fprop (all-gathers) and proj_dgrad, "
    "fc2_dgrad, in t chunks on the copy engines; pipeline for proj_fprop, fc2_fprop (reduce-scatters), in "
    "4 chunks; bulk for qkv_dgrad/wgrad, fc1_dgrad/wgrad (the input all-gather and the gradient "
    "reduce-scatter beside the dgrad and wgrad GEMMs); the embedding, the LM head and the loss's "
    "collectives are not Transformer Engine layers and stay on the critical path"
)
_DISTRIBUTED_OPTIMIZER = FrameworkSetup(
    grad_sync=GradSync.LAST,
    schedule=(
        schedule_line(
            _RS,
            Phase.BACKWARD,
            Tensor.GRADIENTS,
            RankGroup.WORLD,
            Repeat.PER_SYNC,
            "_ParamAndGradBucketGroup.start_grad_sync: reduce_scatter_tensor of each bucket's grad_data (the "
            f"fp32 main gradients) over the data-parallel group, on the last micro-batch (no_sync before); "
            f"{_ONE_BUCKET}",
            padding=Padding.MEGATRON_BUFFER,
            calls=Calls.MEGATRON_BUCKET,
        ),
        schedule_line(
            _AG,
            Phase.AFTER_STEP,
            Tensor.PARAMETERS,
            RankGroup.WORLD,
            Repeat.PER_STEP,
            "_ParamAndGradBucketGroup.start_param_sync: all_gather_into_tensor of each bucket's param_data "
            "(the 16-bit parameters the distributed optimizer updated) after the step, bucket by bucket; "
            "with --overlap-param-gather in the next forward",
            padding=Padding.MEGATRON_BUFFER,
            calls=Calls.MEGATRON_BUCKET,
        ),
    ),
    schedule_source=_SCHEDULE_SOURCE,
)
_ALL_REDUCE = FrameworkSetup(
    grad_sync=GradSync.LAST,
    schedule=(
        schedule_line(
            _AR,
            Phase.BACKWARD,
            Tensor.GRADIENTS,
            RankGroup.WORLD,
            Repeat.PER_SYNC,
            "_ParamAndGradBucketGroup.start_grad_sync: all_reduce of each bucket's grad_data (the fp32 main "
            f"gradients) without the distributed optimizer, unpadded, on the last micro-batch; {_ONE_BUCKET}",
            calls=Calls.MEGATRON_BUCKET,
        ),
    ),
    schedule_source=_SCHEDULE_SOURCE,
)

MEGATRON = FrameworkRecord(
    framework=Framework.MEGATRON,
    source="Megatron-LM distributed optimizer (bf16 params, fp32 main grads, Adam)",
    states=StatesModel.MEGATRON_DISTRIBUTED_OPTIMIZER,
    strategies={
        StrategyName.DDP: _ALL_REDUCE,
        StrategyName.ZERO1: _DISTRIBUTED_OPTIMIZER,
    },
    main_grad_dtype=DType.FP32,
    fused_optimizer=True,
    model_code=ModelImplName.MEGATRON,
    needs_architecture=False,
    init=ModelInit.GPU,
    init_source="Megatron-LM initialises each rank's parameters on its GPU in params_dtype (its CPU "
    "initialisation option off by default)",
    init_in_param_dtype=True,
    precisions=(PrecisionName.BF16_MIXED, PrecisionName.FP16_MIXED),
    optimizers=(OptimizerName.ADAM, OptimizerName.ADAMW),
    fp32_grad_accum=False,
    offload_optimizer=(OffloadTarget.NONE, OffloadTarget.CPU),
    offload_params=(OffloadTarget.NONE,),
    offload_source="Megatron-Core optimizer CPU offload (optimizer_cpu_offload, optimizer_offload_fraction "
    "1.0, use_precision_aware_optimizer; megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py)",
    offload_optimizer_step="Adam on the host (Megatron-Core HybridDeviceOptimizer)",
    offload_moves="the fp32 master copy, Adam's m and v and a copy of the main gradients on the host; the "
    "16-bit parameters and the fp32 main gradients stay on the GPU (the peak; this table is the paper's)",
    accepts="mixed-precision Adam; accepted: {precision} bf16-mixed or fp16-mixed with {optimizer} "
    "adam/adamw (or {framework} paper)",
    tp_style=TpStyle.MEGATRON,
    cp_impls=(CpImpl.RING, CpImpl.ALLGATHER, CpImpl.ULYSSES),
    cp_family=CpFamily.TRANSFORMER_ENGINE,
    pipeline=True,
    pipeline_ties_embedding=True,
    expert_parallel=MEGATRON_EXPERT_PARALLEL,
    latent_attention_tp=MEGATRON_LATENT_ATTENTION,
    fp8=Fp8Support(
        recipes=(Fp8RecipeName.DELAYED, Fp8RecipeName.CURRENT, Fp8RecipeName.BLOCKWISE, Fp8RecipeName.MXFP8),
        model_code=None,
        converts="Megatron-LM --fp8-format/--fp8-recipe (core/fp8_utils.py get_fp8_recipe: delayed, "
        "tensorwise = TE Float8CurrentScaling, blockwise, mxfp8): every Transformer Engine Linear of its "
        "decoder layers; the output layer and embeddings stay high precision",
        all_gather="Megatron-LM --fp8-param-gather (distributed optimizer only, arguments.py): fp8 "
        "parameters, gathered in fp8",
        all_gather_keeps_fp8_params=True,
        model_init=True,
        skip_default=("output",),
    ),
)
"""Megatron-LM's ``main_grad`` is the fp32 buffer backward accumulates gradients into and the data-parallel
ranks reduce (``megatron/training/arguments.py``: ``--bf16`` forces ``accumulate_allreduce_grads_in_fp32``,
which ``DistributedDataParallelConfig.grad_reduce_in_fp32`` follows); its Adam is Transformer Engine's /
apex's ``FusedAdam`` (``megatron/core/optimizer/__init__.py``); it runs only its own layers
(``core/tensor_parallel/layers.py``: the vocabulary padded to a multiple of 128·t); Transformer Engine's
context parallelism (``--cp-comm-type p2p|all_gather|a2a``); ``--sequence-parallel`` off unless asked; a
pipeline stage frees its output's storage once sent (``deallocate_output_tensor``,
``deallocate_pipeline_outputs``), keeping only its ``grad_fn``; a tied embedding's copies on the first and
last stage are kept equal by its embedding group."""
