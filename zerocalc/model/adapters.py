"""The tensors PEFT 0.21 adds to a model for LoRA (and DoRA), as zerocalc parameter tensors.

``get_peft_model(model, LoraConfig(...))`` (peft 0.21.2 with transformers 5.17) decides, by these rules,
each followed where its docstring or comment names it:

* **targets** (peft/tuners/tuners_utils.py ``check_target_module_exists``): a module is targeted when its
  name equals a target or ends with ``.<target>``; without targets, PEFT's default for the model_type
  (the family record's ``peft_targets``); ``"all-linear"``: every ``torch.nn.Linear`` (subclasses too)
  and ``Conv1D`` but the output layer (``_maybe_include_all_linear_layers``). A module inside a
  ``modules_to_save`` entry is never a target. A targeted module that is neither a Linear, a Conv1D nor
  an Embedding is refused (peft/tuners/lora/model.py ``_create_new_module``: "Target module ... is not
  supported"); a LoraConfig that targets nothing is refused (``inject_adapter``: "Target modules ... not
  found in the base model"); target names that match nothing beside others that do are ignored, and
  listed in :attr:`PeftPlan.unmatched`.
* **mixture of experts under transformers 5** (peft/utils/transformers_weight_conversion.py
  ``convert_peft_config_for_transformers``): where the family record has a ``peft_moe`` conversion (Mixtral;
  Qwen3-MoE and DeepSeek-V3, which transformers maps to Qwen2-MoE's pattern), the 4.x names of the router
  and the expert projections (``gate``, ``w1``/``w3``/``w2`` or ``gate_proj``/``up_proj``/``down_proj``),
  and with ``"all-linear"`` the leaf names of every Linear plus all of those, become
  ``target_parameters`` on the router's weight and the stacked ``gate_up_proj``/``down_proj`` (fused
  projections at rank r × their number), and leave ``target_modules`` — so a dense MLP's or a shared
  expert's ``gate_proj`` of such a model is not adapted. Elsewhere the experts (3-D parameters) and the
  routers (``nn.Module``\\ s holding a ``weight``) are not Linears and ``"all-linear"`` does not reach
  them; naming a router is refused. Such a model without targets adapts nothing (the conversion runs
  before the default targets apply, and leaves none): refused.
* **adapter tensors** (peft/tuners/lora/layer.py): a Linear or Conv1D (``lora.Linear``) gets
  ``lora_A.default.weight`` [r, in] and ``lora_B.default.weight`` [out, r]; an Embedding
  (``lora.Embedding``) ``lora_embedding_A.default`` [r, V] and ``lora_embedding_B.default`` [d, r]; DoRA
  (``use_dora``, peft/tuners/lora/dora.py) adds ``lora_magnitude_vector.default.weight`` [out] ([d] for an
  Embedding). A targeted parameter (``lora.ParamWrapper``) of shape [out, in] or [E, out, in] gets
  ``lora_A`` [r·E, in] and ``lora_B`` [out, r·E]; several parameters of one module nest their wrappers in
  the order the module holds them (the first innermost: ``experts.base_layer.lora_A`` is ``gate_up_proj``'s,
  ``experts.lora_A`` ``down_proj``'s); a ParamWrapper refuses dropout and DoRA.
* **modules_to_save** (peft/utils/other.py ``_set_trainable``, ``ModulesToSaveWrapper``): every module whose
  name ends with an entry (a plain suffix: ``norm`` saves every norm) gets a trainable copy of its
  parameters, ``<module>.modules_to_save.default.<...>``, beside the frozen original (a tied ``lm_head``'s
  copy is a weight of its own).

The adapters are named as PEFT names them under zerocalc's module names (``layers.0.attn.q_proj`` +
``.lora_A.default``, tensor ``weight``); the base tensors keep their names (PEFT moves a targeted module's
own under ``base_layer``, a saved module's under ``original_module``). Which kind each tensor is, and its
dtype, is :mod:`zerocalc.parallel.finetune`'s and the precision record's.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple, Protocol

from zerocalc.base.errors import InputError, shown
from zerocalc.model.architecture import Architecture, ParamTensor, TensorParallelRank
from zerocalc.model.hf_classes import LINEAR_CLASSES, ModuleClass
from zerocalc.model.hf_modules import HfModule, hf_containers, hf_modules

if TYPE_CHECKING:
    from zerocalc.model.hf_config import PeftMoeConversion

ALL_LINEAR = "all-linear"
"""PEFT's shorthand for every linear layer but the output layer (``INCLUDE_LINEAR_LAYERS_SHORTHAND``)."""
ADAPTER_NAME = "default"
"""The adapter's name in PEFT's module names (``get_peft_model``'s ``adapter_name``)."""


