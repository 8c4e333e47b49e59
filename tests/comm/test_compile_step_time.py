"""--compile and --async-tp in the step time: Inductor's fused kernels priced by the buffers they read and
write (counted from Inductor's generated code for a torchtitan block, docs/model.md), torchao's compiled
casts, and torch's micro-pipelined TP against a hand-drawn schedule."""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.comm.overlap import TeGemms, async_tp_exposed
from zerocalc.comm.step import STAGE_MICRO_BATCHES
from zerocalc.compute.fp8 import InputFrom, cast_bytes
from zerocalc.compute.ops import Kernels, micro_batch_ops
from zerocalc.model.code import Shape
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.request.presets import load_model

runner = CliRunner()
S = 8192
T = 2 * S  # tokens of a micro-batch of 2
H, F, HEADS, KV, D, V = 4096, 14336, 32, 8, 128, 128256  # Llama 3 8B
EAGER = Kernels(fused=False, flash=True)
TITAN = Kernels(fused=False, flash=True, compiled=True, complex_rotary=True)
HF = Kernels(fused=False, flash=True, compiled=True, compiled_head=True, compiled_loss=True)


def _traffic(kernels: Kernels) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    arch, _ = load_model("llama-3-8b")
    ops = micro_batch_ops(arch, Shape(2, S), kernels, DType.BF16)
    (layer,) = ops.layers
    inside = {t.name: (t.nbytes * t.count, t.backward * t.count) for t in layer.traffic}
    outside = {t.name: (t.nbytes * t.count, t.backward * t.count) for t in ops.outside_traffic}
    return inside, outside


def test_a_compiled_blocks_norms_and_residual_adds_are_one_region_of_18_and_30_bytes() -> None:
    """Forward: the attention norm r2 w2, the first residual add fused into the MLP norm r4 w2, the
    block's output x + attention + MLP r6 w2: 18 per element of h. Backward: the MLP norm's kernel reads
    gate's and up's input gradients, x, the attention output and the output gradient and writes h's
    gradient (12); the attention norm's reads that, q's, k's and v's input gradients, x and, for the MLP
    norm's weight gradient, gate's and up's gradients and the attention output again, and writes one
    (18): 30 = 16 + 2·3 + 4·2."""
    inside, _ = _traffic(TITAN)
    assert inside["norms and residual adds (compiled)"] == (18 * T * H, 30 * T * H)
    assert not {"input_norm", "post_attention_norm", "residual add"} & set(inside)
    eager, _ = _traffic(EAGER)
    assert eager["input_norm"][0] + eager["post_attention_norm"][0] + eager["residual add"][0] == 84 * T * H


def test_compiled_swiglu_moves_6_bytes_forward_and_10_backward() -> None:
    """Forward r gate, r up, w (6); backward r the gradient, gate, up, w their two gradients (10); per
    element of f."""
    inside, _ = _traffic(TITAN)
    assert inside["MLP activation"] == (6 * T * F, 10 * T * F)


def test_torchtitans_complex_rotary_stays_eager_and_transformers_fuses() -> None:
    """torchtitan's complex product: .float() r2 w4, ATen's product r4 w4, type_as r4 w2 = 20 each way
    (Inductor generates no complex code); transformers' rotate_half: its cat written and read back (w2
    r2), the product in place (r2 w2), backward r2 w2."""
    rotated = T * (HEADS + KV) * D
    assert _traffic(TITAN)[0]["rotary"] == (20 * rotated, 20 * rotated)
    assert _traffic(HF)[0]["rotary"] == (8 * rotated, 4 * rotated)
    assert _traffic(EAGER)[0]["rotary"] == (20 * rotated, 40 * rotated)


def test_a_compiled_block_copies_no_attention_output() -> None:
    """The flash kernel's output feeds the o projection as it is (no transpose-contiguous kernel)."""
    assert "attention output copy" in _traffic(EAGER)[0]
    assert "attention output copy" not in _traffic(TITAN)[0]


