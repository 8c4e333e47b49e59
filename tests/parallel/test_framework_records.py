"""The framework records and the precision record: every model reads a framework's facts and a tensor's dtype
from one place (zerocalc/parallel/framework_records, zerocalc/parallel/precision.py)."""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_memory
from zerocalc.base.dtypes import DType, TensorRole
from zerocalc.cli import app
from zerocalc.parallel.framework_records import FRAMEWORKS, frameworks_with
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.precision import ParamKind, ParamLayout, PrecisionName, tensor_dtypes
from zerocalc.parallel.strategies import StrategyName
from zerocalc.peak.evaluate import evaluate
from zerocalc.request.training import parse_options
from zerocalc.states.deepspeed import zero1_model_states

runner = CliRunner()
BF16, FP32 = DType.BF16, DType.FP32


def test_every_framework_has_one_record_keyed_by_its_name() -> None:
    assert list(FRAMEWORKS) == list(Framework)
    assert all(record.framework is name for name, record in FRAMEWORKS.items())


# ------------------------------------------------------------------------------------ the precision record
@pytest.mark.parametrize(
    ("framework", "expected"),
    [
        # the ZeRO paper §3.1: bf16 parameters and gradients, an fp32 master copy and fp32 Adam states
        (Framework.PAPER, dict(stored=BF16, compute=BF16, gradient=BF16, main_gradient=BF16, reduce=BF16,
                               all_gather=BF16, master=FP32, optimizer_state=FP32)),
        # Megatron-LM: backward accumulates into fp32 main_grad, which the data-parallel ranks reduce
        (Framework.MEGATRON, dict(stored=BF16, compute=BF16, gradient=BF16, main_gradient=FP32, reduce=FP32,
                                  all_gather=BF16, master=FP32, optimizer_state=FP32)),
        # FSDP2 MixedPrecisionPolicy(param_dtype=bf16): fp32 shards, bf16 all-gather and gradients, reduce in
        # the compute dtype by default, fp32 sharded .grad; the fp32 parameters are their own master
        (Framework.FSDP2, dict(stored=FP32, compute=BF16, gradient=BF16, main_gradient=FP32, reduce=BF16,
                               all_gather=BF16, master=None, optimizer_state=FP32)),
        # DDP under autocast: fp32 parameters and .grad, reduced in fp32
        (Framework.DDP, dict(stored=FP32, compute=BF16, gradient=FP32, main_gradient=FP32, reduce=FP32,
                             all_gather=FP32, master=None, optimizer_state=FP32)),
    ],
)  # fmt: skip
def test_each_tensor_role_has_the_dtype_its_framework_keeps_under_bf16_mixed(
    framework: Framework, expected: dict[str, DType | None]
) -> None:
    dtypes = FRAMEWORKS[framework].dtypes(PrecisionName.BF16_MIXED)
    assert {name: dtypes.of(TensorRole(name)) for name in expected} == expected
    assert dtypes.activation is dtypes.gemm_input is BF16


def test_reduce_dtype_changes_only_the_reduction() -> None:
    plain = FRAMEWORKS[Framework.FSDP2].dtypes(PrecisionName.BF16_MIXED)
    fp32 = FRAMEWORKS[Framework.FSDP2].dtypes(PrecisionName.BF16_MIXED, reduce=FP32)
    assert fp32.reduce is FP32
    assert plain._replace(reduce=FP32) == fp32


def test_a_frozen_parameter_keeps_no_trained_tensor() -> None:
    frozen = tensor_dtypes(PrecisionName.BF16_MIXED, ParamLayout.MASTER_COPY, kind=ParamKind.FROZEN)
    assert (frozen.stored, frozen.compute, frozen.all_gather) == (BF16, BF16, BF16)
    assert frozen.gradient is frozen.main_gradient is frozen.reduce is None
    assert frozen.master is frozen.optimizer_state is None


def test_fp32_has_no_master_copy_in_any_layout() -> None:
    for layout in ParamLayout:
        dtypes = tensor_dtypes(PrecisionName.FP32, layout)
        assert dtypes.master is None
        assert set(dtypes._replace(master=FP32)) == {FP32}


