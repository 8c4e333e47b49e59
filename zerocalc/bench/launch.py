"""Start the measured world: join torchrun's/srun's, or spawn one process per rank on this node.

Spawned ranks are ``python -m zerocalc.bench.worker CONFIG_JSON`` subprocesses with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT. The launcher watches them:
the first rank to exit with a non-zero status stops the others and is named in one line; the whole job is
stopped after ``--timeout`` seconds (each worker also stops itself then); Ctrl-C stops them all. Nothing
is written unless rank 0 finishes (the calibration is written atomically by rank 0 alone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zerocalc.bench.config import ERROR_DIR_ENV, BenchConfig
from zerocalc.bench.topology import launched_by

GRACE_S = 10.0
"""Extra seconds the launcher gives workers past ``--timeout`` (they stop themselves at ``--timeout``)."""


class BenchFailed(RuntimeError):
    """A rank failed; the message is one line naming it. ``exit_code`` is what the CLI exits with."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


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


def run_bench(config: BenchConfig, nproc: int) -> int:
    """Run the benchmark; returns the exit code (0 done, 2 bad input already reported)."""
    if launched_by() is not None:
        from zerocalc.bench import worker

        return worker.run(config)
    return spawn(config, nproc)


def spawn(config: BenchConfig, nproc: int) -> int:
    return spawn_module("zerocalc.bench.worker", config.model_dump_json(), nproc, config.timeout_s)


def spawn_module(
    module: str, payload: str, nproc: int, timeout_s: float, extra_env: dict[str, str] | None = None
) -> int:
    """Run ``python -m MODULE PAYLOAD`` as ``nproc`` ranks of one world on this node and watch them.

    Shared by ``bench`` and ``validate``. Returns 0 when every rank exits 0; raises :class:`BenchFailed`
    (one line naming the failing rank) otherwise, or KeyboardInterrupt on Ctrl-C. Every rank is stopped
    before this returns.
    """
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    errors = tempfile.TemporaryDirectory(prefix="zerocalc-bench-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base[ERROR_DIR_ENV] = errors.name
    base.update(extra_env or {})
    try:
        for rank in range(nproc):
            env = dict(
                base,
                RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
            )
            procs.append(subprocess.Popen([sys.executable, "-m", module, payload], env=env))
        return _watch(procs, timeout_s + GRACE_S, Path(errors.name))
    finally:
        _stop(procs)
        errors.cleanup()


def _watch(procs: list[subprocess.Popen[bytes]], limit_s: float, errors: Path) -> int:
    deadline = time.monotonic() + limit_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [rank for rank, code in enumerate(codes) if code is not None and code != 0]
        if failed:
            # The first rank seen failing is the cause; peers fail after it ("connection closed by peer").
            # A rank that died without a word (killed, os._exit) is preferred over peers reporting it.
            # Then a rank that passed --timeout (a hang) over peers that saw the connection close.
            rank = min(
                failed, key=lambda r, c=codes: (0 if not _said(errors, r) else 1 if c[r] == 3 else 2, r)
            )
            code = codes[rank]
            if code in (130, -signal.SIGINT):  # Ctrl-C reached the ranks: the CLI says "interrupted"
                raise KeyboardInterrupt
            assert code is not None
            _stop(procs)
            said = _said(errors, rank)
            if code == 2:  # bad input: the worker's one line names the value
                raise BenchFailed(said or f"rank {rank} refused the input", 2)
            if said:
                raise BenchFailed(f"{said}; the other ranks were stopped", 1)
            raise BenchFailed(f"rank {rank} {describe_exit(code)}; the other ranks were stopped", 1)
        if all(code == 0 for code in codes):
            return 0
        if time.monotonic() > deadline:
            waiting = [rank for rank, code in enumerate(codes) if code is None]
            _stop(procs)
            raise BenchFailed(
                f"ranks {waiting} did not finish within --timeout {limit_s - GRACE_S:g} s; "
                "all ranks were stopped"
            )
        time.sleep(0.05)


def _said(errors: Path, rank: int) -> str:
    with contextlib.suppress(OSError):
        return (errors / f"rank{rank}.err").read_text(encoding="utf-8").strip()
    return ""


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every still-running worker, then kill what is left after a short wait."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    end = time.monotonic() + 3
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(end - time.monotonic(), 0.01))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
