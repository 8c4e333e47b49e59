"""Pipeline parallelism: the schedules' order and micro-batches in flight, each stage's parameters and
activations, the point-to-point sends and the bubble, against hand calculations."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_comm, estimate_peak
from zerocalc.cli import app
from zerocalc.comm.pipeline import pair_spans_nodes
from zerocalc.model.architecture import Architecture, MlpKind, NormKind, count_parameters, pipeline_stage
from zerocalc.parallel.mesh import Mesh, PpSchedule
from zerocalc.parallel.pipeline import (
    Pass,
    _schedule_table,
    bubble_fraction,
    chunk_layers,
    in_flight,
    rank_passes,
    shorter_end_stages,
    split_problem,
    stage_layer_counts,
    virtual_stage_layers,
    window,
)
from zerocalc.peak.kinds import TensorKind
from zerocalc.request.training import parse_options
from zerocalc.states.memory import mesh_assumption

runner = CliRunner()
GPIPE, ONE_F_ONE_B = PpSchedule.GPIPE, PpSchedule.ONE_F_ONE_B
INTERLEAVED, ZERO_BUBBLE = PpSchedule.INTERLEAVED_1F1B, PpSchedule.ZERO_BUBBLE


# ------------------------------------------------------------------------------------------ schedules
def test_chunks_hold_the_virtual_stages_of_their_rank() -> None:
    # L 32 over p 4, v 2: 4 layers a chunk; rank 1 holds virtual stages 1 and 5
    assert chunk_layers(32, 4, 2, 1) == (range(4, 8), range(20, 24))
    assert chunk_layers(32, 4, 1, 3) == (range(24, 32),)


def test_megatron_schedule_table() -> None:
    # Megatron-LM schedules.py, the comment of forward_backward_pipelining_with_interleaving: PP2 N3 M5 VP2
    table = _schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [chunk for _, chunk in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_interleaved_passes_of_the_first_rank() -> None:
    # p 2, v 2, m 4, rank 0: warm-up (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forward passes, then F/B pairs; the
    # backward passes go through the chunks in reverse (chunk 1 of micro-batches 0 and 1 first)
    f, b = (lambda c, mb: Pass(True, c, mb)), (lambda c, mb: Pass(False, c, mb))
    assert rank_passes(INTERLEAVED, 2, 2, 0, 4) == (
        f(0, 0), f(0, 1), f(1, 0), f(1, 1),
        f(0, 2), b(1, 0), f(0, 3), b(1, 1), f(1, 2), b(0, 0), f(1, 3), b(0, 1),
        b(1, 2), b(1, 3), b(0, 2), b(0, 3),
    )  # fmt: skip


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 64])
def test_1f1b_and_gpipe_in_flight(m: int) -> None:
    for rank in range(4):
        assert in_flight(ONE_F_ONE_B, 4, 1, rank, m) == min(4 - rank, m)  # Narayanan et al. 2021 §2.2
        assert in_flight(ZERO_BUBBLE, 4, 1, rank, m) == min(4 - rank, m)  # ZB-H1 holds what 1F1B holds
        assert in_flight(GPIPE, 4, 1, rank, m) == m


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 4), (8, 2), (8, 3), (16, 2)])
def test_interleaved_first_rank_holds_the_closed_form(p: int, v: int) -> None:
    # Korthikanti et al. 2022 §4.2.3: p·(1 + (p − 1)/(p·v)) micro-batches of a stage's activations, from
    # Megatron's warm-up (p − 1)·2 + (v − 1)·p forward passes plus the steady state's one
    for m in (2 * p, 4 * p):
        assert in_flight(INTERLEAVED, p, v, 0, m) == p * (1 + Fraction(p - 1, p * v))
        for rank in range(p):
            assert in_flight(INTERLEAVED, p, v, rank, m) == Fraction(2 * (p - rank - 1) + (v - 1) * p + 1, v)
    # m = p: the warm-up takes every pass (Megatron caps it at m·v): all p micro-batches at once
    assert in_flight(INTERLEAVED, p, v, 0, p) == p


@pytest.mark.parametrize("schedule", list(PpSchedule))
def test_simulated_window_holds_what_the_step_holds(schedule: PpSchedule) -> None:
    v = 1 if schedule in (GPIPE, ONE_F_ONE_B) else 3
    for rank in range(4):
        m = window(schedule, 4, v, rank, 32)
        assert m <= 32 and (schedule is GPIPE) == (m == 32)
        assert in_flight(schedule, 4, v, rank, m) == in_flight(schedule, 4, v, rank, 32)


def test_bubble() -> None:
    # Narayanan et al. 2021 §2.2: (p − 1)/m, interleaved (p − 1)/(v·m); ZB-H1 a third (Qi et al. 2023)
    assert bubble_fraction(ONE_F_ONE_B, 4, 1, 8) == Fraction(3, 8)
    assert bubble_fraction(GPIPE, 8, 1, 32) == Fraction(7, 32)
    assert bubble_fraction(INTERLEAVED, 4, 2, 8) == Fraction(3, 16)
    assert bubble_fraction(ZERO_BUBBLE, 4, 1, 8) == Fraction(1, 8)
    assert bubble_fraction(ONE_F_ONE_B, 1, 1, 8) == 0


# ------------------------------------------------------------------------------------- stage parameters
LLAMA3_8B_LAYER = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096
"""q and o h², k and v h·(kv·d_h), gate/up/down h·f, two RMSNorms."""


def test_llama_3_8b_stages() -> None:
    assert LLAMA3_8B_LAYER == 218_112_000
    embedding = 128256 * 4096
    request = parse_options(model="llama-3-8b", gpus=8, pp=4, grad_accum=8)
    params = [stage.params for stage in request.stages]
    assert params == [
        8 * LLAMA3_8B_LAYER + embedding,  # the embedding on the first
        8 * LLAMA3_8B_LAYER,
        8 * LLAMA3_8B_LAYER,
        8 * LLAMA3_8B_LAYER + 4096 + embedding,  # the final norm and the (untied) LM head on the last
    ]
    assert sum(params) == request.model.params
    assert request.rank_model == request.stages[3]  # the largest: model states and DP communication


def test_gpt2_stages_hold_the_tied_head_twice() -> None:
    # h 768, V 50,257, 1,024 learned positions; a block 12h² + 13h; the last stage's LM head is a weight
    # of its own (Megatron's output_layer on the last stage), so the stages hold V·h more than the model
    h, V = 768, 50257
    block = 12 * h * h + 13 * h
    request = parse_options(model="gpt2", gpus=2, pp=2)
    assert [stage.params for stage in request.stages] == [
        V * h + 1024 * h + 6 * block,
        6 * block + 2 * h + V * h,
    ]
    assert sum(s.params for s in request.stages) == request.model.params + V * h


def test_llama_3_70b_stages_per_tensor_parallel_rank() -> None:
    # h 8192, 64 heads of 128, 8 KV heads, f 28,672, V 128,256 padded to a multiple of 128·8 = 129,024;
    # per TP rank of 8: the projections split 8 ways, the norms whole; 80 layers over p 4: 20 a stage
    h, f = 8192, 28672
    layer = (2 * h * h + 2 * h * 1024 + 3 * h * f) // 8 + 2 * h
    vocab = 129024 // 8 * h
    request = parse_options(model="llama-3-70b", gpus=64, tp=8, pp=4, framework="megatron")
    assert [s.params for s in request.stages] == [
        20 * layer + vocab,
        20 * layer,
        20 * layer,
        20 * layer + h + vocab,
    ]
    assert request.stages[3].params == 2_271_551_488
    # p 8, v 2: 5 layers a chunk, rank 3 holds layers 15–19 and 55–59
    interleaved = parse_options(
        model="llama-3-70b", gpus=64, tp=8, pp=8, vpp=2, framework="megatron", grad_accum=16
    )
    arch = interleaved.stages[3].architecture
    assert arch.global_layers == (15, 16, 17, 18, 19, 55, 56, 57, 58, 59)  # type: ignore[union-attr]
    assert [s.params for s in interleaved.stages[1:-1]] == [10 * layer] * 6


GPT3_LAYER_TP8 = 12 * 12288**2 // 8 + 7 * 12288 // 8 + 6 * 12288
"""GPT-3 175B per TP rank of 8 (tests/parallel/test_mesh.py): 12h²/8 + 7h/8 + 6h."""


def test_gpt3_175b_stages_with_virtual_stages() -> None:
    # 96 layers over p 8, v 2: 6 layers a chunk, 12 a rank; the tied embedding 51,200/8 × h on the first
    # and, as the LM head's own weight, on the last; learned positions (2,048·h) on the first
    h = 12288
    vocab = 51200 // 8 * h
    request = parse_options(
        model="gpt3-175b", gpus=64, tp=8, pp=8, vpp=2, framework="megatron", model_impl="megatron",
        sequence_parallel=True, grad_accum=16,
    )  # fmt: skip
    params = [s.params for s in request.stages]
    assert params[0] == 12 * GPT3_LAYER_TP8 + vocab + 2048 * h
    assert params[1:7] == [12 * GPT3_LAYER_TP8] * 6
    assert params[7] == 12 * GPT3_LAYER_TP8 + 2 * h + vocab


def test_a_stage_of_dense_layers_of_a_mixture_of_experts() -> None:
    moe = Architecture(
        name="tiny-moe", vocab_size=1000, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=32,
        mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM, num_experts=8, experts_per_token=2, dense_layers=(0, 1),
        dense_intermediate_size=256,
    )  # fmt: skip
    first = pipeline_stage(moe, 2, 1, 0, (0, 1))
    second = pipeline_stage(moe, 2, 1, 1, (2, 3))
    assert not first.is_moe and first.intermediate_size == 256  # a dense model of the dense layers' width
    assert second.is_moe and second.dense_layers == ()
    whole = count_parameters(moe)
    # the same layers, the tied head aside (untied: no tie here)
    assert count_parameters(first).total + count_parameters(second).total == whole.total


# ------------------------------------------------------------------------------ activations in flight
S, H, A = 2048, 12288, 96
KORTHIKANTI_LAYER = S * H * (34 + 5 * A * S // H)
"""Korthikanti et al. 2022 Table 2, no parallelism, b = 1: s·b·h·(34 + 5·a·s/h) bytes a layer (16-bit)."""
HIDDEN = 2 * S * H
"""One layer's input or output, b·s·h in bf16: what a stage receives and sends per micro-batch."""
RECEIVING_LAYER = KORTHIKANTI_LAYER - HIDDEN
"""Megatron-LM: a chunk's first layer saves its input (its LayerNorm's), which is the activation the stage
received and keeps for its gradient: counted once, as the received activation."""


