"""Why a request asks for something a framework's record does not model (one message each, naming the
concepts as ``{name}``, turned into flags or keywords by the caller)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.framework_records.record import FrameworkRecord, Wrap
from zerocalc.parallel.strategies import OffloadTarget, StrategyName
from zerocalc.request.finetune import PAGED_OPTIMIZERS, finetune_problem

if TYPE_CHECKING:
    from zerocalc.request.training import TrainingRequest


def architecture_problem(
    record: FrameworkRecord, strategy: StrategyName, request: TrainingRequest
) -> str | None:
    """Why ``strategy`` needs the architecture this request does not have (its set-up says), or None."""
    if request.model.architecture is not None:
        return None
    return record.setup(strategy).needs_architecture


def offload_record_problem(record: FrameworkRecord, request: TrainingRequest) -> str | None:
    """An offload the framework's record does not model (its memory, and the step time ``comm`` gives:
    the offload's traffic and the host's optimizer step), or None."""
    if (
        request.offload_optimizer in record.offload_optimizer
        and request.offload_params in record.offload_params
    ):
        return None
    fw = record.framework.value
    none = (OffloadTarget.NONE,)
    if record.offload_optimizer == none and record.offload_params == none:
        offloaders = " or ".join(
            f.value for f, p in FRAMEWORKS.items() if (p.offload_optimizer, p.offload_params) != (none, none)
        )
        return (
            f"{{framework}} {fw} does not model offload; "
            f"accepted: no {{offload_optimizer}}/{{offload_params}} (or {{framework}} {offloaders})"
        )
    everywhere = " or ".join(
        f.value
        for f, p in FRAMEWORKS.items()
        if p.offload_optimizer == tuple(OffloadTarget) and p.offload_params == tuple(OffloadTarget)
    )
    accepted = [f"{{offload_optimizer}} {' or '.join(t.value for t in record.offload_optimizer)}"]
    if record.offload_params == none:
        accepted.append("no {offload_params}")
    else:
        accepted.append(f"{{offload_params}} {' or '.join(t.value for t in record.offload_params)}")
    return (
        f"{{framework}} {fw} does not model this offload; "
        f"accepted: {', '.join(accepted)} (or {{framework}} {everywhere})"
    )


def record_problem(record: FrameworkRecord, request: TrainingRequest) -> str | None:
    """Why ``request`` asks for something ``record`` does not model, or None."""
    fw = record.framework.value
    if request.finetune is not None or request.optimizer in PAGED_OPTIMIZERS:
        return finetune_problem(record, request)
    if request.model.architecture is None and record.needs_architecture:
        return (
            f"{{framework}} {fw} counts what the implementation allocates for a given architecture; "
            "accepted: {model} NAME or config.json (or {framework} paper, deepspeed or megatron with "
            "{params})"
        )
    if (
        request.precision not in record.precisions
        or request.optimizer not in record.optimizers
        or (request.fp32_grad_accum and not record.fp32_grad_accum)
    ):
        return f"{{framework}} {fw} models {record.accepts}"
    problem = offload_record_problem(record, request)
    if problem:
        return problem
    if request.buffers.wrap is Wrap.MODEL and not record.wrap_model:
        return (
            f"{{wrap}} model is not accepted with {{framework}} {fw}: it follows the per-block "
            "wrapping that zerocalc validate measures; accepted: {wrap} block"
        )
    return None
