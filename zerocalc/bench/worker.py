"""The torch side of ``zerocalc bench``: one rank of the measured world (imports torch).

:func:`run` is called in-process by the CLI under torchrun/srun, or runs in ranks spawned by
:func:`zerocalc.harness.procs.spawn` as ``python -m zerocalc.bench.worker CONFIG_JSON``. Every rank runs the
same
sweep in the same order; groups are created by every rank in the same order (``dist.new_group`` is
collective). Rank 0 gathers the figures (max of the ranks' times, sum of the ranks' wrong elements) before
tear-down, fits α/β and returns the :class:`~zerocalc.network.calibration.Calibration`; spawned, it hands it
back
to the parent. Writing and rendering it is the CLI's business.

Exit codes (:mod:`zerocalc.harness.procs`): 0 done, 1 a collective or the rendezvous failed (one line), 2 bad
input (one line), 3 the run passed ``--timeout``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from zerocalc.harness import procs

if __name__ == "__main__":
    procs.exit_quietly_on_ctrl_c()  # before torch's slow import

import torch
import torch.distributed as dist

from zerocalc.base.errors import InputError
from zerocalc.bench.config import TEST_EXIT_ENV, TEST_HANG_ENV, BenchConfig
from zerocalc.bench.fit import fit_alpha_beta
from zerocalc.bench.sweep import SweepPoint, host_available_bytes, memory_problem, sweep_points
from zerocalc.bench.topology import Placement, node_groups, placement_from_env, rendezvous_env
from zerocalc.network.calibration import Calibration, CollectiveFit, Measurement
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import COLLECTIVES, Collective


def visible_gpus() -> int:
    """CUDA devices torch sees here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _test_faults(rank: int) -> None:
    exit_rank, _, code = os.environ.get(TEST_EXIT_ENV, "").partition(":")
    if exit_rank == str(rank):
        os._exit(int(code or 1))
    if os.environ.get(TEST_HANG_ENV) == str(rank):
        while True:
            time.sleep(3600)


def torch_function(collective: Collective) -> Any:
    """The first of the collective's ``torch_functions`` this torch has (probed at run time)."""
    for name in COLLECTIVES[collective].torch_functions:
        if hasattr(dist, name):
            return getattr(dist, name)
    raise InputError(  # pragma: no cover - every torch >= 2.4 has one of them
        f"this torch ({torch.__version__}) has none of {COLLECTIVES[collective].torch_functions}"
    )