def _gpt3_stages(**options: object) -> list:
    report = estimate_peak(
        "gpt3-175b", 32, framework="megatron", model_impl="megatron", strategies="zero1",
        flash_attention=False, seq_len=S, **options,
    )  # fmt: skip
    return report.peak.strategies[0].stages  # type: ignore[union-attr]


def test_1f1b_stage_holds_p_minus_i_micro_batches() -> None:
    # 96 layers over 4 stages; a middle stage's peak is at the end of its warm-up: p − i micro-batches'
    # saved activations of its 24 layers, the last layer's output not yet sent (Megatron frees it once
    # sent), and one received activation per micro-batch in flight
    stages = _gpt3_stages(pp=4, grad_accum=8)
    for stage in stages[1:3]:
        k = 4 - stage.stage
        assert stage.in_flight == k
        assert stage.term(TensorKind.ACTIVATIONS) == k * (23 * KORTHIKANTI_LAYER + RECEIVING_LAYER) + HIDDEN
        assert stage.term(TensorKind.PIPELINE) == k * HIDDEN
    assert [s.in_flight for s in stages] == [4, 3, 2, 1]
    worst = estimate_peak(
        "gpt3-175b",
        32,
        pp=4,
        grad_accum=8,
        framework="megatron",
        model_impl="megatron",
        strategies="zero1",
        flash_attention=False,
    ).peak.strategies[0]  # type: ignore[union-attr]
    assert worst.stage == max(range(4), key=lambda i: stages[i].peak_bytes)
    assert worst.peak_bytes == max(s.peak_bytes for s in stages)


