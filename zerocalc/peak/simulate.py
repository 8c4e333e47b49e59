"""Simulate one strategy's training step for a request: allocated peaks per phase and what is reserved.

* the allocated figures come from one steady step (a step after the first: the optimizer states exist and
  the runtime's workspaces are allocated), as ``torch.cuda.max_memory_allocated`` reads them phase by
  phase;
* the reserve comes from replaying model creation (as ``request.init`` says), wrapping and three steps
  (the first creating the optimizer states lazily and the cuBLAS workspaces at its first matmuls) through
  the caching allocator (:mod:`zerocalc.peak.allocator`), as ``torch.cuda.max_memory_reserved`` reads it;
* the creation's own peak is a phase (:attr:`StepPhase.CREATION`): where it is larger than the step's
  (a whole model created on every GPU), it is the peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.base.memo import IdentityCache
from zerocalc.base.parts import Part
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import (
    Architecture,
    ParamTensor,
    PipelineStage,
    embedding_tensors,
    head_tensors,
    layer_tensors,
)
from zerocalc.model.code import (
    MODEL_CODES,
    Device,
    ForwardTuning,
    Shape,
    layer_saves,
    stream_bytes,
    tuning_unsupported,
)
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.finetune import forward_tuning
from zerocalc.parallel.framework_records import effective_grad_sync
from zerocalc.parallel.framework_records.record import StatesModel, Wrap
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchWrapper
from zerocalc.parallel.mesh import PpSchedule
from zerocalc.parallel.pipeline import boundary_elements, in_flight, rank_passes, window
from zerocalc.parallel.strategies import STRATEGIES, BufferRule, OffloadTarget, StrategyName
from zerocalc.peak.allocator import CachingAllocator
from zerocalc.peak.finetune import finetune_mechanics, forward_transients
from zerocalc.peak.fp8 import fp8_gather_bytes
from zerocalc.peak.kinds import StepPhase, TensorKind
from zerocalc.peak.ledger import Event, Ledger
from zerocalc.peak.mechanics import Accounting, Accumulation, Ddp, Fsdp1, Fsdp2, Mechanics, Unit
from zerocalc.peak.report import StateLine
from zerocalc.peak.timeline import PHASES, Runtime, StagePlan, StepShape, first_start, run_step, steady_start
from zerocalc.request.checks import flash_attention_used
from zerocalc.request.training import TrainingRequest
from zerocalc.states.framework import (
    ADAM_STATES,
    dim0_padded_numel,
    dim0_shard_numel,
    expert_shard_dim,
    fsdp2_sharding,
    fsdp_units,
    shard_ranks,
    zero1_rank_elements,
)
from zerocalc.states.memory import shard_elements

REPLAYED_STEPS = 3
"""Steps replayed for the reserve: the first creates the optimizer states; the reserve settles after it."""


class PhasePeak(NamedTuple):
    phase: StepPhase
    allocated: int
    event: str
    live: dict[str, int]
    """Bytes alive at that peak, by kind of tensor."""


class StepResult(NamedTuple):
    phases: list[PhasePeak]
    start: int
    after_forward: int
    after_backward: int
    events: list[tuple[StepPhase, str, int]]
    reserved: int
    """The caching allocator's high-water mark over model creation and three steps."""
    peak: PhasePeak
    """The first event with the largest allocated total, and what is alive there by kind: the step's, or
    the model's creation where that is larger."""
    reserved_at: list[int | None]
    """At each event, what the caching allocator has reserved (None without the allocator replay)."""
    out_of_memory: bool = False
    """Replayed under a ``limit``, a segment was asked for beyond it with nothing cached left to free."""


@lru_cache(maxsize=256)
def _largest_partition(arch: Architecture, world: int) -> tuple[int, ...]:
    """The elements of each tensor ZeroRedundancyOptimizer gives the rank with the most elements (once per
    architecture and world)."""
    return max(zero1_rank_elements(arch, world), key=sum)


