"""Expert parallelism (``--ep``): the EP and expert-data-parallel groups, each rank's E/e routed experts, the
model states sharded in two parts, the routed activations and the dispatch/combine all-to-alls, against hand
calculations from the models' configs.

Expert sizes (gated MLPs: gate, up and down, 3·h·f per expert):

* Mixtral-8x7B: E = 8, k = 2, h = 4096, f = 14336, 32 MoE layers: 176,160,768 per expert, 5,637,144,576 per
  expert over the layers; Ψ = 46,702,792,704, of which 8 × 5,637,144,576 = 45,097,156,608 in experts and
  1,605,636,096 not;
* Qwen3-30B-A3B: E = 128, k = 8, h = 2048, f = 768, 48 MoE layers: 4,718,592 per expert;
* DeepSeek-V3: E = 256, k = 8, h = 7168, f = 2048, 58 MoE layers (the first 3 of 61 dense): 44,040,192 per
  expert.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import clean_env, one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_comm
from zerocalc.cli import app
from zerocalc.cli.plan import command as printed_command
from zerocalc.comm.mesh import Dimension
from zerocalc.model.activations import ActivationShape, layer_terms
from zerocalc.model.architecture import MlpKind, expert_parameters
from zerocalc.model.code import MODEL_CODES, ModelImplName, Shape, layer_saves
from zerocalc.parallel.frameworks import TorchSetup, TorchWrapper
from zerocalc.parallel.mesh import Mesh
from zerocalc.parallel.strategies import STRATEGIES, StrategyName
from zerocalc.peak.evaluate import evaluate_peak
from zerocalc.peak.states import STATE_BUILDERS
from zerocalc.request.training import parse_options
from zerocalc.states.deepspeed import deepspeed_estimate
from zerocalc.states.framework import (
    dim0_padded_numel,
    dim0_shard_numel,
    predict_rank_states,
    sharded_dim_first,
)
from zerocalc.states.memory import StateKind, evaluate_memory, state_parts

runner = CliRunner()
MIXTRAL = ["--model", "mixtral-8x7b"]

MIXTRAL_PSI = 46_702_792_704
MIXTRAL_EXPERT = 3 * 4096 * 14336  # 176,160,768
MIXTRAL_EXPERT_ALL_LAYERS = 32 * MIXTRAL_EXPERT  # 5,637,144,576
MIXTRAL_REST = MIXTRAL_PSI - 8 * MIXTRAL_EXPERT_ALL_LAYERS  # 1,605,636,096
QWEN3_EXPERT = 3 * 2048 * 768  # 4,718,592
DEEPSEEK_EXPERT = 3 * 7168 * 2048  # 44,040,192


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------------------------- layout
def test_ep_group_is_innermost_of_dp_cp_and_the_expert_data_group_strides_over_it() -> None:
    mesh = Mesh(world=64, gpus_per_node=8, ep=8)
    groups = {g.dimension: (g.size, g.stride, g.spans_nodes) for g in mesh.groups}
    assert groups["ep"] == (8, 1, False)  # ranks 0-7: one node
    assert groups["expert_dp"] == (8, 8, True)  # ranks 0, 8, …, 56: one per node
    cluster = mesh.expert_data_cluster()
    assert (cluster.world_size, cluster.ranks_per_node, cluster.nodes) == (8, 1, 8)
    # tp 2: the EP group's ranks are 2 apart, 8 of them span 16 GPUs, two nodes of 8, 4 per node
    mesh = Mesh(world=128, gpus_per_node=8, tp=2, ep=8)
    assert (mesh.ep_spans_nodes, mesh.ep_ranks_per_node, mesh.expert_dp) == (True, 4, 8)
    assert {g.dimension: g.stride for g in mesh.groups}["expert_dp"] == 16
    # ep = 1: the groups are as they always were (no ep rows)
    assert [g.dimension for g in Mesh(world=64, gpus_per_node=8).groups] == ["tp", "cp", "dp", "pp"]


def test_each_rank_holds_e_over_ep_experts() -> None:
    mixtral = parse_options(model="mixtral-8x7b", gpus=64, ep=8)
    assert mixtral.architecture.local_experts == 1
    assert expert_parameters(mixtral.architecture) == MIXTRAL_EXPERT_ALL_LAYERS
    assert mixtral.rank_model.params == MIXTRAL_REST + MIXTRAL_EXPERT_ALL_LAYERS == 7_242_780_672
    qwen = parse_options(model="qwen3-30b-a3b", gpus=16, ep=8)
    assert expert_parameters(qwen.architecture) == 48 * 16 * QWEN3_EXPERT == 3_623_878_656
    deepseek = parse_options(model="deepseek-v3", gpus=256, ep=8)
    assert expert_parameters(deepseek.architecture) == 58 * 32 * DEEPSEEK_EXPERT == 81_738_596_352
    # the router and the shared experts stay whole: only the routed experts' tensors shrink, by 8
    whole = parse_options(model="deepseek-v3", gpus=256)
    assert whole.rank_model.params - deepseek.rank_model.params == 58 * 224 * DEEPSEEK_EXPERT


# ----------------------------------------------------------------------------------------------- states
def test_paper_states_shard_the_experts_over_the_expert_data_parallel_ranks() -> None:
    request = parse_options(model="mixtral-8x7b", gpus=64, ep=8, strategies="zero1,zero3")
    rest, experts = state_parts(request)
    assert (rest.params, rest.cluster.world_size) == (MIXTRAL_REST, 64)
    assert (experts.params, experts.cluster.world_size) == (MIXTRAL_EXPERT_ALL_LAYERS, 8)
    estimate = evaluate_memory(request)
    per_rank = ceil_div(MIXTRAL_REST, 64) + MIXTRAL_EXPERT_ALL_LAYERS // 8  # 25,088,064 + 704,643,072
    zero3 = estimate.row("zero3")
    assert zero3.bytes_of(StateKind.PARAMS) == 2 * per_rank == 1_459_462_272
    assert zero3.bytes_of(StateKind.OPTIMIZER) == 12 * per_rank
    # fully sharded, the states are Ψ/N with or without expert parallelism: 46.7B / 64 = 729,731,136
    assert per_rank == MIXTRAL_PSI // 64
    zero1 = estimate.row("zero1")
    assert zero1.bytes_of(StateKind.PARAMS) == 2 * (MIXTRAL_REST + MIXTRAL_EXPERT_ALL_LAYERS)
    assert zero1.bytes_of(StateKind.OPTIMIZER) == 12 * per_rank == 8_756_773_632
    shards = [(s.kind, s.shard_ranks, s.elements, s.experts) for s in zero1.states]
    assert shards == [
        (StateKind.PARAMS, 1, MIXTRAL_REST, False),
        (StateKind.PARAMS, 1, MIXTRAL_EXPERT_ALL_LAYERS, True),
        (StateKind.GRADS, 1, MIXTRAL_REST, False),
        (StateKind.GRADS, 1, MIXTRAL_EXPERT_ALL_LAYERS, True),
        (StateKind.OPTIMIZER, 64, 25_088_064, False),
        (StateKind.OPTIMIZER, 8, 704_643_072, True),
    ]
    # the JSON says ``experts`` only on the experts' rows
    dumped = zero1.model_dump(mode="json")["states"]
    assert ["experts" in s for s in dumped] == [False, True] * 3


def test_qwen3_states_over_two_expert_data_parallel_ranks() -> None:
    # 16 GPUs, ep 8: dp·cp/e = 2 ranks share each expert's states
    request = parse_options(model="qwen3-30b-a3b", gpus=16, ep=8, strategies="zero3")
    rest, experts = state_parts(request)
    assert experts.cluster.world_size == 2
    zero3 = evaluate_memory(request).row("zero3")
    assert zero3.bytes_of(StateKind.OPTIMIZER) == 12 * (ceil_div(rest.params, 16) + 3_623_878_656 // 2)
    assert rest.params + 8 * experts.params == 30_532_122_624  # Ψ: the rest once, the experts 8 ways


def test_megatron_distributed_optimizer_shards_the_experts_over_their_group() -> None:
    request = parse_options(model="mixtral-8x7b", gpus=64, ep=8, framework="megatron", strategies="zero1")
    lines = STATE_BUILDERS[request.framework_record.states](request, STRATEGIES[StrategyName.ZERO1]).lines
    held = {line.name: line.bytes for line in lines}
    assert held == {
        "bf16 parameters": 2 * MIXTRAL_REST,
        "bf16 parameters of the routed experts": 2 * MIXTRAL_EXPERT_ALL_LAYERS,
        "fp32 main gradients": 4 * MIXTRAL_REST,
        "fp32 main gradients of the routed experts": 4 * MIXTRAL_EXPERT_ALL_LAYERS,
        "fp32 master + Adam m, v (distributed)": 12 * ceil_div(MIXTRAL_REST, 64),
        "fp32 master + Adam m, v of the routed experts (distributed)": 12 * MIXTRAL_EXPERT_ALL_LAYERS // 8,
    }


def test_deepspeed_estimator_per_part() -> None:
    request = parse_options(model="mixtral-8x7b", gpus=64, ep=8, framework="deepspeed", strategies="zero2")
    estimate = deepspeed_estimate(request, STRATEGIES[StrategyName.ZERO2])
    # estimate_zero2_model_states_mem_needs per part: 2Ψ + int(18Ψ/N), over 64 and over 8 GPUs
    rest = 2 * MIXTRAL_REST + int(18 * MIXTRAL_REST / 64)
    experts = 2 * MIXTRAL_EXPERT_ALL_LAYERS + int(18 * MIXTRAL_EXPERT_ALL_LAYERS / 8)
    assert estimate.gpu_bytes == rest + experts
    assert estimate.params_16bit_bytes == 2 * (MIXTRAL_REST + MIXTRAL_EXPERT_ALL_LAYERS)


def test_fsdp2_shards_each_rank_s_experts_over_the_expert_data_parallel_ranks() -> None:
    fsdp2 = TorchSetup(wrapper=TorchWrapper.FSDP2)
    whole = parse_options(model="mixtral-8x7b", gpus=64, framework="fsdp2").architecture
    rank = parse_options(model="mixtral-8x7b", gpus=64, ep=8, framework="fsdp2").architecture
    # ep 1: each experts tensor [8, ·, ·] cut on dim 0 over 64 ranks, chunks of ceil(8/64) = 1: rank 0 holds
    # one whole expert per layer. ep 8: the rank's [1, ·, ·] over the 8 expert-data-parallel ranks, on dim 1
    # (64 dp ranks > 8 experts, torchtitan's Shard(1)): gate/up 28672/8 = 3584 rows of 4096, down 4096/8 =
    # 512 rows of 14336, 22,020,096 elements = one expert / 8
    before = predict_rank_states(whole, fsdp2, 64, 0)
    after = predict_rank_states(rank, fsdp2, 64, 0, expert_world=8, expert_dim=1)
    assert MIXTRAL_EXPERT // 8 == 3584 * 4096 + 512 * 14336
    assert before.params.bytes - after.params.bytes == 4 * 32 * (MIXTRAL_EXPERT - MIXTRAL_EXPERT // 8)
    # rank 63's experts shard is expert-data index 7 (the EP group innermost): the last 3584 rows, as many
    last = predict_rank_states(rank, fsdp2, 64, 63, expert_world=8, expert_dim=1)
    assert last.params.bytes - predict_rank_states(whole, fsdp2, 64, 63).params.bytes == 4 * 32 * (
        MIXTRAL_EXPERT // 8
    )
    # on dim 0 (16 dp ranks ≤ 128 experts): Qwen3's 16 local experts over 2 ranks, 8 each
    qwen = parse_options(model="qwen3-30b-a3b", gpus=16, ep=8, framework="fsdp2").architecture
    states = predict_rank_states(qwen, fsdp2, 16, 0, expert_world=2, expert_dim=0)
    dense = predict_rank_states(
        qwen.model_copy(update={"ep": 128}), fsdp2, 16, 0, expert_world=1, expert_dim=0
    )
    assert states.params.bytes - dense.params.bytes == 4 * 48 * (8 - 1) * QWEN3_EXPERT


def test_peak_of_an_expert_parallel_step() -> None:
    """Every framework's step runs; the NCCL communicators are the data-parallel group's, the EP group's
    and the expert-data-parallel group's (one each at ep 8: ZeRO's collectives run over the whole group)."""
    frameworks = (("paper", "zero1,zero3"), ("megatron", "zero1"), ("fsdp2", "zero3"), ("deepspeed", "zero3"))
    for framework, strategies in frameworks:
        options = {"model": "mixtral-8x7b", "gpus": 64, "framework": framework, "strategies": strategies}
        peak = evaluate_peak(parse_options(**options, ep=8)).peak
        assert peak is not None
        assert {row.nccl_communicators for row in peak.strategies} == {3}, framework
        dense = evaluate_peak(parse_options(**options)).peak
        assert dense is not None and {row.nccl_communicators for row in dense.strategies} == {1}
    # the paper's ZeRO-3 lines are memory's rows: Ψ/N of 2 + 2 + 12 bytes, in two parts
    peak = evaluate_peak(parse_options(model="mixtral-8x7b", gpus=64, ep=8, strategies="zero3")).peak
    assert peak is not None
    states = [line for line in peak.row("zero3").states if line.source.startswith("ZeRO paper")]
    assert sum(line.bytes for line in states) == 16 * (
        ceil_div(MIXTRAL_REST, 64) + MIXTRAL_EXPERT_ALL_LAYERS // 8
    )


# ----------------------------------------------------------------------------------------- activations
def test_routed_activations_follow_the_capacity_factor() -> None:
    assert Shape(1, 2048, ep=8, capacity_factor=1.25).expert_rows(2 * 2048) == 5120  # ceil(1.25 × 4096)
    assert Shape(1, 2048).expert_rows(4096) == 4096  # without EP a rank computes its own k·T
    arch = parse_options(model="mixtral-8x7b", gpus=64, ep=8).architecture
    hf = MODEL_CODES[ModelImplName.HF]

    def saved(factor: float) -> int:
        saves = layer_saves(hf, arch, 0, Shape(1, 2048, ep=8, capacity_factor=factor), 2)
        return sum(b for _, b in saves.saved)

    # 1,024 more rows of the experts' input [R, h], gate/up [R, 2f], activation and product [R, f]
    assert saved(1.25) - saved(1.0) == 2 * 1024 * (4096 + 4 * 14336) == 125_829_120
    # Korthikanti's terms: k·cf copies of the MLP's (k = 2, f = 14336, s·b = 2048, 2-byte activations)
    shape = ActivationShape(seq_len=2048, micro_batch=1, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                            ffn_hidden=14336, mlp=MlpKind.SWIGLU, dropout=False, flash_attention=True,
                            experts=8, experts_per_token=2, capacity_factor=1.5)  # fmt: skip
    assert layer_terms(shape)["experts_gate_output"] == 3 * 2 * 2048 * 14336


# ------------------------------------------------------------------------------------------- all-to-all
def ep_rows(row):
    return [c for c in row.mesh_collectives if c.dimension is Dimension.EP]


def test_mixtral_all_to_all_per_layer() -> None:
    row = estimate_comm(None, 64, model="mixtral-8x7b", ep=8, strategies="zero1", latency=0.0).row("zero1")
    rows = ep_rows(row)
    assert [(c.op.value, c.phase.value) for c in rows] == [
        ("all_to_all", "forward"),
        ("all_to_all", "forward"),
        ("all_to_all", "backward"),
        ("all_to_all", "backward"),
    ]
    message = 2 * 1 * 2048 * 4096 * 2  # k·b·s·h bf16 = 32 MiB
    for c in rows:
        assert c.elements == [2 * 2048 * 4096]
        assert c.message_bytes == message
        assert c.bytes_sent_per_gpu == message * 7 // 8  # (e−1)/e leaves the GPU
        assert c.times_per_step == 32  # every MoE layer, one micro-batch
        assert (c.group_size, c.spans_nodes, c.inter_node_bytes_per_gpu) == (8, False, 0)
    (ep,) = [d for d in row.dimensions if d.dimension is Dimension.EP]
    assert ep.total_bytes_per_gpu == 4 * 32 * message * 7 // 8
    # the data-parallel collectives: the rest over 64 ranks, the experts over 8
    groups = sorted(c.group_size for c in row.collectives)
    assert groups == [8, 8, 64, 64]


def test_all_to_all_under_context_parallelism_and_recompute() -> None:
    row = estimate_comm(None, 64, model="mixtral-8x7b", ep=8, cp=2, framework="megatron", strategies="zero1",
                        recompute="full", grad_accum=2).row("zero1")  # fmt: skip
    rows = ep_rows(row)
    assert {c.elements[0] for c in rows} == {2 * 1024 * 4096}  # s/c tokens
    assert [c.recomputed for c in rows] == [False, True, False, True, False, False]  # forward re-run
    assert {c.times_per_step for c in rows} == {32 * 2}


def test_qwen3_and_deepseek_all_to_alls_and_their_placement() -> None:
    qwen = ep_rows(estimate_comm(None, 16, model="qwen3-30b-a3b", ep=8, strategies="zero1").row("zero1"))
    assert {c.message_bytes for c in qwen} == {8 * 2048 * 2048 * 2}  # k = 8
    assert {c.times_per_step for c in qwen} == {48}
    row = estimate_comm(None, 256, model="deepseek-v3", ep=64, strategies="zero1", framework="megatron").row(
        "zero1"
    )
    rows = ep_rows(row)
    message = 8 * 2048 * 7168 * 2  # 234,881,024 bytes
    for c in rows:
        assert (c.group_size, c.spans_nodes, c.times_per_step) == (64, True, 58)
        assert c.bytes_sent_per_gpu == message * 63 // 64
        # 8 of the group's 64 ranks share a node: the blocks for the other 56 cross nodes
        assert c.inter_node_bytes_per_gpu == 58 * message * 56 // 64
    assert row.inter_node_bytes_per_gpu == sum(
        c.total_bytes_per_gpu for c in row.collectives if c.spans_nodes
    ) + (4 * 58 * message * 56 // 64)


def test_capacity_factor_scales_the_all_to_alls() -> None:
    row = estimate_comm(None, 64, model="mixtral-8x7b", ep=8, capacity_factor=1.25, strategies="zero1").row(
        "zero1"
    )
    assert {c.elements[0] for c in ep_rows(row)} == {5120 * 4096}  # ceil(1.25 × 2 × 2048) tokens


# ----------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([*MIXTRAL, "--gpus", "8", "--capacity-factor", "1.2"], "changes nothing with --ep 1"),
        ([*MIXTRAL, "--gpus", "8", "--ep", "8", "--capacity-factor", "0"], "above 0"),
        ([*MIXTRAL, "--gpus", "8", "--ep", "8", "--capacity-factor", "4.5"], "at most 4"),
        ([*MIXTRAL, "--gpus", "8", "--ep", "8", "--capacity-factor", "lots"], "not a number"),
        ([*MIXTRAL, "--gpus", "16", "--ep", "2", "--cp", "4", "--framework", "fsdp2"],
         "accepted: --ep a multiple of 4"),
        ([*MIXTRAL, "--gpus", "16", "--ep", "8", "--framework", "deepspeed", "--zeropp", "all"],
         "--zeropp with --ep 8"),
        ([*MIXTRAL, "--gpus", "8", "--ep", "8", "--framework", "ddp"], "accepted: --framework"),
        ([*MIXTRAL, "--gpus", "12", "--ep", "8"], "does not divide the 12 ranks"),
        ([*MIXTRAL, "--gpus", "96", "--ep", "8", "--framework", "fsdp2"],
         "gate_up_proj's 28,672 rows do not split evenly, which FSDP2 refuses"),
    ],
)  # fmt: skip
def test_bad_expert_parallel_inputs_are_refused_in_one_line(args: list[str], fragment: str) -> None:
    for command in ("memory", "comm"):
        one_line_error(runner.invoke(app, [command, *args]), fragment)


def test_ep_is_shown_in_the_tables() -> None:
    memory = runner.invoke(app, ["memory", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8"])
    assert memory.exit_code == 0, memory.output
    assert "holds 1 of the 8 routed experts" in " ".join(memory.stdout.split())
    comm = runner.invoke(app, ["comm", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8"])
    assert comm.exit_code == 0, comm.output
    assert "Expert parallelism: ep 8" in comm.stdout


FULLY_SHARD_EXPERTS = """
import json, sys
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

