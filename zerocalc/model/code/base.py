"""The protocol of a model code (:class:`ModelCode`: what each code decides that the activation accounting
follows) and the vocabulary every code shares: the codes' names, where a step runs, the attention kernels,
what a layer keeps and what parallelism holds for a moment."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import NamedTuple

from zerocalc.model.architecture import Architecture
from zerocalc.model.code.shape import Shape

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


class AttentionKernel(StrEnum):
    """What attention keeps for backward."""

    FLASH = "flash"
    """SDPA's flash (or memory-efficient) kernel: q, k, v, the output and an fp32 log-sum-exp per row; no
    [b, a, s, s] tensor (dropout is drawn inside the kernel)."""
    EAGER = "eager"
    """Softmax probabilities [b, a, s, s] (and their dropout) kept for backward."""


class Ulysses(StrEnum):
    """How a code runs Ulysses context parallelism (q, k, v all-to-all'd from s/c tokens × a heads to s
    tokens × a/c heads), if it does."""

    NONE = "none"
    """No Ulysses: context parallelism rotates K/V (ring or all-gather) only."""
    REPEATS_KV = "repeats_kv"
    """k and v repeated to c heads where they have fewer (DeepSpeed ``runtime/sequence_parallel/
    ulysses_sp.py`` ``UlyssesSPAttentionHF``, ``kv_replication_factor``)."""
    SPLITS_KV = "splits_kv"
    """k and v split by heads like q: the key/value heads per tensor-parallel rank divide by c (Transformer
    Engine ``AttnFuncWithCPAndQKVOA2A``)."""


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
    """The layer's forward in the code's order, where it is written out (:meth:`ModelCode.forward_program`):
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


Program = tuple[tuple[str, str, int], ...]
Saves = list[tuple[str, int]]