def _units(
    request: TrainingRequest, world: int, blocks: int | None = None, experts: tuple[int, int] | None = None
) -> dict[str, Unit]:
    """FSDP units with each parameter's elements, its dim-0 shard on rank 0 and its padded size; with
    ``blocks``, only the first ``blocks`` blocks' units and the root's (the units of the model cut to that
    many blocks: each block's tensors are the same whatever the depth); with ``experts`` (the ranks and
    the dimension), the routed experts sharded as FSDP2 shards them under expert parallelism
    (:func:`~zerocalc.states.framework.fsdp2_sharding`)."""
    arch = request.architecture
    key = (world, blocks, experts)
    units = _UNITS.get(arch, key)  # by identity first: hashing an architecture walks all its fields
    if units is None:
        if blocks is None:
            units = _UNITS.put(arch, key, _units_of(arch, world, experts))
        else:
            units = _UNITS.put(arch, key, _first_units(arch, world, blocks, experts))
    return dict(units)


_UNITS: IdentityCache[tuple[tuple[str, Unit], ...]] = IdentityCache(limit=1024)
""":func:`_units`' units per architecture object and (world, blocks, experts)."""


@lru_cache(maxsize=256)
def _first_units(
    arch: Architecture, world: int, blocks: int, experts: tuple[int, int] | None = None
) -> tuple[tuple[str, Unit], ...]:
    """The units of the first ``blocks`` blocks and the root's (a plan asks at two depths per world, and
    builds no other block's)."""
    return _built_units(_first_fsdp_units(arch, blocks), world, arch, experts)


@lru_cache(maxsize=64)
def _first_fsdp_units(arch: Architecture, blocks: int) -> tuple[tuple[str, tuple[ParamTensor, ...]], ...]:
    """:func:`_fsdp_units_of`'s first ``blocks`` blocks and its root, without building the other blocks:
    :func:`~zerocalc.model.architecture.parameter_tensors` is the embedding's tensors, each block's
    (:func:`~zerocalc.model.architecture.layer_tensors`, every module ``layers.<i>.…``, which
    :func:`~zerocalc.states.framework.fsdp_unit_positions` makes unit ``layers.<i>``), then the head's;
    the root is what no block holds, the embedding's then the head's (a block without tensors is no
    unit)."""
    first = ((str(i), tuple(layer_tensors(arch, i))) for i in range(min(blocks, arch.num_layers)))
    root = ("root", (*embedding_tensors(arch), *head_tensors(arch)))
    return (*((key, tensors) for key, tensors in first if tensors), root)


@lru_cache(maxsize=256)
def _units_of(
    arch: Architecture, world: int, experts: tuple[int, int] | None = None
) -> tuple[tuple[str, Unit], ...]:
    """The blocks' units in order, then the root's; once per architecture and world (the units are shared:
    nothing mutates them)."""
    return _built_units(_fsdp_units_of(arch), world, arch, experts)


def _built_units(
    units: tuple[tuple[str, tuple[ParamTensor, ...]], ...],
    world: int,
    arch: Architecture,
    experts: tuple[int, int] | None = None,
) -> tuple[tuple[str, Unit], ...]:
    """Each unit's elements, shards and padding at ``world`` (the routed experts' over ``experts``' ranks
    and dimension where given), computed once per shape and shard group (every block repeats them)."""
    sizes: dict[tuple[tuple[int, ...], int], tuple[int, int, int]] = {}
    built: list[tuple[str, Unit]] = []
    for key, tensors in units:
        keys = []
        for t in tensors:
            shape, ranks = (t.shape, world) if experts is None else fsdp2_sharding(t, arch, world, *experts)
            keys.append((shape, ranks))
            if (shape, ranks) not in sizes:
                sizes[shape, ranks] = (
                    t.numel,
                    dim0_shard_numel(shape, ranks, 0),
                    dim0_padded_numel(shape, ranks),
                )
        if not tensors:  # a middle pipeline stage's root: no embedding, no head
            built.append((key, Unit(key, [], [], [])))
            continue
        numel, local, padded = zip(*(sizes[k] for k in keys), strict=True)
        built.append((key, Unit(key, list(numel), list(local), list(padded), _registered_last(key, tensors))))
    return tuple(built)


