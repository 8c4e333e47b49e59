"""One training request: its inputs, typed, and what is derived from them.

Everything a user types (``--params 7B``, ``--gpu h100-80gb``, ``--strategy zero2,zero3``, a scenario's
TOML fields, a library call's keywords) arrives as :class:`~zerocalc.request.options_model.TrainingOptions`,
raw. :func:`parse_request` turns each value into a typed one (numbers with their units resolved, presets and
config.json files loaded once per process, :mod:`zerocalc.request.presets`, the calibration file read, each
value's bounds checked) and builds a frozen :class:`TrainingRequest` of them; then
:func:`~zerocalc.request.checks.check` checks how its fields relate (one
:class:`~zerocalc.base.errors.InputError` line per problem). The request holds only its inputs: what is
derived from them (the data-parallel cluster, the rank's model, the pipeline stages, the runtime figures,
the dtypes) are properties computed from them (and cached by the inputs they read, never in the request: a
copy has no stale value). :meth:`TrainingRequest.with_` is the one way to vary a request: a copy with some
typed inputs replaced, checked again. The core (:mod:`zerocalc.states.memory`,
:mod:`zerocalc.comm.estimate`, :mod:`zerocalc.peak`) takes only the typed request: it never parses a
string, reads a file or looks at the environment.

Error messages name each input by its concept, written ``{name}``: the field names below, which are also
the keyword names of :mod:`zerocalc.api`; the CLI shows its flags instead (:mod:`zerocalc.cli`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType, parse_dtype
from zerocalc.base.errors import InputError, shown
from zerocalc.base.memo import IdentityCache
from zerocalc.base.units import parse_bytes, parse_whole
from zerocalc.model.activations import CpImpl, Recompute
from zerocalc.model.architecture import Architecture
from zerocalc.model.code import TORCHTUNE_OUTPUT_CHUNKS, Compiled, LossImpl, ModelImplName, OutputKept, Shape
from zerocalc.network.calibration import Calibration
from zerocalc.network.cluster import Cluster
from zerocalc.network.links import Bandwidths
from zerocalc.network.schedule import GradSync, ZeroPP
from zerocalc.parallel.finetune import (
    AdapterOpDtypes,
    FineTuning,
    ForwardWeights,
    adapter_op_dtypes,
    forward_weights,
)
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.framework_records import FRAMEWORKS, default_strategies
from zerocalc.parallel.framework_records.record import FrameworkRecord, ModelInit, Wrap
from zerocalc.parallel.frameworks import Estimate, Framework
from zerocalc.parallel.mesh import Mesh
from zerocalc.parallel.optimizers import OptimizerImpl, OptimizerName
from zerocalc.parallel.precision import RECIPES, PrecisionName, TensorDtypes
from zerocalc.parallel.strategies import OffloadTarget, StrategyName
from zerocalc.request.checks import check
from zerocalc.request.finetune import parse_finetune, recompute_of
from zerocalc.request.fp8 import fp8_notes, parse_fp8
from zerocalc.request.gpu import (
    GpuChoice,
    calibration_of,
    compute_calibration_path,
    link_figures,
    parse_gpu,
    runtime_of,
)
from zerocalc.request.mesh_checks import parse_capacity_factor, parse_cluster, parse_mesh
from zerocalc.request.model_spec import ModelSpec, model_notes_of, model_spec, rank_models, seq_len_of
from zerocalc.request.options_model import TrainingOptions, options_from_keywords
from zerocalc.request.overlap import OverlapOptions, parse_overlap
from zerocalc.request.savers import parse_loss
from zerocalc.request.values import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    DEFAULT_DEEPSPEED_BUCKET_ELEMENTS,
    DEFAULT_MICRO_BATCH,
    DEFAULT_PREFETCH,
    DEFAULT_SEQ_LEN,
    MAX_CHECKPOINT_EVERY,
    MAX_GRAD_ACCUM,
    MAX_MICRO_BATCH,
    MAX_PREFETCH,
    MAX_SEQ_LEN,
    bucket_elements,
    choice,
    compute_comparison,
    offload_target,
    optimizer_named,
    strategy_names,
    zeropp_features,
)


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
    loss: LossImpl = Field(
        default=LossImpl.FULL,
        description="the cross-entropy: the model code's, torchtune's chunked or Liger's fused linear one",
    )
    loss_chunks: int = Field(
        default=TORCHTUNE_OUTPUT_CHUNKS, ge=1, description="torchtune's num_output_chunks (--loss chunked)"
    )
    keep_output: OutputKept = Field(
        default=OutputKept.NONE,
        description="how long the training loop holds the model's output (its logits): only the loss, to "
        "the end of the step, or until the next forward returns",
    )
    compile: Compiled = Field(
        default=Compiled.NONE,
        description="the parts of the step torch.compile runs (--compile; zerocalc.model.code.compiled)",
    )
    offload: bool = Field(
        default=False,
        description="the forward's saved tensors offloaded to pinned host memory (torchtune's "
        "OffloadActivations, --offload-activations)",
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
    """A request's inputs, typed and checked. Build it with :func:`parse_request`, vary it with
    :meth:`with_`."""

    model_config = ConfigDict(frozen=True)

    estimate: Estimate = Estimate.MEMORY
    model: ModelSpec
    """The whole model, as given."""
    mesh: Mesh
    stage: int | None = Field(
        default=None,
        description="the pipeline rank the request is evaluated for (its share of the model, rank_model); "
        "None: the largest stage",
    )
    tp_across_nodes: bool = Field(default=False, description="a TP group may span nodes")
    overlap: OverlapOptions = OverlapOptions()
    """The frameworks' communication overlaps beyond their defaults (:mod:`zerocalc.request.overlap`)."""
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
    """The strategies to evaluate, each able to run with these options (the check's result where they are
    not explicit: the framework's default set less those left out)."""
    strategies_explicit: bool = True
    strategy_notes: tuple[str, ...] = ()
    """Strategies of the default set left out, and why (the check's result)."""
    reduce_dtype: DType | None = Field(default=None, description="None: the gradient dtype")
    fp8: Fp8Setting = NO_FP8
    activations: ActivationOptions = ActivationOptions()
    buffers: BufferOptions = BufferOptions()
    gpu: GpuChoice | None = None
    """The GPU preset, as the preset gives it."""
    gpu_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="what PyTorch sees of one GPU (torch.cuda.mem_get_info's total): the GPU preset's "
        "usable memory or --gpu-memory; None: no fits/headroom",
    )
    reserve_bytes: int | None = Field(
        default=None,
        ge=0,
        description="--reserve: the context outside the caching allocator; None: the GPU's",
    )
    grad_accum: int = Field(default=1, ge=1, le=MAX_GRAD_ACCUM)
    grad_sync: GradSync | None = Field(
        default=None, description="asked for; None: each framework's default (strategies.effective_grad_sync)"
    )
    zeropp: tuple[ZeroPP, ...] = Field(default=(), description="DeepSpeed ZeRO++ features (ZeRO-3)")
    model_impl: ModelImplName = ModelImplName.HF
    optimizer_impl: OptimizerImpl = OptimizerImpl.FOREACH
    expandable_segments: bool = False
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
    optimizer_in_backward: bool = False
    """Each trained parameter stepped by its own optimizer in its post-accumulate-grad hook, its gradient
    freed then (torchtune's ``optimizer_in_bwd``, :mod:`zerocalc.request.savers`)."""
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

    def with_(self, **changes: Any) -> TrainingRequest:
        """This request with the typed inputs ``changes`` replaced, checked again
        (:func:`~zerocalc.request.checks.check`: the checks that read what changed; strategies that are not
        explicit resolved afresh from the framework's default set): the request parsing the changed options
        gives. Raises :class:`InputError` for the first problem, ``TypeError`` for a name that is not an
        input."""
        fields = type(self).model_fields
        if not changes.keys() <= fields.keys():
            unknown = sorted(set(changes) - fields.keys())
            raise TypeError(f"TrainingRequest.with_: {', '.join(unknown)} not inputs of a request")
        changed = replaced(self, changes)
        return check(changed, _changed_paths(self, changed, changes))

    # ------------------------------------------------------------------------------- derived from inputs
    @property
    def cluster(self) -> Cluster:
        """The dp × cp ranks model states are sharded over and gradients reduced across
        (:meth:`~zerocalc.parallel.mesh.Mesh.data_cluster`): the whole run without tensor, context and
        pipeline parallelism."""
        return _data_cluster(self.mesh)

    @property
    def stages(self) -> tuple[ModelSpec, ...]:
        """With pipeline parallelism, what each pipeline rank holds (:class:`~zerocalc.model.architecture.
        PipelineStage`), rank 0 first; empty at p = 1 (:func:`~zerocalc.request.model_spec.rank_models`)."""
        return rank_models(self.model, self.mesh)[1]

    @property
    def rank_model(self) -> ModelSpec:
        """What one tensor-parallel rank holds of the model (:class:`~zerocalc.model.architecture.
        TensorParallelRank`): the model itself without tensor or pipeline parallelism; with pipeline stages,
        :attr:`stage`'s, else the stage with the most parameters (the first such). Model states and the
        peak count this."""
        largest, stages = rank_models(self.model, self.mesh)
        return largest if self.stage is None else stages[self.stage]

    @property
    def runtime(self) -> GpuChoice:
        """The GPU's runtime figures (context, NCCL, workspaces): the preset's, else ``DEFAULT_GPU``'s;
        ``context_bytes`` is ``reserve`` when given (:func:`~zerocalc.request.gpu.runtime_of`)."""
        return runtime_of(self.gpu, self.reserve_bytes)

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
    def sequence_split(self) -> SequenceSplit:
        """How one rank of the mesh splits each sequence: tensor and sequence parallelism, context parallelism
        and its implementation (which c = 1 runs none of)."""
        return _sequence_split(self.mesh)

    @property
    def rank_shape(self) -> Shape:
        """One micro-batch on one rank of the mesh: b sequences of s tokens, split as
        :attr:`sequence_split` says (:class:`~zerocalc.model.model_impl.Shape`)."""
        a = self.activations
        return _shape(a.micro_batch, a.seq_len, self.sequence_split)

    @property
    def recipe_dtypes(self) -> TensorDtypes:
        """The dtype of every tensor role under this recipe and framework, the reduction the framework's
        own (:attr:`dtypes` without ``--reduce-dtype``: what the roles but the reduction read)."""
        return FRAMEWORKS[self.framework].dtypes(self.precision)

    @property
    def activation_dtype(self) -> DType:
        """The dtype of the activations (the compute dtype: ``dtypes.activation``, which
        ``--reduce-dtype`` does not change)."""
        return _activation_dtype(self.framework, self.precision)

    @property
    def forward_weights(self) -> ForwardWeights | None:
        """What a fine-tuning forward reads off its weights as this framework keeps them under this recipe
        (:func:`~zerocalc.parallel.finetune.forward_weights`); None: full training."""
        if self.finetune is None:
            return None
        return forward_weights(self.finetune, self.framework_record.param_layout, self.precision)

    @property
    def adapter_op_dtypes(self) -> AdapterOpDtypes | None:
        """The dtypes the fine-tuning's own operations run in (:func:`~zerocalc.parallel.finetune.
        adapter_op_dtypes`, the precision record's under this framework); None: full training."""
        finetune = self.finetune
        if finetune is None:
            return None
        record = self.framework_record
        return adapter_op_dtypes(
            finetune, self.precision, record.param_layout, record.main_grad_dtype, self.reduce_dtype
        )

    @property
    def accumulates(self) -> bool:
        """A > 1: the step's micro-batches accumulate gradients (what a step's mechanics read of A)."""
        return self.grad_accum > 1

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
        arch = self.rank_model.architecture
        if arch is None:  # pragma: no cover - the checks guarantee it where needed
            raise InputError("this estimate needs an architecture; accepted: {model} NAME or config.json")
        return arch


