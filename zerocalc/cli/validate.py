"""``zerocalc validate``: run the real frameworks, measure every rank, compare with the exact prediction.

A group of subcommands, one module each, each taking only the options it reads (their records:
:mod:`zerocalc.cli.measure_options`):

========================  ==========================================================================
``validate frameworks``   DDP, ZeRO-1, FSDP1, FSDP2 on ``--nproc`` processes (:mod:`.validate_frameworks`)
``validate tp``           DTensor TP + FSDP2 on a dp × tp mesh of processes (:mod:`.validate_frameworks`)
``validate activations``  what Hugging Face modules save, on the CPU (:mod:`.validate_activations`)
``validate cuda``         each phase's peak of FSDP2 steps on this GPU (:mod:`.validate_cuda`)
``validate fake``         FSDP2 (and TP) at any world size under fake tensors (:mod:`.validate_fake`)
``validate pipeline``     Schedule1F1B stages on processes, ``--fake``: under fake tensors
                          (:mod:`.validate_pipeline`)
``validate expert``       the all-to-alls of a MoE layer on processes (:mod:`.validate_expert`)
========================  ==========================================================================

Bare ``zerocalc validate`` prints this group's help (exit 2); a spelling of the single command it replaced
(``zerocalc validate --fake ...``) is refused in one line naming the subcommand that now runs it.
"""

from __future__ import annotations

import shlex
from typing import Any

import typer

from zerocalc.base.errors import InputError
from zerocalc.cli import (
    validate_activations,
    validate_cuda,
    validate_expert,
    validate_fake,
    validate_frameworks,
    validate_pipeline,
)
from zerocalc.cli.base import OneLineErrorGroup, PlainTextCommand, app

SUBCOMMANDS = (
    validate_frameworks.frameworks,
    validate_frameworks.tp,
    validate_activations.activations,
    validate_cuda.cuda,
    validate_fake.fake,
    validate_pipeline.pipeline,
    validate_expert.expert,
)
"""Every subcommand, in ``--help`` order."""


def new_spelling(args: list[str]) -> str:
    """The subcommand line that runs what ``zerocalc validate ARGS`` ran when validate was one command
    whose flags chose the run (``--fake``, ``--activations``, ``--device``, ``--pp``, ``--ep``, ``--tp``)."""
    words = list(args)

    def drop(flag: str, value: bool = False) -> str | None:
        if flag not in words:
            return None
        at = words.index(flag)
        given = words[at + 1] if value and at + 1 < len(words) else ""
        del words[at : at + (2 if value and at + 1 < len(words) else 1)]
        return given

    device = drop("--device", value=True)
    if "--fake" in words and "--pp" in words:
        command = "pipeline"  # keeps --fake
    elif drop("--fake") is not None:
        command = "fake"
    elif drop("--activations") is not None or device == "cpu":
        command = "activations"
    elif device == "cuda":
        command = "cuda"
    elif "--pp" in words:
        command = "pipeline"
    elif "--ep" in words:
        command = "expert"
    elif "--tp" in words and words[words.index("--tp") + 1 : words.index("--tp") + 2] != ["1"]:
        command = "tp"
    else:
        command = "frameworks"
    return shlex.join(["zerocalc", "validate", command, *words])


class ValidateGroup(OneLineErrorGroup):
    """validate's subcommands; an option before the subcommand is the old single command's spelling,
    refused in one line that names the new one."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            names = ", ".join(self.list_commands(ctx))
            raise InputError(
                f"zerocalc validate takes a subcommand first; accepted: {new_spelling(args)} (subcommands: "
                f"{names}; see `zerocalc validate --help`)"
            )
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # in SUBCOMMANDS' order, not sorted


validate_app = typer.Typer(
    name="validate",
    cls=ValidateGroup,
    help="Run the real frameworks, measure every rank and compare with the exact prediction.\n\n"
    "Model states, collectives, sends, saved activations, each phase's peak. Exit codes: 0 every compared "
    "figure matches, 1 one differs or a configuration failed, 2 bad input, 130 Ctrl-C.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for command in SUBCOMMANDS:
    validate_app.command(cls=PlainTextCommand)(command)
app.add_typer(validate_app)
