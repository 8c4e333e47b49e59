"""What tensor, context and expert parallelism change inside a layer: the combinations a code cannot run,
and the buffers they hold for a moment. What every code shares is here; what a code's own plan or kernels
do is its record's (:meth:`~zerocalc.model.code.base.ModelCode.tensor_parallel_unsupported`,
``tensor_parallel_transients``, ``context_parallel_transients``, :attr:`~zerocalc.model.code.base.ModelCode.
ulysses`)."""

from __future__ import annotations

from zerocalc.model.activations import CpImpl
from zerocalc.model.architecture import Architecture, MlpKind, QkNorm
from zerocalc.model.code.base import FP32, ModelCode, Transient, Ulysses
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def parallel_unsupported(impl: ModelCode, arch: Architecture, shape: Shape, flash: bool) -> str | None:
    """Why the model code cannot run ``arch`` under ``shape``'s tensor and context parallelism, as one
    sentence; None when it can.

    * heads, key/value heads and the MLP width divide by t (Megatron-LM ``num_query_groups % t``;
      ``ColwiseParallel`` splits whole heads), s by c, and s/c by t under sequence parallelism;
    * context parallelism runs in fused attention only (TE's ``attn_forward_func_with_cp``, torch's
      ``_context_parallel`` dispatch of SDPA's flash and efficient kernels);
    * Ulysses splits the attention heads per tensor-parallel rank over c, and as the code runs it
      (:attr:`~zerocalc.model.code.base.ModelCode.ulysses`);
    * the code's tensor-parallel plan (:meth:`~zerocalc.model.code.base.ModelCode.
      tensor_parallel_unsupported`).
    """
    t, c = shape.tp, shape.cp
    checks = [
        (arch.num_heads, t, "attention heads"),
        (arch.kv_heads, t, "key/value heads"),
        (arch.intermediate_size, t, "the MLP width"),
        (shape.s, c, "the sequence length"),
    ]
    for total, parts, what in checks:
        if total % parts:
            return f"{what} ({total}) is not divisible by {parts}"
    if shape.sequence_parallel and shape.local_tokens % t:
        return f"b·s/c ({shape.local_tokens}) is not divisible by {t} for sequence parallelism"
    if c > 1 and not flash:
        return "context parallelism needs flash attention (fused kernels keep no s × s tensor)"
    if c > 1 and shape.cp_impl is CpImpl.ULYSSES:
        a, kv = arch.num_heads // t, arch.kv_heads // t
        if a % c:
            return f"Ulysses needs the {a} attention heads per tensor-parallel rank divisible by {c}"
        if impl.ulysses is Ulysses.SPLITS_KV and kv % c:
            return f"Ulysses needs the {kv} key/value heads per tensor-parallel rank divisible by {c}"
        if impl.ulysses is Ulysses.NONE:
            return f"{impl.name.value}'s context parallelism is ring or all-gather attention, not Ulysses"
    if t > 1:
        return impl.tensor_parallel_unsupported(arch, shape)
    return None


def dense_plan_unsupported(impl: ModelCode, arch: Architecture) -> str | None:
    """Why ``arch`` is not the dense tensor-parallel plan modelled for the codes built from PyTorch modules
    (``hf``, ``torchtitan``: q/k/v and gate/up colwise, o and down rowwise, :mod:`zerocalc.model.code`);
    None when it is. transformers' other plans gather or pack their outputs (Phi-3, OLMo 2, GPT-NeoX),
    GPT-2 and Falcon have none; mixture-of-experts and latent-attention plans are not modelled here."""
    if arch.is_moe:
        return f"{impl.name.value} code's tensor parallelism of mixture-of-experts layers is not modelled"
    if (
        arch.latent_attention is not None
        or arch.fused_qkv
        or arch.fused_gate_up
        or arch.qk_norm is QkNorm.FULL
        or traits(arch).qkv_views_kept
        or arch.mlp is not MlpKind.SWIGLU
    ):
        return (
            f"{impl.name.value} code's tensor-parallel plan for this architecture is not the dense "
            "colwise q/k/v, gate/up and rowwise o/down plan that is modelled"
        )
    return None


