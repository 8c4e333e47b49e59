"""Pipeline schedules: which layers each pipeline rank holds, the order its forwards and backwards run
in, how many micro-batches it holds in flight, and the bubble (pure).

Layers: L layers over p ranks and v model chunks per rank, L/(p·v) layers a chunk; chunk j of rank i
holds the layers of virtual stage j·p + i (Megatron-LM ``core/transformer/transformer_block.py``
``get_num_layers_to_build`` and ``core/transformer/transformer_layer.py``
``get_transformer_layer_offset``; torch.distributed.pipelining's interleaved schedules place stage
j·p + i on rank i, ``stage_index_to_group_rank``). The embedding is on the first virtual stage, the final
norm, the LM head and the loss on the last.

Uneven stages follow Megatron-LM's ``--decoder-first-pipeline-num-layers`` and
``--decoder-last-pipeline-num-layers`` (``num_layers_in_first_pipeline_stage`` /
``num_layers_in_last_pipeline_stage``): the first (last) rank holds the layers given, the others split
the rest evenly; each rank's v chunks hold a v-th of its layers each, and virtual stage j·p + i starts
after j·L/v layers and the chunks of ranks 0 … i − 1 (``get_transformer_layer_offset``). Megatron-LM's
``TransformerConfig.__post_init__`` requires the middle layers to divide over the middle ranks, each
rank's layers to divide by v, and middle ranks exactly when middle layers remain.

Any split: the layers of each of the p·v virtual stages in pipeline order (``--pp-stage-layers``), stage k
chunk k // p of rank k % p, as Megatron-LM's ``pipeline_model_parallel_layout`` lists its stages
(``core/transformer/pipeline_parallel_layer_layout.py``: entry ``vpp_rank·p + pp_rank``) and
torch.distributed.pipelining's looped schedules place them (``stage_index_to_group_rank``, ``loop``
style: stage k on rank k % p; torchtitan's ``pipeline_module_split``). Both frameworks accept a stage
without decoder layers (Megatron's layout an empty stage, torchtitan's weighted split a first stage of the
embedding alone); zerocalc models stages of at least one layer. The rules above are one case of it
(:func:`virtual_stage_layers`).

Order of one rank's passes in a step of m micro-batches (a pass: one chunk's forward or backward of one
micro-batch):

* GPipe: the m forwards, then the m backwards (Huang et al. 2019; torch ``ScheduleGPipe``);
* 1F1B: min(p − i − 1, m) forwards of warm-up, then one forward and one backward in turn, then the
  remaining backwards (Narayanan et al. 2021 §2.2, PipeDream-Flush; Megatron-LM ``core/pipeline_parallel/
  schedules.py`` ``forward_backward_pipelining_without_interleaving``; torch ``Schedule1F1B``);
* interleaved 1F1B: (p − i − 1)·2 + (v − 1)·p forward passes of warm-up (at most m·v), the passes taken
  from Megatron-LM's schedule table (``get_schedule_table``: groups of p micro-batches, each group
  through chunk 0, then chunk 1 …; backward passes through the chunks in reverse;
  ``forward_backward_pipelining_with_interleaving``, ``get_pp_rank_microbatches``; torch
  ``ScheduleInterleaved1F1B`` has the same warm-up);
* zero bubble (ZB-H1, Qi et al. 2023; torch ``ScheduleInterleavedZeroBubble``): the interleaved table
  with (v − 1)·p + (p − i − 1) forward passes of warm-up; a backward's weight-gradient half is taken
  with its input-gradient half (ZB-H1 keeps 1F1B's peak activation memory, Qi et al. §3.1).

In flight: a forward pass's saved activations live until its backward pass; the most forward passes
outstanding on a rank, counted in chunks, over v, is the micro-batches' worth of one stage's
activations it holds at its peak: min(p − i, m) under 1F1B, m under GPipe, and on the first rank of the
interleaved schedule p + (p − 1)/v = p·(1 + (p − 1)/(p·v)) (Korthikanti et al. 2022 §4.2.3; Narayanan et
al. 2021 §2.2.2).

Bubble: the idle fraction of a step's ideal time, (p − 1)/m, and (p − 1)/(v·m) interleaved (Narayanan
et al. 2021 §2.2.1–2.2.2); zero bubble ZB-H1 (p − 1)/(3·m) of it, for forward, input-gradient and
weight-gradient passes of equal time (Qi et al. 2023 §3.1). These formulas take stages of equal time;
with uneven stages the step waits for the slowest, and the bubble is the same fraction of the slowest
stage's compute (``zerocalc.comm.step``): each of the p − 1 fill and drain slots at its pace, an upper
bound of the Σ t_i − max t_i a flush of stages of times t_i leaves.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from itertools import accumulate
from typing import NamedTuple

from zerocalc.base.units import plural
from zerocalc.parallel.mesh import Mesh, PpSchedule


class Pass(NamedTuple):
    """One pass of a pipeline rank: a chunk's forward or backward of one micro-batch."""

    forward: bool
    chunk: int
    """The rank's model chunk, 0 … v − 1."""
    micro_batch: int


