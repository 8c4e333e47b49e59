"""The Typer application every command registers on, and its one-line error handling.

Bad input of any kind (a Click usage error or an :class:`~zerocalc.base.errors.InputError` from the request
parser or the core) becomes one line on stderr and exit code 2. Core messages name inputs by concept
(``{gpus_per_node}``); :func:`flag` is the one place that says which flag each concept is.
"""

from __future__ import annotations

import codecs
import os
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from zerocalc.base.errors import InputError, why_not

EXIT_BAD_INPUT = 2
EXIT_OUTPUT_FAILED = 1
"""Standard output could not be written (a full disk, a closed descriptor): nothing usable was written."""

MIN_COLUMNS = 60
"""Below this width no table of numbers fits whole; a narrower ``COLUMNS`` (0, 1…59, text) is taken as
:data:`DEFAULT_COLUMNS`."""
DEFAULT_COLUMNS = 80
"""The width every table is designed for."""

ASCII_FALLBACKS = {
    "Ψ": "Psi", "α": "alpha", "β": "beta", "Σ": "Sum", "µ": "u", "μ": "u", "·": "*", "×": "x",
    "→": "->", "←": "<-", "≤": "<=", "≥": ">=", "≈": "~", "−": "-", "–": "-", "—": "-", "…": "...",
    "²": "^2", "³": "^3", "§": "sec.", "⏎": "|", "✓": "ok", "✗": "x", "’": "'", "“": '"',
    "”": '"', "\u00a0": " ",
}  # fmt: skip
"""How a symbol is written where the output's encoding cannot represent it (``PYTHONIOENCODING=ascii``, a
C locale); anything else not representable becomes ``?``."""


def flag(concept: str) -> str:
    """The command-line flag of a request concept (``gpus_per_node`` → ``--gpus-per-node``): the option's
    (:data:`zerocalc.request.options.FLAGS`), a switch's off ``no_`` + its concept its negative flag
    (:data:`~zerocalc.request.options.NEGATIVE_FLAGS`), else ``--`` + the concept with ``-`` for ``_``."""
    from zerocalc.request.options import FLAGS, NEGATIVE_FLAGS

    if concept.startswith("no_") and concept[3:] in NEGATIVE_FLAGS:
        return NEGATIVE_FLAGS[concept[3:]]
    return FLAGS.get(concept, "--" + concept.replace("_", "-"))


def _ascii_fallback(error: UnicodeError) -> tuple[str, int]:
    """The ``zerocalc-fallback`` codec error handler: :data:`ASCII_FALLBACKS`, else ``?``."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start : error.end]
    return "".join(ASCII_FALLBACKS.get(char, "?") for char in bad), error.end


def _prepare_output() -> str | None:
    """Make standard output safe to write: symbols its encoding lacks are written in ASCII, and a
    ``COLUMNS`` narrower than :data:`MIN_COLUMNS` (or not a number) is taken as :data:`DEFAULT_COLUMNS`.
    Returns why nothing can be written (standard output closed), or None."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and not (columns.strip().isdigit() and int(columns) >= MIN_COLUMNS):
        os.environ["COLUMNS"] = str(DEFAULT_COLUMNS)
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            "Ψµ·×→".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                # registered only where needed: a registered handler keeps this module's globals alive
                # into the interpreter's final clean-up, which lengthens every exit
                codecs.register_error("zerocalc-fallback", _ascii_fallback)
                reconfigure(errors="zerocalc-fallback")
    if sys.stdout is None or getattr(sys.stdout, "closed", False):
        return "standard output is closed"
    return None


def _output_failed(exc: OSError) -> int:
    """Standard output could not be written: one line on stderr (none for a reader that stopped reading,
    ``| head``), exit code :data:`EXIT_OUTPUT_FAILED`; later writes go nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError, AttributeError):
        pass
    if not isinstance(exc, BrokenPipeError):
        typer.echo(f"zerocalc: error: cannot write the output ({why_not(exc)})", err=True)
    return EXIT_OUTPUT_FAILED


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print ``zerocalc: error: message`` on stderr and return the Exit to raise."""
    typer.echo(f"zerocalc: error: {message}", err=True)
    return typer.Exit(code)


def _plain_text_options(params: list[Any]) -> None:
    """Let text options and flags through as they are typed: ``zerocalc.request.training`` parses every value
    itself, so Typer's per-option pydantic adapter (built on first use, ~1 ms each, and the import of
    its adapter module) is not needed."""
    try:
        from typer._coercion import PassThroughRuntimeParam
    except ImportError:  # pragma: no cover - another typer: keep its own coercion
        return
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", True) is not None:
            continue
        if descriptor.annotation in (str, bool):
            param._runtime_param = PassThroughRuntimeParam(
                annotation=descriptor.annotation, parameter_info=descriptor.parameter_info
            )


class PlainTextCommand(TyperCommand):
    """A command whose text options reach it as typed (see :func:`_plain_text_options`), and whose help
    fits 80 columns (see :meth:`format_help`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _plain_text_options(self.get_params(ctx))
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Typer's help, with a flag's negative form under it in the first column (``--flash-attention
        / --no-flash-attention``, which wraps there) instead of a column of its own: Rich shrinks every
        wrappable column alike, so two columns of long option names cut both (``--expandable-segmen…``)
        at 80 columns; and no type column for a flag (it takes no value: Typer shows ``<bool>``). Only the
        rendering changes; the flags are restored before anything parses."""
        params = self.get_params(ctx)
        flags = [p for p in params if p.secondary_opts and p.opts[0].startswith("--")]
        saved = [(p, p.opts, p.secondary_opts, p.metavar) for p in params]
        for param in flags:
            param.opts = [" / ".join([param.opts[0], *param.secondary_opts]), *param.opts[1:]]
            param.secondary_opts = []
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        try:
            super().format_help(ctx, formatter)
        finally:
            for param, opts, secondary, metavar in saved:
                param.opts, param.secondary_opts, param.metavar = opts, secondary, metavar


class OneLineErrorGroup(TyperGroup):
    """A Typer group whose errors are one line on stderr, never a traceback or a usage panel."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _plain_text_options(self.get_params(ctx))
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Typer's help, with no type column for a flag (``--version``: Typer shows ``<bool>``)."""
        params = [p for p in self.get_params(ctx) if getattr(p, "is_flag", False)]
        saved = [(p, p.metavar) for p in params]
        for param in params:
            param.metavar = ""
        try:
            super().format_help(ctx, formatter)
        finally:
            for param, metavar in saved:
                param.metavar = metavar

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        closed = _prepare_output()
        if closed is not None:
            typer.echo(f"zerocalc: error: {closed}; accepted: a terminal, file or pipe to write to", err=True)
            if standalone_mode:
                sys.exit(EXIT_OUTPUT_FAILED)
            return EXIT_OUTPUT_FAILED
        try:
            result = super().main(
                args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra
            )
            code = result if isinstance(result, int) else 0
            sys.stdout.flush()  # a full disk or a closed pipe is reported here, not at interpreter exit
        except InputError as exc:
            code = fail(exc.render(flag)).exit_code
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
        except OSError as exc:  # writing standard output: every file the commands read or write is checked
            code = _output_failed(exc)
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


def _version(value: bool) -> None:
    if value:
        from zerocalc import __version__

        typer.echo(f"zerocalc {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_version, is_eager=True
    ),
) -> None:
    """Memory and communication calculator for data-parallel training (DDP, ZeRO-1/2/3, FSDP)."""
