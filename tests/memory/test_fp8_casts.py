"""torchao's eager fp8 casts in the step's peak (zerocalc/peak/fp8.py): the ops a cast runs, the layer's
forward program with them, the forward and backward moments by hand, and what they add to a run's peak."""

from __future__ import annotations

from zerocalc.model.architecture import Architecture, MlpKind, NormKind
from zerocalc.model.code import MODEL_CODES, Shape, layer_saves
from zerocalc.model.code.base import ModelImplName
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.peak.fp8 import (
    CAST_TRANSIENT,
    cast_backward_excess,
    cast_forward_excess,
    scale_bytes,
    with_casts,
)
from zerocalc.peak.timeline import Program, _program_run
from zerocalc.request.presets import load_model

WIDE = Architecture(
    name="wide", vocab_size=1024, hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=4,
    intermediate_size=2048, mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM, family="llama",
)  # fmt: skip
"""The wider Llama of docs/validate-fake.md: h 512, f 2048, a 8, kv 4 (d 64)."""
TENSORWISE = Fp8Setting(Fp8RecipeName.TENSORWISE, skip=("lm_head",))
T, H, F = 128, 512, 2048
"""b 2, s 64."""


def _program(fp8: Fp8Setting) -> tuple[tuple[str, str, int], ...]:
    saves = layer_saves(MODEL_CODES[ModelImplName.HF], WIDE, 0, Shape(2, 64), 2)
    assert saves.program
    return with_casts(saves.program, WIDE, 0, fp8, T)


def test_a_cast_holds_nine_bytes_per_element_at_its_largest() -> None:
    """fp32 scaled (4) + fp32 clamped (4) + fp8 result (1)."""
    assert CAST_TRANSIENT == 9
    assert scale_bytes(TENSORWISE, 4096) == 4
    assert scale_bytes(Fp8Setting(Fp8RecipeName.ROWWISE), 4096) == 4 * 4096


def test_the_forward_program_casts_the_input_then_the_weight_before_each_projection() -> None:
    """gate_proj's output op comes after its input's cast (T·h = 65,536 elements) and its weight's
    (f·h = 1,048,576), and both fp8 results and scales are freed after it; with the FP8 all-gather only
    the input is cast."""
    ops = _program(TENSORWISE)
    at = ops.index(next(op for op in ops if op[1].endswith(": gate output")))
    before = [op for op in ops[:at] if op[1].startswith("mlp.gate_proj")]
    assert ("temp", "mlp.gate_proj input: scaled", 4 * T * H) in before
    assert ("temp", "mlp.gate_proj weight: clamped", 4 * F * H) in before
    assert ("temp", "mlp.gate_proj weight fp8", F * H) in before
    after = ops[at + 1 : at + 5]
    assert {name for verb, name, _ in after if verb == "drop"} == {
        "mlp.gate_proj input fp8", "mlp.gate_proj input scale", "mlp.gate_proj weight fp8",
        "mlp.gate_proj weight scale",
    }  # fmt: skip
    gathered = _program(TENSORWISE._replace(all_gather=True))
    assert not any("weight" in name for _, name, _ in gathered if name.startswith("mlp."))
    assert sum(verb == "temp" and name.endswith("input: abs") for verb, name, _ in ops) == 7  # each Linear


def test_the_layers_forward_peak_is_the_down_projections_weight_cast() -> None:
    """Above what the layer holds before it: the program's peak, by hand at down_proj's weight cast: every
    saved tensor of the layer, the mid residual (act·T·h), the fp8 input (T·f) and its scale, and the
    weight's fp32 scaled and clamped copies, its fp8 result and scale (9·h·f + 4)."""
    saves = layer_saves(MODEL_CODES[ModelImplName.HF], WIDE, 0, Shape(2, 64), 2)
    plain = _program_run(Program(saves.program), 0, 0, False, 1)
    cast = _program_run(Program(_program(TENSORWISE)), 0, 0, False, 1)
    assert plain.effect is not None and cast.effect is not None
    saved = sum(b for _, b in saves.saved)
    assert cast.effect.saved == plain.effect.saved == saved
    assert cast.effect.peak == saved + 2 * T * H + (T * F + 4) + (9 * H * F + 4)


def test_llama_3_8bs_largest_forward_cast_is_the_down_projections_input() -> None:
    """b 1, s 8192 (T = 8192): the mid residual beside the cast of the 8192 × 14336 input,
    2·T·4096 + 9·T·14336 = 1,124,073,472 B; larger than its weight's (T·14336 + 9·4096·14336 beside the
    same residual)."""
    arch, _ = load_model("llama-3-8b")
    fp8 = Fp8Setting(Fp8RecipeName.TENSORWISE)
    t = 8192
    excess = cast_forward_excess(arch, 0, fp8, t, 2)
    assert excess == 2 * t * 4096 + 9 * t * 14336 == 1_124_073_472
    assert excess > 2 * t * 4096 + t * 14336 + 9 * 4096 * 14336
    assert cast_forward_excess(arch, 0, Fp8Setting(Fp8RecipeName.DELAYED), t, 2) == 0  # TE's fused casts


def test_the_gate_projections_backward_weight_cast_by_hand() -> None:
    """The wider Llama at T 128 (the tracker's backward peak, validate fake): the up projection starts its
    backward at act·h·f − act·T·f above the layer's, the gate projection act·h·f + act·T·h − 2·act·T·f
    above that; there its output gradient in fp8 (T·f and its scale) beside its weight's cast (9·f·h and
    its scale), each tensor in 512 B blocks."""
    up = 2 * H * F - 2 * T * F
    gate = up + 2 * H * F + 2 * T * H - 2 * 2 * T * F
    assert (up, gate) == (1_572_864, 2_752_512)
    expected = gate + (T * F + 512) + (2 * 4 * F * H + F * H + 512)
    assert cast_backward_excess(WIDE, 0, TENSORWISE, T, 2, 512) == expected == 12_452_864
    assert cast_backward_excess(WIDE, 0, TENSORWISE, T, 2) == gate + (T * F + 4) + (9 * F * H + 4)
    assert cast_backward_excess(WIDE, 0, Fp8Setting(Fp8RecipeName.CURRENT), T, 2) == 0


def test_transformer_engine_saves_a_converted_linears_input_in_fp8() -> None:
    """Megatron-LM with TE DelayedScaling, Llama 3 8B at b 1, s 8192 (T = 8192): the QKV, fc1 and fc2
    inputs saved at 1 B per element, the attention output kept in bf16 by the flash kernel and its fp8
    copy beside it: per layer T·h + T·f = 150,994,944 B fewer than bf16's."""
    from zerocalc.peak.fp8 import te_saved

    arch, _ = load_model("llama-3-8b")
    saves = layer_saves(MODEL_CODES[ModelImplName.MEGATRON], arch, 0, Shape(1, 8192), 2)
    fp8 = Fp8Setting(Fp8RecipeName.DELAYED, skip=("output",))
    saved = te_saved(saves.saved, arch, 0, fp8, 2, True)
    names = dict(saved)
    assert names["qkv_input (fp8)"] == names["mlp_input (fp8)"] == 8192 * 4096
    assert names["down_input (fp8)"] == 8192 * 14336
    assert names["out_proj_input"] == 2 * names["out_proj_input (fp8 copy)"] == 2 * 8192 * 4096
    before, after = sum(b for _, b in saves.saved), sum(b for _, b in saved)
    assert before - after == 8192 * 4096 + 8192 * 14336 == 150_994_944
    assert te_saved(saves.saved, arch, 0, Fp8Setting(Fp8RecipeName.TENSORWISE), 2, True) == saves.saved
