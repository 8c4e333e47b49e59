"""Launch configurations (DeepSpeed ds_config.json, torchtitan job TOML, accelerate config) read into the same
request the flags give: the same peak as the equivalent flags, flags overriding the file, every key zerocalc
does not model listed, and what it cannot honour refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import keywords_in_notes
from helpers import DATA
from typer.testing import CliRunner

from zerocalc import InputError
from zerocalc.api import estimate_peak
from zerocalc.cli import app
from zerocalc.request.launch import LaunchFormat, read_launch_config
from zerocalc.request.launch_config import HARMLESS_NOTE

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
TITAN_FLAGS += [
    "--reduce-dtype",
    "fp32",
    "--recompute",
    "op",
    "--optimizer",
    "adamw",
    "--optimizer-impl",
    "fused",
]

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
    harmless = f"deepspeed ds_config.json: {HARMLESS_NOTE}: gradient_clipping, optimizer.params.lr"
    assert harmless in from_file["notes"]
    assert any("stage3_prefetch_bucket_size is 'auto'" in note for note in from_file["notes"])


def test_a_torchtitan_toml_gives_the_peak_of_the_equivalent_flags(tmp_path: Path) -> None:
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TITAN_TOML)
    from_file = _memory(["--torchtitan", str(path)])
    from_flags = _memory(TITAN_FLAGS)
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    assert f"torchtitan llama3_8b.toml: {HARMLESS_NOTE}: optimizer.lr, training.steps" in from_file["notes"]


def test_an_accelerate_config_gives_the_peak_of_the_equivalent_flags(tmp_path: Path) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE_YAML)
    from_file = _memory(["--model", "llama-3-8b", "--accelerate", str(path)])
    from_flags = _memory(["--model", "llama-3-8b", *ACCELERATE_FLAGS])
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    assert f"accelerate accelerate.yaml: {HARMLESS_NOTE}: compute_environment" in from_file["notes"]


def test_flags_override_the_file_and_the_library_reads_it_too(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS_CONFIG))
    cli = _memory(["--model", "llama-3-8b", "--gpus", "8", "--deepspeed", str(path), "--micro-batch", "1"])
    assert cli["options"]["micro_batch"] == 1 and cli["options"]["grad_accum"] == 4
    library = estimate_peak("llama-3-8b", "8", deepspeed=str(path), micro_batch="1")
    assert library.options == cli["options"]
    assert keywords_in_notes(json.loads(json.dumps(library.to_json_dict()))["peak"]) == keywords_in_notes(
        cli["peak"]
    )


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (LaunchFormat.TORCHTITAN, "[parallelism]\npipeline_parallel_degree = 0\n",
         "parallelism.pipeline_parallel_degree 0 is not modelled; accepted: a whole number of ranks"),
        (LaunchFormat.DEEPSPEED, '{"zero_optimization": {"stage": 4}}',
         "zero_optimization.stage 4 is not accepted; accepted: "),
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
    flags += ["--tp", "2", "--cp", "2", "--optimizer-impl", "fused"]
    from_flags = _memory(flags)
    # FSDP2 shards over dp_shard × cp = 4 ranks; the whole run is dp_shard × cp × tp = 8 GPUs
    assert from_file["request"]["mesh"] == from_flags["request"]["mesh"]
    assert from_file["request"]["mesh"]["world"] == 8 and from_file["request"]["cluster"]["world_size"] == 4
    assert from_file["peak"]["strategies"] == from_flags["peak"]["strategies"]


def test_a_refused_launch_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "zbv.toml"
    path.write_text(
        '[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = "ZBVZeroBubble"\n'
    )
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--torchtitan", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"zerocalc: error: --torchtitan {str(path)!r}: parallelism.pipeline_parallel_schedule "
        "'ZBVZeroBubble' is not modelled; accepted: GPipe, 1F1B, Interleaved1F1B or InterleavedZeroBubble"
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
    from_flags = _memory([*flags, "--checkpoint-every", "2", "--optimizer-impl", "fused"])
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    assert str(from_file["options"]["checkpoint_every"]) == "2"


# torchtitan v0.2.2 layout: Llama 3.1 405B over dp_shard 8 × tp 8 × pp 8 = 512 GPUs, 1F1B, micro-batches of 2
TITAN_405B_PP = """
[model]
name = "llama3"
flavor = "405B"
[optimizer]
name = "AdamW"
[training]
local_batch_size = 16
seq_len = 8192
mixed_precision_param = "bfloat16"
[parallelism]
data_parallel_shard_degree = 8
tensor_parallel_degree = 8
pipeline_parallel_degree = 8
pipeline_parallel_schedule = "1F1B"
pipeline_parallel_microbatch_size = 2
fsdp_reshard_after_forward = "default"
[activation_checkpoint]
mode = "full"
"""
# the same job in torchtitan's older layout (config_manager.py at 9dec370): degrees under [training] and
# [experimental], a micro-batch count
TITAN_405B_PP_OLD = """
[model]
name = "llama3"
flavor = "405B"
[optimizer]
name = "AdamW"
[training]
batch_size = 16
seq_len = 8192
mixed_precision_param = "bfloat16"
data_parallel_shard_degree = 8
tensor_parallel_degree = 8
[experimental]
pipeline_parallel_degree = 8
pipeline_parallel_schedule = "1F1B"
pipeline_parallel_microbatches = 8
[activation_checkpoint]
mode = "full"
"""
# v0.2.2 generate_llm_fqn_per_model_part: 126 layers + embedding + head = 128 over 8 stages, 16 each, less
# one on the first and the last: 15, 16 × 6, 15; 9dec370 generate_split_points: 126 // 8 = 15 on the first,
# 16 on the next six (126 % 8 = 6), 126 − 15 − 96 = 15 on the last. Micro-batches: 16 / 2 = 8. FSDP with a
# pipeline keeps the parameters after forward (reshard_after_forward = not pp_enabled): shard_grad_op.
TITAN_405B_PP_FLAGS = ["--model", "llama-3.1-405b", "--framework", "fsdp2", "--model-impl", "torchtitan"]
TITAN_405B_PP_FLAGS += ["--gpus", "512", "--tp", "8", "--pp", "8", "--pp-schedule", "1f1b"]
TITAN_405B_PP_FLAGS += ["--pp-first-stage-layers", "15", "--pp-last-stage-layers", "15"]
TITAN_405B_PP_FLAGS += ["--micro-batch", "2", "--grad-accum", "8", "--strategy", "shard_grad_op"]
TITAN_405B_PP_FLAGS += ["--seq-len", "8192", "--precision", "bf16-mixed", "--reduce-dtype", "fp32"]
TITAN_405B_PP_FLAGS += ["--recompute", "full", "--optimizer", "adamw"]
# torchtitan's optimizer: fused by default (v0.2.2 Optimizer.implementation), foreach at 9dec370
# (--optimizer.fused false)
TITAN_IMPL = {"new.toml": "fused", "old.toml": "foreach"}


def test_a_torchtitan_pipeline_gives_the_flags_pipeline_in_either_layout(tmp_path: Path) -> None:
    for name, text in (("new.toml", TITAN_405B_PP), ("old.toml", TITAN_405B_PP_OLD)):
        from_flags = _memory([*TITAN_405B_PP_FLAGS, "--optimizer-impl", TITAN_IMPL[name]])
        path = tmp_path / name
        path.write_text(text)
        from_file = _memory(["--torchtitan", str(path)])
        assert from_file["options"] == from_flags["options"], name
        assert from_file["peak"] == from_flags["peak"], name
        assert from_file["request"]["mesh"]["pp"] == 8 and from_file["request"]["mesh"]["dp"] == 8
    older = [note for note in from_file["notes"] if "older layout" in note]
    assert (
        older and "experimental.pipeline_parallel_degree → parallelism.pipeline_parallel_degree" in older[0]
    )


def _stages(text: str, num_layers: int) -> dict[str, str]:
    config = read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f")
    assert config.stages is not None
    keys = ("pp", "pp_schedule", "micro_batch", "grad_accum", "strategies")
    return {**{k: config.values[k] for k in keys}, **config.stages.options(num_layers)}


@pytest.mark.parametrize(
    ("lines", "num_layers", "expected"),
    [
        # Llama 3 70B, GPipe at pp 3: 82 effective layers, 27 a stage, the first one more (82 % 3 = 1),
        # less the embedding and the head: 27, 27, 26
        ('pipeline_parallel_degree = 3\npipeline_parallel_schedule = "GPipe"', 80,
         {"pp": "3", "pp_schedule": "gpipe", "micro_batch": "1", "grad_accum": "8",
          "pp_last_stage_layers": "26"}),
        # Llama 3 8B, Interleaved1F1B at pp 4: 2 stages a rank, embedding and head weighing nothing:
        # 32 over 8 stages, 4 each; local batch 8 in micro-batches of 2
        ('pipeline_parallel_degree = 4\npipeline_parallel_schedule = "Interleaved1F1B"\n'
         "pipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n"
         "pipeline_parallel_microbatch_size = 2", 32,
         {"pp": "4", "pp_schedule": "interleaved-1f1b", "micro_batch": "2", "grad_accum": "4", "vpp": "2"}),
        # layers_per_stage 2 over 32 layers: ⌈32 / 2⌉ = 16 stages, 4 a rank at pp 4
        ('pipeline_parallel_degree = 4\npipeline_parallel_schedule = "InterleavedZeroBubble"\n'
         "pipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n"
         "pipeline_parallel_layers_per_stage = 2", 32,
         {"pp": "4", "pp_schedule": "zero-bubble", "micro_batch": "1", "grad_accum": "8", "vpp": "4"}),
        # split points at layers 7, 16, 25: 7, 9, 9, 7
        ('pipeline_parallel_degree = 4\npipeline_parallel_split_points = ["layers.7", "layers.16", '
         '"layers.25"]', 32,
         {"pp": "4", "pp_schedule": "1f1b", "micro_batch": "1", "grad_accum": "8",
          "pp_first_stage_layers": "7", "pp_last_stage_layers": "7"}),
        # two parts a rank at pp 2 given by module names: 3 + 3 layers on rank 0, 5 + 5 on rank 1
        ('pipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved1F1B"\n'
         'module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1", "layers.2"], '
         '["layers.3", "layers.4", "layers.5", "layers.6", "layers.7"], ["layers.8", "layers.9", '
         '"layers.10"], ["layers.11", "layers.12", "layers.13", "layers.14", "layers.15", "norm", "output"]]',
         16,
         {"pp": "2", "pp_schedule": "interleaved-1f1b", "micro_batch": "1", "grad_accum": "8", "vpp": "2",
          "pp_first_stage_layers": "6"}),
        # Llama 3 70B, 1F1B at pp 8: 82 effective layers, 10 a stage and the first two one more (82 % 8 = 2),
        # less the embedding and the head: 10, 11, 10 × 5, 9 (the middle ranks differ)
        ("pipeline_parallel_degree = 8", 80,
         {"pp": "8", "pp_schedule": "1f1b", "micro_batch": "1", "grad_accum": "8",
          "pp_stage_layers": "10,11,10,10,10,10,10,9"}),
        # Llama 3.1 405B, Interleaved1F1B at pp 8: 16 stages, 128 effective layers, 8 each, less the
        # embedding and the head: 7, 8 × 14, 7 (rank 0's chunks 7 and 8)
        ('pipeline_parallel_degree = 8\npipeline_parallel_schedule = "Interleaved1F1B"', 126,
         {"pp": "8", "pp_schedule": "interleaved-1f1b", "micro_batch": "1", "grad_accum": "8", "vpp": "2",
          "pp_stage_layers": ",".join(["7", *["8"] * 14, "7"])}),
    ],
)  # fmt: skip
def test_torchtitan_stages_map_to_the_pipeline_options(lines: str, num_layers: int, expected: dict) -> None:
    """torchtitan v0.2.2 ``distributed/pipeline_parallel.py``: ``pipeline_llm`` (1 stage a rank for a
    single-stage schedule, 2 for a multi-stage one, or ⌈(L + 2)/layers_per_stage⌉ stages) and
    ``generate_llm_fqn_per_model_part``; micro-batches ``local_batch_size / microbatch_size`` (8 / 1 by
    default); FSDP under a pipeline ``shard_grad_op``."""
    text = f"[training]\nlocal_batch_size = 8\n[parallelism]\n{lines}\n"
    assert _stages(text, num_layers) == {**expected, "strategies": "shard_grad_op"}


def test_the_older_layout_splits_and_counts_micro_batches_as_it_did() -> None:
    """9dec370 ``generate_split_points``: Llama 3 8B's 32 layers over 4 × 2 stages, 32 // 8 = 4 each with
    none left over (v0.2.2's weighted split gives 4, 5, 4 × 5, 3, refused); micro-batches default to the
    pipeline degree, each batch_size / 4 = 2 sequences."""
    old = (
        "[training]\nbatch_size = 8\ntensor_parallel_degree = 2\n[experimental]\n"
        'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "Interleaved1F1B"\n'
        "context_parallel_degree = 2\n"
    )
    read = read_launch_config(LaunchFormat.TORCHTITAN, old, "{torchtitan} f")
    assert {k: read.values[k] for k in ("tp", "cp", "pp", "micro_batch", "grad_accum")} == {
        "tp": "2", "cp": "2", "pp": "4", "micro_batch": "2", "grad_accum": "4"
    }  # fmt: skip
    assert read.stages is not None and read.stages.options(32) == {"vpp": "2"}
    too_few = (
        r"experimental\.pipeline_parallel_microbatches \(unset: the pipeline degree\) 4 is not modelled; "
    )
    with pytest.raises(InputError, match=too_few + "accepted: a divisor of training.batch_size 2"):
        read_launch_config(LaunchFormat.TORCHTITAN, old.replace("batch_size = 8", "batch_size = 2"), "f")
    new = (
        "[training]\nlocal_batch_size = 8\n[parallelism]\ntensor_parallel_degree = 2\n"
        'pipeline_parallel_degree = 4\npipeline_parallel_schedule = "Interleaved1F1B"\n'
        "context_parallel_degree = 2\n"
    )
    # v0.2.2's default: 32 + 2 effective layers over 8 stages, 4 each and the first two one more, less the
    # embedding on the first and the head on the last: 4, 5, 4 × 5, 3 (virtual stages of unequal size)
    assert _stages(new, 32)["pp_stage_layers"] == "4,5,4,4,4,4,4,3"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('pipeline_parallel_degree = 4\npipeline_parallel_schedule = "LoopedBFS"',
         "pipeline_parallel_schedule 'LoopedBFS' is not modelled; accepted: GPipe, 1F1B, Interleaved1F1B"),
        ('pipeline_parallel_degree = 2\npipeline_parallel_schedule = "DualPipeV"',
         "pipeline_parallel_schedule 'DualPipeV' is not modelled"),
        ('pipeline_parallel_degree = 2\npipeline_parallel_schedule_csv = "s.csv"',
         "pipeline_parallel_schedule_csv 's.csv' is not modelled; accepted: none: a schedule by name"),
        ("pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 3",
         "pipeline_parallel_microbatch_size 3 is not modelled; accepted: a divisor of "
         "training.local_batch_size 8"),
        ("expert_parallel_degree = 4\ntensor_parallel_degree = 2",
         "expert_tensor_parallel_degree 1 is not modelled; accepted: 2, the tensor-parallel degree"),
        ("pipeline_parallel_degree = 2\ndata_parallel_shard_degree = 4\ndata_parallel_replicate_degree = 2",
         "data_parallel_replicate_degree 2 is not modelled; accepted: 1 with tensor, context, pipeline"),
    ],
)  # fmt: skip
def test_what_torchtitan_runs_and_zerocalc_does_not_model_is_refused(lines: str, message: str) -> None:
    text = f"[training]\nlocal_batch_size = 8\n[parallelism]\n{lines}\n"
    with pytest.raises(InputError, match=message):
        read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f")


def test_a_torchtitan_stage_without_a_layer_is_refused() -> None:
    """v0.2.2's default at one effective layer a stage: 6 + 2 over 8 stages, 1 each, less the embedding and
    the head: 0, 1 × 6, 0; the first and last stage hold no decoder layer, which zerocalc does not model."""
    text = (
        "[training]\nlocal_batch_size = 8\n[parallelism]\npipeline_parallel_degree = 4\n"
        'pipeline_parallel_schedule = "Interleaved1F1B"\npipeline_parallel_layers_per_stage = 1\n'
    )
    with pytest.raises(InputError, match=r"\(layers a stage: 0, 1 × 6, 0\) leaves a stage without a layer"):
        _stages(text, 6)


def test_a_key_in_both_layouts_is_refused() -> None:
    text = "[training]\ntensor_parallel_degree = 2\n[parallelism]\ntensor_parallel_degree = 4\n"
    with pytest.raises(
        InputError, match=r"training\.tensor_parallel_degree and parallelism\.tensor_parallel_degree 2 is not"
    ):
        read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f")


def test_a_torchtitan_split_of_unequal_middle_stages_is_each_stages_layers(tmp_path: Path) -> None:
    """Llama 3 8B at pp 4 under v0.2.2's default: 34 effective layers, 8 a stage and the first two one
    more, less the embedding and the head: 8, 9, 8, 7 (the middle ranks differ), as --pp-stage-layers;
    with a split given as flags the flags' is used."""
    path = tmp_path / "llama3_8b_pp4.toml"
    path.write_text(TITAN_TOML.replace("tensor_parallel_degree = 1", "pipeline_parallel_degree = 4"))
    mapped = _memory(["--torchtitan", str(path)])
    assert mapped["options"]["pp_stage_layers"] == "8,9,8,7"
    assert mapped["request"]["mesh"]["pp_stage_layers"] == [8, 9, 8, 7]
    given = ["--pp-first-stage-layers", "7", "--pp-last-stage-layers", "7"]
    from_file = _memory(["--torchtitan", str(path), *given])
    # local_batch_size 2 in micro-batches of 1 (the default pipeline_parallel_microbatch_size)
    assert str(from_file["options"]["pp"]) == "4" and str(from_file["options"]["grad_accum"]) == "2"
    assert from_file["request"]["mesh"]["pp_first_stage_layers"] == 7


# torchtitan v0.2.2: Qwen3 30B-A3B (models/qwen3/__init__.py "30B-A3B": 48 layers of 128 experts, the
# presets' Qwen3-30B-A3B), FSDP over 8 GPUs, expert parallelism over all 8
TITAN_QWEN3_EP = """
[model]
name = "qwen3"
flavor = "30B-A3B"
[training]
local_batch_size = 2
seq_len = 4096
mixed_precision_param = "bfloat16"
[parallelism]
data_parallel_shard_degree = 8
expert_parallel_degree = 8
expert_tensor_parallel_degree = 1
[activation_checkpoint]
mode = "full"
"""


def test_torchtitan_expert_parallelism_gives_the_flags_mesh(tmp_path: Path) -> None:
    """``ParallelDims`` (v0.2.2 ``distributed/parallel_dims.py``) unflattens the sparse mesh as
    (pp, dp_replicate, efsdp, ep, etp) with efsdp = dp_shard·cp·t/(etp·ep): with etp = t the EP group is
    e ranks t apart inside dp_shard × cp, zerocalc's ``--ep`` (docs/model.md)."""
    path = tmp_path / "qwen3_30b_a3b.toml"
    path.write_text(TITAN_QWEN3_EP)
    from_file = _memory(["--torchtitan", str(path)])
    flags = ["--model", "qwen3-30b-a3b", "--framework", "fsdp2", "--model-impl", "torchtitan", "--gpus", "8"]
    flags += ["--ep", "8", "--strategy", "zero3", "--micro-batch", "2", "--seq-len", "4096"]
    flags += ["--precision", "bf16-mixed", "--reduce-dtype", "fp32", "--recompute", "full"]
    from_flags = _memory([*flags, "--optimizer-impl", "fused"])
    assert from_file["options"] == from_flags["options"] and from_file["peak"] == from_flags["peak"]
    groups = {g["dimension"]: (g["size"], g["stride"]) for g in from_file["request"]["mesh"]["groups"]}
    assert groups["ep"] == (8, 1) and groups["expert_dp"] == (1, 8)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("distributed_type: MULTI_GPU\nnum_processes: eight\n",
         "num_processes 'eight' is not accepted; accepted: a whole number, 1 or more"),
        ("distributed_type: MULTI_GPU\nnum_processes: 8\nnum_machines: two\n",
         "num_machines 'two' is not accepted; accepted: a whole number, 1 or more"),
        ("distributed_type: MULTI_GPU\nnum_processes: 8\nnum_machines: 0\n",
         "num_machines 0 is not accepted; accepted: a whole number, 1 or more"),
        ("", "holds no key; accepted: an accelerate config as `accelerate config` writes it"),
        ("# only a comment\n", "holds no key; accepted: an accelerate config"),
        ("num_processes: 8\n", "has no distributed_type (accelerate requires one); accepted: FSDP"),
    ],
)  # fmt: skip
def test_a_bad_accelerate_count_or_an_empty_file_is_one_line(
    tmp_path: Path, text: str, fragment: str
) -> None:
    """accelerate 1.15.0 ``ClusterConfig``: ``num_processes`` and ``num_machines`` are ints (1 machine at
    least); ``BaseConfig.process_config`` refuses a file without ``distributed_type``."""
    from helpers import one_line_error

    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--accelerate", str(path)])
    line = one_line_error(result, fragment)
    assert line.startswith(f"zerocalc: error: --accelerate {str(path)!r}")


