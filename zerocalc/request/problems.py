"""Why a request asks for something a framework's profile does not model (one message each, naming the
concepts as ``{name}``, turned into flags or keywords by the caller)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.profiles import PROFILES, Profile, Wrap
from zerocalc.parallel.strategies import OffloadTarget, StrategyName

if TYPE_CHECKING:
    from zerocalc.request.training import TrainingRequest


def architecture_problem(profile: Profile, strategy: StrategyName, request: TrainingRequest) -> str | None:
    """Why ``strategy`` needs the architecture this request does not have, or None."""
    if request.model.architecture is not None:
        return None
    if profile.framework is Framework.DEEPSPEED and strategy is StrategyName.ZERO3:
        return (
            "{framework} deepspeed zero3: DeepSpeed's estimator counts 4 × the largest layer, which needs "
            "the architecture; accepted: {model} NAME or config.json"
        )
    return None


def offload_profile_problem(profile: Profile, request: TrainingRequest) -> str | None:
    """An offload the framework's profile does not model (its memory, and the step time ``comm`` gives:
    the offload's traffic and the host's optimizer step), or None."""
    if (
        request.offload_optimizer in profile.offload_optimizer
        and request.offload_params in profile.offload_params
    ):
        return None
    fw = profile.framework.value
    none = (OffloadTarget.NONE,)
    if profile.offload_optimizer == none and profile.offload_params == none:
        offloaders = " or ".join(
            f.value for f, p in PROFILES.items() if (p.offload_optimizer, p.offload_params) != (none, none)
        )
        return (
            f"{{framework}} {fw} does not model offload; "
            f"accepted: no {{offload_optimizer}}/{{offload_params}} (or {{framework}} {offloaders})"
        )
    everywhere = " or ".join(
        f.value
        for f, p in PROFILES.items()
        if p.offload_optimizer == tuple(OffloadTarget) and p.offload_params == tuple(OffloadTarget)
    )
    accepted = [f"{{offload_optimizer}} {' or '.join(t.value for t in profile.offload_optimizer)}"]
    if profile.offload_params == none:
        accepted.append("no {offload_params}")
    else:
        accepted.append(f"{{offload_params}} {' or '.join(t.value for t in profile.offload_params)}")
    return (
        f"{{framework}} {fw} does not model this offload; "
        f"accepted: {', '.join(accepted)} (or {{framework}} {everywhere})"
    )


def profile_problem(profile: Profile, request: TrainingRequest) -> str | None:
    """Why ``request`` asks for something ``profile`` does not model, or None."""
    fw = profile.framework.value
    if request.model.architecture is None and profile.needs_architecture:
        return (
            f"{{framework}} {fw} counts what the implementation allocates for a given architecture; "
            "accepted: {model} NAME or config.json (or {framework} paper, deepspeed or megatron with "
            "{params})"
        )
    if (
        request.precision not in profile.precisions
        or request.optimizer not in profile.optimizers
        or (request.fp32_grad_accum and not profile.fp32_grad_accum)
    ):
        return f"{{framework}} {fw} models {profile.accepts}"
    problem = offload_profile_problem(profile, request)
    if problem:
        return problem
    if request.buffers.wrap is Wrap.MODEL and not profile.wrap_model:
        return (
            f"{{wrap}} model is not accepted with {{framework}} {fw}: its profile follows the per-block "
            "wrapping that zerocalc validate measures; accepted: {wrap} block"
        )
    architecture = request.model.architecture
    if architecture is not None and architecture.is_moe and not profile.moe:
        return (
            f"{{framework}} {fw} models dense transformers; {architecture.name} is a mixture of experts; "
            "accepted: a dense {model} (or {framework} paper)"
        )
    return None