def test_interleaved_stage_holds_its_forward_passes_in_flight() -> None:
    # p 4, v 2: 12 layers a chunk; rank 1 holds 2·(4 − 1 − 1) + (2 − 1)·4 + 1 = 9 chunks' passes
    stages = _gpt3_stages(pp=4, vpp=2, grad_accum=8)
    rank = stages[1]
    assert rank.in_flight == 4.5
    assert rank.term(TensorKind.ACTIVATIONS) == 9 * (11 * KORTHIKANTI_LAYER + RECEIVING_LAYER) + HIDDEN
    assert rank.term(TensorKind.PIPELINE) == 9 * HIDDEN
    assert rank.layers == [[12, 23], [60, 71]]


def test_gpipe_holds_every_micro_batch() -> None:
    stages = _gpt3_stages(pp=4, grad_accum=6, pp_schedule="gpipe")
    middle = stages[2]
    assert middle.in_flight == 6
    assert middle.term(TensorKind.ACTIVATIONS) == 6 * (23 * KORTHIKANTI_LAYER + RECEIVING_LAYER) + HIDDEN


def test_fsdp2_stage_keeps_its_gradients_whole_until_the_last_backward() -> None:
    # torch.distributed.pipelining: no reduction until the last micro-batch's backward; with micro-batches
    # before the simulated ones, each unit's bf16 gradients are resident whole: stage 0 of llama-3-8b over
    # 2 stages (dp 2) holds 16 blocks and the embedding. torch keeps each stage output until its backward:
    # two of them in flight, and the gradient received from stage 1
    report = estimate_peak("llama-3-8b", 4, framework="fsdp2", strategies="zero3", pp=2, grad_accum=8)
    stage = report.peak.strategies[0].stages[0]  # type: ignore[union-attr]
    assert stage.in_flight == 2 and stage.peak_phase.value == "backward"
    assert stage.term(TensorKind.GRADIENTS) == 2 * (16 * LLAMA3_8B_LAYER + 128256 * 4096)
    assert stage.term(TensorKind.PIPELINE) == 3 * 2 * 2048 * 4096


# ------------------------------------------------------------------------------------- communication
def test_pair_spans_nodes_from_the_layout() -> None:
    # tp 2 × dp 2: stages 4 ranks apart on nodes of 8: 0→1 within a node, 1→2 across, 2→3 within
    mesh = Mesh(world=16, gpus_per_node=8, tp=2, pp=4)
    assert [pair_spans_nodes(mesh, i, i + 1) for i in range(3)] == [False, True, False]
    assert pair_spans_nodes(Mesh(world=32, gpus_per_node=8, tp=8, pp=4), 0, 1)  # 8 apart: always


def test_p2p_sends_of_llama_3_8b() -> None:
    # b·s·h = 2048 × 4096 bf16 elements a send (16 MiB); m = 8 sends a link each way; a middle rank sends
    # its activations forward and its gradients back: 16 sends, 256 MiB
    estimate = estimate_comm(model="llama-3-8b", gpus=32, pp=4, grad_accum=8, framework="megatron")
    pipeline = estimate.pipeline
    assert pipeline is not None
    assert pipeline.message_elements == 2048 * 4096 and pipeline.message_bytes == 16 * 2**20
    assert [(link.stage, link.next_stage, link.forward_sends) for link in pipeline.links] == [
        (0, 1, 8), (1, 2, 8), (2, 3, 8),
    ]  # fmt: skip
    assert all(link.bytes_per_direction == 8 * 16 * 2**20 and link.spans_nodes for link in pipeline.links)
    assert pipeline.busiest_rank_bytes == 16 * 16 * 2**20
    assert pipeline.bubble_fraction == 3 / 8
    assert pipeline.embedding_sync is None  # untied
    # the pipeline as a dimension of each strategy: the busiest rank's sends, tp·cp·dp = 8 ranks apart
    (pp,) = [d for d in estimate.strategies[0].dimensions if d.dimension.value == "pp"]
    assert (pp.group_size, pp.stride, pp.calls_per_step) == (4, 8, 16)
    assert pp.total_bytes_per_gpu == pipeline.busiest_rank_bytes