KEY_LISTS = DATA / "launch_keys"


@pytest.mark.parametrize("kind", list(LaunchFormat))
def test_every_key_a_launch_format_defines_is_sorted(kind: LaunchFormat) -> None:
    """Each key of the format's own definition (tests/data/launch_keys, read from the versions the tables
    name) is modelled, harmless or refused: none falls through to 'unknown'."""
    from zerocalc.request.launch_keys import ACCELERATE_KEYS, DEEPSPEED_KEYS, TORCHTITAN_KEYS, rule_of
    from zerocalc.request.launch_torchtitan import _TITAN_RENAMED

    table = {"deepspeed": DEEPSPEED_KEYS, "torchtitan": TORCHTITAN_KEYS, "accelerate": ACCELERATE_KEYS}[kind]
    lines = (KEY_LISTS / f"{kind.value}.txt").read_text().splitlines()
    keys = [line for line in lines if line and not line.startswith("#")]
    assert len(keys) > 50
    unsorted = [key for key in keys if key not in _TITAN_RENAMED and rule_of(table, key) is None]
    assert unsorted == []


FP8_TITAN = [
    ('[model]\nconverters = ["quantize.linear.mx"]\n', "model.converters 'quantize.linear.mx'"),
    ('[model]\nconverters = ["float8"]\n[float8]\nrecipe_name = "rowwise"\nenable_fsdp_float8_all_gather = '
     "true\n", "float8.enable_fsdp_float8_all_gather True"),
    ('[model]\nconverters = ["float8"]\n[float8]\nemulate = true\n', "float8.emulate True"),
    ("[float8]\nforce_recompute_fp8_weight_in_bwd = true\n", "float8.force_recompute_fp8_weight_in_bwd True"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "fragment"), FP8_TITAN)