class ModelCode(ABC):
    """The code a model is trained with (``--model-impl``), and what of it the activation accounting
    follows: one subclass and one instance per code (:mod:`.hf`, :mod:`.megatron`, :mod:`.torchtitan`;
    :data:`zerocalc.model.code.MODEL_CODES`). The shared machinery (the layers' saved tensors, the loss,
    parallelism's limits and buffers) asks the record what its code does, never which code it is. Each
    record documents its answers with their source (framework, version, file)."""

    name: ModelImplName
    title: str
    library: str
    source: str
    """Where the record's accounting comes from, for the peak's notes."""

    # ---- the tensors its modules keep
    norm_fp32_copy: bool
    """Norms upcast their input with ``x.to(float32)`` and keep the copy."""
    kv_cache_copies: bool
    """Training forwards still build a ``DynamicCache``: attention keeps the cache's ``torch.cat`` copies
    of k and v."""
    embedding_output_alive: bool
    """The embedding output lives through the whole base-model forward in a local variable."""
    transformers_modules: bool
    """The model is built from transformers' classes (the family's ``modeling_<family>.py`` on
    ``PreTrainedModel``), so the step holds what those modules add beyond the layers' saved tensors, as
    the family traits (:mod:`zerocalc.model.traits`) say: Gemma's √h embedding scale and its buffer, Gemma
    2's logit soft-capping, the rotary embedding's ``inv_freq`` buffers and the base model's position ids,
    the sliding-window cache's tensors, a tied LM head built before ``post_init`` ties it, and SDPA's
    philox seed and offset per layer (measured on the H100 runs of this code)."""
    loss: str
    """How the loss is computed, for the loss terms (:func:`~zerocalc.model.code.outside.loss_saves`, the
    step timeline)."""
    loss_savers: bool
    """torchtune's chunked and Liger's fused linear cross-entropy (``--loss``, :mod:`.loss`) stand in for its
    loss: its head is transformers' ``lm_head`` and ``ForCausalLMLoss``, which Liger's patch replaces and
    torchtune's chunked output mirrors."""
    transients: bool
    """In-layer transient peaks are counted (:mod:`.excess`)."""

    # ---- how it runs under parallelism
    fused_kernels: bool
    """Its layers run fused element-wise kernels rather than eager PyTorch ops (the compute model's
    element-wise traffic, :mod:`zerocalc.compute.ops`)."""
    sequence_parallel: bool
    """Tensor parallelism can split the norm, dropout and residual regions along the sequence."""
    ulysses: Ulysses
    """How it runs Ulysses context parallelism, if it does."""
    sharded_logits: bool
    """Under tensor parallelism each rank computes ⌈V/t⌉ vocabulary columns of the logits and the
    cross-entropy runs on that shard (:func:`~zerocalc.model.code.outside.vocab_shard`); else every rank
    holds all V columns."""
    pads_vocab: bool
    """The output layer allocates the vocabulary padded for tensor parallelism
    (:attr:`~zerocalc.model.architecture.TensorParallelRank.padded_vocab`)."""
    loss_parallel_fp32_copies: int
    """fp32 [rows, columns] tensors the vocabulary-parallel cross-entropy holds beyond an unsharded one of
    the same logits, at each of the loss's forward and backward peaks."""
    saves_received_input: bool
    """A pipeline chunk's first layer saves as its ``attn_norm_input`` the very tensor received from the
    previous stage, which the schedule keeps for its gradient: one tensor."""
    op_sac_memory: bool
    """The memory of torchtitan's op-level selective checkpointing (``--recompute op``) is modelled for
    this code (:func:`~zerocalc.model.code.op_sac.op_sac_unsupported`)."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [field for field in ModelCode.__annotations__ if not hasattr(cls, field)]
        if missing:
            raise TypeError(f"model code {cls.__name__} does not set {', '.join(missing)}")

    def __repr__(self) -> str:
        return f"<model code {self.name.value}>"

    @abstractmethod
    def default_attention(self, arch: Architecture) -> tuple[AttentionKernel, str]:
        """The attention kernel the code runs when ``--flash-attention`` is not given, and its source."""

    @abstractmethod
    def layer(
        self,
        arch: Architecture,
        index: int,
        shape: Shape,
        act: int,
        device: Device,
        use_cache: bool,
        flash: bool,
    ) -> LayerSaves:
        """What decoder layer ``index`` keeps for backward and its in-layer transients, per rank, before
        parallelism's buffers and selective recomputation (:func:`~zerocalc.model.code.layer.layer_saves`
        adds those)."""

    @abstractmethod
    def forward_program(
        self,
        arch: Architecture,
        index: int,
        shape: Shape,
        act: int,
        copies: bool,
        flash: bool,
        saved: tuple[tuple[str, int], ...],
        device: Device,
    ) -> Program:
        """The decoder layer's forward op by op (:attr:`LayerSaves.program`) where the code's is written
        out; empty otherwise. ``copies``: the k/v cache copies are made; ``saved``: the layer's saves."""

    @abstractmethod
    def shared_saves(
        self, arch: Architecture, shape: Shape, act: int, checkpointed: bool, device: Device
    ) -> Saves:
        """Saved once per step and shared by the layers (rotary tables, position ids), per rank."""

    @abstractmethod
    def final_saves(self, arch: Architecture, shape: Shape, act: int, device: Device) -> Saves:
        """The final norm's saved tensors and the LM head's input, per rank."""

    @abstractmethod
    def embedding_excess(self, arch: Architecture, shape: Shape, act: int) -> int:
        """Bytes the embedding holds at its forward peak above its output (the R-row hidden state of
        :func:`~zerocalc.model.code.shape.hidden_bytes`) and what was alive before it, on one rank; 0
        without tensor parallelism."""

    @abstractmethod
    def tensor_parallel_unsupported(self, arch: Architecture, shape: Shape) -> str | None:
        """Why the code's tensor-parallel plan (t > 1) cannot run ``arch`` under ``shape``, one sentence;
        None when it can (the checks every code shares are :func:`~zerocalc.model.code.parallel.
        parallel_unsupported`'s)."""

    @abstractmethod
    def tensor_parallel_transients(self, arch: Architecture, shape: Shape, act: int) -> tuple[Transient, ...]:
        """The moments inside one layer where the code's tensor parallelism (t > 1) holds buffers above the
        layer's saved tensors and its own excess, on one rank."""

    @abstractmethod
    def context_parallel_transients(
        self, arch: Architecture, shape: Shape, act: int
    ) -> tuple[Transient, ...]:
        """The moments inside one layer where ring or all-gather context parallelism (c > 1) holds K/V
        buffers and accumulators above the layer's saved tensors, on one rank (Ulysses' are every code's:
        :func:`~zerocalc.model.code.parallel.parallel_transients`)."""
