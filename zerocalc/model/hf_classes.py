"""The classes transformers 5.17 builds an architecture's modules of: what PEFT can wrap and bitsandbytes can
quantise (:mod:`zerocalc.model.hf_modules` gives each module its class, the family records of
:mod:`zerocalc.model.hf_config` their projections'). Apart from the family records so that what reads a
module's class (the fine-tuning and FP8 layouts) does not load the records: they load with a model.
"""

from __future__ import annotations

from enum import StrEnum


class ModuleClass(StrEnum):
    """The class transformers 5.17 builds a module of: what PEFT can wrap and bitsandbytes can quantise."""

    LINEAR = "torch.nn.Linear"
    LINEAR_SUBCLASS = "a subclass of torch.nn.Linear"
    """``FalconLinear``: LoRA wraps it (PEFT checks ``isinstance``), bitsandbytes does not quantise it
    (``replace_with_bnb_linear`` checks ``type(module) is nn.Linear``)."""
    CONV1D = "transformers.pytorch_utils.Conv1D"
    """GPT-2's projections: an ``[in, out]`` weight; PEFT and bitsandbytes treat it as a Linear."""
    EMBEDDING = "torch.nn.Embedding"
    NORM = "a norm"
    ROUTER = "a router (torch.nn.Module)"
    """``MixtralTopKRouter``, ``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``, ``DeepseekV3TopkRouter``: a
    ``weight`` [E, d] held by a plain ``nn.Module``, no Linear."""
    EXPERTS = "experts (torch.nn.Module of 3-D parameters)"
    ATTENTION = "an attention module holding a parameter of its own"
    """``GptOssAttention``: its ``sinks`` (one logit per head) beside its projections; no Linear."""


LINEAR_CLASSES = frozenset({ModuleClass.LINEAR, ModuleClass.LINEAR_SUBCLASS, ModuleClass.CONV1D})
"""What PEFT's ``target_modules="all-linear"`` counts as linear: ``torch.nn.Linear`` and its subclasses and
``Conv1D`` (peft/tuners/tuners_utils.py ``_maybe_include_all_linear_layers``)."""
