"""Multi-head latent attention under Megatron-LM's tensor and sequence parallelism (``--tp`` with
DeepSeek-V3): what each layer gathers and reduce-scatters, the duplicated down projections' gradient
all-reduce, the per-rank GEMMs, and the refusals, against hand counts from Megatron-LM d98e8a6
(``core/transformer/multi_latent_attention.py`` ``MLASelfAttention``, the Transformer Engine layer spec) and
DeepSeek-V3's config.

DeepSeek-V3: h = 7168, a = 128 heads, r_q = 1536, r_kv = 512, d_rope = 64, d_nope = d_v = 128, 61 layers
(3 dense, 58 MoE with one shared expert), 256 routed experts. The job: b = 1, s = 4096, t = 2 with sequence
parallelism, e = 8 on 16 GPUs, one micro-batch: every per-layer row runs 61 times a step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from zerocalc.api import estimate_comm
from zerocalc.base.errors import InputError
from zerocalc.comm.mesh import Dimension, mesh_problem
from zerocalc.comm.step import request_ops
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import Mesh
from zerocalc.request.presets import load_model
from zerocalc.request.training import parse_options

JOB = dict(
    model="deepseek-v3", framework="megatron", sequence_parallel=True, strategies="zero1", micro_batch=1,
    seq_len=4096, flash_attention=True, tp=2, ep=8,
)  # fmt: skip
S, H, R_Q, R_KV, ROPE, LAYERS = 4096, 7168, 1536, 512, 64, 61


def _tp_rows() -> dict[tuple[str, str, str], tuple[int, int, int]]:
    row = estimate_comm(None, 16, **JOB).strategies[0]
    return {
        (c.op.value, c.phase.value, c.moves): (c.message_bytes, c.times_per_step, c.total_bytes_per_gpu)
        for c in row.mesh_collectives
        if c.dimension is Dimension.TP
    }


def test_latent_attention_gathers_its_low_rank_latents_and_never_the_layer_input() -> None:
    """The down projections run on each rank's [s/t, b, h] shard (duplicated ``TELinear``), so no row
    gathers the attention's b·s·h input; ``TELayerNormColumnParallelLinear`` gathers the normed q latent
    (S = b·s·r_q = 4096·1536 = 6,291,456 bf16 elements, 12,582,912 bytes) and kv latent (4096·512 =
    2,097,152, 4,194,304 bytes), again in backward, and reduce-scatters their gradients;
    ``gather_from_sequence_parallel_region(k_pos_emb)`` gathers the rotary key (4096·64 = 262,144, 524,288
    bytes) and reduce-scatters its gradient. Over t = 2 a rank sends (t − 1)/t of S: 61 layers a step
    send 61·6,291,456 = 383,778,816, 61·2,097,152 = 127,926,272 and 61·262,144 = 15,990,784 bytes."""
    rows = _tp_rows()
    q, kv, rope = 2 * S * R_Q, 2 * S * R_KV, 2 * S * ROPE
    expected = {
        ("all_gather", "forward", "latent attention: q latent, normed"): q,
        ("all_gather", "forward", "latent attention: kv latent, normed"): kv,
        ("all_gather", "forward", "latent attention: rotary key"): rope,
        ("reduce_scatter", "backward", "latent attention: rotary key gradient"): rope,
        ("all_gather", "backward", "latent attention: kv latent, gathered again"): kv,
        ("reduce_scatter", "backward", "latent attention: kv latent gradient"): kv,
        ("all_gather", "backward", "latent attention: q latent, gathered again"): q,
        ("reduce_scatter", "backward", "latent attention: q latent gradient"): q,
    }
    for key, message in expected.items():
        assert rows[key] == (message, LAYERS, LAYERS * message // 2)
    assert (
        rows["all_gather", "forward", "latent attention: q latent, normed"][2],
        rows["all_gather", "forward", "latent attention: kv latent, normed"][2],
        rows["all_gather", "forward", "latent attention: rotary key"][2],
    ) == (6_291_456 * LAYERS, 2_097_152 * LAYERS, 262_144 * LAYERS)
    assert not any("attention input" in moves for _, _, moves in rows)


def test_the_attention_output_and_the_shared_experts_keep_their_sequence_parallel_collectives() -> None:
    """``linear_proj`` (row-parallel) reduce-scatters the b·s·h = 29,360,128-element output and gathers its
    gradient in backward; every layer has a dense MLP or a shared expert (3 dense + 58 MoE with one shared
    expert), whose gather, reduce-scatter and backward three run as a dense MLP's: each 58,720,256 bytes,
    61 times."""
    rows = _tp_rows()
    hidden = 2 * S * H
    for key in (
        ("reduce_scatter", "forward", "attention output"),
        ("all_gather", "backward", "attention output gradient"),
        ("all_gather", "forward", "MLP input"),
        ("reduce_scatter", "forward", "MLP output"),
        ("all_gather", "backward", "MLP output gradient"),
        ("all_gather", "backward", "MLP input, gathered again"),
        ("reduce_scatter", "backward", "MLP input gradient"),
    ):
        assert rows[key] == (hidden, LAYERS, LAYERS * hidden // 2)


def test_the_duplicated_down_projections_gradients_join_the_tp_all_reduce() -> None:
    """``finalize_model_grads._allreduce_non_tensor_model_parallel_grads``: one flat fp32 buffer of every
    ``sequence_parallel`` parameter, which ``TELinear(parallel_mode="duplicated")`` sets on the q/kv down
    projections and ``LayerNormLinear`` on the q/kv norms. Per layer 2·7168 (the two norms) + 7168·1536 =
    11,010,048 (q down) + 1536 + 7168·(512 + 64) = 4,128,768 (kv down) + 512 = 15,155,200, × 61 =
    924,467,200; the 58 MoE layers' routers 256·7168 = 1,835,008 each: 106,430,464; the final norm 7168:
    1,030,904,832 elements. An all-reduce over t = 2 sends 2(t − 1)/t = 1 × S: 4,123,619,328 bytes."""
    key = ("all_reduce", "backward", "norm, row bias and duplicated down-projection gradients")
    elements = 61 * (2 * 7168 + 7168 * 1536 + 1536 + 7168 * 576 + 512) + 58 * 256 * 7168 + 7168
    assert elements == 1_030_904_832
    assert _tp_rows()[key] == (4 * elements, 1, 4 * elements)


def test_the_down_projections_run_on_the_sequence_shard_and_the_up_projections_on_the_gathered_rows() -> None:
    """A rank's GEMMs (M rows × N out × K in): q down 2048 × 1536 × 7168 and kv down 2048 × 576 × 7168 on
    its s/t = 2048 rows, whole; q up 4096 × (64·192 = 12,288) × 1536, kv up 4096 × (64·(128 + 128) =
    16,384) × 512 and the output 4096 × 7168 × (64·128 = 8192) on the gathered 4096 rows, a/t = 64 heads.
    The q/kv norms run on the 2048 rows too: half the bytes they move at t = 1."""
    ops = request_ops(parse_options(gpus=16, **JOB))
    gemms = {g.name: (g.m, g.n, g.k) for g in ops.layers[0].gemms}
    assert {k: gemms[k] for k in ("q_a_proj", "kv_a_proj", "q_b_proj", "kv_b_proj", "o_proj")} == {
        "q_a_proj": (2048, 1536, 7168),
        "kv_a_proj": (2048, 576, 7168),
        "q_b_proj": (4096, 12288, 1536),
        "kv_b_proj": (4096, 16384, 512),
        "o_proj": (4096, 7168, 8192),
    }
    whole = request_ops(parse_options(gpus=16, **{**JOB, "tp": 1, "sequence_parallel": False}))
    norms = {t.name: t.nbytes for t in ops.layers[0].traffic}
    norms_whole = {t.name: t.nbytes for t in whole.layers[0].traffic}
    for name in ("q_a_norm", "kv_a_norm"):
        assert 2 * norms[name] == norms_whole[name]


def test_latent_attention_under_tp_without_megatrons_schedule_is_refused_in_one_line() -> None:
    """Only Megatron-LM's (and the paper's, which lays the mesh out as Megatron-LM) latent attention under
    TP is modelled; without sequence parallelism MLASelfAttention never reduces the rotary key's partial
    gradient over the TP group (its one reduction is the backward of the sequence-parallel gather)."""
    arch, _ = load_model("deepseek-v3")
    dense = arch.model_copy(
        update=dict(num_experts=0, experts_per_token=0, num_shared_experts=0,
                    shared_expert_intermediate_size=None, dense_layers=())
    )  # fmt: skip
    mesh = Mesh(world=2, gpus_per_node=8, tp=2)
    problem = mesh_problem(dense, mesh, Framework.MEGATRON)
    assert problem is not None and "accepted: {sequence_parallel}, or {tp} 1" in problem
    assert (
        mesh_problem(dense, mesh.model_copy(update={"sequence_parallel": True}), Framework.MEGATRON) is None
    )
    problem = mesh_problem(dense, mesh, Framework.DEEPSPEED)
    assert problem is not None and "accepted: {tp} 1, or {framework} paper, megatron" in problem


DENSE_MLA = """title = "dense MLA"
source = "a test's"

