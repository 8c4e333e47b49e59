"""One training step as a timeline of the tensors it allocates and frees (pure).

The step — start, forward layer by layer, the loss, backward layer by layer, the optimizer step and
``zero_grad`` — is written once here, in program order, from the model's code
(:mod:`zerocalc.model.code`:
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
Megatron-LM's vocab-parallel cross-entropy (``core/tensor_parallel/cross_entropy.py``) keeps its fp32 softmax
(4·T·V) from the fp32 copy of the logits and turns it into the gradient in place: the bf16 logits and the
fp32 copy (6·T·V) at the forward's peak, the gradient and its bf16 cast (6·T·V) at the backward's.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import NamedTuple, Protocol

from zerocalc.model.activations import Recompute
from zerocalc.model.architecture import (
    Architecture,
    TensorParallelRank,
    embedding_tensors,
    global_layer,
    head_tensors,
)
from zerocalc.model.code import (
    FP32,
    INT64,
    TORCHTUNE_OUTPUT_CHUNKS,
    Compiled,
    Device,
    ForwardTuning,
    LayerSaves,
    LossImpl,
    ModelCode,
    OpSacLayer,
    OutputKept,
    Shape,
    VocabShard,
    chunked_rows,
    compiled_final_saves,
    compiled_loss_saves,
    embedding_saves,
    hidden_bytes,
    layer_saves,
    liger_chunk_rows,
    logits_saves,
    loss_parallel_transients,
    norm_backward_excess,
    op_sac_layer,
    stream_bytes,
    traced_mask_saves,
    tuned_embedding_saves,
    tuned_final_saves,
    tuned_shared_saves,
    vocab_shard,
)
from zerocalc.model.traits import traits
from zerocalc.parallel.fp8 import NO_FP8, Fp8Setting
from zerocalc.parallel.framework_records.record import ModelInit
from zerocalc.parallel.pipeline import Pass
from zerocalc.peak.fp8 import cast_backward_excess, cast_forward_excess, te_saved, torchao_casts, with_casts
from zerocalc.peak.kinds import StepPhase, TensorKind
from zerocalc.peak.layer_nodes import (
    Op,
    experts_backward_program,
    experts_forward_transients,
    first_norm_backward_excess,
)
from zerocalc.peak.ledger import Ledger
from zerocalc.peak.offload import OFFLOAD_STREAM, Pack, Stash, final_packs

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
PIPELINE = TensorKind.PIPELINE

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
    impl: ModelCode
    shape: Shape
    act: int
    """Bytes per activation element (the compute dtype)."""
    device: Device
    flash: bool
    recompute: Recompute
    layer_params: tuple[tuple[int, ...], ...]
    """Elements of each parameter of each block, in registration order."""
    stage: StagePlan | None = None
    """A pipeline rank's passes and what its stage holds; None without pipeline parallelism."""
    checkpoint_every: int = 1
    """Under full recompute, the layers checkpointed: the rank's N-th, 2N-th, … (torchtitan's
    ``selective_ac_option`` N, ``_apply_layer_sac``: a counter over the blocks it wraps); 1: every one."""
    forward_transients: tuple[int, ...] = ()
    """Per block of a fine-tuning run, what one of its Linears holds for a moment in forward beside the
    layer's tensors (a 4-bit weight dequantised, DoRA's norm: :func:`zerocalc.peak.finetune.
    forward_transients`); () for none."""
    tuning: ForwardTuning | None = None
    """A fine-tuning run's forward (what its layers save: :func:`~zerocalc.model.code.layer_saves`'s
    ``tuning``); None: every parameter trained."""
    fp8: Fp8Setting = NO_FP8
    """The FP8 recipe of the converted Linear layers (torchao's eager casts: :mod:`zerocalc.peak.fp8`)."""
    loss: LossImpl = LossImpl.FULL
    """The cross-entropy (``--loss``): the model code's on the full logits, or a saver's
    (:mod:`zerocalc.model.code.loss`)."""
    loss_chunks: int = TORCHTUNE_OUTPUT_CHUNKS
    """torchtune's output chunks (``--loss chunked``)."""
    keep_output: OutputKept = OutputKept.NONE
    """How long the training loop holds the model's output, its logits (``--keep-output``)."""
    offload: bool = False
    """torchtune's activation offloading (``--offload-activations``, :mod:`zerocalc.peak.offload`)."""
    compile: Compiled = Compiled.NONE
    """What ``torch.compile`` runs (``--compile``, :mod:`zerocalc.model.code.compiled`): the blocks' saves
    (and transformers' whole forward, its loss included), the loss's."""
    saves: dict[tuple, LayerSaves] | None = None
    """Where the step finds and keeps its layers' saves, per kind of layer (mixture-of-experts or not; a
    fine-tuning run's per layer) and cache use: steps of one micro-batch and recompute whose blocks are
    alike may share one (the plan's runs of one model at a few layers and at all); None: the step's own."""


class LayerNodes(NamedTuple):
    """Where a layer's forward and backward are written beyond its saves' coarse terms
    (:mod:`zerocalc.peak.layer_nodes`)."""

    forward: tuple[int, ...]
    """Each tensor above the saved ones at its forward peak, in place of ``forward_excess`` (empty: that)."""
    program: tuple[Op, ...]
    """Its first nodes op by op (the experts'), run in place of the start's ``backward_excess``."""
    rest: tuple[int, ...]
    """Elements of each weight whose gradient the program does not produce, each its own tensor."""
    first_norm_excess: int
    """Above the layer's gradients while its first norm's backward runs (0: not written)."""


class StagePlan(NamedTuple):
    """What a pipeline rank runs in a step (:mod:`zerocalc.parallel.pipeline`)."""

    passes: tuple[Pass, ...]
    """Its forward and backward passes in its schedule's order, over the micro-batches simulated."""
    micro_batches: int
    """The micro-batches simulated: the last of the step's, as many as its schedule holds in flight."""
    chunk_sizes: tuple[int, ...]
    """The layers of each model chunk, in order."""
    holds_embedding: bool
    holds_head: bool
    keeps_output: bool
    """The stage's output stays allocated from its send to its backward (torch, DeepSpeed)."""
    boundary_bytes: int
    """The activation received from the previous stage per micro-batch, and the gradients received and
    sent: b·s·h elements (÷ t under sequence parallelism, ÷ c under context parallelism)."""


class Runtime(NamedTuple):
    """Device allocations of the CUDA runtime through the caching allocator (per GPU kind)."""

    cublas_workspace: int
    """One cuBLAS workspace per (handle, stream): the forward thread's and autograd's device thread's
    (the GPU preset's ``cublas_workspace``)."""
    blas: str = "cuBLAS"
    """The GEMM library whose workspaces these are, as the GPU preset names it (``names.blas``:
    hipBLASLt on ROCm), in the allocations' names."""
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

    def pipeline_backward(self, led: Ledger, final: bool) -> None: ...

    def optimizer_step(self, led: Ledger, first_step: bool) -> None: ...

    def zero_grad(self, led: Ledger) -> None: ...


class CreationHooks(StepHooks, Protocol):
    """A step's hooks and the model's creation and wrapping before the first step (:func:`first_start`)."""

    def create(self, led: Ledger, init: ModelInit, element_bytes: int, replaced: int = 0) -> None: ...


def run_step(
    step: StepShape, mechanics: StepHooks, runtime: Runtime | None, led: Ledger, first_step: bool = False
) -> Phases:
    """Append one training step to ``led`` (which holds the state at the step's start) and return the
    allocated totals at its start, after forward and after backward.

    Without pipeline stages the step is one forward and one backward; a pipeline rank runs its passes
    (:attr:`StepShape.stage`) in its schedule's order, "after forward" where its warm-up ends (its first
    backward is next: the most micro-batches in flight)."""
    passes = step.stage.passes if step.stage is not None else _ONE_MICRO_BATCH
    run = _Passes(step, mechanics, runtime, led, first_step)
    led.phase = StepPhase.START
    led.event("start")
    start = led.total
    first_backward = next(k for k, one in enumerate(passes) if not one.forward)
    last_backward = max(k for k, one in enumerate(passes) if not one.forward)
    after_forward = start
    for k, one in enumerate(passes):
        if one.forward:
            run.forward(one, first=k == 0)
        else:
            run.backward(one, last=k == last_backward)
        if k == first_backward - 1:
            led.event("after forward")
            after_forward = led.total
    led.event("after backward")
    after_backward = led.total

    # ---- optimizer ---------------------------------------------------------------------------------------
    led.phase = StepPhase.OPTIMIZER
    mechanics.optimizer_step(led, first_step)
    mechanics.zero_grad(led)
    led.event("zero_grad")
    run.keep_last_loss()  # the training loop's `loss` lives into the next step
    run.release_output()
    return Phases(start, after_forward, after_backward)


_ONE_MICRO_BATCH = (Pass(True, 0, 0), Pass(False, 0, 0))
"""The passes of a step without pipeline stages."""


