"""Run a world of ranks on this node and watch it (standard library only: no torch, cheap to import).

Parent side, :func:`spawn`: start ``python -m MODULE PAYLOAD`` as N ranks with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, watch them, and
return what rank 0 handed back. The first rank to fail stops the others and is named in one line
(:class:`RanksFailed`); the whole world is stopped after its timeout; Ctrl-C (or SIGTERM) stops every rank.
:func:`spawn_series` runs several payloads one after the other in one world (``python -m MODULE P0 P1
...``), with the timeout applying to each payload; a failure is the payload's in progress, and the payloads
after it go on in a fresh world.

Rank side: :func:`say` (the one-line error channel), :func:`start_watchdog` (:class:`Watchdog`),
:func:`fail_rank`, :func:`hand_back` (collect), :func:`run_rank` and :func:`exit_now`. Ranks and the parent
share one folder, named by :data:`DIR_ENV`: ``rank<N>.err`` holds a rank's one line, ``result-<I>.json``
rank 0's result of payload I. Without it (under torchrun/srun, or in-process) a rank prints its line on
stderr and hands nothing back.

Exit codes (a rank's, and the command's): 0 ok, 1 failed, 2 bad input, 3 timeout, 130 Ctrl-C.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol, TextIO, TypeVar

from zerocalc.base.atomic import write_text_atomic
from zerocalc.base.errors import InputError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 3
EXIT_INTERRUPTED = 130

DIR_ENV = "ZEROCALC_PROCS_DIR"
"""Set by :func:`spawn` for its ranks: the folder of their one-line errors and of rank 0's result."""
PARENT_ENV = "ZEROCALC_PROCS_PARENT"
"""Set by :func:`spawn` for its ranks: its process id, so a rank whose parent died before the rank's
:class:`Watchdog` started still sees it gone."""
RESULT_FILE = "result-{index}.json"
"""Rank 0's result of the payload at ``index`` (its position in the ranks' arguments)."""
GRACE_S = 10.0
"""Extra seconds the parent gives the ranks past their timeout (each rank's watchdog fires at it)."""
MAX_TIMEOUT_S = 86_400.0
"""``--timeout`` is at most one day."""
RANKS_PER_CPU = 4
"""Without GPUs, at most this many ranks per CPU core this process may run on (gloo tolerates
oversubscription, but every rank is a Python process holding torch)."""
INTERRUPTED = "interrupted; every spawned process was stopped"

T = TypeVar("T")


class RanksFailed(RuntimeError):
    """A rank failed or the world timed out; the message is one line. ``exit_code`` is the command's."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


class RankStopped(Exception):
    """Raised inside a rank: stop with ``code``, saying ``message`` (empty: a peer says it)."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code, self.message = code, message


# ------------------------------------------------------------------------------------- input bounds
def brief(n: int) -> str:
    """A whole number as a message shows it: exact when short, else its order of magnitude (Python
    refuses to print integers of more than 4300 digits)."""
    if abs(n).bit_length() <= 100:
        return str(n)
    return f"{'-' if n < 0 else ''}~1e{int(abs(n).bit_length() * 0.30103)}"


def check_timeout(timeout_s: float, option: str = "--timeout") -> float:
    """Seconds > 0 and at most :data:`MAX_TIMEOUT_S`; infinity and NaN are refused."""
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise InputError(
            f"{option} {timeout_s:g} is not accepted; accepted: seconds > 0 and at most "
            f"{MAX_TIMEOUT_S:g} (one day)"
        )
    return timeout_s


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    with contextlib.suppress(AttributeError, OSError):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def most_ranks(gpus: int, cpus: int | None = None) -> tuple[int, str]:
    """How many ranks this node can run, and why: one per visible GPU, else :data:`RANKS_PER_CPU` per core."""
    if gpus > 0:
        return gpus, f"one per visible GPU, {gpus} visible"
    cpus = usable_cpus() if cpus is None else cpus
    return RANKS_PER_CPU * cpus, f"{RANKS_PER_CPU} per CPU core, {cpus} usable"


def check_nproc(nproc: int, gpus: int, cpus: int | None = None, option: str = "--nproc") -> int:
    """2 ≤ nproc ≤ :func:`most_ranks`."""
    if nproc < 2:
        raise InputError(f"{option} {brief(nproc)} is not accepted; accepted: 2 or more processes")
    bound, why = most_ranks(gpus, cpus)
    if nproc > bound:
        raise InputError(
            f"{option} {brief(nproc)} is more processes than this node can run ({why}); "
            f"accepted: 2 to {bound}"
        )
    return nproc


