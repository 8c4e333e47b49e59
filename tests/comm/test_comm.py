"""Communication model against hand-computed volumes and times (the arithmetic is in the comments; the
asserted values are literals, not the model's formula run again)."""

from __future__ import annotations

import pytest

from zerocalc.api import estimate_comm
from zerocalc.base.errors import InputError
from zerocalc.network.calibration import save_calibration
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import COLLECTIVES, Collective
from zerocalc.network.links import BandwidthSource

PSI = 7_000_000_000


def test_ddp_all_reduce_of_bf16_gradients_on_8_gpus() -> None:
    est = estimate_comm(PSI, 8, strategies="ddp", intra_node_bw="100GB/s", latency=0.0)
    (c,) = est.row("ddp").collectives
    assert (c.op, c.message_bytes, c.group_size, c.spans_nodes) == (
        Collective.ALL_REDUCE,
        14 * 10**9,
        8,
        False,
    )
    assert c.bytes_sent_per_gpu == 24_500_000_000  # 2 * 7/8 * 14e9
    assert c.time_s == pytest.approx(0.245)  # 24.5e9 / 100e9


def test_zero_stages_at_a_equals_1_match_the_zero_paper_section_7() -> None:
    est = estimate_comm(PSI, 8, strategies="ddp,zero1,zero2,zero3")
    ddp = est.row("ddp").total_bytes_per_gpu
    assert est.row("zero1").total_bytes_per_gpu == ddp == est.row("zero2").total_bytes_per_gpu
    assert est.row("zero3").total_bytes_per_gpu == 3 * ddp // 2  # 3Ψ vs 2Ψ
    assert est.row("zero3").ratio_to_ddp == 1.5


def test_gradient_accumulation_follows_each_framework() -> None:
    est = estimate_comm(PSI, 8, strategies="ddp,zero1,zero2,shard_grad_op,zero3", grad_accum=4)
    # one ring pass over S = 14e9 bytes on 8 ranks: 7/8 · 14e9 = 12.25e9 bytes per GPU
    assert est.row("ddp").total_bytes_per_gpu == 24_500_000_000  # no_sync: one all_reduce (2 passes)
    assert est.row("zero1").total_bytes_per_gpu == 24_500_000_000  # RS + AG once per step
    assert est.row("zero2").total_bytes_per_gpu == 61_250_000_000  # RS × 4 + AG × 1 = 5 passes
    assert est.row("shard_grad_op").total_bytes_per_gpu == 98_000_000_000  # (AG + RS) × 4 = 8 passes
    assert est.row("zero3").total_bytes_per_gpu == 147_000_000_000  # (2 AG + RS) × 4 = 12 passes


def test_reduce_dtype_fp32_doubles_gradient_traffic_only() -> None:
    base = estimate_comm(PSI, 8, strategies="zero1")
    fp32 = estimate_comm(PSI, 8, strategies="zero1", reduce_dtype="fp32")
    rs_base, ag_base = base.row("zero1").collectives
    rs, ag = fp32.row("zero1").collectives
    assert rs.message_bytes == 2 * rs_base.message_bytes and rs.dtype.value == "fp32"
    assert ag.message_bytes == ag_base.message_bytes and ag.dtype.value == "bf16"


def test_sharded_messages_are_padded_to_whole_shards() -> None:
    est = estimate_comm(10, 3, strategies="zero3", precision="fp32")
    ag = est.row("zero3").collectives[0]
    assert ag.message_bytes == 12 * 4  # ceil(10/3) * 3 elements * 4 bytes
    assert ag.bytes_sent_per_gpu == 2 * 4 * 4  # (n-1) shards of 4 elements


def test_reduce_scatter_plus_all_gather_equals_all_reduce() -> None:
    for n in (2, 3, 8, 64, 1000):
        s = 4 * n * 12345
        rs = COLLECTIVES[Collective.REDUCE_SCATTER].bytes_sent_per_rank(s, n)
        ag = COLLECTIVES[Collective.ALL_GATHER].bytes_sent_per_rank(s, n)
        assert rs + ag == COLLECTIVES[Collective.ALL_REDUCE].bytes_sent_per_rank(s, n)


def test_single_gpu_sends_nothing() -> None:
    est = estimate_comm(PSI, 1)
    for row in est.strategies:
        assert row.collectives == [] and row.total_bytes_per_gpu == 0 and row.time_s == 0
        assert row.ratio_to_ddp is None
    assert est.notes


