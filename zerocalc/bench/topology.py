"""Where this process sits in a launched world, read from torchrun's or Slurm's environment (pure).

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node's rank), MASTER_ADDR and
MASTER_PORT. srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES (and
SLURM_NTASKS_PER_NODE with ``--ntasks-per-node``); MASTER_ADDR must then be exported by the job script.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from zerocalc.base.errors import InputError

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    """Identifies this process's node: torchrun's GROUP_RANK, Slurm's SLURM_NODEID, or the host name."""
    launcher: str
    """torchrun (or any launcher setting RANK/WORLD_SIZE), srun, or zerocalc."""


def launched_by(env: Mapping[str, str] | None = None) -> str | None:
    """``torchrun`` when RANK/WORLD_SIZE are set, ``srun`` for a Slurm step of 2+ tasks, else None."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and _int(env.get("SLURM_NTASKS", "1"), 1) > 1:
        return "srun"
    return None


def placement_from_env(env: Mapping[str, str] | None = None) -> Placement:
    """Read the placement of a launched process; raises InputError naming what is missing."""
    env = os.environ if env is None else env
    launcher = launched_by(env)
    if launcher == "srun":
        rank = _int(env["SLURM_PROCID"], 0)
        world = _int(env.get("SLURM_NTASKS", "1"), 1)
        nnodes = _int(env.get("SLURM_NNODES", "1"), 1)
        per_node = _int(env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0], world // max(nnodes, 1))
        return Placement(
            rank=rank,
            world_size=world,
            local_rank=_int(env.get("SLURM_LOCALID", "0"), 0),
            local_world_size=per_node,
            node=env.get("SLURM_NODEID") or socket.gethostname(),
            launcher="srun",
        )
    world = _int(env.get("WORLD_SIZE", "1"), 1)
    local_world = _int(env.get("LOCAL_WORLD_SIZE", str(world)), world)
    return Placement(
        rank=_int(env.get("RANK", "0"), 0),
        world_size=world,
        local_rank=_int(env.get("LOCAL_RANK", "0"), 0),
        local_world_size=local_world,
        node=env.get("GROUP_RANK") or socket.gethostname(),
        launcher=launcher or "zerocalc",
    )


def rendezvous_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """RANK/WORLD_SIZE/MASTER_* for ``init_process_group(init_method="env://")``, filled in under srun."""
    env = os.environ if env is None else env
    placement = placement_from_env(env)
    out = {
        "RANK": str(placement.rank),
        "WORLD_SIZE": str(placement.world_size),
        "LOCAL_RANK": str(placement.local_rank),
        "MASTER_PORT": env.get("MASTER_PORT", str(DEFAULT_MASTER_PORT)),
    }
    if "MASTER_ADDR" not in env:
        raise InputError(
            "MASTER_ADDR is not set; accepted: export MASTER_ADDR=<first node's host name> "
            "(e.g. $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)) before srun"
        )
    out["MASTER_ADDR"] = env["MASTER_ADDR"]
    return out


@dataclass(frozen=True)
class Groups:
    """The process groups of a multi-node measurement, as lists of global ranks, in creation order."""

    nodes: int
    ranks_per_node: int
    intra_node: list[list[int]]
    """The ranks of each node, one group per node."""
    inter_node: list[list[int]]
    """For each local rank i, the i-th rank of every node."""


def node_groups(placements: list[tuple[str, int]]) -> Groups:
    """Group ranks by node from each rank's (node, local_rank), indexed by global rank.

    Nodes are ordered by their lowest global rank; within a node ranks are ordered by local rank. The
    intra- and inter-node groups are only meaningful when every node runs the same number of ranks;
    otherwise both lists are empty (only the world is measured).
    """
    by_node: dict[str, list[tuple[int, int]]] = {}
    for rank, (node, local_rank) in enumerate(placements):
        by_node.setdefault(node, []).append((local_rank, rank))
    nodes = [sorted(members) for members in sorted(by_node.values(), key=lambda m: min(r for _, r in m))]
    sizes = {len(members) for members in nodes}
    if len(sizes) != 1:
        return Groups(len(nodes), 0, [], [])
    per_node = sizes.pop()
    intra = [[rank for _, rank in members] for members in nodes]
    inter = [[intra[node][i] for node in range(len(nodes))] for i in range(per_node)]
    return Groups(len(nodes), per_node, intra, inter)


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default