# ---------------------------------------------------------------------------------------------- buffers
class Point:
    """Buffers of one (collective, size) on one rank, with the pattern ``--check`` verifies."""

    def __init__(self, collective: Collective, count: int, n: int, r: int, src: int, dtype: Any, device: Any):
        self.collective, self.count, self.n, self.r, self.src = collective, count, n, r, src
        spec = COLLECTIVES[collective]
        shard = count // n
        self.inp = torch.zeros(shard if spec.input_is_shard else count, dtype=dtype, device=device)
        if collective in (Collective.ALL_REDUCE, Collective.BROADCAST):
            self.out = self.inp  # in place
        else:
            self.out = torch.zeros(shard if spec.output_is_shard else count, dtype=dtype, device=device)
        self.fn = torch_function(collective)

    def run(self, group: Any) -> None:
        c = self.collective
        if c is Collective.ALL_REDUCE:
            self.fn(self.inp, group=group)
        elif c is Collective.BROADCAST:
            self.fn(self.inp, src=self.src, group=group)
        else:  # reduce_scatter, all_gather, all_to_all_single: (output, input)
            self.fn(self.out, self.inp, group=group)

    # Small integers, exact in bf16/fp16/fp32: data movement uses values < 61, reductions sum 0/1 values
    # over n ranks (exact while n ≤ 256 in bf16).
    def fill_pattern(self) -> None:
        i = torch.arange(self.inp.numel(), device=self.inp.device)
        c, r, m = self.collective, self.r, self.count // self.n
        if c in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER):
            values = (i + r) % 2
        elif c is Collective.ALL_GATHER:
            values = (r * 7 + i) % 61
        elif c is Collective.BROADCAST:
            values = (i % 61 + 1) if r == 0 else torch.zeros_like(i)
        else:  # all_to_all: block b goes to rank b
            values = (r * 5 + (i // m) * 3 + i % m) % 61
        self.inp.copy_(values)

    def expected(self) -> Any:
        k = torch.arange(self.out.numel(), device=self.out.device)
        c, r, n, m = self.collective, self.r, self.n, self.count // self.n
        if c is Collective.ALL_REDUCE:
            return sum(((k + q) % 2) for q in range(n))
        if c is Collective.REDUCE_SCATTER:
            return sum(((k + r * m + q) % 2) for q in range(n))
        if c is Collective.ALL_GATHER:
            return ((k // m) * 7 + k % m) % 61
        if c is Collective.BROADCAST:
            return k % 61 + 1
        return ((k // m) * 5 + r * 3 + k % m) % 61

    def wrong_elements(self) -> int:
        expected = self.expected().to(self.out.dtype)
        return int((self.out != expected).sum().item())


# ----------------------------------------------------------------------------------------------- timing
def time_point(point: Point, group: Any, warmup: int, iters: int, device: Any) -> float:
    """Seconds per iteration on this rank. No host synchronisation inside the timed loop.

    GPU: CUDA events on the current stream around the loop (NCCL work is ordered before later work on
    the current stream with async_op=False), synchronised once after. CPU: wall clock from a barrier to
    the end of the loop (gloo collectives return when done).
    """
    for _ in range(warmup):
        point.run(group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier(group=group, device_ids=[device.index])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            point.run(group)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        point.run(group)
    return (time.perf_counter() - t0) / iters


# ------------------------------------------------------------------------------------------ environment
def device_name(device: Any) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def nccl_version() -> str | None:
    with contextlib.suppress(Exception):
        version = torch.cuda.nccl.version()
        return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    return None


def check_memory(config: BenchConfig, placement: Placement, device: Any) -> None:
    """Refuse a sweep whose largest point does not fit, before any process group exists: the GPU's free
    memory, or on CPU the node's MemAvailable shared by its ranks (a node-wide fact its first rank says)."""
    if device.type == "cuda":
        free, sharing, where = int(torch.cuda.mem_get_info(device)[0]), 1, f"GPU {device.index}"
    else:
        sharing = placement.local_world_size
        free, where = host_available_bytes(), f"this node ({sharing} ranks)"
    problem = memory_problem(
        config.collectives,
        config.dtype.bytes,
        config.min_bytes,
        config.max_bytes,
        config.step_factor,
        sharing,
        free,
        where,
    )
    if problem is None:
        return
    if device.type == "cpu" and placement.local_rank != 0 and not procs.spawned():
        raise procs.RankStopped(procs.EXIT_BAD_INPUT)
    raise InputError(problem)


# -------------------------------------------------------------------------------------------------- run
def run(config: BenchConfig, placement: Placement | None = None) -> Calibration | None:
    """This rank's part of the sweep: rank 0 returns the calibration, the other ranks None.

    Bad input, found before any process group exists, raises :class:`InputError` (or
    :class:`zerocalc.harness.procs.RankStopped` on ranks that leave the saying to another). A failure once the
    world is up is one line (:func:`zerocalc.harness.procs.say`) and ends the process: peers may be gone.
    """
    placement = placement or placement_from_env()
    os.environ.update(rendezvous_env())
    if placement.world_size < 2:
        raise InputError(
            f"a world of {placement.world_size} rank has nothing to measure; accepted: 2 or more ranks"
        )
    disarm = procs.start_watchdog(config.timeout_s, placement.rank)
    if config.backend == "nccl":
        if not torch.cuda.is_available():
            raise InputError("--backend nccl needs a CUDA GPU, and none is visible; accepted: --backend gloo")
        device = torch.device("cuda", placement.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    check_memory(config, placement, device)
    try:
        dist.init_process_group(
            config.backend,
            rank=placement.rank,
            world_size=placement.world_size,
            timeout=timedelta(seconds=config.timeout_s),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    except Exception as exc:
        procs.say(f"rank {placement.rank}: could not join the process group ({procs.first_line(exc)})")
        procs.exit_now(procs.EXIT_FAILED)
    _test_faults(placement.rank)
    try:
        calibration = _measure(config, placement, device)
    except Exception as exc:
        procs.fail_rank(placement.rank, exc, config.timeout_s)
    gc.collect()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    disarm()  # the world is done: writing and printing the result must not be cut short
    return calibration


def _measure(config: BenchConfig, placement: Placement, device: Any) -> Calibration | None:
    world = placement.world_size
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (placement.node, placement.local_rank))
    topo = node_groups(gathered)

    # (kind, group handle this rank is in, its ranks), every rank creating every group in the same order.
    plans: list[tuple[RankGroup, Any, list[int]]] = [(RankGroup.WORLD, None, list(range(world)))]
    if topo.nodes > 1 and topo.ranks_per_node > 0:
        for kind, groups in (
            (RankGroup.NODE, topo.intra_node),
            (RankGroup.ACROSS_NODES, topo.inter_node),
        ):
            mine = None
            for ranks in groups:
                handle = dist.new_group(ranks)
                if placement.rank in ranks:
                    mine = (handle, ranks)
            if mine is not None and len(mine[1]) > 1:  # a group of 1 rank has no communication
                plans.append((kind, *mine))

    dtype = getattr(torch, config.dtype.torch_name)
    rows: list[tuple[RankGroup, int, Collective, SweepPoint]] = []
    for kind, _, ranks in plans:
        for collective in config.collectives:
            for point in sweep_points(
                collective,
                len(ranks),
                config.dtype.bytes,
                config.min_bytes,
                config.max_bytes,
                config.step_factor,
            ):
                rows.append((kind, len(ranks), collective, point))

    progress = procs.Progress("zerocalc bench", len(rows)) if placement.rank == 0 else None
    times = torch.zeros(len(rows), dtype=torch.float64)
    wrong = torch.zeros(len(rows), dtype=torch.float64)
    index = 0
    try:
        for kind, group, ranks in plans:
            r = ranks.index(placement.rank)
            for collective in config.collectives:
                n = len(ranks)
                points = sweep_points(
                    collective, n, config.dtype.bytes, config.min_bytes, config.max_bytes, config.step_factor
                )
                for done, point in enumerate(points, 1):
                    buffers = Point(collective, point.count, n, r, ranks[0], dtype, device)
                    if config.check:
                        buffers.fill_pattern()
                        buffers.run(group)
                        wrong[index] = buffers.wrong_elements()
                        buffers.inp.zero_()
                    times[index] = time_point(buffers, group, config.warmup, config.iters, device)
                    del buffers
                    index += 1
                    if progress is not None:
                        progress.step(f"{collective.value} {kind.value} {n}", f"{done}/{len(points)} sizes")
    finally:
        if progress is not None:
            progress.close()

    # Rank 0 needs the slowest rank's time and every rank's wrong elements.
    reduce_device = device if config.backend == "nccl" else torch.device("cpu")
    times_d, wrong_d = times.to(reduce_device), wrong.to(reduce_device)
    dist.all_reduce(times_d, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrong_d, op=dist.ReduceOp.SUM)
    times, wrong = times_d.cpu(), wrong_d.cpu()
    del times_d, wrong_d
    if placement.rank != 0:
        return None
    dist_backend = dist.get_backend()
    return build_calibration(
        config,
        rows,
        times.tolist(),
        wrong.tolist(),
        backend=str(dist_backend),
        device=device_name(device),
        world_size=world,
        nodes=topo.nodes,
        ranks_per_node=topo.ranks_per_node or placement.local_world_size,
    )


def build_calibration(
    config: BenchConfig,
    rows: list[tuple[RankGroup, int, Collective, SweepPoint]],
    times: list[float],
    wrong: list[float],
    *,
    backend: str,
    device: str,
    world_size: int,
    nodes: int,
    ranks_per_node: int,
) -> Calibration:
    """Measurements (algbw/busbw through :mod:`zerocalc.network.collectives`) and one α/β fit per group
    kind."""
    measurements: list[Measurement] = []
    for (kind, n, collective, point), t, errors in zip(rows, times, wrong, strict=True):
        spec = COLLECTIVES[collective]
        measurements.append(
            Measurement(
                collective=collective,
                group_kind=kind,
                group_size=n,
                size_bytes=point.size_bytes,
                count=point.count,
                dtype=config.dtype.value,
                time_s=t,
                algbw_Bps=spec.algorithm_bandwidth(point.size_bytes, t) if t > 0 else 0.0,
                busbw_Bps=spec.bus_bandwidth(point.size_bytes, n, t) if t > 0 else 0.0,
                errors=int(errors) if config.check else None,
            )
        )
    fits: list[CollectiveFit] = []
    keys = list(dict.fromkeys((m.collective, m.group_kind, m.group_size) for m in measurements))
    for collective, kind, n in keys:
        mine = [
            m for m in measurements if (m.collective, m.group_kind, m.group_size) == (collective, kind, n)
        ]
        factor = float(COLLECTIVES[collective].bus_factor(n))
        ab = fit_alpha_beta([factor * m.size_bytes for m in mine], [m.time_s for m in mine])
        fits.append(
            CollectiveFit(
                collective=collective,
                group_kind=kind,
                group_size=n,
                latency_s=ab.latency_s,
                bus_bandwidth_Bps=ab.bus_bandwidth_Bps,
                peak_busbw_Bps=max(m.busbw_Bps for m in mine),
                points=len(mine),
                beta_from_peak=ab.beta_from_peak,
            )
        )
    return Calibration(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        backend=backend,
        device_name=device,
        torch_version=torch.__version__,
        nccl_version=nccl_version() if backend == "nccl" else None,
        world_size=world_size,
        nodes=nodes,
        gpus_per_node=ranks_per_node,
        dtype=config.dtype.value,
        measurements=measurements,
        fits=fits,
    )


def main(argv: list[str] | None = None) -> int:
    """A spawned rank: rank 0 hands its calibration back to the parent
    (:func:`zerocalc.harness.procs.spawn`)."""
    argv = sys.argv[1:] if argv is None else argv
    config = BenchConfig.model_validate_json(argv[0])

    def body() -> str | None:
        calibration = run(config)
        return None if calibration is None else calibration.model_dump_json()

    return procs.run_rank(body)


if __name__ == "__main__":
    procs.exit_now(main())
