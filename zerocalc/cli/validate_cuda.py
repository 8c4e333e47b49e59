"""``zerocalc validate cuda``: real FSDP2 steps on this GPU, each phase's peak against the step timeline;
``--snapshot-out``: the measured and the predicted step as PyTorch memory snapshots; ``--time-steps``: whole
steps timed against the step time ``zerocalc comm`` predicts.

Thin: read the options, call :mod:`zerocalc.validate.cuda_step`, compare
(:func:`zerocalc.validate.phases.compare_phases`), render. torch is imported only once the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from zerocalc.base.errors import InputError
from zerocalc.cli.base import fail
from zerocalc.cli.measure_options import Measure
from zerocalc.cli.options import takes_measure, whole_number
from zerocalc.cli.validate_common import hf_config, require_torch, shape

if TYPE_CHECKING:
    from zerocalc.request.training import TrainingRequest
    from zerocalc.validate.step_timing import StepTiming


def predicted_snapshot_path(path: str) -> Path:
    """Where ``validate cuda --snapshot-out FILE`` puts the predicted snapshot: beside FILE, ``.predicted``
    before its suffix."""
    measured = Path(path)
    return measured.with_name(f"{measured.stem}.predicted{measured.suffix}")


@takes_measure(Measure.CUDA)
def cuda(values: dict[str, Any], given: frozenset[str]) -> None:
    """Each phase's peak of real FSDP2 steps on this GPU.

    Run FSDP2 steps of --model (a config.json) at world 1 (bf16 parameters, fp32 reduce: the recipe of the
    shared H100 measurements); compare each phase's peak with the step timeline (needs transformers)."""
    micro_batch, seq_len = shape(values)
    from zerocalc.harness import procs
    from zerocalc.validate.step_timing import MAX_TIMED_STEPS

    model, snapshot_out, json = values["model"], values["snapshot_out"], values["json"]
    time_steps = whole_number(values["time_steps"], "--time-steps")
    if time_steps is not None and not 1 <= time_steps <= MAX_TIMED_STEPS:
        raise InputError(
            f"--time-steps {procs.brief(time_steps)} is not accepted; "
            f"accepted: 1 to {MAX_TIMED_STEPS:,} steps"
        )
    if snapshot_out is not None:
        from zerocalc.base.atomic import unwritable
        from zerocalc.base.errors import shown

        if not Path(snapshot_out).name:
            raise InputError(
                f"--snapshot-out {shown(snapshot_out)} names no file; accepted: a file path to write"
            )
        for path in (snapshot_out, predicted_snapshot_path(snapshot_out)):
            why = unwritable(path)
            if why is not None:
                raise InputError(f"--snapshot-out {shown(str(path))} {why}; accepted: a file path to write")
    if model is None:
        raise InputError(
            "zerocalc validate cuda runs the model of --model; accepted: --model path/to/config.json (a "
            "Hugging Face config.json)"
        )
    name, config = hf_config(model, "cuda", on_cpu=False)
    require_torch()
    from zerocalc.validate import cuda_step

    device = cuda_step.cuda_device()
    if device is None:
        raise fail(
            "zerocalc validate cuda: no CUDA device is visible to torch here; accepted: a machine with a GPU"
        )
    require_torch(transformers="cuda")
    from zerocalc.parallel.strategies import StrategyName
    from zerocalc.peak.evaluate import evaluate_peak
    from zerocalc.request.training import parse_options
    from zerocalc.validate.phases import compare_phases

    gpu = _device_gpu_preset(*device)
    request = parse_options(
        model=model, gpus=1, framework="fsdp2", strategies="zero3", micro_batch=micro_batch, seq_len=seq_len,
        recompute="none", reduce_dtype="fp32", model_impl="hf", flash_attention=True, gpu=gpu, init="gpu",
    )  # fmt: skip
    peak = evaluate_peak(request).peak
    assert peak is not None
    (row,) = peak.strategies
    measured, recorded = cuda_step.run(
        config, micro_batch, seq_len, reshard=True, recompute=False, snapshot=snapshot_out is not None
    )
    report = compare_phases(row, measured)
    if snapshot_out is not None and recorded is not None:
        import pickle

        from zerocalc.base.atomic import write_bytes_atomic
        from zerocalc.peak.snapshot import predicted_snapshot

        predicted, _ = predicted_snapshot(request, StrategyName.ZERO3)
        beside = predicted_snapshot_path(snapshot_out)
        from zerocalc.base.errors import why_not

        for path, snapshot in ((Path(snapshot_out), recorded), (beside, predicted)):
            try:
                write_bytes_atomic(path, pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL))
            except OSError as exc:  # the paths were checked before the run: the disk changed
                raise fail(f"--snapshot-out {str(path)!r} cannot be written ({why_not(exc)})", 1) from None
        typer.echo(
            f"snapshots of the last step written: measured {snapshot_out}, predicted {beside}; draw each "
            "with python -m torch.cuda._memory_viz trace_plot FILE -o out.html",
            err=json,
        )
    timing = _timed(config, request, micro_batch, seq_len, time_steps) if time_steps else None
    if json:
        from zerocalc.cli.render import print_json

        print_json(report if timing is None else {"phases": report, "step_time": timing})
    else:
        from zerocalc.cli.render import Column, print_fitted

        lines = report.lines
        print_fitted(
            "line",
            [line.line for line in lines],
            [
                Column(header="predicted", cells=[f"{line.predicted:,}" for line in lines]),
                Column(header="measured", cells=[f"{line.measured:,}" for line in lines]),
                Column(header="diff", cells=[f"{line.relative:+.2%}" for line in lines]),
                Column(header="", cells=["✓" if line.ok else "✗ OFF" for line in lines], justify="left"),
            ],
            title=f"{name}: FSDP2 world 1, b={micro_batch} s={seq_len}, GPU preset {gpu}",
        )
        typer.echo(
            f"peak phase: predicted {report.predicted_phase.value}, measured {report.measured_phase.value}"
        )
        if timing is not None:
            typer.echo(
                f"step time: predicted {timing.predicted_s:.4f} s, measured {timing.measured_s:.4f} s "
                f"(median of {len(timing.step_seconds)} steps after {timing.warmup_steps} warm-up), "
                f"{timing.relative:+.1%} ({timing.compute_table} compute table)"
            )
    if not report.ok:
        raise typer.Exit(1)


