"""Peak memory per GPU of one training step: model states + activations + buffers + fixed overheads.

Each line of a strategy's peak is its own :class:`PeakLine` with the source it follows:

* model states: from the framework profile (:data:`PROFILES`): ``paper`` is the ZeRO paper's accounting
  (:mod:`zerocalc.memory`), ``deepspeed`` reproduces DeepSpeed's own estimators
  (:mod:`zerocalc.deepspeed_estimator`), ``megatron`` Megatron-LM's distributed optimizer, and ``fsdp``,
  ``fsdp2`` and ``torch-zero1`` what PyTorch 2.13 allocates on its largest rank, exactly
  (:mod:`zerocalc.framework_states`, checked by ``zerocalc validate``), with those frameworks' buffers;
* activations: Korthikanti et al. 2022, per op (:mod:`zerocalc.activations`); data parallelism never
  shards them, they scale with the micro-batch;
* buffers: ZeRO-3 / FSDP units gathered in flight (the current unit plus ``prefetch`` more, and the root
  unit holding embeddings and head, which FSDP keeps unsharded through forward and backward) and the
  unsharded gradients of one unit before its reduce-scatter (FSDP docs, "FSDP Notes"); ZeRO-1/2
  reduction and all-gather buckets (DeepSpeed ``reduce_bucket_size``/``allgather_bucket_size``, default
  5e8 elements each); DDP's gradient bucket (``bucket_cap_mb`` 25);
* fixed: the CUDA context and NCCL communicators (``--overhead``, the GPU preset's reserve or 2 GiB)
  and an allocator-fragmentation allowance (``--fragmentation``, a stated 10% of what the caching
  allocator holds: states, activations and buffers).
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from zerocalc import framework_states as torch_states
from zerocalc.activations import ActivationEstimate, ActivationShape, Recompute, estimate_activations
from zerocalc.activations import MlpKind as ActMlp
from zerocalc.architecture import Architecture, MlpKind, NormKind, ParameterCount, count_parameters
from zerocalc.deepspeed_estimator import zero2_model_states, zero3_model_states
from zerocalc.dtypes import DType
from zerocalc.errors import InputError
from zerocalc.memory import Location, MemoryEstimate, StateKind, StrategyMemory
from zerocalc.optimizers import OptimizerName
from zerocalc.precision import RECIPES, PrecisionName, parse_reduce_dtype
from zerocalc.strategies import DEFAULT_STRATEGIES, OffloadTarget, ShardScope, StrategyName
from zerocalc.units import ceil_div

DEFAULT_SEQ_LEN = 2048
DEFAULT_MICRO_BATCH = 1
DEFAULT_PREFETCH = 1
DDP_BUCKET_BYTES = 25 * 2**20
"""torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)."""
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed ZeRO config defaults: reduce_bucket_size = allgather_bucket_size = 5e8 elements."""
DEFAULT_FRAGMENTATION = 0.10
"""A stated allowance: the PyTorch caching allocator typically reserves 5-15% above what is allocated."""


class Framework(str, Enum):
    PAPER = "paper"
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"
    FSDP = "fsdp"
    FSDP2 = "fsdp2"
    TORCH_ZERO1 = "torch-zero1"


class Wrap(str, Enum):
    BLOCK = "block"
    """One FSDP/ZeRO-3 unit per transformer block; embeddings and head in the root unit."""
    MODEL = "model"
    """The whole model is one unit: gathered whole, so ZeRO-3 saves nothing at the peak."""


class LineKind(str, Enum):
    STATES = "model_states"
    ACTIVATIONS = "activations"
    BUFFERS = "buffers"
    OVERHEAD = "overhead"
    FRAGMENTATION = "fragmentation"


class PeakLine(BaseModel):
    kind: LineKind
    name: str
    bytes: int
    source: str
    in_framework_estimate: bool = True
    """False for lines the framework's own estimator leaves out (deepspeed profile)."""


class PeakOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    framework: Framework = Framework.PAPER
    seq_len: int = Field(default=DEFAULT_SEQ_LEN, gt=0)
    micro_batch: int = Field(default=DEFAULT_MICRO_BATCH, gt=0)
    recompute: Recompute = Recompute.NONE
    flash_attention: bool | None = Field(
        default=None, description="None: on for the Llama family (SwiGLU+RMSNorm)"
    )
    prefetch: int = Field(default=DEFAULT_PREFETCH, ge=0)
    wrap: Wrap = Wrap.BLOCK
    ddp_bucket_bytes: int = Field(default=DDP_BUCKET_BYTES, ge=0)
    reduce_bucket_elements: int = Field(default=DEEPSPEED_BUCKET_ELEMENTS, ge=0)
    allgather_bucket_elements: int = Field(default=DEEPSPEED_BUCKET_ELEMENTS, ge=0)
    overhead_bytes: int = Field(ge=0)
    fragmentation: float = Field(default=DEFAULT_FRAGMENTATION, ge=0, le=1)
    reduce_dtype: DType | None = Field(default=None, description="None: the gradient dtype")
    gpu_memory_bytes: int | None = Field(default=None, ge=0, description="the whole GPU: overhead is a line")

    @property
    def reduce_bytes(self) -> int | None:
        """Bytes per element of ``--reduce-dtype``; None: the gradient dtype."""
        return self.reduce_dtype.bytes if self.reduce_dtype is not None else None


class StrategyPeak(BaseModel):
    strategy: StrategyName
    title: str
    lines: list[PeakLine]
    peak_bytes: int
    framework_estimate_bytes: int = Field(description="the lines the framework's own accounting covers")
    host_bytes_per_node: int | None = Field(default=None, description="deepspeed: its estimator's CPU memory")
    fits: bool | None = None
    headroom_bytes: int | None = None

    def total(self, kind: LineKind) -> int:
        return sum(line.bytes for line in self.lines if line.kind is kind)


class PeakEstimate(BaseModel):
    options: PeakOptions
    flash_attention: bool
    activations: ActivationEstimate
    activation_note: str = "data parallelism never shards activations: each GPU holds its own micro-batch's"
    notes: list[str] = Field(default_factory=list)
    strategies: list[StrategyPeak]


def is_llama_family(arch: Architecture) -> bool:
    return arch.mlp is MlpKind.SWIGLU and arch.norm is NormKind.RMSNORM


def activation_shape(arch: Architecture, options: PeakOptions, flash: bool) -> ActivationShape:
    return ActivationShape(
        seq_len=options.seq_len,
        micro_batch=options.micro_batch,
        hidden=arch.hidden_size,
        heads=arch.num_heads,
        kv_heads=arch.kv_heads,
        head_dim=arch.dim_per_head,
        ffn_hidden=arch.intermediate_size,
        layers=arch.num_layers,
        vocab=arch.vocab_size,
        mlp=ActMlp(arch.mlp.value),
        dropout=arch.mlp is MlpKind.GELU,  # GPT-2/3 train with dropout; Llama-family configs set it to 0
        flash_attention=flash,
        experts=arch.num_experts,
        experts_per_token=arch.experts_per_token,
        shared_experts=arch.num_shared_experts,
    )


def _paper_states(row: StrategyMemory) -> list[PeakLine]:
    names = {
        StateKind.PARAMS: "parameters",
        StateKind.GRADS: "gradients",
        StateKind.GRAD_ACCUM: "fp32 gradient accumulation",
        StateKind.OPTIMIZER: "optimizer states",
    }
    return [
        PeakLine(
            kind=LineKind.STATES, name=names[s.kind], bytes=s.bytes, source="ZeRO paper §5 (zerocalc memory)"
        )
        for s in row.states
        if s.location is Location.GPU
    ]


def _units_in_flight(
    block: int,
    root: int,
    b_p: int,
    b_g: int,
    prefetch: int,
    source: str = "FSDP/ZeRO-3",
    copies: str = "gathered",
    b_r: int | None = None,
) -> list[PeakLine]:
    """Unit-by-unit gathering (FSDP docs, "FSDP Notes"): the current block and ``prefetch`` more, the
    root unit (kept unsharded from forward to backward), and one unit's unsharded gradients.
    ``block`` and ``root`` are elements as gathered (padding included where the framework pads)."""
    return [
        PeakLine(
            kind=LineKind.BUFFERS,
            name=f"{copies} blocks (current + {prefetch} prefetched)",
            bytes=(1 + prefetch) * block * b_p,
            source=f"{source}: a unit is unsharded before use (forward/backward prefetch)",
        ),
        PeakLine(
            kind=LineKind.BUFFERS,
            name=f"{copies} root unit (embeddings, final norm, LM head)",
            bytes=root * b_p,
            source=f"{source}: the root unit is not resharded between forward and backward",
        ),
        _unit_gradients(max(block, root), b_g, source, b_r),
    ]


