"""The dp × cp × tp mesh: its layout, each tensor-parallel rank's parameters, and the combinations refused."""

from __future__ import annotations

import os

import pytest
from helpers import one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerocalc.api import estimate_memory
from zerocalc.cli import app
from zerocalc.model.architecture import TensorParallelRank, count_parameters, parameter_tensors
from zerocalc.parallel.framework_records import data_parallel_mesh
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import CpImpl, Mesh
from zerocalc.request.presets import load_model
from zerocalc.request.training import parse_options

runner = CliRunner()
L3 = ["--model", "llama-3-8b"]


def test_layout_puts_tp_innermost_then_cp_then_dp() -> None:
    mesh = Mesh(world=32, gpus_per_node=8, tp=4, cp=2)
    assert mesh.dp == 4
    assert [mesh.rank_of(0, 0, t) for t in range(4)] == [0, 1, 2, 3]
    assert [mesh.rank_of(0, c, 0) for c in range(2)] == [0, 4]
    assert [mesh.rank_of(d, 0, 0) for d in range(4)] == [0, 8, 16, 24]
    # model states shard over the dp·cp = 8 ranks of one TP index, t = 4 apart: 2 of them per node
    cluster = mesh.data_cluster()
    assert (cluster.world_size, cluster.ranks_per_node, cluster.nodes) == (8, 2, 4)
    assert not mesh.tp_spans_nodes and not mesh.cp_spans_nodes  # 4 × 2 = 8 ranks: one node
    assert Mesh(world=32, gpus_per_node=8, tp=4, cp=4).cp_spans_nodes  # 16 ranks: two nodes


def test_data_parallel_mesh_is_the_parsers() -> None:
    for framework in ("paper", "fsdp2", "megatron", "deepspeed", "ddp"):
        request = parse_options(model="llama-3-8b", gpus=16, framework=framework)
        assert request.mesh == data_parallel_mesh(16, 8, Framework(framework))


