"""The request as a result's JSON echoes it: one pydantic model per estimate, each field a value of the
request (pure).

An echo's fields are its one definition: each field is the request's value of the same name (a field or a
derived property, ``request.cluster``), or, where the echo names it otherwise, the path its class's
``SOURCES`` gives (``"micro_batch": "activations.micro_batch"``). :meth:`RequestEcho.of` reads them.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class RequestEcho(BaseModel):
    """A frozen echo of a request: each field read from the request (:attr:`SOURCES` where named
    otherwise)."""

    model_config = ConfigDict(frozen=True)

    SOURCES: ClassVar[dict[str, str]] = {}
    """Field → the request's path (dotted) it is read from, where not the field's own name."""

    @classmethod
    def of(cls, request: Any) -> RequestEcho:
        """The echo of ``request``."""
        return cls(**{name: attrgetter(cls.SOURCES.get(name, name))(request) for name in cls.model_fields})