def test_a_torchtitan_fp8_job_zerocalc_cannot_honour_is_refused(
    tmp_path: Path, text: str, fragment: str
) -> None:
    """What torchtitan's float8 converter is given that zerocalc does not model (an MX converter, emulated
    GEMMs, the weight recomputed in backward) or torchtitan itself refuses (a recipe name with the FSDP
    float8 all-gather: its assert) is refused in one line, never computed in bf16 with exit 0."""
    from helpers import one_line_error

    path = tmp_path / "fp8.toml"
    path.write_text(text + "[parallelism]\ndata_parallel_shard_degree = 8\n")
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--torchtitan", str(path)])
    assert fragment in one_line_error(result, "fp8.toml")


@pytest.mark.parametrize(
    ("kind", "text", "fragment"),
    [
        (LaunchFormat.DEEPSPEED, '{"zero_optimization": {"stage": 3, "overlap_comm": false}}',
         "zero_optimization.overlap_comm False is not modelled (ZeRO-3's collectives not overlapped: zero"),
        (LaunchFormat.DEEPSPEED, '{"train_batch_size": 64, "zero_optimization": {"stage": 2}}',
         "train_batch_size 64 is not modelled; accepted: train_micro_batch_size_per_gpu and"),
        (LaunchFormat.DEEPSPEED, '{"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e8}}',
         "stage3_max_live_parameters 100000000.0 is not modelled (a cap on gathered parameters); accepted: "
         "1000000000 (or leave it out)"),
        (LaunchFormat.DEEPSPEED, '{"zero_optimization": {"stage": 3}, "activation_checkpointing": '
         '{"cpu_checkpointing": true}}', "activation_checkpointing.cpu_checkpointing True is not modelled"),
        (LaunchFormat.DEEPSPEED, '{"zero_optimization": {"stage": 3, "stage_3_typo": 1}}',
         "zero_optimization.stage_3_typo is not a ds_config key zerocalc knows (DeepSpeed 0.19.8"),
        (LaunchFormat.TORCHTITAN, '[compile]\nenable = true\nbackend = "aot_eager"\n',
         "compile.backend 'aot_eager' is not modelled; accepted: inductor"),
        (LaunchFormat.TORCHTITAN, "[training]\nenable_cpu_offload = true\n",
         "training.enable_cpu_offload True is not modelled (FSDP2's CPU offload"),
        (LaunchFormat.TORCHTITAN, "[parallelism]\nenable_compiled_autograd = true\n",
         "enable_compiled_autograd True is not modelled (compiled autograd"),
        (LaunchFormat.TORCHTITAN, "[my_section]\nx = 1\n", "my_section.x is not a torchtitan job key"),
        (LaunchFormat.ACCELERATE, "distributed_type: MULTI_GPU\nmixed_precision: fp8\n",
         "mixed_precision 'fp8' without fp8_config.backend is not modelled (accelerate then picks torchao "
         "where it is installed, else Transformer Engine); accepted: fp8_config.backend AO (torchao)"),
        (LaunchFormat.ACCELERATE, "distributed_type: MULTI_GPU\ndynamo_config:\n  dynamo_backend: INDUCTOR\n"
         "  dynamo_mode: reduce-overhead\n", "dynamo_config.dynamo_mode 'reduce-overhead' is not modelled; "
         "accepted: default or max-autotune-no-cudagraphs (no CUDA graphs"),
        (LaunchFormat.ACCELERATE, "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n",
         "fsdp_auto_wrap_policy (unset: accelerate's NO_WRAP) 'NO_WRAP' is not modelled; accepted: "
         "TRANSFORMER_BASED_WRAP"),
        (LaunchFormat.ACCELERATE, "distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: "
         "TRANSFORMER_BASED_WRAP\n  fsdp_backward_prefetch: BACKWARD_POST\n",
         "fsdp_backward_prefetch 'BACKWARD_POST' is not modelled; accepted: BACKWARD_PRE"),
    ],
)  # fmt: skip
def test_a_key_that_changes_the_numbers_is_refused_naming_it(
    kind: LaunchFormat, text: str, fragment: str
) -> None:
    with pytest.raises(InputError) as error:
        read_launch_config(kind, text, "{deepspeed} f")
    assert fragment in str(error.value)


