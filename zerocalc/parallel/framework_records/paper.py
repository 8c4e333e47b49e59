"""The ZeRO paper's accounting (Rajbhandari et al. 2020, §5 model states, §7 communication), with FSDP's
unit-by-unit gathering for buffers: the reference every framework is compared with."""

from __future__ import annotations

from zerocalc.model.activations import CpImpl
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.framework_records.record import (
    CpFamily,
    ExpertParallel,
    FrameworkRecord,
    ModelInit,
    StatesModel,
)
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import TpStyle
from zerocalc.parallel.strategies import FrameworkSetup, StrategyName

MEGATRON_MOE = "Megatron-LM core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher"
"""Megatron-LM's all-to-all token dispatcher (``--moe-token-dispatcher-type alltoall``; ``all_to_all`` of
``core/tensor_parallel/mappings.py`` over the EP group), which the paper's accounting follows too."""
MEGATRON_EXPERT_PARALLEL = ExpertParallel(
    dispatch=f"{MEGATRON_MOE}.token_dispatch",
    combine=f"{MEGATRON_MOE}.token_combine",
    expert_tensor_parallel=f"{MEGATRON_MOE} (Megatron-LM core 0.20.0, d98e8a6): dispatch_postprocess "
    "gather_from_sequence_parallel_region and combine_preprocess reduce_scatter_to_sequence_parallel_region "
    "over pg_collection.expt_tp",
)

MEGATRON_LATENT_ATTENTION = (
    "Megatron-LM core/transformer/multi_latent_attention.py MLASelfAttention (d98e8a6, core_v0.15.0rc7-2333) "
    "with the Transformer Engine layer spec (models/gpt/gpt_layer_specs.py): the q/kv down projections "
    "duplicated TELinear, the q/kv norms fused into the column-parallel up projections"
)
"""Megatron-LM's multi-head latent attention under tensor parallelism (:data:`zerocalc.comm.mesh.
TP_LATENT_FORWARD`), which the paper's accounting follows too."""


def paper_setup(grad_sync: GradSync, **fields: object) -> FrameworkSetup:
    """The ZeRO paper's accounting of a strategy: its §7 schedule, which fixes when gradients are reduced."""
    return FrameworkSetup(grad_sync=grad_sync, **fields)  # type: ignore[arg-type]


_EVERY, _LAST = GradSync.EVERY, GradSync.LAST

PAPER = FrameworkRecord(
    framework=Framework.PAPER,
    source="ZeRO paper (Rajbhandari et al. 2020) §5; FSDP docs for units",
    states=StatesModel.PAPER,
    strategies={
        StrategyName.DDP: paper_setup(_LAST),
        StrategyName.ZERO1: paper_setup(_LAST),
        StrategyName.ZERO2: paper_setup(_EVERY),
        StrategyName.SHARD_GRAD_OP: paper_setup(_EVERY, in_default_set=False),
        StrategyName.ZERO3: paper_setup(_EVERY),
        StrategyName.HYBRID_SHARD: paper_setup(_EVERY),
    },
    init=ModelInit.META,
    init_source="the ZeRO paper counts model states only: creation allocates no more than them",
    needs_architecture=False,
    tp_style=TpStyle.MEGATRON,
    cp_impls=tuple(CpImpl),
    cp_family=CpFamily.TRANSFORMER_ENGINE,
    pipeline=True,
    pipeline_ties_embedding=True,
    expert_parallel=MEGATRON_EXPERT_PARALLEL,
    latent_attention_tp=MEGATRON_LATENT_ATTENTION,
)
"""The paper composes every mesh dimension as Megatron-LM lays it out (its layers, Transformer Engine's
context parallelism, its pipeline schedules and token dispatcher)."""
