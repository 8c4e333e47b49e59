"""FP8's step time (zerocalc/compute/fp8.py): which products run in FP8 and at what rate, the casts as
element-wise bytes, by hand; the table's FP8 rate from measured FP8 points or from the bf16 ones scaled to
the fp8 peak; `comm --fp8` through the CLI."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.compute.fp8 import TE_AMAX, TE_CAST_TRANSPOSE, TORCHAO_EAGER_CAST, cast_bytes, fp8_rate_note
from zerocalc.compute.ops import Kernels, micro_batch_ops
from zerocalc.compute.table import BandwidthPoint, ComputeTable, GemmPoint, Roofline, Tier
from zerocalc.compute.time import micro_batch_time
from zerocalc.model.activations import Recompute
from zerocalc.model.code import Shape
from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.request.compute import compute_table
from zerocalc.request.presets import load_model

runner = CliRunner()
T, H, KV, F = 8192, 4096, 1024, 14336
"""Llama 3 8B at b 1, s 8192: tokens, width, key/value width, MLP width."""
LAYER_MATRIX = H * H + 2 * H * KV + H * H + 3 * H * F
"""q, k, v, o, gate, up, down: 218,103,808 weights."""


def _bf16_only_table() -> ComputeTable:
    """Every bf16 GEMM at 700 TFLOP/s (one measured point), no FP8 point; the roofline's peaks 1,000 bf16
    and 2,000 fp8; element-wise kernels at 1 TB/s."""
    point = GemmPoint(m=T, n=H, k=H, dtype=DType.BF16, seconds=2 * T * H * H / 700e12, tflops=700)
    memory = tuple(BandwidthPoint(bytes=n, seconds=n / 1e12, bytes_per_s=1e12) for n in (2**10, 2**36))
    roofline = Roofline(
        peak_tflops={DType.BF16: 1000.0, DType.FP8: 2000.0}, memory_bytes_per_s=1e12,
        gemm_tiers=(Tier(at_least=0, efficiency=1),), memory_tiers=(Tier(at_least=0, efficiency=1),),
        attention_forward=0.5, attention_backward=0.5, source="test",
    )  # fmt: skip
    return ComputeTable(device_name="test", source="test", gemm=(point,), memory=memory, roofline=roofline)


def _layer_time(recipe: Fp8RecipeName, all_gather: bool = False) -> tuple[float, float, float, float]:
    """(forward matmul, backward matmul, forward element-wise, backward element-wise) seconds of one
    Llama 3 8B layer, eager code with flash attention, on :func:`_bf16_only_table`."""
    arch, _ = load_model("llama-3-8b")
    fp8 = Fp8Setting(recipe, all_gather=all_gather)
    ops = micro_batch_ops(arch, Shape(1, T), Kernels(fused=False, flash=True), DType.BF16, fp8=fp8)
    (layer,) = ops.layers
    one = ops._replace(layers=(layer._replace(layers=1),), outside_gemms=(), outside_traffic=())
    time = micro_batch_time(_bf16_only_table(), one, Recompute.NONE)
    return time.forward.matmul, time.backward.matmul, time.forward.elementwise, time.backward.elementwise


def test_an_8b_layers_fp8_products_run_at_the_bf16_efficiency_of_the_fp8_peak() -> None:
    """No FP8 point measured: 700 / 1,000 of the bf16 peak applied to the fp8 peak, 1,400 TFLOP/s. The
    layer's forward is 2·T·218,103,808 = 3.573·10¹² FLOPs: 2.552 ms in FP8 (5.105 ms in bf16); backward
    twice that; rowwise-gw-hp's weight gradient at the bf16 rate."""
    forward_flops = 2 * T * LAYER_MATRIX
    assert forward_flops == 3_573_412_790_272
    bf16_f, _, _, _ = _layer_time(Fp8RecipeName.NONE)
    assert bf16_f == pytest.approx(forward_flops / 700e12, rel=1e-12)
    forward, backward, _, _ = _layer_time(Fp8RecipeName.TENSORWISE)
    assert forward == pytest.approx(forward_flops / 1400e12, rel=1e-12)
    assert forward == pytest.approx(2.5524e-3, rel=1e-4)
    assert backward == pytest.approx(2 * forward_flops / 1400e12, rel=1e-12)
    _, high_wgrad, _, _ = _layer_time(Fp8RecipeName.ROWWISE_GW_HP)
    assert high_wgrad == pytest.approx(forward_flops / 1400e12 + forward_flops / 700e12, rel=1e-12)


