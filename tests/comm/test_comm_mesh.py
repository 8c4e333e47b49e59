"""Tensor- and context-parallel communication against hand calculations.

Each expected volume is worked out in the comments from the model's sizes (GPT-3 175B: h 12288, 96 layers,
LayerNorm with biases, learned positions; Llama 3 8B: h 4096, 32 layers, 32 heads, 8 KV heads of 128) and
the nccl-tests bus factors: an all_reduce of S bytes over n ranks sends 2(n−1)/n·S per GPU, an all_gather
or reduce_scatter (n−1)/n·S, an all_to_all (n−1)/n·S of its send buffer, a send/recv S.
"""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_comm
from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.comm.mesh import Dimension
from zerocalc.network.collectives import Collective
from zerocalc.network.links import BandwidthSource

runner = CliRunner()

# GPT-3 175B, t 8, b 1, s 2048, bf16: one layer activation S = b·s·h = 2048 · 12288 elements, 2 bytes each
GPT3_S_BYTES = 2048 * 12288 * 2  # 50,331,648
GPT3_ALL_REDUCE = 88_080_384  # 2 · 7/8 · 50,331,648
GPT3_ONE_PASS = 44_040_192  # 7/8 · 50,331,648 (all_gather or reduce_scatter)
GPT3_CROSS_ENTROPY = 14_336  # all_reduce of b·s = 2048 fp32 values: 2 · 7/8 · 8192 bytes
GPT3_NORM_GRADS = 49_717_248  # all_reduce of (96·6 + 2)·12288 fp32 gradients: 2 · 7/8 · 28,409,856 bytes
"""Per layer, LayerNorm weight and bias twice (4h) and the biases of linear_proj and linear_fc2 (2h); the
final LayerNorm 2h: 578 · 12288 = 7,102,464 elements, 28,409,856 bytes of Megatron-LM's fp32 main
gradients (``finalize_model_grads._allreduce_layernorm_grads`` reduces ``param.main_grad``)."""


def gpt3(gpus: int = 8, **options: object):
    options = {"strategies": "zero1", "micro_batch": 1, "seq_len": 2048, "tp": 8, **options}
    return estimate_comm(None, gpus, model="gpt3-175b", framework="megatron", **options).row("zero1")


def tp_bytes(row) -> int:
    return sum(c.total_bytes_per_gpu for c in row.mesh_collectives if c.dimension is Dimension.TP)


def test_gpt3_tensor_parallel_without_sequence_parallelism() -> None:
    row = gpt3()
    layer = [c for c in row.mesh_collectives if c.scope.value == "layer"]
    assert [(c.op, c.phase.value) for c in layer] == [
        (Collective.ALL_REDUCE, "forward"),  # after linear_proj
        (Collective.ALL_REDUCE, "forward"),  # after linear_fc2
        (Collective.ALL_REDUCE, "backward"),  # linear_fc1's input gradient
        (Collective.ALL_REDUCE, "backward"),  # linear_qkv's input gradient
    ]
    for c in layer:
        assert (c.elements, c.message_bytes, c.times_per_step) == ([2048 * 12288], GPT3_S_BYTES, 96)
        assert c.bytes_sent_per_gpu == GPT3_ALL_REDUCE
    # 4 all-reduces per layer × 96 layers, the word embeddings' all_reduce, the LM head's input gradient,
    # the cross-entropy's three small all-reduces: 33,822,867,456 + 176,160,768 + 43,008
    assert tp_bytes(row) == 96 * 4 * GPT3_ALL_REDUCE + 2 * GPT3_ALL_REDUCE + 3 * GPT3_CROSS_ENTROPY
    assert tp_bytes(row) == 33_999_071_232
    (tp,) = [d for d in row.dimensions if d.dimension is Dimension.TP]
    assert (tp.group_size, tp.stride, tp.spans_nodes, tp.calls_per_step) == (8, 1, False, 96 * 4 + 5)
    (dp,) = [d for d in row.dimensions if d.dimension is Dimension.DP]
    assert (dp.group_size, dp.total_bytes_per_gpu) == (1, 0)  # 8 GPUs, t 8: one data-parallel replica
    assert row.total_bytes_per_gpu == 33_999_071_232


