"""The peak per GPU of one training step, per strategy (pure): request → :class:`MemoryReport`.

The peak is the maximum over the events of one step's timeline (:mod:`zerocalc.peak.simulate`), not a
sum of terms:

* model states: the framework's accounting (:data:`~zerocalc.parallel.framework_records.FRAMEWORKS`,
  lines built by :mod:`zerocalc.peak.states`) — resident for the accountings, simulated tensor by tensor
  for PyTorch's frameworks (:mod:`zerocalc.peak.mechanics`);
* activations and the loss: the model's code (``--model-impl``, :mod:`zerocalc.model.code`), layer by
  layer; data parallelism never shards them;
* the allocator's reserve: the caching allocator replayed over model creation and three steps
  (:mod:`zerocalc.peak.allocator`);
* outside the allocator: the GPU preset's measured context (``--reserve`` overrides it) and one NCCL
  communicator per process group of more than one rank the strategy's collectives use.

``peak_bytes`` (reserved + context + NCCL) is what ``cudaMemGetInfo`` shows used; it is compared with what
PyTorch sees of the GPU. Within :data:`FIT_MARGIN` of it the verdict is "tight", never "fits".
"""

from __future__ import annotations

import re

from zerocalc.base.dtypes import DType
from zerocalc.base.parts import Part
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import PipelineStage
from zerocalc.model.code import MODEL_CODES, AttentionKernel, Device, loss_source
from zerocalc.network.cluster import Cluster
from zerocalc.parallel.finetune import parameter_kinds
from zerocalc.parallel.framework_records.record import FrameworkRecord, ModelInit, StatesModel, Wrap
from zerocalc.parallel.frameworks import TORCH_SOURCES
from zerocalc.parallel.mesh import Mesh
from zerocalc.parallel.pipeline import in_flight
from zerocalc.parallel.precision import ParamKind, tensor_dtypes
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, Strategy, StrategyName
from zerocalc.peak.finetune import FINETUNE_SOURCES, finetune_note
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.report import (
    FrameworkStates,
    MemoryReport,
    PeakEstimate,
    PeakOptions,
    PeakTerm,
    PhasePeak,
    StagePeak,
    StateLine,
    StrategyPeak,
    TimelineEvent,
    Verdict,
)
from zerocalc.peak.simulate import (
    StepResult,
    activation_bytes,
    flash_attention_used,
    runtime_for,
    simulate,
    stage_window,
    step_shape,
)
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.peak.timeline import Runtime, offloaded_host_bytes
from zerocalc.request.training import TrainingRequest
from zerocalc.states.memory import MemoryEstimate, evaluate_memory

FIT_MARGIN = 0.05
"""A peak within 5% of the GPU's memory is "tight", not "fits": on the eight H100 and five H200 runs the
device footprint was predicted from −5.0% to +0.8%; the margin keeps an unmeasured model from being told it
fits when it would not."""


def nccl_communicators(strategy: Strategy, cluster: Cluster, mesh: Mesh | None = None) -> int:
    """NCCL communicators of more than one rank: one per kind of process group the strategy's collectives
    use (FULL_SHARD: the data-parallel group; HYBRID_SHARD: the node and across nodes), plus the tensor- and
    context-parallel groups of the mesh where they have more than one rank, the pipeline group, whose
    batched sends and receives (``batch_isend_irecv``) run on its communicator, and under expert parallelism
    the EP group (its all-to-alls) and the expert-data-parallel groups the routed experts' collectives use.
    NCCL creates one lazily, at a group's first collective; a group of one rank communicates nothing."""
    data = len({c.group for c in strategy.schedule if cluster.group_size(c.group) > 1})
    if mesh is None:
        return data
    experts = 0
    if mesh.ep > 1:
        expert_cluster = mesh.expert_data_cluster()
        experts = 1 + len({c.group for c in strategy.schedule if expert_cluster.group_size(c.group) > 1})
    return data + (mesh.tp > 1) + (mesh.cp > 1) + (mesh.pp > 1) + experts


def outside_allocator_bytes(request: TrainingRequest, communicators: int) -> int:
    """What a GPU holds outside the caching allocator: the CUDA context and ``communicators`` NCCL
    communicators (:func:`nccl_communicators`); the device peak is the reserved bytes plus these."""
    return request.runtime.context_bytes + communicators * request.runtime.nccl_communicator_bytes


