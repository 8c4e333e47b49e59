"""One training request, parsed and validated once.

Everything a user types (``--params 7B``, ``--gpu h100-80gb``, ``--strategy zero2,zero3``, a scenario's
TOML fields, a library call's keywords) arrives as :class:`TrainingOptions`, raw. :func:`parse_request`
turns it into a frozen, typed :class:`TrainingRequest`: numbers with their units resolved, presets and
config.json files loaded (once per process, :mod:`zerocalc.request.presets`), the calibration file read, every
bound and every combination checked, with one :class:`~zerocalc.base.errors.InputError` line per problem. The
core (:mod:`zerocalc.states.memory`, :mod:`zerocalc.comm.estimate`, :mod:`zerocalc.peak`) takes only the
typed request: it never parses a string, reads a file or looks at the environment.

Error messages name each input by its concept, written ``{name}``: the field names below, which are also
the keyword names of :mod:`zerocalc.api`; the CLI shows its flags instead (:mod:`zerocalc.cli`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from zerocalc.base.dtypes import DType, parse_dtype
from zerocalc.base.errors import InputError, shown
from zerocalc.base.units import (
    BINARY_SUFFIXES,
    MAX_COUNT,
    parse_bandwidth,
    parse_bytes,
    parse_count,
    parse_duration,
    parse_fraction,
    parse_tokens,
    parse_whole,
    plural,
)
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import (
    MAX_LAYERS,
    Architecture,
    LatentAttention,
    ParameterCount,
    QkNorm,
    TensorParallelRank,
    count_parameters,
    is_expert_tensor,
    parameter_tensors,
    pipeline_stage,
)
from zerocalc.model.code import (
    MODEL_CODES,
    AttentionKernel,
    ModelImplName,
    Shape,
    Ulysses,
    op_sac_unsupported,
    parallel_unsupported,
)
from zerocalc.network.calibration import Calibration
from zerocalc.network.cluster import DEFAULT_GPUS_PER_NODE, Cluster, RankGroup
from zerocalc.network.links import (
    DEFAULT_DETAIL,
    DEFAULT_INTER_NODE_BUSBW,
    DEFAULT_INTRA_NODE_BUSBW,
    DEFAULT_LATENCY_S,
    Bandwidths,
    BandwidthSource,
    LinkFigures,
)
from zerocalc.network.schedule import GradSync, ZeroPP
from zerocalc.parallel.finetune import FineTuning
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.framework_records import (
    FRAMEWORKS,
    data_parallel_mesh,
    default_strategies,
    framework_strategies,
    frameworks_with,
)
from zerocalc.parallel.framework_records.record import FrameworkRecord, ModelInit, Wrap
from zerocalc.parallel.frameworks import Estimate, Framework
from zerocalc.parallel.mesh import PP_SCHEDULE_NAMES, CpImpl, Mesh, PpSchedule, TpStyle
from zerocalc.parallel.optimizers import OptimizerImpl, OptimizerName
from zerocalc.parallel.pipeline import INTERLEAVED, chunk_layers, mesh_stage_layers, split_problem
from zerocalc.parallel.precision import RECIPES, ParamLayout, PrecisionName, TensorDtypes
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, Strategy, StrategyName, find_strategy
from zerocalc.request.finetune import parse_finetune
from zerocalc.request.fp8 import fp8_notes, fp8_strategy_problem, parse_fp8
from zerocalc.request.options import Command, option, options_for
from zerocalc.request.problems import architecture_problem, offload_record_problem, record_problem

# ------------------------------------------------------------------------------------------------ bounds
MAX_GPUS = 2**20
"""The largest world accepted: 1,048,576 GPUs."""
MAX_GPUS_PER_NODE = 1024
MAX_GRAD_ACCUM = 1_000_000
MAX_SEQ_LEN = 2**26
"""67,108,864 tokens per sequence."""
MAX_MICRO_BATCH = 2**20
MAX_CHECKPOINT_EVERY = 2**20
MAX_PREFETCH = 1024
MAX_TFLOPS = 1e6
"""1 EFLOP/s per GPU: above any accelerator."""

DEFAULT_SEQ_LEN = 2048
"""s without ``seq_len`` (:func:`default_seq_len`: a model's learned positions where fewer)."""
DEFAULT_MICRO_BATCH: int = option(Command.MEMORY, "micro_batch").default
DEFAULT_PREFETCH: int = option(Command.MEMORY, "prefetch").default
DDP_BUCKET_BYTES = 25 * 2**20
"""torch.nn.parallel.DistributedDataParallel's bucket_cap_mb default, 25 MiB (``_DEFAULT_BUCKET_CAP_MB``)."""
DDP_FIRST_BUCKET_BYTES = 2**20
"""``dist._DEFAULT_FIRST_BUCKET_BYTES``: DDP's first bucket when bucket_cap_mb is left at its default
(``_BucketCapacityConfig.create``); an explicit bucket_cap_mb sets both."""
DEFAULT_DEEPSPEED_BUCKET_ELEMENTS = int(float(option(Command.MEMORY, "reduce_bucket").default))
"""DeepSpeed ZeRO config defaults: reduce_bucket_size = allgather_bucket_size = 5e8 elements."""
DEFAULT_GPU = "h100-80gb"
"""Without ``gpu``, the runtime figures (context, NCCL, cuBLAS workspaces) are this preset's (measured)."""


# ---------------------------------------------------------------------------------------- raw options
def options_model(name: str, commands: tuple[Command, ...], **fields: Any) -> type[BaseModel]:
    """A frozen pydantic model of the raw request options of ``commands``, one field per
    :class:`~zerocalc.request.options.Option` (its default the option's), plus ``fields``; nothing is
    checked yet but the types a library caller passes."""
    namespace = {"Architecture": Architecture, "Calibration": Calibration, "Any": Any}
    types: dict[str, Any] = {}  # each type expression evaluated once (options share a handful)
    for command in commands:
        for o in options_for(command, request_only=True):
            if o.name not in fields:
                if o.value_type not in types:
                    types[o.value_type] = eval(o.value_type, namespace)
                fields[o.name] = (types[o.value_type], o.default)
    config = ConfigDict(frozen=True, extra="forbid")
    return create_model(name, __config__=config, __module__=__name__, **fields)


TrainingOptions = options_model(
    "TrainingOptions",
    (Command.MEMORY, Command.COMM),
    estimate=(Estimate, Estimate.MEMORY),
    calibration_name=(str | None, None),
)
"""What the user asked for, as typed: strings with units, names, numbers (the options of ``memory`` and
``comm``, :data:`~zerocalc.request.options.OPTIONS`). ``estimate``: the command the options were given to
(set by the caller, not typed); ``calibration_name``: how a calibration object given as such is named."""


# --------------------------------------------------------------------------------------- typed request
class ModelSpec(BaseModel):
    """The model: its parameter count, and its architecture when one was named."""

    model_config = ConfigDict(frozen=True)

    params: int = Field(gt=0, description="Ψ")
    name: str | None = None
    title: str | None = None
    architecture: Architecture | None = None
    parameter_count: ParameterCount | None = None
    quantization_config: dict[str, Any] | None = Field(
        default=None, description="its config.json's bitsandbytes quantization_config, as written"
    )


class RuntimeNames(BaseModel):
    """What a GPU vendor's software is called in outputs: a field of each GPU preset (NVIDIA's by default,
    AMD's in the Instinct presets), so no output branches on the vendor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    smi: str = Field(default="nvidia-smi", description="the tool whose total memory the preset's memory is")
    context: str = Field(default="CUDA context", description="what the runtime holds per process")
    collectives: str = Field(default="NCCL", description="the collective library")
    blas: str = Field(default="cuBLAS", description="the GEMM library whose workspaces the runtime holds")
    mem_get_info: str = Field(
        default="cudaMemGetInfo", description="the runtime call whose total − free is the device footprint"
    )


class GpuChoice(BaseModel):
    """A GPU preset, its numbers resolved."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str
    memory_bytes: int = Field(description="as the vendor's tool (names.smi) reports it")
    usable_bytes: int = Field(description="what PyTorch sees (torch.cuda.mem_get_info total): the capacity")
    context_bytes: int = Field(
        description="outside the caching allocator: the runtime context, collectives, kernels (world size 1)"
    )
    context_given: bool = Field(default=False, description="context_bytes is --reserve, not the preset's")
    context_measured: bool = Field(default=False, description="the preset's context was measured on it")
    names: RuntimeNames = RuntimeNames()
    bf16: bool = Field(default=True, description="the tensor cores take bf16 (the V100's do not)")
    nccl_communicator_bytes: int
    cublas_workspace_bytes: int
    bf16_dense_tflops: float
    intra_node_Bps: float
    inter_node_Bps: float


class ActivationOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    seq_len: int = Field(default=DEFAULT_SEQ_LEN, ge=1, le=MAX_SEQ_LEN)
    micro_batch: int = Field(default=DEFAULT_MICRO_BATCH, ge=1, le=MAX_MICRO_BATCH)
    recompute: Recompute = Recompute.NONE
    checkpoint_every: int = Field(
        default=1,
        ge=1,
        description="under full recompute, layers N, 2N, … checkpointed (torchtitan selective_ac_option N)",
    )
    flash_attention: bool | None = Field(default=None, description="None: on for the Llama family")
    capacity_factor: float = Field(
        default=1.0,
        gt=0,
        description="under expert parallelism, the tokens a rank's experts receive over the balanced k·b·s/c",
    )


class BufferOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    prefetch: int = Field(default=DEFAULT_PREFETCH, ge=0, le=MAX_PREFETCH)
    wrap: Wrap = Wrap.BLOCK
    ddp_bucket_bytes: int = Field(default=DDP_BUCKET_BYTES, ge=0)
    ddp_first_bucket_bytes: int = Field(default=DDP_FIRST_BUCKET_BYTES, ge=0)
    reduce_bucket_elements: int = Field(default=DEFAULT_DEEPSPEED_BUCKET_ELEMENTS, ge=0)
    allgather_bucket_elements: int = Field(default=DEFAULT_DEEPSPEED_BUCKET_ELEMENTS, ge=0)


class TrainingRequest(BaseModel):
    """A validated request: everything the core needs, typed. Build it with :func:`parse_request`."""

    model_config = ConfigDict(frozen=True)

    estimate: Estimate = Estimate.MEMORY
    model: ModelSpec
    """The whole model, as given."""
    rank_model: ModelSpec
    """What one tensor-parallel rank holds of it (:class:`~zerocalc.model.architecture.TensorParallelRank`):
    the model itself without tensor or pipeline parallelism; with pipeline stages, the stage with the most
    parameters (the first such). Model states and the peak count this."""
    stages: tuple[ModelSpec, ...] = ()
    """With pipeline parallelism, what each pipeline rank holds (:class:`~zerocalc.model.architecture.
    PipelineStage`), rank 0 first; empty at p = 1. The peak is simulated per stage (:func:`stage_request`)."""
    mesh: Mesh
    cluster: Cluster
    """The dp × cp ranks model states are sharded over and gradients reduced across
    (:meth:`~zerocalc.parallel.mesh.Mesh.data_cluster`): the whole run without tensor and context
    parallelism."""
    precision: PrecisionName = PrecisionName.BF16_MIXED
    optimizer: OptimizerName = OptimizerName.ADAMW
    fp32_grad_accum: bool = False
    init_asked: ModelInit | None = Field(
        default=None, description="None: the framework's (FrameworkRecord.init)"
    )
    offload_optimizer: OffloadTarget = OffloadTarget.NONE
    offload_params: OffloadTarget = OffloadTarget.NONE
    framework: Framework = Framework.PAPER
    strategies: tuple[StrategyName, ...]
    """The strategies to evaluate, each able to run with these options."""
    strategies_explicit: bool = True
    strategy_notes: tuple[str, ...] = ()
    """Strategies of the default set left out, and why."""
    reduce_dtype: DType | None = Field(default=None, description="None: the gradient dtype")
    fp8: Fp8Setting = NO_FP8
    activations: ActivationOptions = ActivationOptions()
    buffers: BufferOptions = BufferOptions()
    gpu: GpuChoice | None = None
    gpu_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="what PyTorch sees of one GPU (torch.cuda.mem_get_info's total): the GPU preset's "
        "usable memory or --gpu-memory; None: no fits/headroom",
    )
    runtime: GpuChoice
    """The GPU's runtime figures (context, NCCL, workspaces): the preset's, else :data:`DEFAULT_GPU`'s;
    ``context_bytes`` is ``reserve`` when given."""
    grad_accum: int = Field(default=1, ge=1, le=MAX_GRAD_ACCUM)
    grad_sync: GradSync | None = Field(
        default=None, description="asked for; None: each framework's default (strategies.effective_grad_sync)"
    )
    zeropp: tuple[ZeroPP, ...] = Field(default=(), description="DeepSpeed ZeRO++ features (ZeRO-3)")
    model_impl: ModelImplName = ModelImplName.HF
    optimizer_impl: OptimizerImpl = OptimizerImpl.FOREACH
    expandable_segments: bool = False
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
    links: Bandwidths
    tokens_per_step: int | None = Field(default=None, gt=0)
    tflops: float | None = Field(default=None, gt=0)
    calibration: Calibration | None = None
    calibration_name: str | None = None
    compute_calibration: str | None = Field(
        default=None, description="the compute table's file (``zerocalc bench --compute``); None: the GPU's"
    )
    notes: tuple[str, ...] = ()
    """What parsing tells the user about the inputs (the text model of a multimodal config, a sequence
    beyond a rotary model's trained positions)."""
    finetune: FineTuning | None = Field(default=None, description="None: every parameter trained")

    @property
    def states_capacity_bytes(self) -> int | None:
        """What model states alone are compared with (no architecture, so no step to simulate): the GPU's
        memory less what the process holds outside the caching allocator."""
        if self.gpu_memory_bytes is None:
            return None
        return self.gpu_memory_bytes - self.runtime.context_bytes

    @property
    def framework_record(self) -> FrameworkRecord:
        """Everything the framework decides (:mod:`zerocalc.parallel.framework_records`)."""
        return FRAMEWORKS[self.framework]

    @property
    def dtypes(self) -> TensorDtypes:
        """The dtype of every tensor role of the step, the precision record's for this recipe under this
        framework with ``--reduce-dtype``."""
        return FRAMEWORKS[self.framework].dtypes(self.precision, self.reduce_dtype)

    @property
    def model_code(self) -> ModelImplName:
        """The code that runs the model: the framework's own where it runs no other (Megatron-LM's layers
        under ``--framework megatron``), else ``--model-impl``."""
        return FRAMEWORKS[self.framework].model_code or self.model_impl

    @property
    def init(self) -> ModelInit:
        """How the model is created: as asked, else the framework's documented path."""
        return self.init_asked or FRAMEWORKS[self.framework].init

    @property
    def zero_init(self) -> bool:
        """DeepSpeed ZeRO-3 builds the model under ``deepspeed.zero.Init`` (``init`` meta)."""
        return self.init is ModelInit.META

    @property
    def architecture(self) -> Architecture:
        """The architecture as one tensor-parallel rank holds it; only called where the request has one
        (the peak)."""
        if self.rank_model.architecture is None:  # pragma: no cover - the parser guarantees it where needed
            raise InputError("this estimate needs an architecture; accepted: {model} NAME or config.json")
        return self.rank_model.architecture


