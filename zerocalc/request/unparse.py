"""A typed request back into the options that parse to it (the inverse of
:func:`~zerocalc.request.training.parse_request`), for the commands ``zerocalc plan`` prints.

Each option of :data:`~zerocalc.request.options.OPTIONS` that ``plan`` varies is the request field it sets
(:data:`FIELDS`) written as the option takes it; which commands take it is the option's record. An option
whose value is its field's default is left out, unless asked for. The model, the GPU and the node are
printed as they were given (the request holds the model and the GPU as loaded, and a node larger than the
world as the world).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from zerocalc.parallel.frameworks import Estimate
from zerocalc.request.gpu import gpu_preset, link_figures
from zerocalc.request.options import Command, options_for
from zerocalc.request.training import TrainingRequest


def _text(value: object) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()  # the switch's two flags: true, false
    if isinstance(value, tuple):
        return ",".join(_text(v) for v in value)
    return str(value)


FIELDS: dict[str, str] = {
    "gpus": "mesh.world",
    "gpus_per_node": "mesh.gpus_per_node",
    "tp": "mesh.tp",
    "sequence_parallel": "mesh.sequence_parallel",
    "cp": "mesh.cp",
    "pp": "mesh.pp",
    "vpp": "mesh.vpp",
    "ep": "mesh.ep",
    "fp8": "fp8.recipe",
    "fp8_all_gather": "fp8.all_gather",
    "loss": "activations.loss",
    "optimizer_in_backward": "optimizer_in_backward",
    "pp_first_stage_layers": "mesh.pp_first_stage_layers",
    "pp_last_stage_layers": "mesh.pp_last_stage_layers",
    "seq_len": "activations.seq_len",
    "framework": "framework",
    "strategies": "strategies",
    "micro_batch": "activations.micro_batch",
    "grad_accum": "grad_accum",
    "recompute": "activations.recompute",
    "offload_optimizer": "offload_optimizer",
    "offload_params": "offload_params",
    "reduce_dtype": "reduce_dtype",
    "prefetch": "buffers.prefetch",
    "grad_sync": "grad_sync",
    "init": "init_asked",
    "model_impl": "model_impl",
    "flash_attention": "activations.flash_attention",
    "compile": "activations.compile",
    "calibration": "calibration_name",
    "compute_calibration": "compute_calibration",
}
"""The request field (a path) each option sets, as parsing sets it."""

_FORMATS: dict[str, Callable[[Any], str]] = {}
"""An option written otherwise than its value's text (none yet)."""


def _at(request: TrainingRequest, path: str) -> tuple[object, object]:
    """The value at ``path`` and its field's default (PydanticUndefined: the field has none)."""
    owner: Any = request
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    if not isinstance(owner, BaseModel):  # a NamedTuple (the FP8 setting)
        return getattr(owner, name), owner._field_defaults[name]
    return getattr(owner, name), type(owner).model_fields[name].default


def options_text(
    request: TrainingRequest,
    command: Command,
    names: Iterable[str],
    given: Mapping[str, str] | None = None,
    always: Iterable[str] = (),
) -> dict[str, str]:
    """The options of ``names`` that ``command`` takes, in that order, as they are typed (concept → text):
    ``given`` as given, the others from the request's fields (:data:`FIELDS`), those at their default left
    out unless in ``always``."""
    taken = {o.name for o in options_for(command, request_only=True)}
    given, always = dict(given or {}), set(always)
    out: dict[str, str] = {}
    for name in names:
        if name not in taken:
            continue
        if name in given:
            out[name] = given[name]
            continue
        value, default = _at(request, FIELDS[name])
        if value is None or (value == default and name not in always and default is not PydanticUndefined):
            continue
        out[name] = _FORMATS.get(name, _text)(value)
    return out


def for_command(request: TrainingRequest, command: Command) -> TrainingRequest:
    """The request as ``command`` parses it from its own options: its ``estimate``, and the fields of each
    option it does not take (:data:`~zerocalc.request.options.OPTIONS`) at their defaults; a GPU given by its
    memory alone (``gpu_memory``, memory's option) as the GPU whose figures it runs with (the runtime's
    preset, ``--gpu NAME``: its memory and links)."""
    taken = {o.name for o in options_for(command, request_only=True)}
    changes: dict[str, Any] = {}
    estimate = Estimate(command.value)
    if request.estimate is not estimate:
        changes["estimate"] = estimate
    if "gpu_memory" not in taken and request.gpu is None and request.gpu_memory_bytes is not None:
        gpu = gpu_preset(request.runtime.name)
        changes["gpu"], changes["gpu_memory_bytes"] = gpu, gpu.usable_bytes
        changes["links"] = link_figures(None, None, request.links.intra_node.latency_s, gpu)
    for name, paths in _COMMAND_FIELDS.items():
        if name in taken:
            continue
        for path in paths:
            top, _, field = path.partition(".")
            if field:
                owner = changes.get(top, getattr(request, top))
                default = type(owner).model_fields[field].default
                if getattr(owner, field) != default:
                    changes[top] = owner.model_copy(update={field: default})
            elif getattr(request, top) != type(request).model_fields[top].default:
                changes[top] = type(request).model_fields[top].default
    return request.with_(**changes) if changes else request


_COMMAND_FIELDS: dict[str, tuple[str, ...]] = {
    "reserve": ("reserve_bytes",),
    "fp32_grad_accum": ("fp32_grad_accum",),
    "init": ("init_asked",),
    "prefetch": ("buffers.prefetch",),
    "wrap": ("buffers.wrap",),
    "allgather_bucket": ("buffers.allgather_bucket_elements",),
    "expandable_segments": ("expandable_segments",),
    "calibration": ("calibration", "calibration_name"),
    "compute_calibration": ("compute_calibration",),
    "tokens_per_step": ("tokens_per_step",),
    "tflops": ("tflops",),
}
"""The fields set by options that only some commands take (memory's, comm's); the links an explicit
``--intra-node-bw`` sets are not among them (``plan`` takes none)."""
