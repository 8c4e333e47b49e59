"""The process harness: the watch logic with fake processes (pure), the rank-side channel in-process, and
real spawned worlds of tiny ranks that import no torch (a fraction of a second each)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zerocalc.base.errors import InputError
from zerocalc.harness import procs


# ------------------------------------------------------------------------------- fake processes (pure)
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.now += seconds


class FakeProc:
    """Exits with ``code`` once the clock reaches ``at`` (never when ``code`` is None); may ignore SIGTERM."""

    def __init__(self, clock: Clock, code: int | None, at: float = 0.0, stubborn: bool = False):
        self.clock, self.code, self.at, self.stubborn = clock, code, at, stubborn
        self.signals: list[str] = []

    def poll(self) -> int | None:
        return self.code if self.code is not None and self.clock.now >= self.at else None

    def terminate(self) -> None:
        self.signals.append("TERM")
        if not self.stubborn:
            self.code, self.at = -signal.SIGTERM, self.clock.now

    def kill(self) -> None:
        self.signals.append("KILL")
        self.code, self.at = -signal.SIGKILL, self.clock.now

    def wait(self, timeout: float | None = None) -> int:
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired("fake", timeout or 0)
        return code


def _told(lines: dict[int, str]) -> Callable[[int], str]:
    return lambda rank: lines.get(rank, "")


def test_no_failure_while_ranks_run_or_succeed() -> None:
    assert procs.verdict([None, None], _told({})) is None
    assert procs.verdict([0, None, 0], _told({})) is None


@pytest.mark.parametrize(
    ("codes", "lines", "message", "exit_code"),
    [
        ([None, 17], {}, "rank 1 exited with code 17; the other ranks were stopped", 1),
        ([-9, None], {}, "rank 0 was killed by SIGKILL; the other ranks were stopped", 1),
        # a rank that died without a word is the cause, not the peer that reports the closed connection
        ([1, 17], {0: "rank 0: RuntimeError: Connection closed by peer"}, "rank 1 exited with code 17", 1),
        # a hang (its watchdog or its peer's collective timed out) over peers that saw the connection close
        (
            [1, 3],
            {0: "rank 0: RuntimeError: Connection closed by peer", 1: "rank 1: did not finish"},
            "rank 1: did not finish; the other ranks were stopped",
            3,
        ),
        ([1, 1], {0: "rank 0: boom", 1: "rank 1: boom"}, "rank 0: boom; the other ranks were stopped", 1),
        ([2, 2], {0: "--x 7 is not accepted", 1: "--x 7 is not accepted"}, "--x 7 is not accepted", 2),
        ([None, 2], {}, "rank 1 refused the input", 2),
        # a rank that refused the input stopped; its peer, seen failing in the same look, lost the connection
        (
            [1, 2],
            {0: "rank 0: RuntimeError: Connection closed by peer", 1: "--x 7 is not accepted"},
            "--x 7 is not accepted",
            2,
        ),
    ],
)
def test_the_first_failing_rank_is_named_in_one_line(
    codes: list[int | None], lines: dict[int, str], message: str, exit_code: int
) -> None:
    failure = procs.verdict(codes, _told(lines))
    assert failure is not None
    assert str(failure).startswith(message) and "\n" not in str(failure)
    assert failure.exit_code == exit_code


@pytest.mark.parametrize("code", [130, -signal.SIGINT])
def test_ctrl_c_in_a_rank_is_an_interrupt(code: int) -> None:
    with pytest.raises(KeyboardInterrupt):
        procs.verdict([None, code], _told({1: ""}))


def test_watch_returns_when_every_rank_exits_0(tmp_path: Path) -> None:
    clock = Clock()
    ranks = [FakeProc(clock, 0, at=1.0), FakeProc(clock, 0, at=2.0)]
    procs.watch(ranks, 10, tmp_path, clock=clock, pause=clock.pause)
    assert 2.0 <= clock.now < 2.1 and all(not r.signals for r in ranks)


def test_watch_stops_every_rank_on_the_first_failure(tmp_path: Path) -> None:
    clock = Clock()
    ranks = [FakeProc(clock, None), FakeProc(clock, 17, at=0.5), FakeProc(clock, None)]
    (tmp_path / "rank1.err").write_text("rank 1: RuntimeError: boom\n", encoding="utf-8")
    with pytest.raises(
        procs.RanksFailed, match=r"^rank 1: RuntimeError: boom; the other ranks were stopped$"
    ):
        procs.watch(ranks, 10, tmp_path, clock=clock, pause=clock.pause)
    assert ranks[0].signals == ["TERM"] and ranks[2].signals == ["TERM"] and ranks[1].signals == []


def test_watch_times_out_with_exit_3_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    clock = Clock()
    ranks = [FakeProc(clock, 0, at=0.1), FakeProc(clock, None, stubborn=True)]
    with pytest.raises(procs.RanksFailed) as caught:
        procs.watch(ranks, 5, tmp_path, clock=clock, pause=clock.pause)
    assert str(caught.value) == "ranks [1] did not finish within --timeout 5 s; all ranks were stopped"
    assert caught.value.exit_code == procs.EXIT_TIMEOUT
    assert clock.now >= 5 + procs.GRACE_S
    assert ranks[1].signals == ["TERM", "KILL"]


def test_watch_restarts_the_timeout_whenever_the_work_moves_on(tmp_path: Path) -> None:
    clock = Clock()
    ranks = [FakeProc(clock, 0, at=30.0), FakeProc(clock, 0, at=30.0)]
    steps = [10.0, 20.0]  # two results come in; alone, 5 s + GRACE_S would end at 15

    def progressed() -> bool:
        if steps and clock.now >= steps[0]:
            steps.pop(0)
            return True
        return False

    procs.watch(ranks, 5, tmp_path, clock=clock, pause=clock.pause, progressed=progressed)
    assert 30.0 <= clock.now < 30.1 and not steps


def test_watch_turns_ctrl_c_in_the_ranks_into_an_interrupt_after_stopping_them(tmp_path: Path) -> None:
    clock = Clock()
    ranks = [FakeProc(clock, 130, at=0.2), FakeProc(clock, None)]
    with pytest.raises(KeyboardInterrupt):
        procs.watch(ranks, 10, tmp_path, clock=clock, pause=clock.pause)
    assert ranks[1].signals == ["TERM"]


def test_describe_exit() -> None:
    assert procs.describe_exit(-9) == "was killed by SIGKILL"
    assert procs.describe_exit(3) == "exited with code 3"


def test_rank_env_is_torchrun_s_for_one_node() -> None:
    env = procs.rank_env({"PATH": "/bin"}, 1, 4, 12345)
    assert env == {
        "PATH": "/bin",
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "12345",
        "OMP_NUM_THREADS": "1",
    }


# ----------------------------------------------------------------------------------------- input bounds
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), float("1e400"), 86_400.5])
def test_timeouts_beyond_bounds_are_refused(value: float) -> None:
    with pytest.raises(
        InputError, match=r"^--timeout .* is not accepted; accepted: seconds > 0 and at most 86400"
    ):
        procs.check_timeout(value)


def test_timeouts_within_bounds() -> None:
    assert procs.check_timeout(0.5) == 0.5 and procs.check_timeout(86_400) == 86_400


@pytest.mark.parametrize(
    ("nproc", "gpus", "message"),
    [
        (1, 0, "--nproc 1 is not accepted; accepted: 2 or more processes"),
        (
            9,
            0,
            "--nproc 9 is more processes than this node can run (4 per CPU core, 2 usable); accepted: 2 to 8",
        ),
        (10**9, 0, "--nproc 1000000000 is more processes than this node can run"),
        (5, 4, "--nproc 5 is more processes than this node can run (one per visible GPU, 4 visible)"),
        (10**400, 4, "--nproc ~1e400 is more processes"),
    ],
)
def test_more_ranks_than_the_node_runs_are_refused(nproc: int, gpus: int, message: str) -> None:
    with pytest.raises(InputError) as caught:
        procs.check_nproc(nproc, gpus, cpus=2)
    assert str(caught.value).startswith(message)


def test_ranks_within_bounds() -> None:
    assert procs.check_nproc(8, 0, cpus=2) == 8 and procs.check_nproc(4, 4, cpus=1) == 4
    assert procs.most_ranks(0, cpus=3) == (12, "4 per CPU core, 3 usable")
    assert procs.usable_cpus() >= 1


def test_brief_shows_huge_numbers_by_magnitude() -> None:
    assert procs.brief(10**21) == "1000000000000000000000"
    assert procs.brief(10**5000) == "~1e5000" and procs.brief(-(10**400)) == "-~1e400"


# ------------------------------------------------------------------------------ rank side, in-process
def test_say_goes_to_the_parent_when_spawned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(procs.DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    procs.say("rank 3: something broke")
    assert procs.said(tmp_path, 3) == "rank 3: something broke"
    assert capsys.readouterr().err == ""
    monkeypatch.delenv(procs.DIR_ENV)
    procs.say("rank 3: something broke")
    assert capsys.readouterr().err == "zerocalc: error: rank 3: something broke\n"


def test_run_rank_hands_back_rank_0_s_result_and_turns_bad_input_into_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(procs.DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    assert procs.run_rank(lambda: '{"answer": 42}') == 0
    result = tmp_path / procs.RESULT_FILE.format(index=0)
    assert json.loads(result.read_text(encoding="utf-8")) == {"answer": 42}

    def bad() -> str:
        raise InputError("--x 7 is not accepted; accepted: 1")

    assert procs.run_rank(bad) == 2 and procs.said(tmp_path, 0) == "--x 7 is not accepted; accepted: 1"

    def quiet() -> str:
        raise procs.RankStopped(2)

    monkeypatch.setenv("RANK", "1")
    assert procs.run_rank(quiet) == 2 and procs.said(tmp_path, 1) == ""
    monkeypatch.delenv(procs.DIR_ENV)
    assert procs.hand_back("{}") is False  # not spawned: nobody to hand it to


def test_first_line_drops_torch_s_boilerplate_and_long_tails() -> None:
    exc = RuntimeError("Connection closed by peer. This is typically because a rank died\nmore")
    assert procs.first_line(exc) == "Connection closed by peer"
    assert len(procs.first_line(RuntimeError("x" * 500))) == 200
    assert procs.first_line(RuntimeError("")) == "RuntimeError"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_plain_lines_when_piped_and_a_bar_on_a_terminal() -> None:
    piped = io.StringIO()
    progress = procs.Progress("zerocalc bench", 2, piped)
    progress.step("all_reduce world 2", "1/2 sizes")
    progress.step("all_reduce world 2", "2/2 sizes")
    progress.close()
    assert piped.getvalue() == (
        "zerocalc bench: all_reduce world 2: 1/2 sizes\nzerocalc bench: all_reduce world 2: 2/2 sizes\n"
    )
    terminal = Tty()
    progress = procs.Progress("zerocalc bench", 2, terminal)
    progress.step("all_reduce world 2", "1/2 sizes")
    progress.close()
    assert "\x1b[" in terminal.getvalue() and "1/2 sizes" not in terminal.getvalue()


# ---------------------------------------------------------------------- real worlds of tiny ranks (no torch)
RANK_MODULE = """
import json, os, sys, time
from zerocalc.harness import procs
from zerocalc.base.errors import InputError

