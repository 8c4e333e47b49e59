"""Mixture of experts under tensor parallelism (``--tp`` with ``--ep`` and ``--expert-tp``, Megatron-LM's
``expert_tensor_parallel_size``): the expert mesh apart from the attention's, each rank's expert and dense
parameters, the two gradient reductions, the token dispatcher's collectives and the expert GEMMs, against
hand counts from Megatron-LM core 0.20.0 (d98e8a6) and the models' configs.

Qwen3-30B-A3B: E = 128, k = 8, h = 2048, f = 768, 48 layers, every one MoE, no shared experts; one expert
3·h·f = 4,718,592, every layer's 128: 603,979,776, the 48 layers' 28,991,029,248. Its other parameters on
one of t = 2 tensor-parallel ranks (Megatron layers, the vocabulary 151,936 padded to a multiple of 128·2 =
152,064): per layer q 2048·4096 + k, v 2·2048·512 + o 4096·2048 = 18,874,368 / 2 = 9,437,184, norms
2·2048 + q/k norms 2·128 and the router 128·2048 replicated: 9,703,680; × 48 = 465,776,640; the embedding
and the untied head 2 · 76,032 · 2048 = 311,427,072; the final norm 2048: 777,205,760.

b = 1, s = 2048, bf16: under t = 2 with sequence parallelism a rank routes its T = 1024 tokens, k·T = 8192
copies of h = 2048: one all-to-all buffer S = 33,554,432 bytes.
"""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_comm
from zerocalc.cli import app
from zerocalc.comm.mesh import Dimension
from zerocalc.comm.step import request_ops
from zerocalc.model.architecture import expert_parameters
from zerocalc.parallel.mesh import Mesh
from zerocalc.request.training import parse_options
from zerocalc.states.memory import state_parts

runner = CliRunner()

QWEN = dict(model="qwen3-30b-a3b", framework="megatron", sequence_parallel=True, strategies="zero1")
EXPERT = 4_718_592
DENSE_PER_TP_RANK = 777_205_760
A2A_BUFFER = 8 * 1024 * 2048 * 2


# ----------------------------------------------------------------------------------------------- layout
def test_expert_groups_follow_megatrons_expert_rank_generator() -> None:
    # ETP = 1, e = 8 on 16 GPUs (t = 2): expert rank = (edp · 8 + ep) · 1, the EP group ranks 0-7 (one
    # node), expert DP = 16 / (1·8·1) = 2 ranks 8 apart (one per node)
    mesh = Mesh(world=16, gpus_per_node=8, tp=2, ep=8, expert_tp=1)
    groups = {g.dimension: (g.size, g.stride, g.spans_nodes) for g in mesh.groups}
    assert groups["ep"] == (8, 1, False)
    assert groups["expert_dp"] == (2, 8, True)
    assert groups["tp"] == (2, 1, False) and "expert_tp" not in groups
    cluster = mesh.expert_data_cluster()
    assert (cluster.world_size, cluster.ranks_per_node, mesh.ep_ranks_per_node) == (2, 1, 8)
    # ETP = 2 < t = 4, e = 4: the EP group 4 ranks 2 apart (0, 2, 4, 6), expert DP 16/(2·4) = 2, 8 apart
    mesh = Mesh(world=16, gpus_per_node=8, tp=4, ep=4, expert_tp=2)
    groups = {g.dimension: (g.size, g.stride, g.spans_nodes) for g in mesh.groups}
    assert groups["ep"] == (4, 2, False) and groups["expert_dp"] == (2, 8, True)
    assert groups["expert_tp"] == (2, 1, False)
    # at Megatron's default ETP = t the groups are the ones the EP model always had: 8 ranks 2 apart
    default = Mesh(world=16, gpus_per_node=8, tp=2, ep=8)
    assert default.etp == 2 and default.expert_dp == 1 and default.ep_spans_nodes


