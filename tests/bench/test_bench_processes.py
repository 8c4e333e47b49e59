"""`zerocalc bench` with real processes on CPU (gloo): spawned, under torchrun, and two simulated nodes.

Sizes are tiny and iterations few: these tests check structure, factors and correctness, never bandwidth
values (2 shared cores are noisy; see FIELD-NOTES).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers import BIN, clean_env, run_zerocalc

from zerocalc.harness.procs import free_port
from zerocalc.network.calibration import load_calibration
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import BENCHMARKED, COLLECTIVES, Collective

pytestmark = pytest.mark.slow

TINY = ["--min-bytes", "1KiB", "--max-bytes", "16KiB", "--step-factor", "4", "--warmup", "1", "--iters", "3"]


def _zerocalc(
    *args: str, tmp_path: Path, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    return run_zerocalc(*args, env=clean_env(tmp_path, **extra), timeout=timeout)


def _keys(path: Path) -> list[tuple[str, str, int, int]]:
    cal = load_calibration(path)
    return [(m.collective.value, m.group_kind.value, m.group_size, m.size_bytes) for m in cal.measurements]


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One spawned world of 2 ranks measuring every collective with --check (shared by the tests below)."""
    folder = tmp_path_factory.mktemp("spawned")
    out = folder / "cal.json"
    args = ["bench", "--nproc", "2", "--collectives", "all", "--check", "--json", "--out", str(out), *TINY]
    return out, _zerocalc(*args, tmp_path=folder)


def test_spawned_world_of_two_runs_every_collective_and_passes_check(
    spawned: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, result = spawned
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)  # --json: the calibration on stdout, nothing else
    cal = load_calibration(out)
    assert printed == json.loads(cal.model_dump_json())
    assert f"calibration written to {out}" in result.stderr
    assert (cal.backend, cal.world_size, cal.nodes, cal.gpus_per_node, cal.dtype) == ("gloo", 2, 1, 2, "bf16")
    assert {m.collective for m in cal.measurements} == set(BENCHMARKED)
    assert {m.group_kind for m in cal.measurements} == {RankGroup.WORLD}
    for m in cal.measurements:
        assert m.errors == 0, m
        assert m.time_s > 0
        factor = float(COLLECTIVES[m.collective].bus_factor(m.group_size))
        assert m.busbw_Bps / m.algbw_Bps == pytest.approx(factor)
        assert m.algbw_Bps == pytest.approx(m.size_bytes / m.time_s)
    assert [m.size_bytes for m in cal.measurements if m.collective is Collective.ALL_REDUCE] == [
        1024,
        4096,
        16384,
    ]
    assert len(cal.fits) == 5 and all(f.bus_bandwidth_Bps > 0 and f.points == 3 for f in cal.fits)
    assert not list(out.parent.glob(".cal.json.*"))  # no temporary file left behind


def test_piped_progress_is_one_plain_line_per_size(
    spawned: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    progress = [line for line in spawned[1].stderr.splitlines() if line.startswith("zerocalc bench: ")]
    assert progress[:3] == [f"zerocalc bench: all_reduce world 2: {i}/3 sizes" for i in (1, 2, 3)]
    assert len(progress) == 5 * 3 and progress[-1] == "zerocalc bench: all_to_all world 2: 3/3 sizes"


def test_torchrun_gives_the_same_shape_and_rank_0_alone_writes_and_prints(
    spawned: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "zerocalc", "bench",
         "--check", *TINY],
        capture_output=True, text=True, env=clean_env(tmp_path), timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("Summary") == 1  # rank 0 alone prints
    for text in ("all_reduce, world groups of 2", "busbw", "(GB/s)", "#wrong", "α (µs)", "no wrong elements"):
        assert text in result.stdout
    (written,) = (tmp_path / "zerocalc").glob("calibration-gloo-2x*.json")  # rank 0 alone writes
    assert str(written) in result.stdout.replace("\n", "")
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    default = {c.value for c in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)}
    assert _keys(written) == [k for k in _keys(spawned[0]) if k[0] in default]
    cal = load_calibration(written)
    assert all(m.errors == 0 for m in cal.measurements)
    assert (cal.world_size, cal.nodes, cal.gpus_per_node) == (2, 1, 2)