# ------------------------------------------------------------------------------------------ parent side
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


class Proc(Protocol):
    """What :func:`watch` and :func:`stop` need of a process (``subprocess.Popen`` has it)."""

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def rank_env(base: Mapping[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """The environment of one spawned rank: torchrun's variables for a single node."""
    return dict(
        base,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
    )


def spawn(
    module: str,
    payload: str,
    nproc: int,
    timeout_s: float,
    collect: Callable[[str], T],
) -> T:
    """Run ``python -m MODULE PAYLOAD`` as ``nproc`` ranks of one world on this node, watch them, and
    return ``collect(text)`` of what rank 0 handed back (:func:`hand_back`).

    Raises :class:`RanksFailed` (one line naming the failing rank) or KeyboardInterrupt (Ctrl-C, SIGTERM);
    every rank is stopped before this returns or raises.
    """
    outcomes: list[T | RanksFailed] = []
    spawn_series(
        module, [payload], nproc, timeout_s, collect, lambda _, outcome, __: outcomes.append(outcome)
    )
    (outcome,) = outcomes
    if isinstance(outcome, RanksFailed):
        raise outcome
    return outcome


def spawn_series(
    module: str,
    payloads: Sequence[str],
    nproc: int,
    timeout_s: float,
    collect: Callable[[str], T],
    on_done: Callable[[int, T | RanksFailed, float], None],
) -> None:
    """Run every payload in turn, as few worlds of ``nproc`` ranks as failures allow: a world runs
    ``python -m MODULE P0 P1 ...`` and rank 0 hands back each payload's result (``hand_back(text, I)``)
    as soon as it has it. ``on_done(index, collect(text) or the failure, seconds)`` is called for each
    payload, in order, as its result comes in.

    ``timeout_s`` (+ :data:`GRACE_S`) applies to each payload: from the world's start or the previous
    result. When a world fails (a rank fails, or the payload in progress times out), the failure is that
    payload's one line and the payloads after it run in a fresh world. A result counts once the next one
    has started (rank 0 hands it back before going on), the last one once every rank has exited cleanly,
    so a rank failing in tear-down fails the last payload. A result ``collect`` cannot read (ValueError)
    fails its payload alone. Raises KeyboardInterrupt (Ctrl-C, SIGTERM) after stopping every rank.
    """
    first = 0
    while first < len(payloads):
        first = _world_of_series(module, payloads, first, nproc, timeout_s, collect, on_done)


def _world_of_series(
    module: str,
    payloads: Sequence[str],
    first: int,
    nproc: int,
    timeout_s: float,
    collect: Callable[[str], T],
    on_done: Callable[[int, T | RanksFailed, float], None],
) -> int:
    """One world running ``payloads[first:]``; returns the index of the first payload it did not run."""
    mine = list(payloads[first:])
    with tempfile.TemporaryDirectory(prefix="zerocalc-procs-") as folder:
        started = time.monotonic()
        done = 0  # payloads of this world whose outcome was handed to on_done

        def deliver(outcome: T | RanksFailed) -> None:
            nonlocal done, started
            now = time.monotonic()
            on_done(first + done, outcome, now - started)
            done, started = done + 1, now

        def read(index: int) -> T | RanksFailed:
            try:
                text = (Path(folder) / RESULT_FILE.format(index=index)).read_text(encoding="utf-8")
            except OSError:
                return RanksFailed("rank 0 finished without handing back its result")
            try:
                return collect(text)
            except ValueError as exc:
                first_text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return RanksFailed(f"rank 0 handed back a result that cannot be read ({first_text})")

        def progressed() -> bool:
            """Hand on every result that counts already (all but the last payload's)."""
            moved = False
            while done < len(mine) - 1 and (Path(folder) / RESULT_FILE.format(index=done)).exists():
                deliver(read(done))
                moved = True
            return moved

        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        base[DIR_ENV], base[PARENT_ENV] = folder, str(os.getpid())
        port = free_port()
        procs: list[subprocess.Popen[bytes]] = []
        with _sigterm_interrupts():
            try:
                for rank in range(nproc):
                    env = rank_env(base, rank, nproc, port)
                    procs.append(subprocess.Popen([sys.executable, "-m", module, *mine], env=env))
                watch(procs, timeout_s, Path(folder), progressed=progressed)
            except RanksFailed as failure:
                deliver(failure)
                return first + done
            finally:
                stop(procs)
        while done < len(mine):
            deliver(read(done))
    return first + done


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the ranks run, SIGTERM (``kill``, a scheduler) stops them like Ctrl-C does."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def said(errors: Path, rank: int) -> str:
    """The one line rank ``rank`` said (empty when it said nothing)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return (errors / f"rank{rank}.err").read_text(encoding="utf-8").strip()
    return ""


def verdict(codes: Sequence[int | None], told: Callable[[int], str]) -> RanksFailed | None:
    """The failure to report for these exit codes (None: none yet), or KeyboardInterrupt raised.

    The first rank seen failing is the cause; peers fail after it ("connection closed by peer"), and may
    be seen failing in the same look. A rank that refused the input (exit 2, its line naming the value) is
    preferred over peers whose connection it closed by stopping, then a rank that died without a word
    (killed, ``os._exit``) over peers reporting it, then a rank that passed its timeout (a hang) over peers
    that saw the connection close; then the lowest rank.
    """
    failed = [rank for rank, code in enumerate(codes) if code is not None and code != 0]
    if not failed:
        return None
    lines = {rank: told(rank) for rank in failed}

    def cause(r: int) -> tuple[int, int]:
        if codes[r] == EXIT_BAD_INPUT:
            return 0, r
        return (1 if not lines[r] else 2 if codes[r] == EXIT_TIMEOUT else 3), r

    rank = min(failed, key=cause)
    code = codes[rank]
    assert code is not None
    if code in (EXIT_INTERRUPTED, -signal.SIGINT):  # Ctrl-C reached the ranks: the command says so once
        raise KeyboardInterrupt
    line = lines[rank]
    if code == EXIT_BAD_INPUT:  # the rank's one line names the value
        return RanksFailed(line or f"rank {rank} refused the input", EXIT_BAD_INPUT)
    exit_code = EXIT_TIMEOUT if code == EXIT_TIMEOUT else EXIT_FAILED
    if line:
        return RanksFailed(f"{line}; the other ranks were stopped", exit_code)
    return RanksFailed(f"rank {rank} {describe_exit(code)}; the other ranks were stopped", exit_code)


def watch(
    procs: Sequence[Proc],
    timeout_s: float,
    errors: Path,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
    progressed: Callable[[], bool] = lambda: False,
) -> None:
    """Wait until every rank exits 0; on the first failure or after ``timeout_s`` + :data:`GRACE_S`
    stop them all and raise :class:`RanksFailed` (or KeyboardInterrupt when the ranks got Ctrl-C).
    ``progressed()``, asked after each look at the ranks, says the work moved on: the timeout starts
    again from there."""
    deadline = clock() + timeout_s + GRACE_S
    while True:
        codes = [p.poll() for p in procs]
        if progressed():
            deadline = clock() + timeout_s + GRACE_S
        try:
            failure = verdict(codes, lambda rank: said(errors, rank))
        except KeyboardInterrupt:
            stop(procs)
            raise
        if failure is not None:
            stop(procs)
            raise failure
        if all(code == 0 for code in codes):
            return
        if clock() > deadline:
            waiting = [rank for rank, code in enumerate(codes) if code is None]
            stop(procs)
            raise RanksFailed(
                f"ranks {waiting} did not finish within --timeout {timeout_s:g} s; all ranks were stopped",
                EXIT_TIMEOUT,
            )
        pause(0.05)


def stop(procs: Sequence[Proc], wait_s: float = 3.0) -> None:
    """Terminate every rank still running, then kill what is left after ``wait_s``."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    end = time.monotonic() + wait_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(end - time.monotonic(), 0.01))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


# -------------------------------------------------------------------------------------------- rank side
def spawned() -> bool:
    """This process is a rank started by :func:`spawn` (not torchrun/srun, not in-process)."""
    return bool(os.environ.get(DIR_ENV))


def say(message: str) -> None:
    """A rank's one-line error: to the parent when spawned, else ``zerocalc: error: ...`` on stderr."""
    folder = os.environ.get(DIR_ENV)
    if folder:
        rank = os.environ.get("RANK", "0")
        with (
            contextlib.suppress(OSError),
            open(os.path.join(folder, f"rank{rank}.err"), "w", encoding="utf-8") as handle,
        ):
            handle.write(message + "\n")
        return
    sys.stderr.write(f"zerocalc: error: {message}\n")
    sys.stderr.flush()


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, without torch's boilerplate, at most 200 characters."""
    lines = str(exc).strip().splitlines()
    text = lines[0].split(". This is typically")[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def fail_rank(rank: int, exc: BaseException, timeout_s: float) -> NoReturn:
    """A failure inside the world: one line, then ``os._exit`` (peers may be gone: a clean tear-down
    could hang). A timed-out collective exits 3, anything else 1."""
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text:
        say(
            f"rank {rank}: a collective did not complete within --timeout {timeout_s:g} s "
            "(a peer hung or died)"
        )
        exit_now(EXIT_TIMEOUT)
    say(f"rank {rank}: {type(exc).__name__}: {first_line(exc)}")
    exit_now(EXIT_FAILED)


class Watchdog:
    """Stops this rank after ``timeout_s`` (one line, exit 3), or at once and silently when the process
    that started it is gone (a killed parent must not leave ranks behind). :meth:`restart` gives the next
    piece of work its own ``timeout_s``; :meth:`disarm` stops watching."""

    def __init__(self, timeout_s: float, rank: int, poll_s: float = 0.5):
        self.timeout_s, self.rank, self.poll_s = timeout_s, rank, poll_s
        self._parent = int(os.environ.get(PARENT_ENV) or os.getppid())
        self._deadline = time.monotonic() + timeout_s
        self._disarmed = threading.Event()
        threading.Thread(target=self._guard, name="zerocalc-watchdog", daemon=True).start()

    def restart(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        self._disarmed.set()

    def _guard(self) -> None:
        while not self._disarmed.is_set():
            if os.getppid() != self._parent:
                exit_now(EXIT_FAILED)
            left = self._deadline - time.monotonic()
            if left <= 0:
                say(f"rank {self.rank}: the run did not finish within --timeout {self.timeout_s:g} s")
                exit_now(EXIT_TIMEOUT)
            self._disarmed.wait(min(self.poll_s, left))


def start_watchdog(timeout_s: float, rank: int, poll_s: float = 0.5) -> Callable[[], None]:
    """A :class:`Watchdog` for one piece of work; returns what disarms it."""
    return Watchdog(timeout_s, rank, poll_s).disarm


def hand_back(text: str, index: int = 0) -> bool:
    """Rank 0: hand ``text`` (JSON), the result of payload ``index``, back to the parent that spawned it.
    False when not spawned."""
    folder = os.environ.get(DIR_ENV)
    if not folder:
        return False
    write_text_atomic(Path(folder) / RESULT_FILE.format(index=index), text)
    return True


def run_rank(body: Callable[[], str | None]) -> int:
    """A spawned rank's main: run ``body``, hand its result (rank 0's JSON) back, turn bad input
    (:class:`InputError`, :class:`RankStopped`) into its one line and exit code."""
    try:
        result = body()
    except InputError as exc:
        say(str(exc))
        return EXIT_BAD_INPUT
    except RankStopped as exc:
        if exc.message:
            say(exc.message)
        return exc.code
    if result is not None:
        hand_back(result)
    return EXIT_OK


def exit_quietly_on_ctrl_c() -> None:
    """Ctrl-C reaches every process of the terminal's group: a rank stops at once and quietly (even while
    importing torch) and the parent, which got the same Ctrl-C, reports it once."""

    def stop_now(*_: object) -> None:
        if sys.stderr.isatty():  # a progress bar may have hidden the cursor
            sys.stderr.write("\x1b[?25h")
        exit_now(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, stop_now)


def exit_now(code: int) -> NoReturn:
    """Flush and leave without running interpreter tear-down (torch 2.13 can abort in it)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# ----------------------------------------------------------------------------------- progress on stderr
class Progress:
    """Progress of a long run on stderr: Rich's bar on a terminal, else one plain line per step
    (``zerocalc bench: all_reduce world 2: 5/14 sizes``), so piped runs show they are alive."""

    def __init__(self, command: str, total: int, stream: TextIO | None = None):
        self.command, self.total = command, total
        self.stream: TextIO = sys.stderr if stream is None else stream
        self._bar: Any = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description:<28}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(command, total=total)

    def step(self, label: str, detail: str) -> None:
        """One step done: ``label`` names it on the bar; the plain line is ``command: label: detail``."""
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=label)
            return
        self.stream.write(f"{self.command}: {label}: {detail}\n")
        self.stream.flush()

    def running(self, label: str) -> None:
        """Name on the bar what runs now (the next step); the plain lines name steps once done."""
        if self._bar is not None:
            self._bar.update(self._task, description=label)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