def test_torchaos_eager_casts_by_hand() -> None:
    """q_proj (m 8192, n = k = 4096), 33 B per element cast (abs r2 w2, max r2, to fp32 r2 w4, × scale r4 w4,
    clamp r4 w4, to fp8 r4 w1): forward the input and the weight; backward the output gradient and the
    weight (dgrad), the output gradient and the input again (wgrad)."""
    assert TORCHAO_EAGER_CAST == (2 + 2) + 2 + (2 + 4) + (4 + 4) + (4 + 4) + (4 + 1)
    m, n, k = T, H, H
    forward, backward = cast_bytes(m, n, k, Fp8Setting(Fp8RecipeName.TENSORWISE))
    assert forward == 33 * (m * k + n * k) == 1_660_944_384
    assert backward == 33 * (m * n + n * k) + 33 * (m * n + m * k)
    gathered = cast_bytes(m, n, k, Fp8Setting(Fp8RecipeName.TENSORWISE, all_gather=True))
    assert gathered == (33 * m * k, 33 * m * n + 33 * (m * n + m * k))  # the weight is fp8 already
    high = cast_bytes(m, n, k, Fp8Setting(Fp8RecipeName.ROWWISE_GW_HP))
    assert high == (forward, 33 * (m * n + n * k))


def test_transformer_engines_fused_casts_by_hand() -> None:
    """One cast-transpose kernel per tensor, r2 w1 w1; current scaling's amax pass r2 more."""
    m, n, k = T, H, H
    assert cast_bytes(m, n, k, Fp8Setting(Fp8RecipeName.DELAYED)) == (4 * (m * k + n * k), 4 * m * n)
    per = TE_CAST_TRANSPOSE + TE_AMAX
    assert cast_bytes(m, n, k, Fp8Setting(Fp8RecipeName.CURRENT)) == (per * (m * k + n * k), per * m * n)
    fp8_params = Fp8Setting(Fp8RecipeName.BLOCKWISE, all_gather=True, model_init=True)
    assert cast_bytes(m, n, k, fp8_params) == (4 * m * k, 4 * m * n)


def test_the_casts_are_the_layers_added_elementwise_time() -> None:
    """Every one of the layer's 7 Linear weights converts: its casts' bytes at 1 TB/s are what FP8 adds to
    the layer's element-wise seconds."""
    shapes = [(H, H), (KV, H), (KV, H), (H, H), (F, H), (F, H), (H, F)]  # (n, k): q k v o gate up down
    casts = [cast_bytes(T, n, k, Fp8Setting(Fp8RecipeName.TENSORWISE)) for n, k in shapes]
    _, _, bf16_f, bf16_b = _layer_time(Fp8RecipeName.NONE)
    _, _, forward, backward = _layer_time(Fp8RecipeName.TENSORWISE)
    assert forward - bf16_f == pytest.approx(sum(f for f, _ in casts) / 1e12, rel=1e-9)
    assert backward - bf16_b == pytest.approx(sum(b for _, b in casts) / 1e12, rel=1e-9)