DERIVED = (
    "cluster", "stages", "rank_model", "runtime", "states_capacity_bytes", "framework_record", "dtypes",
    "sequence_split", "rank_shape", "recipe_dtypes", "activation_dtype", "accumulates", "model_code", "init",
    "zero_init", "architecture", "adapter_op_dtypes",
)  # fmt: skip
"""The request's properties derived from its inputs (tests/test_parts.py resolves each to what it reads)."""


class SequenceSplit(NamedTuple):
    """How one rank splits each sequence (:attr:`TrainingRequest.sequence_split`)."""

    tp: int
    sequence_parallel: bool
    cp: int
    cp_impl: CpImpl


@lru_cache(maxsize=4096)
def _shape(b: int, s: int, split: SequenceSplit) -> Shape:
    tp, sequence_parallel, cp, cp_impl = split
    return Shape(b, s, tp=tp, sequence_parallel=sequence_parallel, cp=cp, cp_impl=cp_impl)


_SPLITS: IdentityCache[SequenceSplit] = IdentityCache()


def _sequence_split(mesh: Mesh) -> SequenceSplit:
    """:attr:`TrainingRequest.sequence_split`, once per mesh (by identity)."""
    split = _SPLITS.get(mesh, None)
    if split is None:
        cp_impl = mesh.cp_impl if mesh.cp > 1 else CpImpl.RING
        split = _SPLITS.put(mesh, None, SequenceSplit(mesh.tp, mesh.sequence_parallel, mesh.cp, cp_impl))
    return split


