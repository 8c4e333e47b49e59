"""The step time of one candidate (pure): compute from FLOPs, communication from ``comm``'s schedule with
the overlap each framework achieves, offload transfers and the CPU optimizer.

Compute. Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B): ``6·P + 12·L·H·Q·T`` — P the
parameters a token's matmuls use (active parameters for MoE; the input embedding is a lookup, not a
matmul, so it is left out, a tied LM head counted once), L layers, H·Q the attention width (heads × head
dim), T the sequence length; forward is a third of it. Recompute adds executed FLOPs that are not model
FLOPs: ``full`` one more forward (``2·P + 4·L·H·Q·T``), ``selective`` the attention core's forward
(``4·L·H·Q·T``, Korthikanti et al. 2022 §5) where it keeps s² tensors — with flash attention it keeps
none and recomputes nothing extra. Executed FLOPs run at ``mfu`` × the GPU's dense bf16 peak.

Communication. Each collective's time is ``comm``'s (:func:`zerocalc.comm.estimate.strategy_comm`: α per call
+ bytes
/ β, the calibration's fit or the preset's bandwidths). Overlap, per phase (exposed = max(0, comm −
compute the comm can hide behind), per micro-batch):

* forward all-gathers hide behind forward compute when the next unit is prefetched (FSDP's all-gather
  stream, Zhao et al. 2023 §3.3 / §5.1 "implicit prefetching"; DeepSpeed ZeRO-3's prefetch; the paper's
  ``--prefetch`` ≥ 1, ZeRO paper §7.2.2); with ``--prefetch 0`` they are exposed;
* backward all-gathers, reduce-scatters and DDP's bucketed all-reduces hide behind backward compute
  (Zhao et al. 2023 §3.3; Li et al. 2020, PyTorch DDP, §3.2.3) — except DeepSpeed ZeRO-1/2, whose
  ``overlap_comm`` defaults to false (DeepSpeed config docs): their reductions are exposed;
* collectives after ``optimizer.step()`` (ZeRO-1/2 parameter all-gathers, ZeroRedundancyOptimizer's
  broadcasts) are exposed.

A collective that runs once per step when A > 1 (gradients reduced on the last micro-batch) hides only
behind that micro-batch's compute. One call of each collective per micro-batch is never hidden: the first
unit's all-gather precedes all compute and the last unit's reduction follows it (Zhao et al. 2023, §3.3).

Offload (DeepSpeed ZeRO-Offload / ZeRO-Infinity), not overlapped (an upper bound; DeepSpeed overlaps part):
gradients to the host and updated 16-bit parameters back over PCIe, the CPU Adam step bound by host memory
bandwidth, NVMe reads and writes of the optimizer states, and offloaded parameters fetched twice per
micro-batch (forward and backward). The constants below are stated assumptions, not measurements.
"""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.comm.estimate import CollectiveRun, StrategyComm, times_per_step
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import Architecture, ParameterCount
from zerocalc.network.schedule import GradSync, Phase
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.strategies import OffloadTarget, StrategyName

PCIE_BPS = 25e9
"""Host ↔ GPU bytes/s per GPU: PCIe 4.0 ×16 achieves about 25 GB/s of its 32 GB/s (an assumption; PCIe 5.0
hosts reach about twice that)."""
NVME_BPS = 3.5e9
"""NVMe bytes/s per GPU: one PCIe 4.0 NVMe drive per GPU (ZeRO-Infinity, Rajbhandari et al. 2021, assumes
tens of GB/s per node from several drives); an assumption."""
HOST_MEMORY_BPS = 100e9
"""Host DRAM bytes/s per node available to the CPU optimizer (an assumption: two sockets of DDR4/DDR5)."""
CPU_ADAM_BYTES_PER_PARAM = 30
"""CPU Adam is memory-bound (ZeRO-Offload, Ren et al. 2021, §4.2 CPU-Adam): it reads the fp32 parameter,
gradient and two moments (16 B) and writes the parameter, the moments (12 B) and the 16-bit copy (2 B)."""


class Flops(NamedTuple):
    """Per token."""

    model: float
    """Model FLOPs (forward + backward), what MFU counts."""
    forward: float
    recompute: float
    """Executed on top of the model FLOPs, in backward."""


