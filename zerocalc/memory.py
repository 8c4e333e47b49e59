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
figures are that rank's. Offload follows ZeRO-Offload (Ren et al. 2021, section 4): the optimizer step
runs on the host, so the fp32 states *and the gradient partitions* it consumes leave the GPU (gradients
only where they are partitioned, i.e. ZeRO-2/3); ZeRO-Infinity (Rajbhandari et al. 2021) adds NVMe for
optimizer states and parameters under ZeRO-3. Bytes are exact integers.
"""

from __future__ import annotations

from enum import Enum
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.architecture import ParameterCount
from zerocalc.cluster import Cluster, make_cluster
from zerocalc.dtypes import DType
from zerocalc.errors import InputError
from zerocalc.optimizers import OPTIMIZERS, OptimizerName, OptimizerSpec, parse_optimizer
from zerocalc.precision import RECIPES, PrecisionName, PrecisionRecipe, parse_precision
from zerocalc.strategies import (
    DEFAULT_STRATEGIES,
    STRATEGIES,
    OffloadTarget,
    ShardScope,
    Strategy,
    StrategyName,
    parse_offload,
    parse_strategies,
    shard_divisor,
)
from zerocalc.units import ceil_div, parse_bytes, parse_count

SCHEMA_VERSION = 1


class Location(str, Enum):
    GPU = "gpu"
    CPU = "cpu"
    NVME = "nvme"


class StateKind(str, Enum):
    PARAMS = "params"
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


class StrategyMemory(BaseModel):
    strategy: StrategyName
    title: str
    states: list[StateShard]
    gpu_bytes: int = Field(description="model-state bytes on each GPU")
    cpu_bytes_per_gpu: int
    nvme_bytes_per_gpu: int
    cpu_bytes_per_node: int
    nvme_bytes_per_node: int
    fraction_of_ddp: float = Field(description="gpu_bytes / DDP's gpu_bytes for the same recipe")
    fits: bool | None = Field(default=None, description="gpu_bytes <= gpu_memory_bytes, when given")
    headroom_bytes: int | None = Field(default=None, description="gpu_memory_bytes − gpu_bytes, when given")

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


class MemoryRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    params: int = Field(gt=0, description="Ψ: parameter count")
    cluster: Cluster
    precision: PrecisionName = PrecisionName.BF16_MIXED
    optimizer: OptimizerName = OptimizerName.ADAMW
    fp32_grad_accum: bool = False
    offload_optimizer: OffloadTarget = OffloadTarget.NONE
    offload_params: OffloadTarget = OffloadTarget.NONE
    strategies: tuple[StrategyName, ...] = DEFAULT_STRATEGIES
    gpu_memory_bytes: int | None = Field(default=None, ge=0)


class ModelSummary(BaseModel):
    """The architecture Ψ came from, when the user named a model."""

    name: str
    title: str | None = None
    parameter_count: ParameterCount


class GpuSummary(BaseModel):
    name: str
    memory_bytes: int
    reserve_bytes: int


class MemoryEstimate(BaseModel):
    schema_version: int = SCHEMA_VERSION
    request: MemoryRequest
    model: ModelSummary | None = None
    gpu: GpuSummary | None = None
    bytes_per_parameter: BytesPerParameter
    assumptions: list[str]
    notes: list[str] = Field(default_factory=list)
    strategies: list[StrategyMemory]

    def row(self, name: StrategyName | str) -> StrategyMemory:
        key = StrategyName(name)
        return next(r for r in self.strategies if r.strategy is key)


def optimizer_bytes_per_parameter(recipe: PrecisionRecipe, optimizer: OptimizerSpec) -> Fraction:
    """K: master copy plus optimizer states per parameter, exactly (block scales as a fraction)."""
    k = Fraction(recipe.master_dtype.bytes if recipe.master_dtype else 0)
    for state in optimizer.states:
        dtype = state.dtype or recipe.optimizer_state_dtype
        k += Fraction(dtype.bytes, state.block_size or 1)
    return k


def _optimizer_parts(n: int, recipe: PrecisionRecipe, optimizer: OptimizerSpec) -> dict[str, int]:
    parts: dict[str, int] = {}
    if recipe.master_dtype is not None:
        parts[f"master_{recipe.master_dtype.value}"] = n * recipe.master_dtype.bytes
    parts.update(optimizer.state_bytes(n, recipe))
    return parts


def _shard(
    kind: StateKind,
    scope: ShardScope,
    location: Location,
    request: MemoryRequest,
    parts_for: dict[str, DType] | None = None,
    recipe: PrecisionRecipe | None = None,
    optimizer: OptimizerSpec | None = None,
) -> StateShard:
    d = shard_divisor(scope, request.cluster.world_size, request.cluster.gpus_per_node)
    n = ceil_div(request.params, d)
    if parts_for is not None:
        parts = {name: n * dtype.bytes for name, dtype in parts_for.items()}
    else:
        assert recipe is not None and optimizer is not None
        parts = _optimizer_parts(n, recipe, optimizer)
    return StateShard(
        kind=kind,
        location=location,
        shard_ranks=d,
        elements=n,
        padding_elements=n * d - request.params,
        bytes=sum(parts.values()),
        parts=parts,
    )


def _location(target: OffloadTarget) -> Location:
    return {
        OffloadTarget.NONE: Location.GPU,
        OffloadTarget.CPU: Location.CPU,
        OffloadTarget.NVME: Location.NVME,
    }[target]


def strategy_states(strategy: Strategy, request: MemoryRequest) -> list[StateShard]:
    """The model states one rank holds under ``strategy``: pure function of the request."""
    recipe = RECIPES[request.precision]
    optimizer = OPTIMIZERS[request.optimizer]
    offload_opt = request.offload_optimizer
    # ZeRO-Offload: with the optimizer on the host, partitioned gradients go there too (fp32 grads
    # are produced on the host from them); replicated ZeRO-1 gradients stay on the GPU.
    grads_on_host = offload_opt is not OffloadTarget.NONE and strategy.grads is not ShardScope.REPLICATED
    grad_location = Location.CPU if grads_on_host else Location.GPU
    states = [
        _shard(
            StateKind.PARAMS,
            strategy.params,
            _location(request.offload_params),
            request,
            parts_for={f"params_{recipe.param_dtype.value}": recipe.param_dtype},
        ),
        _shard(
            StateKind.GRADS,
            strategy.grads,
            grad_location,
            request,
            parts_for={f"grads_{recipe.grad_dtype.value}": recipe.grad_dtype},
        ),
    ]
    if request.fp32_grad_accum:
        states.append(
            _shard(
                StateKind.GRAD_ACCUM,
                strategy.grads,
                grad_location,
                request,
                parts_for={"grad_accum_fp32": DType.FP32},
            )
        )
    states.append(
        _shard(
            StateKind.OPTIMIZER,
            strategy.optimizer,
            _location(offload_opt),
            request,
            recipe=recipe,
            optimizer=optimizer,
        )
    )
    return states


def _bytes_at(states: list[StateShard], location: Location) -> int:
    return sum(s.bytes for s in states if s.location is location)


def _check_offload(strategy: Strategy, request: MemoryRequest) -> str | None:
    """Why ``strategy`` cannot do the requested offload, or None."""
    if (
        request.offload_optimizer is not OffloadTarget.NONE
        and request.offload_optimizer not in strategy.optimizer_offload
    ):
        can = ", ".join(t.value for t in strategy.optimizer_offload) or "nothing"
        return f"--offload-optimizer {request.offload_optimizer.value}: {strategy.title} can offload {can}"
    if (
        request.offload_params is not OffloadTarget.NONE
        and request.offload_params not in strategy.param_offload
    ):
        return (
            f"--offload-params {request.offload_params.value}: {strategy.title} keeps whole parameters on "
            "every GPU; only zero3 can offload parameters"
        )
    return None


def _resolve_strategies(request: MemoryRequest, explicit: bool) -> tuple[list[Strategy], list[str]]:
    """The strategies to report; an explicit choice that cannot run is an error, a default one a note."""
    chosen: list[Strategy] = []
    notes: list[str] = []
    for name in request.strategies:
        strategy = STRATEGIES[name]
        problem = _check_offload(strategy, request)
        if problem is None and name is StrategyName.HYBRID_SHARD:
            problem = request.cluster.whole_nodes_problem()
        if problem is None:
            chosen.append(strategy)
        elif explicit:
            raise InputError(problem)
        else:
            notes.append(f"{strategy.title} left out: {problem}")
    if not chosen:
        raise InputError("no strategy can run with these options: " + "; ".join(notes))
    return chosen, notes


def evaluate(request: MemoryRequest, explicit_strategies: bool = True) -> MemoryEstimate:
    """Compute the memory estimate for a validated request."""
    if request.params < 1:
        raise InputError(f"--params {request.params} must be positive")
    recipe = RECIPES[request.precision]
    optimizer = OPTIMIZERS[request.optimizer]
    if request.fp32_grad_accum and recipe.grad_dtype is DType.FP32:
        raise InputError(
            f"--fp32-grad-accum with --precision {recipe.name.value}: gradients are already fp32; "
            "accepted with bf16-mixed, fp16-mixed or bf16-pure"
        )
    strategies, notes = _resolve_strategies(request, explicit_strategies)

    baseline = MemoryRequest(
        **{**request.model_dump(), "offload_optimizer": "none", "offload_params": "none"}
    )
    ddp_gpu_bytes = _bytes_at(strategy_states(STRATEGIES[StrategyName.DDP], baseline), Location.GPU)

    cluster = request.cluster
    rows = []
    for strategy in strategies:
        states = strategy_states(strategy, request)
        gpu = _bytes_at(states, Location.GPU)
        cpu = _bytes_at(states, Location.CPU)
        nvme = _bytes_at(states, Location.NVME)
        fits = headroom = None
        if request.gpu_memory_bytes is not None:
            headroom = request.gpu_memory_bytes - gpu
            fits = headroom >= 0
        rows.append(
            StrategyMemory(
                strategy=strategy.name,
                title=strategy.title,
                states=states,
                gpu_bytes=gpu,
                cpu_bytes_per_gpu=cpu,
                nvme_bytes_per_gpu=nvme,
                cpu_bytes_per_node=cpu * cluster.ranks_per_node,
                nvme_bytes_per_node=nvme * cluster.ranks_per_node,
                fraction_of_ddp=gpu / ddp_gpu_bytes,
                fits=fits,
                headroom_bytes=headroom,
            )
        )

    k = optimizer_bytes_per_parameter(recipe, optimizer)
    bpp = BytesPerParameter(
        b_p=recipe.param_dtype.bytes,
        b_g=recipe.grad_dtype.bytes,
        k=float(k),
        grad_accum=DType.FP32.bytes if request.fp32_grad_accum else 0,
    )
    assumptions = [
        f"Ψ = {request.params:,} parameters; N = {cluster.world_size} GPUs, "
        f"g = {cluster.ranks_per_node} per node ({cluster.nodes} node{'s' if cluster.nodes > 1 else ''})",
        f"{recipe.name.value}: {recipe.note}",
        optimizer.assumption,
    ]
    if request.fp32_grad_accum:
        assumptions.append(
            "fp32 gradient-accumulation buffer: 4 bytes per parameter, sharded like the gradients "
            "(Ultra-Scale Playbook: 2 + 2 + 12 + 4 bytes per parameter)"
        )
    if request.offload_optimizer is not OffloadTarget.NONE:
        assumptions.append(
            f"optimizer offload to {request.offload_optimizer.value} (ZeRO-Offload, Ren et al. 2021; "
            "ZeRO-Infinity for NVMe): master copy and optimizer states move off the GPU, and so do "
            "partitioned gradients, which the host-side optimizer step consumes"
        )
    if request.offload_params is not OffloadTarget.NONE:
        assumptions.append(
            f"parameter offload to {request.offload_params.value} (ZeRO-Infinity, Rajbhandari et al. 2021): "
            "the ZeRO-3 parameter partition lives off the GPU and is fetched layer by layer"
        )
    return MemoryEstimate(
        request=request,
        bytes_per_parameter=bpp,
        assumptions=assumptions,
        notes=notes,
        strategies=rows,
    )


def resolve_params(params: int | str | None, model: str | None) -> tuple[int, ModelSummary | None]:
    """Ψ from ``--params`` or from a model preset / config.json (``--model``), never both."""
    if (params is None) == (model is None):
        raise InputError(
            "give --params or --model (not both); "
            "accepted: --params 7B, or --model llama-3-8b / path/config.json"
        )
    if model is None:
        return parse_count(params), None  # type: ignore[arg-type]
    from zerocalc.architecture import count_parameters
    from zerocalc.presets import load_model

    architecture, preset = load_model(model)
    counted = count_parameters(architecture)
    summary = ModelSummary(
        name=architecture.name, title=preset.title if preset else None, parameter_count=counted
    )
    return counted.total, summary


def resolve_gpu_memory(
    gpu_memory: int | str | None, gpu: str | None, reserve: int | str | None
) -> tuple[int | None, GpuSummary | None]:
    """Usable bytes per GPU: ``--gpu-memory`` as given, or a GPU preset's memory less ``--reserve``."""
    if gpu is None:
        if reserve is not None:
            raise InputError("--reserve applies to --gpu; accepted: --gpu NAME --reserve 2GiB")
        return (None if gpu_memory is None else parse_bytes(gpu_memory, "--gpu-memory")), None
    if gpu_memory is not None:
        raise InputError(
            "give --gpu or --gpu-memory, not both; accepted: --gpu h100-80gb or --gpu-memory 80GiB"
        )
    from zerocalc.presets import load_gpu

    spec = load_gpu(gpu)
    kept = parse_bytes(reserve if reserve is not None else spec.reserve, "--reserve")
    if kept >= spec.memory_bytes:
        raise InputError(
            f"--reserve {reserve} is not below the {spec.title}'s memory; accepted: a smaller size"
        )
    summary = GpuSummary(name=spec.name, memory_bytes=spec.memory_bytes, reserve_bytes=kept)
    return spec.memory_bytes - kept, summary