def _timed(config: dict, request: TrainingRequest, micro_batch: int, seq_len: int, steps: int) -> StepTiming:
    """Time ``steps`` real steps of the recipe and predict the same configuration (``comm``'s step)."""
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate
    from zerocalc.request.compute import compute_table
    from zerocalc.validate import cuda_step
    from zerocalc.validate.step_timing import WARMUP_STEPS, step_timing

    assert request.gpu is not None
    table = compute_table(None, request.gpu.name)
    if table is None:
        raise fail(f"--time-steps: the GPU preset {request.gpu.name} has no compute table", 1)
    comm = evaluate_comm(request.model_copy(update={"estimate": Estimate.COMM}), table.table, table.name)
    step = comm.strategies[0].step
    assert step is not None
    seconds = cuda_step.timed_steps(config, micro_batch, seq_len, steps, WARMUP_STEPS)
    return step_timing(seconds, WARMUP_STEPS, step.step_s, table.name)


def _device_gpu_preset(device_name: str, total_bytes: int) -> str:
    """The GPU preset describing this device (its context and NCCL sizes make the predicted footprint)."""
    from zerocalc.request.presets import load_gpu, preset_names
    from zerocalc.validate.phases import PRESET_MATCH, matching_gpu_preset

    names = preset_names("gpus")
    usable = {n: load_gpu(n).usable_bytes for n in names}
    gpu = matching_gpu_preset(total_bytes, usable)
    if gpu is None:
        raise fail(
            f"zerocalc validate cuda: no GPU preset has the usable memory of this {device_name} "
            f"({total_bytes:,} bytes, ±{PRESET_MATCH:.0%}); accepted: a GPU among the presets "
            f"({', '.join(names)})"
        )
    return gpu