OUTSIDE_BYTES = Part(
    "outside the allocator",
    ("mesh", "runtime", "strategies"),
    lambda request, parts, name: outside_allocator_bytes(
        request, nccl_communicators(STRATEGIES[name], request.cluster, request.mesh)
    ),
)
"""What a GPU holds outside the caching allocator under a strategy, as ``memory`` counts it: the context and
the NCCL communicators (:func:`outside_allocator_bytes`)."""


def peak_options(request: TrainingRequest) -> PeakOptions:
    a, b, rt = request.activations, request.buffers, request.runtime
    flash = flash_attention_used(request)
    return PeakOptions(
        framework=request.framework,
        model_impl=request.model_code,
        optimizer_impl=request.framework_record.optimizer_impl(request.optimizer_impl),
        optimizer_step=request.framework_record.offload_optimizer_step
        if request.offload_optimizer is not OffloadTarget.NONE
        else f"{request.framework_record.optimizer_impl(request.optimizer_impl).value} Adam",
        seq_len=a.seq_len,
        micro_batch=a.micro_batch,
        grad_accum=request.grad_accum,
        grad_sync=request.grad_sync,
        recompute=a.recompute,
        flash_attention=flash,
        attention_kernel=AttentionKernel.FLASH if flash else AttentionKernel.EAGER,
        attention_source=attention_source(request),
        init=request.init,
        init_given=request.init_asked is not None,
        init_source=request.framework_record.init_source,
        prefetch=b.prefetch,
        wrap=b.wrap,
        ddp_bucket_bytes=b.ddp_bucket_bytes,
        reduce_bucket_elements=b.reduce_bucket_elements,
        allgather_bucket_elements=b.allgather_bucket_elements,
        reduce_dtype=request.reduce_dtype,
        expandable_segments=request.expandable_segments,
        runtime_gpu=rt.name,
        context_bytes=rt.context_bytes,
        context_given=rt.context_given,
        context_measured=rt.context_measured,
        runtime_names=rt.names,
        nccl_communicator_bytes=rt.nccl_communicator_bytes,
        cublas_workspace_bytes=rt.cublas_workspace_bytes,
        gpu_memory_bytes=request.gpu_memory_bytes,
    )


def term_sources(
    request: TrainingRequest, strategy: Strategy, profile: FrameworkRecord, states: list[StateLine]
) -> dict[TensorKind, str]:
    """Where each kind of tensor's bytes come from, for this request and strategy: an accounting's own
    lines name theirs."""
    setup = request.framework_record.torch_setup(strategy.name)
    framework = TORCH_SOURCES[setup.wrapper] if setup is not None else profile.source
    impl = MODEL_CODES[request.model_code]
    adam = f"torch/optim/adam.py, {request.optimizer_impl.value}"
    gathered = (
        f"{framework}: units unsharded before use"
        if setup is not None
        else f"ZeRO paper §7.2.2 / FSDP units: the current block + {request.buffers.prefetch} prefetched, "
        "the root kept from forward to backward"
    )
    sources = {
        TensorKind.PARAMETERS: framework,
        TensorKind.GATHERED: gathered,
        TensorKind.GRADIENTS: framework,
        TensorKind.REDUCTION: f"{framework}: gradient reduction",
        TensorKind.OPTIMIZER_STATES: framework if setup is None else f"{framework}; {adam}",
        TensorKind.OPTIMIZER_TEMPORARIES: adam,
        TensorKind.ACTIVATIONS: impl.source,
        TensorKind.LOSS: f"{impl.title}: logits and the cross-entropy ({impl.library})",
        TensorKind.INPUTS: "input ids = labels (int64), the model's buffers",
        TensorKind.RUNTIME: f"{request.runtime.names.blas} workspaces ({request.runtime.name} preset) and "
        "runtime extras",
        TensorKind.BUFFERS: profile.source,
        TensorKind.PIPELINE: pipeline_source(request),
        TensorKind.TRANSIENT: f"{impl.title}: intermediates inside one op or layer",
        TensorKind.BLOCK_REMAINDERS: "c10/cuda/CUDACachingAllocator.cpp: blocks handed out whole "
        "(a remainder of at most 1 MiB is not split off)",
    }
    saver = loss_source(request.activations.loss, request.activations.loss_chunks)
    if saver is not None:
        sources[TensorKind.LOSS] = saver
    if request.optimizer_in_backward:
        sources[TensorKind.OPTIMIZER_TEMPORARIES] = (
            f"{adam}, one optimizer per parameter stepped in its post-accumulate-grad hook (torchtune "
            "training/memory.py register_optim_in_bwd_hooks)"
        )
    if request.finetune is not None:
        sources.update(FINETUNE_SOURCES)
    elif setup is None:
        for kind in TensorKind:
            own = list(dict.fromkeys(line.source for line in states if line.kind is kind))
            if own:
                sources[kind] = "; ".join(own)
    return sources