@lru_cache(maxsize=64)
def _activation_dtype(framework: Framework, precision: PrecisionName) -> DType:
    return FRAMEWORKS[framework].dtypes(precision).activation


def replaced(model: ModelT, update: dict[str, Any]) -> ModelT:
    """A frozen model with the fields of ``update`` replaced, unvalidated (pydantic's ``model_copy(update=)``
    without its generic copies: a plan varies thousands of requests)."""
    kind = type(model)
    copied = _new(kind)
    _set(copied, "__dict__", {**model.__dict__, **update})
    fields_set = model.__pydantic_fields_set__  # shared where it already names them (a frozen model's)
    if not update.keys() <= fields_set:
        fields_set = fields_set | update.keys()
    _set(copied, "__pydantic_fields_set__", fields_set)
    _set(copied, "__pydantic_extra__", None)
    _set(copied, "__pydantic_private__", None)
    return copied


_new = object.__new__
_set = object.__setattr__


ModelT = TypeVar("ModelT", bound=BaseModel)


_CLUSTERS: IdentityCache[Cluster] = IdentityCache()


def _data_cluster(mesh: Mesh) -> Cluster:
    """:meth:`~zerocalc.parallel.mesh.Mesh.data_cluster`, once per mesh (by identity)."""
    cluster = _CLUSTERS.get(mesh, None)
    if cluster is None:
        cluster = _CLUSTERS.put(mesh, None, mesh.data_cluster())
    return cluster


