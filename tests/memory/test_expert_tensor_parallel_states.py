"""Mixture of experts under tensor parallelism (``--tp`` with ``--ep`` and ``--expert-tp``, Megatron-LM's
``expert_tensor_parallel_size``): each rank's expert and dense parameters, gradients and optimizer states,
against hand counts from Megatron-LM core 0.20.0 (d98e8a6) and the models' configs
(``helpers.QWEN_MOE_TP``'s).
"""

from __future__ import annotations

import pytest
from helpers import QWEN_DENSE_PER_TP_RANK, QWEN_EXPERT, QWEN_MOE_TP

from zerocalc.model.architecture import expert_parameters
from zerocalc.request.training import parse_options
from zerocalc.states.memory import state_parts


@pytest.mark.parametrize(
    ("ep", "expert_tp", "experts", "expert_dp"),
    [
        (8, None, 48 * 16 * QWEN_EXPERT // 2, 1),  # 16 experts a rank, each half: 1,811,939,328
        (8, 1, 48 * 16 * QWEN_EXPERT, 2),  # 16 whole experts: 3,623,878,656, over 16/(1·8) ranks
        (4, 1, 48 * 32 * QWEN_EXPERT, 4),  # 32 whole experts: 7,247,757,312, over 16/(1·4) ranks
        (4, 2, 48 * 32 * QWEN_EXPERT // 2, 2),  # ETP = t = 2, e = 4: dp·cp/e = 8/4
    ],
)
def test_each_rank_holds_its_experts_split_by_etp_and_its_dense_part_by_tp(
    ep: int, expert_tp: int | None, experts: int, expert_dp: int
) -> None:
    request = parse_options(gpus=16, tp=2, ep=ep, expert_tp=expert_tp, **QWEN_MOE_TP)
    assert expert_parameters(request.architecture) == experts
    dense, routed = state_parts(request)
    assert (dense.params, routed.params) == (QWEN_DENSE_PER_TP_RANK, experts)
    assert (dense.cluster.world_size, routed.cluster.world_size) == (8, expert_dp)