def _casts_for_reduction(b_g: int, b_r: int | None) -> bool:
    """Whether gradients are cast to a wider reduce dtype first, so both copies are alive at once."""
    return b_r is not None and b_r != b_g


def _unit_gradients(numel: int, b_g: int, source: str, b_r: int | None = None) -> PeakLine:
    """One unit's unsharded gradients; with a wider reduce dtype (``--reduce-dtype fp32``) also the copy
    cast for the reduce-scatter (FSDP ``MixedPrecision(reduce_dtype=...)``), both alive at once."""
    if not _casts_for_reduction(b_g, b_r):
        return PeakLine(
            kind=LineKind.BUFFERS,
            name="unsharded gradients of one unit",
            bytes=numel * b_g,
            source=f"{source}: a unit's full gradients exist until they are reduced",
        )
    return PeakLine(
        kind=LineKind.BUFFERS,
        name="unsharded gradients of one unit + their copy in the reduce dtype",
        bytes=numel * (b_g + b_r),
        source=f"{source}: gradients are cast to the reduce dtype before the reduce-scatter",
    )


def _buffers(
    strategy: StrategyName,
    row: StrategyMemory,
    count: ParameterCount,
    options: PeakOptions,
    b_p: int,
    b_g: int,
) -> list[PeakLine]:
    """Communication buffers and gathered parameters: a pure function of the strategy and the model."""
    psi = count.total
    b_r = options.reduce_bytes
    cast = _casts_for_reduction(b_g, b_r)
    lines: list[PeakLine] = []
    if strategy is StrategyName.DDP:
        lines.append(
            PeakLine(
                kind=LineKind.BUFFERS,
                name="DDP gradient bucket",
                bytes=min(options.ddp_bucket_bytes, psi * b_g),
                source="PyTorch DDP bucket_cap_mb=25 (one bucket in flight)",
            )
        )
    elif strategy in (StrategyName.ZERO1, StrategyName.ZERO2):
        lines += [
            PeakLine(
                kind=LineKind.BUFFERS,
                name="reduce bucket",
                bytes=min(options.reduce_bucket_elements, psi) * (b_g + b_r if cast and b_r else b_g),
                source="DeepSpeed reduce_bucket_size (default 5e8 elements)"
                + ("; with its copy cast to communication_data_type" if cast else ""),
            ),
            PeakLine(
                kind=LineKind.BUFFERS,
                name="all-gather bucket",
                bytes=min(options.allgather_bucket_elements, psi) * b_p,
                source="DeepSpeed allgather_bucket_size (default 5e8 elements)",
            ),
        ]
    elif strategy is StrategyName.SHARD_GRAD_OP:
        unit = psi if options.wrap is Wrap.MODEL else count.largest_block_params
        lines.append(_unit_gradients(unit, b_g, "FSDP", b_r))
    else:  # ZeRO-3, FULL_SHARD, HYBRID_SHARD: parameters are gathered unit by unit
        if options.wrap is Wrap.MODEL:
            lines.append(
                PeakLine(
                    kind=LineKind.BUFFERS,
                    name="whole model gathered (--wrap model)",
                    bytes=psi * b_p + psi * b_g,
                    source="one unit = the model: all parameters and gradients unsharded at once, "
                    "so ZeRO-3 saves nothing at the peak",
                )
            )
        else:
            root = count.embedding + count.head
            lines += _units_in_flight(count.largest_block_params, root, b_p, b_g, options.prefetch, b_r=b_r)
    return lines