# ---------------------------------------------------------------------------------------------- parsing
def parse_request(options: TrainingOptions) -> TrainingRequest:
    """Parse and validate every option once; raises one :class:`InputError` naming the first problem."""
    o = options
    model = _model(o.params, o.model)
    whole = _cluster(o.gpus, o.gpus_per_node)
    precision = _choice(o.precision, "{precision}", PrecisionName, {"_": "-"})
    optimizer = _optimizer(o.optimizer)
    recipe = RECIPES[precision]
    if o.fp32_grad_accum and recipe.grad_dtype is DType.FP32:
        raise InputError(
            f"{{fp32_grad_accum}} with {{precision}} {precision.value}: gradients are already fp32; "
            "accepted with bf16-mixed, fp16-mixed or bf16-pure"
        )
    offload_optimizer = _offload(o.offload_optimizer, "{offload_optimizer}")
    offload_params = _offload(o.offload_params, "{offload_params}")
    framework = _choice(o.framework, "{framework}", Framework, {"_": "-"})
    reduce_dtype = (
        None
        if o.reduce_dtype is None
        else parse_dtype(o.reduce_dtype, "{reduce_dtype}", allowed=(DType.FP32, recipe.grad_dtype))
    )
    seq_len, position_notes = _seq_len(o.seq_len, model)
    activations = ActivationOptions(
        seq_len=seq_len,
        micro_batch=parse_whole(o.micro_batch, "{micro_batch}", 1, MAX_MICRO_BATCH, "sequences"),
        recompute=_choice(o.recompute, "{recompute}", Recompute),
        checkpoint_every=parse_whole(
            o.checkpoint_every, "{checkpoint_every}", 1, MAX_CHECKPOINT_EVERY, "layers"
        ),
        flash_attention=o.flash_attention,
    )
    model_impl = _choice(o.model_impl, "{model_impl}", ModelImplName)
    mesh = _mesh(o, whole, framework, model, activations, model_impl)
    if o.capacity_factor is not None:
        activations = activations.model_copy(
            update={"capacity_factor": _capacity_factor(o.capacity_factor, mesh, model)}
        )
    ddp_bucket = DDP_BUCKET_BYTES if o.ddp_bucket is None else parse_bytes(o.ddp_bucket, "{ddp_bucket}")
    buffers = BufferOptions(
        prefetch=parse_whole(o.prefetch, "{prefetch}", 0, MAX_PREFETCH, "units"),
        wrap=_choice(o.wrap, "{wrap}", Wrap),
        ddp_bucket_bytes=ddp_bucket,
        ddp_first_bucket_bytes=DDP_FIRST_BUCKET_BYTES if o.ddp_bucket is None else ddp_bucket,
        reduce_bucket_elements=_elements(o.reduce_bucket, "{reduce_bucket}"),
        allgather_bucket_elements=_elements(o.allgather_bucket, "{allgather_bucket}"),
    )
    gpu, gpu_memory, runtime = _gpu(o.gpu, o.gpu_memory, o.reserve, precision)
    grad_accum = parse_whole(o.grad_accum, "{grad_accum}", 1, MAX_GRAD_ACCUM, "micro-batches")
    grad_sync = None if o.grad_sync is None else _choice(o.grad_sync, "{grad_sync}", GradSync)
    zeropp = _zeropp(o.zeropp)
    tokens, tflops = _compute(o.tokens_per_step, o.tflops)
    links = _links(o.intra_node_bw, o.inter_node_bw, o.latency, gpu)
    calibration, calibration_name = _calibration(o.calibration, o.calibration_name)

    explicit = _strategy_names(o.strategies)
    rank_model, stages = _rank_models(model, mesh)
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    if mesh.ep > 1 and expert_parallel is not None and expert_parallel.shards_experts_on_dim1:
        _dim1_expert_sharding_problem(rank_model, mesh)
    request = TrainingRequest(
        estimate=o.estimate,
        model=model,
        rank_model=rank_model,
        stages=stages,
        mesh=mesh,
        cluster=mesh.data_cluster(),
        precision=precision,
        optimizer=optimizer,
        fp32_grad_accum=o.fp32_grad_accum,
        init_asked=None if o.init is None else _choice(o.init, "{init}", ModelInit),
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        framework=framework,
        strategies=explicit or default_strategies(framework),
        strategies_explicit=explicit is not None,
        reduce_dtype=reduce_dtype,
        fp8=(fp8 := parse_fp8(o, framework, model_impl)),
        activations=activations,
        buffers=buffers,
        gpu=gpu,
        gpu_memory_bytes=gpu_memory,
        runtime=runtime,
        grad_accum=grad_accum,
        grad_sync=grad_sync,
        zeropp=zeropp,
        model_impl=model_impl,
        optimizer_impl=_choice(o.optimizer_impl, "{optimizer_impl}", OptimizerImpl, {"_": "-"}),
        expandable_segments=o.expandable_segments,
        links=links,
        tokens_per_step=tokens,
        tflops=tflops,
        calibration=calibration,
        calibration_name=calibration_name,
        compute_calibration=_compute_calibration(o.compute_calibration),
        notes=(*_model_notes(o.model), *position_notes, *fp8_notes(fp8, rank_model.architecture)),
        finetune=parse_finetune(o, model),
    )
    resolved = _resolve_strategies(request)
    problem = _ignored_problem(o, resolved) or _model_code_problem(resolved) or _recompute_problem(resolved)
    problem = problem or fp8_strategy_problem(
        resolved.framework, resolved.fp8, resolved.strategies, resolved.model.architecture is not None
    )
    if problem:
        raise InputError(problem)
    return resolved