def _registered_last(key: str, tensors: tuple[ParamTensor, ...]) -> int:
    """Elements of the parameter the model's code registers last in the unit (``module.parameters()``
    order, which FSDP2's parameter group and its gradient list follow). The root: the LM head when untied,
    else the final norm (transformers' ``*ForCausalLM``: ``model.embed_tokens``, ``model.norm``, then
    ``lm_head``), the order of :func:`~zerocalc.states.framework.fsdp_units`'s root. A block: transformers'
    decoder layers register attention and MLP, then their norms (``LlamaDecoderLayer``, its MoE and Gemma
    kin), GPT-2's ``ln_1``, ``attn``, ``ln_2``, ``mlp`` (``c_proj.bias`` last): a 1-D tensor of h, the size
    of the block's last 1-D tensor here."""
    if key == "root":
        return tensors[-1].numel
    return next((t.numel for t in reversed(tensors) if len(t.shape) == 1), 0)


@lru_cache(maxsize=64)
def _fsdp_units_of(arch: Architecture) -> tuple[tuple[str, tuple[ParamTensor, ...]], ...]:
    """:func:`fsdp_units` keyed as the timeline names units (``"root"``, ``"0"`` … ``"L−1"``), once per
    architecture (a plan's search asks at every world)."""
    return tuple(
        (name.removeprefix("layers.") if name != "root" else "root", tuple(tensors))
        for name, tensors in fsdp_units(arch)
    )


def activation_shape(request: TrainingRequest) -> Shape:
    """One micro-batch on one rank of the mesh: b sequences of s tokens, split by tensor, sequence and
    context parallelism as the model's code splits them, and the routed tokens expert parallelism brings
    the rank's experts (:class:`~zerocalc.model.code.Shape`)."""
    return request.rank_shape._replace(
        ep=request.mesh.ep, capacity_factor=request.activations.capacity_factor
    )


def step_shape(request: TrainingRequest, act: int, device: Device) -> StepShape:
    arch = request.architecture
    units = _units_of(arch, 1)
    return StepShape(
        arch=arch,
        impl=MODEL_CODES[request.model_code],
        shape=activation_shape(request),
        act=act,
        device=device,
        flash=flash_attention_used(request),
        recompute=request.activations.recompute,
        checkpoint_every=request.activations.checkpoint_every,
        layer_params=tuple(tuple(unit.params) for _, unit in units[:-1]),
        stage=stage_plan(request, act),
        tuning=_tuning(request),
        forward_transients=forward_transients(request),
        fp8=request.fp8,
        loss=request.activations.loss,
        loss_chunks=request.activations.loss_chunks,
        keep_output=request.activations.keep_output,
        offload=request.activations.offload,
        compile=request.activations.compile,
    )


def _tuning(request: TrainingRequest) -> ForwardTuning | None:
    """A fine-tuning run's forward (:func:`~zerocalc.parallel.finetune.forward_tuning`: gradient
    checkpointing makes the embeddings' output require grad); None: full training."""
    if request.finetune is None:
        return None
    impl = MODEL_CODES[request.model_code]
    reason = tuning_unsupported(request.architecture, flash_attention_used(request))
    if not impl.transformers_modules:
        reason = (
            f"{{model_impl}} {request.model_code.value}: the saved tensors of a fine-tuning forward are "
            "written out for transformers' code"
        )
    if reason is not None:
        raise InputError(f"the peak of a fine-tuning step: {reason}; accepted: {{model_impl}} hf")
    checkpointed = request.activations.recompute is not Recompute.NONE
    return forward_tuning(
        request.architecture, request.finetune, checkpointed=checkpointed, weights=request.forward_weights
    )