[architecture]
family = "deepseek_v3"
vocab_size = 1024
hidden_size = 256
num_layers = 2
num_heads = 4
head_dim = 48
intermediate_size = 512
mlp = "swiglu"
norm = "rmsnorm"

[architecture.latent_attention]
q_lora_rank = 96
kv_lora_rank = 64
qk_nope_head_dim = 32
qk_rope_head_dim = 16
v_head_dim = 32
"""
"""A dense latent-attention model (a model file: no config.json reader builds one without routed
experts)."""


def test_a_dense_latent_attention_model_under_tp_needs_sequence_parallelism_and_no_userbuffers(
    tmp_path: Path,
) -> None:
    """Without sequence parallelism Megatron-LM leaves the rotary key's gradient partial (refused); with it
    the layer's rows are the latent ones: the q latent b·s·r_q = 128·96 = 12,288 bf16 elements (24,576
    bytes), 2 layers; ``--tp-comm-overlap``'s userbuffer model covers a dense layer's four TP linears, not
    the latents' gathers (refused)."""
    path = tmp_path / "dense-mla.toml"
    path.write_text(DENSE_MLA)
    job = dict(model=str(path), framework="megatron", tp=2, seq_len=128, strategies="ddp", gpu="h100-80gb")
    with pytest.raises(InputError, match="accepted: sequence_parallel, or tp 1"):
        estimate_comm(None, 2, **job)
    row = estimate_comm(None, 2, sequence_parallel=True, **job).strategies[0]
    q = [c for c in row.mesh_collectives if c.moves == "latent attention: q latent, normed"]
    assert [(c.message_bytes, c.times_per_step) for c in q] == [(24_576, 2)]
    with pytest.raises(InputError, match="not latent attention's gathers of its latents"):
        estimate_comm(None, 2, sequence_parallel=True, tp_comm_overlap=True, **job)
