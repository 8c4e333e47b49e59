"""Each framework's schedule against hand-computed volumes (the arithmetic is in the comments; the asserted
values are literals). The PyTorch ones are also what real gloo runs recorded (FINDINGS of issue #13, and
`zerocalc validate`'s collective check); the DeepSpeed ones follow the 0.19.8 source."""

from __future__ import annotations

import pytest

from zerocalc.api import estimate_comm, estimate_peak
from zerocalc.base.errors import InputError
from zerocalc.validate.run import resolve_architecture

PSI = 1_231_053
"""zerocalc validate's GPT-2 shrink with --ffn 3072 --vocab 5607 has exactly this many parameters."""


def _bytes(row: object) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in row.collectives:  # type: ignore[attr-defined]
        key = f"{c.op.value} {c.phase.value}{' scales' if c.scales else ''}"
        out[key] = out.get(key, 0) + c.total_bytes_per_gpu
    return out


# ------------------------------------------------------------------------------------- the numbers
def test_torch_zero1_is_ddp_all_reduce_plus_a_broadcast_of_every_parameter() -> None:
    row = estimate_comm(PSI, 2, precision="fp32", framework="torch-zero1", strategies="zero1").row("zero1")
    # all_reduce 2·(1/2)·4Ψ = 4,924,212; broadcasts of every parameter, factor 1: 4Ψ = 4,924,212
    assert _bytes(row) == {"all_reduce backward": 4_924_212, "broadcast after_step": 4_924_212}
    assert row.total_bytes_per_gpu == 9_848_424


@pytest.mark.parametrize("framework", ["ddp", "torch-zero1"])
def test_ddp_reduces_every_micro_batch_unless_the_loop_uses_no_sync(framework: str) -> None:
    def total(sync: str) -> int:
        est = estimate_comm(
            PSI, 2, precision="fp32", framework=framework, strategies="ddp", grad_accum=2, grad_sync=sync
        )
        return est.row("ddp").total_bytes_per_gpu

    assert total("every") == 9_848_424  # 2 micro-batches × 4Ψ
    assert total("last") == 4_924_212  # the last one only


def test_fsdp1_shard_grad_op_under_no_sync_gathers_once_and_reduces_once() -> None:
    row = estimate_comm(
        PSI, 2, precision="fp32", framework="fsdp", strategies="shard_grad_op", grad_accum=2, grad_sync="last"
    ).row("shard_grad_op")
    # one flat unit padded to 2·ceil(Ψ/2) = 1,231,054: all_gather (1/2)·4·1,231,054 + reduce_scatter the same
    assert _bytes(row) == {"all_gather forward": 2_462_108, "reduce_scatter backward": 2_462_108}
    assert row.total_bytes_per_gpu == 4_924_216
    every = estimate_comm(
        PSI, 2, precision="fp32", framework="fsdp", strategies="shard_grad_op", grad_accum=2
    )
    assert every.row("shard_grad_op").total_bytes_per_gpu == 9_848_432  # both, every micro-batch


# ---------------------------------------------------------------------------------------- PyTorch, per unit
GPT2 = resolve_architecture(None, {})
"""2 blocks of 48,447 parameters (d 63, MLP 252) + a root of 127,701 (embeddings 1001×63 and 1024×63, final
LayerNorm 126); Ψ = 224,595."""


def test_ddp_buckets_are_rebuilt_in_reverse_order_with_a_1mib_first_bucket_only_by_default() -> None:
    psi = resolve_architecture(None, {"intermediate_size": 3072, "vocab_size": 5607})
    (ar,) = estimate_comm(model=psi, gpus=2, precision="fp32", framework="ddp").row("ddp").collectives
    # reverse order: final_norm 126, layers.1 fc_out bias 63 + weight 193,536, fc_in bias 3,072 + weight
    # 193,536 → 390,333 elements = 1,561,332 B ≥ 1 MiB closes bucket 1; the other 840,720 fit in 25 MiB
    assert [u.elements for u in ar.units] == [[390_333], [840_720]]
    explicit = estimate_comm(model=psi, gpus=2, precision="fp32", framework="ddp", ddp_bucket="25MiB")
    assert [u.elements for u in explicit.row("ddp").collectives[0].units] == [[1_231_053]]


