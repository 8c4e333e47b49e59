"""The shape of a data-parallel run: N ranks (one per GPU), g GPUs per node, and its groups of ranks."""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.units import ceil_div

DEFAULT_GPUS_PER_NODE = 8
"""An HGX/DGX node: 8 GPUs joined by NVLink/NVSwitch."""


class RankGroup(StrEnum):
    """Which ranks something spans: a state's shard group or a collective's process group.

    A state sharded over no group (``None`` where a ``RankGroup | None`` is expected) is replicated.
    """

    WORLD = "world"
    """All N data-parallel ranks."""
    NODE = "node"
    """The g ranks of one node (HYBRID_SHARD's shard group; replicated across nodes)."""
    ACROSS_NODES = "across_nodes"
    """The N/g ranks of equal local rank, one per node (HYBRID_SHARD's replica group)."""


class Cluster(BaseModel):
    model_config = ConfigDict(frozen=True)

    world_size: int = Field(ge=1, description="N: data-parallel ranks, one per GPU")
    gpus_per_node: int = Field(ge=1, description="g: GPUs per node")

    @classmethod
    def of(cls, world_size: int, gpus_per_node: int) -> Cluster:
        """N GPUs on nodes of g; a run smaller than a node uses N GPUs of it: that is its GPUs per node."""
        return _cluster(world_size, min(gpus_per_node, world_size))

    @property
    def ranks_per_node(self) -> int:
        """GPUs of the run on one node (g, or N when the run is smaller than a node)."""
        return min(self.gpus_per_node, self.world_size)

    @property
    def nodes(self) -> int:
        return ceil_div(self.world_size, self.ranks_per_node)

    def group_size(self, group: RankGroup | None) -> int:
        """Ranks in one group of this kind; 1 for ``None`` (replicated: nothing is split)."""
        if group is RankGroup.WORLD:
            return self.world_size
        if group is RankGroup.NODE:
            return self.ranks_per_node
        if group is RankGroup.ACROSS_NODES:
            return self.nodes
        return 1

    def spans_nodes(self, group: RankGroup) -> bool:
        """Whether a group of this kind has ranks on more than one node (so it runs over the network)."""
        return group is not RankGroup.NODE and self.nodes > 1

    def whole_nodes_problem(self) -> str | None:
        """Why HYBRID_SHARD (shard inside a node, replicate across nodes) cannot run here, or None."""
        if self.world_size % self.ranks_per_node:
            return (
                f"{{gpus}} {self.world_size} is not a multiple of {{gpus_per_node}} {self.gpus_per_node}; "
                "hybrid_shard shards within whole nodes; "
                f"accepted: {{gpus}} a multiple of {self.ranks_per_node}"
            )
        return None


@lru_cache(maxsize=1024)
def _cluster(world_size: int, gpus_per_node: int) -> Cluster:
    """One (frozen) cluster per shape: a plan's search asks for each of its worlds hundreds of times."""
    return Cluster(world_size=world_size, gpus_per_node=gpus_per_node)
