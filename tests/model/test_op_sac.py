"""torchtitan's selective activation checkpointing: op-level (``--recompute op``): what each layer keeps by
hand (zerocalc/model/code/op_sac.py ``op_sac_layer``), the step timeline, the collectives it re-runs, the
refusals, and the policy run by real torch on CPU (zerocalc/validate/op_sac.py); layer-level
(``--recompute full --checkpoint-every N``): the timeline, the step time and the collectives re-run."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.comm.mesh import AG, AR, FWD, RS, MeshCall, Size
from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import Architecture, MlpKind, NormKind
from zerocalc.model.code import (
    MODEL_CODES,
    OP_SAC_MATMUL_ORDER,
    ModelImplName,
    Shape,
    hidden_bytes,
    layer_saves,
    op_sac_layer,
    op_sac_recomputes,
)
from zerocalc.parallel.frameworks import Estimate
from zerocalc.peak.simulate import StepResult, runtime_for, simulate
from zerocalc.plan.allocated import _states
from zerocalc.request.presets import load_model
from zerocalc.request.training import parse_options

runner = CliRunner()
TORCHTITAN = MODEL_CODES[ModelImplName.TORCHTITAN]
TINY = Architecture(
    name="tiny-llama", family="llama", vocab_size=128, hidden_size=64, num_layers=2, num_heads=8,
    num_kv_heads=4, intermediate_size=96, mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM,
)  # fmt: skip


def test_every_second_matmul_of_the_block_is_recomputed() -> None:
    """torchtitan's policy increments its counter at each ``aten.mm`` and saves it unless the count is
    even: of wq, wk, wv, wo, w1, w3, w2 (the order its Llama block calls them) wk, wo and w3."""
    recomputed = [name for name in OP_SAC_MATMUL_ORDER if op_sac_recomputes(name)]
    assert recomputed == ["k_proj", "o_proj", "up_proj"]
    assert not op_sac_recomputes("lm_head")


def test_llama_3_8b_kept_per_layer_by_hand() -> None:
    """Llama 3 8B (h 4096, 32 heads and 8 kv heads of 128, f 14336), b 2, s 8192: T = 16384 tokens.
    Kept: the wq, wv, w1, w2 outputs (bf16, T × 4096, 1024, 14336, 4096), the flash output (T × 4096)
    and its fp32 log-sum-exp (T × 32 heads). Under TP 2 with sequence parallelism (b 1): the column
    shards /2, w2's partial output whole (L × h), and the two reduce-scatters' R = L/2 rows."""
    arch, _ = load_model("llama-3-8b")
    T = 16384
    layer = op_sac_layer(TORCHTITAN, arch, 0, Shape(2, 8192), 2)
    kept = dict(layer.kept)
    assert kept == {
        "q_proj output": 2 * T * 4096,
        "v_proj output": 2 * T * 1024,
        "gate_proj output": 2 * T * 14336,
        "down_proj output": 2 * T * 4096,
        "flash attention output": 2 * T * 4096,
        "flash attention log-sum-exp (fp32)": 4 * T * 32,
    }
    assert sum(kept.values()) == 908_066_816
    # what backward saves beyond the kept outputs and the layer's input is allocated again by the recompute
    saved = sum(b for _, b in layer_saves(TORCHTITAN, arch, 0, Shape(2, 8192), 2).saved)
    aliased = 2 * T * 1024 + 2 * T * 14336 + 2 * T * 4096 + 4 * T * 32 + 2 * T * 4096  # v, gate, out, lse, x
    assert sum(b for _, b in layer.recomputed) == saved - aliased
    assert layer.consumed == ("q_proj output", "down_proj output")

    L, R = 8192, 4096
    split = dict(op_sac_layer(TORCHTITAN, arch, 0, Shape(1, 8192, tp=2, sequence_parallel=True), 2).kept)
    assert split == {
        "q_proj output": 2 * L * 2048,
        "v_proj output": 2 * L * 512,
        "gate_proj output": 2 * L * 7168,
        "down_proj output": 2 * L * 4096,
        "flash attention output": 2 * L * 2048,
        "flash attention log-sum-exp (fp32)": 4 * L * 16,
        "o_proj reduce-scatter output": 2 * R * 4096,
        "down_proj reduce-scatter output": 2 * R * 4096,
    }


def _tensors(recompute: str, checkpoint_every: int = 1) -> StepResult:
    """Llama 3 8B under torchtitan's code, FSDP2 on 8 GPUs, b 2, s 8192: the step's tensors alone (no
    allocator replay, so no blocks' remainders)."""
    request = parse_options(
        estimate=Estimate.MEMORY, model="llama-3-8b", gpus=8, strategies="zero3", framework="fsdp2",
        model_impl="torchtitan", micro_batch=2, seq_len=8192, recompute=recompute,
        checkpoint_every=checkpoint_every,
    )  # fmt: skip
    return simulate(request, request.strategies[0], runtime_for(request), _states(request), reserve=False)


def test_the_timeline_keeps_the_saved_outputs_and_every_layers_input() -> None:
    """After forward, op-level checkpointing holds per layer the 908,066,816 kept bytes more than full
    checkpointing (both keep every layer's input; full also keeps the int64 position ids [8192] its
    closures hold), and without checkpointing each layer holds instead everything backward saves (the
    norm's input being the layer's input)."""
    none, op, full = (_tensors(r) for r in ("none", "op", "full"))
    arch, _ = load_model("llama-3-8b")
    shape = Shape(2, 8192)
    kept = 908_066_816
    saved = sum(b for _, b in layer_saves(TORCHTITAN, arch, 0, shape, 2).saved)
    forward = {name: r.after_forward - r.start for name, r in (("none", none), ("op", op), ("full", full))}
    assert forward["op"] - forward["full"] == 32 * kept - 8 * 8192
    assert forward["none"] - forward["op"] == 32 * (saved - kept - hidden_bytes(arch, shape, 2))
    assert full.peak.allocated < op.peak.allocated < none.peak.allocated


def test_under_tensor_parallelism_the_recompute_gathers_again_and_keeps_the_reduce_scatters() -> None:
    """torchtitan's save list has ``_c10d_functional.reduce_scatter_tensor`` and no all-gather: its
    recompute runs a layer's all-gathers (and a Replicate output's all-reduce) again, not its
    reduce-scatters; full recomputation runs them all."""
    gather = MeshCall(AG, FWD, "attention input", Size.HIDDEN, "plan")
    scatter = MeshCall(RS, FWD, "attention output", Size.HIDDEN, "plan")
    reduce = MeshCall(AR, FWD, "attention output", Size.HIDDEN, "plan")
    assert gather.reruns_under(Recompute.OP) and reduce.reruns_under(Recompute.OP)
    assert not scatter.reruns_under(Recompute.OP)
    assert all(call.reruns_under(Recompute.FULL) for call in (gather, scatter, reduce))
    result = runner.invoke(
        app,
        ["comm", "--model", "llama-3-8b", "--gpus", "8", "--tp", "2", "--sequence-parallel", "--framework",
         "fsdp2", "--micro-batch", "2", "--seq-len", "8192", "--recompute", "op"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line.split()[:2] for line in result.stdout.splitlines() if line[:3] in ("AG ", "RS ")]
    assert ["AG", "rec"] in rows and ["RS", "rec"] not in rows


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["memory", "--model", "llama-3-8b", "--model-impl", "hf"],
         "--recompute op with llama-3-8b: its memory is modelled for torchtitan's Llama code; accepted: "
         "--model-impl torchtitan, or --recompute none, selective or full"),
        (["memory", "--model", "llama-3-8b", "--model-impl", "torchtitan", "--no-flash-attention"],
         "modelled with SDPA's flash kernel"),
        (["memory", "--model", "llama-3-8b", "--model-impl", "torchtitan", "--cp", "2"],
         "not modelled under context parallelism"),
        (["comm", "--model", "gpt2"], "--recompute op with gpt2: it is modelled for the dense Llama block"),
        (["comm", "--model", "mixtral-8x7b"], "it is modelled for the dense Llama block"),
    ],
)  # fmt: skip
def test_op_is_refused_where_it_is_not_modelled(argv: list[str], fragment: str) -> None:
    result = runner.invoke(app, [*argv, "--gpus", "8", "--framework", "fsdp2", "--recompute", "op"])
    one_line_error(result, fragment)


