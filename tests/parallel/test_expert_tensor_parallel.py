"""Mixture of experts under tensor parallelism (``--tp`` with ``--ep`` and ``--expert-tp``, Megatron-LM's
``expert_tensor_parallel_size``): the expert mesh apart from the attention's, and the CLI's refusals,
against hand counts from Megatron-LM core 0.20.0 (d98e8a6) and the models' configs
(``helpers.QWEN_MOE_TP``'s).
"""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.parallel.mesh import Mesh

runner = CliRunner()


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
