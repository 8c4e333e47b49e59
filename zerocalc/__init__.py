"""zerocalc: memory and communication calculator for data-parallel training.

The core is pure: functions from specs to pydantic results, no torch, no I/O. The public names below are
loaded on first use (PEP 562), so that ``import zerocalc`` and the CLI start-up stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["CommEstimate", "InputError", "MemoryEstimate", "estimate_comm", "estimate_memory"]
__version__ = "0.1.0"

_LAZY = {
    "InputError": "zerocalc.errors",
    "MemoryEstimate": "zerocalc.memory",
    "estimate_memory": "zerocalc.memory",
    "CommEstimate": "zerocalc.comm",
    "estimate_comm": "zerocalc.comm",
}

if TYPE_CHECKING:
    from zerocalc.comm import CommEstimate, estimate_comm
    from zerocalc.errors import InputError
    from zerocalc.memory import MemoryEstimate, estimate_memory


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zerocalc' has no attribute {name!r}")