def test_latency_counts_calls() -> None:
    psi = resolve_architecture(None, {"intermediate_size": 3072, "vocab_size": 5607})
    est = estimate_comm(
        model=psi,
        gpus=2,
        precision="fp32",
        framework="ddp",
        latency="1ms",
        intra_node_bw="1GB/s",
        grad_accum=3,
    )
    (ar,) = est.row("ddp").collectives
    assert (ar.times_per_step, ar.calls_per_step) == (3, 6)
    assert ar.time_s == pytest.approx(3 * (2 * 1e-3 + 4_924_212 / 1e9))  # 2 buckets each time


def test_fsdp1_full_shard_does_not_regather_the_root_in_backward() -> None:
    # units padded to a multiple of 2: root 127,702, blocks 48,448; fp32, factor 1/2 → 2 bytes per element
    # all_gather forward 224,598, backward the blocks only 96,896, reduce_scatter 224,598 elements
    row = estimate_comm(model=GPT2, gpus=2, precision="fp32", framework="fsdp", strategies="zero3").row(
        "zero3"
    )
    assert _bytes(row) == {
        "all_gather forward": 449_196,
        "all_gather backward": 193_792,
        "reduce_scatter backward": 449_196,
    }
    assert row.total_bytes_per_gpu == 1_092_184
    assert row.calls_per_step == 8  # 3 + 2 + 3
    last = estimate_comm(
        model=GPT2,
        gpus=2,
        precision="fp32",
        framework="fsdp",
        strategies="zero3",
        grad_accum=2,
        grad_sync="last",
    )
    assert last.row("zero3").total_bytes_per_gpu == 1_735_172  # gathers twice, reduces once


def test_fsdp2_pads_every_parameter_on_dim_0() -> None:
    # a block: every 63-row tensor becomes 64 rows: norms 2·2·64, q/k/v/o 4·(64·63 + 64), fc_in 252·63 + 252,
    # fc_out 64·252 + 64 → 48,960; root: 1002·63 + 1024·63 + 2·64 = 127,766
    row = estimate_comm(model=GPT2, gpus=2, precision="fp32", framework="fsdp2", strategies="zero3").row(
        "zero3"
    )
    assert [u.elements for u in row.collectives[0].units] == [[48_960], [48_960], [127_766]]
    assert row.total_bytes_per_gpu == 1_098_584  # (225,686 + 97,920 + 225,686) × 2
    no_reshard = estimate_comm(
        model=GPT2, gpus=2, precision="fp32", framework="fsdp2", strategies="shard_grad_op", grad_accum=2,
        grad_sync="last",
    )  # fmt: skip
    # reshard after backward: the forward all_gather runs every micro-batch, the reduce_scatter once
    assert _bytes(no_reshard.row("shard_grad_op")) == {
        "all_gather forward": 902_744,
        "reduce_scatter backward": 451_372,
    }


def test_hybrid_shard_all_reduces_each_units_shard_across_nodes() -> None:
    # 4 ranks, 2 per node: FULL_SHARD inside the node as at N = 2 (1,092,184 B), plus an all_reduce over the
    # 2 nodes of each rank's shard: 63,851 + 2·24,224 = 112,299 fp32, factor 2·(1/2) = 1 → 449,196 B
    row = estimate_comm(
        model=GPT2, gpus=4, gpus_per_node=2, precision="fp32", framework="fsdp", strategies="hybrid"
    ).row("hybrid_shard")
    assert row.inter_node_bytes_per_gpu == 449_196
    assert row.total_bytes_per_gpu == 1_541_380


def test_ddp_under_autocast_reduces_fp32_gradients() -> None:
    paper = estimate_comm(PSI, 2, strategies="ddp").row("ddp")
    torch = estimate_comm(PSI, 2, framework="ddp").row("ddp")
    assert paper.collectives[0].dtype.value == "bf16" and torch.collectives[0].dtype.value == "fp32"
    assert torch.total_bytes_per_gpu == 2 * paper.total_bytes_per_gpu == 4_924_212  # 4Ψ
    with pytest.raises(InputError, match="reduce_dtype bf16: DDP reduces gradients in the parameters' dtype"):
        estimate_comm(PSI, 2, framework="ddp", reduce_dtype="bf16")