def test_comm_takes_op_for_any_llama_blocks_code() -> None:
    """The step time and collectives depend on the block's matmul order only, which transformers' Llama
    code shares with torchtitan's: ``comm`` (which takes no model code) accepts op for Llama."""
    result = runner.invoke(app, ["comm", "--model", "llama-3-8b", "--gpus", "8", "--recompute", "op"])
    assert result.exit_code == 0, result.output


def test_the_policy_run_by_torch_saves_what_the_model_keeps() -> None:
    """torchtitan's policy under real ``create_selective_checkpoint_contexts`` (torch 2.13, CPU, bf16), on
    a two-layer Llama block of h 64, 8 heads, 4 kv heads, f 96 at b 2, s 16: per layer the distinct
    storages it saves equal :func:`op_sac_layer`'s kept bytes (21,504: 4096 + 2048 + 6144 + 4096 + 4096 +
    1024), the checkpoint keeps the layer's input, the forward's matmuls alternate saved / recomputed, the
    activations alive after forward (torch's ``MemTracker``) are the kept bytes of every layer above full
    checkpointing's, and backward runs exactly the wk, wo and w3 products again ([32, 32], [32, 64],
    [32, 96] per layer)."""
    pytest.importorskip("torch")
    from zerocalc.validate.op_sac import measure

    measured = measure(TINY, 2, 16)
    shape = Shape(2, 16)
    layer = op_sac_layer(TORCHTITAN, TINY, 0, shape, 2)
    assert sum(b for _, b in layer.kept) == 21_504
    assert len(measured.layers) == 2
    for one in measured.layers:
        assert one.saved_bytes == sum(b for _, b in layer.kept)
        assert one.input_bytes == hidden_bytes(TINY, shape, 2)
        assert one.mm_saved == tuple(not op_sac_recomputes(name) for name in OP_SAC_MATMUL_ORDER)
    assert measured.after_forward_op - measured.after_forward_full == 2 * 21_504
    assert measured.recomputed_mm_shapes == {(32, 32): 2, (32, 64): 2, (32, 96): 2}