def pipeline_source(request: TrainingRequest) -> str:
    """Where a pipeline stage's buffers come from: the schedule and whether the framework keeps a stage's
    output."""
    mesh = request.mesh
    kept = "kept until its backward" if request.framework_record.keeps_stage_output else "freed once sent"
    return (
        f"{mesh.pp_schedule.value} schedule: per micro-batch in flight the received activation; the "
        f"stage output {kept}; the gradients received and sent"
    )


_UNIT_INDEX = re.compile(r"\b(\d+)\b")


def condensed_timeline(result: StepResult, layers: int) -> list[TimelineEvent]:
    """The step's events with runs of one name (per-parameter steps of one unit) kept at their largest,
    and those of the middle layers (1 … L−2) left out except where a phase peaks."""
    keep = {(p.phase, p.event) for p in result.phases} | {(result.peak.phase, result.peak.event)}
    events: list[TimelineEvent] = []
    for (phase, name, allocated), reserved in zip(result.events, result.reserved_at, strict=True):
        index = _UNIT_INDEX.search(name)
        if index and 0 < int(index.group(1)) < layers - 1 and (phase, name) not in keep:
            continue
        if events and (events[-1].phase, events[-1].event) == (phase, name):
            last = events[-1]
            last.allocated_bytes = max(last.allocated_bytes, allocated)
            if reserved is not None:
                last.reserved_bytes = max(last.reserved_bytes or 0, reserved)
            continue
        events.append(
            TimelineEvent(phase=phase, event=name, allocated_bytes=allocated, reserved_bytes=reserved)
        )
    return events


def framework_estimate_bytes(profile: FrameworkRecord, states: list[StateLine]) -> int | None:
    """What the framework's own estimator reports: the lines it covers (DeepSpeed); None for a framework, or
    a strategy of it (DeepSpeed's stage 1), without an estimator of its own."""
    if not profile.estimate_covers_states_only:
        return None
    covered = [line.bytes for line in states if line.in_framework_estimate]
    return sum(covered) if covered else None