def in_flight_saved_bytes(request: TrainingRequest) -> int:
    """Activations pipeline rank 0 holds when its first backward begins, a lower bound of its allocated
    peak: one micro-batch's saves (:func:`micro_batch_saved_bytes`) for each micro-batch in flight
    (:func:`~zerocalc.parallel.pipeline.in_flight`); 0 with recomputation or virtual stages."""
    mesh = request.mesh
    saved = micro_batch_saved_bytes(request)
    return first_stage_in_flight(mesh.pp_schedule, mesh.pp, request.grad_accum) * saved if saved else 0


@lru_cache(maxsize=4096)
def first_stage_in_flight(schedule: PpSchedule, pp: int, grad_accum: int) -> int:
    """The micro-batches pipeline rank 0 holds in flight without virtual stages
    (:func:`~zerocalc.parallel.pipeline.in_flight`): what :func:`in_flight_saved_bytes` multiplies."""
    return int(in_flight(schedule, pp, 1, 0, grad_accum))


def keeps_in_flight(request: TrainingRequest) -> bool:
    """Whether pipeline rank 0 keeps every saved tensor of its micro-batches in flight until their backward
    (what :func:`micro_batch_saved_bytes` counts): pipeline stages without virtual stages or recompute."""
    mesh = request.mesh
    return mesh.pp > 1 and mesh.vpp == 1 and request.activations.recompute is Recompute.NONE


def micro_batch_saved_bytes(request: TrainingRequest) -> int:
    """The saved tensors of one micro-batch through every layer pipeline rank 0 holds
    (:func:`~zerocalc.model.code.layer_saves`, as the timeline keeps them until each layer's backward:
    the smaller with and without the cache copies, less the layer input a chunk's first layer may share with
    the tensor it received). Counted without recomputation and without virtual stages, where each forward
    keeps all of them until its backward; 0 otherwise (and without pipeline stages)."""
    if not keeps_in_flight(request):
        return 0
    arch = request.stages[0].architecture
    assert arch is not None
    impl, shape = MODEL_CODES[request.model_code], activation_shape(request)
    act, flash, tuning = activation_bytes(request), flash_attention_used(request), _tuning(request)

    def kind(index: int) -> bool | int:
        """A layer's saves depend on its index only through its kind; a fine-tuning run's on the index."""
        return arch.is_moe_layer(index) if tuning is None else index

    kinds = {kind(index): index for index in range(arch.num_layers)}
    per_kind = {
        key: min(
            sum(size for name, size in saves.saved if name != "attn_norm_input")
            for saves in (
                layer_saves(
                    impl,
                    arch,
                    index,
                    shape,
                    act,
                    Device.CUDA,
                    use_cache=cache,
                    flash=flash,
                    tuning=tuning,
                    compiled=request.activations.compile.model,
                )
                for cache in (True, False)
            )
        )
        for key, index in kinds.items()
    }
    return sum(per_kind[kind(index)] for index in range(arch.num_layers))


FIRST_STAGE_SAVED = Part(
    "first stage's saved activations",
    ("rank_model", "stages", "rank_shape", "mesh.ep", "mesh.pp", "mesh.vpp", "model_code", "activation_dtype",
     "activations.capacity_factor", "activations.flash_attention", "activations.recompute", "finetune",
     "activations.compile",
     "forward_weights"),
    lambda request, parts: micro_batch_saved_bytes(request),
)  # fmt: skip
""":func:`micro_batch_saved_bytes`: one micro-batch's saves through pipeline rank 0's layers."""


def stage_plan(request: TrainingRequest, act: int) -> StagePlan | None:
    """What the request's pipeline rank runs (its share is a
    :class:`~zerocalc.model.architecture.PipelineStage`): its passes over the micro-batches in flight."""
    arch = request.architecture
    if not isinstance(arch, PipelineStage):
        return None
    mesh = request.mesh
    micro_batches = stage_window(request)
    a = request.activations
    return StagePlan(
        passes=rank_passes(mesh.pp_schedule, mesh.pp, mesh.vpp, arch.stage, micro_batches),
        micro_batches=micro_batches,
        chunk_sizes=arch.chunk_sizes,
        holds_embedding=arch.holds_embedding,
        holds_head=arch.holds_head,
        keeps_output=request.framework_record.keeps_stage_output,
        boundary_bytes=stream_bytes(_tuning(request), act)
        * boundary_elements(mesh, a.micro_batch, a.seq_len, arch.hidden_size),
    )