def estimate_memory(
    params: int | str | None = None,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    *,
    model: str | None = None,
    strategies: str | list[str] | None = None,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    fp32_grad_accum: bool = False,
    offload_optimizer: str | None = None,
    offload_params: str | None = None,
    gpu_memory: int | str | None = None,
    gpu: str | None = None,
    reserve: int | str | None = None,
    default_strategies: tuple[StrategyName, ...] = DEFAULT_STRATEGIES,
) -> MemoryEstimate:
    """Library entry point: per-GPU model-state bytes for each strategy.

    ``params`` takes the CLI's spellings (``"7B"``, ``6_738_415_616``), or ``model`` a preset name or a
    Hugging Face config.json path; ``strategies`` ``"all"``, a comma list or a list of names (FSDP names are
    aliases), ``default_strategies`` the set ``"all"`` stands for; ``gpu`` a GPU preset whose memory
    less ``reserve`` gives the fits column.
    Raises :class:`zerocalc.errors.InputError`.
    """
    if isinstance(strategies, list):
        strategies = ",".join(strategies)
    chosen = parse_strategies(strategies)
    psi, model_summary = resolve_params(params, model)
    usable, gpu_summary = resolve_gpu_memory(gpu_memory, gpu, reserve)
    request = MemoryRequest(
        params=psi,
        cluster=make_cluster(gpus, gpus_per_node),
        precision=parse_precision(precision).name,
        optimizer=parse_optimizer(optimizer).name,
        fp32_grad_accum=fp32_grad_accum,
        offload_optimizer=parse_offload(offload_optimizer, "--offload-optimizer"),
        offload_params=parse_offload(offload_params, "--offload-params"),
        strategies=tuple(s.name for s in chosen) if chosen else default_strategies,
        gpu_memory_bytes=usable,
    )
    estimate = evaluate(request, explicit_strategies=chosen is not None)
    return estimate.model_copy(update={"model": model_summary, "gpu": gpu_summary})