def test_harmless_keys_are_listed_as_harmless_and_nothing_as_not_modelled() -> None:
    """A job's logging, paths, learning rate, steps and seeds: listed once as harmless; a key left at its
    inert default (compile off, no converters) is accepted without a word."""
    text = (
        '[job]\ndump_folder = "./out"\n[metrics]\nlog_freq = 10\n[model]\nname = "llama3"\nflavor = "8B"\n'
        "converters = []\n[optimizer]\nlr = 3e-4\n[lr_scheduler]\nwarmup_steps = 2\n[training]\nsteps = 10\n"
        "[debug]\nseed = 1\n[compile]\nenable = false\n"
    )
    config = read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f")
    assert config.harmless == (
        "debug.seed", "job.dump_folder", "lr_scheduler.warmup_steps", "metrics.log_freq", "optimizer.lr",
        "training.steps",
    )  # fmt: skip
    lines = config.note_lines("torchtitan f.toml")
    assert not any("not modelled" in line for line in lines)
    assert f"torchtitan f.toml: {HARMLESS_NOTE}: debug.seed, job.dump_folder" in lines[-1]


def test_torchtitan_defaults_apply_where_the_file_leaves_keys_out() -> None:
    """torchtitan v0.2.2 ``config/job_config.py``: ``local_batch_size = 8``, ``mode = "selective"`` with
    ``selective_ac_option = "2"`` (every second block checkpointed), ``implementation = "fused"``; a
    ``global_batch_size`` of 64 over dp 2 × local 8 is 4 steps accumulated."""
    text = "[parallelism]\ndata_parallel_shard_degree = 2\n[training]\nglobal_batch_size = 64\n"
    config = read_launch_config(LaunchFormat.TORCHTITAN, text, "{torchtitan} f")
    values = config.values
    assert (values["micro_batch"], values["recompute"], values["checkpoint_every"]) == ("8", "full", "2")
    assert (values["optimizer_impl"], values["grad_accum"]) == ("fused", "4")
    assert any("torchtitan's defaults" in note for note in config.notes)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096}),
         "has no ds_config key (a Hugging Face config.json: give it as --model); accepted: a DeepSpeed"),
        ("{}", "has no ds_config key; accepted: a DeepSpeed ds_config.json"),
    ],
)  # fmt: skip
def test_a_file_with_no_ds_config_key_is_refused(tmp_path: Path, text: str, fragment: str) -> None:
    """A Hugging Face config.json passed as --deepspeed: no key of DeepSpeed's is in it, so nothing of it
    could be modelled; refused in one line, never accepted with every key set aside."""
    from helpers import one_line_error

    path = tmp_path / "config.json"
    path.write_text(text)
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "8", "--deepspeed", str(path)])
    one_line_error(result, fragment)