mode = sys.argv[1]
rank = int(os.environ["RANK"])
timeout = float(os.environ.get("FAKE_TIMEOUT", "60"))
disarm = procs.start_watchdog(timeout, rank, poll_s=0.05)

def body():
    if mode == "bad":
        raise InputError("--thing 7 is not accepted; accepted: 1")
    if mode == "die":
        if rank == 1:
            os._exit(17)
        time.sleep(3600)
    if mode == "hang":
        time.sleep(3600)
    if mode == "disarmed":
        disarm()
        time.sleep(3 * timeout)
    if mode == "nothing" or rank != 0:
        return None
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
    found = {k: os.environ[k] for k in keys}
    return json.dumps({**found, "slurm": any(k.startswith("SLURM_") for k in os.environ)})

procs.exit_now(procs.run_rank(body))
"""


@pytest.fixture()
def rank_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "zc_tiny_rank.py").write_text(textwrap.dedent(RANK_MODULE), encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("SLURM_JOB_ID", "1")  # a Slurm job's variables are not passed on to spawned ranks
    return "zc_tiny_rank"


def test_spawn_collects_rank_0_s_result(rank_module: str) -> None:
    result = procs.spawn(rank_module, "ok", 3, 30, json.loads)
    assert result == {
        "RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "slurm": False,
    }


def test_spawn_names_a_dead_rank_and_stops_the_others(rank_module: str) -> None:
    start = time.monotonic()
    with pytest.raises(
        procs.RanksFailed, match=r"^rank 1 exited with code 17; the other ranks were stopped$"
    ):
        procs.spawn(rank_module, "die", 2, 30, json.loads)
    assert time.monotonic() - start < 10  # rank 0 (sleeping) was stopped, not waited for


def test_spawn_reports_bad_input_with_exit_2(rank_module: str) -> None:
    with pytest.raises(procs.RanksFailed) as caught:
        procs.spawn(rank_module, "bad", 2, 30, json.loads)
    assert (str(caught.value), caught.value.exit_code) == ("--thing 7 is not accepted; accepted: 1", 2)


def test_a_rank_s_watchdog_stops_a_hang_with_exit_3(
    rank_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TIMEOUT", "1")
    with pytest.raises(procs.RanksFailed) as caught:
        procs.spawn(rank_module, "hang", 2, 1, json.loads)
    assert caught.value.exit_code == 3
    assert str(caught.value).endswith(
        "the run did not finish within --timeout 1 s; the other ranks were stopped"
    )


def test_a_disarmed_watchdog_lets_the_rank_finish(rank_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TIMEOUT", "0.2")
    assert procs.spawn(rank_module, "disarmed", 2, 30, json.loads)["RANK"] == "0"


def test_a_result_that_never_came_or_cannot_be_read_is_a_failure(rank_module: str) -> None:
    with pytest.raises(procs.RanksFailed, match="rank 0 finished without handing back its result"):
        procs.spawn(rank_module, "nothing", 2, 30, json.loads)
    with pytest.raises(procs.RanksFailed, match=r"rank 0 handed back a result that cannot be read \(nope\)"):
        procs.spawn(rank_module, "ok", 2, 30, lambda text: (_ for _ in ()).throw(ValueError("nope")))


SERIES_MODULE = """
import json, os, sys, time
from zerocalc.harness import procs

