"""The family traits of an architecture: how its family's transformers code computes what the architecture
describes. Each family's traits are in its record (:data:`zerocalc.model.hf_config.FAMILIES`, beside what
its config.json reads: :class:`zerocalc.model.hf_config.Traits`); :func:`traits` finds the record and
resolves what the architecture itself decides."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from zerocalc.model.architecture import Architecture, MlpKind, NormKind

if TYPE_CHECKING:
    from zerocalc.model.hf_config import Traits


def traits(arch: Architecture) -> Traits:
    """The traits of ``arch.family``'s record (the transformers model_type; an architecture without one:
    GPT-2's for a LayerNorm and GELU block, else Llama's), with the architecture's norm (LayerNorm:
    ``layernorm``), its positions (rotary unless learned) and its rotary tables (one per attention type once
    it has ``sliding_pattern`` layers)."""
    family = arch.family or (
        "gpt2" if arch.norm is NormKind.LAYERNORM and arch.mlp is MlpKind.GELU else "llama"
    )
    layernorm = arch.norm is NormKind.LAYERNORM
    return _resolved(family, layernorm, arch.learned_position_embeddings, arch.num_layers)


@lru_cache(maxsize=256)
def _resolved(family: str, layernorm: bool, learned_positions: bool, layers: int) -> Traits:
    from zerocalc.model.hf_config import FAMILIES, Traits  # the records load with a model, not at start-up

    record = FAMILIES.get(family)
    own = record.traits if record is not None else Traits()
    return own._replace(
        norm="layernorm" if layernorm else own.norm,
        rotary=not learned_positions,
        rotary_tables=own.rotary_tables if layers >= own.sliding_pattern else 1,
    )