def test_p2p_sends_of_gpt3_175b_interleaved() -> None:
    # tp 8 with sequence parallelism: s/t·b·h = 256 × 12288 per send; v 2: 2·m sends a link, and rank 7
    # sends chunk 0's output on to rank 0 (v − 1)·m times; 8·2 − 1 = 15 boundaries a micro-batch
    estimate = estimate_comm(
        model="gpt3-175b", gpus=1024, tp=8, pp=8, vpp=2, grad_accum=64, framework="megatron",
        sequence_parallel=True,
    )  # fmt: skip
    pipeline = estimate.pipeline
    assert pipeline is not None
    assert pipeline.message_elements == 256 * 12288 == 3_145_728
    assert pipeline.boundaries == 15
    assert [link.forward_sends for link in pipeline.links] == [128] * 7 + [64]
    assert (pipeline.links[-1].stage, pipeline.links[-1].next_stage) == (7, 0)
    assert pipeline.busiest_rank_bytes == 2 * 128 * 3_145_728 * 2
    assert pipeline.bubble_fraction == 7 / 128
    sync = pipeline.embedding_sync  # the tied embedding's gradients over the first and the last stage
    assert (
        sync is not None and sync.elements == 51200 // 8 * 12288 and sync.bytes_per_gpu == 4 * sync.elements
    )


def test_context_parallel_divides_the_message() -> None:
    estimate = estimate_comm(model="llama-3-8b", gpus=16, pp=2, cp=2, seq_len=8192, framework="megatron")
    assert estimate.pipeline is not None and estimate.pipeline.message_elements == 8192 // 2 * 4096


# ------------------------------------------------------------------------------------ uneven stages
def test_uneven_stages_follow_megatron_offsets() -> None:
    # Megatron-LM get_num_layers_to_build / get_transformer_layer_offset: the first and last ranks hold
    # the layers given, the middle ranks (L − first − last)/(p − 2) each, in order
    assert stage_layer_counts(126, 16, 7, 7) == (7, *[8] * 14, 7)
    assert chunk_layers(126, 16, 1, 0, 7, 7) == (range(0, 7),)
    assert chunk_layers(126, 16, 1, 1, 7, 7) == (range(7, 15),)
    assert chunk_layers(126, 16, 1, 15, 7, 7) == (range(119, 126),)
    # only the first given: the other three ranks share the rest, 24/3 = 8 each
    assert stage_layer_counts(30, 4, 6, None) == (6, 8, 8, 8)
    assert chunk_layers(30, 4, 1, 3, 6, None) == (range(22, 30),)
    # L 16, p 4, v 2, first 2, last 2: chunks of 1, 3, 3, 1 layers; virtual stage j·p + i starts at
    # j·L/v + the chunks of ranks before i (rank 1, chunk 1: 8 + 1 = 9; rank 3, chunk 1: 8 + 1 + 3 + 3)
    assert [chunk_layers(16, 4, 2, i, 2, 2) for i in range(4)] == [
        (range(0, 1), range(8, 9)),
        (range(1, 4), range(9, 12)),
        (range(4, 7), range(12, 15)),
        (range(7, 8), range(15, 16)),
    ]
    # every layer held once
    held = sorted(i for rank in range(16) for chunk in chunk_layers(92, 16, 2, rank, 4, 4) for i in chunk)
    assert split_problem(92, 16, 2, 4, 4) is None and held == list(range(92))


def test_any_split_lists_each_virtual_stages_layers() -> None:
    # stage k is chunk k // p of rank k % p (Megatron-LM PipelineParallelLayerLayout: entry vpp_rank·p +
    # pp_rank; torch.distributed.pipelining loop style); each starts after the layers of stages 0 … k − 1.
    # Llama 3 8B at p 4 under torchtitan's default split: 8, 9, 8, 7
    split = (8, 9, 8, 7)
    assert stage_layer_counts(32, 4, layers=split) == split
    assert [chunk_layers(32, 4, 1, i, layers=split) for i in range(4)] == [
        (range(0, 8),), (range(8, 17),), (range(17, 25),), (range(25, 32),)
    ]  # fmt: skip
    # Llama 3.1 405B at p 8 × v 2: 7, 8 × 14, 7. Rank 0 holds stages 0 and 8: layers 0-6, and 7 + 7·8 = 63
    # on; rank 7 stages 7 (7 + 6·8 = 55 on) and 15 (7 + 14·8 = 119 on); per rank 7 + 8, 8 + 8, …, 8 + 7
    split = (7, *[8] * 14, 7)
    assert stage_layer_counts(126, 8, layers=split) == (15, *[16] * 6, 15)
    assert chunk_layers(126, 8, 2, 0, layers=split) == (range(0, 7), range(63, 71))
    assert chunk_layers(126, 8, 2, 7, layers=split) == (range(55, 63), range(119, 126))
    chunks = [chunk for rank in range(8) for chunk in chunk_layers(126, 8, 2, rank, layers=split)]
    held = sorted(i for chunk in chunks for i in chunk)
    assert held == list(range(126)) and split_problem(126, 8, 2, None, None, split) is None
    # Megatron's first/last split is one case of it: L 16, p 4, v 2, first 2, last 2 → chunks 1, 3, 3, 1
    megatron = virtual_stage_layers(16, 4, 2, 2, 2)
    assert megatron == (1, 3, 3, 1, 1, 3, 3, 1)
    assert [chunk_layers(16, 4, 2, i, layers=megatron) for i in range(4)] == [
        chunk_layers(16, 4, 2, i, 2, 2) for i in range(4)
    ]


