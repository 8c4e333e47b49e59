"""Activations per rank under tensor, sequence and context parallelism (zerocalc/model/code/),
against hand calculations from the frameworks' source and one CPU measurement."""

from __future__ import annotations

import re

import pytest

from zerocalc.model.activations import CpImpl
from zerocalc.model.architecture import Architecture, MlpKind, NormKind
from zerocalc.model.code import (
    MODEL_CODES,
    Device,
    ModelImplName,
    Shape,
    hidden_bytes,
    layer_saves,
    loss_parallel_transients,
    loss_saves,
    parallel_transients,
    parallel_unsupported,
    vocab_shard,
)
from zerocalc.request.presets import load_model

HF = MODEL_CODES[ModelImplName.HF]
MEGATRON = MODEL_CODES[ModelImplName.MEGATRON]
TORCHTITAN = MODEL_CODES[ModelImplName.TORCHTITAN]


def saved(impl, arch, shape: Shape, **options) -> dict[str, int]:
    return dict(layer_saves(impl, arch, 0, shape, 2, **options).saved)


def test_the_default_shape_is_one_rank_holding_the_micro_batch() -> None:
    shape = Shape(2, 1024)
    assert shape == Shape(2, 1024, tp=1, sequence_parallel=False, cp=1, cp_impl=CpImpl.RING)
    assert shape.tokens == shape.local_tokens == shape.sequence_tokens == 2048
    split = Shape(2, 1024, tp=4, sequence_parallel=True, cp=2)
    assert (split.tokens, split.local_tokens, split.sequence_tokens) == (2048, 1024, 256)
    assert Shape(2, 1024, tp=4, cp=2).sequence_tokens == 1024  # no SP: the norms' rows are replicated


