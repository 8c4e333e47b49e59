"""FP8 training as a request asks for it: the recipe, its switches, and which Linear weights it converts.

The recipes and what each changes of a converted weight's dtypes are the precision record's
(:data:`zerocalc.parallel.precision.FP8_RECIPES`, :func:`~zerocalc.parallel.precision.fp8_rules`); which
framework runs which recipe is its record's (:class:`~zerocalc.parallel.framework_records.record.
Fp8Support`). This module says which parameter tensors a recipe converts:

* torchtitan v0.2.2 ``components/quantization/utils.py`` ``module_filter_fn``: an ``nn.Linear`` is converted
  unless a ``filter_fqns`` entry is a substring of its fully qualified name or a dimension of its weight is
  not divisible by 16 (the FP8 tensor cores' alignment); only the ``weight`` runs in FP8 (a bias is added in
  high precision, torchao 0.18 ``float8_linear.py`` ``Float8Linear.forward``);
* embeddings, norms and the grouped experts (3-D parameters, not ``nn.Linear``) stay in high precision.

A ``--fp8-skip`` entry matches a tensor's module as zerocalc names it (``lm_head``, ``layers.0.attn.q_proj``)
or as torchtitan does (``output``, ``layers.0.attention.wq``: :func:`torchtitan_fqn`). What accelerate's
torchao path leaves in high precision, as entries, is :func:`accelerate_ao_skip`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from zerocalc.model.architecture import Architecture, ParamTensor, parameter_tensors
from zerocalc.model.hf_classes import ModuleClass
from zerocalc.model.hf_modules import hf_linear_ends, hf_modules
from zerocalc.parallel.precision import FP8_RECIPES, Fp8Recipe, Fp8RecipeName, Fp8Use

FP8_ALIGNMENT = 16
"""torchtitan v0.2.2 ``module_filter_fn``: "All dims must be divisible by 16 due to float8 tensorcore hardware
requirements"."""

_TITAN_NAMES: tuple[tuple[str, str], ...] = (
    ("lm_head", "output"),
    ("embed_tokens", "tok_embeddings"),
    ("attn.q_proj", "attention.wq"),
    ("attn.k_proj", "attention.wk"),
    ("attn.v_proj", "attention.wv"),
    ("attn.o_proj", "attention.wo"),
    ("mlp.gate_proj", "feed_forward.w1"),
    ("mlp.down_proj", "feed_forward.w2"),
    ("mlp.up_proj", "feed_forward.w3"),
    ("shared_experts.gate_proj", "shared_experts.w1"),
    ("shared_experts.down_proj", "shared_experts.w2"),
    ("shared_experts.up_proj", "shared_experts.w3"),
    ("moe.router", "moe.router.gate"),
    ("final_norm", "norm"),
)
"""zerocalc's module names (Hugging Face's) and torchtitan's (v0.2.2 ``models/llama3/model/model.py``:
``tok_embeddings``, ``attention.wq…wo``, ``feed_forward.w1…w3``, ``norm``, ``output``; ``models/moe/moe.py``:
``router.gate``, ``shared_experts``)."""


def torchtitan_fqn(module: str) -> str:
    """``module`` as torchtitan names it (``layers.0.attn.q_proj`` → ``layers.0.attention.wq``)."""
    for ours, theirs in _TITAN_NAMES:
        if module == ours or module.endswith(f".{ours}"):
            return module[: len(module) - len(ours)] + theirs
    return module


class Fp8Setting(NamedTuple):
    """What a request asks of FP8 (``--fp8`` and its switches), parsed and checked against the framework
    (:func:`zerocalc.request.fp8.parse_fp8`)."""

    recipe: Fp8RecipeName = Fp8RecipeName.NONE
    all_gather: bool = False
    """The converted weights all-gathered in FP8 (FSDP2's float8 all-gather, Megatron-LM's fp8 parameter
    gather)."""
    precompute_scales: bool = False
    """torchao ``precompute_float8_dynamic_scale_for_fsdp``: every weight's scale in one all-reduce after the
    optimizer step, in place of one amax all-reduce per weight before its all-gather."""
    model_init: bool = False
    """Only the FP8 weights are kept, no high-precision copy (TE ``quantized_model_init``)."""
    skip: tuple[str, ...] = ()
    """Modules left in high precision (torchtitan ``filter_fqns``)."""

    @property
    def on(self) -> bool:
        return self.recipe is not Fp8RecipeName.NONE

    @property
    def record(self) -> Fp8Recipe:
        return FP8_RECIPES[self.recipe]

    @property
    def use(self) -> Fp8Use | None:
        """The key of a converted weight's dtypes (None: FP8 off)."""
        if not self.on:
            return None
        return Fp8Use(self.recipe, self.all_gather, self.model_init)

    def converts(self, tensor: ParamTensor) -> bool:
        """Whether ``tensor`` runs its GEMMs in FP8: a 2-D Linear weight, both dimensions multiples of 16,
        its module not skipped."""
        if not self.on or tensor.name != "weight" or len(tensor.shape) != 2:
            return False
        if tensor.module.startswith("embed_"):
            return False
        if any(d % FP8_ALIGNMENT for d in tensor.shape):
            return False
        names = (tensor.module, torchtitan_fqn(tensor.module))
        return not any(entry in name for entry in self.skip for name in names)


NO_FP8 = Fp8Setting()


@lru_cache(maxsize=64)
def converted_elements(arch: Architecture, fp8: Fp8Setting) -> int:
    """The elements of ``arch``'s weights ``fp8`` converts (as this rank holds them)."""
    return sum(t.numel for t in parameter_tensors(arch) if fp8.converts(t))


def accelerate_ao_skip(arch: Architecture) -> tuple[str, ...]:
    """The ``--fp8-skip`` entries of accelerate's torchao path on ``arch``'s transformers model, in zerocalc's
    module names. accelerate 1.16.0 ``utils/ao.py`` ``convert_model_to_fp8_ao`` filters with
    ``filter_linear_layers``: the first and the last ``nn.Linear`` of ``named_modules()``
    (``find_first_last_linear_layers``: :func:`~zerocalc.model.hf_modules.hf_linear_ends`) stay in high
    precision, as does a Linear with a dimension not divisible by 16 (:meth:`Fp8Setting.converts` already);
    and torchao converts only ``nn.Linear`` (torchao 0.18 ``float8_linear_utils.py`` ``swap_linear_layers``),
    so a 2-D weight of another class stays too: transformers 5.17's routers (``MixtralTopKRouter``: a plain
    module's weight) and GPT-2's ``Conv1D`` projections, one entry each without its layer prefix
    (``moe.router``). ``tests/model/test_accelerate_fp8.py`` checks them against accelerate's functions."""
    entries: list[str] = []
    for end in hf_linear_ends(arch):
        entries += [t.module for t in end.tensors] or [end.module]
    for module in hf_modules(arch):
        if module.cls in (ModuleClass.LINEAR, ModuleClass.LINEAR_SUBCLASS, ModuleClass.EMBEDDING):
            continue
        for tensor in module.tensors:
            if tensor.name == "weight" and len(tensor.shape) == 2:
                parts = tensor.module.split(".")
                entries.append(".".join(parts[2:]) if parts[0] == "layers" else tensor.module)
    return tuple(dict.fromkeys(entries))
