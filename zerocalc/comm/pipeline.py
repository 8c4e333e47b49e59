"""Pipeline-parallel communication per optimizer step: the point-to-point sends between stages, the tied
embedding's gradient all-reduce, and the bubble (pure).

Per micro-batch, every boundary between consecutive virtual stages carries one send forward (the
activation, b·s·h elements, ÷ c under context parallelism, ÷ t under sequence parallelism:
:func:`~zerocalc.parallel.pipeline.boundary_elements`) and one back (its gradient, the same size), in the
compute dtype (Narayanan et al. 2021 §3.2; Megatron-LM ``core/pipeline_parallel/p2p_communication.py``;
torch.distributed.pipelining ``stage.py`` ``get_fwd_send_ops``/``get_bwd_send_ops``). Virtual stage k runs
on pipeline rank k mod p, so pipeline rank i sends to rank i + 1 (and rank p − 1 to rank 0, between a
chunk and the next, v − 1 times per micro-batch under interleaving): p·v − 1 boundaries a micro-batch.

A send's bytes go over the link between the two ranks, tp·cp·dp apart (:class:`~zerocalc.parallel.mesh.
Mesh`'s layout, pipeline stages outermost): inter-node when a pair of them sits on different nodes; its
time is α + S/β with that link's figures (a send's bus factor is 1: nccl-tests ``sendrecv``). Megatron-LM
overlaps them with compute only under interleaving (``overlap_p2p_comm``); the times here are the sends'
own.

A tied embedding held by the first and the last stage (Megatron-LM ``LanguageModule``) has its two
copies' gradients all-reduced over those two ranks once per step
(``core/distributed/finalize_model_grads.py`` ``_allreduce_word_embedding_grads``), V·h/t elements.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.model.architecture import head_tensors
from zerocalc.network.collectives import Collective
from zerocalc.network.links import BandwidthSource, LinkFigures
from zerocalc.network.schedule import Phase
from zerocalc.parallel.mesh import Mesh, PpSchedule
from zerocalc.parallel.pipeline import INTERLEAVED, boundary_elements, bubble_fraction
from zerocalc.request.training import TrainingRequest

BUBBLE_SOURCE: dict[PpSchedule, str] = {
    PpSchedule.GPIPE: "(p − 1)/m (Huang et al. 2019; Narayanan et al. 2021 §2.2.1)",
    PpSchedule.ONE_F_ONE_B: "(p − 1)/m (Narayanan et al. 2021 §2.2.1)",
    PpSchedule.INTERLEAVED_1F1B: "(p − 1)/(v·m) (Narayanan et al. 2021 §2.2.2)",
    PpSchedule.ZERO_BUBBLE: "(p − 1)/(3·v·m): ZB-H1 with forward, input- and weight-gradient passes of "
    "equal time (Qi et al. 2023 §3.1)",
}
"""Each schedule's bubble, as its source writes it (:func:`~zerocalc.parallel.pipeline.bubble_fraction`)."""


class PipelineLink(BaseModel):
    """The sends between pipeline rank ``stage`` and the next, per GPU per step."""

    stage: int = Field(description="the sending rank, forward; it receives the gradients back")
    next_stage: int = Field(description="stage + 1, or 0 from the last rank between chunks (interleaved)")
    ranks_apart: int = Field(description="tp·cp·dp: the distance between the two ranks of a pair")
    spans_nodes: bool = Field(description="a pair of them sits on different nodes")
    forward_sends: int = Field(description="activations sent per step: m per boundary this link carries")
    backward_sends: int = Field(description="gradients sent back per step, as many")
    bytes_per_direction: int = Field(description="per step: sends × message bytes, each way")
    latency_s: float
    bandwidth_Bps: float
    bandwidth_source: BandwidthSource
    time_s: float = Field(description="per step, both directions: sends × α + bytes / β")


class EmbeddingSync(BaseModel):
    """The tied embedding's gradient all-reduce between the first and the last stage."""

    op: Collective = Collective.ALL_REDUCE
    phase: Phase = Phase.BACKWARD
    elements: int = Field(description="V·h/t: the embedding's (tensor-parallel share of its) gradient")
    dtype: DType
    spans_nodes: bool
    bytes_per_gpu: int = Field(description="2(n − 1)/n · S with n = 2: S")
    time_s: float
    source: str


class PipelineComm(BaseModel):
    """What pipeline parallelism communicates per optimizer step, and its bubble."""

    pp: int
    vpp: int
    schedule: PpSchedule
    stage_layers: list[int] = Field(description="each pipeline rank's layers, first to last")
    micro_batches: int = Field(description="m: micro-batches per step (grad_accum)")
    message_elements: int = Field(description="b·s·h ÷ c (÷ t under sequence parallelism) per send")
    dtype: DType = Field(description="the compute dtype the activations and their gradients travel in")
    message_bytes: int
    boundaries: int = Field(description="p·v − 1 boundaries between virtual stages per micro-batch")
    links: list[PipelineLink] = Field(description="per pair of consecutive pipeline ranks that exchange")
    embedding_sync: EmbeddingSync | None = None
    busiest_rank: int = Field(description="the pipeline rank that sends the most per step")
    busiest_rank_calls: int = Field(description="its sends (and the embedding sync, on the first and last)")
    busiest_rank_bytes: int = Field(description="what it sends per step, both directions")
    busiest_rank_inter_node_bytes: int = Field(description="of which over the inter-node link")
    busiest_rank_time_s: float = Field(description="their time per step")
    bubble_fraction: float = Field(description="idle time over the ideal time of a step")
    bubble_source: str


