"""`zerocalc bench`'s pure parts: sweep sizes, the α/β fit, topology, and CLI input errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zerocalc.bench.fit import fit_alpha_beta
from zerocalc.bench.launch import describe_exit
from zerocalc.bench.sweep import buffer_bytes, sweep_memory, sweep_points
from zerocalc.bench.topology import launched_by, node_groups, placement_from_env, rendezvous_env
from zerocalc.cli import app
from zerocalc.collectives import Collective
from zerocalc.errors import InputError

KiB = 1024


def test_sweep_doubles_from_min_to_max() -> None:
    points = sweep_points(Collective.ALL_REDUCE, 2, 2, 1 * KiB, 8 * KiB, 2)
    assert [p.size_bytes for p in points] == [1024, 2048, 4096, 8192]
    assert [p.count for p in points] == [512, 1024, 2048, 4096]


@pytest.mark.parametrize(
    "collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER, Collective.ALL_TO_ALL]
)
def test_split_collectives_round_the_count_to_the_group_size(collective: Collective) -> None:
    points = sweep_points(collective, 3, 4, 1000, 64 * KiB, 4)
    assert all(p.count % 3 == 0 and p.size_bytes == 4 * p.count for p in points)
    assert points[0].count == 249  # 1000 B / 4 B = 250 elements, rounded down to a multiple of 3
    assert sweep_points(collective, 8, 2, 1, 4, 2)[0].count == 8  # at least one element per rank


def test_sweep_refuses_bad_bounds() -> None:
    with pytest.raises(InputError, match="--max-bytes"):
        sweep_points(Collective.ALL_REDUCE, 2, 2, 4 * KiB, 1 * KiB, 2)
    with pytest.raises(InputError, match="--step-factor"):
        sweep_points(Collective.ALL_REDUCE, 2, 2, 1 * KiB, 4 * KiB, 1)


def test_buffer_bytes_follow_the_shapes() -> None:
    s, n = 8 * KiB, 4
    assert buffer_bytes(Collective.ALL_REDUCE, s, n) == 2 * s  # in place + expected result
    assert buffer_bytes(Collective.REDUCE_SCATTER, s, n) == s + 2 * s // n
    assert buffer_bytes(Collective.ALL_GATHER, s, n) == s // n + 2 * s
    assert buffer_bytes(Collective.ALL_TO_ALL, s, n) == 3 * s
    assert sweep_memory([Collective.ALL_REDUCE, Collective.ALL_GATHER], n, 2, s) == s // n + 2 * s


def test_fit_recovers_alpha_and_beta_from_exact_data() -> None:
    alpha, beta = 25e-6, 120e9
    xs = [2.0**k for k in range(10, 31)]
    fit = fit_alpha_beta(xs, [alpha + x / beta for x in xs])
    assert fit.latency_s == pytest.approx(alpha, rel=1e-6)
    assert fit.bus_bandwidth_Bps == pytest.approx(beta, rel=1e-9)


def test_fit_clamps_a_negative_latency_and_falls_back_on_a_flat_sweep() -> None:
    xs = [1e3, 1e6, 2e6]
    assert fit_alpha_beta(xs, [1e-9, 1e-3, 2e-3 + 1e-5]).latency_s == 0.0
    flat = fit_alpha_beta(xs, [3e-3, 2e-3, 1e-3])  # times fall with size: noise, no positive slope
    assert flat.bus_bandwidth_Bps == pytest.approx(2e6 / 1e-3)  # the best x/t
    assert flat.latency_s >= 0
    with pytest.raises(ValueError):
        fit_alpha_beta([1.0], [0.0])


def test_node_groups_two_nodes_of_two() -> None:
    groups = node_groups([("0", 0), ("0", 1), ("1", 0), ("1", 1)])
    assert (groups.nodes, groups.ranks_per_node) == (2, 2)
    assert groups.intra_node == [[0, 1], [2, 3]]
    assert groups.inter_node == [[0, 2], [1, 3]]
    interleaved = node_groups([("a", 0), ("b", 0), ("a", 1), ("b", 1)])
    assert interleaved.intra_node == [[0, 2], [1, 3]] and interleaved.inter_node == [[0, 1], [2, 3]]
    uneven = node_groups([("a", 0), ("a", 1), ("b", 0)])
    assert uneven.nodes == 2 and uneven.intra_node == [] and uneven.inter_node == []


def test_placement_from_torchrun_and_slurm_env() -> None:
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    p = placement_from_env(torchrun)
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.node, p.launcher) == (
        5,
        8,
        1,
        4,
        "1",
        "torchrun",
    )
    slurm = {
        "SLURM_PROCID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "16",
        "SLURM_NNODES": "2",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS_PER_NODE": "8",
    }
    s = placement_from_env(slurm)
    assert (s.rank, s.world_size, s.local_rank, s.local_world_size, s.node, s.launcher) == (
        9,
        16,
        1,
        8,
        "1",
        "srun",
    )
    with pytest.raises(InputError, match="MASTER_ADDR"):
        rendezvous_env(slurm)
    assert rendezvous_env({**slurm, "MASTER_ADDR": "n1"})["RANK"] == "9"
    assert launched_by({}) is None
    assert launched_by({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}) is None


def test_describe_exit() -> None:
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dtype", "int8"], "--dtype 'int8' is not accepted; accepted: bf16, fp16, fp32"),
        (["--collectives", "allreduce,gossip"], "collective 'gossip' is not known"),
        (["--step-factor", "1"], "--step-factor 1"),
        (["--iters", "0"], "--iters 0"),
        (["--min-bytes", "1XB"], "--min-bytes '1XB' has an unknown unit"),
        (["--min-bytes", "8KiB", "--max-bytes", "1KiB"], "--max-bytes 1024 is smaller than --min-bytes 8192"),
        (["--backend", "mpi"], "--backend 'mpi' is not accepted; accepted: nccl, gloo"),
        (["--backend", "nccl"], "--backend nccl needs a CUDA GPU"),
        (["--nproc", "1"], "--nproc 1 is not accepted; accepted: 2 or more processes"),
    ],
)
def test_bad_input_is_one_line(args: list[str], fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    result = runner.invoke(app, ["bench", *args])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr


def test_default_collectives_are_the_three_zero_uses() -> None:
    from zerocalc.bench.defaults import DEFAULT_COLLECTIVES_TEXT
    from zerocalc.bench.sweep import DEFAULT_COLLECTIVES

    assert ",".join(c.value for c in DEFAULT_COLLECTIVES) == DEFAULT_COLLECTIVES_TEXT