def _deepspeed_stages() -> str:
    """The stages DeepSpeed's framework record models, as the launch messages list them."""
    from zerocalc.parallel.framework_records import framework_strategies
    from zerocalc.parallel.frameworks import Framework

    names = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}  # ZeroStageEnum (DeepSpeed 0.19.8)
    listed = [
        f"{names[s.value]} ({s.value})" for s in framework_strategies(Framework.DEEPSPEED) if s.value in names
    ]
    return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + f" or {listed[-1]}"


STAGES = _deepspeed_stages()


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"train_micro_batch_size_per_gpu": "two"},
         "train_micro_batch_size_per_gpu 'two' is not accepted; accepted: a whole number, 1 or more"),
        ({"gradient_accumulation_steps": 0},
         "gradient_accumulation_steps 0 is not accepted; accepted: a whole number, 1 or more"),
        ({"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}},
         "zero_optimization.reduce_bucket_size 'big' is not accepted; accepted: a whole number, 1 or more"),
        ({"communication_data_type": "fp64"},
         "communication_data_type 'fp64' is not accepted; accepted: fp16, bf16 or fp32"),
        ({"bf16": {"enabled": "yes"}}, "bf16.enabled 'yes' is not accepted; accepted: true or false"),
        ({"zero_optimization": {"stage": 5}},
         f"zero_optimization.stage 5 is not accepted; accepted: {STAGES}"),
    ],
)  # fmt: skip
def test_a_bad_ds_config_value_names_its_key(tmp_path: Path, config: dict, fragment: str) -> None:
    """A ds_config value that is not one its key takes is named by the key (never as the flag it would set,
    ``--micro-batch 'two'``); the stages accepted are those whose strategy DeepSpeed's framework record
    models (a stage DeepSpeed has and the record does not, refused as not modelled)."""
    from helpers import one_line_error

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "8", "--deepspeed", str(path)])
    one_line_error(result, fragment)