class LoraSpec(Protocol):
    """What the adapters depend on (:class:`zerocalc.parallel.finetune.LoraConfig` is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def targets(self) -> tuple[str, ...] | str | None: ...
    @property
    def dropout(self) -> float: ...
    @property
    def dora(self) -> bool: ...
    @property
    def modules_to_save(self) -> tuple[str, ...]: ...


class AdapterLayer(StrEnum):
    """The PEFT layer that adapts a module (peft/tuners/lora/layer.py)."""

    LINEAR = "lora.Linear"
    EMBEDDING = "lora.Embedding"
    PARAMETER = "lora.ParamWrapper"


class Adapted(NamedTuple):
    """One adapter: the module it adapts, its PEFT layer and rank."""

    module: HfModule
    layer: AdapterLayer
    rank: int
    parameter: str | None = None
    """A ParamWrapper's parameter (``gate_up_proj``, ``weight``)."""
    outer: int = 0
    """A ParamWrapper's wrappers around it on the same module (its adapter sits under as many
    ``base_layer``)."""


class Saved(NamedTuple):
    """A module ``modules_to_save`` copies: its names and the modules it holds (itself, or a container's)."""

    module: str
    hf_name: str
    members: tuple[HfModule, ...]


class PeftPlan(NamedTuple):
    """What ``get_peft_model`` does to a model: the modules it adapts and those it copies."""

    adapted: tuple[Adapted, ...]
    saved: tuple[Saved, ...]
    unmatched: tuple[str, ...]
    """Target and modules_to_save names that matched nothing (PEFT ignores them beside names that match)."""


def _matches(key: str, names: set[str]) -> bool:
    """peft/tuners/tuners_utils.py ``check_target_module_exists``, for a list of targets."""
    return key in names or any(key.endswith(f".{name}") for name in names)


def _inside_saved(key: str, modules_to_save: tuple[str, ...]) -> bool:
    """``check_target_module_exists``: a module inside a ``modules_to_save`` entry is never a target."""
    return any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in modules_to_save)


def _default_targets(arch: Architecture) -> tuple[str, ...]:
    from zerocalc.model.hf_config import FAMILIES  # the records load with a model, not at start-up

    family = FAMILIES.get(arch.family or "")
    if family is None or family.peft_targets is None:
        what = f"model_type {arch.family!r}" if arch.family else "a model without a model_type"
        raise InputError(
            f"PEFT 0.21 has no default LoRA targets for {what} (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_"
            "MAPPING); accepted: {lora_targets} all-linear or module names"
        )
    return family.peft_targets


def _linear_names(arch: Architecture) -> list[str]:
    """``_maybe_include_all_linear_layers``: every Linear and Conv1D but the output embedding."""
    return [m.hf_name for m in hf_modules(arch) if m.cls in LINEAR_CLASSES and m.hf_name != "lm_head"]


def _conversion(arch: Architecture) -> PeftMoeConversion | None:
    from zerocalc.model.hf_config import FAMILIES

    family = FAMILIES.get(arch.family or "")
    return family.peft_moe if family is not None else None


