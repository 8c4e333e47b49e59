"""`zerocalc bench`'s pure parts: sweep sizes and memory, the α/β fit, topology, calibration files, and
the CLI (every refusal, the output) through Typer's CliRunner with the ranks faked: no process starts."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.errors import InputError
from zerocalc.bench import sweep
from zerocalc.bench.fit import fit_alpha_beta
from zerocalc.bench.sweep import buffer_bytes, memory_problem, sweep_points
from zerocalc.bench.topology import launched_by, node_groups, placement_from_env, rendezvous_env
from zerocalc.cli import app
from zerocalc.cli import bench as cli_bench
from zerocalc.harness import procs
from zerocalc.network.calibration import (
    Calibration,
    CollectiveFit,
    Measurement,
    RankGroup,
    load_calibration,
    save_calibration,
)
from zerocalc.network.collectives import Collective

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


def test_memory_problem_sizes_buffers_for_the_smallest_group() -> None:
    both, gib = [Collective.ALL_REDUCE, Collective.ALL_GATHER], 2**30
    # S = 1 GiB: all_reduce holds 2 S, all_gather at n = 2 holds S/2 + 2 S (with --check's copy), per rank
    need = 2 * (gib // 2 + 2 * gib)
    assert memory_problem(both, 2, KiB, gib, 2, 2, need, "this node (2 ranks)") is None
    assert memory_problem(both, 2, KiB, gib, 2, 2, None, "this node (2 ranks)") is None  # unknown: no check
    problem = memory_problem(both, 2, KiB, gib, 2, 2, need - gib // 4, "GPU 3")
    assert problem == (
        "--max-bytes 1073741824: the largest size S = 1,073,741,824 bytes needs 5.00 GiB of buffers on GPU 3 "
        "but only 4.75 GiB is free; accepted: a smaller --max-bytes"
    )
    assert memory_problem(both, 2, KiB, gib, 2, 1, need // 2, "GPU 3") is None  # one rank per GPU


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
    assert flat.latency_s >= 0 and flat.beta_from_peak
    assert not fit_alpha_beta(xs, [1e-5, 1e-3, 2e-3]).beta_from_peak
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


# ------------------------------------------------------------------------- the CLI, no process started
runner = CliRunner()
TIB = "1,099,511,627,776"


@pytest.fixture()
def no_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict]:
    """A CPU node of 2 cores, not under torchrun, where starting ranks fails the test (refusals must come
    first); a test that wants a run replaces ``procs.spawn``. Returns the spawn calls."""
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cli_bench, "_visible_gpus", lambda: 0)
    monkeypatch.setattr(procs, "usable_cpus", lambda: 2)
    calls: list[dict] = []

    def spawn(*args: object, **kwargs: object) -> None:
        calls.append({"args": args, **kwargs})
        raise AssertionError("a rank was started")

    monkeypatch.setattr(procs, "spawn", spawn)
    return calls


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dtype", "int8"], "--dtype 'int8' is not accepted; accepted: bf16, fp16, fp32"),
        (["--min-bytes", "1XB"], "--min-bytes '1XB' has an unknown unit"),
        (["--collectives", "allreduce,gossip"], "collective 'gossip' is not known"),
        (["--collectives", "send_recv"], "--collectives send_recv is not measured by bench"),
        (["--min-bytes", "8KiB", "--max-bytes", "1KiB"], "--max-bytes 1024 is smaller than --min-bytes 8192"),
        (["--backend", "mpi"], "--backend 'mpi' is not accepted; accepted: nccl, gloo"),
        (["--backend", "nccl"], "--backend nccl needs a CUDA GPU"),
        # sizes: at least 1 byte, at most 1 TiB
        (["--min-bytes", "0"], f"--min-bytes 0 is not accepted; accepted: 1 byte to 1TiB ({TIB} bytes)"),
        (["--max-bytes", "1e400"], "--max-bytes '1e400' is out of range"),
        (["--max-bytes", "2TiB"], "--max-bytes 2199023255552 is not accepted; accepted: 1 byte to 1TiB"),
        (["--min-bytes", "2TiB", "--max-bytes", "4TiB"], "--min-bytes 2199023255552 is not accepted"),
        # step factor: 2 to 1024
        (["--step-factor", "1"], "--step-factor 1 is not accepted; accepted: a whole number from 2 to 1024"),
        (["--step-factor", "1025"], "--step-factor 1025 is not accepted"),
        (["--step-factor", str(10**21)], f"--step-factor {10**21} is not accepted"),
        (["--step-factor", "1.5"], "--step-factor '1.5' is not accepted; accepted: a whole number"),
        # iterations: at most a million
        (["--iters", "0"], "--iters 0 is not accepted; accepted: 1 to 1,000,000 iterations"),
        (["--iters", str(10**21)], f"--iters {10**21} is not accepted; accepted: 1 to 1,000,000 iterations"),
        (["--warmup", "-1"], "--warmup -1 is not accepted; accepted: 0 to 1,000,000 iterations"),
        (["--warmup", str(10**21)], f"--warmup {10**21} is not accepted"),
        # timeout: (0, one day]
        (["--timeout", "1e400"], "--timeout inf is not accepted; accepted: seconds > 0 and at most 86400"),
        (["--timeout", "nan"], "--timeout nan is not accepted"),
        (["--timeout", "0"], "--timeout 0 is not accepted"),
        (["--timeout", "86401"], "--timeout 86401 is not accepted"),
        # processes: 2 to 4 per core (2 cores here), or one per GPU
        (["--nproc", "1"], "--nproc 1 is not accepted; accepted: 2 or more processes"),
        (
            ["--nproc", "1000000000"],
            "--nproc 1000000000 is more processes than this node can run (4 per CPU core, 2 usable); "
            "accepted: 2 to 8",
        ),
        # the output: checked before any rank starts
        (["--out", ""], "--out '' is empty; accepted: a file path such as cal.json"),
        (["--out", "/"], "--out '/' is a directory; accepted: a file path in a writable folder"),
        (["--out", "/proc/version/cal.json"], "--out '/proc/version/cal.json' cannot be created"),
    ],
)
def test_bad_input_is_one_line_before_any_rank_starts(
    args: list[str], fragment: str, no_ranks: list[dict]
) -> None:
    one_line_error(runner.invoke(app, ["bench", *args]), fragment)
    assert no_ranks == []


def test_an_unwritable_out_folder_is_refused(no_ranks: list[dict], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")
    result = runner.invoke(app, ["bench", "--out", str(tmp_path / "file" / "cal.json")])
    assert result.exit_code == 2
    assert f"cannot be created: {str(tmp_path / 'file')!r} is not a directory" in result.stderr


def test_a_sweep_larger_than_the_node_s_memory_is_refused_before_any_rank_starts(
    no_ranks: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "host_available_bytes", lambda: 2**30)
    result = runner.invoke(app, ["bench", "--nproc", "2", "--max-bytes", "1GiB"])
    assert result.exit_code == 2 and no_ranks == []
    assert result.stderr == (
        "zerocalc: error: --max-bytes 1073741824: the largest size S = 1,073,741,824 bytes needs 5.00 GiB of "
        "buffers on this node (2 ranks) but only 1.00 GiB is free; accepted: a smaller --max-bytes\n"
    )


@pytest.mark.usefixtures("torch_hidden")
def test_missing_torch_is_one_line(no_ranks: list[dict]) -> None:
    result = runner.invoke(app, ["bench", "--nproc", "2"])
    assert result.exit_code == 2
    assert result.stderr == (
        "zerocalc: error: zerocalc bench needs PyTorch; install it with: pip install 'zerocalc[bench]'\n"
    )


def _calibration(device: str = "Test CPU") -> Calibration:
    rows = [
        Measurement(
            collective=Collective.ALL_REDUCE, group_kind=RankGroup.WORLD, group_size=2, size_bytes=s,
            count=s // 2, dtype="bf16", time_s=1e-5 + s / 1e9, algbw_Bps=s / (1e-5 + s / 1e9),
            busbw_Bps=s / (1e-5 + s / 1e9), errors=0,
        )
        for s in (1024, 4096)
    ]  # fmt: skip
    fit = CollectiveFit(
        collective=Collective.ALL_REDUCE, group_kind=RankGroup.WORLD, group_size=2, latency_s=1e-5,
        bus_bandwidth_Bps=1e9, peak_busbw_Bps=rows[-1].busbw_Bps, points=2,
    )  # fmt: skip
    return Calibration(
        created_at="2026-11-23T12:00:00+00:00", backend="gloo", device_name=device, torch_version="2.13.0",
        world_size=2, nodes=1, gpus_per_node=2, dtype="bf16", measurements=rows, fits=[fit],
    )  # fmt: skip


def test_rank_0_s_calibration_is_written_0644_to_the_default_path_and_rendered(
    no_ranks: list[dict], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def spawn(module: str, payload: str, nproc: int, timeout_s: float, collect):
        no_ranks.append({"module": module, "payload": json.loads(payload), "nproc": nproc})
        return collect(_calibration().model_dump_json())

    monkeypatch.setattr(procs, "spawn", spawn)
    previous = os.umask(0o022)
    try:
        result = runner.invoke(app, ["bench", "--nproc", "2", "--check", "--iters", "3"])
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.output
    (call,) = no_ranks
    assert (call["module"], call["nproc"], call["payload"]["iters"]) == ("zerocalc.bench.worker", 2, 3)
    assert call["payload"]["max_bytes"] == 64 * 2**20 and call["payload"]["backend"] == "gloo"
    written = list((tmp_path / "cache" / "zerocalc").iterdir())
    assert [p.name for p in written] == ["calibration-gloo-2xtest-cpu-20261123T120000.json"]
    assert stat.S_IMODE(written[0].stat().st_mode) == 0o644
    assert load_calibration(written[0]) == _calibration()
    for text in (
        "all_reduce, world groups of 2",
        "busbw",
        "(GB/s)",
        "#wrong",
        "Summary",
        "α (µs)",
        "no wrong",
    ):
        assert text in result.stdout
    assert str(written[0]) in result.stdout.replace("\n", "")


def test_json_prints_the_calibration_alone_on_stdout(
    no_ranks: list[dict], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(procs, "spawn", lambda *a, collect, **k: collect(_calibration().model_dump_json()))
    out = tmp_path / "cal.json"
    result = runner.invoke(app, ["bench", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(_calibration().model_dump_json())
    assert result.stderr == f"calibration written to {out}\n"


@pytest.mark.parametrize(
    ("failure", "code", "line"),
    [
        (
            procs.RanksFailed("rank 1 exited with code 17; the other ranks were stopped"),
            1,
            "zerocalc: error: rank 1 exited with code 17; the other ranks were stopped\n",
        ),
        (
            procs.RanksFailed("ranks [1] did not finish within --timeout 3 s; all ranks were stopped", 3),
            3,
            "zerocalc: error: ranks [1] did not finish within --timeout 3 s; all ranks were stopped\n",
        ),
        (KeyboardInterrupt(), 130, "zerocalc: interrupted; every spawned process was stopped\n"),
    ],
)
def test_a_failed_run_is_one_line_with_its_exit_code_and_writes_nothing(
    failure: BaseException,
    code: int,
    line: str,
    no_ranks: list[dict],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    def spawn(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(procs, "spawn", spawn)
    result = runner.invoke(app, ["bench", "--out", str(tmp_path / "cal.json")])
    assert (result.exit_code, result.stderr) == (code, line)
    assert not (tmp_path / "cal.json").exists()


# ------------------------------------------------------------------------------------ calibration files
def _fit_json(beta: str) -> str:
    text = _calibration().model_dump_json()
    return text.replace('"bus_bandwidth_Bps":1000000000.0', f'"bus_bandwidth_Bps":{beta}')


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "calibration '' is empty; accepted: a file written by `zerocalc bench`"),
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0); accepted: a file written by `zerocalc bench`"),
        (b"{not json", "is not a zerocalc calibration (file: Invalid JSON"),
        (_fit_json("1e400").encode(), "(fits.0.bus_bandwidth_Bps: Input should be a finite number)"),
        (_fit_json("NaN").encode(), "(fits.0.bus_bandwidth_Bps: Input should be a finite number)"),
        (_fit_json("Infinity").encode(), "(fits.0.bus_bandwidth_Bps: Input should be a finite number)"),
        (_fit_json("-1").encode(), "(fits.0.bus_bandwidth_Bps: Input should be greater than 0)"),
    ],
)
def test_a_bad_calibration_is_refused_in_one_line(
    content: bytes | None, fragment: str, tmp_path: Path
) -> None:
    path = "" if content is None else tmp_path / "cal.json"
    if content is not None:
        Path(path).write_bytes(content)
    with pytest.raises(InputError) as caught:
        load_calibration(path)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_comm_refuses_a_bad_calibration_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "cal.json").write_bytes(_fit_json("1e400").encode())
    for name in ("", str(tmp_path), str(tmp_path / "cal.json")):
        result = runner.invoke(app, ["comm", "--params", "1B", "--gpus", "2", "--calibration", name])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"zerocalc: error: --calibration {name!r} ")


def test_a_saved_calibration_loads_back(tmp_path: Path) -> None:
    save_calibration(_calibration(), tmp_path / "cal.json")
    assert load_calibration(tmp_path / "cal.json") == _calibration()


def test_default_collectives_are_the_three_zero_uses() -> None:
    from zerocalc.bench.defaults import DEFAULT_COLLECTIVES_TEXT
    from zerocalc.bench.sweep import DEFAULT_COLLECTIVES

    assert ",".join(c.value for c in DEFAULT_COLLECTIVES) == DEFAULT_COLLECTIVES_TEXT


def test_a_beta_that_fell_back_to_the_peak_busbw_says_so(
    no_ranks: list[dict], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fit whose slope was not positive takes β from the peak busbw: the summary marks that β and a note
    says why; the JSON carries ``beta_from_peak``."""
    calibration = _calibration()
    fallen = calibration.model_copy(
        update={"fits": [calibration.fits[0].model_copy(update={"beta_from_peak": True})]}
    )
    monkeypatch.setattr(procs, "spawn", lambda *a, collect, **k: collect(fallen.model_dump_json()))
    result = runner.invoke(app, ["bench", "--out", str(tmp_path / "cal.json")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "1.000*" in result.stdout
    assert "· * β is the peak busbw, not a fit: the least-squares slope was not positive" in result.stdout
    shown = runner.invoke(app, ["bench", "--json", "--out", str(tmp_path / "cal2.json")])
    assert json.loads(shown.stdout)["fits"][0]["beta_from_peak"] is True
