"""``--fp8`` and its switches → one :class:`~zerocalc.parallel.fp8.Fp8Setting`, checked against the
framework's record (:class:`~zerocalc.parallel.framework_records.record.Fp8Support`): a recipe or switch
the framework does not run is refused in one line."""

from __future__ import annotations

from typing import Any

from zerocalc.base.errors import InputError, shown
from zerocalc.base.units import format_count
from zerocalc.model.architecture import Architecture, parameter_tensors
from zerocalc.model.code import ModelImplName
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.precision import FP8_RECIPES, Fp8RecipeName
from zerocalc.parallel.strategies import StrategyName
from zerocalc.request.gpu import GpuChoice, gpu_preset
from zerocalc.request.presets import preset_names

_SPELLINGS = {"rowwise-with-gw-hp": Fp8RecipeName.ROWWISE_GW_HP, "tensorwise-current": Fp8RecipeName.CURRENT}
"""torchao's and Megatron-LM's own names where they differ from zerocalc's (torchao ``Float8LinearRecipeName.
ROWWISE_WITH_GW_HP``)."""


def fp8_frameworks(recipe: Fp8RecipeName) -> tuple[Framework, ...]:
    """The frameworks whose record runs ``recipe``."""
    return tuple(f for f, record in FRAMEWORKS.items() if record.fp8 and recipe in record.fp8.recipes)


def fp8_recipe(text: Any) -> Fp8RecipeName:
    """``--fp8``'s recipe by its name (zerocalc's, torchao's or Megatron-LM's spelling)."""
    key = str(text).strip().lower().replace("_", "-")
    if key in _SPELLINGS:
        return _SPELLINGS[key]
    for member in Fp8RecipeName:
        if key == member.value:
            return member
    accepted = ", ".join(m.value for m in Fp8RecipeName)
    raise InputError(f"{{fp8}} {shown(text)} is not accepted; accepted: {accepted}")


