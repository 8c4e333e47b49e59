"""The framework record: everything one framework decides, in one place.

A :class:`FrameworkRecord` says which strategies a framework runs and how (its :class:`~zerocalc.parallel.
strategies.FrameworkSetup` per strategy: the collectives it issues, whether it fixes when gradients are
reduced, its PyTorch set-up), whose accounting its model states follow (:class:`StatesModel`), how it keeps
parameters under mixed precision (:class:`~zerocalc.parallel.precision.ParamLayout`, and its own
main-gradient dtype), how it creates the model, which mesh dimensions it composes (tensor parallelism and
whose layers, sequence parallelism by default, context-parallel implementations, pipeline stages and what a
stage keeps, expert parallelism), what it accepts (precisions, optimizers, offload) and its sources. Every
check and every model reads the record; adding a framework is adding one record
(:mod:`zerocalc.parallel.framework_records`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.model.activations import CpImpl
from zerocalc.model.code import ModelImplName
from zerocalc.network.schedule import GradSync, ScheduledCollective
from zerocalc.parallel.frameworks import Framework, TorchSetup
from zerocalc.parallel.mesh import TpStyle
from zerocalc.parallel.optimizers import OptimizerImpl, OptimizerName
from zerocalc.parallel.precision import (
    Fp8RecipeName,
    Fp8Use,
    ParamKind,
    ParamLayout,
    PrecisionName,
    TensorDtypes,
    tensor_dtypes,
)
from zerocalc.parallel.strategies import STRATEGIES, BufferRule, FrameworkSetup, OffloadTarget, StrategyName


class Wrap(StrEnum):
    BLOCK = "block"
    """One FSDP/ZeRO-3 unit per transformer block; embeddings and head in the root unit."""
    MODEL = "model"
    """The whole model is one unit: gathered whole, so ZeRO-3 saves nothing at the peak."""


class ModelInit(StrEnum):
    """How the model is created on each rank before its first step (``--init``)."""

    META = "meta"
    """Built on the meta device, sharded, then ``to_empty`` and each rank's shard initialised (FSDP2's
    large-model path, torchtitan; DeepSpeed ``zero.Init``): no whole-model tensor on the GPU."""
    GPU = "gpu"
    """The whole model materialised on every GPU in fp32 (``from_config``), then sharded."""
    CPU = "cpu"
    """Built or loaded on the host (``from_pretrained``), then moved to the GPU unit by unit as it is
    sharded, or whole where nothing is sharded."""


class StatesModel(StrEnum):
    """How a framework's model states are counted (and which buffers come with them)."""

    PAPER = "paper"
    """ZeRO paper §5 (:mod:`zerocalc.states.memory`), plus each strategy's buffer rule."""
    DEEPSPEED_ESTIMATOR = "deepspeed_estimator"
    """DeepSpeed's ``estimate_zero2/zero3_model_states_mem_needs`` (:mod:`zerocalc.states.deepspeed`)."""
    MEGATRON_DISTRIBUTED_OPTIMIZER = "megatron_distributed_optimizer"
    """Megatron-LM: bf16 params + fp32 main grads + 12/d bytes of optimizer state (no buffers counted;
    :mod:`zerocalc.states.megatron`)."""
    TORCH_EXACT = "torch_exact"
    """PyTorch's real per-rank allocations (:mod:`zerocalc.states.framework`) and its own buffers."""


class CpFamily(StrEnum):
    """Whose context-parallel attention a framework runs."""

    TRANSFORMER_ENGINE = "transformer_engine"
    """Transformer Engine's ``DotProductAttention`` (``cp_comm_type``), Megatron-LM's."""
    TORCH = "torch"
    """torch's ``context_parallel`` (``torch/distributed/tensor/experimental/_attention.py``),
    torchtitan's."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed's Ulysses ``DistributedAttention`` (``deepspeed/sequence/layer.py``)."""


class ExpertParallel(NamedTuple):
    """How a framework runs expert parallelism: the code its token dispatch and combine follow, and how its
    expert groups are carved."""

    dispatch: str
    """The call that sends routed tokens to their experts (its source)."""
    combine: str
    """The call that brings the experts' outputs back."""
    takes_all_cp: bool = False
    """The EP group takes all of the context-parallel ranks (torchtitan ``ParallelDims``: ep % cp == 0)."""
    shards_experts_on_dim1: bool = False
    """Where the dp·c ranks outnumber the experts the routed experts are sharded on dim 1, evenly only
    (torchtitan ``apply_fsdp``: ``Shard(1)``; FSDP2 refuses uneven shards of a dimension other than 0)."""
    expert_tensor_parallel: str | None = None
    """Where its MoE layers run under tensor parallelism, with an expert-tensor-parallel size of their own:
    the dispatcher's all-gather of the received tokens over the expert-tensor-parallel group and its
    reduce-scatter before the combine (its source). None: MoE under TP is not modelled (the model codes of
    torchtitan and transformers refuse MoE with TP, :func:`~zerocalc.model.code.parallel.
    dense_plan_unsupported`)."""