@pytest.mark.parametrize(
    ("ep", "expert_tp", "experts", "expert_dp"),
    [
        (8, None, 48 * 16 * EXPERT // 2, 1),  # 16 experts a rank, each half: 1,811,939,328
        (8, 1, 48 * 16 * EXPERT, 2),  # 16 whole experts: 3,623,878,656, over 16/(1·8) ranks
        (4, 1, 48 * 32 * EXPERT, 4),  # 32 whole experts: 7,247,757,312, over 16/(1·4) ranks
        (4, 2, 48 * 32 * EXPERT // 2, 2),  # ETP = t = 2, e = 4: dp·cp/e = 8/4
    ],
)
def test_each_rank_holds_its_experts_split_by_etp_and_its_dense_part_by_tp(
    ep: int, expert_tp: int | None, experts: int, expert_dp: int
) -> None:
    request = parse_options(gpus=16, tp=2, ep=ep, expert_tp=expert_tp, **QWEN)
    assert expert_parameters(request.architecture) == experts
    dense, routed = state_parts(request)
    assert (dense.params, routed.params) == (DENSE_PER_TP_RANK, experts)
    assert (dense.cluster.world_size, routed.cluster.world_size) == (8, expert_dp)


# ------------------------------------------------------------------------------------------------- comm
def _comm(**options: object):  # type: ignore[no-untyped-def]
    return estimate_comm(None, 16, tp=2, **{**QWEN, **options}).strategies[0]


def test_dense_gradients_reduce_over_dense_dp_and_expert_gradients_over_expert_dp() -> None:
    # the distributed optimizer's fp32 gradient reduce-scatter, (n-1)/n·S per GPU: dense over dp = 8,
    # 7/8 · 777,205,760 · 4; experts (ETP = 1, e = 8) over 2 expert-DP ranks, 1/2 · 3,623,878,656 · 4
    row = _comm(ep=8, expert_tp=1)
    scatters = {
        c.group_size: c.total_bytes_per_gpu for c in row.collectives if c.op.value == "reduce_scatter"
    }
    assert scatters == {8: 7 * DENSE_PER_TP_RANK * 4 // 8, 2: 48 * 16 * EXPERT * 4 // 2}
    # ETP = t = 2: the experts' one expert-DP rank reduces nothing
    row = _comm(ep=8)
    scatters = {
        c.group_size: c.total_bytes_per_gpu for c in row.collectives if c.op.value == "reduce_scatter"
    }
    assert scatters == {8: 7 * DENSE_PER_TP_RANK * 4 // 8}


def test_the_dispatcher_all_to_alls_carry_the_sequence_shard_and_etp_gathers_them() -> None:
    # each of the 4 all-to-alls per MoE layer sends 7/8 of S = 33,554,432 bytes, 48 times a step
    for expert_tp in (1, 2):
        row = _comm(ep=8, expert_tp=expert_tp)
        a2a = [c for c in row.mesh_collectives if c.dimension is Dimension.EP]
        assert len(a2a) == 4
        assert {(c.group_size, c.message_bytes, c.total_bytes_per_gpu) for c in a2a} == {
            (8, A2A_BUFFER, 48 * 7 * A2A_BUFFER // 8)
        }
        etp = [c for c in row.mesh_collectives if c.dimension is Dimension.ETP]
        if expert_tp == 1:
            assert etp == []
        else:  # all_gather / reduce_scatter of 2·S over the 2 ranks: (2-1)/2 · 2·S each, 48 times
            assert [(c.op.value, c.phase.value) for c in etp] == [
                ("all_gather", "forward"),
                ("reduce_scatter", "forward"),
                ("all_gather", "backward"),
                ("reduce_scatter", "backward"),
            ]
            assert {(c.group_size, c.message_bytes, c.total_bytes_per_gpu) for c in etp} == {
                (2, 2 * A2A_BUFFER, 48 * A2A_BUFFER)
            }


def test_attention_keeps_its_tp_collectives_and_the_routed_mlp_has_none() -> None:
    # sequence parallel Megatron: 5 per layer of attention (AG, RS forward; AG, AG, RS backward), each
    # b·(s)·h = 2048·2048 bf16 = 8 MiB, 48 layers; no dense MLP's gather in a model of MoE layers alone
    row = _comm(ep=8, expert_tp=1)
    tp = [c for c in row.mesh_collectives if c.dimension is Dimension.TP and c.scope.value == "layer"]
    assert sorted(c.moves for c in tp) == sorted(
        [
            "attention input",
            "attention output",
            "attention output gradient",
            "attention input, gathered again",
            "attention input gradient",
        ]
    )
    assert {(c.message_bytes, c.times_per_step) for c in tp} == {(2048 * 2048 * 2, 48)}


def test_shared_experts_run_the_dense_mlps_tp_collectives_in_every_moe_layer() -> None:
    # Qwen1.5-MoE-A2.7B: 24 MoE layers, each with shared experts (Megatron-LM shared_experts.py gathers
    # and reduce-scatters over the TP group as the dense MLP)
    row = estimate_comm(None, 8, tp=2, ep=4, **{**QWEN, "model": "qwen1.5-moe-a2.7b"}).strategies[0]
    mlp = [c for c in row.mesh_collectives if c.dimension is Dimension.TP and c.moves.startswith("MLP")]
    assert len(mlp) == 5 and {c.times_per_step for c in mlp} == {24}


def test_expert_gemms_run_the_gathered_tokens_of_the_etp_group() -> None:
    # ETP = 1: the rank's own 8·1024 copies over its 16 experts, 512 rows each, the experts whole
    # (gate/up 2·768 = 1536 out of 2048, down 2048 out of 768); ETP = 2: 2·8192 / 16 = 1024 rows, half
    # width: the same FLOPs
    for expert_tp, rows, gate_up, down in ((1, 512, 1536, 768), (2, 1024, 768, 384)):
        ops = request_ops(parse_options(gpus=16, tp=2, ep=8, expert_tp=expert_tp, **QWEN))
        gemms = {g.name: g for layer in ops.layers for g in layer.gemms if g.name.startswith("experts")}
        assert {(g.m, g.count) for g in gemms.values()} == {(rows, 16)}
        assert sorted((g.n, g.k) for g in gemms.values()) == sorted([(gate_up, 2048), (2048, down)])


# ---------------------------------------------------------------------------------------------- the CLI
def test_the_former_refusal_prints_memory_and_comm() -> None:
    args = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--framework", "megatron", "--tp", "2", "--ep", "8"]
    for command in ("memory", "comm"):
        for etp in ([], ["--expert-tp", "1"]):
            result = runner.invoke(app, [command, *args, "--sequence-parallel", *etp])
            assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["comm", *args, "--sequence-parallel", "--expert-tp", "2"])
    assert "Expert tensor parallelism: expert tp 2" in result.stdout
    memory = runner.invoke(app, ["memory", *args, "--sequence-parallel", "--expert-tp", "1"])
    text = " ".join(memory.stdout.split())
    assert "dp 8 (ep 8, etp 1) × tp 2 + sp" in text
    assert (
        "EP group (1 apart) holds 16 of the 128 routed experts of every MoE layer, whole, 3,623,878,656"
        in text
    )


MOE = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--tp", "2"]
SP = "--sequence-parallel"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([*MOE, "--ep", "8", "--framework", "megatron"], "accepted: --sequence-parallel"),
        ([*MOE, SP, "--ep", "8", "--framework", "megatron", "--expert-tp", "3"], "does not divide --tp 2"),
        ([*MOE, SP, "--ep", "8", "--framework", "megatron", "--expert-tp", "0"], "--expert-tp"),
        ([*MOE, SP, "--framework", "megatron", "--expert-tp", "1"], "with --ep 1"),
        ([*MOE, "--ep", "8", "--framework", "fsdp2", "--expert-tp", "1"],
         "accepted: --framework paper, megatron"),
        ([*MOE, SP, "--ep", "16", "--framework", "megatron"], "does not divide the 8 ranks of dp × cp"),
        ([*MOE, SP, "--ep", "32", "--framework", "megatron", "--expert-tp", "1"],
         "the 16 ranks of tp/expert_tp (2) × dp × cp"),
    ],
)  # fmt: skip
def test_bad_expert_tensor_parallel_inputs_are_refused_in_one_line(args: list[str], fragment: str) -> None:
    for command in ("memory", "comm"):
        one_line_error(runner.invoke(app, [command, *args]), fragment)
