"""Mixture of experts under tensor parallelism (``--tp`` with ``--ep`` and ``--expert-tp``, Megatron-LM's
``expert_tensor_parallel_size``): its gradient reductions, the token dispatcher's collectives, the expert
GEMMs and the step's exposed dispatcher time, against hand counts from Megatron-LM core 0.20.0 (d98e8a6) and
the models' configs (``helpers.QWEN_MOE_TP``'s).
"""

from __future__ import annotations

import pytest
from helpers import QWEN_A2A_BUFFER, QWEN_DENSE_PER_TP_RANK, QWEN_EXPERT, QWEN_MOE_TP

from zerocalc.api import estimate_comm
from zerocalc.base.errors import InputError
from zerocalc.comm.mesh import Dimension
from zerocalc.comm.step import request_ops
from zerocalc.request.training import parse_options


# ------------------------------------------------------------------------------------------------- comm
def _comm(**options: object):  # type: ignore[no-untyped-def]
    return estimate_comm(None, 16, tp=2, **{**QWEN_MOE_TP, **options}).strategies[0]


def test_dense_gradients_reduce_over_dense_dp_and_expert_gradients_over_expert_dp() -> None:
    # the distributed optimizer's fp32 gradient reduce-scatter, (n-1)/n·S per GPU: dense over dp = 8,
    # 7/8 · 777,205,760 · 4; experts (ETP = 1, e = 8) over 2 expert-DP ranks, 1/2 · 3,623,878,656 · 4
    row = _comm(ep=8, expert_tp=1)
    scatters = {
        c.group_size: c.total_bytes_per_gpu for c in row.collectives if c.op.value == "reduce_scatter"
    }
    assert scatters == {8: 7 * QWEN_DENSE_PER_TP_RANK * 4 // 8, 2: 48 * 16 * QWEN_EXPERT * 4 // 2}
    # ETP = t = 2: the experts' one expert-DP rank reduces nothing
    row = _comm(ep=8)
    scatters = {
        c.group_size: c.total_bytes_per_gpu for c in row.collectives if c.op.value == "reduce_scatter"
    }
    assert scatters == {8: 7 * QWEN_DENSE_PER_TP_RANK * 4 // 8}


def test_the_dispatcher_all_to_alls_carry_the_sequence_shard_and_etp_gathers_them() -> None:
    # each of the 4 all-to-alls per MoE layer sends 7/8 of S = 33,554,432 bytes, 48 times a step
    for expert_tp in (1, 2):
        row = _comm(ep=8, expert_tp=expert_tp)
        a2a = [c for c in row.mesh_collectives if c.dimension is Dimension.EP]
        assert len(a2a) == 4
        assert {(c.group_size, c.message_bytes, c.total_bytes_per_gpu) for c in a2a} == {
            (8, QWEN_A2A_BUFFER, 48 * 7 * QWEN_A2A_BUFFER // 8)
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
                (2, 2 * QWEN_A2A_BUFFER, 48 * QWEN_A2A_BUFFER)
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
    row = estimate_comm(None, 8, tp=2, ep=4, **{**QWEN_MOE_TP, "model": "qwen1.5-moe-a2.7b"}).strategies[0]
    mlp = [c for c in row.mesh_collectives if c.dimension is Dimension.TP and c.moves.startswith("MLP")]
    assert len(mlp) == 5 and {c.times_per_step for c in mlp} == {24}


def test_expert_gemms_run_the_gathered_tokens_of_the_etp_group() -> None:
    # ETP = 1: the rank's own 8·1024 copies over its 16 experts, 512 rows each, the experts whole
    # (gate/up 2·768 = 1536 out of 2048, down 2048 out of 768); ETP = 2: 2·8192 / 16 = 1024 rows, half
    # width: the same FLOPs
    for expert_tp, rows, gate_up, down in ((1, 512, 1536, 768), (2, 1024, 768, 384)):
        ops = request_ops(parse_options(gpus=16, tp=2, ep=8, expert_tp=expert_tp, **QWEN_MOE_TP))
        gemms = {g.name: g for layer in ops.layers for g in layer.gemms if g.name.startswith("experts")}
        assert {(g.m, g.count) for g in gemms.values()} == {(rows, 16)}
        assert sorted((g.n, g.k) for g in gemms.values()) == sorted([(gate_up, 2048), (2048, down)])


def test_the_dispatchers_etp_collectives_count_in_the_steps_exposed_ep_time() -> None:
    # no overlap of the dispatcher is modelled: exposed_ep_s is the sum of the EP and ETP rows' times
    row = estimate_comm(None, 16, tp=2, ep=8, gpu="h100-80gb", **QWEN_MOE_TP).strategies[0]
    dispatcher = [c for c in row.mesh_collectives if c.dimension in (Dimension.EP, Dimension.ETP)]
    assert {c.dimension for c in dispatcher} == {Dimension.EP, Dimension.ETP}
    assert row.step is not None
    assert abs(row.step.exposed_ep_s - sum(c.time_s for c in dispatcher)) < 1e-12


def test_tp_comm_overlap_on_a_mixture_of_experts_is_refused() -> None:
    # the userbuffer overlap is modelled for a dense layer's four TP linears, not the MoE dispatcher
    with pytest.raises(InputError, match="userbuffer overlap is modelled for dense layers"):
        estimate_comm(None, 16, tp=2, ep=8, tp_comm_overlap=True, **QWEN_MOE_TP)