rank = int(os.environ["RANK"])
watchdog = procs.Watchdog(float(os.environ.get("FAKE_TIMEOUT", "60")), rank, poll_s=0.05)

def handed_back(index):
    return os.path.exists(os.path.join(os.environ[procs.DIR_ENV], procs.RESULT_FILE.format(index=index)))

def body():
    for index, mode in enumerate(sys.argv[1:]):
        while index and not handed_back(index - 1):  # in step, as collectives keep real ranks
            time.sleep(0.01)
        watchdog.restart()
        if mode == "die":
            if rank == 1:
                os._exit(17)
            time.sleep(3600)
        if mode == "hang":
            time.sleep(3600)
        time.sleep(float(mode))  # seconds of work
        if rank == 0:
            procs.hand_back(json.dumps({"pid": os.getpid(), "index": index}), index)
    if rank == 1 and os.environ.get("FAKE_TEARDOWN_EXIT"):
        while not handed_back(len(sys.argv) - 2):
            time.sleep(0.01)
        os._exit(int(os.environ["FAKE_TEARDOWN_EXIT"]))
    watchdog.disarm()

procs.exit_now(procs.run_rank(body))
"""


@pytest.fixture()
def series_module(rank_module: str, tmp_path: Path) -> str:
    """Ranks that run their payloads in turn: a number (seconds of work), ``die`` (rank 1 exits 17) or
    ``hang``; rank 0 hands back its pid and the payload's index."""
    (tmp_path / "zc_tiny_series.py").write_text(textwrap.dedent(SERIES_MODULE), encoding="utf-8")
    return "zc_tiny_series"