@pytest.mark.parametrize("stage", ["3", " 3", "3.0", 3.0])
def test_a_ds_config_stage_as_digits_is_read_as_deepspeed_reads_it(stage: object) -> None:
    """DeepSpeed 0.19.8 ``DeepSpeedZeroConfig.stage: ZeroStageEnum`` is validated by pydantic in lax mode:
    ``"3"``, ``" 3"``, ``"3.0"`` and ``3.0`` are stage 3 (``"three"`` and ``5`` are refused)."""
    text = json.dumps({"zero_optimization": {"stage": stage}})
    assert read_launch_config(LaunchFormat.DEEPSPEED, text, "{deepspeed} f").values["strategies"] == "zero3"


ACCELERATE_WRITTEN = """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
"""An FSDP2 config as accelerate 1.15.0's ``accelerate config`` writes it (cluster.py), ``tpu_env: []``
included."""


def test_a_config_as_accelerate_config_writes_it_is_read_whole() -> None:
    """Every key sorted: the wrap policy, version, reshard and precision modelled, CPU-RAM-efficient loading
    as ``--init cpu`` (rank 0 loads on the host), the launcher's keys and the empty TPU list harmless."""
    config = read_launch_config(LaunchFormat.ACCELERATE, ACCELERATE_WRITTEN, "{accelerate} f")
    assert {k: config.values[k] for k in ("framework", "strategies", "precision", "gpus", "init")} == {
        "framework": "fsdp2", "strategies": "zero3", "precision": "bf16-mixed", "gpus": "8", "init": "cpu"
    }  # fmt: skip
    assert "tpu_env" in config.harmless and "fsdp_config.fsdp_state_dict_type" in config.harmless