def _deepspeed_states(
    strategy: StrategyName, estimate: MemoryEstimate, count: ParameterCount
) -> tuple[list[PeakLine], int]:
    request = estimate.request
    cluster = request.cluster
    nodes, per_node = cluster.nodes, cluster.ranks_per_node
    if strategy is StrategyName.ZERO2:
        ds = zero2_model_states(
            request.params, per_node, nodes, cpu_offload=request.offload_optimizer is not OffloadTarget.NONE
        )
        return [
            PeakLine(
                kind=LineKind.STATES,
                name="DeepSpeed estimate_zero2_model_states_mem_needs",
                bytes=ds.gpu_bytes,
                source="DeepSpeed 0.19.8 stage_1_and_2.py (2 + 18/N bytes per parameter without offload)",
            )
        ], ds.cpu_bytes
    ds = zero3_model_states(
        request.params,
        count.largest_layer_params,
        per_node,
        nodes,
        cpu_offload=request.offload_optimizer is not OffloadTarget.NONE,
        cpu_offload_params=request.offload_params is not OffloadTarget.NONE,
        zero_init=True,
    )
    layer = ds.largest_layer_bytes or 0
    return [
        PeakLine(
            kind=LineKind.STATES,
            name="DeepSpeed estimate_zero3_model_states_mem_needs (sharded states)",
            bytes=ds.gpu_bytes - layer,
            source="DeepSpeed 0.19.8 stage3.py (18/N bytes per parameter without offload, zero_init=1)",
        ),
        PeakLine(
            kind=LineKind.BUFFERS,
            name="DeepSpeed largest-layer term (4 × largest layer)",
            bytes=layer,
            source="DeepSpeed 0.19.8 stage3.py largest_layer_memory",
        ),
    ], ds.cpu_bytes


def _megatron_states(strategy: StrategyName, estimate: MemoryEstimate) -> list[PeakLine]:
    """Megatron-LM distributed optimizer docs: bf16 params (2) + fp32 main grads (4) + 12/d optimizer."""
    psi = estimate.request.params
    d = estimate.request.cluster.world_size if strategy is StrategyName.ZERO1 else 1
    source = "Megatron-LM docs, distributed optimizer: 6 + 12/d bytes per parameter (18 without)"
    return [
        PeakLine(kind=LineKind.STATES, name="bf16 parameters", bytes=2 * psi, source=source),
        PeakLine(kind=LineKind.STATES, name="fp32 main gradients", bytes=4 * psi, source=source),
        PeakLine(
            kind=LineKind.STATES,
            name="fp32 master + Adam m, v" + (" (distributed)" if d > 1 else ""),
            bytes=12 * ceil_div(psi, d),
            source=source,
        ),
    ]


class TorchSetup(BaseModel):
    """How a PyTorch framework runs one zerocalc strategy (a row of :data:`TORCH_PROFILES`)."""

    model_config = ConfigDict(frozen=True)

    framework: torch_states.Framework
    title: str
    sharding: torch_states.Sharding | None = None
    reshard_after_forward: bool = True
    shard_scope: ShardScope = ShardScope.WORLD
    """NODE: the shard group is one node's GPUs (hybrid sharding), replicated across nodes."""


_FS, _SH = torch_states.Framework, torch_states.Sharding

TORCH_PROFILES: dict[Framework, dict[StrategyName, TorchSetup]] = {
    # torch/distributed/fsdp/api.py ShardingStrategy (FSDP1, use_orig_params=False, a unit per block)
    Framework.FSDP: {
        StrategyName.DDP: TorchSetup(framework=_FS.FSDP1, title="FSDP NO_SHARD", sharding=_SH.NO_SHARD),
        StrategyName.SHARD_GRAD_OP: TorchSetup(
            framework=_FS.FSDP1, title="FSDP SHARD_GRAD_OP", sharding=_SH.SHARD_GRAD_OP
        ),
        StrategyName.ZERO3: TorchSetup(framework=_FS.FSDP1, title="FSDP FULL_SHARD", sharding=_SH.FULL_SHARD),
        StrategyName.HYBRID_SHARD: TorchSetup(
            framework=_FS.FSDP1,
            title="FSDP HYBRID_SHARD",
            sharding=_SH.FULL_SHARD,
            shard_scope=ShardScope.NODE,
        ),
    },
    # torch/distributed/fsdp/_fully_shard/_fully_shard.py fully_shard(mesh, reshard_after_forward)
    Framework.FSDP2: {
        StrategyName.SHARD_GRAD_OP: TorchSetup(
            framework=_FS.FSDP2, title="FSDP2 reshard_after_forward=False", reshard_after_forward=False
        ),
        StrategyName.ZERO3: TorchSetup(framework=_FS.FSDP2, title="FSDP2 reshard_after_forward=True"),
        StrategyName.HYBRID_SHARD: TorchSetup(
            framework=_FS.FSDP2, title="FSDP2 HSDP (2-D mesh, shard in node)", shard_scope=ShardScope.NODE
        ),
    },
    # torch/nn/parallel/distributed.py; torch/distributed/optim/zero_redundancy_optimizer.py
    Framework.TORCH_ZERO1: {
        StrategyName.DDP: TorchSetup(framework=_FS.DDP, title="DDP", shard_scope=ShardScope.REPLICATED),
        StrategyName.ZERO1: TorchSetup(framework=_FS.TORCH_ZERO1, title="DDP + ZeroRedundancyOptimizer"),
    },
}
"""Which PyTorch configuration each strategy is under the ``fsdp``, ``fsdp2`` and ``torch-zero1``
profiles. The exact per-rank model states come from :mod:`zerocalc.framework_states`, the module that
``zerocalc validate`` checks against the real frameworks."""

