"""``zerocalc bench --compute``: measure what this process's device achieves on GEMMs, attention and
element-wise kernels, write the compute table (atomically) and print it. torch is imported only here."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from zerocalc.base.errors import InputError, why_not
from zerocalc.cli.base import fail
from zerocalc.cli.bench_files import check_out, compute_out_path

if TYPE_CHECKING:
    from zerocalc.bench.compute import AttentionShape, GemmShape
    from zerocalc.compute.table import ComputeTable


def _model_shapes(
    model: str, micro_batch: str, seq_len: str | None, tp: str
) -> tuple[list[GemmShape], list[AttentionShape]]:
    """The shapes one rank of ``model`` runs at b, s and t, as typed (the parser checks them as ``comm``
    does: they are comm's options)."""
    from zerocalc.bench.compute import model_shapes
    from zerocalc.comm.step import request_ops
    from zerocalc.parallel.frameworks import Estimate
    from zerocalc.request.training import parse_options

    request = parse_options(
        estimate=Estimate.COMM, model=model, gpus=tp, tp=tp, micro_batch=micro_batch, seq_len=seq_len
    )
    return model_shapes(request_ops(request))


def bench_compute(
    model: str | None,
    micro_batch: str,
    seq_len: str | None,
    tp: str,
    dtype: str,
    warmup: int,
    iters: int,
    out: str | None,
    json: bool,
) -> None:
    """Check every option (and the output path) first, measure, write, print."""
    from zerocalc.base.dtypes import DType, parse_dtype
    from zerocalc.bench.compute import BANDWIDTH_BYTES, MIN_SECONDS, ComputeBenchConfig, ladder
    from zerocalc.bench.config import check_iterations

    chosen = parse_dtype(dtype, "--dtype", (DType.BF16, DType.FP16, DType.FP32))
    check_iterations(warmup, iters)
    if out is not None and out.strip() == "":
        raise InputError(f"--out {out!r} is empty; accepted: a file path such as compute.json")
    if out is not None:
        check_out(Path(out), parents=False)
    extra_gemms, extra_attention = (
        ([], []) if model is None else _model_shapes(model, micro_batch, seq_len, tp)
    )

    from zerocalc.bench import compute_worker

    device = "cuda" if compute_worker.visible_device() else "cpu"
    gemms, attention = ladder(device)
    gemms = list(dict.fromkeys(gemms + extra_gemms))
    attention = list(dict.fromkeys(attention + extra_attention))
    dtypes = [chosen] + ([DType.FP8] if compute_worker.fp8_available(device) else [])
    shapes = (
        f"; the shapes of {model} at b {micro_batch}, s {seq_len or 'its default'}, tp {tp}" if model else ""
    )
    config = ComputeBenchConfig(
        device=device,
        dtypes=dtypes,
        gemms=gemms,
        attention=attention,
        bandwidth_bytes=list(BANDWIDTH_BYTES[device]),
        warmup=warmup,
        iters=iters,
        min_seconds=MIN_SECONDS[device],
        source=f"zerocalc bench --compute on {compute_worker.device_name(device)}{shapes}",
        out=out,
        json_output=json,
    )
    table = compute_worker.run(config)
    from zerocalc.compute.table import save_compute_table

    path = compute_out_path(out, table)
    try:
        saved = save_compute_table(table, path, parents=out is None)
    except OSError as exc:
        raise fail(f"--out {str(path)!r} cannot be written ({why_not(exc)})", 1) from None
    if json:
        import typer

        from zerocalc.cli.render import print_json

        print_json(table)
        typer.echo(f"compute table written to {saved}", err=True)
    else:
        from zerocalc.cli.render import console

        render_compute(table, [*extra_gemms], [*extra_attention])
        console().print(f"compute table written to {saved}")


def _rate(value: float) -> str:
    """Three significant figures at least (a CPU's rates are fractions of a TFLOP/s)."""
    return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"


def render_compute(table: ComputeTable, model_gemms: list, model_attention: list) -> None:
    """The table's points: the model's GEMMs (or the ladder's), attention, bandwidth."""
    from zerocalc.cli.render import Column, console, print_fitted

    out = console()
    out.print(
        f"[bold]zerocalc bench --compute[/bold]: {table.device_name} ({table.backend}), torch "
        f"{table.torch_version}, {datetime.now(UTC).date() if table.created_at is None else table.created_at}"
    )
    wanted = {tuple(g) for g in model_gemms}
    gemms = [g for g in table.gemm if (g.m, g.n, g.k) in wanted] or list(table.gemm)
    print_fitted(
        "GEMM m × n × k",
        [f"{g.m:,} × {g.n:,} × {g.k:,}" for g in gemms],
        [
            Column("dtype", [g.dtype.value for g in gemms]),
            Column("time\n(µs)", [f"{g.seconds * 1e6:,.1f}" for g in gemms]),
            Column("TFLOP/s", [_rate(g.tflops) for g in gemms]),
        ],
        key_width=22,
    )
    attention = list(table.attention)
    print_fitted(
        "attention\nb × heads × s × d",
        [f"{a.batch} × {a.heads} × {a.seq_q:,} × {a.head_dim}" for a in attention],
        [
            Column("fwd\nTFLOP/s", [_rate(a.forward_tflops) for a in attention]),
            Column("bwd\nTFLOP/s", [_rate(a.backward_tflops) for a in attention]),
        ],
        key_width=22,
    )
    memory = list(table.memory)
    print_fitted(
        "element-wise\nbytes moved",
        [f"{m.bytes:,}" for m in memory],
        [Column("GB/s", [_rate(m.bytes_per_s / 1e9) for m in memory])],
        key_width=16,
    )
    out.print(
        "[dim]· attention: SDPA, causal, executed FLOPs (the masked half skipped; backward 2.5 × forward); "
        "element-wise: torch.mul(x, 2, out=y) in bf16, bytes read + written[/dim]"
    )