def _convert_moe(
    conversion: PeftMoeConversion, names: set[str], rank: int
) -> tuple[set[str], dict[str, int]]:
    """peft/utils/transformers_weight_conversion.py ``_convert_peft_config_moe``: the targets left as
    modules, and the parameters targeted instead with their rank."""
    remaining: set[str] = set()
    parameters: dict[str, int] = {}
    present: dict[str, set[str]] = {new: set() for new in conversion.fused}
    for target in names:
        old = next((o for o in conversion.renamed if target == o or target.endswith(f".{o}")), None)
        if old is None:
            remaining.add(target)
            continue
        new = conversion.renamed[old]
        parameters[new] = rank
        present.setdefault(new, set()).add(old)
    for new, olds in conversion.fused.items():
        if 0 < len(present[new]) < len(olds):
            missing = ", ".join(sorted(set(olds) - present[new]))
            raise InputError(
                f"{{lora_targets}} {shown(sorted(present[new]))} cannot be adapted without {missing}: PEFT "
                f"0.21 targets them as one stacked parameter {new} in transformers 5 "
                f"(_convert_peft_config_moe); accepted: all of {', '.join(olds)}, or none"
            )
        if len(present[new]) == len(olds) > 1:
            parameters[new] = rank * len(olds)  # the rank_pattern PEFT adds for the fused parameter
    return remaining, parameters


def _resolve(arch: Architecture, lora: LoraSpec) -> tuple[set[str], dict[str, int]]:
    """The module targets and the parameter targets (with their ranks) of ``lora`` on ``arch``."""
    conversion = _conversion(arch)
    if lora.targets is None and conversion is not None:
        # inject_adapter converts the config first: its absent target_modules become an empty set, which
        # _prepare_adapter_config then leaves without the model_type's default
        raise InputError(
            f"PEFT 0.21 adapts nothing in a {arch.family} model without target modules (its transformers 5 "
            "MoE conversion empties them before the default applies); accepted: {lora_targets} all-linear "
            "or module names"
        )
    targets = lora.targets if lora.targets is not None else _default_targets(arch)
    if isinstance(targets, str) and targets != ALL_LINEAR:
        raise InputError(
            f"{{lora_targets}} {shown(targets)} is not accepted; accepted: all-linear or module names"
        )
    if targets != ALL_LINEAR:
        names = set(targets)
    elif conversion is None:
        return set(_linear_names(arch)), {}
    else:  # _resolve_string_target_modules: the Linears' leaf names and every 4.x MoE name
        names = {name.rsplit(".", 1)[-1] for name in _linear_names(arch)} | set(conversion.renamed)
    return _convert_moe(conversion, names, lora.rank) if conversion is not None else (names, {})


def _not_supported(hf_name: str, what: str) -> InputError:
    return InputError(
        f"{{lora_targets}} reaches {hf_name} ({what}), which PEFT 0.21 cannot adapt (lora/model.py "
        "_create_new_module: only Linear, Conv1D and Embedding); accepted: names of those modules"
    )


def _saved(arch: Architecture, modules_to_save: tuple[str, ...]) -> tuple[tuple[Saved, ...], set[str]]:
    """``_set_trainable``: every module (or container) whose name ends with an entry, and the entries that
    matched nothing."""
    if not modules_to_save:
        return (), set()
    modules = hf_modules(arch)
    candidates = [(zc, hf, None) for zc, hf in hf_containers(arch)] + [
        (m.module, m.hf_name, m) for m in modules
    ]
    saved: list[Saved] = []
    found: set[str] = set()
    for zc, hf, module in candidates:
        hits = [name for name in modules_to_save if hf.endswith(name)]
        if not hits:
            continue
        found.update(hits)
        if module is not None:
            members: tuple[HfModule, ...] = (module,)
        else:
            members = tuple(m for m in modules if m.hf_name.startswith(f"{hf}.") and m.module != "lm_head")
        saved.append(Saved(zc, hf, members))
    for outer in saved:
        for inner in saved:
            if inner is not outer and inner.hf_name.startswith(f"{outer.hf_name}."):
                raise InputError(
                    f"{{modules_to_save}} saves {inner.hf_name} inside {outer.hf_name}, nested copies that "
                    "zerocalc does not model; accepted: modules that do not hold one another"
                )
    return tuple(saved), set(modules_to_save) - found