def test_every_second_layer_checkpointed_keeps_half_the_layers_whole() -> None:
    """torchtitan's ``selective_ac_option = "2"`` (``_apply_layer_sac``: block k checkpointed when
    k % 2 == 0): of Llama 3 8B's 32 layers the 2nd, 4th, … 32nd keep only their input, the other 16 all
    they save; so after forward 16 × (saved − input) above full checkpointing and, less the int64
    position ids [8192] the checkpoint closures hold, as much below no checkpointing."""
    none, every_second, full = _tensors("none"), _tensors("full", 2), _tensors("full")
    arch, _ = load_model("llama-3-8b")
    shape = Shape(2, 8192)
    saved = sum(b for _, b in layer_saves(TORCHTITAN, arch, 0, shape, 2).saved)
    layer = saved - hidden_bytes(arch, shape, 2)
    forward = {
        name: r.after_forward - r.start for name, r in (("none", none), ("2", every_second), ("full", full))
    }
    assert forward["2"] - forward["full"] == 16 * layer
    assert forward["none"] - forward["2"] == 16 * layer - 8 * 8192


def test_every_nth_layer_reruns_that_share_of_the_forward_and_its_collectives() -> None:
    """Llama 3 8B's 32 layers, every 4th checkpointed: backward re-runs 8 layers' forward, a quarter of
    full recomputation's, and under TP 2 with sequence parallelism 8 of each layer's forward all-gathers
    and reduce-scatters per micro-batch."""
    from zerocalc.compute.ops import Kernels, micro_batch_ops
    from zerocalc.compute.time import micro_batch_time
    from zerocalc.request.compute import compute_table

    arch, _ = load_model("llama-3-8b")
    ops = micro_batch_ops(arch, Shape(2, 8192), Kernels(fused=False, flash=True), DType.BF16)
    table = compute_table(None, "h100-80gb").table
    full = micro_batch_time(table, ops, Recompute.FULL)
    quarter = micro_batch_time(table, ops, Recompute.FULL, checkpoint_every=4)
    assert quarter.recompute.total == pytest.approx(full.recompute.total / 4, rel=1e-12)
    none = micro_batch_time(table, ops, Recompute.NONE)
    assert quarter.flops - none.flops == pytest.approx((full.flops - none.flops) / 4, rel=1e-12)
    result = runner.invoke(
        app,
        ["comm", "--model", "llama-3-8b", "--gpus", "8", "--tp", "2", "--sequence-parallel", "--framework",
         "fsdp2", "--micro-batch", "2", "--seq-len", "8192", "--recompute", "full", "--checkpoint-every", "4",
         "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [
        (c["op"], c["calls_per_step"])
        for s in json.loads(result.stdout)["strategies"][:1]
        for c in s["mesh_collectives"]
        if c.get("recomputed")
    ]
    assert rows and all(calls == 8 for _, calls in rows), rows


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["memory", "--model", "llama-3-8b", "--recompute", "op"],
         "--checkpoint-every 2 with --recompute op: it picks the layers full recomputation checkpoints"),
        (["comm", "--model", "mixtral-8x7b", "--recompute", "full"],
         "--checkpoint-every 2 with mixtral-8x7b: every N-th layer of a mixture-of-experts model"),
    ],
)  # fmt: skip
def test_checkpoint_every_is_refused_outside_full_recompute_of_a_dense_model(
    argv: list[str], fragment: str
) -> None:
    result = runner.invoke(app, [*argv, "--gpus", "8", "--framework", "fsdp2", "--checkpoint-every", "2"])
    one_line_error(result, fragment)
