"""An architecture's modules as transformers 5.17 builds and names them: what PEFT targets and
bitsandbytes quantises by name and class.

zerocalc names a module as :mod:`zerocalc.model.architecture` lays it out (``layers.3.attn.q_proj``); the
modeling file of its family names it ``model.layers.3.self_attn.q_proj``. The family record
(:class:`~zerocalc.model.hf_config.Family`) holds the difference: the attribute holding the decoder
(``body``) and the parts spelled otherwise (``names`` over :data:`~zerocalc.model.hf_config.LLAMA_NAMES`);
each part of a name maps on its own, so the name of anything under a module (``q_proj.lora_A.default``)
maps with it. ``lm_head`` sits beside the decoder in every family (``...ForCausalLM.lm_head``).
``tests/model/test_finetune_names.py`` checks every family's names and shapes against
``AutoModelForCausalLM.from_config``.

An architecture without a family is named as Llama's modeling file names its modules.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from zerocalc.model.architecture import (
    Architecture,
    ParamTensor,
    PipelineStage,
    global_layer,
    parameter_tensors,
)
from zerocalc.model.hf_classes import ModuleClass

if TYPE_CHECKING:
    from zerocalc.model.hf_config import Family


class HfModule(NamedTuple):
    """One module that holds parameters (or, for a tied ``lm_head``, shares the embedding's)."""

    module: str
    """zerocalc's name (:attr:`ParamTensor.module`)."""
    hf_name: str
    """Its name in ``AutoModelForCausalLM.from_config(...).named_modules()``."""
    cls: ModuleClass
    tensors: tuple[ParamTensor, ...]
    """The parameters it holds directly (none for a tied ``lm_head``: the embedding's weight)."""
    weight: tuple[int, ...]
    """Its weight's shape as zerocalc writes it: [out, in] for a projection (Conv1D too), [V, d] for an
    embedding and the LM head, [E, out, in] for experts, [d] for a norm; a fused module's members stacked
    on dim 0."""
    in_out: bool = False
    """Its 3-D expert weights are held [E, in, out] (the family's ``experts_in_out``)."""

    def stacked(self) -> tuple[ParamTensor, ...]:
        """Its parameters as one module holds them, in zerocalc's layout: a fused module's members stacked
        on dim 0 (GPT-2's ``c_attn.weight`` [3d, d]); a tied ``lm_head``'s weight, which it shares."""
        shapes: dict[str, tuple[int, ...]] = {}
        for tensor in self.tensors:
            held = shapes.get(tensor.name)
            shapes[tensor.name] = tensor.shape if held is None else (held[0] + tensor.shape[0], *held[1:])
        if not self.tensors:
            shapes["weight"] = self.weight
        return tuple(
            ParamTensor(module=self.module, name=name, shape=shape) for name, shape in shapes.items()
        )

    def hf_parameters(self) -> dict[str, tuple[int, ...]]:
        """Its own parameters as transformers holds them: name → shape (:meth:`stacked`; a Conv1D weight
        [in, out]; none for a tied ``lm_head``)."""
        shapes = {t.name: t.shape for t in self.stacked()} if self.tensors else {}
        if self.cls is ModuleClass.CONV1D and "weight" in shapes:
            shapes["weight"] = shapes["weight"][::-1]
        if self.in_out:
            shapes = {name: (s[0], s[2], s[1]) if len(s) == 3 else s for name, s in shapes.items()}
        return shapes

    @property
    def in_features(self) -> int:
        return self.weight[-1]

    @property
    def out_features(self) -> int:
        return self.weight[-2] if len(self.weight) > 1 else self.weight[0]


def _family(arch: Architecture) -> Family:
    from zerocalc.model.hf_config import FAMILIES  # the records load with a model, not at start-up

    return FAMILIES.get(arch.family or "", FAMILIES["llama"])


def hf_name(arch: Architecture, module: str) -> str:
    """``module`` (a zerocalc module name, or a name under one) as transformers names it in ``arch``'s
    family; a pipeline stage's layers by their index in the whole model."""
    from zerocalc.model.hf_config import LLAMA_NAMES

    family = _family(arch)
    parts = module.split(".")
    if parts[0] == "lm_head":
        return module
    names = {**LLAMA_NAMES, **family.names}
    if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
        parts[1] = str(global_layer(arch, int(parts[1])))
    return ".".join([family.body, *(names.get(part, part) for part in parts)])


def module_class(arch: Architecture, module: str) -> ModuleClass:
    """The class of zerocalc's ``module`` in ``arch``'s family (transformers 5.17)."""
    leaf = module.rsplit(".", 1)[-1]
    if leaf in ("embed_tokens", "embed_positions"):
        return ModuleClass.EMBEDDING
    if leaf.endswith("norm"):
        return ModuleClass.NORM
    if leaf == "router":
        return ModuleClass.ROUTER
    if leaf == "experts":
        return ModuleClass.EXPERTS
    if leaf == "attn":  # a parameter held by the attention module itself (GPT-OSS sinks)
        return ModuleClass.ATTENTION
    if leaf == "lm_head":
        return ModuleClass.LINEAR
    return _family(arch).projection


def _holds_head(arch: Architecture) -> bool:
    return not isinstance(arch, PipelineStage) or arch.holds_head


@lru_cache(maxsize=64)
def hf_modules(arch: Architecture) -> tuple[HfModule, ...]:
    """Every module of ``arch`` that holds parameters, in zerocalc's order, and a tied ``lm_head`` last
    (a ``torch.nn.Linear`` whose weight is the embedding's: PEFT and bitsandbytes see it as a module)."""
    member_of = {member: fused for fused, members in _family(arch).fused.items() for member in members}
    grouped: dict[str, list[ParamTensor]] = {}
    for tensor in parameter_tensors(arch):
        parent, _, leaf = tensor.module.rpartition(".")
        module = f"{parent}.{member_of[leaf]}" if leaf in member_of else tensor.module
        grouped.setdefault(module, []).append(tensor)
    modules = []
    for module, tensors in grouped.items():
        weights = [t.shape for t in tensors if t.name == "weight"] or [tensors[0].shape]
        weight = (sum(w[0] for w in weights), *weights[0][1:])
        cls = module_class(arch, module)
        in_out = cls is ModuleClass.EXPERTS and _family(arch).experts_in_out
        modules.append(HfModule(module, hf_name(arch, module), cls, tuple(tensors), weight, in_out))
    if arch.tied_embeddings and _holds_head(arch):
        shape = (arch.vocab_size, arch.hidden_size)
        modules.append(HfModule("lm_head", "lm_head", ModuleClass.LINEAR, (), shape))
    return tuple(modules)


_NN_LINEAR = (ModuleClass.LINEAR, ModuleClass.LINEAR_SUBCLASS)
"""The classes that are a ``torch.nn.Linear`` (``isinstance``)."""


def hf_linear_ends(arch: Architecture) -> tuple[HfModule, ...]:
    """The first and the last ``torch.nn.Linear`` of ``named_modules()`` (one if they are the same, none
    without a Linear): modules come in zerocalc's order but where the family registers another projection
    first (:attr:`~zerocalc.model.hf_config.Family.registered_first`); the last is the ``lm_head``, a
    Linear even when tied."""
    linear = [m for m in hf_modules(arch) if m.cls in _NN_LINEAR]
    if not linear:
        return ()
    first, leaf = linear[0], _family(arch).registered_first
    if leaf is not None:
        block = first.module.rsplit(".", 1)[0]
        first = next((m for m in linear if m.module == f"{block}.{leaf}"), first)
    return tuple(dict.fromkeys((first, linear[-1])))


@lru_cache(maxsize=64)
def hf_containers(arch: Architecture) -> tuple[tuple[str, str], ...]:
    """The modules that hold other modules (``model``, ``model.layers.0``, ``model.layers.0.self_attn``...),
    each as (its zerocalc name, its transformers name), the decoder (``body``) with zerocalc name ``""``."""
    seen: dict[str, str] = {}
    body = _family(arch).body
    for module in hf_modules(arch):
        if module.module == "lm_head":
            continue
        seen.setdefault("", body)
        parts = module.module.split(".")
        for end in range(1, len(parts)):
            prefix = ".".join(parts[:end])
            seen.setdefault(prefix, hf_name(arch, prefix))
    return tuple(seen.items())


def hf_parameters(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``arch`` as ``named_parameters()`` of the transformers model gives it: name →
    shape (a tied LM head's weight is the embedding's, named once)."""
    return {
        f"{module.hf_name}.{name}": shape
        for module in hf_modules(arch)
        for name, shape in module.hf_parameters().items()
    }