_TORCH_SOURCE = {
    _FS.DDP: "torch 2.13 DDP",
    _FS.TORCH_ZERO1: "torch 2.13 ZeroRedundancyOptimizer (largest rank)",
    _FS.FSDP1: "torch 2.13 FSDP1",
    _FS.FSDP2: "torch 2.13 FSDP2 (largest rank)",
}


def _torch_lines(
    setup: TorchSetup, arch: Architecture, estimate: MemoryEstimate, options: PeakOptions
) -> list[PeakLine]:
    """Model states of the largest rank and the framework's buffers, exact to the element.

    fp32 sharded parameters are the master copy under ``MixedPrecision``/``MixedPrecisionPolicy`` (and
    autocast for DDP), so mixed precision has 4 + 4 + 8 bytes of states per parameter and no separate
    master; the low-precision copies are buffers (FSDP docs, "MixedPrecision").
    """
    request = estimate.request
    cluster = request.cluster
    world = cluster.ranks_per_node if setup.shard_scope is ShardScope.NODE else cluster.world_size
    mixed = request.precision is not PrecisionName.FP32
    b_r = options.reduce_bytes
    rank = torch_states.largest_rank_states(
        arch,
        setup.framework,
        world,
        "bf16-mixed" if mixed else "fp32",
        request.optimizer.value,
        setup.sharding,
        setup.reshard_after_forward,
    )
    source = _TORCH_SOURCE[setup.framework]
    lines = [
        PeakLine(kind=LineKind.STATES, name=name, bytes=line.bytes, source=f"{source}: {line.explanation}")
        for name, line in (
            ("parameters (fp32 master)", rank.params),
            ("gradients (fp32)", rank.grads),
            ("optimizer states (Adam m, v)", rank.optimizer_states),
            ("Adam step counters", rank.step),
        )
    ]
    if setup.framework in (_FS.DDP, _FS.TORCH_ZERO1):
        lines.append(
            PeakLine(
                kind=LineKind.BUFFERS,
                name="DDP reducer gradient buckets",
                bytes=rank.grads.bytes,
                source="PyTorch DDP docs: with gradient_as_bucket_view=False (default) the buckets are a "
                "second copy of every gradient; bucket_cap_mb only sets their size",
            )
        )
        return lines
    compute = RECIPES[request.precision].param_dtype
    units = {
        name: torch_states.padded_unit_numel(unit, world, setup.framework)
        for name, unit in torch_states.fsdp_units(arch)
    }
    root = units.pop("root")
    block = max(units.values(), default=0)
    no_shard = setup.sharding is _SH.NO_SHARD
    if no_shard and not mixed:
        return lines  # the flat parameters and their gradients are used in place
    keeps_all = setup.sharding is _SH.SHARD_GRAD_OP or not setup.reshard_after_forward
    if keeps_all:
        return [
            *lines,
            PeakLine(
                kind=LineKind.BUFFERS,
                name="unsharded parameters of every unit (kept from forward to backward)",
                bytes=rank.unsharded_after_forward.bytes,
                source=f"{source}: {rank.unsharded_after_forward.explanation}",
            ),
            _unit_gradients(max(block, root), compute.bytes, source, b_r),
        ]
    copies = f"{compute.value} copies of" if no_shard else "gathered"
    return lines + _units_in_flight(
        block, root, compute.bytes, compute.bytes, options.prefetch, source, copies, b_r
    )


