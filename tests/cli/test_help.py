"""Every command's --help at 80 columns: no option name or word cut (``…``), and every ``[default: …]``
shown (Rich markup would swallow an unescaped one, leaving ``per node .``)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from zerocalc.cli import COMMANDS, app, load_commands

runner = CliRunner()


VALIDATE = ["frameworks", "tp", "activations", "cuda", "fake", "pipeline", "expert"]


@pytest.mark.parametrize(
    "command", [*COMMANDS, "presets list", "presets show", *(f"validate {name}" for name in VALIDATE)]
)
def test_help_fits_80_columns_and_shows_its_defaults(command: str) -> None:
    load_commands()
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in result.stdout, [line for line in lines if "…" in line]
    assert not re.search(r"\w \.", result.stdout), "a [default: …] swallowed as Rich markup"


def test_a_flag_and_its_negative_form_are_both_shown_and_both_still_parse() -> None:
    load_commands()
    shown = runner.invoke(app, ["memory", "--help"], env={"COLUMNS": "80"}, terminal_width=80).stdout
    assert "--flash-attention /" in shown and "--no-flash-attention" in shown
    wide = runner.invoke(app, ["memory", "--help"], env={"COLUMNS": "200"}, terminal_width=200).stdout
    assert "g: GPUs per node. [default: 8, or N when N is smaller]" in wide
    for flag in ("--flash-attention", "--no-flash-attention"):
        result = runner.invoke(app, ["memory", "--model", "gpt2", "--gpus", "2", flag, "--json"])
        assert result.exit_code == 0, result.output
        assert f'"flash_attention": {str(flag == "--flash-attention").lower()}' in result.stdout


def test_reduce_dtype_and_ddp_bucket_help_say_what_they_take() -> None:
    """``--reduce-dtype`` lists the dtypes it takes; ``--ddp-bucket`` is a size with its unit, not
    'bucket_cap_mb in bytes' (bucket_cap_mb is in MiB, zerocalc takes any unit)."""
    from zerocalc.request.options import Command, option

    reduce = option(Command.MEMORY, "reduce_dtype").help
    assert "fp32" in reduce and "bf16" in reduce and "fp16" in reduce
    bucket = option(Command.MEMORY, "ddp_bucket").help
    assert "in bytes" not in bucket and "a size with its unit" in bucket
