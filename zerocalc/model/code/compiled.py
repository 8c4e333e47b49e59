"""``--compile``: which parts of the step run under ``torch.compile`` (Inductor), as each model code
compiles them.

* ``torchtitan`` (v0.2.2): ``compile.enable`` with ``compile.components`` (default ``["model", "loss"]``,
  ``torchtitan/config/job_config.py::Compile``). ``model``: each ``TransformerBlock`` compiled on its own,
  ``fullgraph=True`` (``models/llama3/infra/parallelize.py::apply_compile``, after activation checkpointing,
  before FSDP); the embedding, the final norm and the output projection stay eager. ``loss``:
  ``torch.compile(cross_entropy_loss)`` (``components/loss.py::build_cross_entropy_loss``). At commit
  9dec370 (the December 2024 runs) ``training.compile`` compiled the blocks only: the loss's compile was
  commented out (``train.py``: "compiling loss function causes CUDA errors").
* ``hf`` (transformers 5.17): ``torch.compile(model)`` (``TrainingArguments.torch_compile``; accelerate's
  ``dynamo_backend``) compiles the whole forward, the loss with it (``LlamaForCausalLM.forward`` calls
  ``self.loss_function``): ``model`` and ``model,loss`` are one setting there.
* ``megatron``: Megatron-LM does not ``torch.compile`` its model (its element-wise work runs in fused
  kernels of its own and Transformer Engine's): refused.
"""

from __future__ import annotations

from enum import StrEnum


class Compiled(StrEnum):
    """``--compile``: the parts of the step ``torch.compile`` runs (torchtitan's ``compile.components``)."""

    NONE = "none"
    """Eager: every op its own kernel."""
    MODEL = "model"
    """The transformer blocks (torchtitan), the whole forward (hf)."""
    LOSS = "loss"
    """The loss function alone (torchtitan)."""
    MODEL_LOSS = "model,loss"
    """Both (torchtitan v0.2.2's default components)."""

    @property
    def model(self) -> bool:
        return self in (Compiled.MODEL, Compiled.MODEL_LOSS)

    @property
    def loss(self) -> bool:
        return self in (Compiled.LOSS, Compiled.MODEL_LOSS)

    @classmethod
    def of(cls, model: bool, loss: bool) -> Compiled:
        """The setting compiling ``model`` and ``loss`` as asked."""
        return {(False, False): cls.NONE, (True, False): cls.MODEL, (False, True): cls.LOSS}.get(
            (model, loss), cls.MODEL_LOSS
        )