def strategy_peak(
    request: TrainingRequest, profile: FrameworkRecord, name: StrategyName, runtime: Runtime
) -> StrategyPeak:
    """One strategy's step: its accounting's lines, the simulated timeline, the device footprint."""
    strategy = STRATEGIES[name]
    states, host = STATE_BUILDERS[profile.states](request, strategy)
    communicators = nccl_communicators(strategy, request.cluster, request.mesh)
    capacity = request.gpu_memory_bytes
    outside = outside_allocator_bytes(request, communicators)
    result = simulate(request, name, runtime, states)
    limit = None if capacity is None else capacity - outside
    retried_fits = False
    if limit is not None and result.reserved > limit >= result.peak.allocated:
        # the cudaMalloc that passes the device's free memory fails: the allocator frees its unused
        # cached segments and retries (CachingAllocator's limit); where even that fails, the step does not
        # fit and the unlimited replay's reserve is what it would need
        retried = simulate(request, name, runtime, states, limit=limit)
        if not retried.out_of_memory:
            result, retried_fits = retried, True
    sources = term_sources(request, strategy, profile, states)
    terms = [
        PeakTerm(kind=kind, bytes=result.peak.live[kind], source=sources[kind])
        for kind in TensorKind
        if result.peak.live.get(kind)
    ]
    nccl = communicators * request.runtime.nccl_communicator_bytes
    context = request.runtime.context_bytes
    allocated = result.peak.allocated
    reserved = max(result.reserved, allocated)
    peak = reserved + outside
    headroom = None if capacity is None else capacity - peak
    return StrategyPeak(
        strategy=name,
        title=request.framework_record.title_of(strategy.name),
        states=states,
        peak_phase=result.peak.phase,
        peak_event=result.peak.event,
        allocated_peak_bytes=allocated,
        terms=terms,
        phases=[PhasePeak(phase=p.phase, allocated_bytes=p.allocated, event=p.event) for p in result.phases],
        start_bytes=result.start,
        after_forward_bytes=result.after_forward,
        after_backward_bytes=result.after_backward,
        reserved_bytes=reserved,
        allocator_reserve_bytes=reserved - allocated,
        allocator_retried=retried_fits,
        context_bytes=context,
        nccl_communicators=communicators,
        nccl_bytes=nccl,
        peak_bytes=peak,
        framework_estimate_bytes=framework_estimate_bytes(profile, states),
        host_bytes_per_node=host,
        fits=None if capacity is None or headroom is None else headroom >= FIT_MARGIN * capacity,
        verdict=verdict(capacity, headroom),
        headroom_bytes=headroom,
        timeline=condensed_timeline(result, request.architecture.num_layers),
    )


def pipeline_peak(
    request: TrainingRequest,
    profile: FrameworkRecord,
    name: StrategyName,
    runtime: Runtime,
    known: dict[int, StrategyPeak] | None = None,
) -> StrategyPeak:
    """Every pipeline rank's step (its share of the model, its schedule's passes): the row of the stage with
    the largest device footprint (the first such), with every stage's in ``stages``; ``known``: stages'
    rows already evaluated (:func:`strategy_peak` of the request at their ``stage``)."""
    mesh = request.mesh
    rows: list[StrategyPeak] = []
    stages: list[StagePeak] = []
    for i in range(mesh.pp):
        staged = request.with_(stage=i)
        row = (known or {}).get(i) or strategy_peak(staged, profile, name, runtime)
        rows.append(row)
        arch = staged.architecture
        assert isinstance(arch, PipelineStage)
        held = arch.global_layers
        stages.append(
            StagePeak(
                stage=i,
                layers=[
                    [held[start], held[start + size - 1]]
                    for start, size in zip(arch.chunk_starts, arch.chunk_sizes, strict=True)
                ],
                holds_embedding=arch.holds_embedding,
                holds_head=arch.holds_head,
                params=staged.rank_model.params,
                in_flight=float(in_flight(mesh.pp_schedule, mesh.pp, mesh.vpp, i, request.grad_accum)),
                micro_batches_simulated=stage_window(staged),
                peak_phase=row.peak_phase,
                peak_event=row.peak_event,
                allocated_peak_bytes=row.allocated_peak_bytes,
                reserved_bytes=row.reserved_bytes,
                peak_bytes=row.peak_bytes,
                terms=row.terms,
                verdict=row.verdict,
                headroom_bytes=row.headroom_bytes,
            )
        )
    worst = max(range(mesh.pp), key=lambda i: rows[i].peak_bytes)
    return rows[worst].model_copy(update={"stage": worst, "stages": stages})


def verdict(capacity: int | None, headroom: int | None) -> Verdict | None:
    """Fits with :data:`FIT_MARGIN` to spare, tight (below the memory by less), or does not fit."""
    if capacity is None or headroom is None:
        return None
    if headroom >= FIT_MARGIN * capacity:
        return Verdict.FITS
    return Verdict.TIGHT if headroom >= 0 else Verdict.DOES_NOT_FIT


INIT_HOST_BYTES = 4
"""``--init cpu``: the model is built or loaded on the host in fp32 (``from_config``, or ``from_pretrained``
with ``torch_dtype=float32`` for mixed-precision training)."""