def test_an_irregular_split_gives_each_stage_its_parameters_and_memory() -> None:
    # Llama 3 8B (h 4096, f 14336, 8 KV heads of 128, V 128,256, untied) at p 4 as 8, 9, 8, 7: a layer
    # 2h² + 2·h·1024 + 3·h·f + 2h; the embedding V·h on stage 0, the final norm h and the head V·h on 3
    h, f, vocab = 4096, 14336, 128256
    layer = 2 * h * h + 2 * h * 1024 + 3 * h * f + 2 * h
    assert layer == 218_112_000
    args = dict(model="llama-3-8b", gpus=4, pp=4, framework="megatron", grad_accum=8)
    request = parse_options(**args, pp_stage_layers="8,9,8,7")
    params = [s.params for s in request.stages]
    assert params == [8 * layer + vocab * h, 9 * layer, 8 * layer, 7 * layer + h + vocab * h]
    assert params == [2_270_232_576, 1_963_008_000, 1_744_896_000, 2_052_124_672]
    assert sum(params) == 8_030_261_248  # the whole model, each layer once
    assert request.rank_model == request.stages[0]
    peak = estimate_peak(**args, strategies="zero1", pp_stage_layers="8,9,8,7")
    stages = peak.peak.strategies[0].stages  # type: ignore[union-attr]
    assert [stage.layers for stage in stages] == [[[0, 7]], [[8, 16]], [[17, 24]], [[25, 31]]]
    for stage in stages:
        terms = {t.kind: t.bytes for t in stage.terms}
        assert terms[TensorKind.PARAMETERS] == 2 * params[stage.stage]
    estimate = estimate_comm(**args, pp_stage_layers="8,9,8,7")
    assert estimate.pipeline is not None and estimate.pipeline.stage_layers == [8, 9, 8, 7]
    assert "pp 4 (1f1b, stage layers 8, 9, 8, 7)" in mesh_assumption(request)


def test_an_interleaved_irregular_split_sums_each_ranks_chunks() -> None:
    # Llama 3.1 405B, tp 8, p 8 × v 2 as torchtitan's default splits it: 7, 8 × 14, 7. Per TP rank a layer
    # (2h² + 2·h·1024 + 3·h·f)/8 + 2h, the vocabulary padded to 129,024 (128·8), 129,024/8 rows of h
    h, f = 16384, 53248
    layer = (2 * h * h + 2 * h * 1024 + 3 * h * f) // 8 + 2 * h
    vocab = 129024 // 8 * h
    split = ",".join(["7", *["8"] * 14, "7"])
    request = parse_options(
        model="llama-3.1-405b", gpus=1024, tp=8, pp=8, vpp=2, framework="megatron", grad_accum=16,
        pp_stage_layers=split,
    )  # fmt: skip
    archs = [s.architecture for s in request.stages]
    assert archs[0].global_layers == (*range(0, 7), *range(63, 71))  # type: ignore[union-attr]
    assert archs[0].chunk_sizes == (7, 8) and archs[7].chunk_sizes == (8, 7)  # type: ignore[union-attr]
    params = [s.params for s in request.stages]
    assert params[0] == (7 + 8) * layer + vocab == 6_241_615_872
    assert params[1:7] == [(8 + 8) * layer] * 6
    assert params[7] == (8 + 7) * layer + h + vocab
    text = mesh_assumption(request)
    held = "holding 15, 16 × 6, 15 layers from the first to the last, in virtual stages of 7, 8 × 14, 7"
    assert held in text


def test_interleaved_irregular_chunks_run_their_own_layers() -> None:
    # Llama 3 8B at p 2 × v 2 as 3, 5, 13, 11: rank 0 holds stages 0 and 2 (layers 0-2, 8-20), rank 1
    # stages 1 and 3 (3-7, 21-31); each stage's parameters are its own layers' (bf16: 2 bytes each)
    h, vocab, layer = 4096, 128256, 218_112_000
    peak = estimate_peak(
        model="llama-3-8b", gpus=2, pp=2, vpp=2, framework="megatron", grad_accum=4, strategies="zero1",
        pp_stage_layers="3,5,13,11",
    )  # fmt: skip
    stages = peak.peak.strategies[0].stages  # type: ignore[union-attr]
    assert [stage.layers for stage in stages] == [[[0, 2], [8, 20]], [[3, 7], [21, 31]]]
    expected = [16 * layer + vocab * h, 16 * layer + h + vocab * h]
    assert [stage.params for stage in stages] == expected
    for stage in stages:
        terms = {t.kind: t.bytes for t in stage.terms}
        assert terms[TensorKind.PARAMETERS] == 2 * expected[stage.stage]


@pytest.mark.parametrize(
    ("split", "problem"),
    [
        ((126, 16, 1, 7, 7), None),
        ((12, 2, 1, 5, None), None),  # p 2: the last rank takes the other 7
        ((12, 2, 1, 5, 7), None),
        ((126, 16, 1, 7, 6), "the 113 remaining layers do not split evenly over 14 middle stages"),
        ((126, 16, 2, 7, 7), "a stage's 7 layers do not split into 2 chunks"),
        ((12, 2, 1, 5, 6), "1 layer left for 0 middle stages"),
        ((12, 3, 1, 6, 6), "0 layers left for 1 middle stage"),
        ((126, 16, 1, None, None), "126 layers do not split into 16 equal chunks"),
    ],
)
def test_uneven_split_problems_are_megatrons(split: tuple, problem: str | None) -> None:
    # Megatron-LM TransformerConfig.__post_init__, "Uneven PP"
    assert split_problem(*split) == problem