world, rank, local, d, f, dim = json.loads(sys.argv[1])
dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
experts = nn.Module()
experts.gate_up_proj = nn.Parameter(torch.zeros(local, 2 * f, d))
experts.down_proj = nn.Parameter(torch.zeros(local, d, f))
fully_shard(experts, mesh=init_device_mesh("cpu", (world,)), shard_placement_fn=lambda p: Shard(dim))
group = experts._get_fsdp_state()._fsdp_param_group.fsdp_params
print(json.dumps([[p.to_local().numel() for p in experts.parameters()],
                  [q.padded_sharded_param_size.numel() * world for q in group]]))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "rank", "local", "d", "f", "dim"),
    [(8, 0, 1, 16, 12, 1), (8, 7, 1, 24, 28, 1), (4, 3, 3, 8, 6, 0), (8, 6, 5, 8, 4, 0), (2, 1, 16, 8, 6, 0)],
)
def test_fsdp2_expert_shards_are_fully_shard_s(
    world: int, rank: int, local: int, d: int, f: int, dim: int
) -> None:
    """torch's ``fully_shard`` of an experts module ([E/e, 2f, d] and [E/e, d, f]) with ``Shard(dim)``, as
    torchtitan wraps it, on the fake process group: each rank's local elements and the gathered (padded)
    sizes are :func:`~zerocalc.states.framework.fsdp2_sharding`'s, dim 0 unevenly chunked included."""
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-c", FULLY_SHARD_EXPERTS, json.dumps([world, rank, local, d, f, dim])],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=True,
    )
    local_numels, padded = json.loads(done.stdout.strip().splitlines()[-1])
    shapes = [sharded_dim_first(shape, dim) for shape in ((local, 2 * f, d), (local, d, f))]
    assert local_numels == [dim0_shard_numel(shape, world, rank) for shape in shapes]
    assert padded == [dim0_padded_numel(shape, world) for shape in shapes]


