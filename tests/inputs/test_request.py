"""The request model: everything is parsed and checked once, in one place; the core only takes it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from zerocalc.base.errors import InputError, keyword
from zerocalc.cli import app
from zerocalc.cli.base import flag
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.strategies import StrategyName
from zerocalc.request.options_model import TrainingOptions
from zerocalc.request.training import parse_options, parse_request

runner = CliRunner()
PACKAGE = ROOT / "zerocalc"


def test_a_request_is_typed_and_frozen() -> None:
    request = parse_options(
        params="7B", gpus="16", gpus_per_node="8", strategies="fsdp,ddp", reduce_dtype="fp32"
    )
    assert request.model.params == 7_000_000_000
    assert (request.cluster.world_size, request.cluster.nodes) == (16, 2)
    assert request.strategies == (StrategyName.ZERO3, StrategyName.DDP)  # FSDP names are aliases
    assert request.reduce_dtype is not None and request.reduce_dtype.bytes == 4
    with pytest.raises(ValueError, match="frozen"):
        request.grad_accum = 2  # type: ignore[misc]


def test_default_strategies_follow_the_framework_and_unrunnable_ones_become_notes() -> None:
    fsdp = parse_options(model="gpt2", gpus=16, framework="fsdp")
    assert fsdp.strategies == ("ddp", "shard_grad_op", "zero3", "hybrid_shard")
    offload = parse_options(params="7B", gpus=12, gpus_per_node=8, offload_optimizer="cpu")
    assert offload.strategies == (StrategyName.ZERO1, StrategyName.ZERO2, StrategyName.ZERO3)
    assert [note.split(" left out")[0] for note in offload.strategy_notes] == ["DDP", "HYBRID_SHARD"]


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"params": "1e400"}, "params '1e400' is out of range"),
        ({"params": "1e30T"}, "is more than 10,000,000,000,000,000"),
        ({"params": "7B", "gpus": "10**9"}, "gpus '10**9' is not accepted"),
        ({"params": "7B", "gpus": 2**21}, "from 1 to 1,048,576"),
        ({"params": "7B", "grad_accum": 10**24}, "grad_accum"),
        ({"params": "7B", "gpu_memory": "80"}, "gpu_memory '80' has no unit"),
        ({"params": "7B", "gpu_memory": "1e400GiB"}, "out of range"),
        ({"params": "7B", "tflops": "1e400", "tokens_per_step": "1M"}, "tflops '1e400'"),
        ({"params": "7B", "tflops": "nan", "tokens_per_step": "1M"}, "tflops 'nan'"),
        ({"params": "7B", "seq_len": 0}, "seq_len 0"),
        ({"params": "7B", "micro_batch": "0"}, "micro_batch '0'"),
        ({"params": "7B", "recompute": "bogus"}, "recompute 'bogus'"),
        ({"params": "7B", "wrap": "bogus"}, "wrap 'bogus'"),
        ({"params": "7B", "prefetch": -3}, "prefetch -3"),
        ({"params": "7B", "model_impl": "keras"}, "model_impl 'keras'"),
        ({"params": "7B", "optimizer_impl": "apex"}, "optimizer_impl 'apex'"),
        ({"params": "7B", "framework": "nonsense"}, "framework 'nonsense'"),
        ({"params": "7B", "framework": "fsdp2"}, "counts what the implementation allocates"),
        ({"params": "7B", "strategies": "zero9"}, "strategies 'zero9' is not known"),
        ({"params": "7B", "gpu_memory": "1GiB"}, "1,395,458,048 bytes) is not below gpu_memory '1GiB'"),
        ({"params": "7B", "gpu": "h100-80gb", "reserve": "80GiB"}, "reserve ('80GiB'"),
        ({"params": "{gpus}"}, "params '{gpus}'"),  # a user's braces are not read as a name
    ],
)
def test_every_value_is_checked_once_with_one_message_naming_it(options: dict, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_options(**options)
    assert fragment in str(info.value) and "accepted" in str(info.value)


def test_the_cli_names_flags_where_the_library_names_concepts() -> None:
    with pytest.raises(InputError) as info:
        parse_options(params="7B", gpus=12, gpus_per_node=8, strategies="hybrid")
    assert str(info.value).startswith("gpus 12 is not a multiple of gpus_per_node 8")
    assert info.value.render(flag).startswith("--gpus 12 is not a multiple of --gpus-per-node 8")
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "12", "-g", "8", "-s", "hybrid"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--gpus 12 is not a multiple of --gpus-per-node 8" in result.stderr
    assert flag("strategies") == "--strategy" and flag("intra_node_bw") == "--intra-node-bw"


def test_a_switch_turned_off_is_named_by_its_negative_flag_and_by_the_keyword_set_false() -> None:
    with pytest.raises(InputError) as info:
        parse_options(model="llama-3-8b", lora_rank=8, quantize="int8", autocast_adapter_dtype=False)
    assert "(autocast_adapter_dtype=False)" in str(info.value)
    assert "(--no-autocast-adapter-dtype)" in info.value.render(flag)
    assert (
        flag("no_kbit_prepare") == "--no-kbit-prepare" and keyword("no_kbit_prepare") == "kbit_prepare=False"
    )


def test_options_given_with_params_are_validated_too() -> None:
    result = runner.invoke(app, ["memory", "--params", "7B", "--seq-len", "0"])
    assert result.exit_code == 2 and "--seq-len '0'" in result.stderr


def test_presets_are_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from zerocalc.request import presets

    reads: list[Path] = []
    original = presets.load_toml

    def counting(path: Path, model: type) -> object:
        reads.append(path)
        return original(path, model)

    monkeypatch.setattr(presets, "load_toml", counting)
    presets._load_model_preset.cache_clear()
    presets._load_gpu.cache_clear()
    for _ in range(3):
        parse_request(TrainingOptions(model="llama-3-8b", gpus=8, gpu="h100-80gb", framework="fsdp2"))
    assert [p.stem for p in reads] == ["llama-3-8b", "h100-80gb"]


def test_the_framework_enum_is_the_one_memory_and_the_records_use() -> None:
    request = parse_options(model="gpt2", gpus=4, framework="torch_zero1")
    assert request.framework is Framework.TORCH_ZERO1


CORE = ["states/memory.py", "comm/estimate.py", "comm/calls.py", "parallel/zeropp.py", "model/activations.py"]
CORE += ["states/framework.py", "states/deepspeed.py", "network/schedule.py", "comm/collectives.py"]
CORE += [f"peak/{name}" for name in ("evaluate.py", "states.py", "buffers.py", "report.py")]
CORE += ["parallel/strategies.py", "model/architecture.py", "network/cluster.py"]
CORE += [f"parallel/framework_records/{name}.py" for name in ("record", "paper", "megatron", "deepspeed")]
CORE += ["parallel/framework_records/pytorch.py"]
CORE += ["network/collectives.py", "parallel/precision.py", "parallel/optimizers.py"]


@pytest.mark.parametrize("module", CORE)
def test_the_core_reads_no_files_no_environment_and_parses_no_strings(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else f"{node.module}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    forbidden = {
        "os",
        "pathlib",
        "tomllib",
        "json",
        "torch",
        "zerocalc.request.presets",
        "zerocalc.model.hf_config",
    }
    assert not imported & forbidden
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "open" not in names and "environ" not in (PACKAGE / module).read_text()
    parse_calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.startswith("parse_")
    }
    assert not parse_calls, f"{module} parses strings: {parse_calls}"


def test_validate_lists_the_configurations_of_the_records() -> None:
    """The help of each validate subcommand's --strategies names what its records run (written out, so
    that --help imports no record)."""
    from zerocalc.cli.measure_options import FRAMEWORK_STRATEGIES, PIPELINE_STRATEGIES, TP_STRATEGIES
    from zerocalc.validate import pipeline, tp
    from zerocalc.validate.config import STRATEGIES

    assert FRAMEWORK_STRATEGIES.split(", ") == list(STRATEGIES)
    assert TP_STRATEGIES.split(", ") == [s for s in STRATEGIES if s in tp.TP_STRATEGIES]
    assert PIPELINE_STRATEGIES.split(", ") == list(pipeline.PIPELINE_STRATEGIES)


def test_grad_sync_is_checked_once_and_named_by_its_concept() -> None:
    assert parse_options(params="7B", grad_sync="LAST").grad_sync == "last"
    assert parse_options(params="7B").grad_sync is None  # each framework's default
    with pytest.raises(InputError) as info:
        parse_options(
            params="7B", gpus=8, framework="deepspeed", model=None, strategies="zero1", grad_sync="every"
        )
    # DeepSpeed's stage 1 reduces at the accumulation boundary only (reduce_ready_partitions_and_remove_grads)
    assert "ZeRO-1 reduces gradients once per step under framework deepspeed" in str(info.value)
    with pytest.raises(InputError) as info:
        parse_options(params="7B", gpus=8, strategies="zero3", grad_sync="last")  # the paper fixes ZeRO-3
    assert info.value.render(flag).startswith("--grad-sync last: ZeRO-3 / FULL_SHARD reduces gradients every")
    assert "accepted: --grad-sync every, or no --grad-sync" in info.value.render(flag)


def test_comm_and_memory_requests_differ_only_where_the_estimates_do() -> None:
    from zerocalc.parallel.frameworks import Estimate

    comm = parse_options(estimate=Estimate.COMM, params="7B", gpus=8, framework="fsdp")  # Ψ alone is enough
    assert comm.strategies == ("ddp", "shard_grad_op", "zero3", "hybrid_shard")
    with pytest.raises(InputError, match="counts what the implementation allocates"):
        parse_options(params="7B", gpus=8, framework="fsdp")
    deepspeed = parse_options(estimate=Estimate.COMM, params="7B", gpus=8, framework="deepspeed")
    assert deepspeed.strategies == ("zero1", "zero2", "zero3")
    assert parse_options(params="7B", gpus=8, framework="paper").buffers.ddp_first_bucket_bytes == 2**20
    assert parse_options(params="7B", ddp_bucket="8MiB").buffers.ddp_first_bucket_bytes == 8 * 2**20


def test_an_architecture_is_a_model_too() -> None:
    from zerocalc.validate.run import resolve_architecture

    arch = resolve_architecture(None, {})
    request = parse_options(model=arch, gpus=2)
    assert request.model.params == 224_595 and request.model.architecture == arch
