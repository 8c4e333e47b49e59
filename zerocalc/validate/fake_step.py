"""The torch side of ``zerocalc validate fake``: real FSDP2 steps of a real Hugging Face model under fake
tensors, tracked phase by phase with PyTorch's ``FSDPMemTracker``.

The recipe of :mod:`zerocalc.validate.cuda_step` at any world size, on the CPU: ``FakeTensorMode``
(``torch/_subclasses/fake_tensor.py``: tensors with shapes and dtypes, no data) and the fake process group
(``torch/testing/_internal/distributed/fake_pg.py``: every collective returns at once) of N ranks, this
process being rank 0. ``AutoModelForCausalLM.from_config`` in fp32 (sdpa; with ``--lora-rank``, bf16 and
PEFT's LoRA on it: :func:`~zerocalc.validate.recipe.fsdp2_model`), every decoder layer then the
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
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import Architecture
from zerocalc.model.code import OutputKept
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.peak.ledger import CUDA_BLOCK
from zerocalc.request.training import TrainingRequest
from zerocalc.validate.config import TpPlan
from zerocalc.validate.fake import FakeCase, FakeReport, TrackedStates, compare, compare_tp
from zerocalc.validate.phases import AllocatedPhases

STEPS = 3

_LIBRARY_NOISE = (
    ("torchao", "Failed to load "),
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
)
"""What importing transformers prints through torchao 0.18 (which transformers imports where it is
installed): ``torchao/__init__.py`` logs a warning for each of its CUDA extensions a CPU-only torch cannot
load, and its enums' ``register_constant`` calls make torch 2.13's ``torch/utils/_pytree.py`` log a
deprecation per enum. Neither concerns a CPU run; each is dropped by a filter on the logger that emits
it (:func:`_quiet_libraries`)."""


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def _quiet_libraries() -> None:
    """Filters on the loggers of :data:`_LIBRARY_NOISE`, once, before transformers is imported."""
    for name, fragment in _LIBRARY_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropMessage(fragment))


_quiet_libraries()


@contextlib.contextmanager
def _neutralised() -> Iterator[None]:
    """Every storage rounded to 512 B in the tracker; no packed-sequence index from fake positions; under a
    dp × tp mesh, FSDP2's joined mesh built on real tensors and DTensor's global-shape metadata derived
    off the tracker."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed._tools import mem_tracker
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers import cache_utils, masking_utils

    def rounded(info: Any) -> int:  # kMinBlockSize of c10/cuda/CUDACachingAllocator.cpp
        return math.ceil(info.size * info.element_size / CUDA_BLOCK) * CUDA_BLOCK

    def one_sequence(position_ids: torch.Tensor) -> None:
        return None  # the inputs are one sequence per row (positions 0 … s−1)

    sliding_init = cache_utils.DynamicSlidingWindowLayer.__init__

    def host_window_tensor(layer: Any, *args: Any, **kwargs: Any) -> None:
        sliding_init(layer, *args, **kwargs)
        layer._sliding_window_tensor = layer._sliding_window_tensor.to("meta")  # a host tensor, untracked

    concatenate = DeviceMesh._concatenate

    def concatenated_on_real_tensors(meshes: list[Any]) -> Any:
        with unset_fake_temporarily():
            return concatenate(meshes)

    meta = ShardingPropagator._propagate_tensor_meta_non_cached

    def meta_untracked(propagator: Any, op_schema: Any) -> Any:
        with _disable_current_modes():  # off the tracker and the run's fake mode: a fresh fake mode
            return meta(propagator, op_schema)

    saved = mem_tracker._WeakRefInfo._calculate_mem_consumed, masking_utils.find_packed_sequence_indices
    mem_tracker._WeakRefInfo._calculate_mem_consumed = rounded
    masking_utils.find_packed_sequence_indices = one_sequence
    cache_utils.DynamicSlidingWindowLayer.__init__ = host_window_tensor
    DeviceMesh._concatenate = staticmethod(concatenated_on_real_tensors)
    ShardingPropagator._propagate_tensor_meta_non_cached = meta_untracked
    try:
        yield
    finally:
        mem_tracker._WeakRefInfo._calculate_mem_consumed, masking_utils.find_packed_sequence_indices = saved
        cache_utils.DynamicSlidingWindowLayer.__init__ = sliding_init
        DeviceMesh._concatenate = staticmethod(concatenate)
        ShardingPropagator._propagate_tensor_meta_non_cached = meta


def run_cases(
    config: dict[str, Any],
    cases: list[tuple[FakeCase, TrainingRequest]],
    tp_cases: tuple[tuple[FakeCase, Architecture], ...] = (),
) -> FakeReport:
    """Every case run and compared with its request's timeline; every dp × tp case with the model states
    of :mod:`zerocalc.validate.tp`."""
    import transformers

    results = []
    for case, request in cases:
        recompute = case.recompute is Recompute.FULL
        fp8 = None if case.fp8 is Fp8RecipeName.NONE else (case.fp8.value, case.fp8_all_gather)
        measured, seconds = run(
            config,
            case.world,
            case.micro_batch,
            case.seq_len,
            case.reshard,
            recompute,
            fp8,
            case.lora_rank,
            case.keep_output,
        )
        results.append(compare(request, case, measured, seconds, config))
    tp_results = []
    for case, arch in tp_cases:
        phases, states, seconds = run_tp(config, case)
        tp_results.append(compare_tp(arch, case, phases, states, seconds))
    return FakeReport(
        torch=torch.__version__,
        transformers=transformers.__version__,
        cases=tuple(results),
        tp_cases=tuple(tp_results),
    )