def test_fp8_settings_beside_no_converter_change_nothing_and_say_so() -> None:
    """torchtitan v0.2.2's own llama3_8b.toml sets ``[quantize.linear.float8] filter_fqns = ["output"]``
    with no converter: only the float8 converter reads it, so nothing changes, and a note says so."""
    text = '[model]\nname = "llama3"\nflavor = "8B"\nconverters = []\n'
    text += '[quantize.linear.float8]\nfilter_fqns = ["output"]\nenable_fsdp_float8_all_gather = true\n'
    config = read_launch_config(LaunchFormat.TORCHTITAN, text, "f")
    assert "fp8" not in config.values
    assert (
        "quantize.linear.float8.enable_fsdp_float8_all_gather, quantize.linear.float8.filter_fqns: read only "
        "by the float8 converter, not in model.converters" in config.notes
    )


ACCELERATE_FP8 = """distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
fp8_config:
  backend: AO
  pad_inner_dim: true
  enable_fsdp_float8_all_gather: true
mixed_precision: fp8
num_machines: 1
num_processes: 8
"""
"""An FSDP2 job with torchao FP8 as accelerate 1.16.0's ``accelerate config`` writes it (cluster.py: the AO
backend asks ``enable_fsdp_float8_all_gather`` and ``pad_inner_dim``)."""


def test_an_accelerate_torchao_fp8_config_gives_the_request_of_the_equivalent_flags(tmp_path: Path) -> None:
    """accelerate 1.16.0 with ``backend: AO``: bf16 beneath (``set_mixed_precision``: fp8 → bf16), torchao's
    default ``Float8LinearConfig`` (tensorwise) with the FSDP2 float8 all-gather, its scales precomputed
    after the step (``_prepare_ao``), and the first and last ``nn.Linear`` of Llama 3 8B's
    ``named_modules()`` (``model.layers.0.self_attn.q_proj``, ``lm_head``) left in high precision
    (``utils/ao.py``). By hand: 32 blocks × 7 projections = 224 Linear weights, less layer 0's q_proj: 223
    converted (the head is skipped too)."""
    path = tmp_path / "fp8.yaml"
    path.write_text(ACCELERATE_FP8)
    from_file = _memory(["--model", "llama-3-8b", "--accelerate", str(path)])
    flags = ["--framework", "fsdp2", "--strategy", "zero3", "--precision", "bf16-mixed", "--gpus", "8"]
    flags += ["--gpus-per-node", "8", "--fp8", "tensorwise", "--fp8-all-gather", "--fp8-precompute-scales"]
    flags += ["--fp8-skip", "layers.0.attn.q_proj,lm_head"]
    from_flags = _memory(["--model", "llama-3-8b", *flags])
    assert from_file["peak"] == from_flags["peak"] and from_file["options"] == from_flags["options"]
    assert any("223 Linear weights" in note for note in from_file["notes"])
    assert f"accelerate fp8.yaml: {HARMLESS_NOTE}: fp8_config.pad_inner_dim" in from_file["notes"]