def test_gpt3_tensor_parallel_with_sequence_parallelism() -> None:
    row = gpt3(sequence_parallel=True)
    layer = [c for c in row.mesh_collectives if c.scope.value == "layer"]
    ag, rs = Collective.ALL_GATHER, Collective.REDUCE_SCATTER
    assert [(c.op, c.phase.value) for c in layer] == [
        (ag, "forward"), (rs, "forward"),  # linear_qkv's input, linear_proj's output
        (ag, "forward"), (rs, "forward"),  # linear_fc1's input, linear_fc2's output
        # fc2's output gradient, fc1's input gathered again and its gradient, then the same for attention
        (ag, "backward"), (ag, "backward"), (rs, "backward"),
        (ag, "backward"), (ag, "backward"), (rs, "backward"),
    ]  # fmt: skip
    assert {c.bytes_sent_per_gpu for c in layer} == {GPT3_ONE_PASS}
    forward = sum(c.bytes_sent_per_gpu for c in layer if c.phase.value == "forward")
    assert forward == 2 * GPT3_ALL_REDUCE  # Korthikanti §4.2.2: all_gather + reduce_scatter = all_reduce
    # per layer 10 one-pass collectives; per micro-batch the embeddings' all_reduce (GPT-3 has a position
    # table: Megatron all-reduces, then splits) and the split's backward all_gather, the LM head's input
    # all_gather, its backward all_gather and reduce_scatter, the cross-entropy; per step the norms' and
    # row-parallel biases' gradients
    expected = (
        96 * 10 * GPT3_ONE_PASS
        + GPT3_ALL_REDUCE + 4 * GPT3_ONE_PASS + 3 * GPT3_CROSS_ENTROPY
        + GPT3_NORM_GRADS
    )  # fmt: skip
    assert tp_bytes(row) == expected == 42_592_585_728
    (norms,) = [c for c in row.mesh_collectives if c.scope.value == "step"]
    assert norms.elements == [578 * 12288] and norms.dtype.value == "fp32"


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_full_recompute_runs_each_layer_forward_collective_again(sequence_parallel: bool) -> None:
    base = gpt3(sequence_parallel=sequence_parallel)
    full = gpt3(sequence_parallel=sequence_parallel, recompute="full")
    selective = gpt3(sequence_parallel=sequence_parallel, recompute="selective")
    # two all-reduces per layer, or two all-gathers and two reduce-scatters: 96 · 2 · 88,080,384
    assert tp_bytes(full) - tp_bytes(base) == 96 * 2 * GPT3_ALL_REDUCE == 16_911_433_728
    assert {c.moves for c in full.mesh_collectives if c.recomputed} == {
        c.moves for c in base.mesh_collectives if c.scope.value == "layer" and c.phase.value == "forward"
    }
    assert tp_bytes(selective) == tp_bytes(base)  # the core attention holds no tensor-parallel collective


def test_micro_batches_repeat_activations_and_not_the_step_reduction() -> None:
    one, four = gpt3(sequence_parallel=True), gpt3(sequence_parallel=True, grad_accum=4)
    assert tp_bytes(four) == 4 * (tp_bytes(one) - GPT3_NORM_GRADS) + GPT3_NORM_GRADS


def test_tensor_parallel_times_use_the_node_link() -> None:
    row = gpt3(intra_node_bw="400GB/s", inter_node_bw="40GB/s", latency=1e-5)
    (tp,) = [d for d in row.dimensions if d.dimension is Dimension.TP]
    # 389 calls × 10 µs + 33,999,071,232 bytes / 400e9 B/s
    assert tp.time_s == pytest.approx(389 * 1e-5 + 33_999_071_232 / 400e9)


def llama8b(gpus: int, **options: object):
    strategy = "zero3" if options.get("framework") == "fsdp2" else "zero1"
    options = {"strategies": strategy, "micro_batch": 1, "seq_len": 8192, "latency": 0.0, **options}
    return estimate_comm(None, gpus, model="llama-3-8b", **options).row(strategy)


