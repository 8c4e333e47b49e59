"""What a GPU vendor's software is called in outputs (pure): a field of each GPU preset
(:mod:`zerocalc.request.presets`), carried by the request's GPU (:mod:`zerocalc.request.gpu`) to the peak's
report."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