def _chunk_starts(request: TrainingRequest) -> tuple[int, ...] | None:
    """The first block of each model chunk of a pipeline rank holding several; None otherwise."""
    arch = request.architecture
    return arch.chunk_starts if isinstance(arch, PipelineStage) and arch.vpp > 1 else None


def stage_window(request: TrainingRequest) -> int:
    """The micro-batches a pipeline rank's simulated step runs (:func:`~zerocalc.parallel.pipeline.
    window`); 1 without pipeline stages."""
    arch = request.architecture
    if not isinstance(arch, PipelineStage):
        return 1
    mesh = request.mesh
    return window(mesh.pp_schedule, mesh.pp, mesh.vpp, arch.stage, request.grad_accum)


def _accumulation(request: TrainingRequest, name: StrategyName) -> Accumulation:
    if not request.accumulates:
        return Accumulation.NONE
    sync = effective_grad_sync(request.framework, name, request.grad_sync, pipelined=request.mesh.pp > 1)
    return Accumulation.UNSYNCED if sync is GradSync.LAST else Accumulation.SYNCED


def runtime_for(request: TrainingRequest) -> Runtime:
    """The runtime's allocations through the caching allocator on the request's GPU (its preset's BLAS
    workspace, named as the preset names its library; the small extras measured on the H100)."""
    runtime = request.runtime
    return Runtime(cublas_workspace=runtime.cublas_workspace_bytes, blas=runtime.names.blas)


def activation_bytes(request: TrainingRequest) -> int:
    """Bytes per activation element: the compute dtype, the unsharded parameters' (every framework)."""
    return request.activation_dtype.bytes


def mechanics_for(
    request: TrainingRequest, name: StrategyName, states: Sequence[StateLine] = (), blocks: int | None = None
) -> tuple[Mechanics, int]:
    """The strategy's mechanics under the request's framework, and the activation bytes per element.

    With ``blocks``, the hooks of only the first ``blocks`` blocks and the root exist (their units); every
    whole-model quantity stays the request's: the accountings' state lines (``states``) and optimizer
    elements, DDP's reducer buckets, ZeroRedundancyOptimizer's partition, a whole-model unit (``--wrap
    model``). That is what :mod:`zerocalc.plan.layers` runs at a few blocks to extrapolate to the request's
    L: what scales with L is then only the blocks' own tensors, a sum of like terms (the whole-model
    quantities are not affine in L: DeepSpeed's buckets are capped, every line rounded on its own)."""
    mechanics, act = _mechanics(request, name, states, blocks)
    mechanics.earlier = request.mesh.pp == 1 or stage_window(request) < request.grad_accum
    return mechanics, act