def test_plan_shortens_the_end_stages_when_the_layers_do_not_split() -> None:
    # L = p·m − 2k, the smallest k ≥ 1 Megatron-LM's checks accept: 126 = 16·8 − 2 (Llama 3 405B);
    # 32 = 3·12 − 2·2; 32 = 5·8 − 2·4 (5·7 − 2·k is odd); none where L splits evenly, at p 2, or where
    # no k gives every stage a multiple of v (126 at p 16, v 2: m even needs k ≡ 1 mod 16)
    assert shorter_end_stages(126, 16, 1) == 7
    assert shorter_end_stages(32, 3, 1) == 10 and shorter_end_stages(32, 5, 1) == 4
    assert shorter_end_stages(32, 4, 1) is None and shorter_end_stages(33, 2, 1) is None
    assert shorter_end_stages(126, 16, 2) is None and shorter_end_stages(61, 4, 1) is None


def test_llama_3_1_405b_at_pp_16_with_first_and_last_stages_of_7() -> None:
    # Llama 3 (Dubey et al. 2024 §3.3.2): 126 layers at PP 16, one layer fewer on the first and the last
    # stage. Per TP rank of 8: q and o h²/8, k and v h·1024/8, gate/up/down h·f/8, two norms whole; the
    # vocabulary 128,256 padded to a multiple of 128·8: 129,024, 129,024/8 rows of h
    h, f = 16384, 53248
    layer = (2 * h * h + 2 * h * 1024 + 3 * h * f) // 8 + 2 * h
    assert layer == 398_491_648
    vocab = 129024 // 8 * h
    request = parse_options(
        model="llama-3.1-405b", gpus=2048, tp=8, pp=16, framework="megatron", grad_accum=16,
        pp_first_stage_layers=7, pp_last_stage_layers=7,
    )  # fmt: skip
    archs = [s.architecture for s in request.stages]
    assert [a.num_layers for a in archs] == [7, *[8] * 14, 7]  # type: ignore[union-attr]
    assert archs[1].global_layers == tuple(range(7, 15))  # type: ignore[union-attr]
    assert archs[15].global_layers == tuple(range(119, 126))  # type: ignore[union-attr]
    params = [s.params for s in request.stages]
    assert params[0] == 7 * layer + vocab == 3_053_682_688  # the embedding
    assert params[1:15] == [8 * layer] * 14
    assert params[15] == 7 * layer + h + vocab == 3_053_699_072  # the final norm and the LM head
    assert request.rank_model == request.stages[1]  # a middle stage is the largest
    # each stage's memory: bf16 parameters, 2 bytes each, of its own count; the logits and the loss only
    # on the last, which holds one micro-batch in flight (1F1B: p − i), the first all 16
    peak = estimate_peak(
        model="llama-3.1-405b", gpus=2048, tp=8, pp=16, framework="megatron", grad_accum=16,
        strategies="zero1", pp_first_stage_layers=7, pp_last_stage_layers=7,
    )  # fmt: skip
    stages = peak.peak.strategies[0].stages  # type: ignore[union-attr]
    assert [stages[i].layers for i in (0, 1, 15)] == [[[0, 6]], [[7, 14]], [[119, 125]]]
    for stage in stages:
        terms = {t.kind: t.bytes for t in stage.terms}
        assert terms[TensorKind.PARAMETERS] == 2 * params[stage.stage]
        assert (TensorKind.LOSS in terms) == (stage.stage == 15) == stage.holds_head
    assert stages[0].holds_embedding and (stages[0].in_flight, stages[15].in_flight) == (16, 1)
    text = mesh_assumption(request)
    assert "pp 16 (1f1b, first stage 7 layers, last stage 7 layers)" in text
    assert "holding 7, 8 × 14, 7 layers from the first to the last, 1 chunk each" in text


def test_uneven_stages_send_what_even_stages_send() -> None:
    # 32 layers, first 7 and last 7: 9 on each middle rank; a boundary still carries b·s·h, the bubble
    # (p − 1)/m of the slowest stage's compute
    estimate = estimate_comm(
        model="llama-3-8b", gpus=4, pp=4, grad_accum=8, framework="megatron",
        pp_first_stage_layers=7, pp_last_stage_layers=7,
    )  # fmt: skip
    pipeline = estimate.pipeline
    assert pipeline is not None and pipeline.stage_layers == [7, 9, 9, 7]
    assert pipeline.message_elements == 2048 * 4096 and pipeline.bubble_fraction == 3 / 8
    output = runner.invoke(
        app, ["comm", "--model", "llama-3-8b", "--gpus", "4", "--pp", "4", "--grad-accum", "8",
              "--framework", "megatron", "--pp-first-stage-layers", "7", "--pp-last-stage-layers", "7"],
    ).stdout  # fmt: skip
    assert "Pipeline pp 4 (1f1b), m = 8, layers 7, 9 × 2, 7:" in output