def test_accelerate_torchao_without_the_all_gather_keeps_the_bf16_gather() -> None:
    """``enable_fsdp_float8_all_gather: false``: tensorwise FP8 GEMMs, the weights gathered in bf16, no
    precomputed scales (accelerate registers that hook only with the all-gather); a Transformer Engine key
    beside the AO backend is not read (harmless)."""
    text = ACCELERATE_FP8.replace("all_gather: true", "all_gather: false").replace(
        "pad_inner_dim: true", "margin: 0"
    )
    config = read_launch_config(LaunchFormat.ACCELERATE, text, "f")
    assert config.values["fp8"] == "tensorwise" and config.values["precision"] == "bf16-mixed"
    assert "fp8_all_gather" not in config.values and "fp8_precompute_scales" not in config.values
    assert config.fp8_skip_of_model and config.harmless == ("fp8_config.margin",)


def test_fp8_config_beside_another_precision_changes_nothing_and_says_so() -> None:
    """accelerate exports ``fp8_config`` only under ``mixed_precision: fp8`` (``utils/launch.py``
    ``setup_fp8_env``): beside bf16 it is not applied, and a note says so."""
    config = read_launch_config(LaunchFormat.ACCELERATE, ACCELERATE_FP8.replace("fp8\nnum", "bf16\nnum"), "f")
    assert "fp8" not in config.values and not config.fp8_skip_of_model
    assert "fp8_config: read only with mixed_precision fp8; not applied" in config.notes


_FSDP2 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: "
_FSDP2 += "TRANSFORMER_BASED_WRAP\n"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (_FSDP2 + "mixed_precision: fp8\nfp8_config:\n  backend: TE\n",
         "fp8_config.backend 'TE' is not modelled; accepted: AO (torchao) under distributed_type FSDP with "
         "fsdp_version 2 (accelerate's te.Linear swap"),
        (_FSDP2 + "mixed_precision: fp8\nfp8_config:\n  backend: MSAMP\n  opt_level: O2\n",
         "fp8_config.backend 'MSAMP' is not modelled"),
        (_FSDP2 + "mixed_precision: fp8\nfp8_config:\n  backend: XX\n",
         "fp8_config.backend 'XX' is not accepted; accepted: AO or TE"),
        ("distributed_type: MULTI_GPU\nmixed_precision: fp8\nfp8_config:\n  backend: AO\n",
         "fp8_config.backend 'AO' under distributed_type MULTI_GPU is not modelled (zerocalc runs torchao's "
         "float8 under FSDP2 only)"),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  "
         "fsdp_backward_prefetch: BACKWARD_PRE\nmixed_precision: fp8\nfp8_config:\n  backend: AO\n",
         "under distributed_type FSDP with fsdp_version 1 is not modelled"),
        ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\nmixed_precision: fp8\n"
         "fp8_config:\n  backend: AO\n", "under distributed_type DEEPSPEED is not modelled"),
        (_FSDP2 + "  fsdp_cpu_ram_efficient_loading: true\nmixed_precision: fp8\nfp8_config:\n  backend: "
         "AO\n",
         "fsdp_cpu_ram_efficient_loading True with fp8_config.backend 'AO': accelerate refuses it"),
        (_FSDP2 + "mixed_precision: fp8\nfp8_config:\n  backend: AO\n  enable_fsdp_float8_all_gather: 1\n",
         "fp8_config.enable_fsdp_float8_all_gather 1 is not accepted; accepted: true or false"),
        (_FSDP2 + "mixed_precision: fp8\nfp8_config:\n  backend: AO\n  recipe: rowwise\n",
         "fp8_config.recipe is not an accelerate config key zerocalc knows"),
    ],
)  # fmt: skip
def test_an_accelerate_fp8_setting_zerocalc_cannot_honour_is_one_line_and_exit_2(
    tmp_path: Path, text: str, fragment: str
) -> None:
    """Transformer Engine's te.Linear swap (zerocalc runs TE only under Megatron-LM), MS-AMP, torchao outside
    FSDP2 (zerocalc's torchao recipes are FSDP2's), what accelerate itself refuses, and an unknown key:
    refused in one line, never computed in bf16."""
    from helpers import one_line_error

    path = tmp_path / "fp8.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--accelerate", str(path)])
    assert fragment in one_line_error(result, "fp8.yaml")


def test_a_ds_config_carries_no_fp8_and_fp8_beside_it_is_refused_as_under_deepspeed(tmp_path: Path) -> None:
    """DeepSpeed 0.19's ds_config has no FP8 key (runtime/config.py, precision_config.py): the file sets
    ``--framework deepspeed``, whose record runs no FP8 recipe, so ``--fp8`` beside it is one line, exit 2."""
    from helpers import one_line_error

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DS_CONFIG))
    result = runner.invoke(
        app,
        ["memory", "--model", "llama-3-8b", "--gpus", "8", "--deepspeed", str(path), "--fp8", "tensorwise"],
    )
    one_line_error(result, "--fp8 tensorwise under --framework deepspeed: it runs no FP8 recipe here")
