"""What Megatron-LM's multi-head latent attention saves per rank under tensor and sequence parallelism
(``core/transformer/multi_latent_attention.py`` ``MLASelfAttention``, d98e8a6, with Transformer Engine's
``LayerNormLinear`` up projections), hand-counted on a small latent-attention layer, and what a rank
holds of DeepSeek-V3's.

The layer: h = 256, a = 4 heads, r_q = 96, r_kv = 64, d_nope = 32, d_rope = 16, d_v = 32 (d_qk = 48),
b = 1, s = 128, bf16, flash attention; t = 2 with sequence parallelism: the sequence shard has
rows = 64 tokens, the tensor-parallel region the gathered local = 128, a/t = 2 heads.
"""

from __future__ import annotations

from zerocalc.model.activations import ActivationShape, layer_terms
from zerocalc.model.architecture import LatentAttention, MlpKind, TensorParallelRank, layer_tensors
from zerocalc.request.presets import load_model

MLA = LatentAttention(
    q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
)


def _terms(tp: int, sequence_parallel: bool, mla: LatentAttention = MLA) -> dict[str, int]:
    return layer_terms(
        ActivationShape(
            seq_len=128, micro_batch=1, hidden=256, heads=4, kv_heads=4, head_dim=48, ffn_hidden=512,
            mlp=MlpKind.SWIGLU, dropout=False, flash_attention=True, tp=tp,
            sequence_parallel=sequence_parallel, latent=mla,
        )
    )  # fmt: skip


def test_latent_attention_keeps_latents_on_the_sequence_shard_and_heads_on_gathered_rows() -> None:
    """t = 2, sequence parallel, 2 bytes an element: the norm's input and the down projections' shared
    input 64·256·2 = 32,768 each; the q up projection's input before and after its norm 64·96·2 = 12,288
    each; the kv down projection's output 64·(64 + 16)·2 = 10,240 (the kv norm reads its r_kv split) and
    the normed kv latent 64·64·2 = 8,192; q and k 128·2·48·2 = 24,576 each, v and the output
    128·2·32·2 = 16,384 each; the log-sum-exp 128·2·4 = 1,024 (fp32)."""
    terms = _terms(2, True)
    expected = {
        "attn_norm_input": 32_768,
        "qkv_input": 32_768,
        "q_latent_norm_input": 12_288,
        "q_up_input": 12_288,
        "kv_down_output": 10_240,
        "kv_up_input": 8_192,
        "q": 24_576,
        "k": 24_576,
        "v": 16_384,
        "out_proj_input": 16_384,
        "softmax_logsumexp_fp32": 1_024,
    }
    assert {k: terms[k] for k in expected} == expected


def test_without_sequence_parallelism_the_latents_are_whole_on_every_rank() -> None:
    """t = 2 without sequence parallelism: the down projections run on all 128 rows of every rank (q
    latents 128·96·2 = 24,576, kv down output 128·80·2 = 20,480), the heads still split (q 24,576)."""
    terms = _terms(2, False)
    assert (terms["q_up_input"], terms["kv_down_output"], terms["q"]) == (24_576, 20_480, 24_576)


def test_a_latent_attention_without_a_q_rank_saves_no_q_latent() -> None:
    """``linear_q_proj`` reads the layer's normed input (``qkv_input``): no q latent is kept."""
    terms = _terms(2, True, MLA.model_copy(update={"q_lora_rank": None}))
    assert "q_up_input" not in terms and "q_latent_norm_input" not in terms
    assert terms["kv_up_input"] == 8_192


def test_a_tensor_parallel_rank_holds_the_down_projections_whole_and_a_th_of_the_heads() -> None:
    """DeepSeek-V3 at t = 2, as Megatron-LM d98e8a6 builds ``MLASelfAttention`` (``linear_q_down_proj`` and
    ``linear_kv_down_proj`` ``TELinear(parallel_mode="duplicated")``, the norms inside the
    ``TELayerNormColumnParallelLinear`` up projections whole, ``linear_proj`` row-parallel) and torchtitan
    v0.2.2's plan (``wq_a``, ``wkv_a``, ``q_norm``, ``kv_norm`` ``NoParallel``; ``wq_b``, ``wkv_b`` colwise,
    ``wo`` rowwise): q down 1536 × 7168 = 11,010,048, q norm 1536, q up (64·192 = 12,288) × 1536 =
    18,874,368, kv down (512 + 64) × 7168 = 4,128,768, kv norm 512, kv up (64·256 = 16,384) × 512 =
    8,388,608, output 7168 × (64·128 = 8192) = 58,720,256: 101,124,096 a layer."""
    arch, _ = load_model("deepseek-v3")
    rank = TensorParallelRank(**dict(arch), tp=2)
    shapes = {t.module.rsplit(".", 1)[-1]: t.shape for t in layer_tensors(rank, 0) if ".attn." in t.module}
    assert shapes == {
        "q_a_proj": (1536, 7168),
        "q_a_norm": (1536,),
        "q_b_proj": (12288, 1536),
        "kv_a_proj": (576, 7168),
        "kv_a_norm": (512,),
        "kv_b_proj": (16384, 512),
        "o_proj": (7168, 8192),
    }
    assert sum(t.numel for t in layer_tensors(rank, 0) if ".attn." in t.module) == 101_124_096
