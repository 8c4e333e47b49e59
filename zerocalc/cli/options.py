"""The Typer parameters of ``memory``, ``comm`` and ``plan``, derived from :data:`zerocalc.request.options.
OPTIONS` (each option's flags, default, help and accepted values are written there, once).

Every value reaches the command as typed (text) and is parsed by the request
(:mod:`zerocalc.request.training`, :mod:`zerocalc.plan.space`), which names what is accepted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from zerocalc.request.options import Command, Kind, Option, option, options_for


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


def takes_options(command: Command) -> Callable[[Run], Callable[..., None]]:
    """Give ``run(values, given)`` the parameters of every option of ``command``: Typer sees one keyword per
    option (named as the library's keyword, spelled as the option's flags); ``run`` gets them as a dict,
    and the names of those typed on the command line (``given``: they override a launch config's)."""

    def decorate(run: Run) -> Callable[..., None]:
        parameters = [_parameter(o) for o in options_for(command)]
        context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        def command_function(ctx: typer.Context, **values: Any) -> None:
            sources = {name: ctx.get_parameter_source(name) for name in values}
            given = frozenset(name for name, s in sources.items() if getattr(s, "name", "") == "COMMANDLINE")
            run(values, given)

        command_function.__name__ = command.value
        command_function.__qualname__ = command.value
        command_function.__doc__ = run.__doc__
        command_function.__module__ = run.__module__
        command_function.__signature__ = inspect.Signature([context, *parameters])  # type: ignore[attr-defined]
        command_function.__annotations__ = {p.name: p.annotation for p in [context, *parameters]}
        return command_function

    return decorate


def annotated(command: Command, name: str) -> Any:
    """One option's Typer annotation, for a command that declares its other options itself."""
    return _parameter(option(command, name)).annotation