GPT3_175B_TP8 = (
    # per layer: q/k/v, fc1 (weights and biases) and the row-parallel weights split 8 ways; the row-parallel
    # biases (2h) and the two LayerNorms (4h) replicated: 12h²/8 + 7h/8 + 6h
    96 * (12 * 12288**2 // 8 + 7 * 12288 // 8 + 6 * 12288)
    # the tied embedding: the vocabulary 50,257 padded to a multiple of 128 × 8 = 51,200, split 8 ways
    + 51200 // 8 * 12288
    # learned positions (2,048 × h) and the final LayerNorm, replicated
    + 2048 * 12288
    + 2 * 12288
)


def test_megatron_tensor_parallel_rank_of_gpt3_175b() -> None:
    assert GPT3_175B_TP8 == 21_855_215_616
    request = parse_options(
        model="gpt3-175b", gpus=8, tp=8, sequence_parallel=True, framework="megatron", model_impl="megatron",
        strategies="zero1", recompute="selective",
    )  # fmt: skip
    assert request.rank_model.params == GPT3_175B_TP8
    assert request.model.params == 174_604_259_328
    estimate = estimate_memory(
        model="gpt3-175b",
        gpus=8,
        tp=8,
        sequence_parallel=True,
        framework="megatron",
        strategies="zero1",
        model_impl="megatron",
    )
    row = estimate.row("zero1")
    # Megatron-LM's distributed optimizer over dp × cp = 1 rank: bf16 parameters, fp32 main gradients and
    # 12 bytes of fp32 master and Adam states, 2 + 4 + 12 bytes per local parameter (its docs: 18 without it)
    assert row.gpu_bytes == 18 * GPT3_175B_TP8
    assert estimate.request.mesh.tp == 8 and estimate.request.cluster.world_size == 1


def test_dtensor_rank_of_llama_3_8b() -> None:
    # h 4096, 32 heads of 128, 8 KV heads, f 14,336, V 128,256, untied: every projection split in two,
    # the two RMSNorms replicated; embedding and head split by vocabulary (torch.chunk: 64,128 rows each)
    layer = (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336) // 2 + 2 * 4096
    expected = 32 * layer + 2 * (128256 // 2) * 4096 + 4096
    assert expected == 4_015_263_744
    request = parse_options(model="llama-3-8b", gpus=8, tp=2, framework="fsdp2", model_impl="torchtitan")
    assert request.rank_model.params == expected
    assert request.mesh.sequence_parallel  # torchtitan's plan
    assert request.cluster.world_size == 4


def test_megatron_pads_the_vocabulary_to_128_t() -> None:
    arch, _ = load_model("llama-3-8b")
    rank = TensorParallelRank(**dict(arch), tp=8, vocab_multiple=128)
    assert rank.padded_vocab == 129_024  # ceil(128,256 / 1,024) × 1,024
    shapes = {(t.module, t.name): t.shape for t in parameter_tensors(rank)}
    assert shapes[("embed_tokens", "weight")] == (16_128, 4096)
    assert shapes[("layers.0.attn.k_proj", "weight")] == (128, 4096)
    assert shapes[("layers.0.attn.o_proj", "weight")] == (4096, 512)
    assert shapes[("layers.0.mlp.down_proj", "weight")] == (4096, 1792)
    assert shapes[("layers.0.input_norm", "weight")] == (4096,)


def test_experts_split_their_width() -> None:
    arch, _ = load_model("mixtral-8x7b")
    whole = count_parameters(arch)
    rank = count_parameters(TensorParallelRank(**dict(arch), tp=2))
    e, f, h = 8, 14336, 4096
    # experts 3·E·f·h split in two; the router E·h and the norms replicated; attention split as Llama's
    assert whole.per_layer - rank.per_layer == 3 * e * f * h // 2 + (2 * 4096 * 4096 + 2 * 4096 * 1024) // 2


def test_context_parallel_shards_states_over_dp_times_cp() -> None:
    request = parse_options(model="llama-3-8b", gpus=16, cp=2, framework="fsdp2", seq_len=8192)
    assert request.mesh.cp_impl is CpImpl.ALLGATHER  # torch context_parallel's default rotate method
    assert request.cluster.world_size == 16  # FSDP2 over dp_shard × cp
    assert request.rank_model == request.model


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params", "7B", "--tp", "2", "--gpus", "8"], "--tp 2 splits the model's tensors, which needs"),
        ([*L3, "--tp", "2", "--gpus", "7"], "--gpus 7 is not a multiple of --tp 2; accepted"),
        ([*L3, "--tp", "3", "--gpus", "6"], "32 attention heads, not a multiple of 3"),
        ([*L3, "--tp", "16", "--gpus", "16", "-g", "16"], "8 key/value heads"),
        ([*L3, "--tp", "2", "--gpus", "8", "--framework", "fsdp"], "accepted: --framework"),
        ([*L3, "--cp", "2", "--gpus", "8", "--framework", "fsdp2", "--cp-impl", "ulysses"],
         "--cp-impl ulysses: --framework fsdp2 does not implement it; accepted: --cp-impl allgather, ring"),
        ([*L3, "--cp", "2", "--gpus", "8", "--framework", "ddp"], "its context parallelism is not modelled"),
        ([*L3, "--tp", "2", "--gpus", "8", "--framework", "fsdp2", "--sequence-parallel"],
         "--tp 2 with --model-impl hf: transformers' tensor-parallel plans have no sequence parallelism"),
        ([*L3, "--cp", "2", "--gpus", "8", "--framework", "fsdp2", "--no-flash-attention"],
         "context parallelism needs flash attention (fused kernels keep no s × s tensor); accepted: --flash"),
        (["--model", "mixtral-8x7b", "--tp", "2", "--gpus", "8", "--framework", "fsdp2", "--model-impl",
          "torchtitan"], "mixture-of-experts layers is not modelled; accepted: --model-impl megatron"),
        ([*L3, "--gpus", "8", "--cp-impl", "ring"], "changes nothing with --cp 1"),
        ([*L3, "--gpus", "8", "--sequence-parallel"], "--tp is 1"),
        ([*L3, "--tp", "8", "--gpus", "16", "-g", "4"], "a TP group would span nodes"),
        ([*L3, "--tp", "2", "--gpus", "8", "--tp-across-nodes"], "changes nothing"),
        ([*L3, "--cp", "3", "--gpus", "3", "--framework", "megatron", "--seq-len", "4096"],
         "--seq-len 4,096 does not split into 2·c load-balanced chunks; accepted: --seq-len a multiple of 6"),
        (["--model", "olmo-2-1124-7b", "--tp", "2", "--gpus", "2"], "q/k norms over all heads"),
    ],
)  # fmt: skip
def test_bad_meshes_are_refused_in_one_line(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["memory", *args]), fragment)