# ------------------------------------------------------------------------ one source for the states tables
GIB = 2**30


def test_megatrons_states_table_holds_its_fp32_main_gradients() -> None:
    """Megatron-LM docs (distributed optimizer): 6 + 12/d bytes per parameter; 7B on 8: 2 + 4 + 12/8 = 7.5
    bytes, 52.5 GB, in both tables."""
    report = evaluate(parse_options(params="7B", gpus=8, framework="megatron", strategies="zero1"))
    assert (report.bytes_per_parameter.b_p, report.bytes_per_parameter.b_g) == (2, 4)
    row = report.strategies[0]
    assert row.gpu_bytes == 2 * 7_000_000_000 + 4 * 7_000_000_000 + 12 * 7_000_000_000 // 8
    assert row.gpu_bytes == report.framework_states[0].gpu_bytes


def test_fsdp2s_states_table_splits_the_parameters_as_it_keeps_them() -> None:
    """fp32 parameter and gradient shards and Adam's m, v: 4 + 4 + 8 bytes over 8 ranks, no master copy
    (the peak's parameters line is the same fp32 shard)."""
    report = estimate_memory(model="llama-3-8b", gpus=8, framework="fsdp2", strategies="zero3,shard_grad_op")
    per = report.bytes_per_parameter
    assert (per.b_p, per.b_g, per.k) == (4, 4, 8)
    psi = report.model.parameter_count.total
    shard = -(-psi // 8)
    for row in report.strategies:  # FSDP keeps only its shard between steps, SHARD_GRAD_OP too
        assert [s.bytes for s in row.states] == [4 * shard, 4 * shard, 8 * shard]


def test_the_frameworks_that_keep_another_layout_say_so() -> None:
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "fsdp2 keeps bf16-mixed as fp32 parameters cast to bf16 for forward and backward" in text


# --------------------------------------------------------------------------------- DeepSpeed ZeRO-1
def test_deepspeed_zero1_by_hand() -> None:
    """Stage 1 keeps its 16-bit parameters and gradients whole (2 + 2 bytes per parameter) and partitions
    the fp32 gradients, fp32 parameters and Adam states (4 + 4 + 8) over the GPUs: 7B on 8 GPUs, 42 GB."""
    psi = 7_000_000_000
    estimate = zero1_model_states(psi, num_gpus_per_node=8, num_nodes=1, cpu_offload=False)
    assert estimate.gpu_bytes == 2 * psi + 2 * psi + 16 * psi // 8
    assert (estimate.params_16bit_bytes, estimate.grads_16bit_bytes, estimate.sharded_bytes) == (
        2 * psi,
        2 * psi,
        16 * psi // 8,
    )


def test_deepspeed_zero1_is_modelled_by_memory() -> None:
    report = evaluate(parse_options(params="7B", gpus=8, framework="deepspeed", strategies="zero1"))
    lines = {line.name: line.bytes for line in report.framework_states[0].lines}
    assert lines["fp16/bf16 gradients (whole until the boundary's reduction)"] == 14_000_000_000
    assert report.framework_states[0].framework_estimate_bytes is None  # DeepSpeed has no stage-1 estimator


def test_deepspeed_runs_zero1_by_default() -> None:
    request = parse_options(params="7B", gpus=8, framework="deepspeed")
    assert StrategyName.ZERO1 in request.strategies


# ---------------------------------------------------------------------------- checks read the records
@pytest.mark.parametrize(
    ("option", "field", "dimension"),
    [("--tp", "tp_style", "tensor"), ("--cp", "cp_impls", "context"), ("--pp", "pipeline", "pipeline")],
)
def test_a_mesh_dimension_a_framework_does_not_compose_is_refused_naming_those_that_do(
    option: str, field: str, dimension: str
) -> None:
    result = runner.invoke(
        app, ["memory", "--model", "llama-3-8b", "--gpus", "8", "--framework", "ddp", option, "2"]
    )
    line = one_line_error(result)
    assert f"its {dimension} parallelism is not modelled" in line
    assert ", ".join(f.value for f in frameworks_with(field)) in line
