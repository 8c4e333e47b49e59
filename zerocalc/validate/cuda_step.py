"""The torch side of ``zerocalc validate cuda``: real FSDP2 steps on one GPU, each phase's peak.

The recipe of ``shared/measurements/h100-fsdp2-hf/README.md``: ``AutoModelForCausalLM.from_config`` in fp32
on the GPU (sdpa), every decoder layer then the root under ``fully_shard(mp_policy=MixedPrecisionPolicy(
param_dtype=bf16, reduce_dtype=fp32), reshard_after_forward=R)`` on a world-1 NCCL group, ``AdamW(lr=1e-5,
foreach=True)``, ``labels = input_ids``, three steps, the third measured with
``torch.cuda.reset_peak_memory_stats`` between phases (``torch/cuda/memory.py``). The model and optimizer
are :func:`zerocalc.validate.recipe.fsdp2_model`'s.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from zerocalc.validate.phases import PhaseMeasurement
from zerocalc.validate.recipe import fsdp2_model

STEPS = 3
SNAPSHOT_MAX_ENTRIES = 1_000_000
"""At most this many allocator events in a recorded step's history (torch keeps the latest)."""


def cuda_device() -> tuple[str, int] | None:
    """The first CUDA device's name and total memory (``cudaMemGetInfo``), or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), torch.cuda.mem_get_info()[1]


def run(
    config: dict[str, Any], b: int, s: int, reshard: bool, recompute: bool, snapshot: bool = False
) -> tuple[PhaseMeasurement, dict[str, Any] | None]:
    """The phases' peaks of the last of :data:`STEPS` steps; with ``snapshot``, the allocator's history of
    that step (``torch.cuda.memory._record_memory_history`` from its start, Python frames) and its state
    at the end, as ``torch.cuda.memory._snapshot()`` returns them (``torch/cuda/memory.py``)."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1)
    free, total = torch.cuda.mem_get_info()
    cfg, model, opt = fsdp2_model(config, reshard, recompute, device=device)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=device)
    figures: dict[str, int] = {}
    for step in range(STEPS):
        last = step == STEPS - 1
        torch.cuda.synchronize()
        if last:
            figures["start_allocated"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            if snapshot:
                torch.cuda.memory._record_memory_history(
                    enabled="all", context="all", stacks="python", max_entries=SNAPSHOT_MAX_ENTRIES
                )
        loss = model(input_ids=ids, labels=ids).loss
        torch.cuda.synchronize()
        if last:
            figures["forward_peak"] = torch.cuda.max_memory_allocated()
            figures["after_forward"] = torch.cuda.memory_allocated()
            reserved = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        loss.backward()
        torch.cuda.synchronize()
        if last:
            figures["backward_peak"] = torch.cuda.max_memory_allocated()
            figures["after_backward"] = torch.cuda.memory_allocated()
            reserved = max(reserved, torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        if last:
            figures["optimizer_peak"] = torch.cuda.max_memory_allocated()
            reserved = max(reserved, torch.cuda.max_memory_reserved())
    recorded = None
    if snapshot:
        recorded = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    free, total = torch.cuda.mem_get_info()
    peaks = ("forward_peak", "backward_peak", "optimizer_peak")
    result = PhaseMeasurement(
        **figures,
        max_allocated=max(figures[p] for p in peaks),
        max_reserved=reserved,
        device_used=total - free,
    )
    del model, opt, loss
    import gc

    gc.collect()
    dist.destroy_process_group()
    return result, recorded


def timed_steps(config: dict[str, Any], b: int, s: int, steps: int, warmup: int) -> list[float]:
    """Seconds of ``steps`` whole training steps (forward, backward, ``optimizer.step()``, ``zero_grad``)
    of the same recipe as :func:`run` (``reshard_after_forward`` on, no recompute), after ``warmup``
    untimed ones (:func:`zerocalc.validate.step_timing.time_steps`)."""
    import torch.distributed as dist

    from zerocalc.validate.step_timing import time_steps

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1)
    cfg, *parts = fsdp2_model(config, True, False, device=device)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=device)

    def step() -> None:
        model, opt = parts
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    seconds = time_steps(step, torch.cuda.synchronize, steps, warmup)
    parts.clear()  # the model and optimizer freed before the group is torn down
    import gc

    gc.collect()
    dist.destroy_process_group()
    return seconds