def _check_layer(arch: Architecture, lora: LoraSpec, plan: list[Adapted]) -> None:
    if any(a.layer is AdapterLayer.PARAMETER for a in plan) and (lora.dropout or lora.dora):
        what = "{lora_dropout} > 0" if lora.dropout else "{dora}"
        raise InputError(
            f"{what} is refused by PEFT 0.21 on the expert and router parameters {{lora_targets}} reaches in "
            f"this {arch.family} model (lora.ParamWrapper: no dropout, no DoRA); accepted: dropout 0 and no "
            "DoRA, or targets without the router and the experts"
        )


def _module_adapters(
    module: HfModule, names: set[str], parameters: dict[str, int], lora: LoraSpec
) -> list[Adapted]:
    """The adapters PEFT puts on ``module``: a LoRA layer where a module target names it (outside the
    ``modules_to_save``), a ParamWrapper per parameter a parameter target names (``_inject_parameters``)."""
    adapters = []
    if _matches(module.hf_name, names) and not _inside_saved(module.hf_name, lora.modules_to_save):
        if module.cls in LINEAR_CLASSES:
            adapters.append(Adapted(module, AdapterLayer.LINEAR, lora.rank))
        elif module.cls is ModuleClass.EMBEDDING:
            adapters.append(Adapted(module, AdapterLayer.EMBEDDING, lora.rank))
        else:
            raise _not_supported(module.hf_name, module.cls.value)
    wrapped = [n for n in module.hf_parameters() if _matches(f"{module.hf_name}.{n}", set(parameters))]
    if wrapped and adapters:
        raise _not_supported(module.hf_name, "a module adapted already, whose parameters PEFT cannot wrap")
    for index, name in enumerate(wrapped):
        target = next(t for t in sorted(parameters) if _matches(f"{module.hf_name}.{name}", {t}))
        adapters.append(
            Adapted(module, AdapterLayer.PARAMETER, parameters[target], name, len(wrapped) - 1 - index)
        )
    return adapters


def _named(module: HfModule, names: set[str]) -> set[str]:
    """The target names that name ``module`` or one of its parameters."""
    keys = [module.hf_name, *(f"{module.hf_name}.{p}" for p in module.hf_parameters())]
    return {n for n in names if any(_matches(key, {n}) for key in keys)}


@lru_cache(maxsize=64)
def peft_plan(arch: Architecture, lora: LoraSpec) -> PeftPlan:
    """What ``get_peft_model(model, LoraConfig(...))`` adapts and copies in ``arch`` (the rules above); an
    InputError where PEFT refuses the configuration."""
    if isinstance(arch, TensorParallelRank) and (arch.tp > 1 or arch.ep > 1):
        raise InputError(
            "LoRA's adapters on a tensor- or expert-parallel rank's shards are not modelled; accepted: "
            "{lora_rank} with tensor and expert parallelism 1"
        )
    names, parameters = _resolve(arch, lora)
    saved, unmatched = _saved(arch, lora.modules_to_save)
    for _, hf in hf_containers(arch):
        if _matches(hf, names) and not _inside_saved(hf, lora.modules_to_save):
            raise _not_supported(hf, "a module holding others")
    plan = [a for module in hf_modules(arch) for a in _module_adapters(module, names, parameters, lora)]
    if not plan:
        raise InputError(
            f"{{lora_targets}} {shown(sorted(names | set(parameters)))} match no module PEFT 0.21 can adapt "
            f"in this {arch.family or 'model'} (inject_adapter: not found in the base model); accepted: "
            "module names of the model, or all-linear"
        )
    _check_layer(arch, lora, plan)
    for adapted in plan:
        for copy in saved:
            if adapted.module in copy.members:
                raise InputError(
                    f"{{modules_to_save}} copies {adapted.module.hf_name}, which {{lora_targets}} adapts too "
                    "(PEFT would copy the adapted layer); accepted: modules apart from the targets"
                )
    every = names | set(parameters)
    named = set().union(*(_named(m, every) for m in hf_modules(arch)))
    return PeftPlan(tuple(plan), saved, tuple(sorted((every - named) | unmatched)))


