"""The model and optimizer of ``validate --device cuda`` and ``validate --fake`` (imports torch): the recipe
of ``tests/data/h100-fsdp2-hf/README.md``, written once.

``AutoModelForCausalLM.from_config`` in fp32 with ``attn_implementation="sdpa"``, non-reentrant activation
checkpointing when asked, every decoder layer then the root under ``fully_shard(mp_policy=
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), reshard_after_forward=R)``, ``train()``, then
``AdamW(lr=1e-5, foreach=True)``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def fsdp2_model(
    config: dict[str, Any], reshard: bool, recompute: bool, device: Any = None, mesh: Any = None
) -> tuple[Any, Any, Any]:
    """The config object, the wrapped model and its optimizer. ``device``: the device the model is built
    under (``from_config`` alone; None: the current default); ``mesh``: FSDP2's device mesh (None: the
    default process group's)."""
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from zerocalc.validate.saved_measure import decoder_layers

    kw = dict(config)
    cfg = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    with device if device is not None else contextlib.nullcontext():
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.float32, attn_implementation="sdpa"
        )
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    placement = {} if mesh is None else {"mesh": mesh}
    for layer in decoder_layers(model, cfg.num_hidden_layers):
        fully_shard(layer, **placement, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, **placement, mp_policy=mp, reshard_after_forward=reshard)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    return cfg, model, opt
