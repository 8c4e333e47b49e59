"""The GPU and the links of a request: the GPU preset, what PyTorch sees of its memory, its runtime figures
(context, NCCL, workspaces; ``--reserve`` overriding the context), the link figures (explicit, the preset's,
or the stated defaults) and the calibration and compute-table files."""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError, shown
from zerocalc.base.memo import IdentityCache
from zerocalc.base.units import (
    parse_bandwidth,
    parse_bytes,
    parse_duration,
)
from zerocalc.network.calibration import Calibration
from zerocalc.network.links import (
    DEFAULT_DETAIL,
    DEFAULT_INTER_NODE_BUSBW,
    DEFAULT_INTRA_NODE_BUSBW,
    DEFAULT_LATENCY_S,
    Bandwidths,
    BandwidthSource,
    LinkFigures,
)
from zerocalc.parallel.precision import RECIPES, PrecisionName
from zerocalc.request.presets import load_gpu
from zerocalc.request.runtime_names import RuntimeNames

DEFAULT_GPU = "h100-80gb"
"""Without ``gpu``, the runtime figures (context, NCCL, cuBLAS workspaces) are this preset's (measured)."""


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
    sm_count: int | None = Field(default=None, description="streaming multiprocessors (None: not stated)")
    compute_capability: tuple[int, int] | None = Field(
        default=None, description="CUDA compute capability (None: not an NVIDIA GPU, or not stated)"
    )
    intra_node_Bps: float
    inter_node_Bps: float


def _capability(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    major, minor = text.split(".")
    return int(major), int(minor)


def gpu_preset(name: str) -> GpuChoice:
    """The GPU preset ``name``, its numbers resolved (the file read once per process,
    :mod:`zerocalc.request.presets`)."""
    spec = load_gpu(name)
    return GpuChoice(
        name=spec.name,
        title=spec.title,
        memory_bytes=spec.memory_bytes,
        usable_bytes=spec.usable_bytes,
        context_bytes=spec.context_bytes,
        context_measured=spec.context_measured,
        names=spec.names,
        bf16=spec.bf16,
        nccl_communicator_bytes=spec.nccl_communicator_bytes,
        cublas_workspace_bytes=spec.cublas_workspace_bytes,
        bf16_dense_tflops=spec.bf16_dense_tflops,
        sm_count=spec.sm_count,
        compute_capability=_capability(spec.compute_capability),
        intra_node_Bps=spec.intra_node_Bps,
        inter_node_Bps=spec.inter_node_Bps,
    )


_RUNTIMES: IdentityCache[GpuChoice] = IdentityCache(limit=64)


def runtime_of(gpu: GpuChoice | None, reserve_bytes: int | None) -> GpuChoice:
    """The runtime figures (context, NCCL, cuBLAS workspaces) of a request: the GPU preset's, else
    :data:`DEFAULT_GPU`'s, ``reserve_bytes`` (``--reserve``) in place of its context where given. Once per
    GPU object (by identity: a request reads it many times, and hashing a preset walks all its fields),
    then once per equal GPU (the same figures for equal presets)."""
    runtime = _RUNTIMES.get(gpu, reserve_bytes)
    if runtime is None:
        runtime = _RUNTIMES.put(gpu, reserve_bytes, _runtime_of(gpu, reserve_bytes))
    return runtime


@lru_cache(maxsize=64)
def _runtime_of(gpu: GpuChoice | None, reserve_bytes: int | None) -> GpuChoice:
    runtime = gpu if gpu is not None else gpu_preset(DEFAULT_GPU)
    if reserve_bytes is None:
        return runtime
    return runtime.model_copy(update={"context_bytes": reserve_bytes, "context_given": True})


def parse_gpu(
    gpu: str | None,
    gpu_memory: int | str | None,
    reserve: int | str | None,
    precision: PrecisionName = PrecisionName.BF16_MIXED,
) -> tuple[GpuChoice | None, int | None, int | None]:
    """(the GPU preset, what PyTorch sees of one GPU, ``--reserve`` in bytes).

    The memory is the preset's usable memory (``torch.cuda.mem_get_info``'s total) or ``gpu_memory``; the
    context the runtime figures hold (:func:`runtime_of`: the preset's, else :data:`DEFAULT_GPU`'s, or
    ``reserve``) must leave some of it (checked here, where the message names the values as given). A
    recipe holding bf16 tensors is refused on a GPU whose tensor cores take none (``bf16 = false``: the
    V100's, fp16 only): PyTorch would run its matmuls off the tensor cores, at no rate the preset states.
    """
    if gpu is not None and gpu_memory is not None:
        raise InputError(
            "give {gpu} or {gpu_memory}, not both; accepted: {gpu} h100-80gb or {gpu_memory} 80GiB"
        )
    preset = None if gpu is None else gpu_preset(gpu)
    reserve_bytes = None if reserve is None else parse_bytes(reserve, "{reserve}")
    runtime = runtime_of(preset, reserve_bytes)
    recipe = RECIPES[precision]
    dtypes = (recipe.param_dtype, recipe.grad_dtype, recipe.master_dtype, recipe.optimizer_state_dtype)
    if not runtime.bf16 and DType.BF16 in dtypes:
        raise InputError(
            f"{{precision}} {precision.value} on the {runtime.title}: its tensor cores take no bf16 (fp16 "
            "only); accepted: {precision} fp16-mixed or fp32"
        )
    if preset is not None:
        memory, named = preset.usable_bytes, f"the {preset.title}'s usable memory"
    elif gpu_memory is not None:
        memory = parse_bytes(gpu_memory, "{gpu_memory}")
        named = f"{{gpu_memory}} {shown(gpu_memory)}"
    else:
        return None, None, reserve_bytes
    if runtime.context_bytes >= memory:
        given = "its default" if reserve is None else shown(reserve)
        raise InputError(
            f"{{reserve}} ({given}, {runtime.context_bytes:,} bytes) is not below {named}; "
            "accepted: a smaller {reserve} or a larger memory"
        )
    return preset, memory, reserve_bytes


def link_figures(
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


def compute_calibration_path(path: str | None) -> str | None:
    if path is not None and str(path).strip() == "":
        raise InputError(
            "{compute_calibration} '' is empty; accepted: a file written by `zerocalc bench --compute`"
        )
    return path


def calibration_of(
    calibration: str | Calibration | None, name: str | None
) -> tuple[Calibration | None, str | None]:
    if calibration is None or isinstance(calibration, Calibration):
        return calibration, (name or "calibration") if calibration is not None else None
    from zerocalc.network.calibration import load_calibration

    return load_calibration(calibration), name or str(calibration)