def _mechanics(
    request: TrainingRequest, name: StrategyName, states: Sequence[StateLine], blocks: int | None
) -> tuple[Mechanics, int]:
    if request.finetune is not None:  # every framework's fine-tuning step: its kinds of tensor
        return finetune_mechanics(request, name), activation_bytes(request)
    strategy = STRATEGIES[name]
    dtypes = request.dtypes.trained
    optimizer_impl = request.optimizer_impl
    accumulation = _accumulation(request, name)
    setup = request.framework_record.torch_setup(name)
    if setup is not None:
        world = shard_ranks(request.cluster, setup)
        mesh = request.mesh
        experts = None
        if mesh.ep > 1:
            expert_world = shard_ranks(mesh.expert_data_cluster(), setup)
            experts = (expert_world, expert_shard_dim(request.architecture, mesh.dp * mesh.cp))
        units = _units(request, world, blocks, experts)
        if setup.wrapper is TorchWrapper.FSDP2:
            return Fsdp2(
                units,
                world=world,
                param_bytes=dtypes.compute.bytes,
                reduce_bytes=dtypes.reduce.bytes,
                reshard=setup.reshard_after_forward,
                root_reshard=setup.reshard_after_forward,
                optimizer_states=ADAM_STATES,
                optimizer_impl=optimizer_impl,
                accumulation=accumulation,
                pipelined=request.mesh.pp > 1,
                chunk_starts=_chunk_starts(request),
                gather_bytes=fp8_gather_bytes(request.architecture, request.fp8, dtypes.compute.bytes, world),
                in_backward=request.optimizer_in_backward,
            ), activation_bytes(request)
        if setup.wrapper is TorchWrapper.FSDP1:
            no_shard = setup.sharding is Fsdp1Sharding.NO_SHARD or world == 1
            return Fsdp1(
                units,
                world=world,
                no_shard=no_shard,
                param_bytes=dtypes.compute.bytes,
                reduce_bytes=dtypes.reduce.bytes,
                reshard=setup.sharding is not Fsdp1Sharding.SHARD_GRAD_OP,
                optimizer_states=ADAM_STATES,
                optimizer_impl=optimizer_impl,
                accumulation=accumulation,
            ), activation_bytes(request)
        # DDP / ZeroRedundancyOptimizer: fp32 parameters, bf16 autocast under mixed precision
        owned = None
        if setup.wrapper is TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER:
            owned = _largest_partition(request.architecture, request.cluster.world_size)
        return Ddp(
            _units(request, 1, blocks),
            reducer_elements=sum(unit.numel for _, unit in _units_of(request.architecture, 1)),
            autocast_bytes=dtypes.compute.bytes if dtypes.compute is not dtypes.stored else None,
            optimizer_states=ADAM_STATES,
            optimizer_impl=optimizer_impl,
            owned=owned,
            accumulation=accumulation,
        ), activation_bytes(request)
    # the accountings: their state lines resident; the paper's sharded strategies gather units and reduce
    # one unit's gradients at a time (DeepSpeed's and Megatron's lines already hold their own)
    rule = strategy.buffers
    if request.buffers.wrap is Wrap.MODEL:
        params = request.rank_model.params
        units = {"root": Unit("root", [params], [params], [params])}
    else:
        units = _units(request, 1, blocks)
    b_p, b_g, b_r = dtypes.stored.bytes, dtypes.gradient.bytes, dtypes.reduce.bytes
    paper = request.framework_record.states is StatesModel.PAPER
    # an offloaded optimizer steps on the host: no temporaries of its step on the GPU
    steps_on_gpu = paper and request.offload_optimizer is OffloadTarget.NONE
    return Accounting(
        units,
        states=[(f"{line.name} ({line.kind.value})", line.kind, line.bytes) for line in states],
        gather=paper and rule is BufferRule.GATHERED_UNITS,
        unit_grads=paper and rule in (BufferRule.GATHERED_UNITS, BufferRule.UNIT_GRADIENTS),
        param_bytes=b_p,
        grad_bytes=b_g,
        reduce_bytes=b_r,
        prefetch=request.buffers.prefetch,
        keep_root=True,
        optimizer_elements=shard_elements(request, strategy.optimizer) if steps_on_gpu else 0,
        optimizer_impl=optimizer_impl,
    ), activation_bytes(request)


