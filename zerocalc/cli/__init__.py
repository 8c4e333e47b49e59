"""The ``zerocalc`` command line: thin Typer commands over the core (parse, call, render).

Every command module registers itself on :data:`app`. Bad input of any kind (a Click usage error or an
:class:`~zerocalc.errors.InputError` from the core) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from zerocalc.errors import InputError

EXIT_BAD_INPUT = 2


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print ``zerocalc: error: message`` on stderr and return the Exit to raise."""
    typer.echo(f"zerocalc: error: {message}", err=True)
    return typer.Exit(code)


class OneLineErrorGroup(TyperGroup):
    """A Typer group whose errors are one line on stderr, never a traceback or a usage panel."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(
                args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra
            )
            code = result if isinstance(result, int) else 0
        except InputError as exc:
            code = fail(str(exc)).exit_code
        except typer.TyperException as exc:  # Click-level usage errors (typer >= 0.29 vendors Click)
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `zerocalc`: the help text itself
                typer.echo(exc.format_message(), err=True)
                code = exc.exit_code
            else:
                ctx = getattr(exc, "ctx", None)
                hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
                code = fail(exc.format_message() + hint, exc.exit_code).exit_code
        except (typer.Abort, KeyboardInterrupt):
            typer.echo("zerocalc: interrupted", err=True)
            code = 130
        except typer.Exit as exc:
            code = exc.exit_code
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    name="zerocalc",
    cls=OneLineErrorGroup,
    help="Memory and communication calculator for data-parallel training (DDP, ZeRO-1/2/3, FSDP).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Memory and communication calculator for data-parallel training (DDP, ZeRO-1/2/3, FSDP)."""


# Command modules register themselves on ``app`` when imported.
from zerocalc.cli import bench as _bench  # noqa: E402,F401
from zerocalc.cli import memory as _memory  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app()


from zerocalc.cli import check as _check  # noqa: E402,F401
from zerocalc.cli import comm as _comm  # noqa: E402,F401
from zerocalc.cli import presets as _presets  # noqa: E402,F401
from zerocalc.cli import validate as _validate  # noqa: E402,F401