@cache
def _block_labels(count: int) -> tuple[str, ...]:
    """``block#0`` … ``block#{count − 1}``: the labels of a layer's parameters' gradients made outside its
    backward program (named once: a plan's runs make ~10⁵ of them)."""
    return tuple(f"block#{j}" for j in range(count))


class _Passes:
    """The forward and backward passes of one step on one rank: the whole model's, or a pipeline rank's
    chunks', each micro-batch's tensors named apart (`` (mb3)``, `` (mb3 chunk1)``) where several are in
    flight (no word boundary before a digit: the condensed timeline reads the first number as a layer's)."""

    def __init__(
        self, step: StepShape, mechanics: StepHooks, runtime: Runtime | None, led: Ledger, first_step: bool
    ):
        self.step, self.mechanics, self.runtime, self.led = step, mechanics, runtime, led
        self.first_step = first_step
        arch = step.arch
        self.t = traits(arch)
        self.hf = step.impl.transformers_modules
        self.cuda = step.device is Device.CUDA and runtime is not None
        self.checkpointed = step.recompute is Recompute.FULL
        """Layers are checkpointed whole: every one, or every N-th (:meth:`checkpointed_layer`)."""
        self.selective = step.recompute is Recompute.SELECTIVE
        self.op = step.recompute is Recompute.OP
        self.stream = stream_bytes(step.tuning, step.act)
        """Bytes per element of the hidden states between layers: the activation dtype's, fp32 under
        ``prepare_model_for_kbit_training`` (:func:`~zerocalc.model.code.stream_bytes`)."""
        self.hidden_bytes = hidden_bytes(arch, step.shape, self.stream)  # ·R·h: the rank's sequence share
        self.logits_bytes = self.stream
        """Bytes per logit: the LM head's dtype, fp32 under ``prepare_model_for_kbit_training`` (peft 0.21.2
        utils/other.py: every parameter not a ``Params4bit`` cast to fp32, the head too)."""
        self.upcast_bytes = 0 if step.tuning is not None and self.logits_bytes == FP32 else FP32
        """The loss's ``logits.float()`` copy: none of fp32 logits (``Tensor.float`` returns the tensor)."""
        self.logits = logits_shard(step)
        self.compiled_model = step.compile.model
        """The blocks run compiled (Inductor's partitioner decides their saves)."""
        self.compiled_whole = self.compiled_model and self.hf
        """transformers' whole forward is one compiled graph: its norms, mask and loss too."""
        self.compiled_loss = step.compile.loss or self.compiled_whole
        self.compiled_fp8 = self.compiled_model and torchao_casts(step.fp8)
        """torchao's Float8Linear in compiled blocks: its casts are fused kernels, no fp32 copies."""
        self.casts = NO_FP8 if self.compiled_fp8 else step.fp8
        """The FP8 recipe whose eager casts hold fp32 copies (:mod:`zerocalc.peak.fp8`): none compiled."""
        self.eager_casts = torchao_casts(self.casts)
        """Some layer's casts may hold bytes (:func:`~zerocalc.peak.fp8.cast_forward_excess`,
        :func:`~zerocalc.peak.fp8.cast_backward_excess`: 0 for every layer otherwise, not asked per layer)."""
        """The cross-entropy runs compiled: one fused kernel each way, no fp32 [rows, V] tensors."""
        self.loss_parallel = loss_parallel_transients(step.impl, arch, step.shape)
        self._saves: dict[tuple, LayerSaves] = {} if step.saves is None else step.saves
        self._saves_at: dict[tuple[int, bool], LayerSaves] = {}
        """:meth:`saves_of` per (layer, use_cache): each layer's are looked up several times a pass."""
        self._nodes_at: dict[int, LayerNodes] = {}
        """:meth:`nodes_of` per layer."""
        self._op_layer: OpSacLayer | None = None
        self._backward: dict[bool | tuple[bool, int], LayerNodes] = {}
        self._losses: list[str] = []
        held = frozenset({"embedding output"}) if step.impl.embedding_output_alive else frozenset()
        self.stash = Stash(led, held) if step.offload else None
        """torchtune's ``fwd_stash`` of this pass (``--offload-activations``); None: no offloading."""
        self._brought_back: str | None = None
        """The layer input last brought back in backward, freed after the next layer's first node."""

    def layer_input(self, i: int) -> str:
        """Layer ``i``'s input as the timeline names it (the first layer's: the embedding's output)."""
        if i > 0:
            return f"hidden {i}"
        return "embedding output" if self.t.rotary else "hidden 0"

    def saves_of(self, i: int, use_cache: bool) -> LayerSaves:
        """A layer's saves depend on its index only through whether it is a mixture-of-experts layer; a
        fine-tuning run's on the index itself (:func:`~zerocalc.model.code.finetune.tuned_layer`: whether
        its input requires grad, which of its modules are adapted or trained)."""
        found = self._saves_at.get((i, use_cache))
        if found is None:
            found = self._saves_at[(i, use_cache)] = self._saves_by_kind(i, use_cache)
        return found

    def _saves_by_kind(self, i: int, use_cache: bool) -> LayerSaves:
        """:meth:`saves_of`, found or made in the step's saves by the layer's kind."""
        step, arch = self.step, self.step.arch
        fp8 = step.fp8 if step.fp8.on else None  # torchao's casts in the program, TE's fp8 saved inputs
        kind: bool | tuple[str, int] = arch.is_moe_layer(i) if step.tuning is None else ("tuned layer", i)
        key = (kind, use_cache) if fp8 is None else (kind, use_cache, fp8)
        if self.compiled_model:
            key = (*key, "compiled")
        if key not in self._saves:
            saves = layer_saves(
                step.impl, arch, i, step.shape, step.act, step.device, use_cache=use_cache, flash=step.flash,
                selective=self.selective, tuning=step.tuning, compiled=self.compiled_model,
                fp8_matmuls=self.compiled_fp8,
            )  # fmt: skip
            program = saves.program
            if fp8 is not None and torchao_casts(fp8):
                program = with_casts(program, arch, i, fp8, step.shape.local_tokens)
            elif fp8 is not None:
                saves = saves._replace(saved=te_saved(saves.saved, arch, i, fp8, step.act, step.flash))
            self._saves[key] = saves._replace(program=Program(program))  # type: ignore[index]
        return self._saves[key]  # type: ignore[index]

    def embedding_saves(self) -> list[tuple[str, int]]:
        """What the embedding keeps for backward (a fine-tuning run's: its indices where it is trained,
        :func:`~zerocalc.model.code.tuned_embedding_saves`)."""
        step = self.step
        if step.tuning is None:
            return embedding_saves(step.impl, step.arch, step.act)
        return tuned_embedding_saves(step.arch, step.shape, step.tuning)

    def shared_saves(self) -> list[tuple[str, int]]:
        """What the layers share for backward: the rotary tables or GPT-2's position ids. A fine-tuning
        run keeps the tables only from the first layer whose ``q * cos`` records a node
        (:func:`~zerocalc.model.code.tuned_shared_saves`), in the stream's dtype; under checkpointing the
        checkpoints' closures hold them (and the position ids) whatever requires grad."""
        step = self.step
        if self.compiled_whole:
            return traced_mask_saves(step.shape.b, step.shape.s, step.act)
        if step.tuning is None or self.checkpointed:
            return list(
                step.impl.shared_saves(step.arch, step.shape, self.stream, self.checkpointed, step.device)
            )
        return tuned_shared_saves(step.arch, step.shape, step.act, step.device, step.tuning)[1]

    @property
    def shared_until(self) -> int:
        """The layer whose backward frees the shared tensors: the first layer (a fine-tuning run's first
        that keeps the rotary tables)."""
        step = self.step
        if step.tuning is None or self.checkpointed:
            return 0
        first = tuned_shared_saves(step.arch, step.shape, step.act, step.device, step.tuning)[0]
        return first or 0

    def final_saves(self) -> tuple[list[tuple[str, int]], bool]:
        """The final norm's saves and the LM head's input, and whether the last hidden state is kept for
        the final norm's backward (:func:`final_saves`); inside transformers' compiled forward the norm
        keeps its input and rstd (:func:`~zerocalc.model.code.compiled_final_saves`)."""
        final, keeps_last = final_saves(self.step)
        if self.compiled_whole:
            step = self.step
            final = compiled_final_saves(final, step.act, step.shape.sequence_tokens, step.arch.hidden_size)
        return final, keeps_last

    def nodes_of(self, i: int) -> LayerNodes:
        """Layer ``i``'s moments node by node (:mod:`zerocalc.peak.layer_nodes`), which depend on its index
        only through whether it is a mixture-of-experts layer and, in a fine-tuning run, through its
        parameters' gradients (:attr:`StepShape.layer_params`: what each layer trains may differ)."""
        found = self._nodes_at.get(i)
        if found is None:
            found = self._nodes_at[i] = self._nodes_by_kind(i)
        return found

    def _nodes_by_kind(self, i: int) -> LayerNodes:
        """:meth:`nodes_of`, found or made by the layer's kind."""
        moe = self.step.arch.is_moe_layer(i)
        kind: bool | tuple[bool, int] = moe if self.step.tuning is None else (moe, i)
        backward = self._backward.get(kind)
        if backward is None:
            step = self.step
            forward = experts_forward_transients(step.impl, step.arch, i, step.shape, step.act)
            program = experts_backward_program(step.impl, step.arch, i, step.shape, step.act)
            rest = list(step.layer_params[i])
            for verb, _, numel in program:
                if verb == "grad":
                    rest.remove(numel)  # the weight the program's gradient is of (or one of its size)
            excess = first_norm_backward_excess(step.impl, step.arch, step.shape, step.act)
            if self.compiled_whole:
                excess = 0  # the norms' backward is fused into the graph's kernels: no fp32 gradients
            backward = self._backward[kind] = LayerNodes(forward, program, tuple(rest), excess)
        return backward

    def alloc_saves(self, i: int, group: str, saved: tuple[tuple[str, int], ...]) -> None:
        """Layer ``i``'s saved tensors in its group; each its own entry where its backward program frees
        them one by one (a ledger may otherwise keep a group's entries as one, :meth:`Ledger.alloc_group`
        being the one-by-one way)."""
        if self.nodes_of(i).program:
            Ledger.alloc_group(self.led, group, saved, ACTIVATIONS)
        else:
            self.led.alloc_group(group, saved, ACTIVATIONS)

    def forward_peak(self, i: int, name: str, saves: LayerSaves) -> None:
        """Layer ``i``'s forward peak, ``name``: its tensors above the saved ones, each its own storage where
        written node by node, else ``forward_excess``."""
        led, forward = self.led, self.nodes_of(i).forward
        if not forward:
            step = self.step
            casts = (
                cast_forward_excess(step.arch, i, self.casts, step.shape.local_tokens, step.act)
                if self.eager_casts
                else 0
            )
            led.event(name, max(saves.forward_excess, casts), TRANSIENT)
            return
        temps = [f"{name}: transient#{n}" for n in range(len(forward))]
        for temp, nbytes in zip(temps, forward, strict=True):
            led.alloc(temp, nbytes, TRANSIENT)
        led.event(name)
        for temp in temps:
            led.free(temp)

    def checkpointed_layer(self, i: int) -> bool:
        """Layer ``i`` (the rank's) runs under ``torch.utils.checkpoint`` whole: under full recompute the
        (i + 1)-th layers that are multiples of ``checkpoint_every``."""
        return self.checkpointed and (i + 1) % self.step.checkpoint_every == 0

    def keeps_input_of(self, i: int) -> bool:
        """Layer ``i``'s input stays alive as its checkpoint's input (full and op-level checkpointing)."""
        return self.op or self.checkpointed_layer(i)

    def op_layer_of(self, i: int) -> OpSacLayer:
        """Layer ``i`` under torchtitan's op-level selective checkpointing (a dense block: one layer kind)."""
        if self._op_layer is None:
            step = self.step
            self._op_layer = op_sac_layer(
                step.impl, step.arch, i, step.shape, step.act, self.compiled_model, self.compiled_fp8
            )
        return self._op_layer

    def _part(self, one: Pass) -> tuple[str, range, bool, bool]:
        """The pass's tag, its layers and whether it holds the embedding and the head."""
        stage, layers = self.step.stage, self.step.arch.num_layers
        if stage is None:
            return "", range(layers), True, True
        sizes = stage.chunk_sizes
        chunks = len(sizes)
        start = sum(sizes[: one.chunk])
        tag = f" (mb{one.micro_batch})" if stage.micro_batches > 1 else ""
        if chunks > 1:
            tag = f" (mb{one.micro_batch} chunk{one.chunk})"
        embedding = stage.holds_embedding and one.chunk == 0
        head = stage.holds_head and one.chunk == chunks - 1
        return tag, range(start, start + sizes[one.chunk]), embedding, head

    def forward(self, one: Pass, first: bool) -> None:
        step, mechanics, runtime, led = self.step, self.mechanics, self.runtime, self.led
        arch, impl, shape, act, t = step.arch, step.impl, step.shape, step.act, self.t
        h, R = arch.hidden_size, shape.sequence_tokens
        hf, cuda, checkpointed = self.hf, self.cuda, self.checkpointed
        tag, layers, embedding, head = self._part(one)
        led.phase = StepPhase.FORWARD
        mechanics.pre_forward(led, "root")
        if first:
            mechanics.forward_started(led, runtime.no_reshard_extra if cuda else 0)
        received = f"received activation{tag}"
        if embedding:
            shared = self.embedding_saves() + self.shared_saves()
            led.alloc_group(f"shared{tag}", shared, ACTIVATIONS)
            if self.stash is not None:
                for pack in embedding_packs(step):
                    self.stash.pack(pack)
            hidden = f"embedding output{tag}"
            led.alloc(hidden, self.hidden_bytes, ACTIVATIONS)
            if shape.tp > 1:
                led.event(f"embedding forward{tag}", impl.embedding_excess(arch, shape, act), TRANSIENT)
        else:
            # a later stage: the previous stage's output, received, kept for its gradient; the rotary
            # tables are computed again by this stage's forward
            if t.rotary:
                led.alloc_group(f"shared{tag}", self.shared_saves(), ACTIVATIONS)
            hidden = received
            led.alloc(hidden, step.stage.boundary_bytes, PIPELINE)
        if hf and t.rotary and not checkpointed:
            # LlamaModel.forward (and every rotary family's): position_ids = arange(s) + past_seen_tokens,
            # int64 [1, s], alive until the base model returns; saved only by checkpoint closures
            led.alloc(f"position ids{tag}", INT64 * (shape.s // shape.cp), ACTIVATIONS)
        if embedding and not t.rotary:  # GPT-2: wte(ids) + wpe(positions) (+ dropout) is a new tensor
            led.alloc(f"position embedding output{tag}", self.stream * (shape.s // shape.cp) * h, ACTIVATIONS)
            hidden = f"hidden 0{tag}"
            led.alloc(hidden, self.hidden_bytes, ACTIVATIONS)
        kept = {f"embedding output{tag}"} if impl.embedding_output_alive else set()
        kept.add(received)
        for i in layers:
            mechanics.pre_forward(led, i)
            if step.forward_transients:
                led.alloc(f"layer {i} dequantised weight{tag}", step.forward_transients[i], TRANSIENT)
            if self.first_step and cuda and not led.has(workspace(runtime, "forward")):
                led.alloc(workspace(runtime, "forward"), runtime.cublas_workspace, RUNTIME)
            new = f"hidden {i + 1}{tag}"
            if self.checkpointed_layer(i):
                # torch.utils.checkpoint (use_reentrant=False): the layer's saved tensors are dropped at pack
                # time, its input is kept; no cache copies (HF turns use_cache off under checkpointing)
                saves = self.saves_of(i, use_cache=False)
                if self.stash is not None:  # the checkpoint's input, packed by the offloading hook
                    self.stash.pack(Pack(hidden, self.hidden_bytes, hidden))
                if saves.program:
                    label = "forward (checkpointed)"
                    _run_program(led, i, saves.program, 0, new, self.hidden_bytes, label, True, tag)
                else:
                    # the tensors the layer's ops make, each its own block as the forward allocates
                    # them (the sizes its recompute asks the allocator for again), freed at its end
                    led.alloc_group(f"layer {i} work{tag}", saves.saved, ACTIVATIONS)
                    self.forward_peak(i, f"layer {i} forward (checkpointed){tag}", saves)
                    led.free_group(f"layer {i} work{tag}")
                    led.alloc(new, self.hidden_bytes, ACTIVATIONS)
                hidden = new  # every checkpoint input stays alive
            elif self.op:
                # torch.utils.checkpoint with create_selective_checkpoint_contexts: the policy's MUST_SAVE
                # outputs stay in the SAC storage, the other saved tensors are dropped at pack time
                layer = self.op_layer_of(i)
                led.alloc_group(f"layer {i}{tag}", layer.kept, ACTIVATIONS)
                led.alloc(f"layer {i} work{tag}", sum(b for _, b in layer.recomputed), ACTIVATIONS)
                led.event(f"layer {i} forward (op-level checkpointing){tag}", layer.forward_excess, TRANSIENT)
                led.free(f"layer {i} work{tag}")
                led.alloc(new, self.hidden_bytes, ACTIVATIONS)
                hidden = new  # every checkpoint input stays alive
            else:
                saves = self.saves_of(i, use_cache=not checkpointed)
                rng = runtime.per_layer_attention if cuda and hf else 0
                if saves.program:
                    _run_program(led, i, saves.program, rng, new, self.hidden_bytes, tag=tag)
                else:
                    group = f"layer {i}{tag}"
                    saved = saves.saved
                    if hidden == received and impl.saves_received_input:
                        # the chunk's first layer saves its input, the tensor received from the previous
                        # stage, which the schedule keeps for its gradient: one tensor (Megatron-LM
                        # TransformerBlock.set_input_tensor; schedules.py input_tensors)
                        saved = tuple(
                            item for item in saved
                            if item != ("attn_norm_input", step.stage.boundary_bytes)
                        )  # fmt: skip
                    self.alloc_saves(i, group, saved)
                    if hf and t.sliding_pattern and (global_layer(arch, i) + 1) % t.sliding_pattern:
                        led.alloc(
                            f"layer {i} sliding-window cache tensor{tag}", INT64, ACTIVATIONS,
                            group=f"sliding cache{tag}",
                        )  # fmt: skip
                    led.alloc(f"{group}.sdpa rng", rng, ACTIVATIONS, group=group)
                    self.forward_peak(i, f"layer {i} forward{tag}", saves)
                    led.alloc(new, self.hidden_bytes, ACTIVATIONS)
                if not saves.keeps_input and hidden not in kept:
                    led.free(hidden)
                hidden = new
            if step.forward_transients:
                led.free(f"layer {i} dequantised weight{tag}")
            mechanics.post_forward(led, i)

        if not head:
            # the output is sent to the next stage (the framework record's keeps_stage_output: kept until
            # its backward, or its storage freed once sent)
            if step.stage.keeps_output:
                led.rename(hidden, f"stage output{tag}", PIPELINE)
            led.event(f"send activation{tag}")
            led.free(hidden)
            self._forward_done(tag, embedding)
            mechanics.post_forward(led, "root")
            led.free_group(f"sliding cache{tag}")
            return

        final, keeps_last = self.final_saves()
        fused = step.loss is LossImpl.FUSED_LINEAR
        if fused:  # Liger's kernel runs the head outside autograd: nothing saves its input
            final = [(name, b) for name, b in final if name != "LM head input"]
        led.alloc_group(f"final{tag}", final, ACTIVATIONS)
        if self.stash is not None:
            for pack in final_packs(final, (hidden, self.hidden_bytes) if keeps_last else None):
                self.stash.pack(pack)
        if fused or (step.tuning is not None and "lm_head" not in step.tuning.trained):
            # the final norm's output, saved by no one (the head is frozen), is the base model's
            # last_hidden_state: LlamaForCausalLM.forward's `outputs` holds it through the loss
            # (transformers 5.17 modeling_llama.py)
            L = shape.local_tokens
            led.alloc(f"last hidden state (base model output){tag}", self.stream * L * h, ACTIVATIONS)
        # RMSNorm forward: while x·rsqrt (fp32) exists its cast exists and the output does not yet
        led.event(
            f"final norm forward{tag}",
            (FP32 - self.stream) * R * h
            if t.norm != "layernorm" and impl.norm_fp32_copy and not self.compiled_whole
            else 0,
            TRANSIENT,
        )
        if not keeps_last and hidden != f"embedding output{tag}":
            led.free(
                hidden
            )  # the final norm kept its own copy; the last output is no checkpoint input either
        self._forward_done(tag, embedding)

        # the loss
        if step.loss.saver:
            self.saver_loss_forward(tag)
            mechanics.post_forward(led, "root")
            self.free_logits(tag)
            led.free(f"last hidden state (base model output){tag}")
            led.free_group(f"sliding cache{tag}")
            return
        if step.loss is LossImpl.SHIFTED:
            self.shifted_loss_forward(tag)
        else:
            self.model_loss_forward(tag)
        led.free("previous step's loss")
        mechanics.post_forward(led, "root")
        if step.keep_output is OutputKept.NONE and not self.compiled_loss:
            led.free(f"logits{tag}")  # only the loss is kept by the training loop
        led.free(HELD_LOGITS)  # --keep-output next: the previous output, its name rebound as forward returns
        led.free(f"last hidden state (base model output){tag}")
        led.free_group(f"sliding cache{tag}")  # the DynamicCache of the dropped output

    def model_loss_forward(self, tag: str) -> None:
        """The model code's own loss on the full logits (the module docstring)."""
        step, led = self.step, self.led
        arch, impl, shape, act = step.arch, step.impl, step.shape, step.act
        TV = self.logits.rows * self.logits.columns  # the rank's logits: its tokens × its vocabulary columns
        led.alloc(f"logits{tag}", self.logits_bytes * TV, LOSS)
        capped = logits_saves(impl, arch, shape, act)
        for name, b in capped:
            led.alloc(f"{name}{tag}", b, LOSS)
        if self.compiled_loss:
            self.compiled_loss_forward(tag)
        elif impl.loss == "hf_upcast":
            led.alloc(f"logits fp32 copy{tag}", self.upcast_bytes * TV, LOSS)
            led.alloc(f"labels padded{tag}", INT64 * shape.b * (shape.s + 1), LOSS)
            if shape.b > 1 or shape.cp > 1:  # labels[..., 1:].contiguous() copies
                led.alloc(f"shift labels{tag}", INT64 * self.logits.rows, LOSS)
            else:
                led.rename(f"labels padded{tag}", f"shift labels{tag}")  # b = 1: the slice is a view
        elif impl.loss == "float_cross_entropy":
            led.alloc(f"logits fp32 copy{tag}", self.upcast_bytes * TV, LOSS)
        if not self.compiled_loss:
            self.cross_entropy_forward(tag, TV)
            led.free(f"logits fp32 copy{tag}")
            led.free(f"labels padded{tag}")

    def cross_entropy_forward(self, tag: str, elements: int) -> None:
        """``F.cross_entropy`` on ``elements`` fp32 logits: ``log_softmax``'s fp32 output (saved for
        backward), the loss, ``nll_loss``'s ``total_weight``."""
        led = self.led
        led.alloc(f"log_softmax{tag}", FP32 * elements, LOSS)
        led.alloc(f"loss{tag}", FP32, LOSS)
        self._losses.append(f"loss{tag}")
        led.alloc(f"total_weight{tag}", FP32, LOSS)
        led.event(f"loss forward (nll_loss){tag}", self.loss_parallel[0], TRANSIENT)

    def cross_entropy_backward(self, tag: str, elements: int, gradient: str) -> None:
        """Its backward: ``nll_loss_backward``'s d(log_softmax) (the shifted labels and ``total_weight``
        then freed), ``log_softmax_backward``'s fp32 ``gradient`` of the logits beside both, then the saved
        output and d(log_softmax) freed."""
        led = self.led
        led.alloc(f"d log_softmax (nll_loss_backward){tag}", FP32 * elements, LOSS)
        led.free(f"shift labels{tag}")
        led.free(f"total_weight{tag}")
        led.alloc(gradient, FP32 * elements, LOSS)
        led.event(f"loss backward (log_softmax_backward){tag}", self.loss_parallel[1], TRANSIENT)
        led.free(f"log_softmax{tag}")
        led.free(f"d log_softmax (nll_loss_backward){tag}")

    def cast_logits_gradient(self, tag: str, gradient: str) -> None:
        """``Tensor.float``'s backward: the fp32 ``gradient`` of the logits cast to the head's dtype as
        ``d logits`` (the tensor itself, renamed, where the head is fp32)."""
        led = self.led
        if self.logits_bytes != FP32:
            led.alloc(f"d logits{tag}", self.logits_bytes * self.logits.rows * self.logits.columns, LOSS)
            led.event(f"logits.float() backward{tag}")
            led.free(gradient)
        else:
            led.rename(gradient, f"d logits{tag}")

    @property
    def shifted_rows(self) -> int:
        """The rows ``--loss shifted`` takes the loss over: ``logits[..., :-1, :]``, b·(s−1)."""
        shape = self.step.shape
        return shape.b * (shape.s - 1)

    def shifted_loss_forward(self, tag: str) -> None:
        """``--loss shifted``: transformers 4.45.2 ``LlamaForCausalLM.forward``'s loss lines
        (:mod:`zerocalc.model.code.loss`): the fp32 logits the output holds (``logits.float()``; none more
        where the head is fp32, the 16-bit ones freed as the name is rebound), the shifted fp32 copy
        (freed as the forward returns), the shifted labels (a copy where b > 1, held by ``nll_loss``),
        ``log_softmax``'s fp32 output."""
        led, shape = self.led, self.step.shape
        TV = self.logits.rows * self.logits.columns
        shifted = self.shifted_rows * self.logits.columns
        if self.logits_bytes != FP32:
            led.alloc(f"logits (lm_head output){tag}", self.logits_bytes * TV, LOSS)
            led.alloc(f"logits{tag}", FP32 * TV, LOSS)
            led.event(f"logits.float(){tag}")
            led.free(f"logits (lm_head output){tag}")
        else:
            led.alloc(f"logits{tag}", FP32 * TV, LOSS)
        led.alloc(f"shift logits{tag}", FP32 * shifted, LOSS)
        if shape.b > 1:  # labels[..., 1:] of one row is contiguous: .contiguous() returns the view
            led.alloc(f"shift labels{tag}", INT64 * self.shifted_rows, LOSS)
        self.cross_entropy_forward(tag, shifted)
        led.free(f"shift logits{tag}")

    def shifted_loss_backward(self, tag: str) -> None:
        """``--loss shifted``'s backward: ``nll_loss_backward``'s and ``log_softmax_backward``'s fp32
        gradients of the shifted rows, ``slice_backward``'s zero fp32 tensor of the whole logits, then
        ``Tensor.float``'s backward in the head's dtype (none where the head is fp32)."""
        led = self.led
        TV = self.logits.rows * self.logits.columns
        shifted = self.shifted_rows * self.logits.columns
        shifted_gradient = f"d shift logits (log_softmax_backward){tag}"
        self.cross_entropy_backward(tag, shifted, shifted_gradient)
        led.alloc(f"d logits fp32 (slice_backward){tag}", FP32 * TV, LOSS)
        led.event(f"loss backward (slice_backward){tag}")
        led.free(shifted_gradient)
        self.cast_logits_gradient(tag, f"d logits fp32 (slice_backward){tag}")

    def _forward_done(self, tag: str, embedding: bool) -> None:
        """What the base model's forward frees as it returns."""
        led = self.led
        if embedding and not (self.keeps_input_of(0) and self.t.rotary):
            led.free(f"embedding output{tag}")  # under checkpointing it is layer 0's input
        elif embedding and self.stash is not None:
            self.stash.release(f"embedding output{tag}")  # offloaded: inputs_embeds was its last holder
        led.free(f"position embedding output{tag}")
        led.free(f"position ids{tag}")

    def backward(self, one: Pass, last: bool) -> None:
        step, mechanics, runtime, led = self.step, self.mechanics, self.runtime, self.led
        arch, impl, shape, act, t = step.arch, step.impl, step.shape, step.act, self.t
        h = arch.hidden_size
        TV = self.logits.rows * self.logits.columns
        checkpointed = self.checkpointed
        tag, layers, embedding, head = self._part(one)
        led.phase = StepPhase.BACKWARD
        if step.stage is not None:
            mechanics.pipeline_backward(led, one.micro_batch == step.stage.micro_batches - 1)
        autograd_workspace = workspace(runtime, "autograd") if self.cuda else ""
        if head and step.loss.saver:
            led.alloc(f"grad seed{tag}", FP32, LOSS)
            mechanics.pre_backward(led, "root")
            self.saver_loss_backward(tag, autograd_workspace)
            led.event(f"final norm backward{tag}", norm_backward_excess(impl, arch, shape, act), TRANSIENT)
            self.final_unpacked()
            led.free_group(f"final{tag}")
            if self.final_saves()[1]:
                led.free(f"hidden {layers[-1] + 1}{tag}")  # the final norm's saved input
            mechanics.param_grad(led, "root", "final norm", h * (2 if t.norm == "layernorm" else 1))
        elif head:
            led.alloc(f"grad seed{tag}", FP32, LOSS)
            mechanics.pre_backward(led, "root")
            if step.loss is LossImpl.SHIFTED:
                self.shifted_loss_backward(tag)
            elif self.compiled_loss:
                self.compiled_loss_backward(tag)
            elif impl.loss == "fp32_logits":
                # Megatron-LM _VocabParallelCrossEntropy.backward turns the saved softmax into the
                # gradient in place (core/tensor_parallel/cross_entropy.py calculate_gradients)
                led.free(f"total_weight{tag}")
                led.rename(f"log_softmax{tag}", f"d logits fp32 (log_softmax_backward){tag}")
                led.event(f"loss backward (vocab-parallel cross-entropy, in place){tag}")
            else:
                self.cross_entropy_backward(tag, TV, f"d logits fp32 (log_softmax_backward){tag}")
            if not (self.compiled_loss or step.loss is LossImpl.SHIFTED):
                # the compiled loss's fused kernel, the shifted loss's backward made d logits themselves
                self.cast_logits_gradient(tag, f"d logits fp32 (log_softmax_backward){tag}")
            for name, _ in logits_saves(impl, arch, shape, act):
                led.free(f"{name}{tag}")  # tanh_backward has run
            if self.first_step and self.cuda and not led.has(autograd_workspace):
                led.alloc(autograd_workspace, runtime.cublas_workspace, RUNTIME)
            led.alloc(f"d hidden{tag}", self.hidden_bytes, ACTIVATIONS)
            head_weight = "embedding" if arch.tied_embeddings else "lm_head"
            mechanics.param_grad(led, "root", head_weight, _vocab_numel(arch, head_weight))
            led.event(f"lm_head backward{tag}")
            led.free(f"d logits{tag}")
            led.event(f"final norm backward{tag}", self.final_norm_backward_excess(), TRANSIENT)
            self.final_unpacked()
            led.free_group(f"final{tag}")
            if self.final_saves()[1]:
                led.free(f"hidden {layers[-1] + 1}{tag}")  # the final norm's saved input
            mechanics.param_grad(led, "root", "final norm", h * (2 if t.norm == "layernorm" else 1))
        else:
            # the gradient of this stage's output, received from the next stage
            mechanics.pre_backward(led, "root")
            if self.first_step and self.cuda and not led.has(autograd_workspace):
                led.alloc(autograd_workspace, runtime.cublas_workspace, RUNTIME)
            led.alloc(f"d hidden{tag}", step.stage.boundary_bytes, PIPELINE)
            led.event(f"receive output gradient{tag}")
        shared_freed_by = max(layers[0], self.shared_until)  # once: a fine-tuning run's is a whole lookup
        for i in reversed(layers):
            mechanics.pre_backward(led, i)
            saves = self.saves_of(i, use_cache=not checkpointed)
            if self.op:
                # the recompute allocates the saved tensors the SAC storage does not hold, reads the kept
                # outputs (those backward saves no further are freed then), and backward runs as without it
                layer = self.op_layer_of(i)
                led.alloc_group(f"layer {i}{tag}", layer.recomputed, ACTIVATIONS)
                led.event(f"layer {i} recompute (op-level){tag}", layer.forward_excess, TRANSIENT)
                for name in layer.consumed:
                    led.free(f"layer {i}{tag}.{name}")
            elif self.stash is not None:
                self.offloaded_recompute(i, saves)
            elif self.checkpointed_layer(i) and saves.program:
                # the recomputed forward (torch.utils.checkpoint, use_reentrant=False): its output is dropped
                output = f"layer {i} recomputed output{tag}"
                _run_program(led, i, saves.program, 0, output, self.hidden_bytes, "recompute", tag=tag)
                led.free(output)
            elif self.checkpointed_layer(i):
                self.alloc_saves(i, f"layer {i}{tag}", saves.saved)
                self.forward_peak(i, f"layer {i} recompute{tag}", saves)
            backward = self.nodes_of(i)
            if backward.program:
                _run_backward_program(led, mechanics, i, backward.program, tag)
            else:
                casts = (
                    cast_backward_excess(arch, i, self.casts, step.shape.local_tokens, step.act, led.block)
                    if self.eager_casts
                    else 0
                )
                led.event(f"layer {i} backward{tag}", max(saves.backward_excess, casts), TRANSIENT)
            led.free_group(f"layer {i}{tag}")
            j = 0
            while led.has(f"{i}.fp8 saved scale#{j}"):  # the forward's fp8 weights, saved (mechanics)
                led.free(f"{i}.fp8 saved scale#{j}")
                j += 1
            if i == shared_freed_by:
                led.free_group(f"shared{tag}")  # the first layer that keeps the rotary tables is done
            for label, numel in zip(_block_labels(len(backward.rest)), backward.rest, strict=True):
                mechanics.param_grad(led, i, label, numel)
            if backward.first_norm_excess:
                # the first norm's backward, the layer's last: every gradient of the layer exists
                led.event(f"layer {i} first norm backward{tag}", backward.first_norm_excess, TRANSIENT)
            if self.stash is not None and not saves.keeps_input:
                pass  # brought back: freed after the next layer's first node, or at the end of backward
            elif self.keeps_input_of(i) or saves.keeps_input:
                if i > layers[0]:
                    led.free(f"hidden {i}{tag}")
                elif embedding:
                    led.free(f"hidden 0{tag}" if led.has(f"hidden 0{tag}") else f"embedding output{tag}")
            led.event(f"layer {i} gradients{tag}")
            mechanics.post_backward(led, i)

        if embedding:
            # the embedding's backward: a dense [V, h] gradient; a tied weight's two gradients are summed out
            # of place (the autograd engine's InputBuffer holds the LM head's until the embedding's arrives)
            if not t.rotary:
                mechanics.param_grad(led, "root", "position embedding", arch.max_position_embeddings * h)
            mechanics.param_grad(led, "root", "embedding dense", _vocab_numel(arch, "embedding"))
            brought = [p for p in embedding_packs(step) if p.offloaded] if self.stash is not None else []
            for pack in brought:  # the indices, offloaded: a copy brought back on the side stream
                led.alloc(f"{pack.name} (brought back)", pack.nbytes, ACTIVATIONS, stream=OFFLOAD_STREAM)
            led.event(f"embedding backward{tag}")
            for pack in brought:  # freed by the callback at the end of backward
                led.free(f"{pack.name} (brought back)")
            if self._brought_back is not None:
                led.free(self._brought_back)
                self._brought_back = None
            led.free(f"d hidden{tag}")
            if arch.tied_embeddings:
                mechanics.tied_grad_sum(led, _vocab_numel(arch, "embedding"))
                led.event("tied embedding gradient sum")
            for name in ("embedding output", "hidden 0"):
                led.free(f"{name}{tag}")
        else:
            # the gradient of this stage's input, sent to the previous stage
            led.alloc(f"input gradient (sent){tag}", step.stage.boundary_bytes, PIPELINE)
            led.event(f"send input gradient{tag}")
            led.free(f"input gradient (sent){tag}")
            led.free(f"d hidden{tag}")
            led.free(f"received activation{tag}")
        led.free(f"stage output{tag}")
        mechanics.post_backward(led, "root")
        if last:
            mechanics.backward_finished(led)
        led.free(f"grad seed{tag}")  # held by torch.autograd.backward's frame

    # ------------------------------------------------------------ torch.compile's loss
    def compiled_loss_forward(self, tag: str) -> None:
        """The compiled cross-entropy's forward (:func:`~zerocalc.model.code.compiled_loss_saves`): one
        fused reduction kernel; it saves the logits themselves (they stay until its backward), the rows'
        max and log-sum-exp; transformers' loss also its padded labels (``ForCausalLMLoss`` pads, then
        shifts inside the graph) and an fp32 scalar (``nll_loss``'s total weight)."""
        led, step = self.led, self.step
        rows = self.logits.rows
        saves = compiled_loss_saves(rows)
        if self.compiled_whole:
            saves += [("labels padded", INT64 * step.shape.b * (step.shape.s + 1)), ("total_weight", FP32)]
        led.alloc_group(f"compiled loss{tag}", saves, LOSS)
        led.alloc(f"loss{tag}", FP32, LOSS)
        self._losses.append(f"loss{tag}")
        led.event(f"loss forward (compiled cross-entropy){tag}")

    def compiled_loss_backward(self, tag: str) -> None:
        """The compiled cross-entropy's backward: one pointwise kernel writes the logits' gradient in their
        dtype beside an fp32 [rows] buffer (measured: act·rows·V + 4·rows above the saved tensors, torch
        2.13 Inductor, CPU); then its saved tensors and the logits (unless the loop holds them) go."""
        led, step = self.led, self.step
        led.alloc(f"d logits{tag}", self.logits_bytes * self.logits.rows * self.logits.columns, LOSS)
        led.event(f"loss backward (compiled cross-entropy){tag}", FP32 * self.logits.rows, TRANSIENT)
        led.free_group(f"compiled loss{tag}")
        if step.keep_output is OutputKept.NONE:
            led.free(f"logits{tag}")

    def final_norm_backward_excess(self) -> int:
        """The final norm's backward transient (:func:`~zerocalc.model.code.norm_backward_excess`); inside
        transformers' compiled forward a fused kernel's: the input gradient alone (act·rows·h)."""
        step = self.step
        if self.compiled_whole:
            return step.act * step.shape.sequence_tokens * step.arch.hidden_size
        return norm_backward_excess(step.impl, step.arch, step.shape, step.act)

    # ------------------------------------------------------------ activation offloading (torchtune)
    def final_unpacked(self) -> None:
        """The final norm's first backward node unpacked an offloaded tensor: its hook empties the stash."""
        if self.stash is not None and any(p.offloaded for p in self._final_packs()):
            self.stash.clear()

    def _final_packs(self) -> tuple[Pack, ...]:
        final, keeps_last = self.final_saves()
        return final_packs(final, ("last hidden state", self.hidden_bytes) if keeps_last else None)

    def offloaded_recompute(self, i: int, saves: LayerSaves) -> None:
        """Layer ``i``'s recompute under offloading: its input unpacked (used as it is while still in the
        stash, else brought back on the side stream), its first node's hook emptying the stash and freeing
        the previous layer's input brought back (``bwd_tensor_stash``); an input its recomputed ops save
        (``saves.keeps_input``) is freed with them, at the layer's end, as without offloading."""
        assert self.stash is not None
        led, name = self.led, self.layer_input(i)
        if not self.stash.holds(name):
            led.alloc(name, self.hidden_bytes, ACTIVATIONS, stream=OFFLOAD_STREAM)
        if saves.program:
            output = f"layer {i} recomputed output"
            _run_program(led, i, saves.program, 0, output, self.hidden_bytes, "recompute")
            led.free(output)
        else:
            self.alloc_saves(i, f"layer {i}", saves.saved)
            self.forward_peak(i, f"layer {i} recompute", saves)
        self.stash.clear()
        if self._brought_back is not None:
            led.free(self._brought_back)
        self._brought_back = None if saves.keeps_input else name

    # ------------------------------------------------------------------ the savers' losses (--loss)
    @property
    def head_trained(self) -> bool:
        """The LM head's weight is trained (its own, or the embedding it is tied to)."""
        tuning, arch = self.step.tuning, self.step.arch
        if tuning is None:
            return True
        return "lm_head" in tuning.trained or (arch.tied_embeddings and "embed_tokens" in tuning.trained)

    def _labels(self, tag: str) -> None:
        """The labels padded with −100 and shifted (``ForCausalLMLoss``; Liger's ``LigerForCausalLMLoss``
        pads and shifts alike): a copy of b·s where b > 1, a view of the padded labels where b = 1; the
        padded labels live until the loss returns."""
        led, shape = self.led, self.step.shape
        led.alloc(f"labels padded{tag}", INT64 * shape.b * (shape.s + 1), LOSS)
        if shape.b > 1 or shape.cp > 1:
            led.alloc(f"shift labels{tag}", INT64 * self.logits.rows, LOSS)
        else:
            led.rename(f"labels padded{tag}", f"shift labels{tag}")

    def chunk_rows(self) -> tuple[int, ...]:
        """The rows of each chunk of the saver's loss: torchtune's output chunks, Liger's token chunks."""
        step, logits = self.step, self.logits
        if step.loss is LossImpl.CHUNKED:
            return chunked_rows(step.shape.b, logits.rows // step.shape.b, step.loss_chunks)
        return liger_chunk_rows(logits.rows, logits.columns, step.arch.hidden_size)

    def saver_loss_forward(self, tag: str) -> None:
        """The forward of ``--loss chunked`` or ``fused-linear`` (:mod:`zerocalc.model.code.loss`)."""
        step, led = self.step, self.led
        V, h, L = self.logits.columns, step.arch.hidden_size, self.logits.rows
        if step.loss is LossImpl.CHUNKED:
            # TransformerDecoder.chunked_output: [self.output(chunk) for chunk in h.tensor_split(n, dim=1)]
            rows = self.chunk_rows()
            for j, r in enumerate(rows):
                led.alloc(f"logits output chunk{j}{tag}", self.logits_bytes * r * V, LOSS)
            for name, b in logits_saves(step.impl, step.arch, step.shape, step.act):
                led.alloc(f"{name}{tag}", b, LOSS)
            self._labels(tag)
            # CEWithChunkedOutputLoss.forward: (labels != ignore_index).sum(), then chunk by chunk
            led.event(f"loss forward (labels mask){tag}", L, TRANSIENT)
            led.alloc(f"loss{tag}", FP32, LOSS)
            self._losses.append(f"loss{tag}")
            for j, r in enumerate(rows):
                led.alloc(f"logits fp32 copy{tag}", self.upcast_bytes * r * V, LOSS)
                led.alloc(f"log_softmax output chunk{j}{tag}", FP32 * r * V, LOSS)
                led.alloc(f"total_weight output chunk{j}{tag}", FP32, LOSS)
                led.event(f"loss forward (output chunk{j}: log_softmax, nll_loss){tag}")
                led.free(f"logits fp32 copy{tag}")
            led.free(f"labels padded{tag}")
            led.free("previous step's loss")
            return
        # fused_linear_cross_entropy_forward: grad_input (and grad_weight) made here, saved for backward
        self._labels(tag)
        led.alloc(f"grad_input (fused linear cross-entropy){tag}", self.stream * L * h, LOSS)
        if self.head_trained:
            led.alloc(f"grad_weight (fused linear cross-entropy){tag}", self.logits_bytes * V * h, LOSS)
        led.alloc(f"loss_1d{tag}", FP32 * L, LOSS)
        led.alloc(f"target_mask{tag}", L, LOSS)
        # torch.mm(grad_logits_chunk.t(), _input_chunk).float(): [V, h] in the logits' dtype and its fp32
        # copy, before the in-place add into grad_weight
        weight_grad = 0
        if self.head_trained:
            weight_grad = (self.logits_bytes + FP32 if self.logits_bytes != FP32 else FP32) * V * h
        rows = self.chunk_rows()
        for j, r in enumerate(rows):
            if j and r == rows[0]:
                continue  # an equal chunk: the same tensors again
            led.alloc(f"logits chunk{tag}", self.logits_bytes * r * V, LOSS)
            led.event(
                f"loss forward (fused linear cross-entropy, {'a' if j == 0 else 'the last'} chunk){tag}",
                max(self.stream * r * h, weight_grad),
                TRANSIENT,
            )
            led.free(f"logits chunk{tag}")
        led.free(f"target_mask{tag}")
        led.alloc(f"loss{tag}", FP32, LOSS)
        self._losses.append(f"loss{tag}")
        led.free(f"loss_1d{tag}")
        led.free(f"shift labels{tag}")  # the function saves only the gradients
        led.free(f"labels padded{tag}")
        led.free("previous step's loss")

    def free_logits(self, tag: str) -> None:
        """The training loop drops the logits before backward (torchtune's recipes, ``_loss_step``: ``del
        outputs``, "free outputs otherwise it peaks backward memory")."""
        for j in range(len(self.chunk_rows())):
            self.led.free(f"logits output chunk{j}{tag}")

    def saver_loss_backward(self, tag: str, autograd_workspace: str) -> None:
        """The backward of ``--loss chunked`` or ``fused-linear`` down to the gradient of the final norm's
        output (``d hidden``), the LM head's weight gradient made (:mod:`zerocalc.model.code.loss`)."""
        step, led, mechanics, runtime = self.step, self.led, self.mechanics, self.runtime
        arch = step.arch
        V, h = self.logits.columns, arch.hidden_size
        head_weight = "embedding" if arch.tied_embeddings else "lm_head"
        if self.first_step and self.cuda and not led.has(autograd_workspace):
            led.alloc(autograd_workspace, runtime.cublas_workspace, RUNTIME)
        if step.loss is LossImpl.FUSED_LINEAR:
            # LigerFusedLinearCrossEntropyFunction.backward scales the saved gradients in place and returns
            # them: grad_input is the final norm's output gradient, grad_weight the head's (AccumulateGrad
            # takes the tensor)
            led.rename(f"grad_input (fused linear cross-entropy){tag}", f"d hidden{tag}", ACTIVATIONS)
            led.free(f"grad_weight (fused linear cross-entropy){tag}")
            mechanics.param_grad(led, "root", head_weight, _vocab_numel(arch, head_weight))
            led.event(f"loss backward (fused linear cross-entropy: the forward's gradients){tag}")
            return
        rows = self.chunk_rows()
        # every chunk's loss nodes run before any output projection's (the engine runs the ready node of
        # the highest sequence number first): the last chunk first
        for j in reversed(range(len(rows))):
            r = rows[j]
            led.alloc(f"d log_softmax (nll_loss_backward){tag}", FP32 * r * V, LOSS)
            led.free(f"total_weight output chunk{j}{tag}")
            led.alloc(f"d logits fp32 (log_softmax_backward){tag}", FP32 * r * V, LOSS)
            led.event(f"loss backward (output chunk{j}: log_softmax_backward){tag}")
            led.free(f"log_softmax output chunk{j}{tag}")
            led.free(f"d log_softmax (nll_loss_backward){tag}")
            if self.logits_bytes != FP32:
                led.alloc(f"d logits output chunk{j}{tag}", self.logits_bytes * r * V, LOSS)
                led.event(f"logits.float() backward (output chunk{j}){tag}")
                led.free(f"d logits fp32 (log_softmax_backward){tag}")
            else:
                led.rename(f"d logits fp32 (log_softmax_backward){tag}", f"d logits output chunk{j}{tag}")
        led.free(f"shift labels{tag}")
        for name, _ in logits_saves(step.impl, arch, step.shape, step.act):
            led.free(f"{name}{tag}")
        # each chunk's output projection: d h of the chunk, the head's weight gradient (the first made, the
        # others added into it); then tensor_split's slice backward writes each into a zero [b, s, h],
        # summed into the first in place
        weight_grad = self.logits_bytes * V * h if self.head_trained else 0
        for k, j in enumerate(reversed(range(len(rows)))):
            led.alloc(f"d hidden output chunk{j}{tag}", self.stream * rows[j] * h, ACTIVATIONS)
            if k == 0:
                mechanics.param_grad(led, "root", head_weight, _vocab_numel(arch, head_weight))
                led.event(f"lm_head backward (output chunk{j}){tag}")
            else:
                led.event(
                    f"lm_head backward (output chunk{j}, its weight gradient added){tag}",
                    weight_grad,
                    TRANSIENT,
                )
            led.free(f"d logits output chunk{j}{tag}")
        for k, j in enumerate(reversed(range(len(rows)))):
            if k == 0:
                led.alloc(f"d hidden{tag}", self.hidden_bytes, ACTIVATIONS)
                led.event(f"slice backward (output chunk{j}){tag}")
            else:
                led.event(f"slice backward (output chunk{j}, added){tag}", self.hidden_bytes, TRANSIENT)
            led.free(f"d hidden output chunk{j}{tag}")

    def release_output(self) -> None:
        """At the step's end the loop drops the output it held (``--keep-output step``) or keeps it as the
        previous output until the next forward returns (``next``); under ``none`` it is gone already."""
        if self.step.keep_output is OutputKept.STEP:
            self.led.free("logits")
        elif self.step.keep_output is OutputKept.NEXT:
            self.led.rename("logits", HELD_LOGITS)

    def keep_last_loss(self) -> None:
        """The last micro-batch's loss becomes the previous step's; the others' are dropped."""
        for name in self._losses[:-1]:
            self.led.free(name)
        if self._losses:
            self.led.rename(self._losses[-1], "previous step's loss")


def final_saves(step: StepShape) -> tuple[list[tuple[str, int]], bool]:
    """The final norm's saves and the LM head's input, and whether the last hidden state is kept for the
    final norm's backward (a LayerNorm's input; a fine-tuning run's fp32 stream, which the RMSNorm's
    ``to(float32)`` returns itself: :func:`~zerocalc.model.code.tuned_final_saves`)."""
    if step.tuning is None:
        final = step.impl.final_saves(step.arch, step.shape, step.act, step.device)
        return list(final), traits(step.arch).norm == "layernorm"
    return tuned_final_saves(step.arch, step.shape, step.act, step.device, step.tuning)


def embedding_packs(step: StepShape) -> tuple[Pack, ...]:
    """What the embedding packs under offloading: its indices where its weight is trained (the batch's
    input ids, which the batch still holds on the GPU)."""
    if step.tuning is not None and "embed_tokens" not in step.tuning.trained:
        return ()
    return (Pack("input ids (embedding indices)", INT64 * step.shape.tokens, None),)


def offloaded_host_bytes(step: StepShape) -> int:
    """Pinned host bytes of one micro-batch's offloaded tensors (``--offload-activations``): every pack
    of at least 1024 bytes has its own copy, alive to its unpack in backward — the embedding's indices,
    each layer's checkpoint input, the final norm's saves (:mod:`zerocalc.peak.offload`)."""
    final, keeps_last = final_saves(step)
    hidden = hidden_bytes(step.arch, step.shape, stream_bytes(step.tuning, step.act))
    if step.loss is LossImpl.FUSED_LINEAR:
        final = [(name, b) for name, b in final if name != "LM head input"]
    packs = (
        *embedding_packs(step),
        *(Pack(f"hidden {i}", hidden, None) for i in range(step.arch.num_layers)),
        *final_packs(final, ("last hidden state", hidden) if keeps_last else None),
    )
    return sum(p.nbytes for p in packs if p.offloaded)


def _allocated_vocab(arch: Architecture, impl: ModelCode) -> int | None:
    """The vocabulary the output layer allocates: Megatron-LM's padded one under tensor parallelism
    (:attr:`~zerocalc.model.architecture.TensorParallelRank.padded_vocab`), else the model's."""
    if isinstance(arch, TensorParallelRank) and impl.pads_vocab:
        return arch.padded_vocab
    return None


def _vocab_numel(arch: Architecture, module: str) -> int:
    """Elements of the rank's embedding (``embedding``) or untied LM head (``lm_head``) weight."""
    name = "embed_tokens" if module == "embedding" else "lm_head"
    tensors = embedding_tensors(arch) if module == "embedding" else head_tensors(arch)
    return next(t.numel for t in tensors if t.module == name)


class ProgramEffect(NamedTuple):
    """What a layer's program leaves in a ledger (:func:`_run_program`), above what was allocated before
    it."""

    peak: int
    """The bytes the program has allocated at its event."""
    saved: int
    """The bytes of its tensors left in the layer's group (the saved tensors and SDPA's philox state)."""
    output: bool
    """It allocates the layer's output."""


class ProgramRun(NamedTuple):
    """A layer's program as :func:`_run_program` runs it: its event, and its effect."""

    at: int
    """The index of the op after which the most is allocated (the first such), SDPA's philox state left
    out: the layer's event."""
    effect: ProgramEffect | None
    """None where the program leaves a tensor alive outside the layer's group (none of
    :meth:`~zerocalc.model.code.base.ModelCode.forward_program`'s does)."""


class Program(tuple[tuple[str, str, int], ...]):
    """A layer's forward op by op (:attr:`~zerocalc.model.code.LayerSaves.program`), its runs
    (:class:`ProgramRun`) kept per (philox bytes, output bytes, checkpointing, allocator block): a step
    runs a layer's program once per layer, and a plan's steps run the same programs thousands of times."""

    def __init__(self, _ops: tuple[tuple[str, str, int], ...] = ()) -> None:
        self._runs: dict[tuple[int, int, bool, int], ProgramRun] = {}

    def run(self, rng: int, output_bytes: int, checkpointed: bool, block: int) -> ProgramRun:
        key = (rng, output_bytes, checkpointed, block)
        run = self._runs.get(key)
        if run is None:  # by content: an earlier search's steps may have run an equal program
            run = self._runs[key] = _program_run(self, rng, output_bytes, checkpointed, block)
        return run


def _run_program(
    led: Ledger,
    i: int,
    program: Program,
    rng: int,
    output: str,
    output_bytes: int,
    label: str = "forward",
    checkpointed: bool = False,
    tag: str = "",
) -> None:
    """Layer ``i``'s forward op by op: the saved tensors in its group, the intermediates freed where the
    code drops them, SDPA's philox seed and offset (``rng`` bytes) with the saved tensors, the output where
    the program writes it; the layer's event where the most is allocated. ``checkpointed``: the forward of
    a layer under ``torch.utils.checkpoint`` (``use_reentrant=False``), whose saved tensors are freed where
    the code releases them. ``tag`` names one micro-batch's tensors apart from another's (a pipeline rank
    holds several).

    A ledger that keeps no allocation log (no allocator replay reads its tensors one by one) is given the
    program's effect instead (:class:`ProgramEffect`): the same event, the same bytes left in the group
    and the same output."""
    group = f"layer {i}{tag}"
    run = program.run(rng, output_bytes, checkpointed, led.block)
    effect = run.effect
    if effect is not None and not led.record:
        led.event(f"layer {i} {label}{tag}", effect.peak, ACTIVATIONS)
        led.alloc(f"{group}.saved", effect.saved, ACTIVATIONS, group=group)
        if effect.output:
            led.alloc(output, output_bytes, ACTIVATIONS)
        return
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
        if at == run.at:
            led.event(f"layer {i} {label}{tag}")


@lru_cache(maxsize=1024)
def _program_run(
    program: tuple[tuple[str, str, int], ...], rng: int, output_bytes: int, checkpointed: bool, block: int
) -> ProgramRun:
    """The program's event and effect (:class:`ProgramRun`), its ops taken as :func:`_run_program` takes
    them one by one, each tensor rounded up to ``block`` bytes."""

    def rounded(nbytes: int) -> int:
        return 0 if nbytes <= 0 else -(-nbytes // block) * block

    held: dict[str, int] = {}
    """Each tensor's rounded bytes (its first allocation's), as the event's op is chosen."""
    for verb, name, nbytes in program:
        if (verb == "keep" or verb == "temp") and name not in held:
            held[name] = rounded(nbytes)
    live: dict[str, tuple[int, bool]] = {}
    """Per tensor alive, its bytes and whether it is in the layer's group."""

    def alloc(name: str, size: int, grouped: bool) -> int:
        if size:
            if name in live:
                raise KeyError(f"{name} is already allocated")
            live[name] = (size, grouped)
        return size

    at = len(program) - 1
    total = best = allocated = peak = 0
    """``total``: as the event is chosen (SDPA's philox state left out); ``allocated``: as allocated."""
    output = False
    for index, (verb, name, nbytes) in enumerate(program):
        if verb == "keep" or verb == "temp":
            size = rounded(nbytes)
            total += size
            allocated += alloc(name, size, verb == "keep" and not checkpointed)
            if verb == "keep" and not checkpointed and name.startswith("softmax log-sum-exp"):
                allocated += alloc("sdpa rng", rounded(rng), True)
        elif verb == "drop" or (verb == "release" and checkpointed):
            total -= held[name]
            allocated -= live.pop(name, (0, False))[0]
        elif verb == "output":
            size = rounded(output_bytes)
            total += size
            allocated += size
            output = True
        if total > best:
            best, at, peak = total, index, allocated
    if best == 0:
        peak = allocated  # the last op's
    if any(not grouped for _, grouped in live.values()):
        return ProgramRun(at, None)
    return ProgramRun(at, ProgramEffect(peak, sum(size for size, _ in live.values()), output))


def _run_backward_program(
    led: Ledger, mechanics: StepHooks, i: int, program: tuple[Op, ...], tag: str = ""
) -> None:
    """Layer ``i``'s backward nodes op by op (:func:`~zerocalc.peak.layer_nodes.experts_backward_program`):
    gradients and intermediates as transients, the layer's saved tensors freed from its group where their
    last node has run, each weight's gradient through the mechanics (the unit's unsharded gradient); an
    event after each allocation (consecutive events of one name: one line of the condensed timeline)."""
    group = f"layer {i}{tag}"
    event = f"layer {i} experts backward{tag}"
    alloc, free, record, param_grad = led.alloc, led.free, led.event, mechanics.param_grad  # ~10² ops a layer
    for verb, name, size in program:
        if verb == "temp":
            alloc(f"{group} backward.{name}", size, TRANSIENT)
        elif verb == "drop":
            free(f"{group} backward.{name}")
            continue
        elif verb == "free":
            free(f"{group}.{name}")
            continue
        else:  # grad
            param_grad(led, i, name, size)
        record(event)


HELD_LOGITS = "previous output's logits"
"""The logits of the output a ``--keep-output next`` loop still holds when the next step begins."""


def logits_shard(step: StepShape) -> VocabShard:
    """The rank's logits: its tokens × its vocabulary columns (the output layer's allocated vocabulary)."""
    return vocab_shard(step.impl, step.arch, step.shape, vocab=_allocated_vocab(step.arch, step.impl))


def held_logits_bytes(step: StepShape) -> int:
    """The bytes of the logits a loop holds (``--keep-output``): :func:`logits_shard` in the LM head's
    dtype (the hidden stream's: fp32 under ``prepare_model_for_kbit_training``)."""
    shard = logits_shard(step)
    if step.loss is LossImpl.SHIFTED:  # logits.float() in the model's forward
        return FP32 * shard.rows * shard.columns
    return stream_bytes(step.tuning, step.act) * shard.rows * shard.columns


def workspace(runtime: Runtime, thread: str) -> str:
    """The name of the BLAS workspace of the ``forward`` or ``autograd`` thread's handle."""
    return f"{runtime.blas} workspace ({thread} thread)"


def steady_start(step: StepShape, mechanics: StepHooks, runtime: Runtime | None, led: Ledger) -> None:
    """What is allocated at the start of a step after the first: the mechanics' resident state, the input
    ids (= labels), the previous loss, model buffers and the runtime's workspaces."""
    mechanics.resident(led)
    _inputs(step, led)
    led.alloc("previous step's loss", FP32, LOSS)
    if step.keep_output is OutputKept.NEXT:
        led.alloc(HELD_LOGITS, held_logits_bytes(step), LOSS)
    if runtime is not None and step.device is Device.CUDA:
        led.alloc(workspace(runtime, "forward"), runtime.cublas_workspace, RUNTIME)
        led.alloc(workspace(runtime, "autograd"), runtime.cublas_workspace, RUNTIME)
        _runtime_extras(step, runtime, led)


def _inputs(step: StepShape, led: Ledger) -> None:
    arch = step.arch
    t = traits(arch)
    if t.rotary and step.impl.transformers_modules:
        d = arch.latent_attention.qk_rope_head_dim if arch.latent_attention else arch.dim_per_head
        # the rotary embedding's inv_freq and original_inv_freq buffers (fp32 [d/2]), per table
        for table in ("", " (global)")[: t.rotary_tables]:
            led.alloc(f"rotary inv_freq{table}", 2 * d, INPUTS)
            led.alloc(f"rotary original_inv_freq{table}", 2 * d, INPUTS)
    if t.embedding_scale_buffer and step.impl.transformers_modules:
        led.alloc("embedding scale buffer (fp32 0-dim)", FP32, INPUTS)
    led.alloc("input ids (= labels)", INT64 * step.shape.local_tokens, INPUTS)


def _runtime_extras(step: StepShape, runtime: Runtime, led: Ledger) -> None:
    led.alloc("unattributed at step start", runtime.start_extra, RUNTIME)
    if step.recompute in (Recompute.FULL, Recompute.OP):  # both run torch.utils.checkpoint
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
    tied = step.impl.transformers_modules and arch.tied_embeddings
    mechanics.create(
        led, init, element_bytes, element_bytes * arch.vocab_size * arch.hidden_size if tied else 0
    )
    _inputs(step, led)
    if runtime is not None and step.device is Device.CUDA:
        _runtime_extras(step, runtime, led)
