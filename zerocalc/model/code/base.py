"""The vocabulary every model code shares: the codes' names, where a step runs, the record of a model code,
what a layer keeps and what parallelism holds for a moment, the attention kernels."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

FP32 = 4
INT64 = 8


class ModelImplName(StrEnum):
    HF = "hf"
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"


class Device(StrEnum):
    """Where the step runs: a few kernels keep other dtypes on the CPU (LayerNorm statistics, dropout)."""

    CUDA = "cuda"
    CPU = "cpu"


class ModelImpl(NamedTuple):
    """The code a model is trained with, and what of it the activation accounting follows."""

    name: ModelImplName
    title: str
    library: str
    source: str
    norm_fp32_copy: bool
    """Norms upcast their input with ``x.to(float32)`` and keep the copy (HF RMSNorm)."""
    kv_cache_copies: bool
    """Training forwards still build a ``DynamicCache`` (``use_cache`` defaults to True): attention keeps
    the cache's ``torch.cat`` copies of k and v (HF)."""
    embedding_output_alive: bool
    """The embedding output lives through the whole base-model forward in a local variable (HF)."""
    loss: str
    """How the loss is computed, for the loss terms."""
    transients: bool
    """In-layer transient peaks are counted (measured for HF, derived for torchtitan; Korthikanti counts
    none)."""


class AttentionKernel(StrEnum):
    """What attention keeps for backward."""

    FLASH = "flash"
    """SDPA's flash (or memory-efficient) kernel: q, k, v, the output and an fp32 log-sum-exp per row; no
    [b, a, s, s] tensor (dropout is drawn inside the kernel)."""
    EAGER = "eager"
    """Softmax probabilities [b, a, s, s] (and their dropout) kept for backward."""


class LayerSaves(NamedTuple):
    """What one decoder layer's forward keeps for backward, and its transient peaks."""

    saved: tuple[tuple[str, int], ...]
    """(name, bytes) per storage kept until the layer's backward."""
    keeps_input: bool
    """An op saves the layer's input hidden state itself (GPT-2's ln_1, fp32 training), so it stays."""
    forward_excess: int
    """Above what is alive plus ``saved``, at the layer's forward peak (its freshly computed outputs)."""
    backward_excess: int
    """Above what is alive at the start of the layer's backward, at its backward peak."""
    program: tuple[tuple[str, str, int], ...] = ()
    """The layer's forward in the code's order, where it is written out (:func:`forward_program`):
    ``("keep", name, bytes)`` allocates a saved tensor of :attr:`saved`, ``("temp", name, bytes)`` an
    intermediate, ``("drop", name, 0)`` frees one, ``("release", name, 0)`` is where the code drops its
    last reference to a saved tensor (freed there when nothing saves it: the forward of a checkpointed
    layer), ``("output", "", 0)`` is where the layer's output is allocated; empty: the saved tensors at
    once, then ``forward_excess``."""


class Transient(NamedTuple):
    """Buffers tensor or context parallelism holds together at one moment inside a layer."""

    phase: str
    """``forward`` or ``backward``."""
    name: str
    nbytes: int
