"""What the MLP keeps for backward: a dense MLP (gated or GELU) and a mixture-of-experts layer."""

from __future__ import annotations

from zerocalc.model.architecture import MlpKind
from zerocalc.model.code.base import FP32, INT64


def mlp_saves(add, arch, t, T, width, act) -> None:
    """Gated (SwiGLU, GeGLU): gate output, activation output, up output, their product (the down
    projection's input), 4·act·T·f; fused gate/up (Phi-3) keeps its 2f output whole, the same bytes.
    GELU: GPT-2's ``NewGELUActivation`` keeps x, tanh(...), 0.5x and 1 + tanh, plus the output;
    ``nn.GELU`` keeps its input and the output."""
    if arch.mlp is MlpKind.SWIGLU:
        if arch.fused_gate_up:
            add("gate/up output", 2 * act * T * width)
        else:
            add("gate output", act * T * width)
            add("up output", act * T * width)
        add("activation output", act * T * width)
        add("activation × up (down input)", act * T * width)
        return
    if t.gelu == "tanh_decomposed":
        add("GELU input, tanh, 0.5x, 1 + tanh", [act * T * width] * 4)
    else:
        add("GELU input", act * T * width)
    add("GELU output (down input)", act * T * width)


def moe_saves(add, arch, t, T, act, R) -> None:
    """A mixture-of-experts layer under transformers 5.17's default ``grouped_mm`` experts
    (``integrations/moe.py::grouped_mm_experts_forward``): the router's fp32 softmax, top-k indices and
    weights, the permutation indices (3 × int64 [S]), the sentinel mask, per-expert offsets (int32 [E]),
    the gathered tokens, gate/up output [S, 2f], activation, product, routing weights and the down
    output; plus the shared experts (Qwen2-MoE: with a sigmoid gate). GPT-OSS (measured as the others):
    its router keeps the top-k indices and the softmax over the k values (``topk_softmax``), its experts'
    biases are gathered by the sorted expert ids (``gate_up_proj_bias[expert_ids_g]``: ``Index`` keeps the
    int64 [S] ids), and its gate is :func:`expert_gate_saves`' clamped SwiGLU.

    Under expert parallelism (derived from torchtitan ``distributed/expert_parallel.py`` ``ExpertParallel``,
    not measured) the rank's E/e experts compute the R pairs the dispatch all-to-all brings them
    (:meth:`Shape.expert_rows`): the gathered tokens become the all-to-all's output [R, h] and the experts'
    tensors have R rows, offsets E/e; the routing and permutation stay on the rank's own S pairs, and the
    down output the weights multiply is the combine all-to-all's [S, h] (``all_to_all_single_autograd``
    saves nothing itself)."""
    E, k, f, h = arch.num_experts, arch.experts_per_token, arch.intermediate_size, arch.hidden_size
    S = T * k
    if t.router == "topk_softmax":  # GptOssTopKRouter: topk keeps its indices, the softmax its output
        router = [("top-k indices", INT64 * T * k), ("softmax over the top-k", act * T * k)]
        weights = act * S
    elif t.router == "softmax_topk":
        router = [("softmax (fp32)", FP32 * T * E), ("top-k indices", INT64 * T * k)]
        weights = act * S
    else:
        router = [("softmax (fp32)", FP32 * T * E), ("top-k indices", INT64 * T * k)]
        router += [("top-k sum (fp32)", FP32 * T), ("top-k weights (fp32)", FP32 * T * k)]
        weights = act * S if t.router == "softmax_topk_norm_cast" else FP32 * S
    if t.router == "sigmoid_group" and act != FP32:
        # DeepseekV3TopkRouter: F.linear(hidden.type(float32), weight.type(float32)) keeps both fp32 copies
        # (the sigmoid's scores are the "softmax" term; the group top-k's tensors are saved by nodes the
        # loss does not reach, freed when the router returns)
        router += [("input in fp32", FP32 * T * h), ("weight in fp32", FP32 * E * h)]
    add("router", router)
    # named parts: the experts' backward (zerocalc.peak.layer_nodes) frees them where their nodes run
    add(
        "experts",
        [
            ("perm // k", INT64 * S),
            ("perm", INT64 * S),
            *([("sorted expert ids (the biases' index)", INT64 * S)] if arch.expert_bias else []),
            ("inverse perm", INT64 * S),
            ("sentinel mask", S),
            ("offsets", FP32 * arch.local_experts),
            ("gathered tokens", act * R * h),
            *expert_gate_saves(t, act * R * f),
            ("routing weights (sorted)", weights),
            ("down output", act * S * h),
        ],
    )
    if arch.num_shared_experts:
        width = arch.num_shared_experts * (arch.shared_expert_intermediate_size or f)
        add("shared experts", [act * T * width] * 4)
        if arch.shared_expert_gate:
            add("shared expert gate, its output", [act * T, act * T * h])


def expert_gate_saves(t, part: int) -> list[tuple[str, int]]:
    """What the experts' ``_apply_gate`` keeps of the gate/up output [R, 2f], in ``part`` = act·R·f units:

    * ``silu`` (``_default_apply_gate``): the gate/up output (``chunk``'s views gate and up are saved by
      ``silu`` and the product), ``silu(gate)``, and the product, the down projection's input;
    * ``clamped_swiglu`` (``GptOssExperts._apply_gate``): the gate/up output (``clamp`` keeps its input,
      the strided views ``[..., ::2]`` and ``[..., 1::2]``), the clamped gate, ``sigmoid(gate · alpha)``
      (saved by ``sigmoid`` and the product), ``up + 1``, ``glu = gate · sigmoid`` and
      ``(up + 1) · glu``, the down projection's input: 2 + 5 parts (``gate · alpha`` and the clamped up
      are kept by nothing: a product by a number and an addition keep no operand)."""
    if t.expert_gate == "clamped_swiglu":
        return [
            ("gate/up output", 2 * part),
            ("gate clamped", part),
            ("sigmoid(alpha · gate)", part),
            ("up + 1", part),
            ("glu (gate · sigmoid)", part),
            ("glu × (up + 1) (down input)", part),
        ]
    return [
        ("gate/up output", 2 * part),
        ("activation output", part),
        ("activation × up (down input)", part),
    ]