def test_two_simulated_nodes_measure_intra_and_inter_node_groups(tmp_path: Path) -> None:
    out = tmp_path / "two-nodes.json"
    port = str(free_port())
    agents = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "-m",
                "zerocalc",
                "bench",
                "--check",
                "--out",
                str(out),
                "--min-bytes",
                "1KiB",
                "--max-bytes",
                "4KiB",
                "--warmup",
                "1",
                "--iters",
                "2",
                "--timeout",
                "60",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(tmp_path),
        )
        for node in (0, 1)
    ]
    try:
        results = [agent.communicate(timeout=120) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert [a.returncode for a in agents] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    cal = load_calibration(out)
    assert (cal.world_size, cal.nodes, cal.gpus_per_node) == (4, 2, 2)
    kinds = {(f.group_kind, f.group_size) for f in cal.fits}
    assert kinds == {(RankGroup.WORLD, 4), (RankGroup.NODE, 2), (RankGroup.ACROSS_NODES, 2)}
    assert len(cal.fits) == 9  # 3 collectives × 3 group kinds
    assert all(m.errors == 0 for m in cal.measurements)


def test_a_dead_rank_stops_the_job_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "never.json"
    result = _zerocalc(
        "bench",
        "--nproc",
        "2",
        "--out",
        str(out),
        *TINY,
        tmp_path=tmp_path,
        ZEROCALC_BENCH_TEST_EXIT_RANK="1:17",
    )
    assert result.returncode == 1
    assert result.stderr == "zerocalc: error: rank 1 exited with code 17; the other ranks were stopped\n"
    assert not out.exists()


def test_a_hung_rank_is_stopped_after_the_timeout(tmp_path: Path) -> None:
    out = tmp_path / "never.json"
    result = _zerocalc(
        "bench", "--nproc", "2", "--timeout", "3", "--out", str(out), *TINY,
        tmp_path=tmp_path, timeout=30, ZEROCALC_BENCH_TEST_HANG_RANK="1",
    )  # fmt: skip
    assert result.returncode == 3  # a timeout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: rank "), result.stderr
    # The hung rank's watchdog or its waiting peer's process-group timeout: either names --timeout.
    assert "--timeout 3 s" in lines[0] and lines[0].endswith("the other ranks were stopped"), lines[0]
    assert not out.exists()


BLOCK_TORCH = """
import sys
import time
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
import importlib.util
_find_spec = importlib.util.find_spec
def _hidden(name, package=None):
    return None if name == "torch" or name.startswith("torch.") else _find_spec(name, package)
importlib.util.find_spec = _hidden
sys.argv = ["zerocalc", *sys.argv[1:]]
from zerocalc.cli import main
main()
"""


def test_memory_works_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    memory = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, "memory", "--params", "7B", "--gpus", "4"],
        capture_output=True, text=True, env=clean_env(tmp_path), timeout=30,
    )  # fmt: skip
    assert memory.returncode == 0, memory.stderr
    assert "ZeRO-3" in memory.stdout
    probe = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH.replace("from zerocalc.cli import main\nmain()", "import torch")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr  # the blocker really blocks


def test_the_cli_starts_without_torch(tmp_path: Path) -> None:
    code = "import sys, zerocalc.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "False"


def test_ctrl_c_stops_every_spawned_process(tmp_path: Path) -> None:
    out = tmp_path / "never.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zerocalc", "bench", "--nproc", "2", "--iters", "1000", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(tmp_path),
        start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    said: list[str] = []
    while not said or not said[-1].startswith("zerocalc bench: "):  # the ranks are measuring
        line = proc.stderr.readline()  # not a fixed wait: a slow start is still in its rendezvous
        assert line, "".join(said)
        said.append(line)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole process group
    _, rest = proc.communicate(timeout=20)
    stderr = "".join(said) + rest
    assert proc.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith("zerocalc bench: ")]  # progress
    assert lines == ["zerocalc: interrupted; every spawned process was stopped"], stderr
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert left == [], left
    assert not out.exists()


def test_a_measured_calibration_drives_comm_times(
    spawned: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """bench writes a calibration from real gloo collectives; comm then times with its fits, and says so."""
    out = spawned[0]
    base = ["comm", "--params", "1B", "--gpus", "2", "-s", "ddp,zero1", "--json"]
    stated = json.loads(_zerocalc(*base, tmp_path=tmp_path).stdout)
    measured_run = _zerocalc(*base, "--calibration", str(out), tmp_path=tmp_path)
    assert measured_run.returncode == 0, measured_run.stderr
    measured = json.loads(measured_run.stdout)
    cal = load_calibration(out)
    assert measured["calibration_used"] == str(out)
    for before, after in zip(stated["strategies"], measured["strategies"], strict=True):
        assert (
            after["total_bytes_per_gpu"] == before["total_bytes_per_gpu"]
        )  # bytes do not depend on bandwidth
        for c in after["collectives"]:
            fit = cal.fit_for(Collective(c["op"]), RankGroup.WORLD)
            assert fit is not None and c["bandwidth_source"] == "calibration"
            assert c["time_s"] == pytest.approx(
                fit.latency_s + c["bytes_sent_per_gpu"] / fit.bus_bandwidth_Bps
            )
        assert after["time_s"] != before["time_s"]
