"""The library's entry points: keywords as the CLI spells them → one parsed request → the core.

Each function parses its keywords once into a :class:`~zerocalc.request.training.TrainingRequest`
(:func:`~zerocalc.request.training.parse_request`) and hands it to the pure core; they raise
:class:`~zerocalc.base.errors.InputError` for bad input (its message names the keyword).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import keyword, with_names
from zerocalc.request.training import parse_options

if TYPE_CHECKING:
    from zerocalc.comm.estimate import CommEstimate
    from zerocalc.network.calibration import Calibration
    from zerocalc.peak.report import MemoryReport
    from zerocalc.states.memory import MemoryEstimate


def estimate_memory(
    params: int | str | None = None,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    *,
    model: str | dict[str, Any] | None = None,
    strategies: str | list[str] | None = None,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    fp32_grad_accum: bool = False,
    offload_optimizer: str | None = None,
    offload_params: str | None = None,
    gpu_memory: int | str | None = None,
    gpu: str | None = None,
    reserve: int | str | None = None,
) -> MemoryEstimate:
    """Per-GPU model-state bytes for each strategy (the ZeRO paper's accounting).

    ``params`` takes the CLI's spellings (``"7B"``, ``6_738_415_616``), or ``model`` a preset name or a
    Hugging Face config.json path; ``strategies`` ``"all"``, a comma list or a list of names (FSDP names are
    aliases); ``gpu`` a GPU preset (or ``gpu_memory``, what PyTorch sees of one GPU) whose memory less the
    context outside the caching allocator (``reserve``) gives the fits column.
    """
    from zerocalc.states.memory import evaluate_memory

    request = parse_options(
        params=params,
        model=model,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        strategies=strategies,
        precision=precision,
        optimizer=optimizer,
        fp32_grad_accum=fp32_grad_accum,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        gpu_memory=gpu_memory,
        gpu=gpu,
        reserve=reserve,
    )
    return with_names(evaluate_memory(request), keyword)


def estimate_peak(
    model: str | dict[str, Any],
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    *,
    strategies: str | list[str] | None = None,
    framework: str = "paper",
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    fp32_grad_accum: bool = False,
    offload_optimizer: str | None = None,
    offload_params: str | None = None,
    gpu_memory: int | str | None = None,
    gpu: str | None = None,
    reserve: int | str | None = None,
    seq_len: int | str = 2048,
    micro_batch: int | str = 1,
    recompute: str = "none",
    flash_attention: bool | None = None,
    prefetch: int | str = 1,
    wrap: str = "block",
    ddp_bucket: int | str = "25MiB",
    reduce_bucket: int | str = "5e8",
    allgather_bucket: int | str = "5e8",
    reduce_dtype: str | None = None,
    model_impl: str = "hf",
    optimizer_impl: str = "foreach",
    grad_accum: int | str = 1,
    grad_sync: str | None = None,
    zeropp: str | None = None,
    expandable_segments: bool = False,
) -> MemoryReport:
    """Model states and the peak of one training step per strategy, for a model preset, a config.json path
    or a parsed one (``AutoConfig.from_pretrained(name).to_dict()``).

    The keywords are :func:`estimate_memory`'s and the peak's (``zerocalc memory --model``'s options);
    ``reserve`` overrides what the process holds outside the caching allocator (the GPU preset's measured
    context); ``grad_sync`` ``every`` or ``last`` micro-batch of ``grad_accum``; ``zeropp`` DeepSpeed ZeRO++
    features (hpZ's secondary partition is a line of the deepspeed profile's ZeRO-3).
    """
    from zerocalc.peak.evaluate import evaluate_peak

    request = parse_options(
        model=model,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        strategies=strategies,
        framework=framework,
        precision=precision,
        optimizer=optimizer,
        fp32_grad_accum=fp32_grad_accum,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        gpu_memory=gpu_memory,
        gpu=gpu,
        reserve=reserve,
        seq_len=seq_len,
        micro_batch=micro_batch,
        recompute=recompute,
        flash_attention=flash_attention,
        prefetch=prefetch,
        wrap=wrap,
        ddp_bucket=ddp_bucket,
        reduce_bucket=reduce_bucket,
        allgather_bucket=allgather_bucket,
        reduce_dtype=reduce_dtype,
        model_impl=model_impl,
        optimizer_impl=optimizer_impl,
        grad_accum=grad_accum,
        grad_sync=grad_sync,
        zeropp=zeropp,
        expandable_segments=expandable_segments,
    )
    return with_names(evaluate_peak(request), keyword)


def estimate_comm(
    params: int | str | None = None,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    *,
    model: str | dict[str, Any] | None = None,
    gpu: str | None = None,
    strategies: str | list[str] | None = None,
    framework: str = "paper",
    precision: str = "bf16-mixed",
    grad_accum: int | str = 1,
    grad_sync: str | None = None,
    reduce_dtype: str | None = None,
    zeropp: str | None = None,
    ddp_bucket: int | str | None = None,
    reduce_bucket: int | str = "5e8",
    calibration: Calibration | str | None = None,
    calibration_name: str | None = None,
    intra_node_bw: str | float | None = None,
    inter_node_bw: str | float | None = None,
    latency: float | str | None = None,
    tokens_per_step: int | str | None = None,
    tflops: float | str | None = None,
) -> CommEstimate:
    """Per-GPU bytes and time of every collective of each strategy, per optimizer step.

    ``model`` (a preset or config.json) may replace ``params`` (and gives the real units, buckets and
    calls); ``framework`` whose schedule (``paper``, ``deepspeed``, ``megatron``, ``fsdp``, ``fsdp2``,
    ``torch-zero1``, ``ddp``); ``grad_sync`` ``every`` or ``last`` micro-batch; ``zeropp`` DeepSpeed ZeRO++
    features; ``gpu`` (a GPU preset) supplies default bandwidths, which explicit
    ``intra_node_bw``/``inter_node_bw`` and a calibration (an object, or the path of a file ``zerocalc
    bench`` wrote) override.
    """
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.parallel.frameworks import Estimate

    request = parse_options(
        estimate=Estimate.COMM,
        params=params,
        model=model,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        strategies=strategies,
        framework=framework,
        precision=precision,
        grad_accum=grad_accum,
        grad_sync=grad_sync,
        reduce_dtype=reduce_dtype,
        zeropp=zeropp,
        ddp_bucket=ddp_bucket,
        reduce_bucket=reduce_bucket,
        calibration=calibration,
        calibration_name=calibration_name,
        intra_node_bw=intra_node_bw,
        inter_node_bw=inter_node_bw,
        latency=latency,
        tokens_per_step=tokens_per_step,
        tflops=tflops,
    )
    return with_names(evaluate_comm(request), keyword)
