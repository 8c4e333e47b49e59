"""The library's entry points: keywords as the CLI spells them → one parsed request → the core (``plan``:
the search over many).

Each function takes the keywords of its command's options (:data:`zerocalc.request.options.OPTIONS`: the
same names, defaults and accepted values as the CLI's flags), parses them once into a
:class:`~zerocalc.request.training.TrainingRequest` and hands it to the pure core; bad input raises
:class:`~zerocalc.base.errors.InputError`, whose message names the keyword.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError, keyword
from zerocalc.request.launch import with_launch_configs
from zerocalc.request.options import Command, as_given, library_options, option

if TYPE_CHECKING:
    from zerocalc.comm.estimate import CommEstimate
    from zerocalc.peak.report import MemoryReport
    from zerocalc.plan.search import PlanResult
    from zerocalc.request.training import TrainingRequest
    from zerocalc.states.memory import MemoryEstimate


def _request(
    function: str,
    command: Command,
    positional: dict[str, Any],
    keywords: dict[str, Any],
    extra: tuple[str, ...] = (),
) -> tuple[TrainingRequest, dict[str, Any], list[str]]:
    """The request of ``command``'s options given as the function's ``positional`` parameters and its
    ``keywords`` (and ``extra``, keywords of the library only), the options it was made of, and the notes
    of the launch configs it names; a keyword the command does not take is an InputError. What a launch
    config sets gives way to every keyword and to each positional parameter not left at its default."""
    from zerocalc.parallel.frameworks import Estimate
    from zerocalc.request.training import parse_options

    values = {**positional, **keywords}
    accepted = [o.name for o in library_options(command)]
    unknown = sorted(set(values) - set(accepted) - set(extra))
    if unknown:
        raise InputError(f"{function}() takes no keyword {unknown[0]!r}; accepted: {', '.join(accepted)}")
    given = frozenset(keywords) | {n for n, v in positional.items() if v != option(command, n).default}
    options, notes = with_launch_configs(command, values, given)
    options.update({name: values[name] for name in extra if name in values})
    estimate = Estimate.COMM if command is Command.COMM else Estimate.MEMORY
    return parse_options(estimate=estimate, **options), options, notes


def _with_signature(function: Any, command: Command, positional: tuple[str, ...]) -> Any:
    """Give ``function`` the signature its command's options make (for help(), IDEs and the tests)."""
    keywords = {o.name: o for o in library_options(command)}
    parameters = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=keywords[name].default)
        for name in positional
    ]
    parameters += [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default)
        for o in keywords.values()
        if o.name not in positional
    ]
    function.__signature__ = inspect.Signature(parameters)
    return function


def estimate_memory(
    params: int | str | None = None,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    **options: Any,
) -> MemoryEstimate:
    """Per-GPU model-state bytes for each strategy (the ZeRO paper's accounting): ``zerocalc memory``.

    ``params`` takes the CLI's spellings (``"7B"``, ``6_738_415_616``), or ``model`` a preset name or a
    Hugging Face config.json path; ``strategies`` ``"all"``, a comma list or a list of names (FSDP names are
    aliases); ``gpu`` a GPU preset (or ``gpu_memory``, what PyTorch sees of one GPU) whose memory less the
    context outside the caching allocator (``reserve``) gives the fits column. Every other keyword is a
    ``zerocalc memory`` option.
    """
    from zerocalc.states.memory import evaluate_memory

    positional = {"params": params, "gpus": gpus, "gpus_per_node": gpus_per_node}
    request, given, notes = _request("estimate_memory", Command.MEMORY, positional, options)
    return as_given(evaluate_memory(request), Command.MEMORY, given, keyword, notes)


def estimate_peak(
    model: Any, gpus: int | str = 1, gpus_per_node: int | str | None = None, **options: Any
) -> MemoryReport:
    """Model states and the peak of one training step per strategy, for a model preset, a config.json path
    or a parsed one (``AutoConfig.from_pretrained(name).to_dict()``): ``zerocalc memory --model``, every
    keyword one of its options."""
    from zerocalc.peak.evaluate import evaluate_peak

    positional = {"model": model, "gpus": gpus, "gpus_per_node": gpus_per_node}
    request, given, notes = _request("estimate_peak", Command.MEMORY, positional, options)
    return as_given(evaluate_peak(request), Command.MEMORY, given, keyword, notes)


def estimate_comm(
    params: int | str | None = None,
    gpus: int | str = 1,
    gpus_per_node: int | str | None = None,
    **options: Any,
) -> CommEstimate:
    """Per-GPU bytes and time of every collective of each strategy, per optimizer step: ``zerocalc comm``.

    ``model`` (a preset or config.json) may replace ``params`` (and gives the real units, buckets and
    calls); ``framework`` whose schedule; ``gpu`` (a GPU preset) supplies default bandwidths, which explicit
    ``intra_node_bw``/``inter_node_bw`` and a calibration (an object, or the path of a file ``zerocalc
    bench`` wrote) override. Every other keyword is a ``zerocalc comm`` option.
    """
    from zerocalc.comm.estimate import evaluate_comm
    from zerocalc.request.compute import compute_table

    positional = {"params": params, "gpus": gpus, "gpus_per_node": gpus_per_node}
    extra = ("calibration_name",)
    request, given, notes = _request("estimate_comm", Command.COMM, positional, options, extra)
    table = compute_table(request.compute_calibration, request.gpu.name if request.gpu else None)
    computed = evaluate_comm(request, table.table, table.name) if table else evaluate_comm(request)
    return as_given(computed, Command.COMM, given, keyword, notes)


def plan(
    model: Any, gpus: int | str = 1, gpus_per_node: int | str | None = None, **options: Any
) -> PlanResult:
    """The configurations that fit, best first by the objective, each with its exact peak, step time and the
    ``memory``/``comm`` options that reproduce it: ``zerocalc plan``, as its ``--json`` prints it. ``gpus``
    is the most GPUs (fewer whole nodes are searched too); ``gpu`` a GPU preset or file (or ``gpu_memory``);
    ``global_batch`` tokens (``"4M"``) or sequences (``"512seq"``); every other keyword a ``zerocalc plan``
    option, and ``candidates=True`` (the library's only) keeps every candidate searched, not just the top.
    """
    from zerocalc.plan.library import plan_from_keywords

    return plan_from_keywords(model, gpus, gpus_per_node, **options)


_with_signature(estimate_memory, Command.MEMORY, ("params", "gpus", "gpus_per_node"))
_with_signature(estimate_peak, Command.MEMORY, ("model", "gpus", "gpus_per_node"))
_with_signature(estimate_comm, Command.COMM, ("params", "gpus", "gpus_per_node"))
_with_signature(plan, Command.PLAN, ("model", "gpus", "gpus_per_node"))