def test_the_compiled_loss_is_one_pass_forward_and_r2_w2_backward() -> None:
    """Per logit: online softmax over the 16-bit logits (r2), backward r2 w2; torchtitan's blocks alone
    leave the loss (18, 22) and the final norm (36) eager; transformers' whole forward fuses both."""
    logits = T * V
    assert _traffic(TITAN)[1]["loss"] == (18 * logits, 22 * logits)
    assert _traffic(TITAN)[1]["final norm"][0] == 36 * T * H
    assert _traffic(TITAN._replace(compiled_loss=True))[1]["loss"] == (2 * logits, 4 * logits)
    assert _traffic(HF)[1]["loss"] == (2 * logits, 4 * logits)
    assert _traffic(HF)[1]["final norm"][0] == 4 * T * H


@pytest.mark.parametrize(
    ("recipe", "source", "forward", "backward"),
    [
        # forward: the input's amax r2 and cast r2 w1, the weight's the same; backward: the weight r2 w1
        # (its amax saved), the output gradient r2 r2 w1 w1 (two layouts), the input again 5
        (Fp8RecipeName.TENSORWISE, InputFrom.SAVED, 5 * 6 + 5 * 12, 3 * 12 + 6 * 8 + 5 * 6),
        # a compiled norm writes the input: its FP8 copy alone (w1); backward its norm's kernel writes it
        # again (2)
        (Fp8RecipeName.TENSORWISE, InputFrom.NORM, 1 * 6 + 5 * 12, 3 * 12 + 6 * 8 + 2 * 6),
        # SwiGLU's output: cast 5, backward its saved FP8 copy re-laid out (r1 w1)
        (Fp8RecipeName.TENSORWISE, InputFrom.SWIGLU, 5 * 6 + 5 * 12, 3 * 12 + 6 * 8 + 2 * 6),
        # no FP8 weight gradient: the output gradient cast once, the input not again
        (Fp8RecipeName.ROWWISE_GW_HP, InputFrom.SAVED, 5 * 6 + 5 * 12, 3 * 12 + 5 * 8),
    ],
)
def test_torchaos_compiled_casts_read_twice_and_write_once(
    recipe: Fp8RecipeName, source: InputFrom, forward: int, backward: int
) -> None:
    """An (m × k) = 2 × 3 input, (n × k) = 4 × 3 weight, (m × n) = 2 × 4 output gradient."""
    assert cast_bytes(2, 4, 3, Fp8Setting(recipe), compiled=True, source=source) == (forward, backward)


def test_a_norms_cast_under_sequence_parallelism_runs_on_its_shard() -> None:
    """m 8 gathered rows, the norm's shard 2: the fused cast (1) and its backward copy (2) over 2·k, the
    output gradient (6) over the gathered 8·n."""
    fp8 = Fp8Setting(Fp8RecipeName.TENSORWISE)
    assert cast_bytes(8, 4, 3, fp8, True, InputFrom.NORM, norm_rows=2) == (
        1 * 2 * 3 + 5 * 12,
        3 * 12 + 6 * 8 * 4 + 2 * 2 * 3,
    )


def test_the_converted_blocks_casts_against_inductors_code() -> None:
    """The torchtitan block measured (h 256, q 256, k and v 128, f 768) at s 2048: 17.04 MB forward (the
    generated code 17.6), 44.83 MB backward (39-44)."""
    fp8, t = Fp8Setting(Fp8RecipeName.TENSORWISE), 2048
    norm, saved, swiglu = InputFrom.NORM, InputFrom.SAVED, InputFrom.SWIGLU
    linears = [(256, 256, norm), (128, 256, norm), (128, 256, norm), (256, 256, saved), (768, 256, norm),
               (768, 256, norm), (256, 768, swiglu)]  # fmt: skip
    totals = [
        sum(pair) for pair in zip(*(cast_bytes(t, n, k, fp8, True, s) for n, k, s in linears), strict=True)
    ]
    assert totals == [17_039_360, 44_826_624]