# --------------------------------------------------------------------------------------------- DeepSpeed
def test_deepspeed_stages_1_and_2_all_reduce_buckets_then_gather_the_parameters() -> None:
    est = estimate_comm(7_000_000_000, 8, framework="deepspeed", strategies="zero1,zero2", grad_accum=4)
    # bf16 all_reduce 2·(7/8)·14e9 = 24.5e9 in ceil(7e9 / 5e8) = 14 buckets; all_gather of the bit16 group
    # (7e9, a multiple of 2N) after the step (7/8)·14e9 = 12.25e9
    zero1, zero2 = est.row("zero1"), est.row("zero2")
    assert _bytes(zero1) == {"all_reduce backward": 24_500_000_000, "all_gather after_step": 12_250_000_000}
    assert zero1.calls_per_step == 15
    assert _bytes(zero2) == {"all_reduce backward": 98_000_000_000, "all_gather after_step": 12_250_000_000}
    assert zero2.calls_per_step == 57  # stage 2 reduces every micro-batch
    with pytest.raises(InputError, match="reduces gradients every micro-batch under framework deepspeed"):
        estimate_comm("7B", 8, framework="deepspeed", strategies="zero2", grad_sync="last")


LLAMA_2_7B = "llama-2-7b"
"""32 blocks of 202,383,360 (q/k/v/o 4096², gate/up/down 4096·11008, 2 RMSNorms of 4096), embedding and
untied head 32000·4096 = 131,072,000 each, final norm 4096: Ψ = 6,738,415,616, of which the 65 norms
(266,240) are at most 1e5 elements: DeepSpeed keeps them gathered (persistent)."""


def test_deepspeed_zero3_keeps_persistent_and_soon_reused_parameters() -> None:
    row = estimate_comm(
        model=LLAMA_2_7B, gpus=32, gpus_per_node=32, framework="deepspeed", strategies="zero3"
    ).row("zero3")
    # forward: every non-persistent parameter, 6,738,149,376 bf16 elements × (31/32) × 2 B
    # backward: not those reused within 1e9 elements (2 × the parameters after them < 1e9): the head, the
    # last block and block 30's v, o, gate, up, down (502,267,904) → 6,235,881,472 × 31/32 × 2
    # reduce_scatter: all 6,738,415,616 gradients; after the step: the 65 norms, 266,240 × 31/32 × 2
    assert _bytes(row) == {
        "all_gather forward": 13_055_164_416,
        "all_gather backward": 12_082_020_352,
        "reduce_scatter backward": 13_055_680_256,
        "all_gather after_step": 515_840,
    }
    # one fetch per module holding non-persistent parameters: embedding + 32 × 7 + head = 226; 13 kept
    assert [c.calls_per_step for c in row.collectives if c.op.value == "all_gather"] == [226, 213, 65]


def test_zeropp_turns_the_papers_3m_into_0_75m() -> None:
    """Wang et al. 2023: ZeRO-3 moves 3M across the full group per step (forward and backward all-gathers
    and the gradient reduce-scatter, M = the fp16 model); ZeRO++ 0.75M: int8 forward all-gather 0.5M, the
    backward all-gather inside the node (hpZ) 0, int4 gradients 0.25M over both hops."""
    zero3 = estimate_comm(model=LLAMA_2_7B, gpus=32, gpus_per_node=8, strategies="zero3").row("zero3")
    # the paper's schedule: 3 × (31/32) × 2 × 6,738,415,616
    assert zero3.total_bytes_per_gpu == 39_167_040_768
    zeropp = estimate_comm(
        model=LLAMA_2_7B, gpus=32, gpus_per_node=8, framework="deepspeed", strategies="zero3", zeropp="all"
    ).row("zero3")
    data = {
        (c.op.value, c.phase.value, c.group.value): c.total_bytes_per_gpu
        for c in zeropp.collectives
        if not c.scales
    }
    forward = data[("all_gather", "forward", "world")]  # int8: (31/32) × 6,738,149,376 non-persistent
    backward_across = sum(
        b
        for (op, phase, group), b in data.items()
        if phase == "backward" and op == "all_gather" and group != "node"
    )
    gradients = data[("all_to_all", "backward", "node")] + data[("all_to_all", "backward", "across_nodes")]
    assert forward == 6_527_582_208
    assert backward_across == 0
    # int4: hop 1 (7/8) × Ψ_q/2 = 2,947,940,352, hop 2 (3/4) × Ψ_q/16 = 315,850,752; Ψ_q = 6,738,149,376
    assert gradients == 3_263_791_104  # = (31/32) × Ψ_q / 2
    assert round((forward + backward_across + gradients) / zero3.total_bytes_per_gpu, 4) == 0.25  # 0.75M / 3M