INTERLEAVED = (PpSchedule.INTERLEAVED_1F1B, PpSchedule.ZERO_BUBBLE)
"""The schedules that take their passes from the interleaved table (any v)."""


def boundary_elements(mesh: Mesh, micro_batch: int, seq_len: int, hidden: int) -> int:
    """Elements of the activation one stage sends the next per micro-batch, and of its gradient sent
    back: b·s·h, ÷ c under context parallelism (each rank holds s/c tokens), ÷ t under sequence
    parallelism (Megatron-LM ``forward_backward_pipelining_*``: ``tensor_shape[0] //= cp_size``, and
    ``//= tp_size`` under ``sequence_parallel``; torchtitan's stage outputs are sequence-sharded DTensors
    there too)."""
    tokens = micro_batch * seq_len // mesh.cp
    if mesh.sequence_parallel:
        tokens //= mesh.tp
    return tokens * hidden


def virtual_stage_layers(
    num_layers: int,
    pp: int,
    vpp: int,
    first: int | None = None,
    last: int | None = None,
    layers: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """The layers of each of the p·v virtual stages in pipeline order, stage k chunk k // p of rank k % p:
    ``layers`` where given (``--pp-stage-layers``); else rank i's n_i layers (``first`` on rank 0 and
    ``last`` on rank p − 1 where given, the rest split evenly over the others, Megatron-LM
    ``get_num_layers_to_build``; L/p each when neither is given) in v chunks of n_i/v. The one split rule
    every consumer reads; the split is assumed valid (:func:`split_problem`)."""
    if layers is not None:
        return layers
    fixed = {0: first, pp - 1: last}
    given = {rank: n for rank, n in fixed.items() if n is not None}
    middle_ranks = pp - len(given)
    middle = (num_layers - sum(given.values())) // middle_ranks if middle_ranks else 0
    ranks = [given.get(rank, middle) for rank in range(pp)]
    return tuple(ranks[stage % pp] // vpp for stage in range(pp * vpp))


def mesh_stage_layers(mesh: Mesh, num_layers: int) -> tuple[int, ...]:
    """:func:`virtual_stage_layers` of ``mesh``'s split of a model's L layers."""
    first, last = mesh.pp_first_stage_layers, mesh.pp_last_stage_layers
    return virtual_stage_layers(num_layers, mesh.pp, mesh.vpp, first, last, mesh.pp_stage_layers)


def stage_layer_counts(
    num_layers: int,
    pp: int,
    first: int | None = None,
    last: int | None = None,
    layers: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """The layers each of the p pipeline ranks holds: the sum of its virtual stages'
    (:func:`virtual_stage_layers`)."""
    vpp = 1 if layers is None else len(layers) // pp
    split = virtual_stage_layers(num_layers, pp, vpp, first, last, layers)
    return tuple(sum(split[rank::pp]) for rank in range(pp))


def split_problem(
    num_layers: int,
    pp: int,
    vpp: int,
    first: int | None,
    last: int | None,
    layers: tuple[int, ...] | None = None,
) -> str | None:
    """Why L layers do not split over p ranks of v chunks with ``first`` and ``last`` layers on the first
    and last rank (each None: an even share), in Megatron-LM's checks (``TransformerConfig.__post_init__``,
    "Uneven PP"), or as ``layers`` (each virtual stage's: p·v counts of at least one layer, summing to L);
    None when they do. The text names the values; the caller names the options."""
    if layers is not None:
        if len(layers) != pp * vpp:
            return f"{plural(len(layers), 'count')} given for {pp * vpp} virtual stages"
        if min(layers) < 1:
            return "a virtual stage holds no layer"
        if sum(layers) != num_layers:
            return f"the counts sum to {sum(layers)} layers, not {num_layers}"
        return None
    given = [n for n in (first, last) if n is not None]
    if not given:
        if num_layers % (pp * vpp):
            return f"{num_layers} layers do not split into {pp * vpp} equal chunks"
        return None
    rest = num_layers - sum(given)
    middle_ranks = pp - len(given)
    if rest < 0 or (rest == 0) != (middle_ranks == 0):
        return f"{plural(rest, 'layer')} left for {plural(middle_ranks, 'middle stage')}"
    if middle_ranks and rest % middle_ranks:
        return f"the {rest} remaining layers do not split evenly over {middle_ranks} middle stages"
    for n in (*given, *([rest // middle_ranks] if middle_ranks else [])):
        if n % vpp:
            return f"a stage's {n} layers do not split into {vpp} chunks"
    return None


def shorter_end_stages(num_layers: int, pp: int, vpp: int) -> int | None:
    """The layers of the first and of the last stage when L does not split into p·v equal chunks: the
    middle stages m each, the two end stages m − k each for the smallest k ≥ 1 that splits by
    :func:`split_problem` (L = p·m − 2k), as Llama 3 405B's 126 layers at PP 16 hold 7, 8 × 14, 7 (Dubey et
    al. 2024 §3.3.2: one layer fewer on the stages with the embedding and the loss). None when L splits
    evenly, p < 3, or no k splits."""
    if pp < 3 or num_layers % (pp * vpp) == 0:
        return None
    for middle in range(num_layers // pp + 1, num_layers):
        end = (num_layers - (pp - 2) * middle) // 2
        if end < 1:
            return None
        if end < middle and split_problem(num_layers, pp, vpp, end, end) is None:
            return end
    return None


def chunk_layers(
    num_layers: int,
    pp: int,
    vpp: int,
    rank: int,
    first: int | None = None,
    last: int | None = None,
    layers: tuple[int, ...] | None = None,
) -> tuple[range, ...]:
    """The global indices of the layers of each of ``rank``'s v chunks: chunk j holds virtual stage
    k = j·p + i, the next n_k layers after those of stages 0 … k − 1 (n_k: :func:`virtual_stage_layers`;
    Megatron-LM ``get_transformer_layer_offset`` and ``PipelineParallelLayerLayout.get_layer_offset``);
    [(j·p + i)·n, (j·p + i + 1)·n) with n = L/(p·v) on even stages."""
    split = virtual_stage_layers(num_layers, pp, vpp, first, last, layers)
    starts = [0, *accumulate(split)]
    return tuple(range(starts[stage], starts[stage + 1]) for stage in range(rank, pp * vpp, pp))


def warmup_passes(schedule: PpSchedule, pp: int, vpp: int, rank: int, micro_batches: int) -> int:
    """The forward passes rank ``rank`` runs before its first backward (its warm-up)."""
    total = micro_batches * vpp
    if schedule is PpSchedule.GPIPE:
        return total
    if schedule is PpSchedule.ONE_F_ONE_B:
        return min(pp - rank - 1, total)
    hops = pp - rank - 1
    if schedule is PpSchedule.INTERLEAVED_1F1B:
        return min(2 * hops + (vpp - 1) * pp, total)
    return min(hops + (vpp - 1) * pp, total)  # zero bubble: one pass per hop (torch's multiply_factor 1)


def _schedule_table(micro_batches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward pass, in order: groups of ``group`` micro-batches, each group
    through chunk 0, 1, … (Megatron-LM ``get_schedule_table``; the last group takes what is left)."""
    table: list[tuple[int, int]] = []
    for first in range(0, micro_batches, group):
        last = micro_batches if first + group >= micro_batches else first + group
        table += [(mb, chunk) for chunk in range(vpp) for mb in range(first, last)]
    return table


@lru_cache(maxsize=1024)
def rank_passes(schedule: PpSchedule, pp: int, vpp: int, rank: int, micro_batches: int) -> tuple[Pass, ...]:
    """Every pass of rank ``rank`` in a step of ``micro_batches``, in the order it runs them."""
    warmup = warmup_passes(schedule, pp, vpp, rank, micro_batches)
    if schedule in INTERLEAVED:
        table = _schedule_table(micro_batches, vpp, pp)
        forwards = [Pass(True, chunk, mb) for mb, chunk in table]
        backwards = [Pass(False, vpp - 1 - chunk, mb) for mb, chunk in table]
    else:
        forwards = [Pass(True, 0, mb) for mb in range(micro_batches)]
        backwards = [Pass(False, 0, mb) for mb in range(micro_batches)]
    passes = forwards[:warmup]
    steady = len(forwards) - warmup
    for k in range(steady):
        passes += [forwards[warmup + k], backwards[k]]
    return tuple(passes + backwards[steady:])


def passes_in_flight(passes: tuple[Pass, ...]) -> int:
    """The most forward passes whose backward has not yet run, over the order ``passes``."""
    outstanding = most = 0
    for one in passes:
        outstanding += 1 if one.forward else -1
        most = max(most, outstanding)
    return most


def in_flight(schedule: PpSchedule, pp: int, vpp: int, rank: int, micro_batches: int) -> Fraction:
    """Micro-batches' worth of one stage's activations rank ``rank`` holds at its peak: the chunks' forward
    passes in flight, over v."""
    return Fraction(passes_in_flight(rank_passes(schedule, pp, vpp, rank, micro_batches)), vpp)


def window(schedule: PpSchedule, pp: int, vpp: int, rank: int, micro_batches: int) -> int:
    """The micro-batches whose passes a simulation of rank ``rank`` runs: the fewest m' ≤ m whose schedule
    has the whole warm-up and one pass of the steady state, so the same passes in flight at its peak (the
    last m' of the step's m; the earlier ones leave only their gradients). GPipe holds every micro-batch;
    the interleaved table runs whole groups of p."""
    if schedule is PpSchedule.GPIPE:
        return micro_batches
    if schedule is PpSchedule.ONE_F_ONE_B:
        return min(pp - rank, micro_batches)
    uncapped = warmup_passes(schedule, pp, vpp, rank, 10**9)
    groups = -(-(uncapped + 1) // (vpp * pp))
    return min(micro_batches, groups * pp)


def bubble_fraction(schedule: PpSchedule, pp: int, vpp: int, micro_batches: int) -> Fraction:
    """The pipeline bubble over the ideal time of a step: (p − 1)/m; (p − 1)/(v·m) interleaved; ZB-H1 a
    third of its schedule's (Narayanan et al. 2021 §2.2; Qi et al. 2023 §3.1)."""
    if pp == 1:
        return Fraction(0)
    chunks = vpp if schedule in INTERLEAVED else 1
    bubble = Fraction(pp - 1, chunks * micro_batches)
    return bubble / 3 if schedule is PpSchedule.ZERO_BUBBLE else bubble