def _adapter(adapted: Adapted) -> list[ParamTensor]:
    """One adapter's tensors (peft/tuners/lora/layer.py ``LoraLayer.update_layer``,
    ``Embedding.update_layer``, ``ParamWrapper.update_layer``; dora.py ``DoraLinearLayer``)."""
    module, r = adapted.module, adapted.rank
    if adapted.layer is AdapterLayer.EMBEDDING:
        vocab, dim = module.weight
        prefix = module.module
        return [
            ParamTensor(module=f"{prefix}.lora_embedding_A", name=ADAPTER_NAME, shape=(r, vocab)),
            ParamTensor(module=f"{prefix}.lora_embedding_B", name=ADAPTER_NAME, shape=(dim, r)),
        ]
    if adapted.layer is AdapterLayer.PARAMETER:
        shape = next(t.shape for t in module.tensors if t.name == adapted.parameter)
        experts, (out, inner) = (shape[0] if len(shape) == 3 else 1), shape[-2:]
        prefix = module.module + ".base_layer" * adapted.outer
        return [
            ParamTensor(module=f"{prefix}.lora_A.{ADAPTER_NAME}", name="weight", shape=(r * experts, inner)),
            ParamTensor(module=f"{prefix}.lora_B.{ADAPTER_NAME}", name="weight", shape=(out, r * experts)),
        ]
    return [
        ParamTensor(
            module=f"{module.module}.lora_A.{ADAPTER_NAME}", name="weight", shape=(r, module.in_features)
        ),
        ParamTensor(
            module=f"{module.module}.lora_B.{ADAPTER_NAME}", name="weight", shape=(module.out_features, r)
        ),
    ]


def _magnitude(adapted: Adapted) -> ParamTensor:
    """DoRA's magnitude: one value per output feature (an Embedding's: per embedding dimension)."""
    width = (
        adapted.module.weight[1] if adapted.layer is AdapterLayer.EMBEDDING else adapted.module.out_features
    )
    module = f"{adapted.module.module}.lora_magnitude_vector.{ADAPTER_NAME}"
    return ParamTensor(module=module, name="weight", shape=(width,))


def adapter_tensors(arch: Architecture, lora: LoraSpec) -> list[ParamTensor]:
    """The adapters PEFT adds to ``arch`` (DoRA's magnitudes with them), module by module."""
    tensors: list[ParamTensor] = []
    for adapted in peft_plan(arch, lora).adapted:
        tensors += _adapter(adapted)
        if lora.dora and adapted.layer is not AdapterLayer.PARAMETER:
            tensors.append(_magnitude(adapted))
    return tensors


def saved_tensors(arch: Architecture, lora: LoraSpec) -> list[ParamTensor]:
    """The trainable copies ``modules_to_save`` adds (``<module>.modules_to_save.default...``), each
    module's parameters as it holds them (:meth:`HfModule.stacked`: GPT-2's ``c_attn`` one weight)."""
    tensors: list[ParamTensor] = []
    for saved in peft_plan(arch, lora).saved:
        copy = ".".join(p for p in (saved.module, "modules_to_save", ADAPTER_NAME) if p)
        for member in saved.members:
            inner = member.module.removeprefix(saved.module) if saved.module else f".{member.module}"
            tensors += [
                ParamTensor(module=f"{copy}{inner}", name=t.name, shape=t.shape) for t in member.stacked()
            ]
    return tensors