class Fp8Support(NamedTuple):
    """Which FP8 recipes a framework runs, whose Linear layers run them and how it keeps their weights."""

    recipes: tuple[Fp8RecipeName, ...]
    model_code: ModelImplName | None
    """The model code whose Linear layers it can convert (None: any it runs)."""
    converts: str
    """Which layers it converts and who converts them (its source)."""
    all_gather: str
    """What ``--fp8-all-gather`` is under it (its source)."""
    all_gather_keeps_fp8_params: bool = False
    """Its FP8 parameter gather keeps the parameters themselves in FP8 (Megatron-LM ``argument_utils.py``:
    ``fp8_param = args.fp8_param_gather``, TE's ``quantized_model_init``), so ``--fp8-model-init`` comes
    with it."""
    model_init: bool = False
    """``--fp8-model-init``: it can keep only the FP8 weights."""
    precompute_scales: bool = False
    """``--fp8-precompute-scales``: it can compute every weight's scale in one all-reduce after the step."""
    skip_default: tuple[str, ...] = ()
    """The modules it leaves in high precision unless told (``--fp8-skip``)."""


class FrameworkRecord(NamedTuple):
    framework: Framework
    source: str
    """Whose accounting or implementation the estimates follow (framework, version)."""
    states: StatesModel
    strategies: dict[StrategyName, FrameworkSetup]
    """The strategies it implements, and how (in :class:`~zerocalc.parallel.strategies.StrategyName`
    order)."""
    init: ModelInit
    """How a sharded job of this framework creates its model when ``--init`` is not given: its documented
    path (:attr:`init_source`)."""
    init_source: str
    param_layout: ParamLayout = ParamLayout.MASTER_COPY
    main_grad_dtype: DType | None = None
    """The gradients backward leaves for the optimizer, where the framework fixes them (None: the layout's
    for the recipe)."""
    fused_optimizer: bool = False
    """Its Adam is one fused kernel whatever ``--optimizer-impl`` says."""
    model_code: ModelImplName | None = None
    """The only model code it runs (None: ``--model-impl``)."""
    estimate_covers_states_only: bool = False
    """The framework's own estimate counts model states (and its own buffer term) only: every other line
    is marked as outside it (DeepSpeed)."""
    precisions: tuple[PrecisionName, ...] = tuple(PrecisionName)
    optimizers: tuple[OptimizerName, ...] = tuple(OptimizerName)
    fp32_grad_accum: bool = True
    offload_optimizer: tuple[OffloadTarget, ...] = tuple(OffloadTarget)
    """Where its memory model can put the optimizer (``--offload-optimizer``; the strategy's rule applies
    too)."""
    offload_params: tuple[OffloadTarget, ...] = tuple(OffloadTarget)
    """Where its memory model can put the parameters (``--offload-params``)."""
    offload_source: str = "ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity for NVMe"
    """Whose offload it models."""
    offload_moves: str = (
        "master copy and optimizer states move off the GPU, and so do partitioned gradients, which the "
        "host-side optimizer step consumes"
    )
    """What an offloaded optimizer takes off the GPU, and what stays."""
    offload_optimizer_step: str = "CPU Adam (DeepSpeedCPUAdam)"
    """Which optimizer steps an offloaded optimizer on the host (DeepSpeed 0.19.8 ``runtime/engine.py``
    ``_configure_basic_optimizer``: Adam/AdamW with ZeRO offload is ``deepspeed/ops/adam/cpu_adam.py``
    ``DeepSpeedCPUAdam``, ZeRO-Offload's CPU-Adam, Ren et al. 2021 §4.2)."""
    wrap_model: bool = True
    moe: bool = True
    accepts: str = ""
    """What the record accepts, for the message when a request asks for something else."""
    needs_architecture: bool = True
    """Its model states need the architecture (the PyTorch frameworks count each tensor); False: the
    parameter count is enough (its strategies may still need more)."""
    init_in_param_dtype: bool = False
    """``--init gpu`` allocates the parameters in the compute dtype, not fp32 (Megatron-LM's
    ``params_dtype``)."""
    host_copy_per_node: bool = False
    """``--init cpu`` holds one host copy of the model per node (the node's first rank loads it, the others
    receive it: accelerate's ``cpu_ram_efficient_loading``, FSDP ``sync_module_states``); else every rank
    builds its own."""
    tp_style: TpStyle | None = None
    """Whose layers its tensor parallelism uses (None: it composes no tensor parallelism here)."""
    sequence_parallel_default: bool = False
    """Sequence parallelism when ``--sequence-parallel`` is not given (with TP and a model code that has
    it)."""
    cp_impls: tuple[CpImpl, ...] = ()
    """The context-parallel implementations it has, its default first (none: no context parallelism)."""
    cp_family: CpFamily | None = None
    """Whose context-parallel attention it runs."""
    pipeline: bool = False
    """It composes pipeline parallelism with its data parallelism."""
    keeps_stage_output: bool = False
    """A pipeline stage's output stays allocated from its send to its backward."""
    pipeline_grad_sync: GradSync | None = None
    """When its pipeline schedule reduces gradients, whatever the training loop (None: as the loop says)."""
    pipeline_ties_embedding: bool = False
    """It keeps a tied embedding's two copies equal across the first and last pipeline stages (an
    all-reduce of its gradient over the embedding group)."""
    expert_parallel: ExpertParallel | None = None
    """How it runs expert parallelism (None: it has none here)."""
    latent_attention_tp: str = ""
    """The code that runs multi-head latent attention under its tensor parallelism, as read (the schedule:
    :mod:`zerocalc.comm.mesh`); empty: latent attention under tensor parallelism is not modelled for it."""
    fp8: Fp8Support | None = None
    """The FP8 recipes it runs (None: none)."""
    optimizer_in_backward: str = ""
    """Where its code runs a parameter's post-accumulate-grad hooks once the gradient it keeps is ready, so
    that the optimizer can step in backward and free it (``--optimizer-in-backward``, torchtune's
    ``optimizer_in_bwd``); empty: it does not (its own optimizer step, or hooks before its reduction)."""
    activation_offloading: str = ""
    """The code that offloads the forward's saved tensors to the host under it, as read
    (``--offload-activations``: torchtune's ``OffloadActivations``, :mod:`zerocalc.request.savers`); empty:
    none of its recipes does."""

    # ------------------------------------------------------------------------------------- strategies
    def setup(self, strategy: StrategyName) -> FrameworkSetup:
        """How it runs ``strategy`` (a KeyError where it does not)."""
        return self.strategies[strategy]

    def runs(self, strategy: StrategyName) -> bool:
        return strategy in self.strategies

    def title_of(self, strategy: StrategyName) -> str:
        """What it calls ``strategy``, for tables: its own short title, else the strategy's."""
        setup = self.strategies.get(strategy)
        return (setup.title if setup and setup.title else None) or STRATEGIES[strategy].title

    def legend_of(self, strategy: StrategyName) -> str | None:
        setup = self.strategies.get(strategy)
        return setup.legend if setup else None

    def schedule_of(self, strategy: StrategyName) -> tuple[ScheduledCollective, ...]:
        """The collectives it issues for ``strategy``: its own schedule, else the ZeRO paper's."""
        setup = self.strategies[strategy]
        return STRATEGIES[strategy].schedule if setup.schedule is None else setup.schedule

    def torch_setup(self, strategy: StrategyName) -> TorchSetup | None:
        """The PyTorch wrapper and options of ``strategy`` (None for a framework that is not PyTorch's)."""
        return self.strategies[strategy].torch

    @property
    def has_own_schedules(self) -> bool:
        """Some strategy issues its own collectives (split by units, buckets or parameters), not the
        paper's one flat array."""
        return any(setup.schedule is not None for setup in self.strategies.values())

    def reads_prefetch(self, strategy: StrategyName) -> bool:
        """Its memory model of ``strategy`` reads ``--prefetch`` (the paper's units gathered ahead)."""
        return self.states is StatesModel.PAPER and STRATEGIES[strategy].buffers is BufferRule.GATHERED_UNITS

    # -------------------------------------------------------------------------------------- precision
    def dtypes(
        self,
        precision: PrecisionName,
        reduce: DType | None = None,
        kind: ParamKind = ParamKind.TRAINABLE,
        fp8: Fp8Use | None = None,
    ) -> TensorDtypes:
        """Every tensor role's dtype under ``precision`` as this framework keeps it (the precision record,
        :func:`~zerocalc.parallel.precision.tensor_dtypes`), ``reduce`` as ``--reduce-dtype``, ``fp8`` the FP8
        recipe of a Linear weight it converts."""
        return tensor_dtypes(precision, self.param_layout, self.main_grad_dtype, reduce, kind, fp8=fp8)

    def optimizer_impl(self, asked: OptimizerImpl) -> OptimizerImpl:
        """How its Adam runs its step: fused where the framework fuses it, else as asked."""
        return OptimizerImpl.FUSED if self.fused_optimizer else asked

    # ------------------------------------------------------------------------------------------ mesh
    @property
    def default_cp_impl(self) -> CpImpl:
        """The context-parallel implementation it runs when ``--cp-impl`` is not given."""
        return self.cp_impls[0] if self.cp_impls else CpImpl.RING

    @property
    def layers_tp_style(self) -> TpStyle:
        """Whose layers its tensor parallelism uses (Megatron's where it composes none)."""
        return self.tp_style or TpStyle.MEGATRON

    @property
    def is_torch(self) -> bool:
        """Its estimates are PyTorch's real per-rank allocations."""
        return self.states is StatesModel.TORCH_EXACT
