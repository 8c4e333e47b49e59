"""``--compile``'s refusals: where a model's code does not ``torch.compile`` the part asked, and where
what the compiled step runs or saves is not modelled (pure; :mod:`zerocalc.model.code.compiled`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import layer_tensors
from zerocalc.model.code import Compiled, LossImpl, ModelImplName, compile_unsupported
from zerocalc.parallel.frameworks import Estimate
from zerocalc.parallel.precision import Fp8RecipeName

if TYPE_CHECKING:
    from zerocalc.request.training import TrainingRequest


def compile_problem(request: TrainingRequest, flash: Callable[[], bool]) -> str | None:
    """``--compile`` where the model's code does not ``torch.compile`` the part asked
    (:mod:`zerocalc.model.code.compiled`), or where what it runs is not modelled: by any estimate, or (for
    ``memory`` and plan's memory requests) by the compiled step's saves; None where accepted (or not
    asked). ``flash``: whether the attention kernel is flash, asked only where compile is
    (:func:`~zerocalc.request.checks.flash_attention_used`: a ``--params`` request has no architecture)."""
    compiled = request.activations.compile
    if compiled is Compiled.NONE:
        return None
    what = f"{{compile}} {compiled.value}"
    if request.model_code is ModelImplName.MEGATRON:
        return (
            f"{what} with Megatron-LM's model code: Megatron-LM does not torch.compile its layers (it runs "
            "fused kernels of its own and Transformer Engine's); accepted: {compile} none, or {model_impl} "
            "torchtitan or hf"
        )
    if request.model_code is ModelImplName.HF and compiled is Compiled.LOSS:
        return (
            f"{what} with transformers' model code: its loss runs inside the model's forward "
            "(LlamaForCausalLM.forward calls self.loss_function), compiled with it or not at all; accepted: "
            "{compile} model, or {compile} none"
        )
    acts = request.activations
    if request.finetune is not None:
        return (
            f"{what} with fine-tuning (LoRA, QLoRA, DoRA, frozen weights) is not modelled; accepted: " + NONE
        )
    if acts.offload:
        return f"{what} with {{offload_activations}} is not modelled; accepted: " + NONE
    hf = request.model_code is ModelImplName.HF
    if acts.loss is not LossImpl.FULL and (compiled.loss or hf):
        return (
            f"{what} with {{loss}} {acts.loss.value}: a loss other than the model code's under compile is "
            "not modelled; "
            "accepted: {loss} full, or {compile} model with {model_impl} torchtitan"
        )
    if request.estimate is Estimate.MEMORY:
        return compile_memory_problem(request, what, flash())
    return None


NONE = "{compile} none"


def compile_memory_problem(request: TrainingRequest, what: str, flash: bool) -> str | None:
    """``--compile`` where what the compiled step saves is not modelled (:mod:`zerocalc.model.code.
    compiled`, measured on the dense Llama block with SDPA's flash kernel, on one rank and under
    torchtitan's TP plan with sequence parallelism: :mod:`zerocalc.validate.compiled_tp`); None where it
    is. The step time prices more (:mod:`zerocalc.compute.ops`: other recipes, context parallelism)."""
    compiled, acts = request.activations.compile, request.activations
    hf = request.model_code is ModelImplName.HF
    fp8 = request.fp8
    if fp8.on and (
        fp8.recipe is not Fp8RecipeName.TENSORWISE
        or hf
        or not all(fp8.converts(t) for t in layer_tensors(request.architecture, 0) if len(t.shape) == 2)
    ):
        return (
            f"{what} with {{fp8}} {fp8.recipe.value}: modelled for torchao's tensorwise Float8Linear on "
            "every linear of torchtitan's blocks (what was measured); accepted: {fp8} tensorwise, or " + NONE
        )
    tp = request.rank_shape.tp
    if fp8.on and tp > 1 and (compiled.model or hf):
        return (
            f"{what} with {{fp8}} {fp8.recipe.value} and {{tp}} {tp}: the compiled Float8 block is measured "
            "on one rank (torchao's Float8ColwiseParallel plan not measured); accepted: {tp} 1, or " + NONE
        )
    if compiled.model or hf:
        reason = compile_unsupported(request.architecture, request.rank_shape, flash)
        if reason is not None:
            return f"{what}: the saves of a compiled block: {reason}; accepted: {{compile}} none"
        if tp > 1 and (hf or acts.recompute is Recompute.FULL):
            # torch 2.13: a checkpoint_wrapper'd block under DTensor TP fails to compile (AOTAutograd's
            # save_from_forward: "expected all tensors_saved_with_vc_check to be Tensors", a DeviceMesh)
            code = "transformers' code" if hf else "{recompute} full"
            return (
                f"{what} with {code} and {{tp}} {tp}: the compiled saves are measured under TP for "
                "torchtitan's blocks with {recompute} none or op; accepted: {tp} 1, or " + NONE
            )
        allowed = (Recompute.NONE,) if hf else (Recompute.NONE, Recompute.FULL, Recompute.OP)
        if acts.recompute not in allowed:
            names = ", ".join(r.value for r in allowed)
            return (
                f"{what} with {{recompute}} {acts.recompute.value}: not modelled for "
                f"{request.model_code.value}'s compiled code; accepted: {{recompute}} {names}"
            )
    if compiled.loss and request.rank_shape.tp > 1:
        return (
            f"{what} with {{tp}} {request.rank_shape.tp}: the compiled vocabulary-parallel loss is not "
            "modelled; accepted: {tp} 1, or {compile} model"
        )
    return None
