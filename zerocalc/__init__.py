"""zerocalc: memory and communication calculator for data-parallel training.

The core is pure: functions from specs to pydantic results, no torch, no I/O.
"""

from zerocalc.errors import InputError
from zerocalc.memory import MemoryEstimate, estimate_memory

__all__ = ["InputError", "MemoryEstimate", "estimate_memory"]
__version__ = "0.1.0"