def test_a_measured_fp8_point_is_the_rate_where_it_was_measured() -> None:
    """The H100 table measured FP8 products: at a measured shape the rate is that point's, not the scaled
    bf16 one."""
    named = compute_table(None, "h100-80gb")
    assert named is not None
    table = named.table
    point = next(p for p in table.gemm if p.dtype is DType.FP8 and p.m >= 4096)
    bf16 = next(
        p for p in table.gemm if p.dtype is DType.BF16 and (p.m, p.n, p.k) == (point.m, point.n, point.k)
    )
    assert table.gemm_rate(point.m, point.n, point.k, DType.FP8) == point.tflops * 1e12
    assert point.tflops != pytest.approx(2 * bf16.tflops, rel=1e-3)


def test_a_gpu_without_fp8_tensor_cores_is_refused_in_one_line() -> None:
    """No fp8 peak and no FP8 points (the A100's table): FP8 GEMMs do not run there."""
    result = runner.invoke(
        app,
        ["comm", "--model", "llama-3-8b", "--gpus", "8", "--framework", "megatron", "--fp8", "delayed",
         "--gpu", "a100-80gb"],
    )  # fmt: skip
    line = one_line_error(result, "--fp8 on 'NVIDIA A100")
    assert "no FP8 tensor cores" in line and "or --fp8 none" in line


def _step(*args: str) -> dict:
    result = runner.invoke(
        app,
        ["comm", "--model", "llama-3-8b", "--gpus", "8", "--micro-batch", "1", "--seq-len", "8192", "--gpu",
         "h100-80gb", "--flash-attention", "--json", *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["strategies"][0]["step"]


def test_megatron_fp8_runs_its_gemms_faster_and_adds_its_casts() -> None:
    """Megatron-LM with TE DelayedScaling on an H100: the products at the measured FP8 rates (under the bf16
    ones), the casts on top of the element-wise time; current scaling's amax pass adds more."""
    bf16 = _step("--framework", "megatron")
    delayed = _step("--framework", "megatron", "--fp8", "delayed")
    current = _step("--framework", "megatron", "--fp8", "current")
    assert delayed["matmul_s"] < 0.75 * bf16["matmul_s"]
    assert delayed["elementwise_s"] > bf16["elementwise_s"]
    assert current["elementwise_s"] > delayed["elementwise_s"]
    assert current["matmul_s"] == delayed["matmul_s"]
    assert delayed["tokens_per_s_per_gpu"] > bf16["tokens_per_s_per_gpu"]


def test_torchaos_eager_casts_cost_more_than_its_fp8_gemms_save_on_llama_3_8b() -> None:
    """torchao eager (no torch.compile): its unfused casts (33 B per element, each Linear casting its own
    input) take more than the FP8 products save; the FP8 all-gather drops the weights' casts."""
    bf16 = _step("--framework", "fsdp2", "--strategy", "zero3")
    eager = _step("--framework", "fsdp2", "--strategy", "zero3", "--fp8", "tensorwise")
    gathered = _step("--framework", "fsdp2", "--strategy", "zero3", "--fp8", "tensorwise", "--fp8-all-gather")
    assert eager["matmul_s"] < bf16["matmul_s"]
    assert eager["compute_s"] > bf16["compute_s"]
    assert gathered["elementwise_s"] < eager["elementwise_s"]
    assert gathered["matmul_s"] == eager["matmul_s"]


def test_the_step_says_where_its_fp8_rates_come_from() -> None:
    """Measured FP8 points (the H100's), the bf16 points scaled (the assumption, said), the roofline."""
    named = compute_table(None, "h100-80gb")
    assert named is not None
    torchao = Fp8Setting(Fp8RecipeName.TENSORWISE)
    assert "measured FP8 GEMMs" in fp8_rate_note(torchao, named.table)
    scaled = fp8_rate_note(Fp8Setting(Fp8RecipeName.DELAYED), _bf16_only_table())
    assert "bf16 GEMM rate at each shape × the fp8 / bf16 datasheet peaks (an assumption" in scaled
    assert "fused casts" in scaled
    assert "roofline" in fp8_rate_note(torchao, _bf16_only_table().model_copy(update={"gemm": ()}))
