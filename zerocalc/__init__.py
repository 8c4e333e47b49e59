"""zerocalc: memory and communication calculator for data-parallel training.

The core is pure: functions from typed requests to pydantic results, no torch, no I/O. The public names
below are loaded on first use (PEP 562), so that ``import zerocalc`` and the CLI start-up stay cheap.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from zerocalc.base.display import use_renderers

__all__ = [
    "CommEstimate",
    "InputError",
    "MemoryEstimate",
    "MemoryReport",
    "PlanResult",
    "TrainingRequest",
    "estimate_comm",
    "estimate_memory",
    "estimate_peak",
    "plan",
]
__version__ = "0.1.0"

_LAZY = {
    "InputError": "zerocalc.base.errors",
    "MemoryEstimate": "zerocalc.states.memory",
    "MemoryReport": "zerocalc.peak.report",
    "CommEstimate": "zerocalc.comm.estimate",
    "TrainingRequest": "zerocalc.request.training",
    "estimate_memory": "zerocalc.api",
    "estimate_peak": "zerocalc.api",
    "estimate_comm": "zerocalc.api",
    "plan": "zerocalc.api",
    "PlanResult": "zerocalc.plan.search",
}

if TYPE_CHECKING:
    from zerocalc.api import estimate_comm, estimate_memory, estimate_peak, plan
    from zerocalc.base.errors import InputError
    from zerocalc.comm.estimate import CommEstimate
    from zerocalc.peak.report import MemoryReport
    from zerocalc.plan.search import PlanResult
    from zerocalc.request.training import TrainingRequest
    from zerocalc.states.memory import MemoryEstimate


def _renderers() -> ModuleType:
    from zerocalc.render import display

    return display


use_renderers(_renderers)  # the results display as the CLI's tables


def __dir__() -> list[str]:
    """The public names too (they are loaded on first use, so not yet in the module's namespace)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zerocalc' has no attribute {name!r}")