def test_megatron_layer_is_korthikanti_table_2_per_rank() -> None:
    """GPT-3 175B (s 2048, b 1, t 8) through the model code: 23 sbh with TP, 14.25 sbh with TP + SP,
    13 sbh and 4.25 sbh under selective recomputation (Korthikanti Table 2,
    tests/model/test_activations.py)."""
    arch, _ = load_model("gpt3-175b")
    sbh = 2048 * 12288
    for sp, full, kept in ((False, 23 * sbh, 13 * sbh), (True, 57 * sbh // 4, 17 * sbh // 4)):
        shape = Shape(1, 2048, tp=8, sequence_parallel=sp)
        assert sum(saved(MEGATRON, arch, shape, flash=False).values()) == full
        assert sum(saved(MEGATRON, arch, shape, flash=False, selective=True).values()) == kept
    assert hidden_bytes(arch, Shape(1, 2048, tp=8, sequence_parallel=True), 2) == 2 * sbh // 8


def test_torchtitan_llama_3_8b_per_rank_by_hand() -> None:
    """Llama-3-8B (h 4096, 32 heads, 8 kv heads of 128, f 14336) at s 8192, b 1, t 8 with sequence
    parallelism under torchtitan's plan: L = 8192 tokens, R = 1024 norm rows, 4 heads, 1 kv head, f/t 1792."""
    arch, _ = load_model("llama-3-8b")
    shape = Shape(1, 8192, tp=8, sequence_parallel=True)
    s = saved(TORCHTITAN, arch, shape)
    L, R, h = 8192, 1024, 4096
    assert s["attention norm: input"] == s["MLP norm: input"] == 2 * R * h == 8_388_608
    assert s["attention norm: rstd (fp32)"] == 4 * R
    # the all-gathered (Replicate) input that wq/wk/wv and w1/w3 save: whole on every rank
    assert s["attention input (norm output): attention input (norm output)"] == 2 * L * h == 67_108_864
    assert s["MLP input (norm output): MLP input (norm output)"] == 2 * L * h
    assert s["q: q"] == s["attention output (o projection input): attention output (o projection input)"]
    assert s["q: q"] == 2 * L * 4 * 128 == 8_388_608
    assert s["k: k"] == s["v: v"] == 2 * L * 128 == 2_097_152
    assert s["softmax log-sum-exp: softmax log-sum-exp"] == 4 * L * 4
    assert s["gate output: gate output"] == 2 * L * 1792 == 29_360_128
    # 2 norms (input + rstd), 2 gathered inputs, q + out, k + v, lse, 4 f-wide tensors
    total = 2 * (2 * R * h + 4 * R) + 2 * 2 * L * h + 2 * 2 * L * 512 + 2 * 2 * L * 128 + 4 * L * 4
    assert sum(s.values()) == total + 4 * 2 * L * 1792 == 289_546_240
    saves = layer_saves(TORCHTITAN, arch, 0, shape, 2)
    # forward: w2's partial output (L x h), funcol's contiguous copy of it for the Shard(1) reduce-scatter,
    # the R-row result and the MLP norm's R-row output (feed_forward's argument): 2·2(L + R)h
    assert saves.forward_excess == 2 * 2 * (L + R) * h == 150_994_944
    # backward: the output gradient all-gathered to L rows beside w2's input gradient (L x f/t) and weight
    # gradient (h x f/t): 2(Lh + 1792L + 1792h), above the MLP moment 2(1792h) + 2·2(1792L)
    assert saves.backward_excess == 2 * (L * h + L * 1792 + h * 1792) == 111_149_056
    assert saves.program == ()


def test_hf_tensor_parallel_replicates_the_norms() -> None:
    """transformers' Llama plan has no sequence parallelism: the norms run on all L rows (the fp32 copy
    of LlamaRMSNorm included); only q, k, v, the attention output and the MLP are split."""
    arch, _ = load_model("llama-3-8b")
    whole = saved(HF, arch, Shape(1, 4096))
    split = saved(HF, arch, Shape(1, 4096, tp=4))
    for name, value in whole.items():
        sharded = name.split(":")[0] in {
            "q", "k", "v", "attention output (o projection input)", "softmax log-sum-exp", "gate output",
            "up output", "activation output", "activation × up (down input)",
        }  # fmt: skip
        assert split[name] == (value // 4 if sharded else value), name
    saves = layer_saves(HF, arch, 0, Shape(1, 4096, tp=4), 2)
    assert saves.forward_excess == 3 * 2 * 4096 * 4096  # mid residual, partial output, all-reduced output
    # the down projection's weight gradient and two f/t-wide gradients (2·4096·3584 + 2·2·4096·3584)
    # outweigh the up projection's all-reduced input gradient moment (2·2·4096·4096 = 67,108,864)
    assert saves.backward_excess == 2 * 4096 * 3584 + 2 * 2 * 4096 * 3584 == 88_080_384


def test_torchtitan_block_matches_a_cpu_measurement() -> None:
    """Measured on CPU (torch 2.13, gloo, world 2): a torchtitan v0.2.2 Llama block and output layer under
    apply_tp's plan (SequenceParallel norms, Shard(1) → Replicate before attention and the MLP, Colwise
    wq/wk/wv/w1/w3, Rowwise wo/w2 to Shard(1), the output Colwise to Shard(-1) under loss_parallel), bf16,
    b 2, s 16, h 64, 8 heads, 4 kv heads, f 96, V 128, saved tensors by ``saved_tensors_hooks`` on rank 0:
    [32, 64] bf16 ×2 (4096 B: the gathered attention and MLP inputs), [2, 4, 16, 8] bf16 ×2 (2048 B: q and
    the output), [2, 2, 16, 8] bf16 ×2 (1024 B: k, v), [2, 4, 16] fp32 (512 B: log-sum-exp), f/t-wide
    [32, 48] bf16 ×4 (3072 B), each norm's [2, 8, 1] fp32 rstd (64 B: s/t rows); LM head input [32, 64] bf16
    (4096 B), log-softmax [32, 64] fp32 (8192 B), target int64 [32] (256 B). (CPU's unfused RMSNorm keeps
    fp32 copies of its input where CUDA's fused kernel keeps the input itself.)"""
    tiny = Architecture(
        name="tiny-llama", family="llama", vocab_size=128, hidden_size=64, num_layers=1, num_heads=8,
        num_kv_heads=4, intermediate_size=96, mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM,
    )  # fmt: skip
    shape = Shape(2, 16, tp=2, sequence_parallel=True)
    s = {name.split(":")[0]: b for name, b in saved(TORCHTITAN, tiny, shape).items()}
    assert s["attention input (norm output)"] == s["MLP input (norm output)"] == 4096
    assert s["q"] == s["attention output (o projection input)"] == 2048
    assert s["k"] == s["v"] == 1024
    assert s["softmax log-sum-exp"] == 512
    for name in ("gate output", "up output", "activation output", "activation × up (down input)"):
        assert s[name] == 3072
    rstd = dict(saved(TORCHTITAN, tiny, shape))
    assert rstd["attention norm: rstd (fp32)"] == rstd["MLP norm: rstd (fp32)"] == 64
    assert dict(TORCHTITAN.final_saves(tiny, shape, 2, Device.CUDA))["LM head input"] == 4096
    assert loss_saves(TORCHTITAN, tiny, shape) == [
        ("log_softmax output (fp32)", 8192),
        ("target", 256),
        ("total_weight (fp32)", 4),
    ]


@pytest.mark.parametrize(
    ("b", "f", "sequence_parallel", "forward", "backward"),
    [
        (2, 512, True, 49_152, 163_840),  # backward: w2's weight gradient and two f/t-wide gradients
        (2, 64, True, 49_152, 32_768),  # backward: the output gradient's all-gather staging and cat
        (1, 64, True, 24_576, 16_384),  # b 1: the gather is a view; w2's input and weight gradients
        (2, 64, False, None, 24_576),  # w3's input gradient and its all-reduce, dW2, dW3, d(silu)
    ],
)
def test_tensor_parallel_excess_matches_a_cpu_trace(b, f, sequence_parallel, forward, backward) -> None:
    """Traced op by op on CPU (torch 2.13, gloo, world 2, rank 0): every local tensor a dispatch mode sees
    (the DTensor ops run first), live bytes after each op, for a torchtitan v0.2.2 Llama block (s 64,
    h 64, 8 heads, 4 kv heads, bf16) under apply_tp's plan at t 2 (and the same without SequenceParallel
    norms and with Replicate row-parallel outputs), its RMSNorm saving the input and an fp32 rstd as the
    CUDA kernel does; excess = peak − (live before the layer + the layer's saved tensors)."""
    tiny = Architecture(
        name="tiny-llama", family="llama", vocab_size=128, hidden_size=64, num_layers=1, num_heads=8,
        num_kv_heads=4, intermediate_size=f, mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM,
    )  # fmt: skip
    saves = layer_saves(TORCHTITAN, tiny, 0, Shape(b, 64, tp=2, sequence_parallel=sequence_parallel), 2)
    if forward is not None:
        assert saves.forward_excess == forward
    assert saves.backward_excess == backward


@pytest.mark.parametrize("impl", [TORCHTITAN, HF])
@pytest.mark.parametrize("cp_impl", [CpImpl.RING, CpImpl.ALLGATHER])
def test_ring_and_allgather_save_what_a_rank_of_s_over_c_tokens_saves(impl, cp_impl: CpImpl) -> None:
    arch, _ = load_model("llama-3-8b")
    assert saved(impl, arch, Shape(1, 8192, cp=4, cp_impl=cp_impl)) == saved(impl, arch, Shape(1, 2048))
    # the rotary tables cover the rank's positions
    assert impl.shared_saves(arch, Shape(1, 8192, cp=4), 2, False, Device.CUDA) == impl.shared_saves(
        arch, Shape(1, 2048), 2, False, Device.CUDA
    )


def test_ulysses_saves_the_attention_output_twice() -> None:
    """DeepSpeed's UlyssesSPAttentionHF: SDPA keeps k and v all-to-all'd to s x kv/c heads (as many bytes)
    beside the cache's local copies, and its output before the all-to-all back beside the o projection's
    input; Llama-3-8B, s 8192, c 4: L = 2048."""
    arch, _ = load_model("llama-3-8b")
    local = saved(HF, arch, Shape(1, 2048))
    ulysses = saved(HF, arch, Shape(1, 8192, cp=4, cp_impl=CpImpl.ULYSSES))
    extra = {name: b for name, b in ulysses.items() if name not in local}
    assert extra == {
        "k after the all-to-all: k after the all-to-all": 2 * 2048 * 8 * 128,
        "v after the all-to-all: v after the all-to-all": 2 * 2048 * 8 * 128,
        "attention output before the all-to-all: attention output before the all-to-all": 2 * 2048 * 4096,
    }


def test_context_parallel_transients_by_hand() -> None:
    """Llama-3-8B, s 8192, c 4 (L = 2048), bf16: the rank's K and V are kv = 2 * 2 * 2048 * 1024 =
    8 MiB; q is 2 * 2048 * 4096 B."""
    arch, _ = load_model("llama-3-8b")
    kv, q, fp32_q = 2 * 2 * 2048 * 1024, 2 * 2048 * 4096, 4 * 2048 * 4096

    def moments(impl, cp_impl):
        found = parallel_transients(impl, arch, 0, Shape(1, 8192, cp=4, cp_impl=cp_impl), 2)
        return {m.phase: m.nbytes for m in found}

    # Transformer Engine's ring keeps every step's K/V buffer (c of them) until the forward returns
    assert moments(MEGATRON, CpImpl.RING) == {"forward": 4 * kv, "backward": 4 * kv + q}
    # TE all-gather: gathered K/V (c kv) and its causal reordering of K then V (c kv / 2 more at once)
    assert moments(MEGATRON, CpImpl.ALLGATHER) == {"forward": 6 * kv, "backward": 10 * kv + q}
    # torch's alltoall rotater: the chunk in use, the copy sent, the chunk received; fp32 merged output
    fp32_kv_grads = 2 * 4 * 2 * 2048 * 1024  # the fp32 dK/dV chunk sent and the one received
    fp32_accumulators = 4 * 2048 * (4096 + 2 * 1024)
    assert moments(TORCHTITAN, CpImpl.RING) == {
        "forward": 3 * kv + fp32_q,
        "backward": 3 * kv + fp32_accumulators + fp32_kv_grads,
    }
    assert moments(TORCHTITAN, CpImpl.ALLGATHER)["forward"] == 5 * kv + fp32_q  # local copy + all c chunks
    ulysses = 2 * 2048 * (4096 + 2 * 1024)  # q, k, v before the all-to-all
    assert moments(HF, CpImpl.ULYSSES) == {"forward": ulysses, "backward": ulysses}
    saves = layer_saves(MEGATRON, arch, 0, Shape(1, 8192, cp=4), 2, flash=True)
    assert (saves.forward_excess, saves.backward_excess) == (4 * kv, 4 * kv + q)


def test_megatron_tensor_parallel_transients() -> None:
    """With sequence parallelism: the all-gathered L x h input of a column-parallel linear in forward;
    in backward the input gathered again beside the input gradient before its reduce-scatter. Without
    it Megatron's all-reduces run in place: no buffer."""
    arch, _ = load_model("gpt3-175b")
    L, h = 2048, 12288
    sp = layer_saves(MEGATRON, arch, 0, Shape(1, 2048, tp=8, sequence_parallel=True), 2, flash=False)
    assert (sp.forward_excess, sp.backward_excess) == (2 * L * h, 2 * 2 * L * h)
    tp = layer_saves(MEGATRON, arch, 0, Shape(1, 2048, tp=8), 2, flash=False)
    assert (tp.forward_excess, tp.backward_excess) == (0, 0)


def test_vocabulary_per_rank() -> None:
    """Megatron-LM: V padded to a multiple of 128·t (GPT-2's 50257 → 51200 at t 8), V/t columns;
    torchtitan's loss_parallel: ⌈V/t⌉ (Llama 3's 128256 / 8 = 16032) and one more fp32 copy of them at the
    loss's forward and backward peaks; transformers gathers every column.

    Traced op by op on CPU (torch 2.13, gloo, world 2, bf16 logits [256, 256] per rank, fp32 shard
    262,144 B): ``cross_entropy(logits.float())`` peaks at the bf16 logits and 2 fp32 shards in forward,
    3 in backward; under ``loss_parallel`` at 3 and 4."""
    gpt3, _ = load_model("gpt3-175b")
    llama, _ = load_model("llama-3-8b")
    shape = Shape(1, 2048, tp=8, sequence_parallel=True)
    assert tuple(vocab_shard(MEGATRON, gpt3, shape, vocab=51200)) == (2048, 6400, True)
    assert tuple(vocab_shard(TORCHTITAN, llama, shape)) == (2048, 16032, True)
    assert tuple(vocab_shard(HF, llama, Shape(1, 2048, tp=8))) == (2048, 128256, False)
    assert loss_parallel_transients(TORCHTITAN, llama, shape) == (4 * 2048 * 16032,) * 2
    assert loss_parallel_transients(MEGATRON, gpt3, shape) == (0, 0)
    cp = Shape(1, 8192, tp=8, sequence_parallel=True, cp=4)
    assert dict(loss_saves(TORCHTITAN, llama, cp))["log_softmax output (fp32)"] == 4 * 2048 * 16032


@pytest.mark.parametrize(
    ("impl", "model", "shape", "flash", "reason"),
    [
        (TORCHTITAN, "llama-3-8b", Shape(1, 8192, cp=2, cp_impl=CpImpl.ULYSSES), True, "not Ulysses"),
        (HF, "llama-3-8b", Shape(1, 8192, cp=2), False, "needs flash attention"),
        (HF, "mixtral-8x7b", Shape(1, 4096, tp=2), True, "mixture-of-experts"),
        (HF, "phi-3-mini-4k", Shape(1, 4096, tp=2), True, "dense colwise"),
        (HF, "llama-3-8b", Shape(1, 4096, tp=2, sequence_parallel=True), True, "no sequence parallelism"),
        (MEGATRON, "llama-3-8b", Shape(1, 4096, tp=16), True, r"value heads \(8\) is not divisible by 16"),
        (MEGATRON, "llama-3-8b", Shape(1, 4100, cp=8), True, r"sequence length \(4100\)"),
        (MEGATRON, "llama-3-8b", Shape(1, 4096, tp=8, cp=8, cp_impl=CpImpl.ULYSSES), True, "Ulysses needs"),
    ],
)
def test_unsupported_combinations_say_why(impl, model, shape, flash, reason) -> None:
    arch, _ = load_model(model)
    message = parallel_unsupported(impl, arch, shape, flash)
    assert message is not None
    assert re.search(reason, message)
    with pytest.raises(ValueError, match=reason):
        layer_saves(impl, arch, 0, shape, 2, flash=flash)


def test_megatron_moe_and_every_family_run_unsplit() -> None:
    """Megatron's accounting covers any layer under TP (experts tensor-parallel over the same ranks)."""
    arch, _ = load_model("mixtral-8x7b")
    whole = saved(MEGATRON, arch, Shape(1, 4096))
    split = saved(MEGATRON, arch, Shape(1, 4096, tp=2, sequence_parallel=True))
    assert split["experts_gate_output"] == whole["experts_gate_output"] // 2
    assert split["router_logits_fp32"] == whole["router_logits_fp32"] // 2  # the router reads R rows
    assert parallel_unsupported(MEGATRON, arch, Shape(1, 4096, tp=2), True) is None


def test_vocabulary_parallel_embedding_excess() -> None:
    """torchtitan: the L x h partial lookup and reduce_scatter_single's contiguous copy of it (traced on
    CPU: 32,768 B at b 2, s 64, h 64, t 2). Megatron-LM under SP: the partial output and its
    transpose(0, 1).contiguous() copy beside the masked ids (int64) and mask (bool); at b 1 the transpose
    is already contiguous, so the copy and the R-row reduce-scatter output; without SP nothing but the ids
    (the all-reduce is in place)."""
    tiny = Architecture(
        name="tiny-llama", family="llama", vocab_size=128, hidden_size=64, num_layers=1, num_heads=8,
        num_kv_heads=4, intermediate_size=96, mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM,
    )  # fmt: skip
    sp = Shape(2, 64, tp=2, sequence_parallel=True)
    assert TORCHTITAN.embedding_excess(tiny, sp, 2) == 32_768
    assert MEGATRON.embedding_excess(tiny, sp, 2) == 9 * 128 + 2 * (2 * 128 - 64) * 64
    b1 = Shape(1, 64, tp=2, sequence_parallel=True)  # L 64, R 32: the copy (L) and the result (R) above R
    assert MEGATRON.embedding_excess(tiny, b1, 2) == 9 * 64 + 2 * 64 * 64
    assert MEGATRON.embedding_excess(tiny, Shape(2, 64, tp=2), 2) == 9 * 128
    assert HF.embedding_excess(tiny, Shape(2, 64, tp=2), 2) == 0
    assert TORCHTITAN.embedding_excess(tiny, Shape(2, 64), 2) == 0
