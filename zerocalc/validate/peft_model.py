"""The one place validate adapts a real model with PEFT (imports peft when called).

``get_peft_model(model, LoraConfig(...))`` of peft 0.21.2 from zerocalc's
:class:`~zerocalc.parallel.finetune.LoraConfig` (r, lora_alpha, target_modules, lora_dropout, use_dora,
modules_to_save; ``autocast_adapter_dtype``: PEFT's default True, fp32 adapters on a 16-bit base), used by
``validate activations`` (:func:`zerocalc.validate.saved_measure.tune`), ``validate fake``
(:func:`zerocalc.validate.recipe.with_lora`) and ``validate frameworks`` (:mod:`zerocalc.validate.worker`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerocalc.parallel.finetune import LoraConfig


def lora_model(model: Any, lora: LoraConfig, targets: list[str] | str | None = None) -> Any:
    """The ``PeftModel`` of ``model`` under ``lora``; ``targets``: the ``target_modules`` given to PEFT
    instead of ``lora.targets`` (a model PEFT has no ``model_type`` default for: validate's own)."""
    import peft

    if targets is None and lora.targets is not None:
        targets = lora.targets if isinstance(lora.targets, str) else list(lora.targets)
    return peft.get_peft_model(
        model,
        peft.LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            target_modules=targets,
            lora_dropout=lora.dropout,
            use_dora=lora.dora,
            modules_to_save=list(lora.modules_to_save) or None,
        ),
        autocast_adapter_dtype=lora.autocast_adapter_dtype,
    )
