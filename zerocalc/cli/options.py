"""The Typer parameters of every command, derived from the option records: ``memory``, ``comm`` and
``plan``'s from :data:`zerocalc.request.options.OPTIONS`, ``bench``'s and the ``validate`` subcommands' from
:data:`zerocalc.cli.measure_options.MEASURE_OPTIONS` (each option's flags, default, help and accepted values
are written there, once).

Every value reaches the command as typed (text) and is parsed where it is read: by the request
(:mod:`zerocalc.request.training`, :mod:`zerocalc.plan.space`), or by the measuring commands with
:func:`whole_number`, :func:`seconds` and :func:`comma_list`, each naming what is accepted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zerocalc.base.errors import InputError
from zerocalc.request.options import Command, Kind, Option, options_for

if TYPE_CHECKING:
    from zerocalc.cli.measure_options import Measure


def _help(option: Option) -> str:
    if option.default_help is None:
        return option.help
    return f"{option.help} \\[default: {option.default_help}]"


def _parameter(option: Option) -> inspect.Parameter:
    show_default = option.kind is Kind.TEXT and option.default is not None
    if option.kind is Kind.TEXT:
        annotation: Any = str | None
        default = None if option.default is None else str(option.default)
        info = typer.Option(
            *option.flags, help=_help(option), metavar=option.metavar, show_default=show_default
        )
    elif option.kind is Kind.FLAG:
        annotation, default = bool, bool(option.default)
        info = typer.Option(*option.flags, help=_help(option), show_default=False)
    else:
        annotation, default = bool | None, option.default
        decls = [f"{option.flag}/{option.negative}", *option.flags[1:]]
        info = typer.Option(*decls, help=_help(option), show_default=False)
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, info]
    )


Run = Callable[[dict[str, Any], frozenset[str]], None]


def _command_function(name: str, options: tuple[Option, ...], run: Run, doc_of: Run) -> Callable[..., None]:
    """A function Typer reads as a command: one keyword per option (named as the option's keyword, spelled
    as its flags), calling ``run(values, given)`` with them as a dict and the names of those typed on the
    command line (``given``); its name, help and module are ``doc_of``'s."""
    parameters = [_parameter(o) for o in options]
    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

    def command_function(ctx: typer.Context, **values: Any) -> None:
        sources = {name: ctx.get_parameter_source(name) for name in values}
        given = frozenset(name for name, s in sources.items() if getattr(s, "name", "") == "COMMANDLINE")
        run(values, given)

    command_function.__name__ = name
    command_function.__qualname__ = name
    command_function.__doc__ = _flowed(doc_of.__doc__)
    command_function.__module__ = doc_of.__module__
    command_function.__signature__ = inspect.Signature([context, *parameters])  # type: ignore[attr-defined]
    command_function.__annotations__ = {p.name: p.annotation for p in [context, *parameters]}
    return command_function


def _flowed(doc: str | None) -> str | None:
    """A docstring's paragraphs each on one line: Typer keeps the line breaks of every paragraph but the
    first, and Rich then wraps the broken lines again (ragged help at 80 columns)."""
    if doc is None:
        return None
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def takes_options(command: Command) -> Callable[[Run], Callable[..., None]]:
    """Give ``run(values, given)`` the parameters of every option of ``command``: Typer sees one keyword per
    option (named as the library's keyword, spelled as the option's flags); ``run`` gets them as a dict,
    and the names of those typed on the command line (``given``: they override a launch config's)."""

    def decorate(run: Run) -> Callable[..., None]:
        return _command_function(command.value, options_for(command), run, run)

    return decorate


def takes_measure(command: Measure) -> Callable[[Run], Callable[..., None]]:
    """:func:`takes_options` for a measuring command (its records in
    :data:`~zerocalc.cli.measure_options.MEASURE_OPTIONS`, its variant's too): before ``run``, an option
    given that the chosen variant does not read is refused in one line (:func:`refuse_unread`)."""
    from zerocalc.cli.measure_options import VARIANTS, declared_options

    options = declared_options(command)

    def decorate(run: Run) -> Callable[..., None]:
        def checked(values: dict[str, Any], given: frozenset[str]) -> None:
            if command in VARIANTS:
                switch, variant = VARIANTS[command]
                refuse_unread(command, variant, switch, bool(values[switch]), given)
            run(values, given)

        return _command_function(command.value.split()[-1], options, checked, run)

    return decorate


def refuse_unread(command: Measure, variant: Measure, switch: str, on: bool, given: frozenset[str]) -> None:
    """One line for the first option ``given`` that the chosen one of ``command`` and its ``variant`` (on
    with the flag ``switch``) does not read."""
    from zerocalc.cli.measure_options import declared_options, measure_options_for

    chosen = variant if on else command
    reads = {o.name for o in measure_options_for(chosen)}
    flags = {o.name: o.flag for o in declared_options(command)}
    unread = [o.name for o in declared_options(command) if o.name in given and o.name not in reads]
    if not unread:
        return
    flag, switch_flag = flags[unread[0]], flags[switch]
    if on:
        accepted = ", ".join(o.flag for o in measure_options_for(variant) if o.name != switch)
        raise InputError(f"{flag} is not read with {switch_flag}; accepted with {switch_flag}: {accepted}")
    raise InputError(f"{flag} is read only with {switch_flag}; accepted: {switch_flag} {flag}, or no {flag}")


# ------------------------------------------------------------------------ the measuring commands' values
def whole_number(text: str | None, flag: str) -> int | None:
    """A whole number as typed (``12``, ``-3``, ``1_000``); None stays None. Bounds are the reader's."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{flag} {text!r} is not accepted; accepted: a whole number") from None


def seconds(text: str, flag: str = "--timeout") -> float:
    """Seconds > 0 and at most one day (:func:`zerocalc.harness.procs.check_timeout`)."""
    from zerocalc.harness import procs

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
        if text.strip().lower() != "nan":
            raise InputError(
                f"{flag} {text!r} is not accepted; accepted: seconds > 0 and at most "
                f"{procs.MAX_TIMEOUT_S:g} (one day)"
            ) from None
    return procs.check_timeout(value, flag)


def comma_list(text: str, flag: str, accepted: tuple[str, ...], allow_all: bool) -> list[str]:
    """The names of a comma list, each one of ``accepted`` (``all``: every one, where ``allow_all``), in
    the order given, each once."""
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if allow_all and names == ["all"]:
        return list(accepted)
    if not names or any(n not in accepted for n in names):
        shown = ("all, or " if allow_all else "") + ", ".join(accepted)
        raise InputError(f"{flag} {text!r} is not accepted; accepted: {shown}")
    return list(dict.fromkeys(names))