# ---------------------------------------------------------------------------------------- the shell
def test_memory_and_comm_take_pp_4_vpp_8() -> None:
    args = ["--model", "llama-3-8b", "--gpus", "32", "--pp", "4", "--vpp", "8", "--grad-accum", "8"]
    memory = runner.invoke(app, ["memory", *args, "--framework", "megatron", "--gpu", "h100-80gb"])
    assert memory.exit_code == 0, memory.stderr
    assert "stage 3, forward" in memory.stdout  # the worst stage named (its loss, Megatron-LM's code)
    assert "zero1 per stage, device (micro-batches in flight): 0:" in memory.stdout
    assert "(4.38)," in memory.stdout  # rank 0: 4·(1 + 3/32) micro-batches
    assert max(len(line) for line in memory.stdout.splitlines()) <= 80
    data = json.loads(runner.invoke(app, ["memory", *args, "--framework", "megatron", "--json"]).stdout)
    row = data["peak"]["strategies"][0]
    assert [s["stage"] for s in row["stages"]] == [0, 1, 2, 3]
    assert row["stages"][0]["in_flight"] == 4.375 and row["stages"][0]["layers"][1] == [4, 4]
    assert row["peak_bytes"] == max(s["peak_bytes"] for s in row["stages"])
    comm = runner.invoke(app, ["comm", *args, "--framework", "megatron"])
    assert comm.exit_code == 0, comm.stderr
    assert "Pipeline pp 4 × v 8 (interleaved-1f1b), m = 8" in comm.stdout
    assert "3→0" in comm.stdout and "(p − 1)/(v·m)" in comm.stdout
    assert max(len(line) for line in comm.stdout.splitlines()) <= 80
    pipeline = json.loads(runner.invoke(app, ["comm", *args, "--framework", "megatron", "--json"]).stdout)
    assert pipeline["pipeline"]["bubble_fraction"] == 3 / 64


def test_no_pipeline_keys_without_pipeline() -> None:
    data = json.loads(runner.invoke(app, ["memory", "--model", "gpt2", "--gpus", "2", "--json"]).stdout)
    assert "stages" not in data["peak"]["strategies"][0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--pp", "4", "--vpp", "2", "--grad-accum", "6", "--gpus", "4"],
         "--grad-accum 6 with --pp-schedule interleaved-1f1b over --pp 4: its micro-batches run in groups"),
        (["--pp", "2", "--gpus", "2", "--framework", "deepspeed"],
         "accepted: --framework paper, megatron, fsdp2"),
        (["--pp", "2", "--gpus", "4", "--framework", "fsdp2", "--grad-sync", "every", "-s", "zero3"],
         "--grad-sync every"),
        (["--pp", "4", "--gpus", "4", "--pp-first-stage-layers", "7", "--pp-last-stage-layers", "6"],
         "--pp-first-stage-layers 7 and --pp-last-stage-layers 6 with --pp 4: of llama-3-8b's 32 layers, "
         "the 19 remaining layers do not split evenly over 2 middle stages; accepted: values that leave 2 "
         "middle stages an equal share"),
        (["--pp", "4", "--gpus", "4", "--vpp", "2", "--grad-accum", "4", "--pp-first-stage-layers", "7",
          "--pp-last-stage-layers", "7"],
         "a stage's 7 layers do not split into 2 chunks; accepted: values that leave 2 middle stages an "
         "equal share, every stage's layers a multiple of --vpp 2"),
        (["--gpus", "2", "--pp-first-stage-layers", "7"],
         "--pp-first-stage-layers changes nothing with --pp 1"),
        (["--pp", "2", "--gpus", "2", "--pp-last-stage-layers", "0"],
         "--pp-last-stage-layers '0' is not accepted; accepted: a whole number of layers from 1"),
        (["--pp", "2", "--gpus", "2", "--pp-first-stage-layers", "15", "--pp-last-stage-layers", "16"],
         "1 layer left for 0 middle stages; accepted: --pp-first-stage-layers + --pp-last-stage-layers = 32"),
        (["--pp", "5", "--gpus", "5"],
         "accepted: --pp × --vpp a divisor of 32, or --pp-first-stage-layers and --pp-last-stage-layers, "
         "or --pp-stage-layers"),
        (["--pp", "4", "--gpus", "4", "--pp-stage-layers", "8,9,15"],
         "--pp-stage-layers 8,9,15 with --pp 4: 3 counts given for 4 virtual stages; accepted: 4 counts of "
         "at least 1 layer summing to llama-3-8b's 32"),
        (["--pp", "4", "--gpus", "4", "--vpp", "2", "--grad-accum", "4", "--pp-stage-layers", "8,9,8,7"],
         "--pp-stage-layers 8,9,8,7 with --pp 4 × --vpp 2: 4 counts given for 8 virtual stages"),
        (["--pp", "4", "--gpus", "4", "--pp-stage-layers", "8,9,8,8"],
         "the counts sum to 33 layers, not 32"),
        (["--pp", "2", "--gpus", "2", "--pp-stage-layers", "32,0"],
         "--pp-stage-layers 32,0 with --pp 2: a virtual stage holds no layer"),
        (["--pp", "2", "--gpus", "2", "--pp-stage-layers", "16,x"],
         "--pp-stage-layers '16,x' is not accepted; accepted: a comma list of whole numbers of layers"),
        (["--pp", "2", "--gpus", "2", "--pp-stage-layers", "16,16", "--pp-first-stage-layers", "16"],
         "--pp-stage-layers and --pp-first-stage-layers both split the layers; accepted: one of them"),
        (["--gpus", "2", "--pp-stage-layers", "32"],
         "--pp-stage-layers changes nothing with --pp 1"),
    ],
)  # fmt: skip
def test_pipeline_refusals(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["memory", "--model", "llama-3-8b", *args]), fragment)


