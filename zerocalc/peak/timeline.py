"""One training step as a timeline of the tensors it allocates and frees (pure).

The step — start, forward layer by layer, the loss, backward layer by layer, the optimizer step and
``zero_grad`` — is written once here, in program order, from the model's code
(:mod:`zerocalc.model.model_impl`:
what each layer keeps for backward, what the loss allocates) and the framework's mechanics
(:mod:`zerocalc.peak.mechanics`: where parameters are gathered and released, how gradients are reduced
and kept, what the optimizer allocates). A :class:`~zerocalc.peak.ledger.Ledger` records every tensor;
the peak of a phase is the maximum over its events. Written from Hugging Face transformers 5.17 under
PyTorch FSDP2 (torch 2.13 source), this reproduces the tensors of every phase of eight H100 runs to the
byte.

Loss (``hf``, ``loss_utils.ForCausalLMLoss``): the LM head's logits in the compute dtype (2·T·V), their
fp32 copy (``logits.float()``, 4·T·V), the labels padded with −100 (8·b·(s+1)) and their shifted copy
(8·T; a view when b = 1), ``log_softmax``'s fp32 output (saved, 4·T·V), the loss and ``total_weight``. In
backward ``nll_loss_backward`` allocates d(log_softmax) (4·T·V) and ``log_softmax_backward`` d(logits)
(4·T·V): with the saved output, 12·T·V of fp32 loss tensors at once — the step's peak when T·V is large.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Protocol

from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import Architecture, TensorParallelRank, embedding_tensors, head_tensors
from zerocalc.model.model_impl import (
    FP32,
    INT64,
    Device,
    LayerSaves,
    ModelImpl,
    ModelImplName,
    Shape,
    embedding_excess,
    embedding_saves,
    final_saves,
    hidden_bytes,
    layer_saves,
    logits_saves,
    loss_parallel_transients,
    norm_backward_excess,
    shared_saves,
    traits,
    vocab_shard,
)
from zerocalc.parallel.profiles import ModelInit
from zerocalc.peak.kinds import StepPhase, TensorKind
from zerocalc.peak.ledger import Ledger

# kinds of tensors (short names for the program below)
PARAMS = TensorKind.PARAMETERS
GATHERED = TensorKind.GATHERED
GRADS = TensorKind.GRADIENTS
REDUCE = TensorKind.REDUCTION
OPTIMIZER = TensorKind.OPTIMIZER_STATES
OPTIMIZER_TEMP = TensorKind.OPTIMIZER_TEMPORARIES
ACTIVATIONS = TensorKind.ACTIVATIONS
LOSS = TensorKind.LOSS
INPUTS = TensorKind.INPUTS
RUNTIME = TensorKind.RUNTIME
BUFFERS = TensorKind.BUFFERS
TRANSIENT = TensorKind.TRANSIENT

PHASES = (StepPhase.START, StepPhase.FORWARD, StepPhase.BACKWARD, StepPhase.OPTIMIZER)
"""The phases of a step (creation comes once, before the first)."""

MiB = 2**20
START_EXTRA = 512
"""Measured at every step start on the H100 (torch 2.11, CUDA 13), not attributed; taken for every GPU."""
PER_LAYER_ATTENTION = 1024
"""Per layer from forward to that layer's backward, without recompute (2 × 512 B on the H100): SDPA's
philox seed and offset kept on the device."""
RECOMPUTE_EXTRA = 2 * MiB
"""Measured under activation checkpointing from the step start (H100)."""
NO_RESHARD_EXTRA = 1 * MiB
"""Measured with ``reshard_after_forward=False`` from forward to the end of backward (H100)."""


class StepShape(NamedTuple):
    """What the timeline needs besides the mechanics: the model, its code, the micro-batch."""

    arch: Architecture
    impl: ModelImpl
    shape: Shape
    act: int
    """Bytes per activation element (the compute dtype)."""
    device: Device
    flash: bool
    recompute: Recompute
    layer_params: tuple[tuple[int, ...], ...]
    """Elements of each parameter of each block, in registration order."""


class Runtime(NamedTuple):
    """Device allocations of the CUDA runtime through the caching allocator (per GPU kind)."""

    cublas_workspace: int
    """One cuBLAS workspace per (handle, stream): the forward thread's and autograd's device thread's
    (the GPU preset's ``cublas_workspace``)."""
    start_extra: int = START_EXTRA
    per_layer_attention: int = PER_LAYER_ATTENTION
    recompute_extra: int = RECOMPUTE_EXTRA
    no_reshard_extra: int = NO_RESHARD_EXTRA


class Phases(NamedTuple):
    start: int
    after_forward: int
    after_backward: int


class StepHooks(Protocol):
    """The hooks a steady step (:func:`steady_start`, :func:`run_step`) calls, in program order: where the
    framework allocates and frees (:mod:`zerocalc.peak.mechanics`). ``unit`` is ``"root"`` or a block's
    index."""

    def resident(self, led: Ledger, first_step: bool = False) -> None: ...

    def pre_forward(self, led: Ledger, unit: str | int) -> None: ...

    def forward_started(self, led: Ledger, runtime_extra: int) -> None: ...

    def post_forward(self, led: Ledger, unit: str | int) -> None: ...

    def pre_backward(self, led: Ledger, unit: str | int) -> None: ...

    def param_grad(self, led: Ledger, unit: str | int, label: str, numel: int) -> None: ...

    def tied_grad_sum(self, led: Ledger, numel: int) -> None: ...

    def post_backward(self, led: Ledger, unit: str | int) -> None: ...

    def backward_finished(self, led: Ledger) -> None: ...

    def optimizer_step(self, led: Ledger, first_step: bool) -> None: ...

    def zero_grad(self, led: Ledger) -> None: ...


class CreationHooks(StepHooks, Protocol):
    """A step's hooks and the model's creation and wrapping before the first step (:func:`first_start`)."""

    def create(self, led: Ledger, init: ModelInit, element_bytes: int, replaced: int = 0) -> None: ...


def run_step(
    step: StepShape, mechanics: StepHooks, runtime: Runtime | None, led: Ledger, first_step: bool = False
) -> Phases:
    """Append one training step to ``led`` (which holds the state at the step's start) and return the
    allocated totals at its start, after forward and after backward."""
    arch, impl, shape, act, device = step.arch, step.impl, step.shape, step.act, step.device
    h, L = arch.hidden_size, arch.num_layers
    hidden_size_bytes = hidden_bytes(arch, shape, act)  # act·R·h: R rows of the rank's sequence share
    R = shape.sequence_tokens
    logits = vocab_shard(impl, arch, shape, vocab=_allocated_vocab(arch, impl))
    TV = logits.rows * logits.columns  # the rank's logits: its b·s/c tokens × its vocabulary columns
    loss_parallel_forward, loss_parallel_backward = loss_parallel_transients(impl, arch, shape)
    checkpointed = step.recompute is Recompute.FULL
    selective = step.recompute is Recompute.SELECTIVE
    saves_by_kind: dict[tuple[bool, bool], LayerSaves] = {}

    def saves_of(i: int, use_cache: bool) -> LayerSaves:
        """A layer's saves depend on its index only through whether it is a mixture-of-experts layer."""
        key = (arch.is_moe_layer(i), use_cache)
        if key not in saves_by_kind:
            saves_by_kind[key] = layer_saves(
                impl, arch, i, shape, act, device, use_cache=use_cache, flash=step.flash, selective=selective
            )
        return saves_by_kind[key]

    t = traits(arch)
    hf = impl.name is ModelImplName.HF
    cuda = device is Device.CUDA and runtime is not None

    led.phase = StepPhase.START
    led.event("start")
    start = led.total

    # ---- forward ---------------------------------------------------------------------------------------
    led.phase = StepPhase.FORWARD
    mechanics.pre_forward(led, "root")
    mechanics.forward_started(led, runtime.no_reshard_extra if cuda else 0)
    shared = embedding_saves(impl, arch, act) + shared_saves(impl, arch, shape, act, checkpointed, device)
    led.alloc_group("shared", shared, ACTIVATIONS)
    hidden = "embedding output"
    led.alloc(hidden, hidden_size_bytes, ACTIVATIONS)
    if shape.tp > 1:
        led.event("embedding forward", embedding_excess(impl, arch, shape, act), TRANSIENT)
    if hf and t.rotary and not checkpointed:
        # LlamaModel.forward (and every rotary family's): position_ids = arange(s) + past_seen_tokens,
        # int64 [1, s], alive until the base model returns; saved only by checkpoint closures
        led.alloc("position ids", INT64 * (shape.s // shape.cp), ACTIVATIONS)
    if not t.rotary:  # GPT-2: wte(ids) + wpe(positions) (+ dropout) is a new tensor; both inputs stay
        led.alloc("position embedding output", act * (shape.s // shape.cp) * h, ACTIVATIONS)
        led.alloc("hidden 0", hidden_size_bytes, ACTIVATIONS)
        hidden = "hidden 0"
    embedding_alive = impl.embedding_output_alive
    for i in range(L):
        mechanics.pre_forward(led, i)
        if first_step and cuda and i == 0:
            led.alloc("cuBLAS workspace (forward thread)", runtime.cublas_workspace, RUNTIME)
        if checkpointed:
            # torch.utils.checkpoint (use_reentrant=False): the layer's saved tensors are dropped at pack
            # time, its input is kept; no cache copies (HF turns use_cache off under checkpointing)
            saves = saves_of(i, use_cache=False)
            new = f"hidden {i + 1}"
            if saves.program:
                label = "forward (checkpointed)"
                _run_program(led, i, saves.program, 0, new, hidden_size_bytes, label, checkpointed=True)
            else:
                led.alloc(f"layer {i} work", sum(b for _, b in saves.saved), ACTIVATIONS)
                led.event(f"layer {i} forward (checkpointed)", saves.forward_excess, TRANSIENT)
                led.free(f"layer {i} work")
                led.alloc(new, hidden_size_bytes, ACTIVATIONS)
            hidden = new  # every checkpoint input stays alive
        else:
            saves = saves_of(i, use_cache=True)
            new = f"hidden {i + 1}"
            rng = runtime.per_layer_attention if cuda and hf else 0
            if saves.program:
                _run_program(led, i, saves.program, rng, new, hidden_size_bytes)
            else:
                led.alloc_group(f"layer {i}", saves.saved, ACTIVATIONS)
                if hf and t.sliding_pattern and (i + 1) % t.sliding_pattern:
                    led.alloc(
                        f"layer {i} sliding-window cache tensor", INT64, ACTIVATIONS, group="sliding cache"
                    )
                led.alloc(f"layer {i}.sdpa rng", rng, ACTIVATIONS, group=f"layer {i}")
                led.event(f"layer {i} forward", saves.forward_excess, TRANSIENT)
                led.alloc(new, hidden_size_bytes, ACTIVATIONS)
            if not saves.keeps_input and not (hidden == "embedding output" and embedding_alive):
                led.free(hidden)
            hidden = new
        mechanics.post_forward(led, i)

    led.alloc_group("final", final_saves(impl, arch, shape, act, device), ACTIVATIONS)
    # RMSNorm forward: while x·rsqrt (fp32) exists its cast exists and the output does not yet
    led.event(
        "final norm forward",
        (FP32 - act) * R * h if t.norm != "layernorm" and impl.norm_fp32_copy else 0,
        TRANSIENT,
    )
    layernorm_keeps = t.norm == "layernorm"
    if not layernorm_keeps and hidden != "embedding output":
        led.free(hidden)  # the final norm kept its own copy; the last output is no checkpoint input either
    if not (checkpointed and t.rotary):
        led.free(
            "embedding output"
        )  # the base model's forward returns (under checkpointing it is layer 0's input)
    led.free("position embedding output")
    led.free("position ids")

    # the loss
    led.alloc("logits", act * TV, LOSS)
    capped = logits_saves(impl, arch, shape, act)
    for name, b in capped:
        led.alloc(name, b, LOSS)
    if impl.loss == "hf_upcast":
        led.alloc("logits fp32 copy", FP32 * TV, LOSS)
        led.alloc("labels padded", INT64 * shape.b * (shape.s + 1), LOSS)
        if shape.b > 1 or shape.cp > 1:
            led.alloc("shift labels", INT64 * logits.rows, LOSS)  # labels[..., 1:].contiguous() copies
        else:
            led.rename("labels padded", "shift labels")  # b = 1: the slice is contiguous, a view
    elif impl.loss == "float_cross_entropy":
        led.alloc("logits fp32 copy", FP32 * TV, LOSS)
    led.alloc("log_softmax", FP32 * TV, LOSS)
    led.alloc("loss", FP32, LOSS)
    led.alloc("total_weight", FP32, LOSS)
    led.event("loss forward (nll_loss)", loss_parallel_forward, TRANSIENT)
    led.free("logits fp32 copy")
    led.free("labels padded")
    led.free("previous step's loss")
    mechanics.post_forward(led, "root")
    led.free("logits")  # only the loss is kept by the training loop
    led.free_group("sliding cache")  # the DynamicCache of the dropped output
    led.event("after forward")
    after_forward = led.total

    # ---- backward --------------------------------------------------------------------------------------
    led.phase = StepPhase.BACKWARD
    led.alloc("grad seed", FP32, LOSS)
    mechanics.pre_backward(led, "root")
    led.alloc("d log_softmax (nll_loss_backward)", FP32 * TV, LOSS)
    led.free("shift labels")
    led.free("total_weight")
    led.alloc("d logits fp32 (log_softmax_backward)", FP32 * TV, LOSS)
    led.event("loss backward (log_softmax_backward)", loss_parallel_backward, TRANSIENT)
    led.free("log_softmax")
    led.free("d log_softmax (nll_loss_backward)")
    if act != FP32:
        led.alloc("d logits", act * TV, LOSS)
        led.event("logits.float() backward")
        led.free("d logits fp32 (log_softmax_backward)")
    else:
        led.rename("d logits fp32 (log_softmax_backward)", "d logits")
    for name, _ in capped:
        led.free(name)  # tanh_backward has run
    if first_step and cuda:
        led.alloc("cuBLAS workspace (autograd thread)", runtime.cublas_workspace, RUNTIME)
    led.alloc("d hidden", hidden_size_bytes, ACTIVATIONS)
    head = "embedding" if arch.tied_embeddings else "lm_head"
    mechanics.param_grad(led, "root", head, _vocab_numel(arch, head))
    led.event("lm_head backward")
    led.free("d logits")
    led.event("final norm backward", norm_backward_excess(impl, arch, shape, act), TRANSIENT)
    led.free_group("final")
    if layernorm_keeps:
        led.free(hidden)  # ln_f's saved input
    mechanics.param_grad(led, "root", "final norm", h * (2 if t.norm == "layernorm" else 1))
    for i in reversed(range(L)):
        mechanics.pre_backward(led, i)
        saves = saves_of(i, use_cache=not checkpointed)
        if checkpointed and saves.program:
            # the recomputed forward (torch.utils.checkpoint, use_reentrant=False): its output is dropped
            _run_program(
                led, i, saves.program, 0, f"layer {i} recomputed output", hidden_size_bytes, "recompute"
            )
            led.free(f"layer {i} recomputed output")
        elif checkpointed:
            led.alloc_group(f"layer {i}", saves.saved, ACTIVATIONS)
            led.event(f"layer {i} recompute", saves.forward_excess, TRANSIENT)
        led.event(f"layer {i} backward", saves.backward_excess, TRANSIENT)
        led.free_group(f"layer {i}")
        if i == 0:
            led.free_group("shared")
        if checkpointed or saves.keeps_input:
            previous = f"hidden {i}" if i > 0 else ("hidden 0" if led.has("hidden 0") else "embedding output")
            led.free(previous)
        mechanics.param_grad(led, i, "block", sum(step.layer_params[i]))
        led.event(f"layer {i} gradients")
        mechanics.post_backward(led, i)

    # the embedding's backward: a dense [V, h] gradient; a tied weight's two gradients are summed out of
    # place (the autograd engine's InputBuffer holds the LM head's until the embedding's arrives)
    if not t.rotary:
        mechanics.param_grad(led, "root", "position embedding", arch.max_position_embeddings * h)
    mechanics.param_grad(led, "root", "embedding dense", _vocab_numel(arch, "embedding"))
    led.event("embedding backward")
    led.free("d hidden")
    if arch.tied_embeddings:
        mechanics.tied_grad_sum(led, _vocab_numel(arch, "embedding"))
        led.event("tied embedding gradient sum")
    for name in ("embedding output", "hidden 0"):
        led.free(name)
    mechanics.post_backward(led, "root")
    mechanics.backward_finished(led)
    led.free("grad seed")  # held by torch.autograd.backward's frame
    led.event("after backward")
    after_backward = led.total

    # ---- optimizer ---------------------------------------------------------------------------------------
    led.phase = StepPhase.OPTIMIZER
    mechanics.optimizer_step(led, first_step)
    mechanics.zero_grad(led)
    led.event("zero_grad")
    led.rename("loss", "previous step's loss")  # the training loop's `loss` lives into the next step
    return Phases(start, after_forward, after_backward)


def _allocated_vocab(arch: Architecture, impl: ModelImpl) -> int | None:
    """The vocabulary the output layer allocates: Megatron-LM's padded one under tensor parallelism
    (:attr:`~zerocalc.model.architecture.TensorParallelRank.padded_vocab`), else the model's."""
    if isinstance(arch, TensorParallelRank) and impl.name is ModelImplName.MEGATRON:
        return arch.padded_vocab
    return None


def _vocab_numel(arch: Architecture, module: str) -> int:
    """Elements of the rank's embedding (``embedding``) or untied LM head (``lm_head``) weight."""
    name = "embed_tokens" if module == "embedding" else "lm_head"
    tensors = embedding_tensors(arch) if module == "embedding" else head_tensors(arch)
    return next(t.numel for t in tensors if t.module == name)


def _run_program(
    led: Ledger,
    i: int,
    program: tuple[tuple[str, str, int], ...],
    rng: int,
    output: str,
    output_bytes: int,
    label: str = "forward",
    checkpointed: bool = False,
) -> None:
    """Layer ``i``'s forward op by op (:attr:`~zerocalc.model.model_impl.LayerSaves.program`): the saved
    tensors in its group, the intermediates freed where the code drops them, SDPA's philox seed and offset
    (``rng`` bytes) with the saved tensors, the output where the program writes it; the layer's event where
    the most is allocated. ``checkpointed``: the forward of a layer under ``torch.utils.checkpoint``
    (``use_reentrant=False``), whose saved tensors are freed where the code releases them."""
    group = f"layer {i}"
    peak = _program_peak(program, output_bytes, checkpointed, led.block)
    for at, (verb, name, nbytes) in enumerate(program):
        if verb == "keep":
            if checkpointed:
                led.alloc(f"{group}.{name}", nbytes, TRANSIENT)
            else:
                led.alloc(f"{group}.{name}", nbytes, ACTIVATIONS, group=group)
                if name.startswith("softmax log-sum-exp"):
                    led.alloc(f"{group}.sdpa rng", rng, ACTIVATIONS, group=group)
        elif verb == "temp":
            led.alloc(f"{group}.{name}", nbytes, TRANSIENT)
        elif verb == "drop" or (verb == "release" and checkpointed):
            led.free(f"{group}.{name}")
        elif verb == "output":
            led.alloc(output, output_bytes, ACTIVATIONS)
        if at == peak:
            led.event(f"layer {i} {label}")


@lru_cache(maxsize=4096)
def _program_peak(
    program: tuple[tuple[str, str, int], ...], output_bytes: int, checkpointed: bool, block: int
) -> int:
    """The index of the program's op after which the most is allocated (the first such), its tensors
    rounded up to ``block`` bytes (computed once per program and sizes: the plan runs the same layer
    programs thousands of times)."""

    def rounded(nbytes: int) -> int:
        return 0 if nbytes <= 0 else -(-nbytes // block) * block

    held: dict[str, int] = {}
    for verb, name, nbytes in program:
        if verb in ("keep", "temp"):
            held.setdefault(name, nbytes)
    total = best = 0
    peak = len(program) - 1
    for at, (verb, name, nbytes) in enumerate(program):
        if verb in ("keep", "temp"):
            total += rounded(nbytes)
        elif verb == "output":
            total += rounded(output_bytes)
        elif verb == "drop" or (verb == "release" and checkpointed):
            total -= rounded(held[name])
        if total > best:
            best, peak = total, at
    return peak


def steady_start(step: StepShape, mechanics: StepHooks, runtime: Runtime | None, led: Ledger) -> None:
    """What is allocated at the start of a step after the first: the mechanics' resident state, the input
    ids (= labels), the previous loss, model buffers and the runtime's workspaces."""
    mechanics.resident(led)
    _inputs(step, led)
    led.alloc("previous step's loss", FP32, LOSS)
    if runtime is not None and step.device is Device.CUDA:
        led.alloc("cuBLAS workspace (forward thread)", runtime.cublas_workspace, RUNTIME)
        led.alloc("cuBLAS workspace (autograd thread)", runtime.cublas_workspace, RUNTIME)
        _runtime_extras(step, runtime, led)


def _inputs(step: StepShape, led: Ledger) -> None:
    arch = step.arch
    t = traits(arch)
    if t.rotary and step.impl.name is ModelImplName.HF:
        d = arch.latent_attention.qk_rope_head_dim if arch.latent_attention else arch.dim_per_head
        # the rotary embedding's inv_freq and original_inv_freq buffers (fp32 [d/2]), per table
        for table in ("", " (global)")[: t.rotary_tables]:
            led.alloc(f"rotary inv_freq{table}", 2 * d, INPUTS)
            led.alloc(f"rotary original_inv_freq{table}", 2 * d, INPUTS)
    if t.embedding_scale_buffer and step.impl.name is ModelImplName.HF:
        led.alloc("embedding scale buffer (fp32 0-dim)", FP32, INPUTS)
    led.alloc("input ids (= labels)", INT64 * step.shape.local_tokens, INPUTS)


def _runtime_extras(step: StepShape, runtime: Runtime, led: Ledger) -> None:
    led.alloc("unattributed at step start", runtime.start_extra, RUNTIME)
    if step.recompute is Recompute.FULL:
        led.alloc("checkpointing runtime extra", runtime.recompute_extra, RUNTIME)


def first_start(
    step: StepShape,
    mechanics: CreationHooks,
    runtime: Runtime | None,
    led: Ledger,
    init: ModelInit,
    element_bytes: int,
) -> None:
    """Model creation and wrapping as ``init`` says (the allocation stream before the first step, its
    events in the creation phase), then the first step's inputs: for the allocator replay. Hugging Face's
    ``PreTrainedModel.post_init`` ties a tied LM head after the model is built (``init_weights`` →
    ``tie_weights``, transformers 5.17): its own [V, h] weight exists until then."""
    led.phase = StepPhase.CREATION
    arch = step.arch
    tied = step.impl.name is ModelImplName.HF and arch.tied_embeddings
    mechanics.create(
        led, init, element_bytes, element_bytes * arch.vocab_size * arch.hidden_size if tied else 0
    )
    _inputs(step, led)
    if runtime is not None and step.device is Device.CUDA:
        _runtime_extras(step, runtime, led)
