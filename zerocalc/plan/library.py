"""``zerocalc.plan(...)``: the search of ``zerocalc plan`` from keywords, as the CLI spells its options.

:func:`zerocalc.api.plan` (the library's entry point, ``from zerocalc import plan``) and the callable
package (``zerocalc/plan/__init__.py``) both call :func:`plan_from_keywords`.
"""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError
from zerocalc.plan.search import PlanResult, search
from zerocalc.plan.space import PlanOptions, parse_plan
from zerocalc.request.launch import with_launch_configs
from zerocalc.request.options import Command, echo, library_options, option
from zerocalc.request.training import options_from_keywords


def plan_from_keywords(
    model: Any, gpus: int | str = 1, gpus_per_node: int | str | None = None, **options: Any
) -> PlanResult:
    """``zerocalc plan``'s result for these keywords (:func:`zerocalc.api.plan`); ``candidates=True`` keeps
    every candidate. A keyword the command does not take is an :class:`InputError` listing those it does."""
    candidates = options.pop("candidates", False)
    if not isinstance(candidates, bool):
        raise InputError(f"plan() candidates={candidates!r} is not accepted; accepted: True or False")
    positional = {"model": model, "gpus": gpus, "gpus_per_node": gpus_per_node}
    values = {**positional, **options}
    accepted = [o.name for o in library_options(Command.PLAN)]
    unknown = sorted(set(values) - set(accepted))
    if unknown:
        names = ", ".join([*accepted, "candidates"])
        raise InputError(f"plan() takes no keyword {unknown[0]!r}; accepted: {names}")
    given = frozenset(options) | {n for n, v in positional.items() if v != option(Command.PLAN, n).default}
    typed, _ = with_launch_configs(Command.PLAN, values, given)
    request = parse_plan(options_from_keywords(PlanOptions, typed))
    result = search(request, keep_all=candidates)
    return result.model_copy(update={"options": echo(Command.PLAN, typed)})