def test_the_core_stages_are_what_validate_builds() -> None:
    # zerocalc validate pipeline builds each stage's modules from the core's layers; the core's PipelineStage
    # holds the whole model's tensors of those modules: the embedding on stage 0, L/p consecutive blocks,
    # the final norm and head on stage p − 1 (an untied model: no second head); a boundary carries the
    # b·s·h elements validate predicts
    from zerocalc.model.architecture import embedding_tensors, head_tensors, layer_tensors, parameter_tensors
    from zerocalc.parallel.pipeline import boundary_elements
    from zerocalc.validate.pipeline import activation_elements

    request = parse_options(model="llama-3-8b", gpus=8, pp=4, grad_accum=4)
    arch = request.model.architecture
    assert arch is not None
    for i, stage in enumerate(request.stages):
        assert stage.architecture is not None
        core = [t.shape for t in parameter_tensors(stage.architecture)]
        whole = embedding_tensors(arch) if i == 0 else []
        for index in range(8 * i, 8 * i + 8):
            whole += layer_tensors(arch, index)
        whole += head_tensors(arch) if i == 3 else []
        assert core == [t.shape for t in whole]
    assert boundary_elements(request.mesh, 1, 2048, 4096) == activation_elements(arch, 1, 2048)


@pytest.mark.parametrize(
    "options",
    [
        dict(model="llama-3-8b", gpus=16, pp=8, grad_accum=16, framework="megatron"),
        dict(model="llama-3-8b", gpus=16, tp=2, pp=4, vpp=2, grad_accum=8, framework="megatron",
             pp_first_stage_layers=6, pp_last_stage_layers=6),
        dict(model="llama-3-8b", gpus=8, pp=4, grad_accum=4, framework="fsdp2", strategies="zero3",
             reduce_dtype="fp32"),
        dict(model="deepseek-v3", gpus=64, pp=8, ep=8, grad_accum=8, framework="megatron",
             pp_first_stage_layers=5, pp_last_stage_layers=8),
    ],
    ids=["megatron-pp8", "uneven-interleaved", "fsdp2", "moe-dense-first"],
)  # fmt: skip
def test_a_steps_compute_reads_each_kind_of_stage_once(options: dict) -> None:
    """Stages alike in their layers, dense layers, embedding and head (``stage_kind``) run the same
    operations and hold the same parameters: the step's slowest stage from one stage of each kind is the
    one every stage gives, to the bit, and the kinds are fewer than the stages."""
    from zerocalc.comm.step import (
        StageCompute,
        _micro_batch_time,
        fsdp2_traffic,
        optimizer_traffic,
        request_compute,
        request_ops,
        stage_micro_batches,
        with_framework_traffic,
    )
    from zerocalc.compute.time import step_compute
    from zerocalc.request.compute import compute_table

    request = parse_options(gpu="h100-80gb", seq_len=4096, **options)
    named = compute_table(None, request.gpu.name)
    assert named is not None
    table = named.table
    strategy = request.strategies[0]
    assert 1 < len(stage_micro_batches(request, table)) < len(request.stages)
    every = []
    for stage in request.stages:
        micro = _micro_batch_time(
            table, request_ops(request, stage.architecture), request.activations.recompute,
            request.activations.checkpoint_every,
        )  # fmt: skip
        compute = step_compute(table, micro, request.grad_accum, *optimizer_traffic(request, strategy, stage))
        compute = with_framework_traffic(compute, fsdp2_traffic(request, strategy, table, stage))
        every.append(StageCompute(compute, micro.forward.attention * request.grad_accum, stage))
    slowest = max(every, key=lambda s: s.compute.total_s)
    assert request_compute(request, table, strategy) == (slowest.compute, slowest.attention_forward_s)


@pytest.mark.parametrize(
    "options",
    [
        dict(model="llama-3-8b", gpus=8, pp=4, grad_accum=8, framework="megatron"),
        dict(model="llama-3-8b", gpus=8, tp=2, pp=2, grad_accum=4, framework="megatron"),
        dict(model="llama-3-8b", gpus=8, pp=4, grad_accum=2, framework="fsdp2", strategies="zero3"),
        dict(model="llama-3-8b", gpus=8, pp=2, grad_accum=4, framework="fsdp2", model_impl="torchtitan"),
        dict(model="gpt2", gpus=4, pp=2, grad_accum=1, framework="megatron", pp_schedule="gpipe",
             seq_len=1024),
        dict(model="qwen1.5-moe-a2.7b", gpus=8, pp=2, ep=2, grad_accum=4, framework="megatron"),
    ],
    ids=["megatron", "megatron-tp-sp", "fsdp2-m-below-p", "torchtitan", "gpipe", "moe"],
)  # fmt: skip
def test_the_first_stages_in_flight_saves_are_below_its_allocated_peak(options: dict) -> None:
    """The planner's bound of a pipelined candidate without recompute: the first stage's in-flight
    micro-batches (min(p, m) under 1F1B, m under GPipe) times one micro-batch's saved tensors through its
    layers is positive and at most that stage's allocated peak (memory's own simulation)."""
    from zerocalc.peak.evaluate import evaluate
    from zerocalc.peak.simulate import in_flight_saved_bytes, micro_batch_saved_bytes

    request = parse_options(**{"gpu": "h100-80gb", "seq_len": 4096, **options})
    bound = in_flight_saved_bytes(request)
    flight = min(request.mesh.pp, request.grad_accum)
    if request.mesh.pp_schedule is PpSchedule.GPIPE:
        flight = request.grad_accum
    assert bound == flight * micro_batch_saved_bytes(request) > 0
    stages = evaluate(request).peak.strategies[0].stages
    assert stages is not None
    assert bound <= stages[0].allocated_peak_bytes


def test_recompute_and_virtual_stages_give_no_in_flight_bound() -> None:
    from zerocalc.peak.simulate import in_flight_saved_bytes

    for extra in (dict(recompute="full"), dict(vpp=2, grad_accum=8), dict(pp=1)):
        options = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, pp=4, grad_accum=8, framework="megatron")
        assert in_flight_saved_bytes(parse_options(**{**options, **extra})) == 0