def _modules(given: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    if given is None:
        return None
    items = given.split(",") if isinstance(given, str) else [str(item) for item in given]
    return tuple(dict.fromkeys(item.strip() for item in items if item.strip()))


def parse_fp8(o: Any, framework: Framework, model_impl: ModelImplName) -> Fp8Setting:
    """The FP8 setting ``o`` (the raw options) asks for under ``framework`` running ``model_impl``."""
    recipe = fp8_recipe(o.fp8)
    all_gather, precompute, model_init = bool(o.fp8_all_gather), o.fp8_precompute_scales, o.fp8_model_init
    skip = _modules(o.fp8_skip)
    if recipe is Fp8RecipeName.NONE:
        for asked, concept in (
            (all_gather, "fp8_all_gather"), (precompute, "fp8_precompute_scales"),
            (model_init, "fp8_model_init"), (skip is not None, "fp8_skip"),
        ):  # fmt: skip
            if asked:
                raise InputError(
                    f"{{{concept}}} without an FP8 recipe changes nothing; accepted: {{fp8}} "
                    f"{', '.join(m.value for m in Fp8RecipeName if m is not Fp8RecipeName.NONE)}"
                )
        return NO_FP8
    record = FRAMEWORKS[framework]
    support = record.fp8
    if support is None or recipe not in support.recipes:
        runs = " or ".join(f.value for f in fp8_frameworks(recipe))
        own = f"{{fp8}} {', '.join(r.value for r in support.recipes)}, or " if support else ""
        raise InputError(
            f"{{fp8}} {recipe.value} under {{framework}} {framework.value}: it runs "
            f"{'no FP8 recipe' if support is None else 'other recipes'} here; accepted: {own}{{framework}} "
            f"{runs} ({FP8_RECIPES[recipe].library.value})"
        )
    if support.model_code is not None and (record.model_code or model_impl) is not support.model_code:
        raise InputError(
            f"{{fp8}} {recipe.value} with {{model_impl}} {model_impl.value}: {support.converts}; accepted: "
            f"{{model_impl}} {support.model_code.value}"
        )
    if all_gather and not FP8_RECIPES[recipe].all_gather:
        able = [r.value for r in support.recipes if FP8_RECIPES[r].all_gather]
        raise InputError(
            f"{{fp8_all_gather}} with {{fp8}} {recipe.value}: {support.all_gather}; accepted: {{fp8}} "
            f"{' or '.join(able)}, or no {{fp8_all_gather}}"
        )
    if precompute and not (support.precompute_scales and all_gather):
        raise InputError(
            f"{{fp8_precompute_scales}} under {{framework}} {framework.value}"
            f"{'' if all_gather else ' without {fp8_all_gather}'}: torchao precomputes the scales of the "
            "weights FSDP2 all-gathers in fp8; accepted: {fp8_precompute_scales} with {fp8_all_gather} "
            "under {framework} fsdp2, or no {fp8_precompute_scales}"
        )
    if model_init and not support.model_init:
        raise InputError(
            f"{{fp8_model_init}} under {{framework}} {framework.value}: its FP8 Linear layers keep the "
            "high-precision weight (torchao Float8Linear casts it each step); accepted: no {fp8_model_init}, "
            "or {framework} megatron"
        )
    if model_init and support.all_gather_keeps_fp8_params and not all_gather:
        raise InputError(
            f"{{fp8_model_init}} without {{fp8_all_gather}} under {{framework}} {framework.value}: it keeps "
            f"fp8 parameters only with its fp8 parameter gather ({support.all_gather}); accepted: "
            "{fp8_all_gather}, or no {fp8_model_init}"
        )
    return Fp8Setting(
        recipe=recipe,
        all_gather=all_gather,
        precompute_scales=precompute,
        model_init=model_init or (all_gather and support.all_gather_keeps_fp8_params),
        skip=support.skip_default if skip is None else skip,
    )


def fp8_gpu_problem(fp8: Fp8Setting, gpu: GpuChoice | None) -> str | None:
    """An FP8 recipe whose GEMMs the GPU's tensor cores do not run (its compute capability below the
    recipe's :attr:`~zerocalc.parallel.precision.Fp8Recipe.min_compute_capability`; where a GPU states
    none, the recipes that need more than FP8 tensor cores); None without a GPU or a recipe."""
    if gpu is None or not fp8.on:
        return None
    needed = FP8_RECIPES[fp8.recipe].min_compute_capability
    if needed <= (8, 9) or (gpu.compute_capability is not None and gpu.compute_capability >= needed):
        return None
    have = (
        "states no compute capability"
        if gpu.compute_capability is None
        else f"has compute capability {'.'.join(map(str, gpu.compute_capability))}"
    )
    runs = [n for n in preset_names("gpus") if (cc := gpu_preset(n).compute_capability) and cc >= needed]
    return (
        f"{{fp8}} {fp8.recipe.value} on {shown(gpu.name)}: its GEMMs need compute capability "
        f"{'.'.join(map(str, needed))} or later (Transformer Engine 2.x transformer_engine/pytorch/fp8.py), "
        f"and the GPU {have}; "
        f"accepted: {{gpu}} {' or '.join(runs)}, or another {{fp8}} recipe"
    )


def fp8_strategy_problem(
    framework: Framework, fp8: Fp8Setting, strategies: tuple[StrategyName, ...], architecture: bool = True
) -> str | None:
    """An FP8 recipe without the model's tensors (which weights convert follows them), or a strategy that
    cannot gather FP8 parameters under ``framework`` (Megatron-LM ``arguments.py``: "--fp8-param-gather
    only supported with distributed optimizer"); None when neither."""
    if fp8.on and not architecture:
        return (
            f"{{fp8}} {fp8.recipe.value} without {{model}}: which Linear weights it converts follows the "
            "model's tensors; accepted: {model} NAME or config.json"
        )
    support = FRAMEWORKS[framework].fp8
    if not fp8.all_gather or support is None or not support.all_gather_keeps_fp8_params:
        return None
    if StrategyName.DDP in strategies:
        return (
            f"{{fp8_all_gather}} under {{framework}} {framework.value} with {{strategies}} ddp: "
            f"{support.all_gather}; accepted: {{strategies}} zero1, or no {{fp8_all_gather}}"
        )
    return None


def fp8_notes(fp8: Fp8Setting, arch: Architecture | None) -> tuple[str, ...]:
    """What the FP8 recipe converts, for the output (none without a recipe)."""
    if not fp8.on:
        return ()
    recipe = fp8.record
    what = f"{{fp8}} {recipe.name.value} ({recipe.library.value}: {recipe.scaling})"
    gathered = ", all-gathered in fp8" if fp8.all_gather else ""
    kept = "; only the fp8 weights kept" if fp8.model_init else ""
    skipped = f"; skipped: {', '.join(fp8.skip)}" if fp8.skip else ""
    if arch is None:
        return (f"{what}: every Linear weight with dimensions multiples of 16{gathered}{kept}{skipped}",)
    converted = [t for t in parameter_tensors(arch) if fp8.converts(t)]
    elements = sum(t.numel for t in converted)
    return (
        f"{what}: {len(converted):,} Linear weights ({format_count(elements)} elements) run their GEMMs in "
        f"fp8{gathered}{kept}{skipped}; embeddings, norms and the rest stay in high precision",
    )