def pair_spans_nodes(mesh: Mesh, stage: int, next_stage: int) -> bool:
    """Whether some rank of pipeline rank ``stage`` and its peer at ``next_stage`` (the same dp, cp and tp
    index, tp·cp·dp apart per stage) sit on different nodes."""
    apart = mesh.tp * mesh.cp * mesh.dp
    g = mesh.gpus_per_node
    low, high = sorted((stage, next_stage))
    if (high - low) * apart >= g:
        return True
    # pairs (low·apart + k, high·apart + k), k < apart: some crosses a node boundary if a multiple of g
    # lies in (low·apart + k, high·apart + k] for some k
    return (low * apart) // g != ((high + 1) * apart - 1) // g


def _link_time(sends: int, nbytes: int, figures: LinkFigures) -> float:
    return sends * figures.latency_s + nbytes / figures.bus_bandwidth_Bps


def pipeline_comm(request: TrainingRequest) -> PipelineComm | None:
    """The pipeline's sends per step, per pair of consecutive ranks, the tied embedding's gradient sync and
    the bubble; None without pipeline parallelism."""
    mesh = request.mesh
    arch = request.model.architecture
    if mesh.pp == 1 or arch is None:
        return None
    p, v, m = mesh.pp, mesh.vpp, request.grad_accum
    a = request.activations
    dtype = request.dtypes.activation
    elements = boundary_elements(mesh, a.micro_batch, a.seq_len, arch.hidden_size)
    message = elements * dtype.bytes
    chunks = v if mesh.pp_schedule in INTERLEAVED else 1
    # rank i → i + 1 carries chunks boundaries per micro-batch; rank p − 1 → 0 the chunks − 1 between chunks
    carried = [(i, i + 1, chunks) for i in range(p - 1)]
    if chunks > 1:
        carried.append((p - 1, 0, chunks - 1))
    links: list[PipelineLink] = []
    calls, sent, inter, times = [0] * p, [0] * p, [0] * p, [0.0] * p
    for stage, following, boundaries in carried:
        spans = pair_spans_nodes(mesh, stage, following)
        figures = request.links.inter_node if spans else request.links.intra_node
        sends = boundaries * m
        nbytes = sends * message
        link = PipelineLink(
            stage=stage,
            next_stage=following,
            ranks_apart=mesh.tp * mesh.cp * mesh.dp,
            spans_nodes=spans,
            forward_sends=sends,
            backward_sends=sends,
            bytes_per_direction=nbytes,
            latency_s=figures.latency_s,
            bandwidth_Bps=figures.bus_bandwidth_Bps,
            bandwidth_source=figures.source,
            time_s=2 * _link_time(sends, nbytes, figures),
        )
        links.append(link)
        for rank in (stage, following):  # the forward sender and the backward sender
            calls[rank] += sends
            sent[rank] += nbytes
            inter[rank] += nbytes if spans else 0
            times[rank] += _link_time(sends, nbytes, figures)
    sync = _embedding_sync(request)
    if sync is not None:
        for rank in (0, p - 1):
            calls[rank] += 1
            sent[rank] += sync.bytes_per_gpu
            inter[rank] += sync.bytes_per_gpu if sync.spans_nodes else 0
            times[rank] += sync.time_s
    busiest = max(range(p), key=lambda rank: (sent[rank], times[rank]))
    return PipelineComm(
        pp=p,
        vpp=v,
        schedule=mesh.pp_schedule,
        stage_layers=[stage.architecture.num_layers for stage in request.stages if stage.architecture],
        micro_batches=m,
        message_elements=elements,
        dtype=dtype,
        message_bytes=message,
        boundaries=p * chunks - 1,
        links=links,
        embedding_sync=sync,
        busiest_rank=busiest,
        busiest_rank_calls=calls[busiest],
        busiest_rank_bytes=sent[busiest],
        busiest_rank_inter_node_bytes=inter[busiest],
        busiest_rank_time_s=times[busiest],
        bubble_fraction=float(bubble_fraction(mesh.pp_schedule, p, v, m)),
        bubble_source=BUBBLE_SOURCE[mesh.pp_schedule],
    )


def _embedding_sync(request: TrainingRequest) -> EmbeddingSync | None:
    """A tied embedding's gradient all-reduce over the first and the last stage (Megatron-LM), if any."""
    mesh, arch = request.mesh, request.model.architecture
    if arch is None or not arch.tied_embeddings or not request.framework_record.pipeline_ties_embedding:
        return None
    head = request.stages[-1].architecture
    assert head is not None
    elements = next(t.numel for t in head_tensors(head) if t.module == "lm_head")
    dtype = request.dtypes.trained.reduce
    spans = pair_spans_nodes(mesh, 0, mesh.pp - 1)
    figures = request.links.inter_node if spans else request.links.intra_node
    nbytes = elements * dtype.bytes  # all_reduce over 2 ranks: 2(n − 1)/n · S = S
    return EmbeddingSync(
        elements=elements,
        dtype=dtype,
        spans_nodes=spans,
        bytes_per_gpu=nbytes,
        time_s=figures.latency_s + nbytes / figures.bus_bandwidth_Bps,
        source="Megatron-LM core/distributed/finalize_model_grads.py _allreduce_word_embedding_grads",
    )