PROFILES: dict[Framework, dict[str, object]] = {
    Framework.PAPER: {
        "strategies": tuple(StrategyName),
        "source": "ZeRO paper (Rajbhandari et al. 2020) §5; FSDP docs for units",
    },
    Framework.DEEPSPEED: {
        "strategies": (StrategyName.ZERO2, StrategyName.ZERO3),
        "source": "DeepSpeed 0.19.8 estimate_zero2/zero3_model_states_mem_needs (needs fp16/bf16 mixed Adam)",
    },
    Framework.MEGATRON: {
        "strategies": (StrategyName.DDP, StrategyName.ZERO1),
        "source": "Megatron-LM distributed optimizer (bf16 params, fp32 main grads, Adam)",
    },
    **{
        framework: {
            "strategies": tuple(setups),
            "source": _TORCH_SOURCE[next(iter(setups.values())).framework],
        }
        for framework, setups in TORCH_PROFILES.items()
    },
}
"""Which strategies each framework profile models, and where its accounting comes from."""


def _check_framework(estimate: MemoryEstimate, framework: Framework, explicit: bool) -> list[StrategyMemory]:
    request = estimate.request
    supported = PROFILES[framework]["strategies"]
    if framework in TORCH_PROFILES:
        adam = request.optimizer in (OptimizerName.ADAM, OptimizerName.ADAMW)
        if not adam or request.fp32_grad_accum or request.precision is PrecisionName.BF16_PURE:
            raise InputError(
                f"--framework {framework.value} models Adam/AdamW on fp32 parameters and gradients "
                "(MixedPrecision keeps them fp32); accepted: --precision fp32, bf16-mixed or fp16-mixed, "
                "--optimizer adam or adamw, no --fp32-grad-accum (or --framework paper)"
            )
        if (
            request.offload_optimizer is not OffloadTarget.NONE
            or request.offload_params is not OffloadTarget.NONE
        ):
            raise InputError(
                f"--framework {framework.value} does not model offload; "
                "accepted: no --offload-* options (or --framework paper or deepspeed)"
            )
    elif framework is not Framework.PAPER:
        mixed = request.precision in (PrecisionName.BF16_MIXED, PrecisionName.FP16_MIXED)
        adam = request.optimizer in (OptimizerName.ADAM, OptimizerName.ADAMW)
        if not (mixed and adam) or request.fp32_grad_accum:
            raise InputError(
                f"--framework {framework.value} models mixed-precision Adam; "
                "accepted: --precision bf16-mixed "
                "or fp16-mixed with --optimizer adam/adamw (or --framework paper)"
            )
    rows = [r for r in estimate.strategies if r.strategy in supported]  # type: ignore[operator]
    dropped = [r for r in estimate.strategies if r.strategy not in supported]  # type: ignore[operator]
    if dropped and explicit:
        names = ", ".join(s.value for s in supported)  # type: ignore[attr-defined]
        raise InputError(
            f"--framework {framework.value} models {names}; {dropped[0].strategy.value} is not one of them; "
            f"accepted: --strategy {names}"
        )
    if not rows:
        names = ", ".join(s.value for s in supported)  # type: ignore[attr-defined]
        raise InputError(f"--framework {framework.value} models {names} only; accepted: --strategy {names}")
    return rows