def cp_bytes(row) -> int:
    return sum(c.total_bytes_per_gpu for c in row.mesh_collectives if c.dimension is Dimension.CP)


# Llama 3 8B, t 2, c 4, b 1, s 8192: a rank's K and V chunk is b·(s/c)·(kv/t)·(d_k + d_v)
# = 2048 · 4 · 256 = 2,097,152 bf16 elements, 4,194,304 bytes
LLAMA_KV = 4_194_304


def test_ring_attention_of_transformer_engine() -> None:
    row = llama8b(16, framework="megatron", tp=2, cp=4, cp_impl="ring")
    cp = [c for c in row.mesh_collectives if c.dimension is Dimension.CP]
    assert {c.op for c in cp} == {Collective.SEND_RECV}
    assert [(c.phase.value, c.elements) for c in cp] == [
        ("forward", [2_097_152] * 3),  # c − 1 steps
        ("backward", [2_097_152]),  # K, V at the first step
        ("backward", [2 * 2_097_152] * 2),  # K, V with dK, dV at the c − 2 middle steps
        ("backward", [2_097_152]),  # dK, dV at the last
    ]
    # forward 3 KV, backward KV + 2·2KV + KV = 6 KV: 9 · 4,194,304 bytes per layer, 32 layers
    assert cp_bytes(row) == 32 * 9 * LLAMA_KV == 1_207_959_552
    (dim,) = [d for d in row.dimensions if d.dimension is Dimension.CP]
    assert (dim.group_size, dim.stride, dim.spans_nodes, dim.calls_per_step) == (4, 2, False, 32 * 7)
    selective = llama8b(16, framework="megatron", tp=2, cp=4, cp_impl="ring", recompute="selective")
    assert cp_bytes(selective) == cp_bytes(row) + 32 * 3 * LLAMA_KV  # the core attention's forward again


def test_all_gathered_keys_and_values_of_transformer_engine() -> None:
    row = llama8b(16, framework="megatron", tp=2, cp=4, cp_impl="allgather")
    # K (and V) of the whole sequence: b·s·(kv/t)·d = 8192 · 4 · 128 = 4,194,304 elements, 8,388,608 bytes;
    # each all_gather or reduce_scatter sends 3/4 of it, 6,291,456 bytes: K, V in forward, again in
    # backward, dK and dV reduce-scattered
    assert cp_bytes(row) == 32 * 6 * 6_291_456


def test_torch_context_parallel_rotates_gradients_in_fp32() -> None:
    row = llama8b(16, framework="fsdp2", tp=2, cp=4, cp_impl="ring")
    # K, V: c − 1 sends forward and backward; dK, dV: c sends of the same elements in fp32 (8,388,608 bytes)
    assert cp_bytes(row) == 32 * (3 * LLAMA_KV + 3 * LLAMA_KV + 4 * 2 * LLAMA_KV)


def test_ulysses_all_to_alls_of_deepspeed() -> None:
    row = llama8b(8, framework="deepspeed", cp=4)
    cp = [c for c in row.mesh_collectives if c.dimension is Dimension.CP]
    assert [c.op for c in cp] == [Collective.ALL_TO_ALL] * 8
    # per rank b·(s/c) = 2048 tokens: q and the output 2048 · 32 · 128 = 8,388,608 elements, k and v
    # 2048 · 8 · 128 = 2,097,152 (GQA); each sends 3/4 of its buffer, twice (forward and backward)
    q, kv = 8_388_608, 2_097_152
    assert [c.elements[0] for c in cp] == [q, kv, kv, q, q, q, kv, kv]  # q, k, v, out; dout, dq, dk, dv
    per_layer = 2 * 3 * (8_388_608 + 2_097_152 + 2_097_152 + 8_388_608) * 2 // 4
    assert cp_bytes(row) == 32 * per_layer == 2_013_265_920
    full = llama8b(8, framework="deepspeed", cp=4, recompute="full")
    assert cp_bytes(full) == cp_bytes(row) + 32 * per_layer // 2  # the forward's four again


