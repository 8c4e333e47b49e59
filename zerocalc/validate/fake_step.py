"""The torch side of ``zerocalc validate --fake``: real FSDP2 steps of a real Hugging Face model under fake
tensors, tracked phase by phase with PyTorch's ``FSDPMemTracker``.

The recipe of :mod:`zerocalc.validate.cuda_step` at any world size, on the CPU: ``FakeTensorMode``
(``torch/_subclasses/fake_tensor.py``: tensors with shapes and dtypes, no data) and the fake process group
(``torch/testing/_internal/distributed/fake_pg.py``: every collective returns at once) of N ranks, this
process being rank 0. ``AutoModelForCausalLM.from_config`` in fp32 (sdpa), every decoder layer then the
root under ``fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32),
reshard_after_forward=R)``, ``AdamW(foreach=True)``, ``labels = input_ids``, three steps, the third
measured. ``torch/distributed/_tools/fsdp2_mem_tracker.py`` sees every storage the dispatcher creates and
every one freed; each phase's peak is its high-water mark from the phase's start (the tracker's
``_peak_mem`` reset there, as ``torch.cuda.reset_peak_memory_stats`` resets the CUDA one).

Artefacts of a fake CPU run that a GPU run does not have, neutralised here:

* the tracker rounds only CUDA storages to the caching allocator's 512 B (``_WeakRefInfo.
  _calculate_mem_consumed``): every storage is rounded here;
* transformers' ``is_tracing()`` is true for a fake tensor (``utils/import_utils.py``), so
  ``masking_utils.find_packed_sequence_indices`` cannot see that ``arange`` positions are one sequence and
  returns a packed-sequence index that makes an explicit (b, 1, s, s) mask (whenever no cache is passed:
  ``use_cache=False``, as under checkpointing). A real run returns None there; so does the run here;
* Adam's ``step`` counters are host tensors in a GPU run (``torch/optim/adam.py``, not ``capturable``, not
  ``fused``): they are untracked after each ``optimizer.step``;
* a sliding-window cache layer (``cache_utils.DynamicSlidingWindowLayer``) makes its 0-dim
  ``_sliding_window_tensor`` on the host and copies it to the device at its first update; on the CPU the
  copy is the same tensor, so it would count from the cache's creation: the host tensor is made on "meta"
  here, and the copy at the first update is counted;
* the tracker refuses a second forward of the root without ``reset_mod_stats()``: called every step;
* fake CUDA tensors on a CPU-only torch abort at the first autograd edge: the device is "cpu" (CPU SDPA
  runs ``_scaled_dot_product_flash_attention_for_cpu``: the output and log-sum-exp CUDA flash keeps).
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from zerocalc.model.activations import Recompute
from zerocalc.request.training import TrainingRequest
from zerocalc.validate.fake import FakeCase, FakeReport, compare
from zerocalc.validate.phases import AllocatedPhases

STEPS = 3
CUDA_BLOCK = 512
"""``kMinBlockSize`` of ``c10/cuda/CUDACachingAllocator.cpp``, the tracker's ``_PYTORCH_MIN_ALLOCATE``."""


@contextlib.contextmanager
def _neutralised() -> Iterator[None]:
    """Every storage rounded to 512 B in the tracker; no packed-sequence index from fake positions."""
    from torch.distributed._tools import mem_tracker
    from transformers import cache_utils, masking_utils

    def rounded(info: Any) -> int:
        return math.ceil(info.size * info.element_size / CUDA_BLOCK) * CUDA_BLOCK

    def one_sequence(position_ids: torch.Tensor) -> None:
        return None  # the inputs are one sequence per row (positions 0 … s−1)

    sliding_init = cache_utils.DynamicSlidingWindowLayer.__init__

    def host_window_tensor(layer: Any, *args: Any, **kwargs: Any) -> None:
        sliding_init(layer, *args, **kwargs)
        layer._sliding_window_tensor = layer._sliding_window_tensor.to("meta")  # a host tensor, untracked

    saved = mem_tracker._WeakRefInfo._calculate_mem_consumed, masking_utils.find_packed_sequence_indices
    mem_tracker._WeakRefInfo._calculate_mem_consumed = rounded
    masking_utils.find_packed_sequence_indices = one_sequence
    cache_utils.DynamicSlidingWindowLayer.__init__ = host_window_tensor
    try:
        yield
    finally:
        mem_tracker._WeakRefInfo._calculate_mem_consumed, masking_utils.find_packed_sequence_indices = saved
        cache_utils.DynamicSlidingWindowLayer.__init__ = sliding_init


def run_cases(config: dict[str, Any], cases: list[tuple[FakeCase, TrainingRequest]]) -> FakeReport:
    """Every case run and compared with its request's timeline."""
    import transformers

    results = []
    for case, request in cases:
        recompute = case.recompute is Recompute.FULL
        measured, seconds = run(config, case.world, case.micro_batch, case.seq_len, case.reshard, recompute)
        results.append(compare(request, case, measured, seconds, config))
    return FakeReport(torch=torch.__version__, transformers=transformers.__version__, cases=tuple(results))


def run(
    config: dict[str, Any], world: int, b: int, s: int, reshard: bool, recompute: bool
) -> tuple[AllocatedPhases, float]:
    """One case: its third step's allocated figures (bytes on the largest rank, rank 0) and the seconds
    it took."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    started = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        # the mesh is built on real tensors (under fake tensors its rank check reads a fake value)
        mesh = init_device_mesh("cpu", (world,))
        with _neutralised():
            figures = _steps(config, mesh, b, s, reshard, recompute)
    finally:
        gc.collect()
        dist.destroy_process_group()
    return figures, time.perf_counter() - started


def _steps(
    config: dict[str, Any], mesh: Any, b: int, s: int, reshard: bool, recompute: bool
) -> AllocatedPhases:
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _UpdateType

    from zerocalc.validate.recipe import fsdp2_model

    transformers.logging.set_verbosity_error()
    cpu = torch.device("cpu")
    with FakeTensorMode():
        cfg, model, opt = fsdp2_model(config, reshard, recompute, mesh=mesh)
        ids = torch.randint(0, cfg.vocab_size, (b, s), device=cpu)
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((ids,))

        def allocated() -> int:
            return tracker.get_tracker_snapshot("current").get(cpu, {}).get("Total", 0)

        def reset_peak() -> None:
            tracker._peak_mem = {cpu: allocated()}

        def peak() -> int:
            return tracker._peak_mem.get(cpu, 0)

        def untrack_step_counters() -> None:
            for state in opt.state.values():
                step = state.get("step")
                if step is None:
                    continue
                info, _ = tracker._WINFO.get(step.untyped_storage(), (None, None))
                if info is not None and info.mem_consumed > 0:
                    tracker._update_snap(_UpdateType.DEL, info)
                    info.mem_consumed = 0

        figures: dict[str, int] = {}
        # the training loop's `loss` lives into the next step until the next forward returns (the
        # timeline's "previous step's loss")
        with tracker:
            for _ in range(STEPS):
                tracker.reset_mod_stats()
                figures["start_allocated"] = allocated()
                reset_peak()
                loss = model(input_ids=ids, labels=ids).loss
                figures["forward_peak"], figures["after_forward"] = peak(), allocated()
                reset_peak()
                loss.backward()
                figures["backward_peak"], figures["after_backward"] = peak(), allocated()
                reset_peak()
                opt.step()
                opt.zero_grad()
                untrack_step_counters()
                figures["optimizer_peak"] = peak()

    return AllocatedPhases(**figures)