def flash_attention_used(request: TrainingRequest) -> bool:
    """``flash_attention`` as asked, else what the model's code runs (its record's ``default_attention``)."""
    asked = request.activations.flash_attention
    if asked is not None:
        return asked
    kernel, _ = MODEL_CODES[request.model_code].default_attention(request.architecture)
    return kernel is AttentionKernel.FLASH


def rank_shape(request: TrainingRequest) -> Shape:
    """One micro-batch on one rank of the mesh: b sequences of s tokens, split by tensor, sequence and
    context parallelism as the model's code splits them (:class:`~zerocalc.model.code.Shape`)."""
    a, mesh = request.activations, request.mesh
    return Shape(
        a.micro_batch,
        a.seq_len,
        tp=mesh.tp,
        sequence_parallel=mesh.sequence_parallel,
        cp=mesh.cp,
        cp_impl=mesh.cp_impl,
    )


def _model_code_problem(request: TrainingRequest) -> str | None:
    """A mesh the model's code cannot run the step of (:func:`~zerocalc.model.code.
    parallel_unsupported`), for the peak of a step; None when it can or no step is simulated."""
    mesh, arch = request.mesh, request.model.architecture
    if request.estimate is not Estimate.MEMORY or arch is None or (mesh.tp == 1 and mesh.cp == 1):
        return None
    impl = MODEL_CODES[request.model_code]
    reason = parallel_unsupported(impl, arch, rank_shape(request), flash_attention_used(request))
    if reason is None:
        return None
    degrees = " and ".join(f"{{{n}}} {d}" for n, d in (("tp", mesh.tp), ("cp", mesh.cp)) if d > 1)
    if "flash attention" in reason:
        accepted = "{flash_attention}"
    elif "sequence parallelism (the norms" in reason:
        accepted = "{sequence_parallel} off, or {model_impl} torchtitan"
    elif "Ulysses" in reason and impl.ulysses is Ulysses.NONE:
        accepted = "{cp_impl} ring or allgather"
    elif "not modelled" in reason:
        accepted = "{model_impl} megatron, or {tp} 1"
    else:
        accepted = "a mesh that divides them"
    return f"{degrees} with {{model_impl}} {impl.name.value}: {reason}; accepted: {accepted}"


def _recompute_problem(request: TrainingRequest) -> str | None:
    """``{recompute} op`` where torchtitan's op-level policy is not modelled
    (:func:`~zerocalc.model.code.op_sac_unsupported`): the step's memory for torchtitan's code only,
    its time and collectives for any dense Llama block's; ``{checkpoint_every}`` N > 1 (torchtitan's
    layer-level selective checkpointing, any code's ``checkpoint_wrapper`` on every N-th block) other than
    under full recompute of a dense model; None otherwise."""
    arch, activations = request.model.architecture, request.activations
    code = request.model_code
    every = activations.checkpoint_every
    if every > 1 and activations.recompute is not Recompute.FULL:
        return (
            f"{{checkpoint_every}} {every} with {{recompute}} {activations.recompute.value}: it picks the "
            "layers full recomputation checkpoints; accepted: {checkpoint_every} 1, or {recompute} full"
        )
    if every > 1 and arch is not None and arch.is_moe:
        return (
            f"{{checkpoint_every}} {every} with {arch.name}: every N-th layer of a mixture-of-experts model "
            "is not modelled; accepted: {checkpoint_every} 1"
        )
    if activations.recompute is not Recompute.OP or arch is None:
        return None
    impl = MODEL_CODES[code]
    memory_code = impl if request.estimate is Estimate.MEMORY else None
    reason = op_sac_unsupported(arch, rank_shape(request), flash_attention_used(request), memory_code)
    if reason is None:
        return None
    accepted = "{recompute} none, selective or full"
    if "torchtitan's Llama code" in reason:
        accepted = f"{{model_impl}} torchtitan, or {accepted}"
    return f"{{recompute}} op with {arch.name}: {reason}; accepted: {accepted}"


def _ignored_problem(options: TrainingOptions, request: TrainingRequest) -> str | None:
    """An option given that changes nothing in this request (never ignored silently), or None."""
    if (
        options.reserve is not None
        and request.gpu_memory_bytes is None
        and request.model.architecture is None
        and request.estimate is Estimate.MEMORY
    ):
        return (
            f"{{reserve}} {shown(options.reserve)} changes nothing here: it is subtracted from a GPU's "
            "memory ({gpu} or {gpu_memory}) or added to the peak of a step ({model}); accepted: {reserve} "
            "with one of them, or no {reserve}"
        )
    return None


def default_seq_len(arch: Architecture | None) -> int:
    """s when none is given: :data:`DEFAULT_SEQ_LEN`, or a model's learned positions where fewer."""
    if arch is not None and arch.learned_position_embeddings:
        return min(DEFAULT_SEQ_LEN, arch.max_position_embeddings)
    return DEFAULT_SEQ_LEN


def _seq_len(text: int | str | None, model: ModelSpec) -> tuple[int, tuple[str, ...]]:
    """s: as given, else :data:`DEFAULT_SEQ_LEN` (a model's learned positions where fewer). Beyond learned
    positions is refused (the position table has no row for them: ``wpe(position_ids)`` fails); beyond a
    rotary model's ``max_position_embeddings`` it runs, with a note."""
    arch = model.architecture
    positions = arch.max_position_embeddings if arch is not None else 0
    learned = arch is not None and arch.learned_position_embeddings
    if text is None:
        return default_seq_len(arch), ()
    seq_len = parse_tokens(text, "{seq_len}", 1, MAX_SEQ_LEN)
    if not positions or seq_len <= positions:
        return seq_len, ()
    name = model.name or "the model"
    if learned:
        raise InputError(
            f"{{seq_len}} {seq_len:,} is beyond {name}'s {positions:,} learned positions (its position "
            f"embedding has {positions:,} rows); accepted: {{seq_len}} 1 to {positions:,}"
        )
    return seq_len, (
        f"--seq-len {seq_len:,} is beyond {name}'s max_position_embeddings ({positions:,}): rotary "
        "positions run, past what the model was trained for",
    )


def _model_notes(model: str | Architecture | None) -> tuple[str, ...]:
    if not isinstance(model, str):
        return ()
    from zerocalc.request.presets import model_notes

    return model_notes(model)


def _choice(
    text: object, what: str, enum: type, replace: dict[str, str] | None = None, aliases: dict | None = None
):
    """An enum member by its value, case-insensitive (``_`` read as ``-`` where ``replace`` says), or by
    one of its ``aliases`` (keys lower-case, without ``-`` and ``_``)."""
    key = str(text).strip().lower()
    for old, new in (replace or {}).items():
        key = key.replace(old, new)
    for member in enum:
        if key == member.value:
            return member
    alias = (aliases or {}).get(key.replace("-", "").replace("_", ""))
    if alias is not None:
        return alias
    accepted = ", ".join(m.value for m in enum)
    raise InputError(f"{what} {shown(text)} is not accepted; accepted: {accepted}")