def parallel_transients(
    impl: ModelCode, arch: Architecture, index: int, shape: Shape, act: int
) -> tuple[Transient, ...]:
    """The moments inside one layer where tensor, context or expert parallelism holds buffers above the
    layer's saved tensors, on one rank; :func:`~zerocalc.model.code.layer.layer_saves` takes the largest of
    each phase into ``forward_excess`` / ``backward_excess`` (the timeline counts them above all of the
    layer's saved tensors: at most the MLP's saved tensors more than the moment holds). Derived from the
    source, not measured:

    * expert parallelism, in a mixture-of-experts layer (Megatron-LM ``core/transformer/moe/
      token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``, torchtitan ``ExpertParallel``): forward, the
      rank's S = k·L permuted tokens while the dispatch all-to-all sends them (what it receives is the
      experts' saved input); backward, the combine's output gradient sent (S rows) and received
      (:meth:`Shape.expert_rows`); L the rank's b·s/c tokens, its sequence shard b·s/(c·t) under tensor
      and sequence parallelism (Megatron-LM core 0.20.0: the MoE layer routes the [s/t, b, h] hidden
      states, ``moe_layer.py``);
    * tensor parallelism: the code's (:meth:`~zerocalc.model.code.base.ModelCode.
      tensor_parallel_transients`);
    * Ulysses context parallelism (Transformer Engine ``AttnFuncWithCPAndQKVOA2A``, DeepSpeed
      ``UlyssesSPAttentionHF``): the caller's q, k, v from before the all-to-all beside the ones after it,
      and in backward the gradients before their all-to-all back;
    * ring and all-gather context parallelism: the code's (:meth:`~zerocalc.model.code.base.ModelCode.
      context_parallel_transients`).
    """
    L, h = shape.local_tokens, arch.hidden_size
    out: list[Transient] = []
    if shape.ep > 1 and arch.is_moe_layer(index):
        pairs = shape.sequence_tokens * arch.experts_per_token
        out.append(Transient("forward", "dispatch all-to-all: the permuted tokens sent", act * pairs * h))
        both = act * (pairs + shape.expert_rows(pairs)) * h
        out.append(Transient("backward", "combine all-to-all backward: the gradient sent and received", both))
    if shape.tp > 1:
        out += impl.tensor_parallel_transients(arch, shape, act)
    if shape.cp == 1:
        return tuple(out)
    if shape.cp_impl is CpImpl.ULYSSES:
        q_width, kv_width = head_widths(arch, shape)
        qkv = act * L * (q_width + 2 * kv_width)
        out.append(Transient("forward", "q, k, v before the all-to-all", qkv))
        out.append(Transient("backward", "q, k, v gradients before the all-to-all back", qkv))
    else:
        out += impl.context_parallel_transients(arch, shape, act)
    return tuple(out)


def head_widths(arch: Architecture, shape: Shape) -> tuple[int, int]:
    """The columns of q and of each of k and v on one tensor-parallel rank: a/t·d and kv/t·d."""
    d = arch.dim_per_head
    return shape.split(arch.num_heads, "attention heads") * d, shape.split(
        arch.kv_heads, "key/value heads"
    ) * d


def torch_context_parallel_transients(arch: Architecture, shape: Shape, act: int) -> tuple[Transient, ...]:
    """Ring and all-gather context parallelism in torch (``hf`` through accelerate, ``torchtitan``):
    ``distributed/tensor/experimental/_context_parallel/_attention.py`` (``_templated_ring_attention``,
    ``convert_to_f32``): the ``alltoall`` rotater (ring) holds the chunk in use, the copy it sends and the
    one it receives (min(c, 3)·kv, kv = 2·act·L·h_kv/t the rank's K and V), the ``allgather`` rotater the
    local copy and all of K/V ((c + 1)·kv); both merge the output in fp32 (4·L·a/t·d); in backward the same
    K/V, fp32 accumulators for dq, dk, dv and the fp32 dK/dV chunk sent and received. Derived from the
    source, not measured."""
    L, c = shape.local_tokens, shape.cp
    q_width, kv_width = head_widths(arch, shape)
    kv = 2 * act * L * kv_width
    held = min(c, 3) * kv if shape.cp_impl is CpImpl.RING else (c + 1) * kv
    merged = FP32 * L * q_width
    accumulators = FP32 * L * (q_width + 2 * kv_width)
    dkv_in_flight = 2 * FP32 * 2 * L * kv_width
    backward = held + accumulators + dkv_in_flight
    return (
        Transient("forward", "K/V in flight, fp32 merged output", held + merged),
        Transient("backward", "K/V in flight, fp32 dq/dk/dv, dK/dV in flight", backward),
    )