def init_host_bytes_per_node(request: TrainingRequest) -> int | None:
    """``--init cpu``: host bytes per node of the whole model at creation, one copy per rank that builds
    it (one per node where the framework's loading broadcasts from the node's first rank): fp32, or a
    fine-tuning run's model as it is loaded (:func:`loaded_model_bytes`)."""
    if request.init is not ModelInit.CPU:
        return None
    mesh = request.mesh
    copies = mesh.tp if request.framework_record.host_copy_per_node else mesh.gpus_per_node
    if request.finetune is not None:
        return copies * loaded_model_bytes(request)
    return copies * INIT_HOST_BYTES * request.rank_model.params


def offloaded_activations_host_bytes(request: TrainingRequest) -> int | None:
    """``--offload-activations``: the pinned host bytes per GPU of one micro-batch's offloaded tensors
    (:func:`~zerocalc.peak.timeline.offloaded_host_bytes`); None without it."""
    if not request.activations.offload:
        return None
    return offloaded_host_bytes(step_shape(request, activation_bytes(request), Device.CUDA))


def init_host_model(request: TrainingRequest) -> str | None:
    """What :func:`init_host_bytes_per_node` counts, in words."""
    if request.init is not ModelInit.CPU:
        return None
    if request.finetune is None:
        return "the whole model in fp32"
    base = _loaded_dtype(request, ParamKind.FROZEN_BASE).value
    quantized = ", not yet quantised" if request.finetune.quantized else ""
    return f"the model as loaded (its frozen base {base}{quantized})"


def _loaded_dtype(request: TrainingRequest, kind: ParamKind) -> DType:
    """A tensor's dtype as the model is loaded, before ``prepare_model_for_kbit_training`` and before
    bitsandbytes quantises (a quantised weight is then its frozen base's)."""
    if kind is ParamKind.QUANTIZED:
        kind = ParamKind.FROZEN_BASE
    autocast = request.finetune is None or request.finetune.adapter_autocast
    layout = request.framework_record.param_layout
    return tensor_dtypes(request.precision, layout, kind=kind, adapter_autocast=autocast).stored


def loaded_model_bytes(request: TrainingRequest) -> int:
    """A fine-tuning run's model on the host before it is sharded, each tensor as loaded
    (:func:`_loaded_dtype`): the frozen base as ``from_pretrained(..., dtype=torch.bfloat16)`` loads it,
    PEFT's fp32 adapters; ``prepare_model_for_kbit_training`` casts after loading, and bitsandbytes'
    ``Params4bit`` and ``Int8Params`` quantise as they move onto the GPU (bitsandbytes 0.50.2
    ``nn/modules.py`` ``Params4bit.to`` → ``_quantize``), after the host copy is sharded."""
    finetune = request.finetune
    assert finetune is not None
    return sum(
        k.tensor.numel * _loaded_dtype(request, k.kind).bytes
        for k in parameter_kinds(request.architecture, finetune)
    )


INIT_MEANING = {
    ModelInit.META: "nothing whole on the GPU",
    ModelInit.GPU: "the whole fp32 model on every GPU first",
    ModelInit.CPU: "built on the host, moved as it is sharded",
}


def _init_part(request: TrainingRequest) -> str:
    init = request.init
    if request.init_asked is not None:
        return f"model creation: --init {init.value} ({INIT_MEANING[init]})"
    return f"model creation: {init.value} ({request.framework.value}'s default)"


def attention_source(request: TrainingRequest) -> str:
    """Why the attention kernel is what it is: the flag, or the model code's default."""
    asked = request.activations.flash_attention
    if asked is not None:
        return "--flash-attention" if asked else "--no-flash-attention"
    return MODEL_CODES[request.model_code].default_attention(request.architecture)[1]


def _attention_part(request: TrainingRequest) -> str:
    kernel = "flash" if flash_attention_used(request) else "eager, s² kept"
    asked = request.activations.flash_attention is not None
    why = attention_source(request) if asked else "the model code's"
    return f"attention: {kernel} ({why})"


def _creation_note(request: TrainingRequest) -> str:
    """How the model is created and which attention kernel is assumed, and why (their sources in full:
    ``options.init_source``, ``options.attention_source``)."""
    return f"{_init_part(request)}; {_attention_part(request)}"