def evaluate_peak(
    estimate: MemoryEstimate,
    arch: Architecture,
    options: PeakOptions,
    explicit_strategies: bool = True,
) -> PeakEstimate:
    """Peak bytes per GPU for every strategy of ``estimate`` (pure)."""
    count = count_parameters(arch)
    recipe = RECIPES[estimate.request.precision]
    b_p, b_g = recipe.param_dtype.bytes, recipe.grad_dtype.bytes
    flash = is_llama_family(arch) if options.flash_attention is None else options.flash_attention
    activations = estimate_activations(activation_shape(arch, options, flash), options.recompute)
    rows = _check_framework(estimate, options.framework, explicit_strategies)
    notes: list[str] = []
    gpu_memory = options.gpu_memory_bytes
    peaks = []
    if options.framework in TORCH_PROFILES:
        if options.wrap is Wrap.MODEL:
            raise InputError(
                f"--wrap model is not accepted with --framework {options.framework.value}: its profile "
                "follows the per-block wrapping that zerocalc validate measures; accepted: --wrap block"
            )
        if arch.is_moe:
            raise InputError(
                f"--framework {options.framework.value} models dense transformers; {arch.name} is a "
                "mixture of experts; accepted: a dense --model (or --framework paper)"
            )
    for row in rows:
        host = None
        title = row.title
        if options.framework is Framework.DEEPSPEED:
            lines, host = _deepspeed_states(row.strategy, estimate, count)
            if row.strategy is StrategyName.ZERO2:  # DeepSpeed's estimator leaves its own buckets out
                lines += [
                    line.model_copy(update={"in_framework_estimate": False})
                    for line in _buffers(row.strategy, row, count, options, b_p, b_g)
                ]
        elif options.framework is Framework.MEGATRON:
            lines = _megatron_states(row.strategy, estimate)
        elif options.framework in TORCH_PROFILES:
            setup = TORCH_PROFILES[options.framework][row.strategy]
            title = setup.title
            lines = _torch_lines(setup, arch, estimate, options)
        else:
            lines = _paper_states(row) + _buffers(row.strategy, row, count, options, b_p, b_g)
        outside = options.framework is Framework.DEEPSPEED
        lines.append(
            PeakLine(
                kind=LineKind.ACTIVATIONS,
                name=(
                    f"activations (s={options.seq_len}, b={options.micro_batch}, "
                    f"recompute {options.recompute.value})"
                ),
                bytes=activations.total_bytes,
                source="Korthikanti et al. 2022, Table 2, per op" + ("; flash attention" if flash else ""),
                in_framework_estimate=not outside,
            )
        )
        allocated = sum(line.bytes for line in lines)
        lines += [
            PeakLine(
                kind=LineKind.OVERHEAD,
                name="CUDA context + NCCL communicators",
                bytes=options.overhead_bytes,
                source="--overhead (GPU preset reserve, default 2 GiB)",
                in_framework_estimate=not outside,
            ),
            PeakLine(
                kind=LineKind.FRAGMENTATION,
                name=f"allocator fragmentation ({options.fragmentation:.0%})",
                bytes=round(options.fragmentation * allocated),
                source="--fragmentation, a stated allowance on the caching allocator",
                in_framework_estimate=not outside,
            ),
        ]
        peak = sum(line.bytes for line in lines)
        fits = headroom = None
        if gpu_memory is not None:
            headroom = gpu_memory - peak
            fits = headroom >= 0
        peaks.append(
            StrategyPeak(
                strategy=row.strategy,
                title=title,
                lines=lines,
                peak_bytes=peak,
                framework_estimate_bytes=sum(line.bytes for line in lines if line.in_framework_estimate),
                host_bytes_per_node=host,
                fits=fits,
                headroom_bytes=headroom,
            )
        )
    if options.framework is Framework.DEEPSPEED:
        notes.append(
            "DeepSpeed's estimator covers only the lines marked as in its estimate; it prints GiB labelled "
            "'GB' and adds a 1.5x factor to host memory"
        )
    if options.wrap is Wrap.MODEL:
        notes.append(
            "--wrap model gathers the whole model at once: "
            "ZeRO-3's parameter sharding saves nothing at the peak"
        )
    return PeakEstimate(
        options=options, flash_attention=flash, activations=activations, notes=notes, strategies=peaks
    )


