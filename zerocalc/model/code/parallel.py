"""What tensor, context and expert parallelism change inside a layer: the combinations a code cannot run,
and the buffers they hold for a moment."""

from __future__ import annotations

from zerocalc.model.activations import CpImpl
from zerocalc.model.architecture import Architecture, MlpKind, QkNorm
from zerocalc.model.code.base import FP32, ModelImpl, ModelImplName, Transient
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def parallel_unsupported(impl: ModelImpl, arch: Architecture, shape: Shape, flash: bool) -> str | None:
    """Why the model code cannot run ``arch`` under ``shape``'s tensor and context parallelism, as one
    sentence; None when it can.

    * heads, key/value heads and the MLP width divide by t (Megatron-LM ``num_query_groups % t``;
      ``ColwiseParallel`` splits whole heads), s by c, and s/c by t under sequence parallelism;
    * context parallelism runs in fused attention only (TE's ``attn_forward_func_with_cp``, torch's
      ``_context_parallel`` dispatch of SDPA's flash and efficient kernels);
    * torchtitan's context parallelism rotates K/V (ring or all-gather), it has no Ulysses;
    * ``hf`` has no sequence parallelism (``base_model_tp_plan`` leaves the norms replicated);
    * ``hf`` and ``torchtitan`` under TP: the dense plan of the module docstring only (transformers' other
      plans gather or pack their outputs: Phi-3, OLMo 2, GPT-NeoX; GPT-2 and Falcon have none; MoE and
      latent attention plans are not modelled here).
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
        if impl.name is ModelImplName.MEGATRON and kv % c:
            # TE's AttnFuncWithCPAndQKVOA2A splits k and v by heads too (DeepSpeed repeats them instead)
            return f"Ulysses needs the {kv} key/value heads per tensor-parallel rank divisible by {c}"
        if impl.name is ModelImplName.TORCHTITAN:
            return "torchtitan's context parallelism is ring or all-gather attention, not Ulysses"
    if t > 1 and shape.sequence_parallel and impl.name is ModelImplName.HF:
        return "transformers' tensor-parallel plans have no sequence parallelism (the norms are replicated)"
    if t > 1 and impl.name is not ModelImplName.MEGATRON:
        tr = traits(arch)
        if arch.is_moe:
            return f"{impl.name.value} code's tensor parallelism of mixture-of-experts layers is not modelled"
        if (
            arch.latent_attention is not None
            or arch.fused_qkv
            or arch.fused_gate_up
            or arch.qk_norm is QkNorm.FULL
            or tr.qkv_views_kept
            or arch.mlp is not MlpKind.SWIGLU
        ):
            return (
                f"{impl.name.value} code's tensor-parallel plan for this architecture is not the dense "
                "colwise q/k/v, gate/up and rowwise o/down plan that is modelled"
            )
    return None


def parallel_transients(
    impl: ModelImpl, arch: Architecture, index: int, shape: Shape, act: int
) -> tuple[Transient, ...]:
    """The moments inside one layer where tensor or context parallelism holds buffers above the layer's
    saved tensors, on one rank; :func:`layer_saves` takes the largest of each phase into
    ``forward_excess`` / ``backward_excess`` (the timeline counts them above all of the layer's saved
    tensors: at most the MLP's saved tensors more than the moment holds). ``hf`` and ``torchtitan``'s
    tensor-parallel buffers are in their measured excess instead (:func:`forward_excess`,
    :func:`backward_excess`). Derived from the source, not measured. With kv = 2·act·L·h_kv/t, the rank's
    K and V:

    * ``megatron`` tensor parallelism with sequence parallelism (TE ``Linear``/``LayerNormLinear``, Megatron
      ``LinearWithGradAccumulationAndAsyncCommunication``): forward, the all-gathered L × h input of a
      column-parallel linear (the row-parallel partial output before its reduce-scatter is as large, at
      another moment); backward, the input gathered again and the L × h input gradient before its
      reduce-scatter. Without sequence parallelism the all-reduces run in place: nothing.
    * ``megatron`` context parallelism, Transformer Engine ``attention/dot_product_attention/
      context_parallel.py``: ring (``AttnFuncWithCPAndKVP2P``) keeps every step's K/V buffer in
      ``p2p_comm_buffers`` until the forward returns (c·kv) and in backward two buffers of K/V with dK/dV
      (4·kv) and dq; all-gather (``AttnFuncWithCPAndKVAllGather``) gathers K and V and reorders them for
      causal load balance (3c/2·kv), and in backward adds dK, dV over the whole sequence (c·kv) and dq;
      Ulysses (``AttnFuncWithCPAndQKVOA2A``) keeps the caller's q, k, v from before the all-to-all beside
      the ones after it, and in backward the gradients before their all-to-all back.
    * ``hf`` (accelerate's torch context parallelism) and ``torchtitan``, torch
      ``distributed/tensor/experimental/_context_parallel/_attention.py`` (``_templated_ring_attention``,
      ``convert_to_f32``): the ``alltoall`` rotater (ring) holds the chunk in use, the copy it sends and
      the one it receives (min(c, 3)·kv), the ``allgather`` rotater the local copy and all of K/V
      ((c + 1)·kv); both merge the output in fp32 (4·L·a/t·d); in backward the same K/V, fp32
      accumulators for dq, dk, dv and the fp32 dK/dV chunk sent and received. DeepSpeed Ulysses (``hf``):
      q, k, v before the all-to-all (``UlyssesSPAttentionHF`` holds them), as for Megatron.
    * expert parallelism, in a mixture-of-experts layer (Megatron-LM ``core/transformer/moe/
      token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``, torchtitan ``ExpertParallel``; derived, not
      measured): forward, the rank's S = k·L permuted tokens while the dispatch all-to-all sends them (what
      it receives is the experts' saved input); backward, the combine's output gradient sent (S rows) and
      received (:meth:`Shape.expert_rows`).
    """
    L, R, h, c = shape.local_tokens, shape.sequence_tokens, arch.hidden_size, shape.cp
    out: list[Transient] = []
    if shape.ep > 1 and arch.is_moe_layer(index):
        pairs = L * arch.experts_per_token
        out.append(Transient("forward", "dispatch all-to-all: the permuted tokens sent", act * pairs * h))
        both = act * (pairs + shape.expert_rows(pairs)) * h
        out.append(Transient("backward", "combine all-to-all backward: the gradient sent and received", both))
    megatron = impl.name is ModelImplName.MEGATRON
    if megatron and shape.tp > 1 and R < L:
        out.append(Transient("forward", "all-gathered input of a column-parallel linear", act * L * h))
        both = "input gathered again, input gradient before its reduce-scatter"
        out.append(Transient("backward", both, 2 * act * L * h))
    if c == 1:
        return tuple(out)
    d = arch.dim_per_head
    q_width = shape.split(arch.num_heads, "attention heads") * d
    kv_width = shape.split(arch.kv_heads, "key/value heads") * d
    kv = 2 * act * L * kv_width
    qkv = act * L * (q_width + 2 * kv_width)
    if shape.cp_impl is CpImpl.ULYSSES:
        out.append(Transient("forward", "q, k, v before the all-to-all", qkv))
        out.append(Transient("backward", "q, k, v gradients before the all-to-all back", qkv))
    elif megatron and shape.cp_impl is CpImpl.RING:
        out.append(Transient("forward", "K/V buffer of every ring step", c * kv))
        out.append(Transient("backward", "two K/V + dK/dV ring buffers, dq", 4 * kv + act * L * q_width))
    elif megatron:
        out.append(Transient("forward", "all-gathered K/V and its causal reordering", 3 * c * kv // 2))
        dq = act * L * q_width
        both = "dK/dV over s, all-gathered K/V reordered, dq"
        out.append(Transient("backward", both, 5 * c * kv // 2 + dq))
    else:
        held = min(c, 3) * kv if shape.cp_impl is CpImpl.RING else (c + 1) * kv
        merged = FP32 * L * q_width
        accumulators = FP32 * L * (q_width + 2 * kv_width)
        dkv_in_flight = 2 * FP32 * 2 * L * kv_width
        out.append(Transient("forward", "K/V in flight, fp32 merged output", held + merged))
        backward = held + accumulators + dkv_in_flight
        out.append(Transient("backward", "K/V in flight, fp32 dq/dk/dv, dK/dV in flight", backward))
    return tuple(out)
