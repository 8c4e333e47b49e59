"""Every option is defined once (zerocalc/request/options.py): the CLI's parameters, the library's keywords,
the raw options models and the JSON's ``options`` echo are derived from it, and agree option by option."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from conftest import keywords_in_notes
from typer.testing import CliRunner

from zerocalc import api
from zerocalc.cli import app, load_commands
from zerocalc.plan.space import PlanOptions
from zerocalc.request.options import FLAGS, OPTIONS, Command, Kind, echo, library_options, option, options_for
from zerocalc.request.options_model import TrainingOptions

runner = CliRunner()

SAMPLES: dict[str, tuple[Any, dict[str, Any]]] = {
    # option: (a value other than its default, the other options that value needs)
    "params": ("7B", {}),
    "model": ("gpt2", {}),
    "gpus": ("4", {}),
    "gpus_per_node": ("2", {"gpus": "4"}),
    "gpu": ("h100-80gb", {}),
    "gpu_memory": ("79GiB", {}),
    "reserve": ("1GiB", {"gpu": "h100-80gb"}),
    "strategies": ("zero2,zero3", {}),
    "framework": ("deepspeed", {}),
    "precision": ("fp32", {}),
    "optimizer": ("adam", {}),
    "fp32_grad_accum": (True, {}),
    "init": ("cpu", {"framework": "fsdp2"}),
    "offload_optimizer": ("cpu", {"strategies": "zero2"}),
    "offload_params": ("cpu", {"strategies": "zero3"}),
    "reduce_dtype": ("fp32", {}),
    "seq_len": ("1024", {}),
    "micro_batch": ("2", {}),
    "grad_accum": ("2", {}),
    "grad_sync": ("last", {"grad_accum": "2"}),
    "zeropp": ("hpz", {"framework": "deepspeed", "strategies": "zero3", "gpus": "16", "gpus_per_node": "8"}),
    "recompute": ("full", {}),
    "checkpoint_every": ("2", {"recompute": "full"}),
    "flash_attention": (False, {}),
    "model_impl": ("megatron", {}),
    "optimizer_impl": ("fused", {}),
    "prefetch": ("2", {}),
    "wrap": ("model", {"strategies": "zero3"}),
    "ddp_bucket": ("50MiB", {}),
    "reduce_bucket": ("1e8", {}),
    "allgather_bucket": ("1e8", {}),
    "expandable_segments": (True, {}),
    "intra_node_bw": ("300GB/s", {}),
    "inter_node_bw": ("25GB/s", {}),
    "latency": ("30us", {}),
    "tokens_per_step": ("4M", {"tflops": "400"}),
    "tflops": ("400", {"tokens_per_step": "4M"}),
    "pp_first_stage_layers": ("5", {"model": "gpt2", "pp": "2", "gpus": "2"}),
    "pp_last_stage_layers": ("5", {"model": "gpt2", "pp": "2", "gpus": "2"}),
    "pp_stage_layers": ("5,7", {"model": "gpt2", "pp": "2", "gpus": "2"}),
}
BASE = {Command.MEMORY: {"model": "gpt2", "gpus": "2"}, Command.COMM: {"params": "1B", "gpus": "8"}}


def _argv(command: Command, values: dict[str, Any]) -> list[str]:
    argv = [command.value, "--json"]
    for name, value in values.items():
        o = option(command, name)
        if o.kind is Kind.TEXT:
            argv += [o.flag, str(value)]
        elif value:
            argv.append(o.flag)
        else:
            argv.append(o.negative or "")
    return argv


def _case(command: Command, name: str) -> dict[str, Any]:
    value, needs = SAMPLES[name]
    values = {**BASE[command], **needs, name: value}
    if name == "params":
        values.pop("model", None)
    if name == "model" or "model" in needs:
        values.pop("params", None)
    return values


def test_names_and_flags_are_unique_per_command() -> None:
    for command in Command:
        names = [o.name for o in options_for(command)]
        flags = [f for o in options_for(command) for f in o.flags]
        assert len(names) == len(set(names)) and len(flags) == len(set(flags)), command
    for o in OPTIONS:  # a concept has one flag wherever it is taken: messages name it so
        assert FLAGS[o.name] == o.flag


def test_the_raw_options_models_are_the_registry() -> None:
    estimates = {o.name: o.default for c in (Command.MEMORY, Command.COMM) for o in options_for(c, True)}
    fields = {n: f.default for n, f in TrainingOptions.model_fields.items()}
    assert {n: fields[n] for n in estimates} == estimates
    assert set(fields) - set(estimates) == {"estimate", "calibration_name"}
    plan = {o.name: o.default for o in options_for(Command.PLAN, True)}
    assert {n: f.default for n, f in PlanOptions.model_fields.items()} == plan


@pytest.mark.parametrize("command", list(Command))
def test_the_cli_takes_every_option_with_its_flags_and_default(command: Command) -> None:
    load_commands()
    import typer.main

    click_command = typer.main.get_command(app).commands[command.value]  # type: ignore[attr-defined]
    params = {p.name: p for p in click_command.params}
    for o in options_for(command):
        assert o.name in params, o.name
        assert set(o.flags) <= set(params[o.name].opts) | set(params[o.name].secondary_opts)
        default = params[o.name].default
        expected = o.default if o.kind is not Kind.TEXT or o.default is None else str(o.default)
        assert default == expected, o.name
    assert set(params) == {o.name for o in options_for(command)}


@pytest.mark.parametrize(
    ("function", "command"),
    [
        (api.estimate_memory, Command.MEMORY),
        (api.estimate_peak, Command.MEMORY),
        (api.estimate_comm, Command.COMM),
    ],
)
def test_the_library_takes_every_option_as_a_keyword_with_its_default(
    function: Any, command: Command
) -> None:
    parameters = inspect.signature(function).parameters
    expected = {o.name: o.default for o in library_options(command)}
    assert {n: p.default for n, p in parameters.items() if n in expected} == {
        n: d for n, d in expected.items() if parameters[n].default is not inspect.Parameter.empty
    }
    assert set(parameters) == set(expected)


def test_the_library_refuses_a_keyword_its_command_does_not_take() -> None:
    from zerocalc import InputError

    refused = r"estimate_comm\(\) takes no keyword 'fp32_grad_accum'; accepted: params"
    with pytest.raises(InputError, match=refused):
        api.estimate_comm("7B", 8, fp32_grad_accum=True)


CASES = [
    (c, n) for c in (Command.MEMORY, Command.COMM) for n in SAMPLES if n in {o.name for o in options_for(c)}
]


@pytest.mark.parametrize(("command", "name"), CASES, ids=[f"{c.value}-{n}" for c, n in CASES])
def test_cli_library_and_json_agree_for_every_option(command: Command, name: str) -> None:
    """The flag and the keyword give the same JSON, and its ``options`` echo carries the value given."""
    values = _case(command, name)
    result = runner.invoke(app, _argv(command, values), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout)
    if command is Command.COMM:
        library = api.estimate_comm(**values)
    elif "model" in values:
        library = api.estimate_peak(**values)
    else:
        library = api.estimate_memory(**values)
    dumped = library.to_json_dict() if hasattr(library, "to_json_dict") else library.model_dump(mode="json")
    assert keywords_in_notes(cli) == keywords_in_notes(json.loads(json.dumps(dumped)))
    given = values[name]  # a number typed as text is echoed as that number (--gpus 4 → 4)
    numeric = isinstance(given, str) and given.isdigit()
    assert cli["options"][name] == (int(given) if numeric else given)
    assert cli["options"] == echo(command, values)


def test_numbers_typed_as_text_are_echoed_as_numbers() -> None:
    """``--gpus 8`` is the integer 8 in the JSON's ``options`` (the library's value), ``--tflops 400.5``
    the float; a count with a suffix (``7B``) stays as typed."""
    result = runner.invoke(
        app,
        ["comm", "--params", "7B", "--gpus", "8", "--tokens-per-step", "4M", "--tflops", "400.5", "--json"],
    )
    options = json.loads(result.stdout)["options"]
    assert (options["gpus"], options["tflops"], options["params"], options["tokens_per_step"]) == (
        8, 400.5, "7B", "4M"
    )  # fmt: skip


# ------------------------------------------------------------------ bench and the validate subcommands
def _click_command(words: list[str]) -> Any:
    import typer.main

    load_commands()
    command = typer.main.get_command(app)
    for word in words:
        command = command.commands[word]  # type: ignore[attr-defined]
    return command


MEASURE_COMMANDS = ["bench", *(f"validate {name}" for name in
                    ("frameworks", "tp", "activations", "cuda", "fake", "pipeline", "expert"))]  # fmt: skip


@pytest.mark.parametrize("command", MEASURE_COMMANDS)
def test_each_measuring_command_takes_exactly_its_records_with_their_flags_and_defaults(command: str) -> None:
    """bench and every validate subcommand have one parameter per record that names them (or their
    variant: bench --compute, validate pipeline --fake), spelled and defaulted as the record says."""
    from zerocalc.cli.measure_options import Measure, declared_options

    params = {p.name: p for p in _click_command(command.split()).params}
    declared = declared_options(Measure(command))
    assert set(params) == {o.name for o in declared}
    for o in declared:
        assert set(o.flags) <= set(params[o.name].opts) | set(params[o.name].secondary_opts), o.name
        expected = o.default if o.kind is not Kind.TEXT or o.default is None else str(o.default)
        assert params[o.name].default == expected, o.name


def test_a_shared_option_is_one_record() -> None:
    """--nproc is one record for bench and every validate subcommand that starts processes; --model and
    --json are memory's own records (the same help, flags and default), and a name is one flag."""
    from zerocalc.cli.measure_options import MEASURE_OPTIONS, VARIANTS, Measure, measure_options_for

    (nproc,) = {o for o in MEASURE_OPTIONS if o.name == "nproc"}
    assert {c for c in Measure if nproc in measure_options_for(c)} == {
        Measure.BENCH,
        Measure.FRAMEWORKS,
        Measure.TP,
        Measure.PIPELINE,
        Measure.EXPERT,
    }
    for name in ("model", "json"):
        memory = option(Command.MEMORY, name)
        shared = [o for o in MEASURE_OPTIONS if o.name == name and o.help == memory.help]
        assert shared and all(o._replace(commands=memory.commands) == memory for o in shared)
    flags = dict(FLAGS)
    for o in MEASURE_OPTIONS:  # a name is one flag in every command, memory's and these
        assert flags.setdefault(o.name, o.flag) == o.flag, o.name
    for command in Measure:  # one record per name in a command, and in a command and its variant
        names = [o.name for o in measure_options_for(command)]
        assert len(names) == len(set(names)), command
    for command, (_, variant) in VARIANTS.items():
        both = measure_options_for(command) + measure_options_for(variant)
        assert len({o.name for o in both}) == len(set(both)), command
