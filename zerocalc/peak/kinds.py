"""The vocabulary of the step timeline: its phases and the kinds of tensor it allocates.

Every tensor the timeline allocates has one :class:`TensorKind`; the report's terms at the peak are the
bytes alive per kind. Defined once here, read by the timeline, the mechanics and the report.
"""

from __future__ import annotations

from enum import StrEnum


class StepPhase(StrEnum):
    """A phase of one training step, as ``torch.cuda.reset_peak_memory_stats`` separates them, and the
    model's creation before the first step."""

    CREATION = "creation"
    """Model creation and wrapping (``--init``), before the first step."""
    START = "start"
    FORWARD = "forward"
    """The forward pass and the loss."""
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    """``optimizer.step()`` and ``zero_grad()``."""


class TensorKind(StrEnum):
    PARAMETERS = "parameters"
    """The parameters each rank keeps (its fp32 shard, DDP's replica, an accounting's parameter line)."""
    GATHERED = "gathered parameters"
    """Unsharded (all-gathered) parameters and their low-precision copies."""
    GRADIENTS = "gradients"
    REDUCTION = "gradient reduction buffers"
    """Gradients cast to the reduce dtype, reduce-scatter inputs and outputs, DDP's reducer buckets."""
    OPTIMIZER_STATES = "optimizer states"
    OPTIMIZER_TEMPORARIES = "optimizer step temporaries"
    ACTIVATIONS = "activations"
    """What the model's forward keeps for backward, and the hidden-state gradients of backward."""
    LOSS = "loss"
    """Logits, their fp32 copies, log-softmax and their gradients."""
    INPUTS = "inputs"
    """Input ids, labels and the model's buffers (rotary frequencies)."""
    RUNTIME = "runtime workspaces"
    """cuBLAS workspaces and small runtime allocations."""
    BUFFERS = "communication buffers"
    """Buckets an accounting keeps resident (DeepSpeed's reduce/all-gather buckets, DDP's bucket)."""
    PIPELINE = "pipeline buffers"
    """A pipeline stage's activations received from the previous stage (kept for their gradient), the
    gradients it receives and sends, and its output where the framework keeps it until its backward."""
    TRANSIENT = "in-layer temporaries"
    """Intermediates alive only inside one op or layer."""
    BLOCK_REMAINDERS = "allocator block remainders"
    """What ``torch.cuda.memory_allocated`` counts above the requests: cached blocks the caching allocator
    handed out whole (:mod:`zerocalc.peak.allocator`)."""
