"""The shape of a data-parallel run: N ranks (one per GPU), g GPUs per node."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.errors import InputError
from zerocalc.units import ceil_div

DEFAULT_GPUS_PER_NODE = 8
"""An HGX/DGX node: 8 GPUs joined by NVLink/NVSwitch."""


class Cluster(BaseModel):
    model_config = ConfigDict(frozen=True)

    world_size: int = Field(ge=1, description="N: data-parallel ranks, one per GPU")
    gpus_per_node: int = Field(ge=1, description="g: GPUs per node")

    @property
    def ranks_per_node(self) -> int:
        """GPUs of the run on one node (g, or N when the run is smaller than a node)."""
        return min(self.gpus_per_node, self.world_size)

    @property
    def nodes(self) -> int:
        return ceil_div(self.world_size, self.ranks_per_node)

    def whole_nodes_problem(self) -> str | None:
        """Why HYBRID_SHARD (shard inside a node, replicate across nodes) cannot run here, or None."""
        if self.world_size % self.ranks_per_node:
            return (
                f"--gpus {self.world_size} is not a multiple of --gpus-per-node {self.gpus_per_node}; "
                "hybrid_shard shards within whole nodes; "
                f"accepted: --gpus a multiple of {self.ranks_per_node}"
            )
        return None


def parse_gpu_count(value: int | str, what: str) -> int:
    """A whole number of GPUs, 1 or more (``--gpus``, ``--gpus-per-node``)."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise InputError(f"{what} {value!r} is not accepted; accepted: a whole number of GPUs, 1 or more")
    return int(text)


def make_cluster(gpus: int | str, gpus_per_node: int | str | None = None) -> Cluster:
    """Validate ``--gpus`` and ``--gpus-per-node`` (default: 8, or N when N is smaller)."""
    world = parse_gpu_count(gpus, "--gpus")
    per_node = (
        min(DEFAULT_GPUS_PER_NODE, world)
        if gpus_per_node is None
        else parse_gpu_count(gpus_per_node, "--gpus-per-node")
    )
    return Cluster(world_size=world, gpus_per_node=per_node)