def estimate_peak(
    model: str,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    *,
    framework: str = "paper",
    seq_len: int = DEFAULT_SEQ_LEN,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    recompute: str = "none",
    flash_attention: bool | None = None,
    prefetch: int = DEFAULT_PREFETCH,
    wrap: str = "block",
    ddp_bucket: int | str = DDP_BUCKET_BYTES,
    reduce_bucket: int | str = DEEPSPEED_BUCKET_ELEMENTS,
    allgather_bucket: int | str = DEEPSPEED_BUCKET_ELEMENTS,
    overhead: int | str | None = None,
    fragmentation: float = DEFAULT_FRAGMENTATION,
    reduce_dtype: str | None = None,
    **memory_options: object,
) -> tuple[MemoryEstimate, PeakEstimate]:
    """Library entry point: the model-state estimate and the peak of each strategy for a named model.

    ``memory_options`` are :func:`zerocalc.memory.estimate_memory`'s (strategies, precision, optimizer,
    offload, gpu, gpu_memory, ...); ``overhead`` is also its ``reserve``.
    """
    from zerocalc.memory import estimate_memory
    from zerocalc.presets import DEFAULT_RESERVE, load_model
    from zerocalc.units import parse_bytes, parse_count

    options = parse_peak_options(
        framework=framework,
        seq_len=seq_len,
        micro_batch=micro_batch,
        recompute=recompute,
        flash_attention=flash_attention,
        prefetch=prefetch,
        wrap=wrap,
        ddp_bucket_bytes=parse_bytes(ddp_bucket, "--ddp-bucket"),
        reduce_bucket_elements=parse_count(reduce_bucket, "--reduce-bucket") if reduce_bucket else 0,
        allgather_bucket_elements=parse_count(allgather_bucket, "--allgather-bucket")
        if allgather_bucket
        else 0,
        overhead_bytes=0,
        fragmentation=fragmentation,
    )
    strategies = memory_options.get("strategies")
    gpu = memory_options.get("gpu")
    reserve = {"reserve": overhead} if gpu is not None else {}
    profile = options.framework
    estimate = estimate_memory(
        None,
        gpus,
        gpus_per_node,
        model=model,
        default_strategies=PROFILES[profile]["strategies"]  # type: ignore[arg-type]
        if profile is not Framework.PAPER
        else DEFAULT_STRATEGIES,
        **reserve,  # type: ignore[arg-type]
        **memory_options,  # type: ignore[arg-type]
    )
    if estimate.gpu is not None:  # the reserve becomes the overhead line; fits compares with the whole GPU
        kept, whole = estimate.gpu.reserve_bytes, estimate.gpu.memory_bytes
    else:
        kept = parse_bytes(overhead if overhead is not None else DEFAULT_RESERVE, "--overhead")
        whole = estimate.request.gpu_memory_bytes
    reduce = parse_reduce_dtype(reduce_dtype, RECIPES[estimate.request.precision])
    options = options.model_copy(
        update={"overhead_bytes": kept, "gpu_memory_bytes": whole, "reduce_dtype": reduce}
    )
    arch, _ = load_model(model)
    explicit = strategies not in (None, "all")
    return estimate, evaluate_peak(estimate, arch, options, explicit_strategies=explicit)


def parse_peak_options(**values: object) -> PeakOptions:
    """Validate peak options; a bad value is one InputError naming it and what is accepted."""
    choices = {
        "framework": (Framework, "--framework"),
        "recompute": (Recompute, "--recompute"),
        "wrap": (Wrap, "--wrap"),
    }
    for key, (enum, option) in choices.items():
        try:
            values[key] = enum(str(values[key]).strip().lower())
        except ValueError:
            accepted = ", ".join(e.value for e in enum)
            raise InputError(f"{option} {values[key]!r} is not accepted; accepted: {accepted}") from None
    limits = {
        "seq_len": ("--seq-len", "a whole number of tokens, 1 or more", 1),
        "micro_batch": ("--micro-batch", "a whole number of sequences, 1 or more", 1),
        "prefetch": ("--prefetch", "a whole number of units, 0 or more", 0),
    }
    for key, (option, accepted, low) in limits.items():
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"{option} {value!r} is not accepted; accepted: {accepted}")
    frag = values["fragmentation"]
    if not isinstance(frag, (int, float)) or not 0 <= frag <= 1:
        raise InputError(
            f"--fragmentation {frag!r} is not accepted; accepted: a fraction from 0 to 1, e.g. 0.1"
        )
    return PeakOptions(**values)  # type: ignore[arg-type]


def report_json(estimate: MemoryEstimate, peak: PeakEstimate) -> dict[str, object]:
    """``zerocalc memory --model --json``: the model-state estimate with the peak under ``"peak"``."""
    return {**estimate.model_dump(mode="json"), "peak": peak.model_dump(mode="json")}