def test_step_time_exposes_the_all_to_alls() -> None:
    """The dispatch and combine all-to-alls are on the critical path (Megatron-LM's alltoall dispatcher
    without overlap_moe_expert_parallel_comm): the step adds every one of their seconds."""
    row = estimate_comm(None, 16, model="qwen3-30b-a3b", ep=8, framework="megatron", strategies="zero1",
                        micro_batch=1, seq_len=4096, gpu="h100-80gb").row("zero1")  # fmt: skip
    step = row.step
    assert step is not None
    all_to_alls = sum(c.time_s for c in ep_rows(row))
    assert all_to_alls > 0
    assert step.exposed_ep_s == pytest.approx(all_to_alls)
    parts = step.exposed_dp_s + step.exposed_tp_s + step.exposed_cp_s + step.exposed_ep_s + step.exposed_pp_s
    assert step.exposed_comm_s == pytest.approx(parts)
    assert step.step_s == pytest.approx(step.compute_s + step.exposed_comm_s + step.bubble_s + step.offload_s)


def test_a_plan_row_with_expert_parallelism_reproduces() -> None:
    """A plan over ``--ep 8`` prices the all-to-alls in its step; the row's printed comm options give the
    same step, with the all-to-alls exposed."""
    args = ["--model", "qwen3-30b-a3b", "--gpu", "h200-141gb", "--gpus", "8", "--global-batch", "64seq",
            "--seq-len", "2048", "--framework", "megatron", "--ep", "8", "--top", "1", "--json"]  # fmt: skip
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["top"][0]
    assert top["ep"] == 8 and top["comm_options"]["ep"] == "8" and top["memory_options"]["ep"] == "8"
    comm = runner.invoke(app, [*printed_command("comm", top["comm_options"]).split()[1:], "--json"])
    assert comm.exit_code == 0, comm.output
    step = json.loads(comm.stdout)["strategies"][0]["step"]
    assert step["step_s"] == top["step_s"]
    assert step["exposed_ep_s"] > 0
