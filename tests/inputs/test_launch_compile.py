"""torch.compile and async TP in the launch files: torchtitan's ``[compile]`` (v0.2.2), the older
``training.compile``, async TP in either layout; accelerate's ``dynamo_config``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc import InputError
from zerocalc.cli import app
from zerocalc.request.launch import LaunchFormat, read_launch_config

runner = CliRunner()


def _titan(text: str) -> dict:
    return read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f").values


@pytest.mark.parametrize(
    ("text", "compiled"),
    [
        ("[compile]\nenable = true\n", "model,loss"),  # v0.2.2's default components
        ('[compile]\nenable = true\ncomponents = ["model"]\n', "model"),
        ('[compile]\nenable = true\ncomponents = ["loss"]\nbackend = "inductor"\n', "loss"),
        ("[compile]\nenable = true\ncomponents = []\n", "none"),
        ('[compile]\nenable = false\ncomponents = ["model"]\n', None),
        ("[training]\ncompile = true\nlocal_batch_size = 2\n", "model,loss"),  # v0.1.0: blocks and loss
        ("[training]\ncompile = true\nbatch_size = 2\n", "model"),  # 9dec370: the blocks alone
    ],
)
def test_torchtitans_compile_keys_map_to_compile(text: str, compiled: str | None) -> None:
    assert _titan(text).get("compile") == compiled


@pytest.mark.parametrize(
    "text",
    [
        "[compile]\nenable = true\n[parallelism]\nenable_async_tensor_parallel = true\n",
        "[training]\ncompile = true\nbatch_size = 2\n[experimental]\nenable_async_tensor_parallel = true\n",
    ],
)
def test_async_tp_in_either_layout_is_async_tp(text: str) -> None:
    assert _titan(text)["async_tp"] is True


def test_a_component_torchtitan_does_not_compile_is_refused() -> None:
    with pytest.raises(InputError, match=r"compile.components \['model', 'optimizer'\] is not accepted"):
        _titan('[compile]\nenable = true\ncomponents = ["model", "optimizer"]\n')


def _accelerate(lines: str) -> dict:
    text = f"distributed_type: MULTI_GPU\n{lines}"
    return read_launch_config(LaunchFormat.ACCELERATE, text, "{accelerate} f").values


@pytest.mark.parametrize(
    ("lines", "compiled"),
    [
        ("dynamo_config:\n  dynamo_backend: INDUCTOR\n", "model"),
        ("dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: max-autotune-no-cudagraphs\n", "model"),
        ("dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_use_fullgraph: true\n", "model"),
        ("dynamo_backend: inductor\n", "model"),
        ("dynamo_config:\n  dynamo_backend: 'NO'\n", None),
    ],
)
def test_accelerates_dynamo_backend_maps_to_compile(lines: str, compiled: str | None) -> None:
    assert _accelerate(lines).get("compile") == compiled


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        ("dynamo_config:\n  dynamo_backend: EAGER\n", "dynamo_config.dynamo_backend 'EAGER' is not modelled"),
        ("dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: max-autotune\n",
         "dynamo_mode 'max-autotune' is not modelled"),
        ("dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_use_regional_compilation: true\n",
         "dynamo_use_regional_compilation True is not modelled"),
    ],
)  # fmt: skip
def test_what_accelerate_compiles_and_zerocalc_does_not_price_is_one_line(
    tmp_path: Path, lines: str, fragment: str
) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(f"distributed_type: MULTI_GPU\n{lines}")
    result = runner.invoke(app, ["comm", "--model", "llama-3-8b", "--gpus", "8", "--accelerate", str(path)])
    one_line_error(result, fragment)


COMM = ["comm", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--gpus-per-node", "8",
        "--seq-len", "4096", "--json"]  # fmt: skip


def _step(argv: list[str]) -> dict:
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["strategies"][0]["step"]


def test_a_compiled_async_tp_toml_gives_the_step_of_the_equivalent_flags(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        "[compile]\nenable = true\n[parallelism]\ntensor_parallel_degree = 8\n"
        'enable_async_tensor_parallel = true\n[activation_checkpoint]\nmode = "none"\n'
    )
    from_file = _step([*COMM, "--torchtitan", str(path)])
    flags = ["--framework", "fsdp2", "--model-impl", "torchtitan", "--strategy", "zero3", "--tp", "8",
             "--recompute", "none", "--compile", "model,loss", "--async-tp", "--micro-batch", "8",
             "--reduce-dtype", "fp32", "--optimizer-impl", "fused"]  # fmt: skip
    assert from_file == _step([*COMM, *flags])