def test_groups_are_placed_by_the_layout() -> None:
    # tp 8 fills a node; the two CP ranks of a TP index are 8 apart, on two nodes (and so is the dp × cp
    # group that reduces gradients)
    row = llama8b(16, framework="megatron", tp=8, cp=2, intra_node_bw="400GB/s", inter_node_bw="40GB/s")
    spans = {d.dimension: d.spans_nodes for d in row.dimensions}
    assert spans == {Dimension.DP: True, Dimension.TP: False, Dimension.CP: True}
    assert {c.bus_bandwidth_Bps for c in row.mesh_collectives if c.dimension is Dimension.CP} == {40e9}
    assert {c.bus_bandwidth_Bps for c in row.mesh_collectives if c.dimension is Dimension.TP} == {400e9}
    # 4 GPUs per node: tp 2 × cp 2 fits one node, the data-parallel pairs are on two
    row = llama8b(8, gpus_per_node=4, framework="megatron", tp=2, cp=2)
    spans = {d.dimension: (d.group_size, d.stride, d.spans_nodes) for d in row.dimensions}
    assert spans == {Dimension.DP: (4, 2, True), Dimension.TP: (2, 1, False), Dimension.CP: (2, 2, False)}
    # a TP group of 16 on nodes of 8, allowed by --tp-across-nodes, runs at the inter-node figure
    row = gpt3(16, tp=16, tp_across_nodes=True, inter_node_bw="40GB/s")
    assert {c.bus_bandwidth_Bps for c in row.mesh_collectives} == {40e9}