_OPTIMIZER_ALIASES = {
    "adam8bit": OptimizerName.ADAM_8BIT,
    "adamw-8bit": OptimizerName.ADAM_8BIT,
    "sgd-momentum": OptimizerName.SGD,
}


def _optimizer(text: str) -> OptimizerName:
    key = str(text).strip().lower().replace("_", "-")
    if key in _OPTIMIZER_ALIASES:
        return _OPTIMIZER_ALIASES[key]
    return _choice(key, "{optimizer}", OptimizerName)


def _offload(text: str | None, what: str) -> OffloadTarget:
    return OffloadTarget.NONE if text is None else _choice(text, what, OffloadTarget)


def _elements(text: int | str, what: str) -> int:
    """A DeepSpeed bucket in elements; 0 turns the bucket off."""
    if text in (0, "0"):
        return 0
    return parse_count(text, what, "a number of elements such as 5e8 or 500M, or 0", MAX_COUNT)


def _zeropp(text: str | list[str] | tuple[str, ...] | None) -> tuple[ZeroPP, ...]:
    """``all``, ``none`` or a comma list of ZeRO++ features, in :class:`ZeroPP` order."""
    if text is None:
        return ()
    if isinstance(text, (list, tuple)):
        text = ",".join(text)
    parts = [part.strip().lower() for part in text.split(",") if part.strip()]
    if parts == ["all"]:
        return tuple(ZeroPP)
    if parts == ["none"]:
        return ()
    accepted = "all, none, or a comma list of " + ", ".join(z.value for z in ZeroPP)
    if not parts or any(part not in {z.value for z in ZeroPP} for part in parts):
        raise InputError(f"{{zeropp}} {shown(text)} is not accepted; accepted: {accepted}")
    return tuple(z for z in ZeroPP if z.value in parts)


@lru_cache(maxsize=64)
def _counted(architecture: Architecture) -> ParameterCount:
    """The parameter count of a loaded architecture (once per architecture: ``plan`` parses hundreds of
    requests of one model)."""
    return count_parameters(architecture)


def _model(params: int | str | None, model: str | Architecture | dict[str, Any] | None) -> ModelSpec:
    """Ψ from ``params``, or from a model preset / model TOML file / config.json / architecture (``model``),
    never both."""
    if (params is None) == (model is None):
        raise InputError(
            f"give {{params}} or {{model}}{'' if params is None else ', not both'}; "
            "accepted: {params} 7B, or {model} llama-3-8b / path/model.toml / path/config.json"
        )
    if model is None:
        try:
            return ModelSpec(params=parse_count(params))  # type: ignore[arg-type]
        except InputError:
            if _names_a_model(params):
                raise InputError(
                    f"{{params}} {shown(params)} is a model, not a parameter count; accepted: {{model}} "
                    f"{shown(params)}, or {{params}} a count such as 7B"
                ) from None
            raise
    if isinstance(model, Architecture):
        count = count_parameters(model)
        return ModelSpec(params=count.total, name=model.name, architecture=model, parameter_count=count)
    if isinstance(model, dict):
        return _config_dict_model(model)
    from zerocalc.model.hf_config import config_title
    from zerocalc.request.presets import load_model, model_quantization_config

    architecture, preset = load_model(model)
    count = _counted(architecture)
    if count.total > MAX_COUNT:
        raise InputError(
            f"{{model}} {shown(model)} has {count.total:,} parameters; accepted: a model of at most "
            f"{MAX_COUNT:,}, as {{params}} accepts"
        )
    return ModelSpec(
        params=count.total,
        name=architecture.name,
        title=preset.title if preset else config_title(architecture, model),
        architecture=architecture,
        parameter_count=count,
        quantization_config=model_quantization_config(model),
    )


def _config_dict_model(config: dict[str, Any]) -> ModelSpec:
    """A parsed config.json (``AutoConfig.from_pretrained(...).to_dict()``), read as the file would be."""
    from zerocalc.model.hf_config import architecture_from_hf_dict, config_title, hf_quantization_config

    source = config.get("_name_or_path")
    name = str(source).rstrip("/").rsplit("/", 1)[-1] if source else str(config.get("model_type", "config"))
    architecture = architecture_from_hf_dict(config, "{model} (a config dict)", name or "config", True)
    count = _counted(architecture)
    if count.total > MAX_COUNT:
        raise InputError(
            f"{{model}} (a config dict) has {count.total:,} parameters; accepted: at most {MAX_COUNT:,}"
        )
    return ModelSpec(
        params=count.total,
        name=architecture.name,
        title=config_title(architecture, "a config dict"),
        architecture=architecture,
        parameter_count=count,
        quantization_config=hf_quantization_config(config),
    )


def _names_a_model(text: object) -> bool:
    """Whether ``text``, given as Ψ, names a model preset or file (a keyword mixed up)."""
    if not isinstance(text, str) or not text.strip():
        return False
    from pathlib import Path

    from zerocalc.request.presets import preset_names

    name = text.strip()
    if name.lower() in preset_names("models") or name.lower().endswith((".json", ".toml")):
        return True
    try:
        return Path(name).exists()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte
        return False


def _cluster(gpus: int | str, gpus_per_node: int | str | None) -> Cluster:
    """``gpus`` and ``gpus_per_node`` (default: 8, or N when N is smaller)."""
    world = parse_whole(gpus, "{gpus}", 1, MAX_GPUS, "GPUs")
    per_node = (
        DEFAULT_GPUS_PER_NODE
        if gpus_per_node is None
        else parse_whole(gpus_per_node, "{gpus_per_node}", 1, MAX_GPUS_PER_NODE, "GPUs")
    )
    return Cluster.of(world, per_node)