def _changed_paths(before: BaseModel, after: BaseModel, changes: dict[str, Any]) -> frozenset[str]:
    """The paths by which ``after`` differs from ``before`` in ``changes``' fields: a field of a sub-model
    where only some of its fields changed (``activations.micro_batch``), else the field."""
    paths: list[str] = []
    olds = before.__dict__
    for name, new in changes.items():
        old = olds[name]
        if old is new:
            continue
        fields = _SUB_MODELS.get(type(old))
        if fields is not None and type(new) is type(old):
            old_values, new_values = old.__dict__, new.__dict__
            for field, path in fields[name]:
                if old_values[field] != new_values[field]:
                    paths.append(path)
        elif old != new:
            paths.append(name)
    return frozenset(paths)


_SUB_MODELS = {
    kind: {name: tuple((field, f"{name}.{field}") for field in kind.model_fields) for name in names}
    for kind, names in (
        (ActivationOptions, ("activations",)),
        (BufferOptions, ("buffers",)),
        (Mesh, ("mesh",)),
    )
}
"""The sub-models whose fields a check may read apart (``activations.micro_batch``): per field of the request
holding one, each field and its path."""


# ---------------------------------------------------------------------------------------------- parsing
def parse_request(options: TrainingOptions) -> TrainingRequest:
    """Each option parsed into its typed value (its bounds, and the relations whose messages name values
    as typed, checked here), the request built of them, then checked
    (:func:`~zerocalc.request.checks.check`); raises one :class:`InputError` naming the first problem."""
    o = options
    model = model_spec(o.params, o.model)
    whole = parse_cluster(o.gpus, o.gpus_per_node)
    precision = choice(o.precision, "{precision}", PrecisionName, {"_": "-"})
    optimizer = optimizer_named(o.optimizer)
    offload_optimizer = offload_target(o.offload_optimizer, "{offload_optimizer}")
    offload_params = offload_target(o.offload_params, "{offload_params}")
    framework = choice(o.framework, "{framework}", Framework, {"_": "-"})
    grad_dtype = RECIPES[precision].grad_dtype  # the recipe's gradients, or fp32
    reduce_dtype = (
        None
        if o.reduce_dtype is None
        else parse_dtype(o.reduce_dtype, "{reduce_dtype}", allowed=(DType.FP32, grad_dtype))
    )
    seq_len, position_notes = seq_len_of(o.seq_len, model)
    finetune = parse_finetune(o, model)
    recompute, recompute_notes = recompute_of(o.recompute, finetune)
    activations = ActivationOptions(
        seq_len=seq_len,
        micro_batch=parse_whole(o.micro_batch, "{micro_batch}", 1, MAX_MICRO_BATCH, "sequences"),
        recompute=recompute,
        checkpoint_every=parse_whole(
            o.checkpoint_every, "{checkpoint_every}", 1, MAX_CHECKPOINT_EVERY, "layers"
        ),
        flash_attention=o.flash_attention,
    )
    loss, loss_chunks = parse_loss(o.loss, o.loss_chunks)
    activations = activations.model_copy(
        update={
            "loss": loss,
            "loss_chunks": loss_chunks,
            "keep_output": choice(o.keep_output, "{keep_output}", OutputKept),
            "offload": o.offload_activations,
            "compile": choice(o.compile, "{compile}", Compiled, aliases={"loss,model": Compiled.MODEL_LOSS}),
        }
    )
    model_impl = choice(o.model_impl, "{model_impl}", ModelImplName)
    mesh = parse_mesh(o, whole, framework, model_impl, model)
    if o.capacity_factor is not None:
        activations = activations.model_copy(
            update={"capacity_factor": parse_capacity_factor(o.capacity_factor, mesh, model)}
        )
    ddp_bucket = DDP_BUCKET_BYTES if o.ddp_bucket is None else parse_bytes(o.ddp_bucket, "{ddp_bucket}")
    buffers = BufferOptions(
        prefetch=parse_whole(o.prefetch, "{prefetch}", 0, MAX_PREFETCH, "units"),
        wrap=choice(o.wrap, "{wrap}", Wrap),
        ddp_bucket_bytes=ddp_bucket,
        ddp_first_bucket_bytes=DDP_FIRST_BUCKET_BYTES if o.ddp_bucket is None else ddp_bucket,
        reduce_bucket_elements=bucket_elements(o.reduce_bucket, "{reduce_bucket}"),
        allgather_bucket_elements=bucket_elements(o.allgather_bucket, "{allgather_bucket}"),
    )
    gpu, gpu_memory, reserve_bytes = parse_gpu(o.gpu, o.gpu_memory, o.reserve, precision)
    grad_accum = parse_whole(o.grad_accum, "{grad_accum}", 1, MAX_GRAD_ACCUM, "micro-batches")
    grad_sync = None if o.grad_sync is None else choice(o.grad_sync, "{grad_sync}", GradSync)
    zeropp = zeropp_features(o.zeropp)
    tokens, tflops = compute_comparison(o.tokens_per_step, o.tflops)
    links = link_figures(o.intra_node_bw, o.inter_node_bw, o.latency, gpu)
    calibration, calibration_name = calibration_of(o.calibration, o.calibration_name)
    explicit = strategy_names(o.strategies)
    strategies = explicit or default_strategies(framework)
    overlap = parse_overlap(
        o.overlap_grad_reduce,
        o.overlap_param_gather,
        o.tp_comm_overlap,
        o.overlap_comm,
        framework,
        mesh,
        strategies,
        o.async_tp,
        FRAMEWORKS[framework].model_code or model_impl,
        activations.compile,
    )
    problem = _ignored_problem(o, gpu_memory, model, o.estimate)
    if problem:
        raise InputError(problem)
    request = TrainingRequest(
        estimate=o.estimate,
        model=model,
        mesh=mesh,
        tp_across_nodes=o.tp_across_nodes,
        overlap=overlap,
        precision=precision,
        optimizer=optimizer,
        fp32_grad_accum=o.fp32_grad_accum,
        init_asked=None if o.init is None else choice(o.init, "{init}", ModelInit),
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        framework=framework,
        strategies=strategies,
        strategies_explicit=explicit is not None,
        reduce_dtype=reduce_dtype,
        fp8=(fp8 := parse_fp8(o, framework, model_impl)),
        activations=activations,
        buffers=buffers,
        gpu=gpu,
        gpu_memory_bytes=gpu_memory,
        reserve_bytes=reserve_bytes,
        grad_accum=grad_accum,
        grad_sync=grad_sync,
        zeropp=zeropp,
        model_impl=model_impl,
        optimizer_impl=choice(o.optimizer_impl, "{optimizer_impl}", OptimizerImpl, {"_": "-"}),
        expandable_segments=o.expandable_segments,
        optimizer_in_backward=o.optimizer_in_backward,
        links=links,
        tokens_per_step=tokens,
        tflops=tflops,
        calibration=calibration,
        calibration_name=calibration_name,
        compute_calibration=compute_calibration_path(o.compute_calibration),
        notes=(*model_notes_of(o.model), *position_notes, *recompute_notes),
        finetune=finetune,
    )
    request = check(request)  # the stages are checked before the rank's model is built for the notes
    converted = fp8_notes(fp8, rank_models(model, mesh)[0].architecture)
    return request.model_copy(update={"notes": (*request.notes, *converted)}) if converted else request


def _ignored_problem(
    options: TrainingOptions, gpu_memory: int | None, model: ModelSpec, estimate: Estimate
) -> str | None:
    """An option given that changes nothing in this request (never ignored silently), or None."""
    if (
        options.reserve is not None
        and gpu_memory is None
        and model.architecture is None
        and estimate is Estimate.MEMORY
    ):
        return (
            f"{{reserve}} {shown(options.reserve)} changes nothing here: it is subtracted from a GPU's "
            "memory ({gpu} or {gpu_memory}) or added to the peak of a step ({model}); accepted: {reserve} "
            "with one of them, or no {reserve}"
        )
    return None


def parse_options(**values: object) -> TrainingRequest:
    """:func:`parse_request` from keywords; a value of the wrong type is an InputError too."""
    return parse_request(options_from_keywords(TrainingOptions, values))
