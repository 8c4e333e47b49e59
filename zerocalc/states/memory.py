"""Per-GPU bytes of model states (parameters, gradients, optimizer states) under each strategy.

Model (ZeRO paper, Rajbhandari et al. 2020, section 5, Figure 1 and Table 1): with Ψ parameters, N
data-parallel ranks, b_p bytes per compute parameter, b_g per gradient and K bytes of optimizer state,

==============================  ========  ========  ========
strategy                        params    grads     optimizer
==============================  ========  ========  ========
DDP (FSDP NO_SHARD)             b_p·Ψ     b_g·Ψ     K·Ψ
ZeRO-1 (P_os)                   b_p·Ψ     b_g·Ψ     K·Ψ/N
ZeRO-2, FSDP SHARD_GRAD_OP      b_p·Ψ     b_g·Ψ/N   K·Ψ/N
ZeRO-3, FSDP FULL_SHARD         b_p·Ψ/N   b_g·Ψ/N   K·Ψ/N
FSDP HYBRID_SHARD               b_p·Ψ/g   b_g·Ψ/g   K·Ψ/g
==============================  ========  ========  ========

A shard is whole elements: the largest rank holds ceil(Ψ/d) of a tensor split over d ranks, and the
figures are that rank's. Under expert parallelism of degree e a rank's parameters are two parts, each
sharded over its own group (:func:`state_parts`): the routed experts it holds (E/e of each layer's) over
the dp·c/e expert-data-parallel ranks, everything else over the dp·c ranks as without it (Megatron-LM's
distributed optimizer over ``expert_data_parallel_group``, torchtitan's FSDP2 of the experts over
``dp_shard_mod_ep``, DeepSpeed-MoE's ZeRO over ``expert_data_parallel_group``), one row per part.
Offload follows ZeRO-Offload (Ren et al. 2021, section 4): the optimizer step
runs on the host, so the fp32 states *and the gradient partitions* it consumes leave the GPU (gradients
only where they are partitioned, i.e. ZeRO-2/3); ZeRO-Infinity (Rajbhandari et al. 2021) adds NVMe for
optimizer states and parameters under ZeRO-3. Bytes are exact integers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import StrEnum
from fractions import Fraction
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from zerocalc.base.display import TableDisplay
from zerocalc.base.dtypes import DType
from zerocalc.base.parts import Part
from zerocalc.base.units import ceil_div, format_count, gib, plural, summary_repr
from zerocalc.model.architecture import ParameterCount, ParamTensor, expert_parameters
from zerocalc.model.quantized import Part as QuantPart
from zerocalc.network.cluster import Cluster, RankGroup
from zerocalc.parallel.finetune import (
    TRAINED_KINDS,
    FineTuneCounts,
    FineTuning,
    finetune_counts,
    finetune_tensor_dtypes,
    parameter_kinds,
    quantized_storage,
)
from zerocalc.parallel.framework_records.record import StatesModel
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchWrapper
from zerocalc.parallel.mesh import Mesh, describe_layer_counts
from zerocalc.parallel.optimizers import BNB_QMAP_BYTES, OPTIMIZERS, OptimizerName, OptimizerSpec
from zerocalc.parallel.pipeline import mesh_stage_layers, stage_layer_counts
from zerocalc.parallel.precision import (
    RECIPES,
    ParamKind,
    ParamLayout,
    PrecisionName,
    TensorDtypes,
    describe_layout,
)
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, Strategy, StrategyName, row_named
from zerocalc.request.echo import RequestEcho
from zerocalc.request.options import OptionsEcho
from zerocalc.request.training import TrainingRequest
from zerocalc.states.fp8 import te_param_parts

SCHEMA_VERSION = 2
GRAD_ACCUM_DTYPE = DType.FP32
"""``--fp32-grad-accum``: the gradient-accumulation buffer's dtype."""


