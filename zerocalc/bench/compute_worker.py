"""The torch side of ``zerocalc bench --compute``: time GEMMs, fused attention and an element-wise kernel
on this process's device and return a :class:`~zerocalc.compute.table.ComputeTable` (imports torch).

Timing: ``warmup`` untimed runs, then runs timed one by one (CUDA events on a GPU, the wall clock on
the CPU) until ``min_seconds`` have passed or ``iters`` ran; a point's time is the median. fp8 GEMMs run
``torch._scaled_mm`` (e4m3 inputs, per-tensor scales, a bf16 output), the GEMM of Transformer Engine's
and torchao's fp8 linears, on GPUs of compute capability 8.9 and later. Attention is
``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal``; its backward time is the forward
and backward's less the forward's.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import torch
import torch.nn.functional as F

from zerocalc.base.dtypes import DType
from zerocalc.bench.compute import AttentionShape, ComputeBenchConfig, GemmShape
from zerocalc.compute.ops import FLASH_BACKWARD_FLOPS, Attention
from zerocalc.compute.table import AttentionPoint, BandwidthPoint, ComputeTable, GemmPoint

FP8_CAPABILITY = (8, 9)
"""Ada and Hopper: the first GPUs with fp8 tensor cores."""


def fp8_available(device: str = "cuda") -> bool:
    """FP8 GEMMs run on ``device``: a CUDA GPU of compute capability 8.9 or later, or a CPU where
    ``torch._scaled_mm`` runs (torch 2.13's CPU kernel: a 16 × 16 product tried; it prices nothing, it
    tests the path)."""
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
        return False
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability() >= FP8_CAPABILITY
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    one = torch.ones(())
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def visible_device() -> bool:
    """A CUDA device is visible to torch here."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return platform.processor() or platform.machine() or "cpu"


def _timer(device: str, warmup: int, iters: int, min_seconds: float) -> Callable[[Callable[[], Any]], float]:
    cuda = device == "cuda"

    def measure(run: Callable[[], Any]) -> float:
        for _ in range(warmup):
            run()
        if cuda:
            torch.cuda.synchronize()
        samples: list[float] = []
        spent = 0.0
        while len(samples) < iters and spent < min_seconds:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                seconds = start.elapsed_time(end) / 1e3
            else:
                begin = time.perf_counter()
                run()
                seconds = time.perf_counter() - begin
            samples.append(seconds)
            spent += seconds
        return statistics.median(samples)

    return measure


def _gemm(shape: GemmShape, dtype: DType, device: str, measure: Callable) -> GemmPoint:
    m, n, k = shape
    if dtype is DType.FP8:
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.ones((), device=device)

        def run() -> Any:
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        torch_dtype = getattr(torch, dtype.torch_name)
        a = torch.randn(m, k, device=device, dtype=torch_dtype)
        b = torch.randn(k, n, device=device, dtype=torch_dtype)
        out = torch.empty(m, n, device=device, dtype=torch_dtype)

        def run() -> Any:
            return torch.matmul(a, b, out=out)

    seconds = measure(run)
    return GemmPoint(m=m, n=n, k=k, dtype=dtype, seconds=seconds, tflops=2 * m * n * k / seconds / 1e12)


def _attention(shape: AttentionShape, dtype: DType, device: str, measure: Callable) -> AttentionPoint:
    torch_dtype = getattr(torch, dtype.torch_name)
    q, k, v = (
        torch.randn(
            shape.batch,
            shape.heads,
            seq,
            shape.head_dim,
            device=device,
            dtype=torch_dtype,
            requires_grad=True,
        )
        for seq in (shape.seq_q, shape.seq_kv, shape.seq_kv)
    )
    grad = torch.randn(
        shape.batch, shape.heads, shape.seq_q, shape.head_dim, device=device, dtype=torch_dtype
    )

    def forward() -> Any:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

    def both() -> Any:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)
        return torch.autograd.grad(out, (q, k, v), grad)

    forward_s = measure(forward)
    backward_s = max(measure(both) - forward_s, forward_s / 100)
    flops = Attention(
        shape.batch,
        shape.heads,
        shape.seq_q,
        shape.seq_kv,
        shape.head_dim,
        shape.head_dim,
        shape.causal,
        True,
    ).forward_flops
    return AttentionPoint(
        batch=shape.batch,
        heads=shape.heads,
        seq_q=shape.seq_q,
        seq_kv=shape.seq_kv,
        head_dim=shape.head_dim,
        causal=shape.causal,
        dtype=dtype,
        forward_s=forward_s,
        backward_s=backward_s,
        forward_tflops=flops / forward_s / 1e12,
        backward_tflops=FLASH_BACKWARD_FLOPS * flops / backward_s / 1e12,
    )


def _bandwidth(nbytes: int, device: str, measure: Callable) -> BandwidthPoint:
    elements = max(1, nbytes // 4)  # bf16: 2 bytes read and 2 written per element
    x = torch.randn(elements, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    seconds = measure(lambda: torch.mul(x, 2.0, out=y))
    moved = 4 * elements
    return BandwidthPoint(bytes=moved, seconds=seconds, bytes_per_s=moved / seconds)


def run(config: ComputeBenchConfig, on_point: Callable[[str], None] | None = None) -> ComputeTable:
    """Every point of ``config`` on this process's device."""
    device = config.device
    measure = _timer(device, config.warmup, config.iters, config.min_seconds)
    torch.manual_seed(0)
    gemms = []
    for dtype in config.dtypes:
        for shape in config.gemms:
            gemms.append(_gemm(shape, dtype, device, measure))
            if on_point is not None:
                on_point("gemm")
    attention_dtype = next((d for d in config.dtypes if d is not DType.FP8), DType.BF16)
    attention = []
    for shape in config.attention:
        attention.append(_attention(shape, attention_dtype, device, measure))
        if on_point is not None:
            on_point("attention")
    memory = []
    for nbytes in config.bandwidth_bytes:
        memory.append(_bandwidth(nbytes, device, measure))
        if on_point is not None:
            on_point("memory")
    return ComputeTable(
        device_name=device_name(device),
        source=config.source,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        torch_version=torch.__version__,
        backend=device,
        gemm=tuple(gemms),
        attention=tuple(attention),
        memory=tuple(memory),
    )
