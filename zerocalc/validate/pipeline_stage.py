"""One stage of the validate model as ``torch.distributed.pipelining`` runs it (imports torch): its modules
(:class:`StageModule`, cut as :func:`zerocalc.validate.pipeline.stage_layers` says) and the static shapes
``PipelineStage`` is given. Shared by the real ranks (:mod:`zerocalc.validate.pipeline_worker`) and the
fake run (:mod:`zerocalc.validate.pipeline_fake`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate.model import Transformer
from zerocalc.validate.pipeline import PipelineJob, activation_dtype, stage_layers

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class StageModule(nn.Module):
    """The modules of one stage of a :class:`~zerocalc.validate.model.Transformer`, in its registration
    order: the embeddings (first stage), the stage's blocks, the final norm and LM head (last stage). The
    first stage takes token ids, the others hidden states; the last returns logits."""

    def __init__(self, model: Transformer, layers: range, first: bool, last: bool, autocast: bool):
        super().__init__()
        if first:
            self.embed_tokens = model.embed_tokens
            self.embed_positions = model.embed_positions
        self.layers = nn.ModuleList(model.layers[i] for i in layers)
        if last:
            self.final_norm = model.final_norm
            self.lm_head = model.lm_head
        self.first, self.last, self.autocast = first, last, autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            if self.first:
                tokens = x
                x = self.embed_tokens(tokens)
                if self.embed_positions is not None:
                    x = x + self.embed_positions(torch.arange(tokens.shape[1], device=tokens.device))
            for layer in self.layers:
                x = layer(x)
            if self.last:
                x = self.lm_head(self.final_norm(x))
        return x


def build_stage(model: Transformer, job: PipelineJob, stage: int) -> StageModule:
    """Stage ``stage`` of ``model`` (the other stages' modules are left to the caller to drop)."""
    autocast = job.precision is PrecisionName.BF16_MIXED and job.strategy != "fsdp2"
    layers = stage_layers(job.arch.num_layers, job.pp, stage, job.first_stage_layers, job.last_stage_layers)
    return StageModule(model, layers, stage == 0, stage == job.pp - 1, autocast)


def stage_shapes(job: PipelineJob, stage: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``PipelineStage``'s static ``input_args`` and ``output_args`` of ``stage`` for one micro-batch:
    token ids or hidden states (requiring grad: their gradient is sent back), hidden states or logits."""
    b, s, h, v = job.batch, job.seq, job.arch.hidden_size, job.arch.vocab_size
    dtype = _TORCH_DTYPES[activation_dtype(job.strategy, job.precision).value]
    logits_dtype = torch.float32 if job.precision is PrecisionName.FP32 else torch.bfloat16
    if stage == 0:
        inputs: tuple[Any, ...] = (torch.zeros(b, s, dtype=torch.long),)
    else:
        inputs = (torch.empty(b, s, h, dtype=dtype, requires_grad=True),)
    if stage == job.pp - 1:
        outputs: tuple[Any, ...] = (torch.empty(b, s, v, dtype=logits_dtype, requires_grad=True),)
    else:
        outputs = (torch.empty(b, s, h, dtype=dtype, requires_grad=True),)
    return inputs, outputs