def _notes(request: TrainingRequest) -> list[str]:
    notes: list[str] = [_creation_note(request)]
    if request.framework_record.states is StatesModel.DEEPSPEED_ESTIMATOR:
        notes.append(
            "DeepSpeed's estimator covers only its own lines (its estimate column); it prints GiB labelled "
            "'GB' and adds a 1.5x factor to host memory"
        )
    if request.buffers.wrap is Wrap.MODEL:
        notes.append(
            "{wrap} model gathers the whole model at once: "
            "ZeRO-3's parameter sharding saves nothing at the peak"
        )
    mesh = request.mesh
    if mesh.pp > 1:
        notes.append(
            f"pipeline: each stage's timeline runs its {mesh.pp_schedule.value} passes over the last of the "
            f"{request.grad_accum} micro-batches, as many as it holds in flight (parallel.pipeline.window); "
            "the gradients of the earlier ones are resident"
        )
    elif request.grad_accum > 1 and request.finetune is not None:
        notes.append(
            f"the timeline is the last of {request.grad_accum} micro-batches: the trained gradients of the "
            "earlier ones are resident (kept sharded; on the host under CPU offload)"
        )
    elif request.grad_accum > 1:
        notes.append(
            f"the timeline is the last of {request.grad_accum} micro-batches: the gradients of the earlier "
            "ones are resident (sharded when reduced every micro-batch, whole under no_sync)"
        )
    if request.activations.recompute is Recompute.SELECTIVE and flash_attention_used(request):
        notes.append(
            "{recompute} selective drops attention's s²-sized tensors; flash attention keeps none, so it "
            "changes nothing here"
        )
    if request.finetune is not None:
        notes.append(finetune_note(request))
    if request.gpu is None:
        notes.append(
            "no {gpu}: the runtime figures (context, NCCL, cuBLAS workspaces) are the "
            f"{request.runtime.title}'s"
        )
    return notes


def evaluate_peak(request: TrainingRequest) -> MemoryReport:
    """Model states and the peak of one step per strategy, for a request with an architecture (pure).

    The model-state rows carry no fits/headroom here: with a step to simulate, the peak decides. A
    fine-tuning run's step is :mod:`zerocalc.peak.finetune`'s."""
    estimate = evaluate_memory(request)
    profile = request.framework_record
    runtime = runtime_for(request)
    one = strategy_peak if request.mesh.pp == 1 else pipeline_peak
    rows = [one(request, profile, row.strategy, runtime) for row in estimate.strategies]
    peak = PeakEstimate(
        options=peak_options(request),
        model_impl_source=MODEL_CODES[request.model_code].source,
        notes=_notes(request),
        strategies=rows,
        init_host_bytes_per_node=init_host_bytes_per_node(request),
        init_host_model=init_host_model(request),
        offloaded_activations_host_bytes=offloaded_activations_host_bytes(request),
    )
    states = [row.model_copy(update={"fits": None, "headroom_bytes": None}) for row in estimate.strategies]
    echo = estimate.request.model_copy(update={"states_capacity_bytes": None})
    return MemoryReport(**{**dict(estimate), "strategies": states, "request": echo}, peak=peak)


def framework_states(request: TrainingRequest, estimate: MemoryEstimate) -> list[FrameworkStates]:
    """Each strategy's model states as the request's framework accounts them (from Ψ alone)."""
    profile = request.framework_record
    rows = []
    for row in estimate.strategies:
        strategy = STRATEGIES[row.strategy]
        lines, host = STATE_BUILDERS[profile.states](request, strategy)
        rows.append(
            FrameworkStates(
                strategy=row.strategy,
                title=request.framework_record.title_of(strategy.name),
                lines=lines,
                gpu_bytes=sum(line.bytes for line in lines),
                framework_estimate_bytes=framework_estimate_bytes(profile, lines),
                host_bytes_per_node=host,
                source=profile.source,
            )
        )
    return rows


def evaluate(request: TrainingRequest) -> MemoryReport:
    """``zerocalc memory``: model states, the framework's own accounting of them when only Ψ is known,
    and the peak when the request has an architecture."""
    if request.model.architecture is None:
        estimate = evaluate_memory(request)
        paper = request.framework_record.states is StatesModel.PAPER or request.finetune is not None
        own = None if paper else framework_states(request, estimate)
        return MemoryReport(**dict(estimate), framework_states=own)
    return evaluate_peak(request)
