"""The raw options of a command (:data:`~zerocalc.request.options.OPTIONS`) as a frozen pydantic model: what
the user typed, nothing checked yet but the types a library caller passes."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from zerocalc.base.errors import InputError
from zerocalc.model.architecture import (
    Architecture,
)
from zerocalc.network.calibration import Calibration
from zerocalc.parallel.frameworks import Estimate
from zerocalc.request.options import Command, options_for


# ---------------------------------------------------------------------------------------- raw options
def options_model(name: str, commands: tuple[Command, ...], **fields: Any) -> type[BaseModel]:
    """A frozen pydantic model of the raw request options of ``commands``, one field per
    :class:`~zerocalc.request.options.Option` (its default the option's), plus ``fields``; nothing is
    checked yet but the types a library caller passes."""
    namespace = {"Architecture": Architecture, "Calibration": Calibration, "Any": Any}
    types: dict[str, Any] = {}  # each type expression evaluated once (options share a handful)
    for command in commands:
        for o in options_for(command, request_only=True):
            if o.name not in fields:
                if o.value_type not in types:
                    types[o.value_type] = eval(o.value_type, namespace)
                fields[o.name] = (types[o.value_type], o.default)
    config = ConfigDict(frozen=True, extra="forbid")
    return create_model(name, __config__=config, __module__=__name__, **fields)


TrainingOptions = options_model(
    "TrainingOptions",
    (Command.MEMORY, Command.COMM),
    estimate=(Estimate, Estimate.MEMORY),
    calibration_name=(str | None, None),
)
"""What the user asked for, as typed: strings with units, names, numbers (the options of ``memory`` and
``comm``, :data:`~zerocalc.request.options.OPTIONS`). ``estimate``: the command the options were given to
(set by the caller, not typed); ``calibration_name``: how a calibration object given as such is named."""


OptionsT = TypeVar("OptionsT", bound=BaseModel)


def options_from_keywords(options: type[OptionsT], values: dict[str, object]) -> OptionsT:
    """``options(**values)``, a value of the wrong type an :class:`InputError` naming its concept."""
    try:
        return options(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "_".join(str(p) for p in first["loc"][:1]) or "options"
        raise InputError(f"{{{where}}} is not accepted ({first['msg']})") from None
