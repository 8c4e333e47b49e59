"""Peak memory per GPU of one training step: model states + activations + buffers + fixed overheads.

Each line of a strategy's peak is its own :class:`~zerocalc.peak.report.PeakLine` with the source it
follows:

* model states (and the buffers that come with them): from the framework's profile
  (:data:`~zerocalc.peak.profiles.PROFILES`, built by :mod:`zerocalc.peak.states`);
* activations: Korthikanti et al. 2022, per op (:mod:`zerocalc.activations`); data parallelism never
  shards them, they scale with the micro-batch;
* fixed: the CUDA context and NCCL communicators (the GPU preset's reserve, or ``reserve``, 2 GiB by
  default) and an allocator-fragmentation allowance (``fragmentation``, a stated 10% of what the caching
  allocator holds: states, activations and buffers).
"""

from __future__ import annotations

from zerocalc.activations import ActivationEstimate, ActivationShape, estimate_activations
from zerocalc.architecture import Architecture, MlpKind, NormKind
from zerocalc.frameworks import Framework
from zerocalc.memory import StrategyMemory, evaluate_memory
from zerocalc.peak.profiles import PROFILES, Profile, Wrap
from zerocalc.peak.report import LineKind, MemoryReport, PeakEstimate, PeakLine, PeakOptions, StrategyPeak
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.request import TrainingRequest
from zerocalc.strategies import STRATEGIES


def is_llama_family(arch: Architecture) -> bool:
    return arch.mlp is MlpKind.SWIGLU and arch.norm is NormKind.RMSNORM


def flash_attention_used(request: TrainingRequest) -> bool:
    """``flash_attention`` as asked, else on for the Llama family (SwiGLU + RMSNorm)."""
    asked = request.activations.flash_attention
    return is_llama_family(request.architecture) if asked is None else asked


def activation_shape(request: TrainingRequest) -> ActivationShape:
    arch = request.architecture
    return ActivationShape(
        seq_len=request.activations.seq_len,
        micro_batch=request.activations.micro_batch,
        hidden=arch.hidden_size,
        heads=arch.num_heads,
        kv_heads=arch.kv_heads,
        head_dim=arch.dim_per_head,
        ffn_hidden=arch.intermediate_size,
        layers=arch.num_layers,
        vocab=arch.vocab_size,
        mlp=arch.mlp,
        dropout=arch.mlp is MlpKind.GELU,  # GPT-2/3 train with dropout; Llama-family configs set it to 0
        flash_attention=flash_attention_used(request),
        experts=arch.num_experts,
        experts_per_token=arch.experts_per_token,
        shared_experts=arch.num_shared_experts,
    )


def peak_options(request: TrainingRequest) -> PeakOptions:
    a, b = request.activations, request.buffers
    return PeakOptions(
        framework=request.framework,
        seq_len=a.seq_len,
        micro_batch=a.micro_batch,
        recompute=a.recompute,
        flash_attention=a.flash_attention,
        prefetch=b.prefetch,
        wrap=b.wrap,
        ddp_bucket_bytes=b.ddp_bucket_bytes,
        reduce_bucket_elements=b.reduce_bucket_elements,
        allgather_bucket_elements=b.allgather_bucket_elements,
        overhead_bytes=request.overhead_bytes,
        fragmentation=request.fragmentation,
        reduce_dtype=request.reduce_dtype,
        gpu_memory_bytes=request.peak_gpu_memory_bytes,
    )


def strategy_peak(
    request: TrainingRequest, profile: Profile, row: StrategyMemory, activations: ActivationEstimate
) -> StrategyPeak:
    """The peak of one strategy: its profile's states and buffers, activations, overhead, fragmentation."""
    strategy = STRATEGIES[row.strategy]
    lines, host = STATE_BUILDERS[profile.states](request, strategy, row)
    inside = not profile.estimate_covers_states_only
    a = request.activations
    lines.append(
        PeakLine(
            kind=LineKind.ACTIVATIONS,
            name=f"activations (s={a.seq_len}, b={a.micro_batch}, recompute {a.recompute.value})",
            bytes=activations.total_bytes,
            source="Korthikanti et al. 2022, Table 2, per op"
            + ("; flash attention" if flash_attention_used(request) else ""),
            in_framework_estimate=inside,
        )
    )
    allocated = sum(line.bytes for line in lines)
    lines += [
        PeakLine(
            kind=LineKind.OVERHEAD,
            name="CUDA context + NCCL communicators",
            bytes=request.overhead_bytes,
            source="--overhead (GPU preset reserve, default 2 GiB)",
            in_framework_estimate=inside,
        ),
        PeakLine(
            kind=LineKind.FRAGMENTATION,
            name=f"allocator fragmentation ({request.fragmentation:.0%})",
            bytes=round(request.fragmentation * allocated),
            source="--fragmentation, a stated allowance on the caching allocator",
            in_framework_estimate=inside,
        ),
    ]
    peak = sum(line.bytes for line in lines)
    gpu_memory = request.peak_gpu_memory_bytes
    headroom = None if gpu_memory is None else gpu_memory - peak
    return StrategyPeak(
        strategy=row.strategy,
        title=strategy.title_under(request.framework),
        lines=lines,
        peak_bytes=peak,
        framework_estimate_bytes=sum(line.bytes for line in lines if line.in_framework_estimate),
        host_bytes_per_node=host,
        fits=None if headroom is None else headroom >= 0,
        headroom_bytes=headroom,
    )


def evaluate_peak(request: TrainingRequest) -> MemoryReport:
    """Model states and the peak of one step per strategy, for a request with an architecture (pure)."""
    estimate = evaluate_memory(request)
    profile = PROFILES[request.framework]
    activations = estimate_activations(activation_shape(request), request.activations.recompute)
    rows = [strategy_peak(request, profile, row, activations) for row in estimate.strategies]
    notes: list[str] = []
    if request.framework is Framework.DEEPSPEED:
        notes.append(
            "DeepSpeed's estimator covers only the lines marked as in its estimate; it prints GiB labelled "
            "'GB' and adds a 1.5x factor to host memory"
        )
    if request.buffers.wrap is Wrap.MODEL:
        notes.append(
            "--wrap model gathers the whole model at once: "
            "ZeRO-3's parameter sharding saves nothing at the peak"
        )
    peak = PeakEstimate(
        options=peak_options(request),
        flash_attention=flash_attention_used(request),
        activations=activations,
        notes=notes,
        strategies=rows,
    )
    return MemoryReport(**dict(estimate), peak=peak)


def evaluate(request: TrainingRequest) -> MemoryReport:
    """``zerocalc memory``: model states, and the peak when the request has an architecture."""
    if request.model.architecture is None:
        return MemoryReport(**dict(evaluate_memory(request)))
    return evaluate_peak(request)