def test_a_compiled_blocks_norm_fed_linears_cast_their_input_at_one_byte() -> None:
    """q, k, v, gate and up read a norm's output: 1 B per input element; o and down 5."""
    arch, _ = load_model("llama-3-8b")
    fp8 = Fp8Setting(Fp8RecipeName.TENSORWISE)
    ops = micro_batch_ops(arch, Shape(2, S), TITAN, DType.BF16, fp8=fp8)
    casts = {t.name: t.nbytes for t in ops.layers[0].traffic if t.name.endswith("fp8 casts")}
    weights = {"q_proj": H * H, "k_proj": KV * D * H, "v_proj": KV * D * H, "o_proj": H * H,
               "gate_proj": F * H, "up_proj": F * H, "down_proj": H * F}  # fmt: skip
    inputs = {"o_proj": 5 * T * H, "down_proj": 5 * T * F}
    for name, weight in weights.items():
        assert casts[f"{name} fp8 casts"] == inputs.get(name, T * H) + 5 * weight, name


def test_async_tp_hides_the_collectives_behind_t_pieces_of_their_matmuls() -> None:
    """t = 4, each GEMM 4 s, each collective 6 s. All-gather → matmul: pieces of 1 s, a shard 2 s; the
    own piece 0-1, shard 1 arrives at 2 (piece 2-3), shard 2 at 4 (4-5), shard 3 at 6 (6-7): 3 s beyond
    the 4 s of pieces. Matmul → reduce-scatter: pieces 0-1, 1-2, 2-3, 3-4, their 1.5 s copies queued
    1-2.5, 2.5-4, 4-5.5, 5.5-7: 3 s. With 3 s collectives the shards arrive in time (0) and the last
    piece's 0.75 s copy is exposed."""
    same = {"qkv": 4.0, "proj": 4.0, "fc1": 4.0, "fc2": 4.0}
    gemms = TeGemms(same, same, same)
    assert async_tp_exposed(gemms, 6.0, 4) == pytest.approx((12.0, 12.0))
    assert async_tp_exposed(gemms, 3.0, 4) == pytest.approx((1.5, 1.5))


def test_the_stages_micro_batches_are_keyed_by_compile() -> None:
    """A plan's caches share the stages' micro-batches among candidates agreeing on what they read."""
    assert "activations.compile" in STAGE_MICRO_BATCHES.reads


TITAN_ARGS = ["comm", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--gpus-per-node", "8",
              "--framework", "fsdp2", "--model-impl", "torchtitan", "--strategy", "zero3", "--micro-batch",
              "1", "--seq-len", "8192", "--json"]  # fmt: skip


def _step(*args: str) -> dict:
    import json

    result = runner.invoke(app, [*TITAN_ARGS, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["strategies"][0]["step"]


def test_compile_and_async_tp_shorten_the_step_and_hide_tp() -> None:
    eager = _step("--tp", "8")
    compiled = _step("--tp", "8", "--compile", "model")
    pipelined = _step("--tp", "8", "--compile", "model", "--async-tp")
    assert compiled["elementwise_s"] < eager["elementwise_s"]
    assert compiled["matmul_s"] == pytest.approx(eager["matmul_s"])
    assert compiled["exposed_tp_s"] == pytest.approx(eager["exposed_tp_s"])
    assert pipelined["exposed_tp_s"] < compiled["exposed_tp_s"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--tp", "8", "--async-tp"], "'model' in --compile.components"),
        (["--async-tp", "--compile", "model"], "--async-tp with --tp 1"),
        (
            ["--tp", "8", "--async-tp", "--compile", "model", "--model-impl", "hf"],
            "accepted: --framework fsdp2",
        ),
    ],
)
def test_async_tp_is_refused_where_torchtitan_does_not_run_it(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, [*TITAN_ARGS, *args]), fragment)


def test_a_compiled_async_tp_step_says_how_it_is_priced() -> None:
    import json

    result = runner.invoke(app, [*TITAN_ARGS, "--tp", "8", "--compile", "model", "--async-tp"])
    notes = json.loads(result.stdout)["notes"]
    assert any(n.startswith("--compile model: the compiled part's element-wise work") for n in notes)
    assert any(
        n.startswith("--async-tp: each layer's TP all-gather and reduce-scatter in t pieces") for n in notes
    )
    eager = json.loads(runner.invoke(app, [*TITAN_ARGS, "--tp", "8"]).stdout)["notes"]
    assert not any(n.startswith(("--compile", "--async-tp")) for n in eager)
