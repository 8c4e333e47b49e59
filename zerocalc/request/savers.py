"""The memory savers of fine-tuning recipes as a request holds them (``--loss``, ``--loss-chunks``,
``--optimizer-in-backward``, ``--offload-activations``): parsed once here, checked against the model's
code and the framework (:func:`savers_problem`); and what the training loop keeps of the loss's output
(``--keep-output``, :func:`kept_output_problem`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerocalc.base.errors import InputError
from zerocalc.base.units import parse_whole
from zerocalc.model.activations import Recompute
from zerocalc.model.code import (
    MODEL_CODES,
    SHIFTED_LOSS_FAMILIES,
    TORCHTUNE_OUTPUT_CHUNKS,
    LossImpl,
    ModelImplName,
    OutputKept,
)
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.precision import ParamLayout
from zerocalc.parallel.strategies import OffloadTarget
from zerocalc.request.values import choice

if TYPE_CHECKING:
    from zerocalc.request.training import TrainingRequest

MAX_LOSS_CHUNKS = 2**16
"""The most output chunks ``--loss-chunks`` takes (``tensor_split`` itself takes any; past the sequence
length the chunks are empty)."""


def parse_loss(loss: Any, chunks: Any) -> tuple[LossImpl, int]:
    """``--loss`` and ``--loss-chunks`` typed: the loss and its chunk count (torchtune's 8 where not given;
    given, only with ``chunked``, the one loss that reads it)."""
    impl = choice(loss, "{loss}", LossImpl)
    if chunks is None:
        return impl, TORCHTUNE_OUTPUT_CHUNKS
    count = parse_whole(chunks, "{loss_chunks}", 1, MAX_LOSS_CHUNKS, "chunks")
    if impl is not LossImpl.CHUNKED:
        raise InputError(
            f"{{loss_chunks}} {count} with {{loss}} {impl.value}: it is the chunk count of torchtune's "
            "chunked cross-entropy (Liger's fused-linear derives its own from V/h); accepted: {loss} "
            "chunked, or no {loss_chunks}"
        )
    return impl, count


def savers_problem(request: TrainingRequest) -> str | None:
    """A saver this request cannot run, as the code it comes from refuses it or as it is not modelled,
    or None."""
    loss = request.activations.loss
    if loss is LossImpl.SHIFTED:
        return _shifted_problem(request)
    if loss is not LossImpl.FULL:
        impl = MODEL_CODES[request.model_code]
        if not impl.loss_savers:
            accepted = ", ".join(n.value for n, c in MODEL_CODES.items() if c.loss_savers)
            return (
                f"{{loss}} {loss.value} with {{model_impl}} {request.model_code.value}: it replaces "
                f"transformers' LM head and loss; accepted: {{model_impl}} {accepted}, or {{loss}} full"
            )
        record = request.framework_record
        if (
            loss is LossImpl.FUSED_LINEAR
            and record.param_layout is ParamLayout.AUTOCAST
            and (request.finetune is None or not request.finetune.base_frozen)
        ):
            # Liger's grad_weight = zeros_like(weight) is then fp32 beside bf16 logits: torch.addmm(...,
            # out_dtype=torch.float32) on CUDA, another path than the one modelled
            accepted = ", ".join(
                f.value
                for f, r in FRAMEWORKS.items()
                if r.param_layout is not ParamLayout.AUTOCAST
                and (r.model_code is None or MODEL_CODES[r.model_code].loss_savers)
            )
            return (
                f"{{loss}} fused-linear with {{framework}} {record.framework.value}: autocast keeps the LM "
                f"head's weight in fp32, whose gradient Liger accumulates otherwise, not modelled; accepted: "
                f"{{framework}} {accepted}, or a frozen head ({{lora_rank}})"
            )
        if request.mesh.tp > 1:
            return (
                f"{{loss}} {loss.value} with {{tp}} {request.mesh.tp}: the chunks' logits of a vocabulary "
                "sharded over tensor-parallel ranks are not modelled; accepted: {tp} 1, or {loss} full"
            )
    if request.optimizer_in_backward and (problem := _in_backward_problem(request)):
        return problem
    if request.activations.offload:
        return _offload_problem(request)
    return None


def _shifted_problem(request: TrainingRequest) -> str | None:
    """Where transformers 4.36-4.45's in-forward loss (:mod:`zerocalc.model.code.loss`) is not the code
    asked for, or is not modelled."""
    if request.model_code is not ModelImplName.HF:
        return (
            f"{{loss}} shifted with {{model_impl}} {request.model_code.value}: it is the loss of older "
            "transformers' ForCausalLM models; accepted: {model_impl} hf, or {loss} full"
        )
    arch = request.rank_model.architecture
    family = arch.family if arch is not None else None
    if family not in SHIFTED_LOSS_FAMILIES:
        families = ", ".join(sorted(SHIFTED_LOSS_FAMILIES))
        return (
            f"{{loss}} shifted with {f'the {family} family' if family else 'a model of no family'}: its "
            "transformers 4.45 forward does not upcast and shift its logits that way; accepted: a model of "
            f"the families {families} (config.json's model_type), or {{loss}} full"
        )
    mesh = request.mesh
    for name, size in (("tp", mesh.tp), ("cp", mesh.cp), ("pp", mesh.pp)):
        if size > 1:
            return (
                f"{{loss}} shifted with {{{name}}} {size}: transformers 4.45 trained its models on one "
                f"rank's whole sequence and vocabulary; accepted: {{{name}}} 1, or {{loss}} full"
            )
    return None


def _offload_problem(request: TrainingRequest) -> str | None:
    """What torchtune's activation offloading (v0.6.0-rc1-220-gbd2a0fc7
    ``training/_activation_offloading.py``) cannot run with, as its recipes refuse it or as it is not
    modelled."""
    record = request.framework_record
    if not record.activation_offloading:
        accepted = ", ".join(f.value for f, r in FRAMEWORKS.items() if r.activation_offloading)
        return (
            f"{{offload_activations}} with {{framework}} {record.framework.value}: it is torchtune's "
            f"(OffloadActivations), whose recipes run FSDP2 or one GPU; accepted: {{framework}} {accepted}"
        )
    if request.model_code is not ModelImplName.HF:
        return (
            f"{{offload_activations}} with {{model_impl}} {request.model_code.value}: torchtune's recipes "
            "run their own decoder, modelled with transformers' layers; accepted: {model_impl} hf"
        )
    activations = request.activations
    if activations.recompute is not Recompute.FULL:
        # recipes/full_finetune_distributed.py: "enable_activation_offloading should only be True when
        # enable_activation_checkpointing is True"
        return (
            f"{{offload_activations}} with {{recompute}} {activations.recompute.value}: torchtune refuses it "
            "without activation checkpointing; accepted: {recompute} full"
        )
    if activations.checkpoint_every > 1:
        return (
            f"{{offload_activations}} with {{checkpoint_every}} {activations.checkpoint_every}: the saved "
            "tensors of the layers not checkpointed, each offloaded, are not modelled; accepted: "
            "{checkpoint_every} 1"
        )
    if request.mesh.pp > 1:
        return (
            f"{{offload_activations}} with {{pp}} {request.mesh.pp}: torchtune's recipes that offload have "
            "no pipeline stages; accepted: {pp} 1"
        )
    return None


def _in_backward_problem(request: TrainingRequest) -> str | None:
    record = request.framework_record
    if not record.optimizer_in_backward:
        accepted = ", ".join(f.value for f, r in FRAMEWORKS.items() if r.optimizer_in_backward)
        return (
            f"{{optimizer_in_backward}} with {{framework}} {record.framework.value}: its code does not step "
            f"the optimizer in a gradient hook; accepted: {{framework}} {accepted}"
        )
    if request.grad_accum > 1:
        # torchtune recipes/full_finetune_distributed.py: "Gradient accumulation is not supported with
        # optimizer in bwd"
        return (
            f"{{optimizer_in_backward}} with {{grad_accum}} {request.grad_accum}: each gradient is stepped "
            "and freed as it is made, so none accumulates (torchtune refuses it); accepted: {grad_accum} 1"
        )
    if request.offload_params is not OffloadTarget.NONE:
        return (
            f"{{optimizer_in_backward}} with {{offload_params}} {request.offload_params.value}: the "
            "optimizer steps on the host there, not modelled in backward; accepted: no {offload_params}"
        )
    if request.mesh.ep > 1:
        # torchtitan v0.2.2 components/optimizer.py build_optimizers: "not supported with Expert Parallel"
        return (
            f"{{optimizer_in_backward}} with {{ep}} {request.mesh.ep}: torchtitan refuses it with expert "
            "parallelism; accepted: {ep} 1"
        )
    if request.mesh.pp > 1:
        return (
            f"{{optimizer_in_backward}} with {{pp}} {request.mesh.pp}: a pipeline stage reduces its "
            "gradients after the last micro-batch; accepted: {pp} 1"
        )
    if request.model_code is ModelImplName.MEGATRON:
        return "{optimizer_in_backward} with {model_impl} megatron is not modelled; accepted: {model_impl} hf"
    return None


def kept_output_problem(request: TrainingRequest) -> str | None:
    """``--keep-output`` where the loop cannot hold a transformers output, or where what it holds is not
    modelled; None where accepted (or not asked)."""
    kept = request.activations.keep_output
    if kept is OutputKept.NONE:
        return None
    what = f"{{keep_output}} {kept.value}"
    impl = MODEL_CODES[request.model_code]
    if not impl.transformers_modules:
        return (
            f"{what} with {{model_impl}} {request.model_code.value}: its training loop keeps only the "
            "loss (torchtitan's `del pred`, Megatron-LM's schedules); accepted: {model_impl} hf, or "
            "{keep_output} none"
        )
    if request.activations.loss.saver:
        return (
            f"{what} with {{loss}} {request.activations.loss.value}: the saver's recipe drops the output "
            "(torchtune's `del outputs`; Liger's loss returns no logits); accepted: {loss} full"
        )
    if request.activations.offload:
        return (
            f"{what} with {{offload_activations}}: torchtune's recipes drop the logits (`del logits`); "
            "accepted: {keep_output} none"
        )
    if request.mesh.pp > 1:
        return (
            f"{what} with {{pp}} {request.mesh.pp}: a pipeline schedule calls the loss itself; accepted: "
            "{pp} 1"
        )
    if impl.kv_cache_copies and request.activations.recompute is not Recompute.FULL:
        # transformers 5.17: use_cache defaults to True in training and is forced off only under gradient
        # checkpointing; the output's DynamicCache then holds every layer's k and v past their backward
        return (
            f"{what} with {{recompute}} {request.activations.recompute.value}: the output's DynamicCache "
            "(use_cache, on unless gradient checkpointing turns it off) would hold every layer's k and v "
            "too, not modelled; accepted: {recompute} full"
        )
    return None
