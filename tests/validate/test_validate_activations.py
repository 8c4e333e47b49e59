"""``zerocalc validate activations``: the hf profile against what the real transformers modules save.

Every family the profile describes is built from its tiny config (zerocalc/validate/saved.py), run forward
in train mode under ``saved_tensors_hooks`` on the CPU, and compared region by region (embedding, each
layer, final, loss) with :func:`zerocalc.validate.saved.predict_regions`: to the byte wherever the profile
claims exactness; where it does not (``NOT_EXACT``), the measurement must still differ, so a stale entry
fails. A few seconds per family (model build included), in-process.
"""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.model.code import HF_ATTENTION, Shape
from zerocalc.model.hf_config import architecture_from_hf_dict
from zerocalc.validate.saved import (
    NOT_EXACT,
    TINY_CONFIGS,
    MeasuredStorage,
    Term,
    _match,
    compare,
    not_exact_reason,
    predict_regions,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from zerocalc.validate import saved_measure  # noqa: E402

runner = CliRunner()
SHAPES = [(2, 64), (1, 48)]  # b = 1: the loss's target is a view of the padded labels (no copy)


def _arch(family: str):
    return architecture_from_hf_dict(TINY_CONFIGS[family], family, family)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("family", list(TINY_CONFIGS))
def test_saved_bytes_per_region_equal_the_profile(family: str, dtype: str, attention: str) -> None:
    if attention == "sdpa" and family not in HF_ATTENTION:  # its transformers code runs eager only
        pytest.skip(f"{family}: _supports_sdpa = False")
    arch = _arch(family)
    model = saved_measure.build(TINY_CONFIGS[family], dtype, attention)
    for b, s in SHAPES:
        measured = saved_measure.measure(model, arch.num_layers, b, s, arch.vocab_size)
        case = compare(family, arch, Shape(b, s), dtype, attention, measured)
        assert [r.region for r in case.regions][:2] == ["embedding", "layer 0"]
        assert case.regions[-1].region == "loss"
        if not_exact_reason(family, attention) is None:
            wrong = {r.region: (r.predicted, r.measured, r.unmatched_terms, r.unmatched_storages)
                     for r in case.regions if not r.ok}  # fmt: skip
            assert wrong == {}, f"{family} {dtype} {attention} b={b} s={s}"
        else:  # not claimed: it must still be off, else the NOT_EXACT entry is stale
            assert not case.exact or (b, s) != SHAPES[0]


def test_every_family_the_hf_profile_reads_has_a_tiny_config() -> None:
    from zerocalc.model.hf_config import FAMILIES

    assert set(TINY_CONFIGS) == set(FAMILIES)
    assert {family for family, _ in NOT_EXACT} <= set(FAMILIES)


def test_llama_layer_by_hand() -> None:
    """FINDINGS' per-layer formula for Llama under bf16 SDPA (flash): 16Th + 4T·a·d + 4T·kv·d + 8Tf + 4T·a
    + 8T (norm copies, q/k/v, SwiGLU, log-sum-exp, rsqrt), layer 0 also cos and sin 2·2·s·d; the loss
    4TV + 8T + 4; against both the profile and the measurement."""
    cfg = TINY_CONFIGS["llama"]
    b, s = 2, 64
    T, h, f, a, kv, d, V = b * s, cfg["hidden_size"], cfg["intermediate_size"], 8, 2, 16, cfg["vocab_size"]
    layer = 16 * T * h + 4 * T * a * d + 4 * T * kv * d + 8 * T * f + 4 * T * a + 8 * T
    regions = predict_regions(_arch("llama"), Shape(b, s), "bf16", "sdpa")
    assert sum(t.bytes for t in regions["layer 1"]) == layer
    assert sum(t.bytes for t in regions["layer 0"]) == layer + 4 * s * d
    assert sum(t.bytes for t in regions["loss"]) == 4 * T * V + 8 * T + 4
    model = saved_measure.build(cfg, "bf16", "sdpa")
    measured = saved_measure.measure(model, 2, b, s, V)
    assert sum(m.bytes for m in measured if m.region == "layer 1") == layer


def test_gemma_norm_keeps_one_plus_weight_in_fp32() -> None:
    """Gemma's ``output * (1.0 + self.weight.float())`` saves the fp32 sum over its width: four [h] per
    layer (the sandwich norms) and two [d] (the per-head q/k norms)."""
    model = saved_measure.build(TINY_CONFIGS["gemma3_text"], "bf16", "sdpa")
    measured = saved_measure.measure(model, 2, 2, 64, 1024)
    layer = [m for m in measured if m.region == "layer 1"]
    kept = sorted(m.bytes for m in layer if len(m.shape) == 1 and m.dtype == "fp32")
    h, d = TINY_CONFIGS["gemma3_text"]["hidden_size"], TINY_CONFIGS["gemma3_text"]["head_dim"]
    assert kept == sorted([4 * h] * 4 + [4 * d] * 2)
    terms = predict_regions(_arch("gemma3_text"), Shape(2, 64), "bf16", "sdpa")["layer 1"]
    assert sorted(t.bytes for t in terms if t.name.endswith("1 + weight (fp32)")) == kept


def test_match_names_what_each_side_lacks() -> None:
    terms = [Term(name="a", bytes=8), Term(name="b", bytes=16), Term(name="c", bytes=16)]
    storages = [MeasuredStorage(region="x", bytes=b, dtype="fp32", shape=(b // 4,)) for b in (16, 8, 32)]
    missing, extra = _match(terms, storages)
    assert [t.name for t in missing] == ["c"] and [s.bytes for s in extra] == [32]


@pytest.mark.slow
def test_cli_activations_table_and_exit_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["validate", "activations", "--family", "llama,gpt2", "--precision", "bf16-mixed"]
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "4 of 4 cases exact to the byte" in ok.stdout
    assert all(len(line) <= 80 for line in ok.stdout.splitlines())
    # a prediction one byte off must be reported and fail
    import zerocalc.validate.saved as saved

    real = saved.loss_saves
    monkeypatch.setattr(saved, "loss_saves", lambda *a: [*real(*a), ("one byte", 1)])
    off = runner.invoke(app, ["validate", "activations", "--family", "qwen2", "--attention", "sdpa"])
    assert off.exit_code == 1
    assert "qwen2 fp32 sdpa, loss: predicted" in off.stdout and "one byte (1 B)" in off.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--attention", "flash"], "--attention 'flash' is not accepted; accepted: sdpa"),
        (["--family", "bert"], "--family 'bert' is not accepted"),
        (
            ["--model", "llama-3-8b"],
            "accepted: a Hugging Face config.json (the modules are built from it), or --family",
        ),
        (["-b", "0"], "accepted: b ≥ 1, s ≥ 2"),
        (["-b", "1024", "-s", "1024"], "b·s ≤ 65,536"),
        (["-s", "many"], "--seq-len 'many' is not accepted; accepted: a whole number"),
        (["--device", "cpu"], "No such option: --device"),
        (["--precision", "fp16"], "--precision 'fp16' is not accepted"),
    ],
)
def test_cli_activations_bad_input(args: list[str], fragment: str) -> None:
    one_line_error(runner.invoke(app, ["validate", "activations", *args]), fragment)
