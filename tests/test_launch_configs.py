"""Launch configurations (DeepSpeed ds_config.json, torchtitan job TOML, accelerate config) read into the same
request the flags give: the same peak as the equivalent flags, flags overriding the file, every key zerocalc
does not model listed, and what it cannot honour refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import keywords_in_notes
from typer.testing import CliRunner

from zerocalc import InputError
from zerocalc.api import estimate_peak
from zerocalc.cli import app
from zerocalc.request.launch import LaunchFormat, read_launch_config

runner = CliRunner()

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "reduce_bucket_size": 100_000_000,
        "stage3_prefetch_bucket_size": "auto",
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "gradient_clipping": 1.0,
}
DS_FLAGS = ["--framework", "deepspeed", "--strategy", "zero3", "--micro-batch", "2", "--grad-accum", "4"]
DS_FLAGS += ["--offload-optimizer", "cpu", "--reduce-bucket", "100000000", "--precision", "bf16-mixed"]
DS_FLAGS += ["--optimizer", "adamw"]

TITAN_TOML = """
[model]
name = "llama3"
flavor = "8B"
[optimizer]
name = "AdamW"
lr = 3e-4
[training]
local_batch_size = 2
seq_len = 4096
mixed_precision_param = "bfloat16"
mixed_precision_reduce = "float32"
steps = 1000
[parallelism]
data_parallel_shard_degree = 8
fsdp_reshard_after_forward = "default"
tensor_parallel_degree = 1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""
TITAN_FLAGS = ["--model", "llama-3-8b", "--framework", "fsdp2", "--model-impl", "torchtitan", "--gpus", "8"]
TITAN_FLAGS += ["--strategy", "zero3", "--micro-batch", "2", "--seq-len", "4096", "--precision", "bf16-mixed"]
TITAN_FLAGS += ["--reduce-dtype", "fp32", "--recompute", "op", "--optimizer", "adamw"]

