"""DeepSpeed's estimators reproduced: values computed by hand from DeepSpeed 0.19.8's published formulas."""

from __future__ import annotations

from zerocalc.states.deepspeed import (
    zero2_model_states,
    zero2_variants,
    zero3_model_states,
    zero3_variants,
)

P = 6_738_415_616  # Llama-2-7B
LARGEST = 32000 * 4096  # its embedding (largest module by direct parameters, as DeepSpeed's model_to_params)


def test_zero2_without_offload_counts_2_plus_18_over_n() -> None:
    est = zero2_model_states(P, num_gpus_per_node=8, num_nodes=1, cpu_offload=False)
    assert est.gpu_bytes == 2 * P + (18 * P) // 8  # 13,476,831,232 + 15,161,435,136
    assert est.gpu_bytes == 28_638_266_368
    assert est.cpu_bytes == int(P * 4 * 8 * 1.5)  # 323,443,949,568


def test_zero2_with_offload_keeps_fp16_params_only() -> None:
    est = zero2_model_states(P, num_gpus_per_node=8, num_nodes=2, cpu_offload=True)
    assert est.gpu_bytes == 2 * P
    assert est.cpu_bytes == P * 64 * 3 // 2  # max(4 * 16, 16) * 1.5 bytes per parameter


def test_zero3_variants_by_hand() -> None:
    rows = zero3_variants(P, LARGEST, num_gpus_per_node=8, num_nodes=1)
    got = [(r.offload_optimizer, r.offload_params, r.zero_init, r.cpu_bytes, r.gpu_bytes) for r in rows]
    layer = 4 * LARGEST  # 524,288,000
    assert got == [
        (True, True, True, P * 27, layer),  # 18 * 1.5 = 27 bytes/param on the host
        (True, True, False, P * 48, layer),  # max(4*8, 18) * 1.5 = 48
        (True, False, True, P * 24, layer + 2 * P // 8),  # 16 * 1.5 = 24
        (True, False, False, P * 48, layer + 2 * P // 8),
        (False, False, True, LARGEST * 4 * 8 * 3 // 2, layer + 18 * P // 8),
        (False, False, False, P * 4 * 8 * 3 // 2, layer + 18 * P // 8),
    ]


def test_zero3_multi_node_divides_host_memory_by_nodes() -> None:
    est = zero3_model_states(P, LARGEST, num_gpus_per_node=8, num_nodes=4, cpu_offload=True)
    assert est.cpu_bytes == int(P * 18 * 0.25 * 1.5)
    assert len(zero2_variants(P, 8, 4)) == 2