def test_zeropp_needs_deepspeed_zero3_and_qgz_needs_the_shapes() -> None:
    with pytest.raises(InputError, match="zeropp is DeepSpeed ZeRO-3's"):
        estimate_comm("7B", 16, framework="fsdp2", zeropp="qwz")
    with pytest.raises(InputError, match="zeropp is DeepSpeed ZeRO-3's"):
        estimate_comm("7B", 16, framework="deepspeed", strategies="zero2", zeropp="all")
    with pytest.raises(InputError, match="zeropp qgz: its scales follow each gradient's shape"):
        estimate_comm("7B", 16, framework="deepspeed", zeropp="qgz")
    with pytest.raises(InputError, match="zeropp 'int3' is not accepted; accepted: all, none"):
        estimate_comm("7B", 16, framework="deepspeed", zeropp="int3")
    one_node = estimate_comm(
        model=LLAMA_2_7B, gpus=8, framework="deepspeed", strategies="zero3", zeropp="qgz"
    )
    assert any("qgZ does nothing on one node" in note for note in one_node.notes)


def test_hpz_secondary_partition_is_a_line_of_deepspeed_zero3_memory() -> None:
    report = estimate_peak(LLAMA_2_7B, 32, 8, framework="deepspeed", strategies="zero3", zeropp="hpz")
    (line,) = [x for x in report.peak.row("zero3").states if x.name == "ZeRO++ hpZ secondary partition"]
    # every parameter (a multiple of 32 elements) over the node's 8 ranks, bf16: 6,738,415,616 / 8 × 2
    assert line.bytes == 1_684_603_904 and not line.in_framework_estimate
    plain = estimate_peak(LLAMA_2_7B, 32, 8, framework="deepspeed", strategies="zero3")
    # resident through the step: the allocated peak grows by exactly its bytes
    hpz, without = report.peak.row("zero3"), plain.peak.row("zero3")
    assert hpz.allocated_peak_bytes - without.allocated_peak_bytes == line.bytes


# ------------------------------------------------------------------------------------------- grad-sync
def test_grad_sync_is_stated_and_frameworks_that_fix_it_say_so() -> None:
    est = estimate_comm(PSI, 2, framework="fsdp", grad_accum=4)
    assert {r.grad_sync.value for r in est.strategies} == {"every"}
    assert "PyTorch's default" in est.row("zero3").grad_sync_reason
    paper = estimate_comm(PSI, 2, grad_accum=4, grad_sync="every")  # the paper fixes DDP and ZeRO-1 to once
    assert paper.row("ddp").grad_sync.value == "last"
    assert any(note.startswith("DDP: grad_sync every does not apply") for note in paper.notes)
    with pytest.raises(InputError, match="grad_sync 'sometimes' is not accepted; accepted: every, last"):
        estimate_comm(PSI, 2, grad_sync="sometimes")


# ------------------------------------------------------------------- Megatron-LM's distributed optimizer
def test_megatron_distributed_optimizer_reduce_scatters_fp32_main_grads_and_gathers_bf16_params() -> None:
    """One bucket per buffer (no --overlap-grad-reduce), Ψ = PSI at d = 2: each parameter starts at a
    multiple of 64 (one flat tensor here), the bucket ends at a multiple of lcm(2, 128) = 128:
    S = 1,231,104; reduce-scatter (1/2)·4·S of the fp32 main gradients = 2,462,208, all-gather (1/2)·2·S of
    the bf16 parameters after the step = 1,231,104 (core/distributed/param_and_grad_buffer.py)."""
    row = estimate_comm(PSI, 2, framework="megatron", strategies="zero1", grad_accum=4).row("zero1")
    assert _bytes(row) == {"reduce_scatter backward": 2_462_208, "all_gather after_step": 1_231_104}
    assert [c.dtype.value for c in row.collectives] == ["fp32", "bf16"]


def test_megatron_without_the_distributed_optimizer_all_reduces_the_main_grads_unpadded() -> None:
    row = estimate_comm(PSI, 2, framework="megatron", strategies="ddp", grad_accum=4).row("ddp")
    assert _bytes(row) == {"all_reduce backward": 2 * 4 * PSI // 2}  # 2(n−1)/n·4Ψ, once per step


def test_megatron_pads_each_parameter_to_64_elements_in_its_buffer() -> None:
    """GPT-2 shrink by tensors: Σ ceil(numel/64)·64 over its parameters, then to a multiple of 128."""
    from zerocalc.model.architecture import parameter_tensors

    aligned = sum(-(-t.numel // 64) * 64 for t in parameter_tensors(GPT2))
    padded = -(-aligned // 128) * 128
    row = estimate_comm(model=GPT2, gpus=2, framework="megatron", strategies="zero1").row("zero1")
    assert _bytes(row)["reduce_scatter backward"] == 4 * padded // 2
