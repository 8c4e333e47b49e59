"""Why a request asks for something a framework's profile does not model (one message each, naming the
concepts as ``{name}``, turned into flags or keywords by the caller)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.profiles import Profile, Wrap
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
    offloading = (request.offload_optimizer, request.offload_params) != (
        OffloadTarget.NONE,
        OffloadTarget.NONE,
    )
    if offloading and not profile.offload:
        return (
            f"{{framework}} {fw} does not model offload; "
            "accepted: no {offload_optimizer}/{offload_params} (or {framework} paper or deepspeed)"
        )
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
