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

from zerocalc.model.architecture import expert_parameters
from zerocalc.request.training import parse_options
from zerocalc.states.memory import state_parts

QWEN = dict(model="qwen3-30b-a3b", framework="megatron", sequence_parallel=True, strategies="zero1")
EXPERT = 4_718_592
DENSE_PER_TP_RANK = 777_205_760


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