ACCELERATE_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: true
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
mixed_precision: bf16
num_machines: 2
num_processes: 16
"""
ACCELERATE_FLAGS = ["--framework", "fsdp2", "--strategy", "zero3", "--recompute", "full"]
ACCELERATE_FLAGS += ["--precision", "bf16-mixed", "--gpus", "16", "--gpus-per-node", "8"]


def _memory(argv: list[str]) -> dict:
    result = runner.invoke(app, ["memory", *argv, "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_ds_config_gives_the_peak_of_the_equivalent_flags(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DS_CONFIG))
    from_file = _memory(["--model", "llama-3-8b", "--gpus", "8", "--deepspeed", str(path)])
    from_flags = _memory(["--model", "llama-3-8b", "--gpus", "8", *DS_FLAGS])
    assert from_file["peak"] == from_flags["peak"] and from_file["strategies"] == from_flags["strategies"]
    assert from_file["options"] == from_flags["options"]
    unmodelled = "gradient_clipping, zero_optimization.stage3_prefetch_bucket_size"
    assert f"deepspeed ds_config.json: not modelled: {unmodelled}" in from_file["notes"]
    assert any("stage3_prefetch_bucket_size is 'auto'" in note for note in from_file["notes"])


def test_a_torchtitan_toml_gives_the_peak_of_the_equivalent_flags(tmp_path: Path) -> None:
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TITAN_TOML)
    from_file = _memory(["--torchtitan", str(path)])
    from_flags = _memory(TITAN_FLAGS)
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    assert "torchtitan llama3_8b.toml: not modelled: optimizer.lr, training.steps" in from_file["notes"]


def test_an_accelerate_config_gives_the_peak_of_the_equivalent_flags(tmp_path: Path) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE_YAML)
    from_file = _memory(["--model", "llama-3-8b", "--accelerate", str(path)])
    from_flags = _memory(["--model", "llama-3-8b", *ACCELERATE_FLAGS])
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    unmodelled = (
        "accelerate accelerate.yaml: not modelled: compute_environment, fsdp_config.fsdp_auto_wrap_policy"
    )
    assert unmodelled in from_file["notes"]


def test_flags_override_the_file_and_the_library_reads_it_too(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS_CONFIG))
    cli = _memory(["--model", "llama-3-8b", "--gpus", "8", "--deepspeed", str(path), "--micro-batch", "1"])
    assert cli["options"]["micro_batch"] == 1 and cli["options"]["grad_accum"] == "4"
    library = estimate_peak("llama-3-8b", "8", deepspeed=str(path), micro_batch="1")
    assert library.options == cli["options"]
    assert keywords_in_notes(json.loads(json.dumps(library.to_json_dict()))["peak"]) == keywords_in_notes(
        cli["peak"]
    )


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (LaunchFormat.TORCHTITAN, "[parallelism]\npipeline_parallel_degree = 8\n",
         "parallelism.pipeline_parallel_degree 8 is not modelled; accepted: 1 .zerocalc models dp × cp × tp"),
        (LaunchFormat.DEEPSPEED, '{"zero_optimization": {"stage": 4}}',
         "zero_optimization.stage 4 is not modelled; accepted: 0, 1, 2 or 3"),
        (LaunchFormat.DEEPSPEED, "{not json", "is not JSON"),
        (LaunchFormat.ACCELERATE, "distributed_type: TPU\n", "distributed_type 'TPU' is not modelled"),
        (LaunchFormat.ACCELERATE, "fsdp_config:\n  - a\n", "is not a 'key: value' line"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_naming_the_key(
    kind: LaunchFormat, text: str, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        read_launch_config(kind, text, "{deepspeed} f")


def test_a_torchtitan_mesh_gives_the_flags_mesh(tmp_path: Path) -> None:
    path = tmp_path / "llama3_8b_tp.toml"
    path.write_text(
        TITAN_TOML.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2")
        .replace("data_parallel_shard_degree = 8", "data_parallel_shard_degree = 2")
        .replace("[activation_checkpoint]", "context_parallel_degree = 2\n[activation_checkpoint]")
        .replace('mode = "selective"', 'mode = "full"')
    )
    from_file = _memory(["--torchtitan", str(path)])
    flags = [*TITAN_FLAGS[: TITAN_FLAGS.index("--recompute")], "--recompute", "full", "--optimizer", "adamw"]
    flags += ["--tp", "2", "--cp", "2"]
    from_flags = _memory(flags)
    # FSDP2 shards over dp_shard × cp = 4 ranks; the whole run is dp_shard × cp × tp = 8 GPUs
    assert from_file["request"]["mesh"] == from_flags["request"]["mesh"]
    assert from_file["request"]["mesh"]["world"] == 8 and from_file["request"]["cluster"]["world_size"] == 4
    assert from_file["peak"]["strategies"] == from_flags["peak"]["strategies"]


def test_a_refused_launch_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "tp.toml"
    path.write_text("[parallelism]\nexpert_parallel_degree = 8\n")
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--torchtitan", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"zerocalc: error: --torchtitan {str(path)!r}: parallelism.expert_parallel_degree 8 is not modelled; "
        "accepted: 1 (zerocalc models dp × cp × tp meshes)"
    ]
    missing = runner.invoke(
        app, ["memory", "--model", "llama-3-8b", "--deepspeed", str(tmp_path / "none.json")]
    )
    assert missing.exit_code == 2 and "cannot be read (No such file or directory)" in missing.stderr


def test_each_launch_config_option_names_a_format() -> None:
    from zerocalc.request.options import LAUNCH_CONFIGS

    assert tuple(kind.value for kind in LaunchFormat) == LAUNCH_CONFIGS


@pytest.mark.parametrize(
    ("option", "values"),
    [('selective_ac_option = "op"', {"recompute": "op"}),
     ('selective_ac_option = "1"', {"recompute": "full", "checkpoint_every": "1"}),
     ('selective_ac_option = "0"', {"recompute": "full", "checkpoint_every": "1"}),
     ('selective_ac_option = "3"', {"recompute": "full", "checkpoint_every": "3"}),
     ("selective_ac_option = 4", {"recompute": "full", "checkpoint_every": "4"}),
     ("", {"recompute": "full", "checkpoint_every": "2"})],
)  # fmt: skip
def test_torchtitan_selective_options_map_to_their_recompute(option: str, values: dict) -> None:
    """torchtitan v0.2.2 ``_apply_ac_to_transformer_block``: ``op`` is the op-level policy;
    ``_apply_layer_sac`` checkpoints block k whole when ``not ac_freq or k % ac_freq == 0``: every block
    for 0 and 1, every N-th for N; without the key its default ``"2"`` (``config/job_config.py``)."""
    text = f'[activation_checkpoint]\nmode = "selective"\n{option}\n'
    read = read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f").values
    assert {key: read[key] for key in values} == values
    assert "checkpoint_every" in read or values == {"recompute": "op"}


@pytest.mark.parametrize(
    ("line", "reduce_dtype"),
    [("", "fp32"), ('mixed_precision_reduce = "float32"', "fp32"),
     ('mixed_precision_reduce = "bfloat16"', "bf16")],
)  # fmt: skip
def test_torchtitan_reduces_in_fp32_unless_the_file_says_otherwise(line: str, reduce_dtype: str) -> None:
    """torchtitan v0.2.2 ``config/job_config.py``: ``mixed_precision_reduce: Literal["float32"] =
    "float32"``; a file without the key reduces in fp32, as ``--reduce-dtype fp32``."""
    text = f"[training]\nlocal_batch_size = 2\n{line}\n"
    read = read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f").values
    assert read["reduce_dtype"] == reduce_dtype


def test_an_unknown_selective_option_is_refused_naming_the_value() -> None:
    text = '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "layer"\n'
    with pytest.raises(
        InputError, match="selective_ac_option 'layer' is not modelled; accepted: op, or a whole"
    ):
        read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f")


def test_every_second_block_checkpointed_gives_the_peak_of_the_equivalent_flags(tmp_path: Path) -> None:
    """torchtitan's default selective option ("2") is ``--recompute full --checkpoint-every 2``."""
    path = tmp_path / "llama3_8b_layer_sac.toml"
    path.write_text(TITAN_TOML.replace('selective_ac_option = "op"\n', ""))
    from_file = _memory(["--torchtitan", str(path)])
    flags = [*TITAN_FLAGS[: TITAN_FLAGS.index("--recompute")], "--recompute", "full", "--optimizer", "adamw"]
    from_flags = _memory([*flags, "--checkpoint-every", "2"])
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    assert str(from_file["options"]["checkpoint_every"]) == "2"
