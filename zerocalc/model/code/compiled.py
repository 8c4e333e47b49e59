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

from zerocalc.model.code.base import FP32


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


# ---- what a compiled step saves (measured: torch 2.13 Inductor on the CPU, zerocalc/validate/compiled.py)
#
# AOTAutograd traces each compiled region's forward and backward as one joint graph, and Inductor's
# partitioner (torch 2.13 ``_functorch/partitioners.py::min_cut_rematerialization_partition``, called by
# ``_inductor/compile_fx.py``) chooses which forward values the backward graph receives: a min cut of the
# joint graph where the ops it may recompute are the cheap ones (pointwise, views, reductions; never a
# matmul or an attention kernel: ``is_fusible``/``should_ban_recomputation``). What it saves instead of what
# eager autograd saves, per dense Llama block (nn.RMSNorm or transformers' LlamaRMSNorm, SwiGLU, SDPA):
#
# * each RMSNorm: its input and rstd (fp32 [rows, 1]); the fp32 copy and the normalised tensor of
#   transformers' ``LlamaRMSNorm`` are recomputed from them in the backward's fused kernel;
# * the norm's output (the q/k/v and gate/up matmuls' input), q and k after the rotary embedding, v, the
#   attention output and log-sum-exp (what SDPA's backward, an extern kernel, reads);
# * the o projection's output in place of the mid residual (``x + wo(...)``, recomputed from it and the
#   block's input): the same bytes;
# * the gate and up outputs and their product (the down projection's input); ``silu(gate)`` is recomputed.
#
# Under checkpointing the partitioner honours the region's policy (torch.utils.checkpoint under
# torch.compile: ``tag_activation_checkpoint``; recomputable nodes are ``PREFER_RECOMPUTE``): full, the
# block's input only; torchtitan's op-level policy, its MUST_SAVE outputs that the backward reads — the
# down projection's output, which eager SAC caches for the recompute's replay, is read by no backward node
# and is not kept.

COMPILED_RECOMPUTED = frozenset({"activation output"})
"""The eager saves of a dense Llama block the partitioner recomputes in the backward instead (SwiGLU's
``silu(gate)``); transformers' RMSNorm fp32 copies are rewritten whole (:func:`compiled_layer_saves`)."""


def compiled_layer_saves(
    saved: tuple[tuple[str, int], ...],
    repeats_kv: bool,
    a_width: int,
    act: int,
    rows: int,
    width: int,
    fp8: bool = False,
) -> tuple[tuple[str, int], ...]:
    """The saved tensors of a compiled dense Llama block, from the eager ones (``saved``, named as
    :func:`~zerocalc.model.code.layer.module_layer` names them): each norm's input (act·``rows``·``width``)
    and rstd (fp32 [rows, 1]) in place of what its eager ops keep (transformers' ``x.float()`` copy and
    normalised tensor), without :data:`COMPILED_RECOMPUTED`; with ``repeats_kv`` (transformers' code) k and
    v repeated to every query head (``a_width`` = a·d columns: under tracing
    ``masking_utils._ignore_causal_mask_sdpa`` keeps the causal mask, so ``sdpa_attention.
    use_gqa_in_sdpa`` is False and ``repeat_kv`` runs), not the cache's copies. ``fp8``: every linear
    of the block torchao's ``Float8Linear`` (tensorwise), whose fp8 inputs are casts of pointwise results:
    :data:`COMPILED_FP8_RECOMPUTED` are recomputed too."""
    out: list[tuple[str, int]] = []
    recomputed = COMPILED_RECOMPUTED | (COMPILED_FP8_RECOMPUTED if fp8 else frozenset())
    for name, nbytes in saved:
        term = name.split(":")[0]
        if term in recomputed:
            continue
        if term in NORMS:
            if not any(n.startswith(f"{term}:") for n, _ in out):
                out += [(f"{term}: input", act * rows * width), (f"{term}: rstd (fp32)", FP32 * rows)]
            continue
        if repeats_kv and term in ("k", "v"):
            nbytes = act * rows * a_width
        out.append((name, nbytes))
    return tuple(out)


COMPILED_FP8_RECOMPUTED = frozenset(
    {"attention input (norm output)", "MLP input (norm output)", "activation × up (down input)"}
)
"""Under torchao's ``Float8Linear`` (tensorwise) the matmuls read fp8 casts of these (``hp_tensor_to_
float8_dynamic``: a pointwise cast and an amax), which the partitioner recomputes in the backward from the
norms' inputs and rstd and from gate and up, rather than keep them (measured, torch 2.13 Inductor, torchao
0.18, CPU); the casts' 0-dim amax and scales it keeps (2 and 4 B each) are left out."""

NORMS = ("attention norm", "MLP norm")
"""The dense Llama block's norms, as :func:`~zerocalc.model.code.layer.module_layer` names their terms."""


COMPILED_OP_UNREAD = frozenset({"down_proj output", "down_proj reduce-scatter output"})
"""The op-level policy's MUST_SAVE outputs no backward node of the compiled block reads: w2's (the
row-parallel partial sum under TP) and, under sequence parallelism, its reduce-scatter's (the block's
output less the mid residual)."""


def compiled_op_kept(kept: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """torchtitan's op-level policy under compile: its MUST_SAVE outputs but :data:`COMPILED_OP_UNREAD`
    (measured: the compiled forward returns wq's, wv's and w1's outputs and the flash kernel's output and
    log-sum-exp; under torchtitan's TP plan with sequence parallelism wo's reduce-scatter output too, on
    the sequence shard, :mod:`zerocalc.validate.compiled_tp`)."""
    return tuple(item for item in kept if item[0] not in COMPILED_OP_UNREAD)


def compiled_loss_saves(rows: int) -> list[tuple[str, int]]:
    """What ``torch.compile(cross_entropy_loss)`` keeps beyond its inputs (the logits and the labels, which
    it saves themselves): the rows' max and log-sum-exp, fp32 [rows, 1] each; the ``.float()`` upcast,
    ``log_softmax`` and ``nll_loss`` are one fused reduction kernel, and the backward one pointwise kernel
    writing the logits' gradient in their dtype. Measured (torch 2.13 Inductor, CPU): torchtitan's
    ``cross_entropy_loss`` and transformers' ``ForCausalLMLoss`` inside the compiled model alike."""
    return [("loss row max (fp32)", FP32 * rows), ("loss log-sum-exp (fp32)", FP32 * rows)]


def compiled_final_saves(
    final: list[tuple[str, int]], act: int, rows: int, width: int
) -> list[tuple[str, int]]:
    """The final norm's and the LM head's saves inside a compiled whole forward (transformers' code): the
    norm's input and rstd in place of what its eager ops keep (as in each block,
    :func:`compiled_layer_saves`), the LM head's input as eager."""
    out = [(n, b) for n, b in final if not n.startswith("final norm:")]
    return [("final norm: input", act * rows * width), ("final norm: rstd (fp32)", FP32 * rows), *out]


def traced_mask_saves(b: int, s: int, act: int) -> list[tuple[str, int]]:
    """What the layers of a compiled transformers model share for backward: the causal mask
    [b, 1, s, s] in the compute dtype, which ``masking_utils._ignore_causal_mask_sdpa`` keeps under tracing
    (``is_tracing``) and every layer's SDPA saves; the rotary cos and sin are recomputed from
    ``inv_freq`` (a buffer) in the backward graph."""
    return [("causal mask (built under tracing)", act * b * s * s)]