def simulate(
    request: TrainingRequest,
    name: StrategyName,
    runtime: Runtime | None,
    states: Sequence[StateLine] = (),
    device: Device = Device.CUDA,
    reserve: bool = True,
    allocator: CachingAllocator | None = None,
    limit: int | None = None,
) -> StepResult:
    """Allocated peaks of one steady step, and (``reserve``) the allocator's high-water mark.

    With ``reserve`` the allocation stream of model creation and :data:`REPLAYED_STEPS` steps goes
    through the caching allocator (``allocator``, else a fresh one for the request), and the last of
    those steps (a steady one) gives the peaks and what is reserved at each of its events; without, one
    steady step from its resident start. ``limit``: what the fresh allocator may reserve before it frees
    its cached segments and retries (:class:`~zerocalc.peak.allocator.CachingAllocator`)."""
    mechanics, act = mechanics_for(request, name, states)
    step = step_shape(request, act, device)
    block = 512 if device is Device.CUDA else 1
    led = Ledger(block)
    if not reserve:
        allocator = None
    elif allocator is None:
        allocator = CachingAllocator(expandable=request.expandable_segments, limit=limit)
    creation = None
    if allocator is not None:
        element_bytes = (
            request.dtypes.stored.bytes if request.framework_record.init_in_param_dtype else DType.FP32.bytes
        )
        first_start(step, mechanics, runtime, led, request.init, element_bytes)
        created = led.phase_peak(StepPhase.CREATION)
        creation = PhasePeak(
            StepPhase.CREATION, created.allocated, created.name, led.peak_live.get(StepPhase.CREATION, {})
        )
        for number in range(REPLAYED_STEPS - 1):
            mechanics.earlier_micro_batches(led)
            run_step(step, mechanics, runtime, led, first_step=number == 0)
            allocator.replay(led.log)
            led.log = []
        mechanics.earlier_micro_batches(led)
        allocator.replay(led.log)
        led.log = []
        led.clear_events()
        allocator.measured_step_begins()
    else:
        steady_start(step, mechanics, runtime, led)
    run_step(step, mechanics, runtime, led)
    # with the replay, at each event what is reserved, and the allocated total as memory_allocated counts
    # it: the requests plus the remainders of the blocks handed out whole
    reserved_at: list[int | None] = [None] * len(led.events)
    remainders = [0] * len(led.events)
    if allocator is not None:
        done = 0
        for i, mark in enumerate(led.marks):
            allocator.replay(led.log[done:mark])
            done = mark
            reserved_at[i], remainders[i] = allocator.reserved, allocator.remainder
        allocator.replay(led.log[done:])
        led.log = []

    remainder_of = {id(event): r for event, r in zip(led.events, remainders, strict=True)}

    def counted(event: Event) -> int:
        return event.allocated + remainder_of[id(event)]

    def live(event: Event) -> dict[str, int]:
        kinds = dict(led.peak_live.get(event.phase, {}))
        if counted(event) > event.allocated:
            kinds[TensorKind.BLOCK_REMAINDERS] = counted(event) - event.allocated
        return kinds

    named = {e.name: counted(e) for e in led.events if e.name in ("start", "after forward", "after backward")}
    # each phase's peak as max_memory_allocated reads it after reset_peak_memory_stats at the phase's
    # start: at least what is allocated when the phase begins
    entering = {
        StepPhase.START: named["start"],
        StepPhase.FORWARD: named["start"],
        StepPhase.BACKWARD: named["after forward"],
        StepPhase.OPTIMIZER: named["after backward"],
    }
    peaks = []
    for phase in PHASES:
        event = led.phase_peak(phase)
        if counted(event) >= entering[phase]:
            peaks.append(PhasePeak(phase, counted(event), event.name, live(event)))
        else:  # nothing in the phase exceeds what it starts with (its first event is where it stands)
            first = next(e for e in led.events if e.phase == phase)
            peaks.append(PhasePeak(phase, entering[phase], first.name, live(event)))
    top = max(led.events, key=lambda e: e.allocated)
    peak = PhasePeak(StepPhase(top.phase), counted(top), top.name, live(top))
    if creation is not None:
        peaks.insert(0, creation)
        if creation.allocated > peak.allocated:  # the whole model at creation outgrows the step
            peak = creation
    return StepResult(
        peak=peak,
        phases=peaks,
        start=named["start"],
        after_forward=named["after forward"],
        after_backward=named["after backward"],
        events=[(StepPhase(e.phase), e.name, counted(e)) for e in led.events],
        reserved=allocator.max_reserved if allocator is not None else 0,
        reserved_at=reserved_at,
        out_of_memory=allocator is not None and allocator.out_of_memory,
    )