class Location(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    NVME = "nvme"
    UNIFIED = "unified"
    """CUDA unified memory (``cudaMallocManaged``: bitsandbytes' paged optimizer states), outside PyTorch's
    caching allocator: on the GPU while in use, paged to the host under memory pressure."""


class StateKind(StrEnum):
    PARAMS = "params"
    """The trained parameters (all of them without fine-tuning)."""
    FROZEN = "frozen"
    """Fine-tuning: the frozen parameters kept in a dtype (the base of a PEFT model, frozen modules)."""
    QUANTIZED = "quantized"
    """Fine-tuning: the quantised weights' storage, part by part (:mod:`zerocalc.model.quantized`)."""
    GRADS = "grads"
    GRAD_ACCUM = "grad_accum"
    OPTIMIZER = "optimizer"


class StateShard(BaseModel):
    """One kind of model state as held by the largest rank."""

    kind: StateKind
    location: Location
    shard_ranks: int = Field(description="d: ranks the state is partitioned over (1 = replicated)")
    elements: int = Field(description="parameter elements this rank holds: ceil(Ψ/d)")
    padding_elements: int = Field(description="d·ceil(Ψ/d) − Ψ: elements added so every shard is equal")
    bytes: int
    parts: dict[str, int] = Field(description="bytes of each tensor making up this state")
    experts: bool = Field(
        default=False,
        description="the routed experts' part under expert parallelism, sharded over the expert-data-"
        "parallel ranks (shown only when true; the other part is everything else)",
    )

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``experts`` only where it is true: without expert parallelism the record is as it always was."""
        data = handler(self)
        if not self.experts:
            data.pop("experts", None)
        return data


class StrategyMemory(BaseModel):
    strategy: StrategyName
    title: str
    states: list[StateShard]
    gpu_bytes: int = Field(description="model-state bytes on each GPU")
    cpu_bytes_per_gpu: int
    nvme_bytes_per_gpu: int
    unified_bytes_per_gpu: int = Field(
        default=0, description="paged optimizer states in CUDA unified memory, outside the GPU's total"
    )
    cpu_bytes_per_node: int
    nvme_bytes_per_node: int
    fraction_of_ddp: float = Field(description="gpu_bytes / DDP's gpu_bytes for the same recipe")
    fits: bool | None = Field(default=None, description="gpu_bytes <= states_capacity_bytes, when given")
    headroom_bytes: int | None = Field(
        default=None, description="states_capacity_bytes − gpu_bytes, when a GPU memory is given"
    )

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``unified_bytes_per_gpu`` only where there are such bytes (paged optimizer states)."""
        data = handler(self)
        if not self.unified_bytes_per_gpu:
            data.pop("unified_bytes_per_gpu", None)
        return data

    def bytes_of(self, kind: StateKind) -> int:
        """Bytes of one state kind on this rank's GPU (0 when offloaded or absent)."""
        return sum(s.bytes for s in self.states if s.kind is kind and s.location is Location.GPU)


class BytesPerParameter(BaseModel):
    """The recipe in the ZeRO paper's notation."""

    b_p: int = Field(description="bytes per compute parameter")
    b_g: int = Field(description="bytes per gradient")
    k: float = Field(description="K: optimizer-state bytes per parameter (master copy included)")
    grad_accum: int = Field(
        description="bytes per parameter of an fp32 gradient-accumulation buffer (0: none)"
    )


class MemoryRequest(RequestEcho):
    """The request as the model-state estimate echoes it in its JSON."""

    SOURCES: ClassVar[dict[str, str]] = {
        "params": "model.params",
        "rank_params": "rank_model.params",
        "context_bytes": "runtime.context_bytes",
    }

    params: int = Field(gt=0, description="Ψ: parameter count")
    rank_params: int = Field(
        gt=0,
        description="Ψ_t: what one tensor-parallel rank holds (Ψ at tp 1); with pipeline stages the largest "
        "stage's, Ψ_s",
    )
    mesh: Mesh
    cluster: Cluster = Field(description="the dp × cp ranks model states are sharded over")
    precision: PrecisionName
    optimizer: OptimizerName
    fp32_grad_accum: bool
    offload_optimizer: OffloadTarget
    offload_params: OffloadTarget
    strategies: tuple[StrategyName, ...]
    gpu_memory_bytes: int | None = Field(default=None, ge=0, description="what PyTorch sees of one GPU")
    context_bytes: int = Field(description="held outside the caching allocator (CUDA context, NCCL, kernels)")
    states_capacity_bytes: int | None = Field(
        default=None, description="gpu_memory_bytes − context_bytes: what model states are compared with"
    )


class ModelSummary(BaseModel):
    """The architecture Ψ came from, when the user named a model."""

    name: str
    title: str | None = None
    parameter_count: ParameterCount


class GpuSummary(BaseModel):
    name: str
    title: str
    memory_bytes: int = Field(description="as the vendor's tool (memory_tool) reports it")
    memory_tool: str = Field(description="the tool memory_bytes is read from: nvidia-smi, rocm-smi")
    usable_bytes: int = Field(description="what PyTorch sees: torch.cuda.mem_get_info's total")
    context_bytes: int = Field(description="held outside the caching allocator at world size 1")


class FineTuneSummary(BaseModel):
    """What a fine-tuning run trains, freezes and quantises (``zerocalc.parallel.finetune``)."""

    method: FineTuning
    counts: FineTuneCounts
    trained_bytes: int = Field(description="the trained tensors in their stored dtype, the whole model")
    frozen_bytes: int = Field(
        description="the frozen tensors (quantised weights aside) in their stored dtype, the whole model"
    )
    quantized_bytes: int = Field(description="the quantised weights' storage, every part (0: none)")


class MemoryEstimate(TableDisplay, BaseModel):
    schema_version: int = SCHEMA_VERSION
    request: MemoryRequest
    options: OptionsEcho = None
    model: ModelSummary | None = None
    gpu: GpuSummary | None = None
    finetune: FineTuneSummary | None = Field(default=None, description="None: every parameter trained")
    bytes_per_parameter: BytesPerParameter
    assumptions: list[str]
    notes: list[str] = Field(
        default=[],
        description="each naming inputs by concept ({gpus}), as InputError messages do: the CLI shows flags, "
        "the library keywords (errors.with_names)",
    )
    strategies: list[StrategyMemory]

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``finetune`` only for a fine-tuning run: a full training run's JSON is as it always was."""
        data = handler(self)
        if self.finetune is None:
            data.pop("finetune", None)
        return data

    def row(self, name: StrategyName | str) -> StrategyMemory:
        """The row of a strategy, by any of its names (``fsdp``, ``full_shard``, ``zero3``)."""
        return row_named(self.strategies, name)

    def summary(self) -> list[tuple[str, object]]:
        """What a one-line repr shows: Ψ, N and each strategy's model states per GPU."""
        head = [("params", format_count(self.request.params)), ("gpus", self.request.cluster.world_size)]
        return head + [(row.strategy.value, gib(row.gpu_bytes)) for row in self.strategies]

    def __repr__(self) -> str:
        return summary_repr(type(self).__name__, self.summary())

    def __rich_repr__(self) -> Iterator[tuple[str, object]]:
        yield from self.summary()


def optimizer_bytes_per_parameter(dtypes: TensorDtypes, optimizer: OptimizerSpec) -> Fraction:
    """K: master copy plus optimizer states per parameter, exactly (block scales as a fraction), in the
    precision record's dtypes."""
    k = Fraction(dtypes.master.bytes if dtypes.master else 0)
    for state in optimizer.states:
        dtype = state.dtype or dtypes.optimizer_state
        assert dtype is not None  # trained parameters
        k += Fraction(dtype.bytes, state.block_size or 1)
    return k


PartsOf = Callable[[int], dict[str, int]]
"""The bytes of each tensor making up a state, for a shard of so many parameter elements."""


def tensor_parts(name: str, dtype: DType) -> PartsOf:
    """One tensor of ``dtype`` per parameter element."""
    return lambda n: {name: n * dtype.bytes}


def optimizer_parts(dtypes: TensorDtypes, optimizer: OptimizerSpec) -> PartsOf:
    """K's tensors: the master copy, if the framework keeps one under the recipe, and the optimizer's
    states (the precision record's dtypes)."""
    master, state_dtype = dtypes.master, dtypes.optimizer_state
    assert state_dtype is not None  # trained parameters

    def parts(n: int) -> dict[str, int]:
        found: dict[str, int] = {}
        if master is not None:
            found[f"master_{master.value}"] = n * master.bytes
        found.update(optimizer.state_bytes(n, state_dtype))
        return found

    return parts


class StatePart(NamedTuple):
    """Parameters of one rank whose states are sharded over one data-parallel group."""

    params: int
    """Ψ of the part on this rank."""
    cluster: Cluster
    """The ranks its states are sharded over."""
    experts: bool
    """The routed experts under expert parallelism."""


def state_parts(request: TrainingRequest) -> tuple[StatePart, ...]:
    """A rank's parameters as its states are sharded: all of them over the dp × cp ranks
    (``request.cluster``); under expert parallelism, the rest over those and its E/e routed experts over the
    dp·c/e expert-data-parallel ranks (:meth:`~zerocalc.parallel.mesh.Mesh.expert_data_cluster`)."""
    whole = request.rank_model.params
    if request.mesh.ep == 1:
        return (StatePart(whole, request.cluster, False),)
    experts = expert_parameters(request.architecture)
    return (
        StatePart(whole - experts, request.cluster, False),
        StatePart(experts, request.mesh.expert_data_cluster(), True),
    )


def shard_elements(request: TrainingRequest, group: RankGroup | None) -> int:
    """Σ ceil(Ψ/d) over the parts (:func:`state_parts`): the parameter elements of a state sharded over
    ``group`` that the largest rank holds."""
    return sum(ceil_div(part.params, part.cluster.group_size(group)) for part in state_parts(request))


def state_shard(
    kind: StateKind,
    group: RankGroup | None,
    location: Location,
    request: TrainingRequest,
    parts_of: PartsOf,
    part: StatePart | None = None,
) -> StateShard:
    """One state of ``part`` (the rank's whole share when None) sharded over ``group`` of its ranks (None:
    replicated), as the largest rank holds it."""
    if part is None:
        part = StatePart(request.rank_model.params, request.cluster, False)
    psi = part.params
    d = part.cluster.group_size(group)
    n = ceil_div(psi, d)
    parts = parts_of(n)
    return StateShard(
        kind=kind,
        location=location,
        shard_ranks=d,
        elements=n,
        padding_elements=n * d - psi,
        bytes=sum(parts.values()),
        parts=parts,
        experts=part.experts,
    )


def state_shards(
    kind: StateKind, group: RankGroup | None, location: Location, request: TrainingRequest, parts_of: PartsOf
) -> list[StateShard]:
    """:func:`state_shard` of each part of the rank's parameters (:func:`state_parts`): one row, or the
    rest's and the routed experts' under expert parallelism."""
    return [state_shard(kind, group, location, request, parts_of, part) for part in state_parts(request)]


LOCATIONS = {
    OffloadTarget.NONE: Location.GPU,
    OffloadTarget.CPU: Location.CPU,
    OffloadTarget.NVME: Location.NVME,
}
"""Where an offload target puts a state."""


def params_group(strategy: Strategy, request: TrainingRequest) -> RankGroup | None:
    """The ranks one rank's parameters are sharded over between steps: under a PyTorch framework its
    set-up's (FSDP keeps only its shard outside forward and backward, SHARD_GRAD_OP too: FSDP1's
    ``FlatParamHandle.reshard`` after backward, FSDP2's ``post_backward``; DDP, ZeroRedundancyOptimizer and
    NO_SHARD replicate), else the strategy's rule (ZeRO paper §5.1)."""
    setup = request.framework_record.strategies.get(strategy.name)
    torch = setup.torch if setup is not None else None
    if torch is None:
        return strategy.params
    replicated = torch.wrapper in (TorchWrapper.DDP, TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER)
    if replicated or torch.sharding is Fsdp1Sharding.NO_SHARD:
        return None
    return torch.shard_group


def strategy_states(strategy: Strategy, request: TrainingRequest) -> list[StateShard]:
    """The model states one rank holds under ``strategy``: pure function of the request, each state in the
    dtype the framework keeps it (the precision record: the stored parameters, the main gradients the
    optimizer steps from, the master copy and the optimizer's states); a fine-tuning run's by the kind of
    each tensor (:func:`finetune_states`)."""
    if request.finetune is not None:
        return finetune_states(strategy, request)
    dtypes = request.dtypes.trained
    optimizer = OPTIMIZERS[request.optimizer]
    offload_opt = request.offload_optimizer
    # ZeRO-Offload: with the optimizer on the host, partitioned gradients go there too (fp32 grads
    # are produced on the host from them); replicated ZeRO-1 gradients stay on the GPU.
    grads_on_host = offload_opt is not OffloadTarget.NONE and strategy.grads is not None
    grad_location = Location.CPU if grads_on_host else Location.GPU
    grad_dtype = dtypes.main_gradient
    states = [
        *state_shards(
            StateKind.PARAMS,
            params_group(strategy, request),
            LOCATIONS[request.offload_params],
            request,
            te_param_parts(request, state_parts(request)[0].params),
        ),
        *state_shards(
            StateKind.GRADS,
            strategy.grads,
            grad_location,
            request,
            tensor_parts(f"grads_{grad_dtype.value}", grad_dtype),
        ),
    ]
    if request.fp32_grad_accum:
        states += state_shards(
            StateKind.GRAD_ACCUM,
            strategy.grads,
            grad_location,
            request,
            tensor_parts(f"grad_accum_{GRAD_ACCUM_DTYPE.value}", GRAD_ACCUM_DTYPE),
        )
    states += state_shards(
        StateKind.OPTIMIZER,
        strategy.optimizer,
        LOCATIONS[offload_opt],
        request,
        optimizer_parts(dtypes, optimizer),
    )
    return states


QUANT_DATA_PARTS = (QuantPart.PACKED, QuantPart.INT8_WEIGHT)
"""The parts of a quantised weight that are its parameter's data (sharded, gathered and offloaded as a
parameter); the others are its ``QuantState`` (:func:`finetune_states`)."""
FROZEN_KINDS = (ParamKind.FROZEN, ParamKind.FROZEN_BASE)


def _sharded(
    kind: StateKind,
    d: int,
    location: Location,
    sized: list[tuple[int, dict[str, int]]],
    elements: int,
) -> StateShard:
    """One state of a fine-tuning run: ``sized`` holds each tensor's elements on this rank and the bytes of
    its parts; ``elements`` the whole group's parameter elements, sharded over ``d`` ranks."""
    parts: dict[str, int] = {}
    for _, tensor_parts in sized:
        for name, size in tensor_parts.items():
            parts[name] = parts.get(name, 0) + size
    n = ceil_div(elements, d)
    return StateShard(
        kind=kind,
        location=location,
        shard_ranks=d,
        elements=n,
        padding_elements=n * d - elements,
        bytes=sum(parts.values()),
        parts=parts,
    )


def finetune_dtypes(request: TrainingRequest, kind: ParamKind) -> TensorDtypes:
    """The dtypes of a fine-tuning run's tensors of ``kind`` under the request's recipe and framework
    (:func:`~zerocalc.parallel.finetune.finetune_tensor_dtypes`)."""
    finetune = request.finetune
    assert finetune is not None
    record = request.framework_record
    return finetune_tensor_dtypes(
        finetune, request.precision, record.param_layout, record.main_grad_dtype, request.reduce_dtype, kind
    )


def finetune_shard(request: TrainingRequest, tensor: ParamTensor, d: int) -> int:
    """The elements of ``tensor`` the largest of ``d`` ranks holds: FSDP2's rank 0 dim-0 chunk
    (``_fsdp_param.py`` ``_chunk_with_empty``: ⌈rows/d⌉ rows, more than ⌈numel/d⌉ where a tensor has fewer
    rows than ranks), else ⌈numel/d⌉ (FSDP1's flat parameter, ZeRO's partitions)."""
    setup = request.framework_record.torch_setup(request.strategies[0])
    if d > 1 and setup is not None and setup.wrapper is TorchWrapper.FSDP2:
        rows = -(-tensor.shape[0] // d)
        return min(rows, tensor.shape[0]) * (tensor.numel // tensor.shape[0])
    return ceil_div(tensor.numel, d)


def finetune_states(strategy: Strategy, request: TrainingRequest) -> list[StateShard]:
    """A fine-tuning run's model states on the largest rank (:func:`~zerocalc.parallel.finetune.
    parameter_kinds` decides each tensor's kind, the precision record its dtypes):

    * ``params``: the trained tensors (PEFT's adapters, ``modules_to_save`` copies, unfrozen parameters);
      ``frozen``: the frozen ones in their stored dtype; ``quantized``: the quantised weights' storage part
      by part, all three sharded like parameters (FSDP and ZeRO-3 shard frozen and quantised weights too:
      what ``bnb_4bit_quant_storage`` is for);
    * ``grads`` and ``optimizer``: of the trained tensors only (a frozen tensor has no ``.grad``, and
      neither PEFT's optimizer nor FSDP's reduce-scatter sees it); bitsandbytes' optimizers tensor by
      tensor (fp32 states under 4,096 elements; paged states of 10⁵ elements or more in unified memory);
    * FSDP's CPU offload (``--offload-params cpu`` under fsdp, fsdp2: ``CPUOffload(offload_params=True)``,
      ``CPUOffloadPolicy``) keeps the sharded parameters, their gradients and the optimizer on the host.
    """
    finetune = request.finetune
    assert finetune is not None
    arch = request.architecture
    kinded = parameter_kinds(arch, finetune)
    optimizer = OPTIMIZERS[request.optimizer]
    fsdp_offload = (
        request.framework_record.states is StatesModel.TORCH_EXACT
        and request.offload_params is not OffloadTarget.NONE
    )
    param_location = LOCATIONS[request.offload_params]
    grads_on_host = fsdp_offload or (
        request.offload_optimizer is not OffloadTarget.NONE and strategy.grads is not None
    )
    grad_location = Location.CPU if grads_on_host else Location.GPU
    optimizer_location = Location.CPU if fsdp_offload else LOCATIONS[request.offload_optimizer]
    d_params = request.cluster.group_size(params_group(strategy, request))
    d_grads = request.cluster.group_size(strategy.grads)
    d_optimizer = request.cluster.group_size(strategy.optimizer)

    trained = [
        (k.tensor, finetune_dtypes(request, k.kind).trained) for k in kinded if k.kind in TRAINED_KINDS
    ]
    frozen = [(k.tensor, finetune_dtypes(request, k.kind).stored) for k in kinded if k.kind in FROZEN_KINDS]
    trained_elements = sum(t.numel for t, _ in trained)

    def each(
        tensors: list[tuple[ParamTensor, DType]], d: int, prefix: str
    ) -> list[tuple[int, dict[str, int]]]:
        return [
            (
                finetune_shard(request, t, d),
                {f"{prefix}_{dt.value}": finetune_shard(request, t, d) * dt.bytes},
            )
            for t, dt in tensors
        ]

    states = [
        _sharded(
            StateKind.PARAMS,
            d_params,
            param_location,
            each([(t, dt.stored) for t, dt in trained], d_params, "params"),
            trained_elements,
        )
    ]
    if frozen:
        states.append(
            _sharded(
                StateKind.FROZEN,
                d_params,
                param_location,
                each(frozen, d_params, "frozen"),
                sum(t.numel for t, _ in frozen),
            )
        )
    if finetune.quantized:
        assert finetune.quant is not None
        storage = quantized_storage(arch, finetune.quant)
        # only the weight's data is a parameter (Params4bit.data, Int8Params.data), which FSDP and ZeRO-3
        # shard and offload; its QuantState (absmax, the nested absmax, the code tables; Int8Params' SCB
        # row scales) is a Python attribute of the parameter and of its Linear4bit (bitsandbytes 0.50
        # bitsandbytes/nn/modules.py: Params4bit.quant_state, fix_4bit_weight_quant_state_from_module
        # "the quant state got lost when the parameter got converted. This happens for example for fsdp"),
        # neither a parameter nor a buffer: whole on every rank, on the GPU
        data = {f"quantized_{p.value}": ceil_div(size, d_params) for p, size in storage.parts.items()
                if p in QUANT_DATA_PARTS}  # fmt: skip
        state = {
            f"quantized_{p.value}": size for p, size in storage.parts.items() if p not in QUANT_DATA_PARTS
        }
        states.append(_sharded(StateKind.QUANTIZED, d_params, param_location, [(0, data)], storage.weights))
        if state:
            states.append(_sharded(StateKind.QUANTIZED, 1, Location.GPU, [(0, state)], 0))
    states.append(
        _sharded(
            StateKind.GRADS,
            d_grads,
            grad_location,
            each([(t, dt.main_gradient) for t, dt in trained], d_grads, "grads"),
            trained_elements,
        )
    )
    if request.fp32_grad_accum:
        states.append(
            _sharded(
                StateKind.GRAD_ACCUM,
                d_grads,
                grad_location,
                each([(t, GRAD_ACCUM_DTYPE) for t, _ in trained], d_grads, "grad_accum"),
                trained_elements,
            )
        )
    held: list[tuple[int, dict[str, int]]] = []
    paged: list[tuple[int, dict[str, int]]] = []
    for t, dt in trained:
        n = finetune_shard(request, t, d_optimizer)
        parts = {f"master_{dt.master.value}": n * dt.master.bytes} if dt.master is not None else {}
        assert dt.optimizer_state is not None
        for name, size in optimizer.tensor_state_bytes(n, dt.optimizer_state).items():
            (paged if name.endswith("_paged") else held).append((0, {name: size}))
        held.append((n, parts))
    if any(name.startswith("absmax") for _, parts in held for name in parts):
        held.append((0, {"qmaps": BNB_QMAP_BYTES}))  # one pair for the whole optimizer
    states.append(_sharded(StateKind.OPTIMIZER, d_optimizer, optimizer_location, held, trained_elements))
    if paged:
        states.append(_sharded(StateKind.OPTIMIZER, d_optimizer, Location.UNIFIED, paged, 0))
    return states


def bytes_at(states: list[StateShard], location: Location) -> int:
    """The bytes of the states kept at ``location``."""
    return sum(s.bytes for s in states if s.location is location)


def ddp_baseline_gpu_bytes(request: TrainingRequest) -> int:
    """DDP's model states on one GPU for the same recipe, without offload (the "vs DDP" denominator)."""
    baseline = request.model_copy(
        update={"offload_optimizer": OffloadTarget.NONE, "offload_params": OffloadTarget.NONE}
    )
    return bytes_at(strategy_states(STRATEGIES[StrategyName.DDP], baseline), Location.GPU)


def strategy_memory(strategy: Strategy, request: TrainingRequest, ddp_gpu_bytes: int) -> StrategyMemory:
    """One strategy's row: its states, where they are, and whether they fit."""
    states = strategy_states(strategy, request)
    gpu = bytes_at(states, Location.GPU)
    cpu = bytes_at(states, Location.CPU)
    nvme = bytes_at(states, Location.NVME)
    unified = bytes_at(states, Location.UNIFIED)
    fits = headroom = None
    capacity = request.states_capacity_bytes
    if capacity is not None:
        headroom = capacity - gpu
        fits = headroom >= 0
    per_node = request.mesh.gpus_per_node
    return StrategyMemory(
        strategy=strategy.name,
        title=strategy.title,
        states=states,
        gpu_bytes=gpu,
        cpu_bytes_per_gpu=cpu,
        nvme_bytes_per_gpu=nvme,
        cpu_bytes_per_node=cpu * per_node,
        nvme_bytes_per_node=nvme * per_node,
        unified_bytes_per_gpu=unified,
        fraction_of_ddp=gpu / ddp_gpu_bytes,
        fits=fits,
        headroom_bytes=headroom,
    )


def strategy_row(request: TrainingRequest) -> StrategyMemory:
    """:func:`evaluate_memory`'s row of the request's first strategy (the same functions), without the rest
    of the estimate: what ``zerocalc plan`` needs of each candidate."""
    return strategy_memory(STRATEGIES[request.strategies[0]], request, ddp_baseline_gpu_bytes(request))


STATES_BYTES = Part(
    "model states",
    ("model", "mesh", "stage", "framework", "precision", "reduce_dtype", "optimizer", "fp32_grad_accum",
     "offload_optimizer", "offload_params", "strategies", "finetune", "fp8"),
    lambda request, parts: bytes_at(
        strategy_states(STRATEGIES[request.strategies[0]], request), Location.GPU
    ),
)  # fmt: skip
"""The model states on the GPU of the request's first strategy (its row's ``gpu_bytes``)."""


def layout_assumption(request: TrainingRequest) -> str:
    """How the request's framework keeps the recipe's tensors (its record's layout, the precision record's
    dtypes), where that is not the ZeRO paper's 16-bit parameters and gradients beside a master copy."""
    record = request.framework_record
    layout = describe_layout(record.param_layout, request.dtypes)
    return f"{record.framework.value} keeps {request.precision.value} as {layout} ({record.source})"


def offload_assumption(request: TrainingRequest) -> str:
    """What an offloaded optimizer moves off the GPU, after the offload the request's framework runs (its
    profile's)."""
    profile = request.framework_record
    target = request.offload_optimizer.value
    return f"optimizer offload to {target} ({profile.offload_source}): {profile.offload_moves}"


def mesh_assumption(request: TrainingRequest) -> str:
    """The mesh, its layout and what a rank holds, in words."""
    mesh, cluster = request.mesh, request.cluster
    text = (
        f"mesh {mesh.describe()}, TP innermost then CP then DP (Megatron-LM and torchtitan order); model "
        f"states sharded over the {plural(cluster.world_size, 'rank')} of dp × cp"
    )
    if mesh.tp > 1 and mesh.pp == 1:
        text += (
            f"; each of the {mesh.tp} tensor-parallel ranks holds Ψ_t = {request.rank_model.params:,} "
            f"parameters ({mesh.tp_style.value} layers)"
        )
    if mesh.pp > 1:
        largest = request.stages.index(request.rank_model)
        arch = request.model.architecture
        split = mesh_stage_layers(mesh, arch.num_layers if arch else 0)
        layers = stage_layer_counts(0, mesh.pp, layers=split)
        if any(count != layers[k % mesh.pp] // mesh.vpp for k, count in enumerate(split)):
            held = (
                f"holding {describe_layer_counts(layers)} layers from the first to the last, in virtual "
                f"stages of {describe_layer_counts(split)} layers"
            )
        elif len(set(layers)) == 1:
            held = f"each holding {plural(mesh.vpp, 'chunk')} of {plural(layers[0] // mesh.vpp, 'layer')}"
        else:
            held = (
                f"holding {describe_layer_counts(layers)} layers from the first to the last, "
                f"{plural(mesh.vpp, 'chunk')} each"
            )
        text += (
            f"; pipeline ranks outermost, {held} "
            "(chunk j of rank i: virtual stage j·p + i), the embedding on the first, the final norm and "
            f"LM head on the last; the rows are stage {largest}'s, the largest: Ψ_s = "
            f"{request.rank_model.params:,} parameters"
            + (f" per tensor-parallel rank ({mesh.tp_style.value} layers)" if mesh.tp > 1 else "")
        )
    if mesh.ep > 1:
        arch = request.architecture
        rest, experts = state_parts(request)
        text += (
            f"; expert parallelism: each of the {mesh.ep} ranks of an EP group ({mesh.etp} apart) holds "
            f"{arch.local_experts} of the {arch.num_experts} routed experts of every MoE layer"
            + (f", each split over {mesh.etp} expert-tensor-parallel ranks" if mesh.etp > 1 else "")
            + (", whole" if mesh.etp == 1 < mesh.tp else "")
            + f", {experts.params:,} parameters whose states are sharded over the "
            f"{plural(experts.cluster.world_size, 'expert-data-parallel rank')} "
            f"({mesh.etp * mesh.ep} apart), and {rest.params:,} other parameters"
        )
    return text


def routing_assumption(request: TrainingRequest) -> str:
    """What expert parallelism assumes of the routing, in words: the tokens a rank's experts get (its
    routed activations) and the all-to-alls carry."""
    arch, mesh = request.architecture, request.mesh
    factor = request.activations.capacity_factor
    routing = (
        "balanced routing"
        if factor == 1
        else f"the busiest rank's experts get {factor:g}× the balanced share"
    )
    tokens = "b·s/(c·t)" if mesh.tp > 1 and mesh.sequence_parallel else "b·s/c"
    gathered = (
        f"; its experts compute those of its {mesh.etp} expert-tensor-parallel ranks, gathered, "
        f"{mesh.etp}·cf·k·{tokens}"
        if mesh.etp > 1 and mesh.tp > 1
        else ""
    )
    return (
        f"expert parallelism: each rank routes its {tokens} tokens to k = {arch.experts_per_token} of the "
        f"{arch.num_experts} experts, {arch.local_experts} on each of the {mesh.ep} ranks of an EP group; a "
        f"rank's experts compute, and a dispatch or combine all-to-all carries, cf·k·{tokens} tokens with "
        f"the capacity factor cf = {factor:g} ({routing}), (e−1)/e of them from or to other GPUs{gathered}"
    )


def finetune_assumptions(request: TrainingRequest, counts: FineTuneCounts) -> list[str]:
    """What a fine-tuning run's states count, in words."""
    finetune = request.finetune
    assert finetune is not None
    lines = []
    if finetune.lora is not None:
        lora = finetune.lora
        targets = (
            "PEFT's default targets"
            if lora.targets is None
            else lora.targets
            if isinstance(lora.targets, str)
            else ", ".join(lora.targets)
        )
        adapter = finetune_dtypes(request, ParamKind.ADAPTER)
        if not lora.autocast_adapter_dtype:
            kept = (
                f"{adapter.stored.value}: the base layer's dtype, PEFT's without autocast_adapter_dtype "
                "(and before 0.12)"
            )
        elif adapter.stored is DType.FP32:
            kept = "fp32: PEFT's autocast_adapter_dtype"
        else:
            kept = (
                f"fp32 in PEFT (autocast_adapter_dtype), counted as the recipe's {adapter.stored.value} "
                "parameters beside an fp32 master copy"
            )
        lines.append(
            f"{'DoRA' if lora.dora else 'LoRA'} r {lora.rank} on {targets} (PEFT 0.21): {counts.adapters:,} "
            f"adapter parameters ({kept})"
            + (f" and {counts.saved_copies:,} in the modules_to_save copies" if counts.saved_copies else "")
            + f" trained; the base's {counts.frozen:,} parameters frozen: no gradient, no optimizer state"
        )
    else:
        lines.append(
            f"{counts.trainable:,} parameters trained, {counts.frozen:,} frozen "
            f"({', '.join(finetune.freeze)}): no gradient, no optimizer state for them"
        )
    quantized = counts.quantized
    if quantized is not None and finetune.quant is not None:
        quant = finetune.quant
        parts = ", ".join(f"{part.value} {size:,} B" for part, size in quantized.parts.items())
        lines.append(
            f"{quant.method.value} (bitsandbytes 0.50"
            + (", double quantisation" if quant.double_quant else "")
            + f", storage {quant.dtypes.storage.value}): {quantized.weights:,} weights of "
            f"{quantized.modules:,} Linear modules in {quantized.total:,} B ({parts}); the embeddings, norms "
            "and the LM head unquantised"
        )
    if finetune.kbit_prepared:
        lines.append(
            "prepare_model_for_kbit_training (peft/utils/other.py) casts every parameter but the quantised "
            "weights to fp32 (--no-kbit-prepare: as loaded)"
        )
    if request.framework_record.states is StatesModel.TORCH_EXACT and request.offload_params is not (
        OffloadTarget.NONE
    ):
        lines.append(
            "FSDP CPU offload (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy): the sharded "
            "parameters, their gradients and the optimizer step on the host"
        )
    return lines


def finetune_summary(request: TrainingRequest) -> FineTuneSummary:
    """A fine-tuning run's counts and the whole model's bytes of each kind, each tensor in the dtype the
    precision record stores its kind in."""
    finetune = request.finetune
    assert finetune is not None
    arch = request.architecture
    counts = finetune_counts(arch, finetune)
    stored = {kind: finetune_dtypes(request, kind).stored.bytes for kind in (*TRAINED_KINDS, *FROZEN_KINDS)}
    kinded = parameter_kinds(arch, finetune)
    return FineTuneSummary(
        method=finetune,
        counts=counts,
        trained_bytes=sum(k.tensor.numel * stored[k.kind] for k in kinded if k.kind in TRAINED_KINDS),
        frozen_bytes=sum(k.tensor.numel * stored[k.kind] for k in kinded if k.kind in FROZEN_KINDS),
        quantized_bytes=counts.quantized.total if counts.quantized is not None else 0,
    )


def evaluate_memory(request: TrainingRequest) -> MemoryEstimate:
    """Model states per GPU of every strategy of a validated request (pure)."""
    recipe = RECIPES[request.precision]
    dtypes = request.dtypes.trained
    optimizer = OPTIMIZERS[request.optimizer]
    ddp_gpu_bytes = ddp_baseline_gpu_bytes(request)
    rows = [strategy_memory(STRATEGIES[name], request, ddp_gpu_bytes) for name in request.strategies]

    if request.finetune is not None:  # the trained tensors' bytes: the adapters' dtypes under LoRA
        trained_kind = ParamKind.ADAPTER if request.finetune.lora is not None else ParamKind.TRAINABLE
        dtypes = finetune_dtypes(request, trained_kind).trained
    k = optimizer_bytes_per_parameter(dtypes, optimizer)
    bpp = BytesPerParameter(
        b_p=dtypes.stored.bytes,
        b_g=dtypes.main_gradient.bytes,
        k=float(k),
        grad_accum=GRAD_ACCUM_DTYPE.bytes if request.fp32_grad_accum else 0,
    )
    mesh = request.mesh
    assumptions = [
        f"Ψ = {request.model.params:,} parameters; N = {plural(mesh.world, 'GPU')}, "
        f"g = {mesh.gpus_per_node} per node ({plural(mesh.nodes, 'node')})",
    ]
    if mesh.model_parallel:
        assumptions.append(mesh_assumption(request))
    summary = None
    if request.finetune is not None:
        summary = finetune_summary(request)
        assumptions += finetune_assumptions(request, summary.counts)
    if mesh.ep > 1:
        assumptions.append(routing_assumption(request))
    assumptions += [f"{recipe.name.value}: {recipe.note}"]
    layout = request.framework_record.param_layout
    if layout is not ParamLayout.MASTER_COPY or dtypes.main_gradient is not dtypes.gradient:
        assumptions.append(layout_assumption(request))
    assumptions.append(optimizer.assumption)
    if request.fp32_grad_accum:
        assumptions.append(
            f"fp32 gradient-accumulation buffer: {GRAD_ACCUM_DTYPE.bytes} bytes per parameter, sharded like "
            "the gradients (Ultra-Scale Playbook: 2 + 2 + 12 + 4 bytes per parameter)"
        )
    if request.offload_optimizer is not OffloadTarget.NONE:
        assumptions.append(offload_assumption(request))
    fsdp_offload = request.finetune is not None and request.framework_record.states is StatesModel.TORCH_EXACT
    if request.offload_params is not OffloadTarget.NONE and not fsdp_offload:
        assumptions.append(
            f"parameter offload to {request.offload_params.value} (ZeRO-Infinity, Rajbhandari et al. 2021): "
            "the ZeRO-3 parameter partition lives off the GPU and is fetched layer by layer"
        )
    model = request.model
    gpu = request.gpu
    return MemoryEstimate(
        request=MemoryRequest.of(request),
        model=None
        if model.parameter_count is None
        else ModelSummary(name=model.name or "", title=model.title, parameter_count=model.parameter_count),
        gpu=None
        if gpu is None
        else GpuSummary(
            name=gpu.name,
            title=gpu.title,
            memory_bytes=gpu.memory_bytes,
            memory_tool=gpu.names.smi,
            usable_bytes=gpu.usable_bytes,
            context_bytes=request.runtime.context_bytes,
        ),
        finetune=summary,
        bytes_per_parameter=bpp,
        assumptions=assumptions,
        notes=[*request.notes, *request.strategy_notes],
        strategies=rows,
    )
