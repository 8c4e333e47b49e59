"""What every launch-configuration reader shares: the formats, :class:`LaunchConfig` (what a file sets,
as option values), and the one-line refusals (pure).

The readers are one module per format (:mod:`zerocalc.request.launch_deepspeed`,
:mod:`zerocalc.request.launch_torchtitan`, :mod:`zerocalc.request.launch_accelerate`);
:mod:`zerocalc.request.launch` reads a user's files with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError

if TYPE_CHECKING:
    from zerocalc.request.launch_titan_stages import TitanStages

HARMLESS_NOTE = "harmless (no bearing on memory, communication or step time)"
"""How a note lists a file's harmless keys."""


class LaunchFormat(StrEnum):
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    ACCELERATE = "accelerate"


@dataclass(frozen=True)
class LaunchConfig:
    """What a launch configuration says, as option values (keyword → value as the library takes it)."""

    values: dict[str, Any]
    notes: tuple[str, ...] = ()
    harmless: tuple[str, ...] = field(default=())
    """Keys of the file with no bearing on memory, communication or step time (dotted paths,
    :mod:`zerocalc.request.launch_keys`)."""
    stages: TitanStages | None = None
    """How the file splits the model's layers over pipeline stages, which gives ``vpp`` and the first and
    last stage's layers once the model's layer count is known (:meth:`TitanStages.options`)."""
    fp8_skip_of_model: bool = False
    """The FP8 modules left in high precision follow the model (accelerate's torchao path: its first and last
    ``nn.Linear``, :func:`~zerocalc.parallel.fp8.accelerate_ao_skip`): ``fp8_skip`` is set once the model's
    architecture is known."""

    def note_lines(self, source: str) -> list[str]:
        lines = [f"{source}: {note}" for note in self.notes]
        if self.harmless:
            lines.append(f"{source}: {HARMLESS_NOTE}: {', '.join(self.harmless)}")
        return lines


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def refused(where: str, key: str, value: Any, accepted: str) -> InputError:
    """A setting the framework runs and zerocalc does not model."""
    return InputError(f"{where}: {key} {value!r} is not modelled; accepted: {accepted}")


def invalid(where: str, key: str, value: Any, accepted: str) -> InputError:
    """A value that is not one the key takes (a word for a count)."""
    return InputError(f"{where}: {key} {value!r} is not accepted; accepted: {accepted}")


def listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" or {items[-1]}"


def whole(value: Any, key: str, where: str, least: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise invalid(where, key, value, f"a whole number, {least} or more")
    return value