def _series(module: str, payloads: list[str], timeout_s: float) -> list[tuple[Any, float]]:
    outcomes: list[tuple[int, Any, float]] = []
    procs.spawn_series(module, payloads, 2, timeout_s, json.loads, lambda *outcome: outcomes.append(outcome))
    assert [index for index, _, _ in outcomes] == list(range(len(payloads)))
    return [(outcome, seconds) for _, outcome, seconds in outcomes]


def test_a_series_runs_in_one_world_with_a_timeout_per_payload(
    series_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TIMEOUT", "1")  # each rank's watchdog: 1 s per payload, 1.8 s in all
    results = _series(series_module, ["0.6", "0.6", "0.6"], 30)
    assert [r["index"] for r, _ in results] == [0, 1, 2]
    assert len({r["pid"] for r, _ in results}) == 1
    assert all(0.5 < seconds < 10 for _, seconds in results[1:])


def test_a_failing_payload_is_its_one_line_and_the_rest_run_in_a_fresh_world(series_module: str) -> None:
    results = [outcome for outcome, _ in _series(series_module, ["0", "die", "0", "0"], 30)]
    assert isinstance(results[1], procs.RanksFailed)
    assert str(results[1]) == "rank 1 exited with code 17; the other ranks were stopped"
    first, _, third, fourth = results
    assert first["pid"] != third["pid"] == fourth["pid"]
    assert (third["index"], fourth["index"]) == (0, 1)


def test_a_hung_payload_times_out_and_a_failed_tear_down_fails_the_last(
    series_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TIMEOUT", "1")
    hung, after = [outcome for outcome, _ in _series(series_module, ["hang", "0"], 1)]
    assert isinstance(hung, procs.RanksFailed) and hung.exit_code == procs.EXIT_TIMEOUT
    assert str(hung).endswith("the run did not finish within --timeout 1 s; the other ranks were stopped")
    assert after["index"] == 0
    monkeypatch.setenv("FAKE_TEARDOWN_EXIT", "17")
    done, last = [outcome for outcome, _ in _series(series_module, ["0", "0"], 30)]
    assert done["index"] == 0
    assert str(last) == "rank 1 exited with code 17; the other ranks were stopped"


PARENT = """
import json, sys
from zerocalc.harness import procs
try:
    procs.spawn("zc_tiny_rank", "hang", 2, 60, json.loads)
except KeyboardInterrupt:
    sys.exit(130)
"""


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_or_killed_parent_leaves_no_rank_behind(rank_module: str, sig: signal.Signals) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 20
        while len(ranks := _children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ranks) == 2
        time.sleep(0.3)  # the ranks have started their watchdogs
        parent.send_signal(sig)
        assert parent.wait(timeout=20) == (130 if sig == signal.SIGTERM else -signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(r) for r in ranks)
    finally:
        if parent.poll() is None:
            parent.kill()
