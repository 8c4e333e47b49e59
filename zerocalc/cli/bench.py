"""``zerocalc bench``: measure collectives with torch.distributed and write a calibration for ``comm``
(``--compute``: :mod:`zerocalc.cli.bench_compute`).

Thin: check the options (their records: :mod:`zerocalc.cli.measure_options`; every bound, and the output
path, before any rank starts), run the world (in-process under torchrun/srun, else ranks spawned by
:func:`zerocalc.harness.procs.spawn`), then on rank 0 write the returned calibration atomically and render
it. torch is imported only once the command runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from zerocalc.base.errors import InputError, why_not
from zerocalc.bench.defaults import DEFAULT_MAX_BYTES_CPU, DEFAULT_MAX_BYTES_GPU
from zerocalc.cli.base import PlainTextCommand, app, fail
from zerocalc.cli.bench_files import check_out, default_out_folder, default_out_path
from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import seconds, takes_measure, whole_number

if TYPE_CHECKING:
    from zerocalc.bench.config import BenchConfig
    from zerocalc.network.calibration import Calibration
    from zerocalc.network.collectives import Collective

NEEDS_TORCH = "zerocalc bench needs PyTorch; install it with: pip install 'zerocalc[bench]'"


@app.command(cls=PlainTextCommand)
@takes_measure(Measure.BENCH)
def bench(values: dict[str, Any], given: frozenset[str]) -> None:
    """Measure all_reduce / reduce_scatter / all_gather (and more) and write a calibration for `comm`;
    with --compute, measure GEMMs, attention and memory bandwidth for the step time."""
    if importlib.util.find_spec("torch") is None:
        raise fail(NEEDS_TORCH)
    warmup = whole_number(values["warmup"], "--warmup")
    iters = whole_number(values["iters"], "--iters")
    assert warmup is not None and iters is not None
    out, dtype, json = values["out"], values["dtype"], values["json"]
    if values["compute"]:
        from zerocalc.cli.bench_compute import bench_compute

        if values["model"] is None:
            shaping = [n for n in ("micro_batch", "seq_len", "tp") if n in given]
            if shaping:
                flag = "--" + shaping[0].replace("_", "-")
                raise InputError(
                    f"{flag} sizes the shapes of --model; accepted: --compute --model NAME {flag} ..., "
                    f"or no {flag}"
                )
        shapes = (values["model"], values["micro_batch"], values["seq_len"], values["tp"])
        bench_compute(*shapes, dtype, warmup, iters, out, json)
        return
    from zerocalc.base.dtypes import DType, parse_dtype
    from zerocalc.base.units import parse_bytes
    from zerocalc.bench.config import check_iterations, check_sweep
    from zerocalc.bench.topology import launched_by, placement_from_env
    from zerocalc.harness import procs

    # What needs no torch is checked first, so bad input is refused at once.
    chosen = _parse_collectives(values["collectives"])
    dt = parse_dtype(dtype, "--dtype", (DType.BF16, DType.FP16, DType.FP32))
    check_iterations(warmup, iters)
    timeout = seconds(values["timeout"])
    smallest = parse_bytes(values["min_bytes"], "--min-bytes", bare_unit="B")
    max_bytes = values["max_bytes"]
    largest = parse_bytes(max_bytes, "--max-bytes", bare_unit="B") if max_bytes is not None else None
    step_factor = whole_number(values["step_factor"], "--step-factor")
    assert step_factor is not None
    check_sweep(smallest, largest if largest is not None else smallest, step_factor)
    nproc = whole_number(values["nproc"], "--nproc")
    if nproc is not None and nproc < 2:
        raise InputError(f"--nproc {procs.brief(nproc)} is not accepted; accepted: 2 or more processes")
    if out is not None and out.strip() == "":
        raise InputError(f"--out {out!r} is empty; accepted: a file path such as cal.json")
    launched = launched_by() is not None
    if not launched or placement_from_env().rank == 0:  # rank 0 alone writes
        check_out(Path(out) if out is not None else default_out_folder() / "calibration.json", out is None)

    gpus = _visible_gpus()
    chosen_backend = _parse_backend(values["backend"], gpus)
    if not launched:
        if nproc is None:
            nproc = gpus if chosen_backend == "nccl" else 2
        if nproc < 2:
            raise InputError(
                f"{gpus} GPU visible: a collective needs 2 or more ranks; accepted: a node with 2+ GPUs, "
                "or --backend gloo --nproc 2"
            )
        procs.check_nproc(nproc, gpus if chosen_backend == "nccl" else 0)
    if largest is None:
        largest = max(DEFAULT_MAX_BYTES_GPU if chosen_backend == "nccl" else DEFAULT_MAX_BYTES_CPU, smallest)
    from zerocalc.bench.config import BenchConfig

    config = BenchConfig(
        collectives=chosen,
        dtype=dt,
        min_bytes=smallest,
        max_bytes=largest,
        step_factor=step_factor,
        warmup=warmup,
        iters=iters,
        check=values["check"],
        backend=chosen_backend,
        timeout_s=timeout,
        out=out,
        json_output=json,
    )
    try:
        calibration = _measure(config, None if launched else nproc)
    except procs.RanksFailed as exc:
        raise fail(str(exc), exc.exit_code) from None
    except procs.RankStopped as exc:  # under torchrun: another rank says why
        raise typer.Exit(exc.code) from None
    except KeyboardInterrupt:  # every spawned rank has been stopped
        typer.echo(f"zerocalc: {procs.INTERRUPTED}", err=True)
        raise typer.Exit(procs.EXIT_INTERRUPTED) from None
    if calibration is not None:  # rank 0
        finish(config, calibration)


def _measure(config: BenchConfig, nproc: int | None) -> Calibration | None:
    """Rank 0's calibration: in-process under torchrun/srun (None on the other ranks), else collected
    from spawned ranks once the memory the sweep needs is known to fit (checked before any rank starts)."""
    from zerocalc.harness import procs

    if nproc is None:  # under torchrun/srun
        from zerocalc.bench import worker

        return worker.run(config)
    from zerocalc.bench.sweep import host_available_bytes, memory_problem
    from zerocalc.network.calibration import Calibration

    if config.backend == "gloo":
        problem = memory_problem(
            config.collectives,
            config.dtype.bytes,
            config.min_bytes,
            config.max_bytes,
            config.step_factor,
            nproc,
            host_available_bytes(),
            f"this node ({nproc} ranks)",
        )
        if problem:
            raise InputError(problem)
    return procs.spawn(
        "zerocalc.bench.worker",
        config.model_dump_json(),
        nproc,
        config.timeout_s,
        collect=Calibration.model_validate_json,
    )


def _parse_collectives(text: str) -> list[Collective]:
    from zerocalc.network.collectives import BENCHMARKED, parse_collective

    names = [t for t in (p.strip() for p in text.split(",")) if t]
    if not names:
        raise InputError("--collectives is empty; accepted: all or a comma list of " + _all_names())
    if names == ["all"]:
        return list(BENCHMARKED)
    chosen = list(dict.fromkeys(parse_collective(name) for name in names))
    for collective in chosen:
        if collective not in BENCHMARKED:
            raise InputError(
                f"--collectives {collective.value} is not measured by bench; "
                "accepted: all or a comma list of " + _all_names()
            )
    return chosen


def _all_names() -> str:
    from zerocalc.network.collectives import BENCHMARKED

    return ", ".join(c.value for c in BENCHMARKED)


def _visible_gpus() -> int:
    from zerocalc.bench.worker import visible_gpus

    return visible_gpus()


def _parse_backend(backend: str | None, gpus: int) -> str:
    if backend is None:
        return "nccl" if gpus > 0 else "gloo"
    key = backend.strip().lower()
    if key not in ("nccl", "gloo"):
        raise InputError(f"--backend {backend!r} is not accepted; accepted: nccl, gloo")
    if key == "nccl" and gpus == 0:
        raise InputError("--backend nccl needs a CUDA GPU, and none is visible; accepted: --backend gloo")
    return key


# ------------------------------------------------------------------------------------ rank 0: the output
def finish(config: BenchConfig, calibration: Calibration) -> None:
    """Rank 0, after the sweep: write the file atomically, then print the tables (or the JSON)."""
    from zerocalc.cli.render import console, print_json
    from zerocalc.network.calibration import save_calibration

    path = Path(config.out) if config.out else default_out_path(calibration)
    try:
        saved = save_calibration(calibration, path, parents=not config.out)
    except OSError as exc:  # the path was checked before the run: the disk or its permissions changed
        raise fail(f"--out {str(path)!r} cannot be written ({why_not(exc)})", 1) from None
    if config.json_output:
        print_json(calibration)
        typer.echo(f"calibration written to {saved}", err=True)
    else:
        render_calibration(calibration, config.check)
        console().print(f"calibration written to {saved}")


def render_calibration(calibration: Calibration, checked: bool) -> None:
    from zerocalc.base.units import plural
    from zerocalc.cli.render import Column, console, print_fitted
    from zerocalc.network.cluster import RankGroup
    from zerocalc.network.collectives import COLLECTIVES

    out = console()
    nccl = f", NCCL {calibration.nccl_version}" if calibration.nccl_version else ""
    out.print(
        f"[bold]zerocalc bench[/bold]: {calibration.backend} on {calibration.device_name}, world "
        f"{calibration.world_size} ({plural(calibration.nodes, 'node')} × "
        f"{plural(calibration.gpus_per_node, 'rank')}), "
        f"{calibration.dtype}, torch {calibration.torch_version}{nccl}"
    )
    for fit in calibration.fits:
        rows = [
            m
            for m in calibration.measurements
            if (m.collective, m.group_kind, m.group_size) == (fit.collective, fit.group_kind, fit.group_size)
        ]
        spec = COLLECTIVES[fit.collective]
        out.print(
            f"[bold]{fit.collective.value}[/bold], {fit.group_kind.value} groups of {fit.group_size} "
            f"(busbw = algbw × {spec.formula} = {float(spec.bus_factor(fit.group_size)):g})"
        )
        columns = [
            Column("count", [f"{m.count:,}" for m in rows]),
            Column("type", [m.dtype for m in rows]),
            Column("time\n(µs)", [f"{m.time_s * 1e6:,.1f}" for m in rows]),
            Column("algbw\n(GB/s)", [f"{m.algbw_Bps / 1e9:.3f}" for m in rows]),
            Column("busbw\n(GB/s)", [f"{m.busbw_Bps / 1e9:.3f}" for m in rows]),
        ]
        if checked:
            columns.append(
                Column("#wrong", [f"[red]{m.errors}[/red]" if m.errors else str(m.errors) for m in rows])
            )
        print_fitted("size (B)", [f"{m.size_bytes:,}" for m in rows], columns, key_width=13)
    out.print("[bold]Summary[/bold]: t = α + factor·S/β (least squares)")
    fits = calibration.fits
    print_fitted(
        "collective\ngroup (ranks)",
        [f"{f.collective.value}\n{f.group_kind.value} ({f.group_size})" for f in fits],
        [
            Column("α (µs)", [f"{f.latency_s * 1e6:,.1f}" for f in fits]),
            Column(
                "β\n(GB/s)",
                [f"{f.bus_bandwidth_Bps / 1e9:.3f}{'*' if f.beta_from_peak else ''}" for f in fits],
            ),
            Column("peak busbw\n(GB/s)", [f"{f.peak_busbw_Bps / 1e9:.3f}" for f in fits]),
            Column("points", [str(f.points) for f in fits]),
        ],
    )
    if any(f.beta_from_peak for f in fits):
        out.print(
            "[yellow]· * β is the peak busbw, not a fit: the least-squares slope was not positive (times "
            "that do not grow with size, or one point); a longer sweep (--max-bytes) fits it[/yellow]"
        )
    if checked:
        total = sum(m.errors or 0 for m in calibration.measurements)
        out.print(
            "[green]--check: no wrong elements[/green]"
            if total == 0
            else f"[red]--check: {total} wrong elements[/red]"
        )
    kinds = {f.group_kind for f in calibration.fits}
    if calibration.nodes > 1 and RankGroup.ACROSS_NODES not in kinds:
        out.print("[yellow]· nodes run different numbers of ranks: only the world was measured[/yellow]")