def test_pipeline_options_are_checked() -> None:
    for args, fragment in (
        ([*L3, "--framework", "megatron", "--pp", "3", "--gpus", "24"], "32 layers do not split into 3"),
        ([*L3, "--vpp", "2", "--gpus", "8"], "--vpp changes nothing with --pp 1"),
        ([*L3, "--pp", "4", "--vpp", "8", "--gpus", "32", "--pp-schedule", "1f1b"], "one stage per rank"),
        ([*L3, "--pp", "4", "--gpus", "32", "--pp-schedule", "ScheduleInterleaved1F1B"], "virtual stages"),
        ([*L3, "--pp", "2", "--gpus", "12", "--tp", "4"], "--gpus 12 is not a multiple of --pp 2 × --tp 4"),
        ([*L3, "--ep", "2", "--gpus", "2"], "llama-3-8b, a dense model"),
        (["--model", "mixtral-8x7b", "--ep", "16", "--gpus", "16"], "8 experts, not a multiple of 16"),
        (["--model", "mixtral-8x7b", "--ep", "8", "--gpus", "8", "--tp", "2"], "does not divide the 4 ranks"),
    ):
        one_line_error(runner.invoke(app, ["memory", *args]), fragment)


def test_hf_code_under_fsdp2_tensor_parallelism_has_no_sequence_parallelism() -> None:
    assert not parse_options(model="llama-3-8b", gpus=8, tp=2, framework="fsdp2").mesh.sequence_parallel
    titan = parse_options(model="llama-3-8b", gpus=8, tp=2, framework="fsdp2", model_impl="torchtitan")
    assert titan.mesh.sequence_parallel


def test_tp_across_nodes_is_accepted_when_said() -> None:
    request = parse_options(model="llama-3-8b", gpus=16, gpus_per_node=4, tp=8, tp_across_nodes=True)
    assert request.mesh.tp_spans_nodes


@settings(
    max_examples=int(os.environ.get("MESH_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_mesh_is_estimated_or_refused_in_one_line(data: st.DataObject) -> None:
    """Meshes of every degree, framework, model code and model: an estimate, or one line and exit 2."""
    command = data.draw(st.sampled_from(["memory", "comm"]))
    model = data.draw(st.sampled_from(["gpt2", "llama-3-8b", "mixtral-8x7b", "gpt3-175b"]))
    args = [command, "--model", model]
    args += ["--gpus", str(data.draw(st.sampled_from([2, 4, 8, 16, 32, 64])))]
    args += ["--framework", data.draw(st.sampled_from(["paper", "megatron", "fsdp2", "deepspeed", "ddp"]))]
    for flag, values in (
        ("--tp", ["1", "2", "3", "4", "8", "16"]),
        ("--cp", ["1", "2", "4", "3"]),
        ("--cp-impl", ["ring", "allgather", "ulysses", "rings"]),
        ("--seq-len", ["1024", "4096", "1000"]),
        ("--micro-batch", ["1", "2"]),
        ("--ep", ["1", "2", "4", "8", "3"]),
        ("--capacity-factor", ["1", "1.25", "0"]),
    ):
        if data.draw(st.booleans()):
            args += [flag, data.draw(st.sampled_from(values))]
    if command == "memory" and data.draw(st.booleans()):
        args += ["--model-impl", data.draw(st.sampled_from(["hf", "megatron", "torchtitan"]))]
    switch = data.draw(st.sampled_from([None, "--sequence-parallel", "--no-sequence-parallel"]))
    if switch:
        args.append(switch)
    if command == "memory" and data.draw(st.booleans()):
        args.append("--flash-attention")
    result = runner.invoke(app, args)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code != 0:
        one_line_error(result)