def _mesh(
    o: TrainingOptions,
    whole: Cluster,
    framework: Framework,
    model: ModelSpec,
    activations: ActivationOptions,
    model_impl: ModelImplName,
) -> Mesh:
    """dp × cp × tp of ``o.gpus`` ranks (:mod:`zerocalc.parallel.mesh`), each combination a framework
    cannot run, or a model cannot be split by, one :class:`InputError`."""
    tp = parse_whole(o.tp, "{tp}", 1, MAX_GPUS, "ranks")
    cp = parse_whole(o.cp, "{cp}", 1, MAX_GPUS, "ranks")
    pp = parse_whole(o.pp, "{pp}", 1, MAX_GPUS, "stages")
    n, per_node = whole.world_size, whole.ranks_per_node
    if n % (tp * cp * pp):
        ranks = tp * cp * pp
        degrees = [f"{{{name}}} {d}" for name, d in (("pp", pp), ("tp", tp), ("cp", cp)) if d > 1]
        product = " × ".join(degrees) + (f" = {ranks}" if len(degrees) > 1 else "")
        raise InputError(
            f"{{gpus}} {n} is not a multiple of {product}; accepted: {{gpus}} a multiple of {ranks}"
        )
    vpp, schedule, first, last, stage_layers = _pipeline(o, framework, model, pp)
    ep = _expert_parallel(o, framework, model, n // (tp * pp), cp)
    record = FRAMEWORKS[framework]
    _refuse_unmodelled("tp", tp, framework, "tp_style", "tensor parallelism")
    _refuse_unmodelled("cp", cp, framework, "cp_impls", "context parallelism")
    impls = record.cp_impls
    if o.cp_impl is None:
        cp_impl = record.default_cp_impl
    else:
        cp_impl = _choice(o.cp_impl, "{cp_impl}", CpImpl)
        if cp == 1:
            raise InputError(
                f"{{cp_impl}} {cp_impl.value} changes nothing with {{cp}} 1; accepted: {{cp}} 2 or more, "
                "or no {cp_impl}"
            )
        if cp_impl not in impls:
            names = ", ".join(i.value for i in impls)
            raise InputError(
                f"{{cp_impl}} {cp_impl.value}: {{framework}} {framework.value} does not implement it; "
                f"accepted: {{cp_impl}} {names}"
            )
    if o.sequence_parallel is None:
        sequence_parallel = default_sequence_parallel(framework, tp, model_impl)
    elif o.sequence_parallel and tp == 1:
        raise InputError(
            "{sequence_parallel} shards over the tensor-parallel group, and {tp} is 1; "
            "accepted: {tp} 2 or more, or no {sequence_parallel}"
        )
    else:
        sequence_parallel = o.sequence_parallel
    if tp > 1 or cp > 1:
        _model_split_problem(model, tp, cp, cp_impl, sequence_parallel, activations.seq_len)
    tp_fits = per_node % tp == 0
    if o.tp_across_nodes and tp_fits:
        raise InputError(
            f"{{tp_across_nodes}} changes nothing: {{tp}} {tp} ranks fit in a node of {per_node}; "
            "accepted: no {tp_across_nodes}"
        )
    if not tp_fits and not o.tp_across_nodes:
        raise InputError(
            f"{{tp}} {tp} does not fit the nodes' {per_node} GPUs: a TP group would span nodes; accepted: "
            f"{{tp}} a divisor of {per_node}, or {{tp_across_nodes}}"
        )
    return Mesh(
        world=n,
        gpus_per_node=per_node,
        tp=tp,
        cp=cp,
        sequence_parallel=sequence_parallel,
        cp_impl=cp_impl,
        tp_style=record.layers_tp_style,
        pp=pp,
        vpp=vpp,
        pp_schedule=schedule,
        pp_first_stage_layers=first,
        pp_last_stage_layers=last,
        pp_stage_layers=stage_layers,
        ep=ep,
    )


def default_sequence_parallel(framework: Framework, tp: int, model_impl: ModelImplName) -> bool:
    """Sequence parallelism when ``--sequence-parallel`` is not given: the framework's default
    (``sequence_parallel_default``) with TP and a model code that has it (transformers' tensor-parallel
    plans replicate the norms: none in hf code)."""
    return (
        tp > 1
        and FRAMEWORKS[framework].sequence_parallel_default
        and MODEL_CODES[model_impl].sequence_parallel
    )


def _refuse_unmodelled(option: str, degree: int, framework: Framework, field: str, dimension: str) -> None:
    """Refuses ``--option degree`` (above 1) under a framework whose record does not compose ``dimension``
    (its ``field`` unset)."""
    if degree > 1 and not getattr(FRAMEWORKS[framework], field):
        names = ", ".join(f.value for f in frameworks_with(field))
        raise InputError(
            f"{{{option}}} {degree} with {{framework}} {framework.value}: its {dimension} is not modelled; "
            f"accepted: {{framework}} {names}, or {{{option}}} 1"
        )


def _mesh_change_problem(request: TrainingRequest) -> None:
    """The checks of :func:`_mesh` a mesh built outside the parser (``zerocalc plan``'s, with the parser's
    defaults for the schedule, the CP implementation and sequence parallelism, its degrees dividing the
    GPUs and TP inside a node) can fail, in the parser's order and with its lines."""
    mesh, framework, model = request.mesh, request.framework, request.model
    if mesh.pp > 1:
        _refuse_unmodelled("pp", mesh.pp, framework, "pipeline", "pipeline parallelism")
        arch = model.architecture
        if arch is not None:
            _split_check(
                arch,
                mesh.pp,
                mesh.vpp,
                mesh.pp_first_stage_layers,
                mesh.pp_last_stage_layers,
                mesh.pp_stage_layers,
            )
    if mesh.ep > 1:
        options = TrainingOptions(ep=mesh.ep)
        _expert_parallel(options, framework, model, mesh.world // (mesh.tp * mesh.pp), mesh.cp)
    _refuse_unmodelled("tp", mesh.tp, framework, "tp_style", "tensor parallelism")
    _refuse_unmodelled("cp", mesh.cp, framework, "cp_impls", "context parallelism")
    if mesh.tp > 1 or mesh.cp > 1:
        _model_split_problem(
            model, mesh.tp, mesh.cp, mesh.cp_impl, mesh.sequence_parallel, request.activations.seq_len
        )


def _pipeline(
    o: TrainingOptions, framework: Framework, model: ModelSpec, pp: int
) -> tuple[int, PpSchedule, int | None, int | None, tuple[int, ...] | None]:
    """``vpp``, ``pp_schedule``, the first and last stage's layers and each virtual stage's, checked against
    the stages and the model's layers as Megatron-LM checks them (``core/transformer/transformer_config.py``:
    layers divisible by p, and by p·v interleaved; with uneven stages or each stage's layers,
    :func:`~zerocalc.parallel.pipeline.split_problem`)."""
    vpp = parse_whole(o.vpp, "{vpp}", 1, MAX_LAYERS, "virtual stages")
    first, last = (
        None if given is None else parse_whole(given, name, 1, MAX_LAYERS, "layers")
        for given, name in (
            (o.pp_first_stage_layers, "{pp_first_stage_layers}"),
            (o.pp_last_stage_layers, "{pp_last_stage_layers}"),
        )
    )
    stage_layers = _stage_layers(o.pp_stage_layers)
    if stage_layers is not None and (first is not None or last is not None):
        given = "{pp_first_stage_layers}" if first is not None else "{pp_last_stage_layers}"
        raise InputError(f"{{pp_stage_layers}} and {given} both split the layers; accepted: one of them")
    if o.pp_schedule is None:
        schedule = PpSchedule.INTERLEAVED_1F1B if vpp > 1 else PpSchedule.ONE_F_ONE_B
    else:
        schedule = _choice(o.pp_schedule, "{pp_schedule}", PpSchedule, None, PP_SCHEDULE_NAMES)
    if pp == 1:
        for name, given in (
            ("{vpp}", vpp > 1),
            ("{pp_schedule}", o.pp_schedule is not None),
            ("{pp_first_stage_layers}", first is not None),
            ("{pp_last_stage_layers}", last is not None),
            ("{pp_stage_layers}", stage_layers is not None),
        ):
            if given:
                raise InputError(
                    f"{name} changes nothing with {{pp}} 1; accepted: {{pp}} 2 or more, or no {name}"
                )
        return vpp, schedule, first, last, stage_layers
    _refuse_unmodelled("pp", pp, framework, "pipeline", "pipeline parallelism")
    if vpp > 1 and schedule in (PpSchedule.GPIPE, PpSchedule.ONE_F_ONE_B):
        raise InputError(
            f"{{vpp}} {vpp} with {{pp_schedule}} {schedule.value}: it runs one stage per rank; accepted: "
            "{pp_schedule} interleaved-1f1b or zero-bubble, or {vpp} 1"
        )
    if vpp == 1 and schedule is PpSchedule.INTERLEAVED_1F1B:
        raise InputError(
            "{pp_schedule} interleaved-1f1b needs virtual stages; accepted: {vpp} 2 or more, or "
            "{pp_schedule} 1f1b"
        )
    arch = model.architecture
    if arch is None:
        raise InputError(
            f"{{pp}} {pp} splits the model's layers, which needs its architecture; accepted: {{model}} NAME, "
            "config.json or a model TOML"
        )
    _split_check(arch, pp, vpp, first, last, stage_layers)
    return vpp, schedule, first, last, stage_layers


def _stage_layers(given: str | list[int | str] | tuple[int | str, ...] | None) -> tuple[int, ...] | None:
    """``--pp-stage-layers``: a comma list of whole numbers of layers (each checked against the stages and
    the model by :func:`_split_check`)."""
    if given is None:
        return None
    parts = [str(part).strip() for part in given] if isinstance(given, (list, tuple)) else given.split(",")
    refused = InputError(
        f"{{pp_stage_layers}} {shown(given)} is not accepted; accepted: a comma list of whole numbers of "
        "layers, one per virtual stage (8,9,8,7)"
    )
    if not parts or any(not part.strip() for part in parts):
        raise refused
    try:
        return tuple(parse_whole(part, "{pp_stage_layers}", 0, MAX_LAYERS, "layers") for part in parts)
    except InputError:
        raise refused from None


def _split_check(
    arch: Architecture,
    pp: int,
    vpp: int,
    first: int | None,
    last: int | None,
    stage_layers: tuple[int, ...] | None = None,
) -> None:
    """The model's layers over p ranks of v chunks, ``first`` and ``last`` on the first and last rank, or
    ``stage_layers`` on the p·v virtual stages (:func:`~zerocalc.parallel.pipeline.split_problem`,
    Megatron-LM's checks), or one :class:`InputError`."""
    problem = split_problem(arch.num_layers, pp, vpp, first, last, stage_layers)
    if problem is None:
        return
    if stage_layers is not None:
        shape = f"{{pp}} {pp}" + (f" × {{vpp}} {vpp}" if vpp > 1 else "")
        raise InputError(
            f"{{pp_stage_layers}} {','.join(map(str, stage_layers))} with {shape}: {problem}; accepted: "
            f"{pp * vpp} counts of at least 1 layer summing to {arch.name}'s {arch.num_layers}"
        )
    if first is None and last is None:
        raise InputError(
            f"{{pp}} {pp} × {{vpp}} {vpp}: {arch.name}'s {problem}; accepted: {{pp}} × {{vpp}} a divisor of "
            f"{arch.num_layers}, or {{pp_first_stage_layers}} and {{pp_last_stage_layers}}, or "
            "{pp_stage_layers}"
        )
    given = " and ".join(
        f"{name} {n}"
        for name, n in (("{pp_first_stage_layers}", first), ("{pp_last_stage_layers}", last))
        if n is not None
    )
    middle = pp - (first is not None) - (last is not None)
    accepted = (
        f"values that leave {plural(middle, 'middle stage')} an equal share"
        if middle
        else f"{{pp_first_stage_layers}} + {{pp_last_stage_layers}} = {arch.num_layers}"
    )
    raise InputError(
        f"{given} with {{pp}} {pp}{f' × {{vpp}} {vpp}' if vpp > 1 else ''}: of {arch.name}'s "
        f"{arch.num_layers} layers, {problem}; accepted: {accepted}"
        + (f", every stage's layers a multiple of {{vpp}} {vpp}" if vpp > 1 else "")
    )


def _expert_parallel(o: TrainingOptions, framework: Framework, model: ModelSpec, dp_cp: int, cp: int) -> int:
    """``ep``: a divisor of the experts and of the dp × cp ranks it is carved from (Megatron-LM
    ``core/parallel_state.py``; torchtitan ``ParallelDims``, whose EP group takes all of cp)."""
    ep = parse_whole(o.ep, "{ep}", 1, MAX_GPUS, "ranks")
    if ep == 1:
        return ep
    _refuse_unmodelled("ep", ep, framework, "expert_parallel", "expert parallelism")
    arch = model.architecture
    if arch is None or not arch.is_moe:
        what = "a model without its architecture" if arch is None else f"{arch.name}, a dense model"
        raise InputError(
            f"{{ep}} {ep} shards experts, and {{model}} is {what}; accepted: {{model}} a mixture of experts "
            "(mixtral-8x7b, qwen3-30b-a3b, deepseek-v3), or {ep} 1"
        )
    if arch.num_experts % ep:
        raise InputError(
            f"{{ep}} {ep}: {arch.name} has {arch.num_experts} experts, not a multiple of {ep}; "
            f"accepted: {{ep}} a divisor of {arch.num_experts}"
        )
    if dp_cp % ep:
        raise InputError(
            f"{{ep}} {ep} does not divide the {dp_cp} ranks of dp × cp it is carved from; "
            f"accepted: {{ep}} a divisor of {dp_cp}"
        )
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    if expert_parallel is not None and expert_parallel.takes_all_cp and ep % cp:
        raise InputError(
            f"{{ep}} {ep} with {{cp}} {cp}: torchtitan's expert-parallel group takes all of the context-"
            f"parallel ranks (ParallelDims: ep % cp == 0); accepted: {{ep}} a multiple of {cp}"
        )
    return ep


def _dim1_expert_sharding_problem(rank_model: ModelSpec, mesh: Mesh) -> None:
    """torchtitan shards the routed experts on dim 1 when the dp·c ranks outnumber the experts
    (``apply_fsdp``: ``Shard(1)``), and FSDP2 shards a dimension other than 0 only evenly
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` ``_init_sharded_param``: "FSDP does not
    support uneven sharding on dim 1"): each expert tensor's dim 1 must divide by the dp·c/e ranks."""
    arch = rank_model.architecture
    assert arch is not None  # ep > 1 needs the architecture
    ranks = mesh.expert_dp
    if mesh.dp * mesh.cp <= arch.num_experts or ranks == 1:
        return
    for tensor in parameter_tensors(arch):
        rows = tensor.shape[1] if is_expert_tensor(tensor) else 0
        if rows % ranks:
            raise InputError(
                f"{{ep}} {mesh.ep} with {{framework}} fsdp2: torchtitan shards the routed experts on dim 1 "
                f"over the {ranks} expert-data-parallel ranks (dp·cp {mesh.dp * mesh.cp} > "
                f"{arch.num_experts} experts), and {tensor.name}'s {rows:,} rows do not split evenly, which "
                f"FSDP2 refuses; accepted: {{gpus}}, {{cp}} and {{ep}} whose dp·cp/ep divides {rows:,}"
            )


def _capacity_factor(text: float | str, mesh: Mesh, model: ModelSpec) -> float:
    """``capacity_factor``: with expert parallelism only (a rank without it computes all of its own k·T
    routed tokens, however they are spread over the experts), above 0 and at most the most a rank's E/e
    experts can receive, every token of the EP group that routes to them: e·min(k, E/e)/k."""
    if mesh.ep == 1:
        raise InputError(
            f"{{capacity_factor}} {shown(text)} changes nothing with {{ep}} 1: a rank computes all of its "
            "own routed tokens whatever the routing; accepted: {ep} 2 or more, or no {capacity_factor}"
        )
    arch = model.architecture
    assert arch is not None  # ep > 1 needs the architecture
    k, local = arch.experts_per_token, arch.num_experts // mesh.ep
    most = mesh.ep * min(k, local) / k
    accepted = (
        f"a number above 0 and at most {most:g} (e·min(k, E/e)/k: every token routed to a rank's experts)"
    )
    value = parse_fraction(text, "{capacity_factor}", 0, most, accepted)
    if value == 0:
        raise InputError(f"{{capacity_factor}} {shown(text)} is not accepted; accepted: {accepted}")
    return value


def _model_split_problem(
    model: ModelSpec, tp: int, cp: int, cp_impl: CpImpl, sequence_parallel: bool, seq_len: int
) -> None:
    """The tensor-parallel split of heads and widths, and the context-parallel split of the sequence,
    as Megatron-LM checks them (``core/transformer/transformer_config.py``, ``core/parallel_state.py``)."""
    arch = model.architecture
    if arch is None:
        split = f"{{tp}} {tp} splits the model's tensors" if tp > 1 else f"{{cp}} {cp} splits every sequence"
        raise InputError(
            f"{split}, which needs its architecture; accepted: {{model}} NAME, config.json or a model TOML"
        )
    checks: list[tuple[str, str, int, int]] = []
    if tp > 1:
        latent: LatentAttention | None = arch.latent_attention
        checks.append(("{tp}", "attention heads", arch.num_heads, tp))
        if latent is None:
            checks.append(("{tp}", "key/value heads", arch.kv_heads, tp))
        widths = (arch.intermediate_size, arch.dense_intermediate_size, arch.shared_expert_intermediate_size)
        checks += [("{tp}", "MLP width", width, tp) for width in widths if width]
        if arch.qk_norm is QkNorm.FULL:
            raise InputError(
                f"{{tp}} {tp}: {arch.name}'s q/k norms over all heads are not split by tensor parallelism "
                "here; accepted: {tp} 1"
            )
    if cp > 1 and cp_impl is CpImpl.ULYSSES:
        checks.append(("{cp}", "attention heads", arch.num_heads // tp, cp))
        checks.append(("{cp}", "key/value heads", arch.kv_heads // tp, cp))
    for flag, what, count, ranks in checks:
        if count % ranks:
            per_rank = " per tensor-parallel rank" if flag == "{cp}" and tp > 1 else ""
            raise InputError(
                f"{flag} {ranks}: {arch.name} has {count:,} {what}{per_rank}, not a multiple of {ranks}; "
                f"accepted: {flag} a divisor of {count:,}"
            )
    chunks = 2 * cp if cp > 1 and cp_impl is not CpImpl.ULYSSES else cp
    if sequence_parallel:
        chunks *= tp
    if seq_len % chunks:
        why = "2·c load-balanced chunks" if cp > 1 and cp_impl is not CpImpl.ULYSSES else "c chunks"
        if sequence_parallel:
            why += ", each split t ways by sequence parallelism" if cp > 1 else "t sequence-parallel chunks"
        raise InputError(
            f"{{seq_len}} {seq_len:,} does not split into {why}; accepted: {{seq_len}} a multiple of {chunks}"
        )


def _rank_model(model: ModelSpec, mesh: Mesh) -> ModelSpec:
    """What one tensor- and expert-parallel rank holds: its local shards of every tensor, E/e routed experts
    (the model itself at t = e = 1)."""
    arch = model.architecture
    if (mesh.tp == 1 and mesh.ep == 1) or arch is None:
        return model
    vocab_multiple = 128 if mesh.tp_style is TpStyle.MEGATRON else 1
    rank, count = _tp_share(arch, mesh.tp, mesh.ep, vocab_multiple)
    return model.model_copy(update={"params": count.total, "architecture": rank, "parameter_count": count})


@lru_cache(maxsize=1024)
def _tp_share(
    arch: Architecture, tp: int, ep: int, vocab_multiple: int
) -> tuple[TensorParallelRank, ParameterCount]:
    """One tensor- and expert-parallel rank's share of ``arch`` and its count, once per architecture and
    split (a plan asks for each many times)."""
    rank = TensorParallelRank(**dict(arch), tp=tp, ep=ep, vocab_multiple=vocab_multiple)
    return rank, count_parameters(rank)


def _rank_models(model: ModelSpec, mesh: Mesh) -> tuple[ModelSpec, tuple[ModelSpec, ...]]:
    """What one rank holds (:attr:`TrainingRequest.rank_model`) and, with pipeline stages, what each
    pipeline rank holds (:attr:`TrainingRequest.stages`): its chunks' layers
    (:func:`~zerocalc.parallel.pipeline.chunk_layers`) of one tensor-parallel rank's share."""
    rank = _rank_model(model, mesh)
    arch = rank.architecture
    if mesh.pp == 1 or arch is None:
        return rank, ()
    split = mesh_stage_layers(mesh, arch.num_layers)
    return _pipeline_stages(rank.name, rank.title, arch, mesh.pp, mesh.vpp, split)


@lru_cache(maxsize=1024)
def _pipeline_stages(
    name: str | None, title: str | None, arch: Architecture, pp: int, vpp: int, split: tuple[int, ...]
) -> tuple[ModelSpec, tuple[ModelSpec, ...]]:
    """The largest stage and every stage of the model ``name`` (one rank's share, ``arch``) over p ranks of
    v chunks, the p·v virtual stages' layers ``split``; once per model and split (a plan derives many
    requests of each)."""
    stages = []
    for i in range(pp):
        share, count = _stage_share(arch, pp, vpp, i, split)
        stages.append(
            ModelSpec(params=count.total, name=name, title=title, architecture=share, parameter_count=count)
        )
    largest = max(stages, key=lambda stage: stage.params)
    return largest, tuple(stages)


@lru_cache(maxsize=1024)
def _stage_share(
    arch: Architecture, pp: int, vpp: int, stage: int, split: tuple[int, ...]
) -> tuple[Architecture, ParameterCount]:
    """Pipeline rank ``stage``'s share of ``arch`` and its count, its chunks those of the p·v virtual stages'
    layers ``split`` (:func:`~zerocalc.parallel.pipeline.virtual_stage_layers`), once per architecture and
    split (a plan asks for each many times)."""
    chunks = chunk_layers(arch.num_layers, pp, vpp, stage, layers=split)
    layers = tuple(i for chunk in chunks for i in chunk)
    share = pipeline_stage(arch, pp, vpp, stage, layers, tuple(len(chunk) for chunk in chunks))
    return share, count_parameters(share)


def _gpu_choice(name: str, reserve: int | str | None) -> GpuChoice:
    from zerocalc.request.presets import load_gpu

    spec = load_gpu(name)
    context = spec.context_bytes if reserve is None else parse_bytes(reserve, "{reserve}")
    return GpuChoice(
        name=spec.name,
        title=spec.title,
        memory_bytes=spec.memory_bytes,
        usable_bytes=spec.usable_bytes,
        context_bytes=context,
        context_given=reserve is not None,
        context_measured=spec.context_measured,
        names=spec.names,
        bf16=spec.bf16,
        nccl_communicator_bytes=spec.nccl_communicator_bytes,
        cublas_workspace_bytes=spec.cublas_workspace_bytes,
        bf16_dense_tflops=spec.bf16_dense_tflops,
        intra_node_Bps=spec.intra_node_Bps,
        inter_node_Bps=spec.inter_node_Bps,
    )


def _gpu(
    gpu: str | None,
    gpu_memory: int | str | None,
    reserve: int | str | None,
    precision: PrecisionName = PrecisionName.BF16_MIXED,
) -> tuple[GpuChoice | None, int | None, GpuChoice]:
    """(the GPU preset, what PyTorch sees of one GPU, the runtime figures).

    The memory is the preset's usable memory (``torch.cuda.mem_get_info``'s total) or ``gpu_memory``;
    the runtime figures (context, NCCL, cuBLAS workspaces) are the preset's, else :data:`DEFAULT_GPU`'s,
    ``reserve`` overriding the context. The context must leave some of the memory. A recipe holding bf16
    tensors is refused on a GPU whose tensor cores take none (``bf16 = false``: the V100's, fp16 only):
    PyTorch would run its matmuls off the tensor cores, at no rate the preset states.
    """
    if gpu is not None and gpu_memory is not None:
        raise InputError(
            "give {gpu} or {gpu_memory}, not both; accepted: {gpu} h100-80gb or {gpu_memory} 80GiB"
        )
    runtime = _gpu_choice(DEFAULT_GPU if gpu is None else gpu, reserve)
    recipe = RECIPES[precision]
    dtypes = (recipe.param_dtype, recipe.grad_dtype, recipe.master_dtype, recipe.optimizer_state_dtype)
    if not runtime.bf16 and DType.BF16 in dtypes:
        raise InputError(
            f"{{precision}} {precision.value} on the {runtime.title}: its tensor cores take no bf16 (fp16 "
            "only); accepted: {precision} fp16-mixed or fp32"
        )
    if gpu is not None:
        memory, named = runtime.usable_bytes, f"the {runtime.title}'s usable memory"
    elif gpu_memory is not None:
        memory = parse_bytes(gpu_memory, "{gpu_memory}")
        named = f"{{gpu_memory}} {shown(gpu_memory)}"
    else:
        return None, None, runtime
    if runtime.context_bytes >= memory:
        given = "its default" if reserve is None else shown(reserve)
        raise InputError(
            f"{{reserve}} ({given}, {runtime.context_bytes:,} bytes) is not below {named}; "
            "accepted: a smaller {reserve} or a larger memory"
        )
    return (runtime if gpu is not None else None), memory, runtime


def _compute(
    tokens_per_step: int | str | None, tflops: float | str | None
) -> tuple[int | None, float | None]:
    if (tokens_per_step is None) != (tflops is None):
        raise InputError("{tokens_per_step} and {tflops} go together; accepted: both or neither")
    if tokens_per_step is None:
        return None, None
    tokens = parse_count(
        tokens_per_step, "{tokens_per_step}", "a token count such as 4M (4,194,304) or 1e6", MAX_COUNT,
        BINARY_SUFFIXES,
    )  # fmt: skip
    flops = parse_fraction(
        tflops, "{tflops}", 1e-9, MAX_TFLOPS, "achieved TFLOP/s per GPU, e.g. 400 (at most 1,000,000)"
    )
    return tokens, flops


def _links(
    intra_node_bw: str | float | None,
    inter_node_bw: str | float | None,
    latency: str | float | None,
    gpu: GpuChoice | None,
) -> Bandwidths:
    """Intra/inter-node figures: explicit values, then the GPU preset's, then the stated defaults."""
    alpha = DEFAULT_LATENCY_S if latency is None else parse_duration(latency, "{latency}")

    def figure(
        text: str | float | None, which: str, preset_value: float | None, default: float
    ) -> LinkFigures:
        if text is not None:
            option = "{intra_node_bw}" if which == "intra-node" else "{inter_node_bw}"
            return LinkFigures(
                latency_s=alpha,
                bus_bandwidth_Bps=parse_bandwidth(text, option),
                source=BandwidthSource.EXPLICIT,
                detail=f"--{which}-bw",
            )
        if preset_value is not None and gpu is not None:
            return LinkFigures(
                latency_s=alpha,
                bus_bandwidth_Bps=preset_value,
                source=BandwidthSource.GPU_PRESET,
                detail=f"GPU preset {gpu.name}",
            )
        return LinkFigures(
            latency_s=alpha,
            bus_bandwidth_Bps=default,
            source=BandwidthSource.DEFAULT,
            detail=DEFAULT_DETAIL[which],
        )

    return Bandwidths(
        intra_node=figure(
            intra_node_bw, "intra-node", gpu.intra_node_Bps if gpu else None, DEFAULT_INTRA_NODE_BUSBW
        ),
        inter_node=figure(
            inter_node_bw, "inter-node", gpu.inter_node_Bps if gpu else None, DEFAULT_INTER_NODE_BUSBW
        ),
    )


def _compute_calibration(path: str | None) -> str | None:
    if path is not None and str(path).strip() == "":
        raise InputError(
            "{compute_calibration} '' is empty; accepted: a file written by `zerocalc bench --compute`"
        )
    return path


def _calibration(
    calibration: str | Calibration | None, name: str | None
) -> tuple[Calibration | None, str | None]:
    if calibration is None or isinstance(calibration, Calibration):
        return calibration, (name or "calibration") if calibration is not None else None
    from zerocalc.network.calibration import load_calibration

    return load_calibration(calibration), name or str(calibration)


def _normalise(text: str) -> str:
    return text.strip().lower().replace("-", "_")


def strategy_named(text: str) -> Strategy:
    """A strategy by its name or one of its aliases (FSDP names, DeepSpeed stages)."""
    strategy = find_strategy(text)
    if strategy is not None:
        return strategy
    accepted = ", ".join(
        f"{s.name.value} ({', '.join(s.aliases[:3])})" if s.aliases else s.name.value
        for s in STRATEGIES.values()
    )
    raise InputError(f"{{strategies}} {shown(text)} is not known; accepted: all, {accepted}")


def _strategy_names(text: str | list[str] | tuple[str, ...] | None) -> tuple[StrategyName, ...] | None:
    """``all`` or a comma list (or a list of names); None means the framework's default set."""
    if isinstance(text, (list, tuple)):
        text = ",".join(text)
    if text is None or _normalise(text) == "all":
        return None
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise InputError(
            f"{{strategies}} {shown(text)} names no strategy; accepted: all or a comma list of names"
        )
    if any(_normalise(part) == "all" for part in parts):
        raise InputError(
            f"{{strategies}} {shown(text)}: 'all' stands alone; accepted: all, or a comma list of names"
        )
    return tuple(dict.fromkeys(strategy_named(part).name for part in parts))


_GROUP_WORDS = {
    RankGroup.WORLD: "the world",
    RankGroup.NODE: "each node",
    RankGroup.ACROSS_NODES: "groups of one rank per node",
}


def offload_problem(strategy: Strategy, request: TrainingRequest) -> str | None:
    """Why ``strategy`` cannot do the requested offload, or None."""
    if (
        request.offload_optimizer is not OffloadTarget.NONE
        and request.offload_optimizer not in strategy.optimizer_offload
    ):
        can = ", ".join(t.value for t in strategy.optimizer_offload) or "nothing"
        return f"{{offload_optimizer}} {request.offload_optimizer.value}: {strategy.title} can offload {can}"
    if (
        request.offload_params is not OffloadTarget.NONE
        and request.offload_params not in strategy.param_offload
    ):
        if strategy.params is None:
            return (
                f"{{offload_params}} {request.offload_params.value}: {strategy.title} keeps whole parameters "
                "on every GPU; only zero3 can offload parameters"
            )
        return (
            f"{{offload_params}} {request.offload_params.value}: {strategy.title} shards parameters within "
            f"{_GROUP_WORDS[strategy.params]}, and parameter offload is modelled for zero3 only (DeepSpeed "
            "offload_param)"
        )
    return None


def _resolve_strategies(request: TrainingRequest) -> TrainingRequest:
    """Keep the strategies that can run: an explicit one that cannot is an error, a default one a note."""
    framework = request.framework
    supported = framework_strategies(framework)
    if request.strategies_explicit:
        for name in request.strategies:
            if name not in supported:
                names = ", ".join(s.value for s in supported)
                raise InputError(
                    f"{{framework}} {framework.value} models {names}; {name.value} is not one of them; "
                    f"accepted: {{strategies}} {names}"
                )
    record = FRAMEWORKS[framework]
    if request.estimate is Estimate.MEMORY:
        problem = record_problem(record, request)
        if problem:
            raise InputError(problem)
    if request.estimate is Estimate.COMM:
        problem = _comm_problem(request)
        if problem is None:
            problem = offload_record_problem(record, request)
        if problem:
            raise InputError(problem)
    chosen: list[StrategyName] = []
    notes: list[str] = []
    for name in request.strategies:
        strategy = STRATEGIES[name]
        problem = offload_problem(strategy, request)
        if problem is None and request.estimate is Estimate.MEMORY:
            problem = architecture_problem(record, name, request)
        if problem is None and name is StrategyName.HYBRID_SHARD:
            problem = request.cluster.whole_nodes_problem()
        if problem is None:
            chosen.append(name)
        elif request.strategies_explicit:
            raise InputError(problem)
        else:
            notes.append(f"{strategy.title} left out: {problem}")
    if not chosen:
        raise InputError("no strategy can run with these options: " + "; ".join(notes))
    resolved = (
        request  # nothing left out (every explicit strategy): the same fields, no copy
        if tuple(chosen) == request.strategies and tuple(notes) == request.strategy_notes
        else request.model_copy(update={"strategies": tuple(chosen), "strategy_notes": tuple(notes)})
    )
    problem = _grad_sync_problem(resolved) or _zeropp_problem(resolved) or _micro_batches_problem(resolved)
    if problem:
        raise InputError(problem)
    return resolved


def request_with(request: TrainingRequest, **changes: object) -> TrainingRequest:
    """A request with some of its typed fields changed, checked again as :func:`parse_request` checks a
    request (its strategies resolved afresh): the request that parsing the changed options gives, where the
    changes stay within the parser's bounds and the strategies are explicit. ``zerocalc plan`` derives its
    hundreds of candidate requests so (tests/plan/test_plan.py compares each with the parser's)."""
    if not changes.get("strategies_explicit", request.strategies_explicit):
        raise ValueError("request_with needs explicit strategies (a default set resolves to other notes)")
    if ("cluster" in changes or "framework" in changes) and "mesh" not in changes:
        if request.mesh.model_parallel:
            raise ValueError("request_with changes the cluster of a model-parallel mesh: give its mesh")
        cluster = changes.get("cluster", request.cluster)
        assert isinstance(cluster, Cluster)
        framework = changes.get("framework", request.framework)
        assert isinstance(framework, Framework)
        changes["mesh"] = data_parallel_mesh(cluster.world_size, cluster.ranks_per_node, framework)
    elif "mesh" in changes and changes["mesh"] != request.mesh:
        mesh = changes["mesh"]
        assert isinstance(mesh, Mesh)
        changes["cluster"] = mesh.data_cluster()
        if "rank_model" not in changes:
            model = changes.get("model", request.model)
            assert isinstance(model, ModelSpec)
            changes["rank_model"], changes["stages"] = _rank_models(model, mesh)
    if "model" in changes and "rank_model" not in changes:
        model = changes["model"]
        assert isinstance(model, ModelSpec)
        mesh = changes.get("mesh", request.mesh)
        assert isinstance(mesh, Mesh)
        changes["rank_model"], changes["stages"] = _rank_models(model, mesh)
    changed = request.model_copy(update={**changes, "strategy_notes": ()})
    if changed.mesh.model_parallel:
        _mesh_change_problem(changed)
        resolved = _resolve_strategies(changed)
        problem = _model_code_problem(resolved)
        if problem:
            raise InputError(problem)
        return resolved
    return _resolve_strategies(changed)


def with_model(request: TrainingRequest, model: ModelSpec) -> TrainingRequest:
    """The same request for another model (its tensor-parallel share recounted), unchecked: the caller
    derives it from a request already checked (a plan's model cut to fewer layers)."""
    rank_model, stages = _rank_models(model, request.mesh)
    return request.model_copy(update={"model": model, "rank_model": rank_model, "stages": stages})


def stage_request(request: TrainingRequest, stage: int) -> TrainingRequest:
    """The request as pipeline rank ``stage`` runs it: its share of the model (``request.stages``)."""
    return request.model_copy(update={"rank_model": request.stages[stage]})


def _micro_batches_problem(request: TrainingRequest) -> str | None:
    """The interleaved schedules run the micro-batches in groups of p (Megatron-LM
    ``forward_backward_pipelining_with_interleaving``: ``microbatch_group_size_per_vp_stage`` defaults to
    p, and M must be a multiple of it; torch's interleaved schedules split M into rounds of p)."""
    mesh = request.mesh
    if mesh.pp == 1 or mesh.pp_schedule not in INTERLEAVED or request.grad_accum % mesh.pp == 0:
        return None
    return (
        f"{{grad_accum}} {request.grad_accum} with {{pp_schedule}} {mesh.pp_schedule.value} over {{pp}} "
        f"{mesh.pp}: its micro-batches run in groups of {mesh.pp}; accepted: {{grad_accum}} a multiple of "
        f"{mesh.pp}"
    )


def _comm_problem(request: TrainingRequest) -> str | None:
    """What the communication model cannot do for this request, or None."""
    record = FRAMEWORKS[request.framework]
    if record.param_layout is ParamLayout.AUTOCAST and request.reduce_dtype is not None:
        stored = record.dtypes(request.precision).stored
        if request.reduce_dtype is not stored:
            return (
                f"{{reduce_dtype}} {request.reduce_dtype.value}: DDP reduces gradients in the parameters' "
                f"dtype, {stored.value} under {request.precision.value} (autocast keeps them); accepted: no "
                "{reduce_dtype} (a comm hook such as bf16_compress_hook is not modelled)"
            )
    return None


def _grad_sync_problem(request: TrainingRequest) -> str | None:
    """An explicit strategy whose framework fixes when gradients are reduced, asked to do otherwise."""
    asked = request.grad_sync
    if asked is None or not request.strategies_explicit:
        return None
    record = FRAMEWORKS[request.framework]
    for name in request.strategies:
        fixed = record.setup(name).grad_sync
        if fixed is None and request.mesh.pp > 1:
            fixed = record.pipeline_grad_sync
        if fixed is not None and fixed is not asked:
            when = "every micro-batch" if fixed is GradSync.EVERY else "once per step"
            return (
                f"{{grad_sync}} {asked.value}: {record.title_of(name)} reduces gradients "
                f"{when} under {{framework}} {request.framework.value}; "
                f"accepted: {{grad_sync}} {fixed.value}, or no {{grad_sync}}"
            )
    return None


def _zeropp_problem(request: TrainingRequest) -> str | None:
    """ZeRO++ needs DeepSpeed ZeRO-3; hpZ whole nodes; qgZ each tensor's shape."""
    if not request.zeropp:
        return None
    if request.mesh.ep > 1:
        return (
            f"{{zeropp}} with {{ep}} {request.mesh.ep}: ZeRO++ over expert-data-parallel groups is not "
            "modelled; accepted: no {zeropp}, or {ep} 1"
        )
    takes = [n for n in request.strategies if FRAMEWORKS[request.framework].setup(n).zeropp]
    if not takes:
        return (
            "{zeropp} is DeepSpeed ZeRO-3's (ZeRO++); "
            "accepted: {framework} deepspeed with {strategies} zero3, or no {zeropp}"
        )
    cluster = request.cluster
    if ZeroPP.HPZ in request.zeropp and cluster.world_size % cluster.ranks_per_node:
        return (
            f"{{zeropp}} hpz with {{gpus}} {cluster.world_size}: zero_hpz_partition_size "
            f"({{gpus_per_node}} {cluster.gpus_per_node}) must divide the world; "
            f"accepted: {{gpus}} a multiple of {cluster.ranks_per_node}"
        )
    if ZeroPP.QGZ in request.zeropp and request.model.architecture is None:
        return (
            "{zeropp} qgz: its scales follow each gradient's shape; "
            "accepted: {model} NAME or config.json, or {zeropp} without qgz"
        )
    return None


OptionsT = TypeVar("OptionsT", bound=BaseModel)


def options_from_keywords(options: type[OptionsT], values: dict[str, object]) -> OptionsT:
    """``options(**values)``, a value of the wrong type an :class:`InputError` naming its concept."""
    try:
        return options(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "_".join(str(p) for p in first["loc"][:1]) or "options"
        raise InputError(f"{{{where}}} is not accepted ({first['msg']})") from None


def parse_options(**values: object) -> TrainingRequest:
    """:func:`parse_request` from keywords; a value of the wrong type is an InputError too."""
    return parse_request(options_from_keywords(TrainingOptions, values))