def flops_per_token(
    arch: Architecture, count: ParameterCount, seq_len: int, recompute: Recompute, flash: bool
) -> Flops:
    """PaLM's ``6·P + 12·L·H·Q·T`` per token, and what recompute adds (see the module's doc)."""
    matmul = count.active_per_token - count.embedding
    if arch.tied_embeddings:
        matmul += arch.vocab_size * arch.hidden_size  # the LM head's matmul reuses the embedding
    width = arch.num_heads * (arch.head_dim or arch.hidden_size // arch.num_heads)
    attention = 12.0 * arch.num_layers * width * seq_len
    model = 6.0 * matmul + attention
    forward = model / 3
    if recompute is Recompute.FULL:
        extra = forward
    elif recompute is Recompute.SELECTIVE and not flash:
        extra = attention / 3
    else:
        extra = 0.0
    return Flops(model=model, forward=forward, recompute=extra)


class StepTime(NamedTuple):
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    offload_s: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float


def _overlaps_backward(framework: Framework, strategy: StrategyName) -> bool:
    return not (framework is Framework.DEEPSPEED and strategy in (StrategyName.ZERO1, StrategyName.ZERO2))


class PhaseComm(NamedTuple):
    """One phase's communication at one A, as its exposed time reads it."""

    spread: float
    """Comm of the collectives that run on every micro-batch, spread evenly over the A micro-batches."""
    once: float
    """Comm of the collectives that run on the last micro-batch only."""
    call_spread: float
    """One call of each spread collective."""
    call_once: float
    """One call of each last-only collective."""


def _exposed(phase: PhaseComm, compute: float, accum: int, hides: bool) -> float:
    """Exposed time of one phase. Per micro-batch, at least one call is exposed (the first all-gather before
    any compute, the last reduction after it)."""
    spread, once, call_spread, call_once = phase
    if not hides:
        return spread + once
    per = compute / accum
    each = max(call_spread, spread / accum - per)
    last = max(call_spread + call_once, spread / accum + once - per)
    return (accum - 1) * each + last


def offload_seconds(
    params: int,
    world: int,
    ranks_per_node: int,
    optimizer_shards: int,
    offload_optimizer: OffloadTarget,
    offload_params: OffloadTarget,
    grad_accum: int,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> float:
    """Offload time per step per GPU (see the module's doc for what moves and the assumed rates)."""
    seconds = 0.0
    if offload_optimizer is not OffloadTarget.NONE:
        owned = params / optimizer_shards
        seconds += owned * (grad_bytes + param_bytes) / PCIE_BPS
        seconds += owned * ranks_per_node * CPU_ADAM_BYTES_PER_PARAM / HOST_MEMORY_BPS
        if offload_optimizer is OffloadTarget.NVME:
            seconds += 2 * owned * 12 / NVME_BPS  # fp32 parameter and moments read and written
    if offload_params is not OffloadTarget.NONE:
        rate = PCIE_BPS if offload_params is OffloadTarget.CPU else NVME_BPS
        seconds += grad_accum * 2 * (params / world) * param_bytes / rate
    return seconds


class CommLine(NamedTuple):
    """One collective of ``comm``'s schedule for one key (world, group, framework, strategy, reduce dtype,
    grad sync), with how its runs per step depend on A: ``times(A) = times_at_2 + slope·(A − 2)`` — every
    :class:`~zerocalc.network.schedule.Repeat` is affine in A (once: 1; per micro-batch: A; per sync: A or 1;
    after
    the first micro-batch: A − 1), so its runs at A = 2 and A = 3 give it exactly."""

    phase: Phase
    times_at_2: int
    slope: int
    calls_per_run: int
    run_s: float
    """One run's time (:attr:`zerocalc.comm.estimate.CollectiveRun.seconds`): calls × α + bytes / β."""

    def times(self, accum: int) -> int:
        return self.times_at_2 + self.slope * (accum - 2)


def comm_lines(collectives: list[CollectiveRun], sync: GradSync) -> tuple[CommLine, ...]:
    """The schedule's collectives (:func:`zerocalc.comm.estimate.collective_runs`), each with its runs per
    step at
    A = 2 and A = 3 (:func:`zerocalc.comm.estimate.times_per_step`); every one runs at A = 2."""
    lines = []
    for c in collectives:
        line = c.run.line
        at_2 = times_per_step(line.repeat, 2, sync)
        slope = times_per_step(line.repeat, 3, sync) - at_2
        lines.append(CommLine(line.phase, at_2, slope, c.traffic.calls.count, c.seconds))
    return tuple(lines)


def comm_of_lines(lines: tuple[CommLine, ...], accum: int) -> list[tuple[Phase, int, int, float]]:
    """(phase, times per step, calls per step, time_s) of each collective that runs at this A — the same
    floats as ``comm`` computes (``times × (calls × α + bytes / β)``)."""
    out = []
    for line in lines:
        times = line.times(accum)
        if times > 0:
            out.append((line.phase, times, times * line.calls_per_run, times * line.run_s))
    return out


_PHASES = tuple(Phase)
"""The phases, in order (iterating the enum itself costs more than the sums)."""


class CommTime(NamedTuple):
    """A schedule's communication at one A, as the step time reads it."""

    time_s: float
    """comm's ``time_s``: every collective's, summed in order."""
    forward: PhaseComm
    backward: PhaseComm
    after_step: PhaseComm


def comm_time(
    collectives: list[tuple[Phase, int, int, float]], accum: int, time_s: float | None = None
) -> CommTime:
    """The collectives' (phase, times per step, calls per step, time_s) summed per phase, and their total
    (``time_s``, when comm's is at hand)."""
    sums = {phase: [0.0, 0.0, 0.0, 0.0] for phase in _PHASES}
    total = 0  # as sum() starts
    for phase, times, calls, seconds in collectives:
        once = accum > 1 and times == 1
        phase_sums = sums[phase]
        phase_sums[1 if once else 0] += seconds
        phase_sums[3 if once else 2] += seconds / calls if calls else 0.0
        total += seconds
    return CommTime(
        total if time_s is None else time_s,
        PhaseComm(*sums[Phase.FORWARD]),
        PhaseComm(*sums[Phase.BACKWARD]),
        PhaseComm(*sums[Phase.AFTER_STEP]),
    )


def step_time(
    flops: Flops,
    tokens_per_gpu: int,
    grad_accum: int,
    peak_flops: float,
    mfu: float,
    comm: StrategyComm,
    framework: Framework,
    prefetch: int | None,
    offload_s: float,
) -> StepTime:
    """Compute + exposed communication + offload, for one GPU's share of the step."""
    collectives = [(c.phase, c.times_per_step, c.calls_per_step, c.time_s) for c in comm.collectives]
    at = (tokens_per_gpu, grad_accum, comm_time(collectives, grad_accum, comm.time_s), offload_s)
    return step_times(flops, peak_flops, mfu, comm.strategy, framework, prefetch, [at])[0]


def step_times(
    flops: Flops,
    peak_flops: float,
    mfu: float,
    strategy: StrategyName,
    framework: Framework,
    prefetch: int | None,
    steps: list[tuple[int, int, CommTime, float]],
) -> list[StepTime]:
    """:func:`step_time` of one configuration at each of ``steps``: (tokens per GPU, A, the communication's
    sums at that A (:func:`comm_time`), offload seconds)."""
    rate = peak_flops * mfu
    backward_flops = flops.model - flops.forward + flops.recompute
    hides_forward, hides_backward = prefetch != 0, _overlaps_backward(framework, strategy)
    times = []
    for tokens_per_gpu, grad_accum, comm, offload_s in steps:
        forward = tokens_per_gpu * flops.forward / rate
        backward = tokens_per_gpu * backward_flops / rate
        compute = forward + backward
        exposed = _exposed(comm.forward, forward, grad_accum, hides_forward)
        exposed += _exposed(comm.backward, backward, grad_accum, hides_backward)
        exposed += comm.after_step.spread + comm.after_step.once
        step = compute + exposed + offload_s
        achieved = tokens_per_gpu * flops.model / (step * peak_flops)
        times.append(
            StepTime(compute, comm.time_s, exposed, offload_s, step, tokens_per_gpu / step, achieved)
        )
    return times