def test_dtensor_layers_reduce_each_projection_input_gradient() -> None:
    row = llama8b(8, framework="fsdp2", tp=2, sequence_parallel=False, seq_len=2048)
    layer = [c for c in row.mesh_collectives if c.scope.value == "layer"]
    # o_proj and down_proj outputs forward; gate and up, then q, k and v input gradients backward
    assert [len(c.elements) for c in layer] == [1, 1, 2, 3]
    assert {c.bytes_sent_per_gpu // len(c.elements) for c in layer} == {2048 * 4096 * 2}  # 2 · 1/2 · S


def test_fsdp2_reduces_sequence_parallel_norm_weights_where_it_reduces_gradients() -> None:
    every = llama8b(8, framework="fsdp2", tp=2, grad_accum=4, sequence_parallel=True)
    last = llama8b(8, framework="fsdp2", tp=2, grad_accum=4, grad_sync="last", sequence_parallel=True)
    (norms,) = [c for c in every.mesh_collectives if c.scope.value == "sync"]
    assert norms.elements == [4096] * 65  # two norms per layer and the final norm, one call each
    assert norms.times_per_step == 4
    (norms,) = [c for c in last.mesh_collectives if c.scope.value == "sync"]
    assert norms.times_per_step == 1


def test_calibration_prices_groups_of_the_size_it_measured(calibration_of) -> None:
    cal = calibration_of(Collective.ALL_REDUCE)  # all_reduce over the 8 GPUs of one node
    row = gpt3(calibration=cal, calibration_name="cal.json")
    sources = {c.bandwidth_source for c in row.mesh_collectives}
    assert sources == {BandwidthSource.CALIBRATION}
    row = gpt3(tp=4, calibration=cal, calibration_name="cal.json")
    assert {c.bandwidth_source for c in row.mesh_collectives} == {BandwidthSource.DEFAULT}


def test_data_parallel_rows_are_unchanged_without_tensor_or_context_parallelism() -> None:
    row = estimate_comm(7_000_000_000, 8, strategies="ddp").row("ddp")
    assert row.mesh_collectives == []
    (dp,) = row.dimensions
    assert (dp.dimension, dp.group_size, dp.stride) == (Dimension.DP, 8, 1)
    assert dp.total_bytes_per_gpu == row.total_bytes_per_gpu == 24_500_000_000  # 2 · 7/8 · 14e9


def test_ratio_to_ddp_compares_data_parallel_bytes() -> None:
    est = estimate_comm(None, 16, model="gpt3-175b", framework="megatron", tp=8, strategies="ddp,zero1")
    assert est.row("ddp").ratio_to_ddp == 1.0
    # Megatron-LM reduces its fp32 main gradients: DDP all-reduces 2 · 4Ψ, the distributed optimizer
    # reduce-scatters 4Ψ and all-gathers the bf16 parameters, 2Ψ; the TP bytes are left out
    assert est.row("zero1").ratio_to_ddp == 0.75


def test_comm_json_carries_each_dimension() -> None:
    args = ["comm", "--model", "gpt3-175b", "--gpus", "16", "--framework", "megatron", "--tp", "8"]
    result = runner.invoke(app, [*args, "--micro-batch", "1", "--seq-len", "2048", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["request"]["mesh"]["tp"] == 8 and data["request"]["seq_len"] == 2048
    for row in data["strategies"]:
        dims = {d["dimension"]: d for d in row["dimensions"]}
        assert set(dims) == {"dp", "tp"}
        assert (dims["tp"]["group_size"], dims["tp"]["spans_nodes"]) == (8, False)
        dp = dims["dp"]
        assert (dp["group_size"], dp["stride"], dp["spans_nodes"]) == (2, 8, True)
        assert dims["tp"]["total_bytes_per_gpu"] == 33_999_071_232
        assert row["total_bytes_per_gpu"] == sum(d["total_bytes_per_gpu"] for d in row["dimensions"])


@pytest.mark.parametrize("per_unit", [False, True])
def test_tables_show_each_dimension_within_80_columns(
    per_unit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    import zerocalc.cli.comm as comm_cli

    narrow = Console(width=80, record=True, highlight=False)
    monkeypatch.setattr(comm_cli, "console", lambda: narrow)
    args = ["comm", "--model", "llama-3-70b", "--gpus", "64", "--framework", "megatron", "--tp", "8"]
    args += ["--cp", "2", "--sequence-parallel", "--seq-len", "8192", "--recompute", "full", "-u", "B"]
    result = runner.invoke(app, args + (["--per-unit"] if per_unit else []))
    assert result.exit_code == 0, result.output
    lines = narrow.export_text().splitlines()
    for line in lines:
        assert len(line) <= 80 and "…" not in line, line
    text = "\n".join(lines)
    for fragment in ("Tensor parallelism", "Context parallelism", "Per dimension", "P2P fwd", "AG rec"):
        assert fragment in text
    if not per_unit:
        words = {word for line in lines for word in line.split()}
        estimate = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
        for row in estimate["strategies"]:
            for d in row["dimensions"]:
                assert f"{d['total_bytes_per_gpu']:,}" in words


def test_activation_options_without_a_mesh_say_they_change_nothing() -> None:
    def said(**options: object) -> bool:
        return any("change nothing here" in note for note in estimate_comm("7B", 8, **options).notes)

    assert said(recompute="full") and said(micro_batch=4) and not said()


def test_mixture_of_experts_under_tensor_parallelism_needs_sequence_parallelism_under_megatron() -> None:
    # Megatron-LM core 0.20.0 moe_layer.py MoELayer.forward raises ValueError for TP without SP in training
    with pytest.raises(InputError, match="without sequence parallelism"):
        estimate_comm(None, 8, model="mixtral-8x7b", tp=2, framework="megatron")
    result = runner.invoke(app, ["comm", "--model", "mixtral-8x7b", "--gpus", "8", "--tp", "2"])
    one_line_error(result, "accepted: --sequence-parallel")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7B", "--gpus", "8", "--tp", "2"], "--tp 2"),
        (["--model", "gpt3-175b", "--gpus", "8", "--tp", "8", "--recompute", "most"], "--recompute"),
        (["--model", "llama-3-8b", "--gpus", "8", "--cp", "4", "--seq-len", "100"], "--seq-len"),
    ],
)
def test_bad_mesh_inputs_exit_2(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["comm", *args]), fragment)
