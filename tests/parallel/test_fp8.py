"""FP8 training: the recipes as options and launch-file keys, the precision record's dtypes of a converted
Linear weight, which weights a recipe converts, and what it changes of model states and collectives."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.model.architecture import ParamTensor, parameter_tensors
from zerocalc.parallel.fp8 import Fp8Setting, torchtitan_fqn
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.precision import Fp8RecipeName, Fp8Use, PrecisionName
from zerocalc.request.launch import with_launch_configs
from zerocalc.request.options import Command
from zerocalc.request.presets import load_model
from zerocalc.request.training import TrainingRequest, parse_options

runner = CliRunner()
LLAMA = ["--model", "llama-3-8b", "--gpus", "8"]


def from_file(path: Path, **values: object) -> TrainingRequest:
    """The request a torchtitan job file (and ``values``) gives."""
    options, _ = with_launch_configs(Command.MEMORY, {"torchtitan": str(path), **values}, frozenset(values))
    return parse_options(**options)


# ------------------------------------------------------------------------------------------------ options
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--framework", "fsdp2", "--fp8", "delayed"],
         "--fp8 delayed under --framework fsdp2: it runs other recipes here; accepted: --fp8 tensorwise, "
         "rowwise, rowwise-gw-hp, or --framework megatron (transformer_engine)"),
        (["--framework", "megatron", "--fp8", "tensorwise"],
         "accepted: --fp8 delayed, current, blockwise, mxfp8"),
        (["--framework", "deepspeed", "--fp8", "current"], "it runs no FP8 recipe here"),
        (["--framework", "fsdp2", "--fp8", "rowwise", "--fp8-all-gather"],
         "--fp8-all-gather with --fp8 rowwise: torchao 0.18 Float8LinearConfig.enable_fsdp_float8_all_gather "
         "(tensorwise only"),
        (["--framework", "fsdp2", "--fp8-all-gather"],
         "--fp8-all-gather without an FP8 recipe changes nothing"),
        (["--framework", "fsdp2", "--fp8-skip", "output"], "--fp8-skip without an FP8 recipe"),
        (["--fp8", "e4m3"], "--fp8 'e4m3' is not accepted; accepted: none, tensorwise, rowwise"),
        (["--framework", "fsdp2", "--fp8", "tensorwise", "--fp8-precompute-scales"],
         "--fp8-precompute-scales under --framework fsdp2 without --fp8-all-gather"),
        (["--framework", "fsdp2", "--fp8", "tensorwise", "--fp8-model-init"],
         "--fp8-model-init under --framework fsdp2: its FP8 Linear layers keep the high-precision weight"),
        (["--framework", "megatron", "--fp8", "current", "--fp8-model-init"],
         "--fp8-model-init without --fp8-all-gather under --framework megatron"),
        (["--framework", "megatron", "--fp8", "delayed", "--fp8-all-gather", "--strategy", "ddp"],
         "--fp8-all-gather under --framework megatron with --strategy ddp"),
    ],
)  # fmt: skip
def test_an_fp8_recipe_or_switch_the_framework_does_not_run_is_refused_in_one_line(
    args: list[str], fragment: str
) -> None:
    one_line_error(runner.invoke(app, ["memory", *LLAMA, *args]), fragment)


def test_the_fp8_options_are_one_typed_setting_of_the_request() -> None:
    request = parse_options(
        model="llama-3-8b", gpus=8, framework="fsdp2", fp8="tensorwise", fp8_all_gather=True,
        fp8_precompute_scales=True, fp8_skip="output, attention.wq",
    )  # fmt: skip
    assert request.fp8 == Fp8Setting(Fp8RecipeName.TENSORWISE, True, True, False, ("output", "attention.wq"))
    assert parse_options(model="llama-3-8b", framework="fsdp2", fp8="rowwise_with_gw_hp").fp8.recipe is (
        Fp8RecipeName.ROWWISE_GW_HP
    )


def test_megatrons_fp8_parameter_gather_keeps_fp8_parameters_and_skips_the_output_layer() -> None:
    """Megatron-LM ``argument_utils.py``: ``fp8_param = args.fp8_param_gather``; its output layer is a
    ``tensor_parallel.ColumnParallelLinear``, not a Transformer Engine module."""
    fp8 = parse_options(
        model="llama-3-8b",
        gpus=8,
        framework="megatron",
        strategies="zero1",
        fp8="delayed",
        fp8_all_gather=True,
    ).fp8
    assert fp8.model_init and fp8.all_gather and fp8.skip == ("output",)


def test_a_torchtitan_float8_job_asks_what_the_flags_ask(tmp_path: Path) -> None:
    """torchtitan v0.2.2 ``[quantize.linear.float8]`` (recipe_name unset: tensorwise) and v0.1.0 ``[float8]``
    read as ``--fp8 tensorwise --fp8-all-gather --fp8-precompute-scales --fp8-skip output``."""
    flags = parse_options(
        model="llama-3-8b", gpus=8, framework="fsdp2", model_impl="torchtitan", strategies="zero3",
        fp8="tensorwise", fp8_all_gather=True, fp8_precompute_scales=True, fp8_skip="output",
    ).fp8  # fmt: skip
    for converter, table in (("quantize.linear.float8", "quantize.linear.float8"), ("float8", "float8")):
        path = tmp_path / f"{converter}.toml"
        path.write_text(
            f'[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["{converter}"]\n'
            "[parallelism]\ndata_parallel_shard_degree = 8\n"
            f"[{table}]\nenable_fsdp_float8_all_gather = true\n"
            'precompute_float8_dynamic_scale_for_fsdp = true\nfilter_fqns = ["output"]\n'
        )
        assert from_file(path).fp8 == flags
    path = tmp_path / "rowwise.toml"
    path.write_text('[model]\nconverters = ["float8"]\n[float8]\nrecipe_name = "rowwise_with_gw_hp"\n')
    assert from_file(path, model="llama-3-8b").fp8.recipe is Fp8RecipeName.ROWWISE_GW_HP


# ------------------------------------------------------------------------------------ the precision record
def test_a_converted_weight_keeps_its_stored_copy_and_gradients_and_feeds_its_gemms_fp8() -> None:
    """torchao 0.18 ``Float8Linear`` saves the high-precision input and weight, its casts transient; with the
    FSDP float8 all-gather the weight travels and is used in fp8; the reduction is untouched."""
    fsdp2 = FRAMEWORKS[Framework.FSDP2]
    plain = fsdp2.dtypes(PrecisionName.BF16_MIXED, DType.FP32)
    converted = fsdp2.dtypes(PrecisionName.BF16_MIXED, DType.FP32, fp8=Fp8Use(Fp8RecipeName.TENSORWISE))
    assert converted._replace(gemm_input=plain.gemm_input) == plain
    assert converted.gemm_input is DType.FP8 and converted.activation is DType.BF16
    gathered = fsdp2.dtypes(PrecisionName.BF16_MIXED, DType.FP32, fp8=Fp8Use(Fp8RecipeName.TENSORWISE, True))
    assert (gathered.all_gather, gathered.compute, gathered.stored, gathered.reduce) == (
        DType.FP8, DType.FP8, DType.FP32, DType.FP32,
    )  # fmt: skip


def test_transformer_engine_saves_the_fp8_input_and_its_parameter_gather_keeps_fp8_parameters() -> None:
    megatron = FRAMEWORKS[Framework.MEGATRON]
    te = megatron.dtypes(PrecisionName.BF16_MIXED, fp8=Fp8Use(Fp8RecipeName.DELAYED))
    assert (te.gemm_input, te.activation, te.stored, te.all_gather) == (
        DType.FP8,
        DType.FP8,
        DType.BF16,
        DType.BF16,
    )
    gathered = megatron.dtypes(PrecisionName.BF16_MIXED, fp8=Fp8Use(Fp8RecipeName.DELAYED, True, True))
    assert (gathered.stored, gathered.all_gather, gathered.master, gathered.main_gradient) == (
        DType.FP8, DType.FP8, DType.FP32, DType.FP32,
    )  # fmt: skip


# ------------------------------------------------------------------------------- which weights convert
def test_every_decoder_linear_converts_and_embeddings_norms_and_skipped_modules_do_not() -> None:
    """torchtitan v0.2.2 ``module_filter_fn``: nn.Linear only, both dims multiples of 16, no filter_fqns
    entry inside the name. Llama-3-8B: 7 Linear weights a layer × 32 and the output layer."""
    arch, _ = load_model("llama-3-8b")
    tensors = parameter_tensors(arch)
    everything = Fp8Setting(Fp8RecipeName.TENSORWISE)
    converted = [t for t in tensors if everything.converts(t)]
    assert len(converted) == 7 * 32 + 1
    assert {t.module for t in tensors if not everything.converts(t)} >= {"embed_tokens", "final_norm"}
    skipped = Fp8Setting(Fp8RecipeName.TENSORWISE, skip=("output",))
    assert [t.module for t in converted if not skipped.converts(t)] == ["lm_head"]
    wq = Fp8Setting(Fp8RecipeName.TENSORWISE, skip=("attention.wq",))
    assert sum(not wq.converts(t) for t in converted) == 32
    assert not everything.converts(
        ParamTensor(module="layers.0.mlp.gate_proj", name="weight", shape=(4104, 4096))
    )


def test_torchtitan_names_its_modules_as_its_llama_does() -> None:
    assert torchtitan_fqn("layers.3.attn.q_proj") == "layers.3.attention.wq"
    assert torchtitan_fqn("layers.3.mlp.down_proj") == "layers.3.feed_forward.w2"
    assert torchtitan_fqn("lm_head") == "output"


# ------------------------------------------------------------------------------------------- collectives
LAYER_LINEAR = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096
"""Llama-3-8B: q and o 4096², k and v 1024 × 4096 (8 KV heads of 128), gate, up and down 14336 × 4096."""
LAYER_NORMS = 2 * 4096
ROOT = 2 * 128256 * 4096 + 4096
"""The embedding and the output layer (untied), 128256 × 4096 each, and the final norm."""


def _collectives(*args: str) -> list[dict[str, object]]:
    import json

    result = runner.invoke(
        app,
        ["comm", *LLAMA, "--framework", "fsdp2", "--strategy", "zero3", "--micro-batch", "1", "--seq-len",
         "8192", "--json", *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["strategies"][0]["collectives"]


def test_the_fp8_all_gather_moves_decoder_linear_weights_at_one_byte_and_the_rest_in_bf16() -> None:
    """By hand: each of the 32 blocks' all-gather moves its 7 Linear weights at 1 B and its 2 norms at 2 B;
    the root's (forward only: never resharded) the embedding, the skipped output layer and the final norm at
    2 B; the amax of each of the 7 × 32 fp8 weights is all-reduced before each of its all-gathers (4 B);
    the reduce-scatter stays bf16."""
    rows = {(c["op"], c["phase"]): c for c in _collectives(
        "--fp8", "tensorwise", "--fp8-all-gather", "--fp8-skip", "output")}  # fmt: skip
    block = LAYER_LINEAR + 2 * LAYER_NORMS
    assert rows["all_gather", "forward"]["message_bytes"] == 32 * block + 2 * ROOT
    assert rows["all_gather", "forward"]["dtype"] == "fp8"
    assert rows["all_gather", "backward"]["message_bytes"] == 32 * block
    assert rows["all_reduce", "forward"]["calls_per_step"] == 7 * 32
    assert rows["all_reduce", "backward"]["message_bytes"] == 7 * 32 * 4
    bf16 = {(c["op"], c["phase"]): c for c in _collectives()}
    assert rows["reduce_scatter", "backward"] == bf16["reduce_scatter", "backward"]
    assert bf16["all_gather", "forward"]["message_bytes"] == 2 * (32 * (LAYER_LINEAR + LAYER_NORMS) + ROOT)


def test_precomputed_scales_are_one_stacked_all_reduce_after_the_step() -> None:
    rows = _collectives("--fp8", "tensorwise", "--fp8-all-gather", "--fp8-precompute-scales")
    reduces = [c for c in rows if c["op"] == "all_reduce"]
    assert [(c["phase"], c["calls_per_step"], c["message_bytes"]) for c in reduces] == [
        ("after_step", 1, (7 * 32 + 1) * 4)  # the output layer converted too (no --fp8-skip)
    ]


def test_without_the_fp8_all_gather_the_collectives_are_bf16s() -> None:
    assert _collectives("--fp8", "rowwise") == _collectives()


def test_a_torchtitan_float8_job_moves_what_the_flags_move(tmp_path: Path) -> None:
    path = tmp_path / "float8.toml"
    path.write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.float8"]\n'
        "[parallelism]\ndata_parallel_shard_degree = 8\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n"
        'mixed_precision_reduce = "bfloat16"\n'
        '[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\nfilter_fqns = ["output"]\n'
    )
    import json

    result = runner.invoke(app, ["comm", "--torchtitan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    from_file = json.loads(result.stdout)["strategies"][0]["collectives"]
    flags = _collectives(
        "--model-impl", "torchtitan", "--fp8", "tensorwise", "--fp8-all-gather", "--fp8-skip", "output"
    )
    assert [(c["op"], c["phase"], c["message_bytes"]) for c in from_file] == [
        (c["op"], c["phase"], c["message_bytes"]) for c in flags
    ]


def test_megatrons_fp8_parameter_gather_moves_fp8_weights() -> None:
    import json

    result = runner.invoke(
        app, ["comm", *LLAMA, "--framework", "megatron", "--strategy", "zero1", "--fp8", "delayed",
              "--fp8-all-gather", "--json"],
    )  # fmt: skip
    rows = {c["op"]: c for c in json.loads(result.stdout)["strategies"][0]["collectives"]}
    assert rows["all_gather"]["message_bytes"] == 32 * (LAYER_LINEAR + 2 * LAYER_NORMS) + 2 * ROOT
    assert rows["reduce_scatter"]["dtype"] == "fp32"


# ------------------------------------------------------------------------------------------ model states
CONVERTED = 32 * LAYER_LINEAR
PARAMS = 8_030_261_248


def _megatron_params(*args: str) -> dict[str, int]:
    import json

    result = runner.invoke(
        app, ["memory", *LLAMA, "--framework", "megatron", "--strategy", "zero1", "--json", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["strategies"][0]["states"][0]["parts"]


def test_transformer_engine_keeps_two_fp8_usages_of_each_converted_weight_beside_its_bf16_parameter() -> None:
    """TE 2.x ``module/linear.py``: the weight quantised rowwise and columnwise, cached across steps; the
    output layer is Megatron-LM's own ColumnParallelLinear (not converted)."""
    assert _megatron_params() == {"params_bf16": 2 * PARAMS}
    assert _megatron_params("--fp8", "delayed") == {
        "params_bf16": 2 * PARAMS,
        "fp8_weight_copies_fp8": 2 * CONVERTED,
    }
    assert _megatron_params("--fp8", "mxfp8")["fp8_scales"] == 2 * CONVERTED // 32  # E8M0, one per 32
    assert _megatron_params("--fp8", "blockwise")["fp8_scales"] == 2 * 4 * -(-CONVERTED // (128 * 128))


def test_megatrons_fp8_parameter_gather_drops_the_bf16_copy_of_the_converted_weights() -> None:
    assert _megatron_params("--fp8", "current", "--fp8-all-gather") == {
        "params_bf16": 2 * (PARAMS - CONVERTED),
        "fp8_params_fp8": 2 * CONVERTED,
    }


def test_torchaos_recipes_leave_fsdp2s_model_states_as_they_are() -> None:
    import json

    def states(*args: str) -> list[dict[str, object]]:
        result = runner.invoke(
            app, ["memory", *LLAMA, "--framework", "fsdp2", "--strategy", "zero3", "--json", *args]
        )
        return json.loads(result.stdout)["strategies"][0]["states"]

    assert states("--fp8", "tensorwise", "--fp8-all-gather") == states()


def test_the_memory_output_says_what_the_recipe_converts() -> None:
    result = runner.invoke(app, ["memory", *LLAMA, "--framework", "megatron", "--fp8", "delayed", "--json"])
    notes = [n for n in __import__("json").loads(result.stdout)["notes"] if n.startswith("--fp8")]
    assert notes == [
        "--fp8 delayed (transformer_engine: one scale per tensor from an amax history): 224 Linear weights "
        "(6.98B elements) run their GEMMs in fp8; skipped: output; embeddings, norms and the rest stay in "
        "high precision"
    ]


def test_an_fp8_recipe_needs_the_models_tensors() -> None:
    one_line_error(
        runner.invoke(app, ["memory", "--params", "7B", "--framework", "megatron", "--fp8", "delayed"]),
        "--fp8 delayed without --model: which Linear weights it converts follows the model's tensors",
    )


@pytest.mark.parametrize(
    ("gpu", "recipe", "runs"),
    [
        ("h100-80gb", "mxfp8", False),  # MXFP8: Blackwell's tensor cores (10.0)
        ("b200-180gb", "mxfp8", True),
        ("mi300x", "mxfp8", False),  # no CUDA compute capability stated
        ("l40s", "blockwise", False),  # Float8BlockScaling: Hopper on (9.0); Ada is 8.9
        ("h100-80gb", "blockwise", True),
        ("l40s", "delayed", True),  # FP8 tensor cores: 8.9
    ],
)
def test_an_fp8_recipe_the_gpus_tensor_cores_do_not_run_is_refused(gpu: str, recipe: str, runs: bool) -> None:
    result = runner.invoke(app, ["memory", *LLAMA, "--framework", "megatron", "--gpu", gpu, "--fp8", recipe])
    if runs:
        assert result.exit_code == 0, result.output
    else:
        line = one_line_error(result, f"--fp8 {recipe} on '{gpu}': its GEMMs need compute capability")
        assert "accepted: --gpu b200-180gb or gb200" in line or recipe != "mxfp8", line
