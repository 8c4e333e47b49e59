"""The model and optimizer of ``validate cuda`` and ``validate fake`` (imports torch): the recipe
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

from zerocalc.validate.config import TpPlan


def fsdp2_model(
    config: dict[str, Any],
    reshard: bool,
    recompute: bool,
    device: Any = None,
    mesh: Any = None,
    tp: tuple[Any, TpPlan] | None = None,
    fp8: tuple[str, bool] | None = None,
    lora: int = 0,
) -> tuple[Any, Any, Any]:
    """The config object, the wrapped model and its optimizer. ``device``: the device the model is built
    under (``from_config`` alone; None: the current default); ``mesh``: FSDP2's device mesh (None: the
    default process group's); ``tp``: the tp sub-mesh and the plan applied on it first (:func:`parallelize`,
    ``mesh`` then being the dp sub-mesh); ``fp8``: a torchao recipe and whether FSDP2 all-gathers in fp8
    (:func:`convert_to_fp8`); ``lora``: PEFT's LoRA of that rank on the default targets, the base loaded
    in bf16 as LoRA recipes load it (:func:`with_lora`; the model returned is the one PEFT adapted, which
    FSDP2 wraps, and the optimizer steps the adapters only)."""
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from zerocalc.validate.saved_measure import decoder_layers

    kw = dict(config)
    cfg = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    with device if device is not None else contextlib.nullcontext():
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16 if lora else torch.float32, attn_implementation="sdpa"
        )
    if lora:
        model = with_lora(model, lora)
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if tp is not None:
        parallelize(model, *tp)
    if fp8 is not None:
        convert_to_fp8(model, *fp8)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    placement = {} if mesh is None else {"mesh": mesh}
    for layer in decoder_layers(model, cfg.num_hidden_layers):
        fully_shard(layer, **placement, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, **placement, mp_policy=mp, reshard_after_forward=reshard)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-5, foreach=True)
    return cfg, model, opt


def with_lora(model: Any, rank: int) -> Any:
    """PEFT 0.21's LoRA of ``rank`` on ``model`` (``get_peft_model``, ``LoraConfig(r=rank)``: the model
    type's default targets, ``autocast_adapter_dtype`` fp32 adapters), returned as the adapted model
    itself (PEFT injects its layers in place; ``PeftModel.forward`` calls it). Under fake tensors a
    module's ``.to(device)`` swaps each parameter (``torch/nn/modules/module.py`` ``_apply``: FakeTensor
    parameters always swap), which PEFT's moves of a new layer cannot (``_replace_module``'s
    ``.to(weight.device)``; ``_move_adapter_to_device_of_base_layer``'s ``.to(device, dtype=bf16)``, which
    ``cast_adapter_dtype`` undoes, back to fp32): every tensor is already on the CPU and the adapters are
    created fp32, so a ``.to`` onto the CPU is skipped while the adapters are injected."""
    from zerocalc.parallel.finetune import LoraConfig
    from zerocalc.validate.peft_model import lora_model

    to = torch.nn.Module.to

    def kept_on_the_cpu(module: Any, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if args else kwargs.get("device")
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu":
            return module
        return to(module, *args, **kwargs)

    torch.nn.Module.to = kept_on_the_cpu  # type: ignore[method-assign]
    try:
        adapted = lora_model(model, LoraConfig(rank=rank))
    finally:
        torch.nn.Module.to = to  # type: ignore[method-assign]
    return adapted.base_model.model


def convert_to_fp8(model: Any, recipe: str, all_gather: bool) -> None:
    """torchao 0.18 ``convert_to_float8_training`` as torchtitan v0.2.2's ``Float8LinearConverter`` calls it:
    a recipe by name (``Float8LinearConfig.from_recipe_name``), or tensorwise with
    ``enable_fsdp_float8_all_gather``; every ``nn.Linear`` whose dimensions are multiples of 16 but the LM
    head (``module_filter_fn`` with ``filter_fqns`` naming it)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if all_gather:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    else:
        config = Float8LinearConfig.from_recipe_name(recipe.replace("-gw-hp", "_with_gw_hp"))

    def converted(module: Any, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear) or "lm_head" in fqn:
            return False
        return module.weight.shape[0] % 16 == 0 and module.weight.shape[1] % 16 == 0

    convert_to_float8_training(model, config=config, module_filter_fn=converted)


def parallelize(model: Any, tp_mesh: Any, plan: TpPlan) -> None:
    """torchtitan's TP plan (:mod:`zerocalc.validate.tp`) on a Hugging Face Llama-layout model
    (``model.embed_tokens``, ``model.layers.<i>.{input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``model.norm``, ``lm_head``).

    With sequence parallel the embedding's output is the local sequence shard, from which the base model
    would derive s/t positions (``LlamaModel.forward``: ``cache_position`` from ``inputs_embeds.shape[1]``):
    a forward pre-hook passes ``position_ids = arange(s)`` of the input ids, made where the model makes
    them and alive as long (until the base model returns).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    between = Shard(1) if plan.sequence_parallel else Replicate()
    root: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "lm_head": ColwiseParallel(
            input_layouts=between,
            output_layouts=Shard(-1) if plan.loss_parallel else Replicate(),
            use_local_output=not plan.loss_parallel,
        ),
    }
    if plan.sequence_parallel:
        root["model.norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, root)
    for layer in model.model.layers:
        block: dict[str, Any] = {
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": between},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "mlp": PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),)),
            "self_attn.o_proj": RowwiseParallel(output_layouts=between),
            "mlp.down_proj": RowwiseParallel(output_layouts=between),
        }
        for name in (*(f"self_attn.{x}_proj" for x in "qkv"), "mlp.gate_proj", "mlp.up_proj"):
            block[name] = ColwiseParallel()
        if plan.sequence_parallel:
            block["input_layernorm"] = SequenceParallel()
            block["post_attention_layernorm"] = SequenceParallel()
        parallelize_module(layer, tp_mesh, block)
    if plan.sequence_parallel:

        def full_positions(module: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
            if kwargs.get("position_ids") is None:
                ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
                kwargs["position_ids"] = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return args, kwargs

        model.model.register_forward_pre_hook(full_positions, with_kwargs=True)
