"""The vocabulary of a collective schedule: one line per collective a strategy issues in a step."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from zerocalc.cluster import RankGroup
from zerocalc.collectives import Collective


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    AFTER_STEP = "after_step"


class Tensor(StrEnum):
    GRADIENTS = "gradients"
    PARAMETERS = "parameters"


class Repeat(StrEnum):
    PER_STEP = "per_step"
    PER_MICRO_BATCH = "per_micro_batch"


class ScheduledCollective(BaseModel):
    """One line of a strategy's schedule."""

    model_config = ConfigDict(frozen=True)

    op: Collective
    phase: Phase
    tensor: Tensor
    group: RankGroup
    repeat: Repeat
    shard_of: RankGroup | None = None
    """The message is one rank's shard of a tensor partitioned over this group (HYBRID_SHARD)."""
    behaviour: str
    """Which framework behaviour the line follows, with its source."""