def test_hybrid_shard_by_hand_intra_and_inter_node() -> None:
    # 64 GPUs, 8 per node, bf16: inside a node AG fwd + AG bwd + RS of S = 14e9 over 8 ranks;
    # across the 8 nodes an all_reduce of each rank's shard S = 14e9 / 8 = 1.75e9 bytes.
    est = estimate_comm(
        PSI, 64, 8, strategies="hybrid", intra_node_bw="400GB/s", inter_node_bw="40GB/s", latency=1e-5
    )
    row = est.row("hybrid_shard")
    assert row.intra_node_bytes_per_gpu == 36_750_000_000  # 3 passes × 7/8 × 14e9
    assert row.inter_node_bytes_per_gpu == 3_062_500_000  # 2 · 7/8 · 1.75e9
    across = row.collectives[-1]
    assert (across.group, across.group_size) == (RankGroup.ACROSS_NODES, 8)
    assert across.message_bytes == 1_750_000_000
    # 3 × (10 µs + 12.25e9 / 400e9 s) + (10 µs + 3.0625e9 / 40e9 s) = 0.091905 + 0.0765725 s
    assert row.time_s == pytest.approx(0.1684775)


def test_world_group_spanning_nodes_runs_at_inter_node_bandwidth() -> None:
    est = estimate_comm(PSI, 16, 8, strategies="ddp", intra_node_bw="400GB/s", inter_node_bw="25GB/s")
    (c,) = est.row("ddp").collectives
    assert c.spans_nodes and c.bus_bandwidth_Bps == 25e9 and c.bandwidth_source is BandwidthSource.EXPLICIT


def test_compute_side_6_psi_t_over_n_f() -> None:
    est = estimate_comm(PSI, 8, strategies="ddp", tokens_per_step="1M", tflops=500.0)
    assert est.compute is not None
    # 6 · 7e9 · 1,048,576 FLOP (1M tokens: k and M are 1,024 and 1,024² for tokens) / (8 · 500e12 FLOP/s)
    assert est.compute.seconds == pytest.approx(11.010048)
    row = est.row("ddp")
    assert row.hidden_time_s == pytest.approx(min(row.time_s, est.compute.seconds))
    assert row.exposed_time_s == 0.0


def test_calibration_fits_replace_the_defaults(tmp_path, calibration_of) -> None:
    cal = calibration_of(Collective.ALL_REDUCE)
    save_calibration(cal, tmp_path / "cal.json")
    est = estimate_comm(PSI, 8, strategies="ddp,zero1", calibration=cal, calibration_name="cal.json")
    (ar,) = est.row("ddp").collectives
    assert ar.bandwidth_source is BandwidthSource.CALIBRATION
    assert ar.time_s == pytest.approx(0.20421667, rel=1e-6)  # 50 µs + 24.5e9 / 120e9 s
    rs, _ = est.row("zero1").collectives  # no reduce_scatter fit: falls back to the stated default
    assert rs.bandwidth_source is BandwidthSource.DEFAULT
    assert est.calibration_used == "cal.json"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"grad_accum": 0}, "grad_accum 0"),
        ({"reduce_dtype": "fp8"}, "'fp8'"),
        ({"intra_node_bw": "fast"}, "'fast'"),
        ({"intra_node_bw": "450"}, "has no unit"),
        ({"intra_node_bw": "1e400GB/s"}, "out of range"),
        ({"tflops": 100.0}, "tokens_per_step"),
        ({"gpus": 12, "gpus_per_node": 8, "strategies": "hybrid"}, "gpus 12"),
        ({"latency": -1.0}, "latency"),
        ({"latency": "1e400"}, "out of range"),
        ({"latency": "fast"}, "latency 'fast'"),
    ],
)
def test_bad_input(kwargs: dict, fragment: str) -> None:
    args = {"gpus": 8, **kwargs}
    with pytest.raises(InputError) as info:
        estimate_comm(PSI, **args)
    assert fragment in str(info.value) and "accepted" in str(info.value)


def test_latency_accepts_units() -> None:
    a = estimate_comm(PSI, 8, strategies="ddp", latency="20us").row("ddp").collectives[0]
    b = estimate_comm(PSI, 8, strategies="ddp", latency=2e-5).row("ddp").collectives[0]
    assert a.latency_s == b.latency_s == pytest.approx(2e-5)