def run(
    config: dict[str, Any],
    world: int,
    b: int,
    s: int,
    reshard: bool,
    recompute: bool,
    fp8: tuple[str, bool] | None = None,
    lora: int = 0,
    keep_output: OutputKept = OutputKept.NONE,
) -> tuple[AllocatedPhases, float]:
    """One case: its third step's allocated figures (bytes on the largest rank, rank 0) and the seconds
    it took; ``fp8``: torchao's recipe and FP8 all-gather (:func:`~zerocalc.validate.recipe.
    convert_to_fp8`); ``lora``: PEFT's LoRA rank (:func:`~zerocalc.validate.recipe.fsdp2_model`);
    ``keep_output``: how long the loop holds the model's output (``--keep-output``)."""
    phases, _, seconds = _run(config, world, b, s, reshard, recompute, None, fp8, lora, keep_output)
    return phases, seconds


def run_tp(config: dict[str, Any], case: FakeCase) -> tuple[AllocatedPhases, TrackedStates, float]:
    """A dp × tp case: its third step's allocated figures and model states on rank 0, and the seconds."""
    plan = case.tp_plan
    assert plan is not None
    recompute = case.recompute is Recompute.FULL
    return _run(config, case.world, case.micro_batch, case.seq_len, case.reshard, recompute, plan)


def _run(
    config: dict[str, Any],
    world: int,
    b: int,
    s: int,
    reshard: bool,
    recompute: bool,
    plan: TpPlan | None,
    fp8: tuple[str, bool] | None = None,
    lora: int = 0,
    keep_output: OutputKept = OutputKept.NONE,
) -> tuple[AllocatedPhases, TrackedStates, float]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    started = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        # the meshes are built on real tensors (under fake tensors a mesh's rank check reads a fake value,
        # and joining the dp and tp meshes raises DynamicOutputShapeException on aten.nonzero)
        if plan is None:
            mesh, tp = init_device_mesh("cpu", (world,)), None
        else:
            mesh_2d = init_device_mesh("cpu", (plan.dp, plan.tp), mesh_dim_names=("dp", "tp"))
            mesh, tp = mesh_2d["dp"], (mesh_2d["tp"], plan)
        with _neutralised():
            phases, states = _steps(config, mesh, b, s, reshard, recompute, tp, fp8, lora, keep_output)
    finally:
        gc.collect()
        dist.destroy_process_group()
    return phases, states, time.perf_counter() - started


def _steps(
    config: dict[str, Any],
    mesh: Any,
    b: int,
    s: int,
    reshard: bool,
    recompute: bool,
    tp: Any = None,
    fp8: tuple[str, bool] | None = None,
    lora: int = 0,
    keep_output: OutputKept = OutputKept.NONE,
) -> tuple[AllocatedPhases, TrackedStates]:
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
    from torch.distributed._tools.mem_tracker import _UpdateType

    from zerocalc.validate.recipe import fsdp2_model

    transformers.logging.set_verbosity_error()
    cpu = torch.device("cpu")
    with FakeTensorMode():
        cfg, model, opt = fsdp2_model(config, reshard, recompute, mesh=mesh, tp=tp, fp8=fp8, lora=lora)
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

        def category(kind: Any) -> int:
            return tracker.get_tracker_snapshot("current").get(cpu, {}).get(kind, 0)

        loss_context = contextlib.nullcontext
        if tp is not None and tp[1].loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            loss_context = loss_parallel
        figures: dict[str, int] = {}
        states: dict[str, int] = {}
        # the training loop's `loss` lives into the next step until the next forward returns (the
        # timeline's "previous step's loss"); its `output` (--keep-output) as the loop holds it: dropped at
        # once (none), set to None after the step (step), rebound by the next forward (next)
        output = None
        with tracker:
            for _ in range(STEPS):
                tracker.reset_mod_stats()
                figures["start_allocated"] = allocated()
                states["params"] = category(_FSDPRefType.SHARDED_PARAM)
                states["optimizer"] = category(_FSDPRefType.OPT)
                reset_peak()
                with loss_context():
                    if keep_output is OutputKept.NONE:
                        loss = model(input_ids=ids, labels=ids).loss
                    else:
                        output = model(input_ids=ids, labels=ids)
                        loss = output.loss
                    figures["forward_peak"], figures["after_forward"] = peak(), allocated()
                    reset_peak()
                    loss.backward()
                figures["backward_peak"], figures["after_backward"] = peak(), allocated()
                states["grads"] = category(_FSDPRefType.SHARDED_GRAD)
                reset_peak()
                opt.step()
                opt.zero_grad()
                untrack_step_counters()
                figures["optimizer_peak"] = peak()
                if keep_output is OutputKept.STEP:
                    output = None

    return AllocatedPhases(**figures), TrackedStates(**states)
