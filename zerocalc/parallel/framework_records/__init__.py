"""Every framework's record (:class:`~zerocalc.parallel.framework_records.record.FrameworkRecord`), one
module each, and the lookups every model and check uses.

Adding a framework: a module here with its record, and its entry in :data:`FRAMEWORKS`.
"""

from __future__ import annotations

from functools import cache, lru_cache

from zerocalc.network.schedule import GradSync
from zerocalc.parallel.framework_records.deepspeed import DEEPSPEED
from zerocalc.parallel.framework_records.megatron import MEGATRON
from zerocalc.parallel.framework_records.paper import PAPER
from zerocalc.parallel.framework_records.pytorch import DDP, FSDP, FSDP2, TORCH_ZERO1
from zerocalc.parallel.framework_records.record import FrameworkRecord
from zerocalc.parallel.frameworks import Framework, TorchSetup, TorchWrapper
from zerocalc.parallel.mesh import Mesh
from zerocalc.parallel.strategies import StrategyName

FRAMEWORKS: dict[Framework, FrameworkRecord] = {
    record.framework: record for record in (PAPER, DEEPSPEED, MEGATRON, FSDP, FSDP2, TORCH_ZERO1, DDP)
}
"""Every framework's record, in :class:`~zerocalc.parallel.frameworks.Framework` order."""


@cache
def framework_strategies(framework: Framework) -> tuple[StrategyName, ...]:
    """The strategies a framework implements, in :class:`StrategyName` order (once per framework: a plan's
    search asks hundreds of times)."""
    setups = FRAMEWORKS[framework].strategies
    return tuple(name for name in StrategyName if name in setups)


def default_strategies(framework: Framework) -> tuple[StrategyName, ...]:
    """What ``all`` stands for under a framework."""
    setups = FRAMEWORKS[framework].strategies
    return tuple(name for name in framework_strategies(framework) if setups[name].in_default_set)


def effective_grad_sync(
    framework: Framework, strategy: StrategyName, asked: GradSync | None, pipelined: bool = False
) -> GradSync:
    """When ``strategy`` reduces gradients under ``framework``: fixed by the framework where it is
    (DeepSpeed's stages, the paper's accounting; a pipeline schedule, ``pipeline_grad_sync``), else what the
    training loop was said to do (``asked``), else PyTorch's default, every micro-batch."""
    record = FRAMEWORKS[framework]
    fixed = record.strategies[strategy].grad_sync
    if fixed is None and pipelined:
        fixed = record.pipeline_grad_sync
    return fixed or asked or GradSync.EVERY


def validated_setups() -> dict[str, tuple[Framework, StrategyName, TorchSetup]]:
    """``zerocalc validate``'s configurations by name, by wrapper then strategy."""
    found = [
        (setup.torch.validate_name, (record.framework, name, setup.torch))
        for record in FRAMEWORKS.values()
        for name, setup in record.strategies.items()
        if setup.torch is not None and setup.torch.validate_name
    ]
    wrappers, names = list(TorchWrapper), list(StrategyName)
    found.sort(key=lambda item: (wrappers.index(item[1][2].wrapper), names.index(item[1][1])))
    return {validate_name: value for validate_name, value in found if validate_name}


def frameworks_with(field: str) -> tuple[Framework, ...]:
    """The frameworks whose record's ``field`` is set (for the messages that name them)."""
    return tuple(f for f, record in FRAMEWORKS.items() if getattr(record, field))


@lru_cache(maxsize=1024)
def data_parallel_mesh(world: int, gpus_per_node: int, framework: Framework) -> Mesh:
    """The mesh of a data-parallel run of ``world`` GPUs (tp = cp = 1), as the parser builds it: one per
    shape and framework, since a plan's search asks for each hundreds of times."""
    record = FRAMEWORKS[framework]
    return Mesh(
        world=world,
        gpus_per_node=min(gpus_per_node, world),
        cp_impl=record.default_cp_impl,
        tp_style=record.layers_tp_style,
    )
