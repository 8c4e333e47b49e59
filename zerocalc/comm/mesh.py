"""Tensor- and context-parallel communication per optimizer step: the collectives each layer issues per
micro-batch, as each framework's code issues them, and what they cost over the mesh's groups (pure).

The schedules are data tables (:data:`TP_LAYER`, :data:`TP_MODEL`, :data:`TP_GRADIENTS`, :data:`CP_LAYER`):
one :class:`MeshCall` per collective, in the order the code issues it, each citing the code that issues
it. A rank holds b sequences of s/c tokens (context parallelism splits the sequence), t the
tensor-parallel degree, h the hidden size, a and kv the attention and key/value heads, d_k and d_v the
key and value head widths; S is nccl-tests' size of a call (the all_reduce tensor, the all_gather
output, the reduce_scatter input, the all_to_all per-rank send buffer, the send/recv message), so that
every call of a layer's activation moves S = b·(s/c)·h elements:

* tensor parallelism, per layer and micro-batch: without sequence parallelism an all_reduce after each
  row-parallel projection in forward and one of each column-parallel input's gradient in backward;
  with it, all_gather + reduce_scatter in their place (Korthikanti et al. 2022 §4.2.2), and Megatron-LM
  gathers the sequence-sharded input of each column-parallel linear again in backward for its weight
  gradient, where DTensor's autograd keeps the gathered input; multi-head latent attention under
  Megatron-LM gathers its low-rank q/kv latents and rotary key instead of the layer's input
  (:data:`TP_LATENT_FORWARD`);
* the vocabulary-parallel embedding and LM head once per micro-batch, and the vocabulary-parallel
  cross-entropy's three all_reduces of b·(s/c) fp32 values (the logits' maximum, the target logit, the
  sum of exponentials);
* the gradients of the parameters every tensor-parallel rank holds whole but computes from its own
  sequence shard (norms; Megatron's row-parallel biases), all-reduced over the TP group;
* context parallelism, per layer and micro-batch: the K/V exchange of attention (ring, all-gather or
  Ulysses all-to-all), c ranks t apart;
* expert parallelism, per MoE layer and micro-batch: the dispatch all-to-all of the routed tokens to the
  ranks of their experts and the combine all-to-all of the experts' outputs back, each of S = cf·k·b·(s/c)·h
  elements (k experts per token, cf the capacity factor: the busiest rank's buffer, the balanced k·b·s/c·h
  at cf = 1), and the gradients of both in backward; e ranks t apart, (e−1)/e of each buffer leaving the
  GPU and, where the group spans nodes, (e − m)/e of it the node (m of its ranks per node). The exchange
  of the per-expert token counts before each dispatch (E integers) is left out.

Activation recomputation re-runs forward collectives in backward: full recompute every forward
collective of a layer (of every N-th layer under ``checkpoint_every`` N, torchtitan's layer-level
``selective_ac_option``); selective recompute (Korthikanti et al.'s core attention) those inside the core
attention Megatron-LM checkpoints (``transformer/attention.py`` ``_checkpointed_attention_forward``
re-runs Transformer Engine's attention, and its context-parallel exchange). DeepSpeed's all-to-alls sit
outside the local attention it would recompute, and torch's SDPA with ``context_parallel`` is not
recomputed by it. torchtitan's op-level selective checkpointing (``--recompute op``; v0.2.2
``distributed/activation_checkpoint.py::_apply_op_sac``, ``models/llama3/infra/parallelize.py``
``_op_sac_save_list``) saves the outputs of ``_c10d_functional.reduce_scatter_tensor`` and not those of
the all-gathers: under tensor parallelism with sequence parallelism its recompute runs the all-gathers of
the attention and MLP inputs (``PrepareModuleInput`` Shard(1) → Replicate) again and takes the
reduce-scatters' outputs (``RowwiseParallel`` output Shard(1)) from its storage; a Replicate output's
all-reduce is not in the save list and runs again (it is refused under context parallelism, whose
exchange would run inside the saved attention kernel). Scalar reductions for logging (the loss over the
CP group) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from pydantic import BaseModel, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.memo import IdentityCache
from zerocalc.base.units import ceil_div
from zerocalc.model.activations import Recompute, routed_rows
from zerocalc.model.architecture import Architecture, MlpKind, parameter_tensors, tensor_parallel_dim
from zerocalc.network.calibration import Calibration, CollectiveFit
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import COLLECTIVES, Collective
from zerocalc.network.links import Bandwidths, BandwidthSource, LinkFigures
from zerocalc.network.schedule import GradSync, Phase
from zerocalc.parallel.framework_records import FRAMEWORKS
from zerocalc.parallel.framework_records.record import CpFamily
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import CpImpl, Mesh, TpStyle


class Dimension(StrEnum):
    """A dimension of the mesh, and the group its collectives run over."""

    DP = "dp"
    """Data parallelism over the dp × cp ranks of one TP index (the strategies' collectives)."""
    TP = "tp"
    """Tensor parallelism: t consecutive ranks."""
    CP = "cp"
    """Context parallelism: c ranks, t apart."""
    PP = "pp"
    """Pipeline parallelism: p stages, t·c·dp apart (:mod:`zerocalc.comm.pipeline`)."""
    EP = "ep"
    """Expert parallelism: e ranks, ETP apart (t apart at Megatron-LM's default ETP = t)."""
    ETP = "etp"
    """Expert tensor parallelism: the ETP consecutive ranks each routed expert is split over (the TP group
    at ETP = t; Megatron-LM ``pg_collection.expt_tp``)."""


class Size(StrEnum):
    """S of one call, in elements, from the rank's micro-batch (b sequences of s/c tokens)."""

    HIDDEN = "hidden"
    """b·(s/c)·h: a layer's activation."""
    TOKENS = "tokens"
    """b·(s/c): one value per token."""
    KV = "kv"
    """b·(s/c)·(kv/t)·(d_k + d_v): the rank's K and V chunk in one buffer (or their gradients)."""
    KV_WITH_GRADS = "kv_with_grads"
    """2·b·(s/c)·(kv/t)·(d_k + d_v): K, V, dK and dV in one buffer."""
    K_GATHERED = "k_gathered"
    """b·s·(kv/t)·d_k: K of the whole sequence (an all_gather output, a reduce_scatter input)."""
    V_GATHERED = "v_gathered"
    """b·s·(kv/t)·d_v."""
    KV_GATHERED = "kv_gathered"
    """b·s·(kv/t)·(d_k + d_v): K and V of the whole sequence in one buffer."""
    Q_HEADS = "q_heads"
    """b·(s/c)·(a/t)·d_k: the rank's queries, sent as c blocks of heads (all_to_all)."""
    K_HEADS = "k_heads"
    """b·(s/c)·(kv/t)·d_k."""
    V_HEADS = "v_heads"
    """b·(s/c)·(kv/t)·d_v."""
    O_HEADS = "o_heads"
    """b·(s/c)·(a/t)·d_v: attention's output."""
    REPLICATED_GRADS = "replicated_grads"
    """Σ of the replicated parameters' elements, one flat buffer."""
    REPLICATED_GRAD = "replicated_grad"
    """One call per replicated parameter, of its elements."""
    ROUTED = "routed"
    """routed_rows(k·T, cf)·h: the token copies routed to the experts (all-to-all), T = b·(s/c) tokens of
    the rank, b·(s/c)/t under tensor and sequence parallelism (the MoE layer's input is sequence-sharded)."""
    ROUTED_GATHERED = "routed_gathered"
    """ETP·routed_rows(k·T, cf)·h: the received token copies of the ETP ranks of an expert-tensor-parallel
    group in one buffer (the all_gather output, the reduce_scatter input)."""
    Q_LATENT = "q_latent"
    """b·(s/c)·r_q: latent attention's normed q down-projection output, the q up projection's input
    (b·(s/c)·h, the layer's input, for a model whose q has no rank)."""
    KV_LATENT = "kv_latent"
    """b·(s/c)·r_kv: latent attention's normed kv down-projection output, the kv up projection's input."""
    K_ROPE = "k_rope"
    """b·(s/c)·d_rope: latent attention's rotary key, one head shared by every query head."""


class Count(StrEnum):
    """How many calls of its size a row makes each time it runs."""

    ONE = "1"
    CP_STEPS = "c-1"
    """The steps of a ring after the first."""
    CP_SIZE = "c"
    CP_INNER = "c-2"
    """The ring steps between the first and the last."""
    ATTENTION_INPUTS = "attention inputs"
    """One per column-parallel projection of attention's input: 1 (fused q/k/v) or 3."""
    MLP_INPUTS = "mlp inputs"
    """One per column-parallel projection of the MLP's input: 1 (fc_in, fused gate/up) or 2 (gate, up)."""


class Carried(StrEnum):
    """Which dtype a row's tensor travels in."""

    ACTIVATION = "activation"
    """The precision recipe's compute dtype."""
    FP32 = "fp32"
    GRADIENT = "gradient"
    """The gradients' reduce dtype (``--reduce-dtype``, else the recipe's gradient dtype)."""


class Scope(StrEnum):
    """How often a row runs in a step of A micro-batches."""

    LAYER = "layer"
    """In every layer, every micro-batch: L·A times."""
    MODEL = "model"
    """Once per micro-batch: A times."""
    STEP = "step"
    """Once per step."""
    SYNC = "sync"
    """Once per micro-batch that synchronises gradients (A under ``every``, 1 under ``last``)."""
    MOE_LAYER = "moe_layer"
    """In every mixture-of-experts layer, every micro-batch: L_moe·A times."""


@dataclass(frozen=True)
class MeshCall:
    """One collective of a tensor- or context-parallel schedule."""

    op: Collective
    phase: Phase
    moves: str
    size: Size
    source: str
    count: Count = Count.ONE
    carried: Carried = Carried.ACTIVATION
    scope: Scope = Scope.LAYER
    in_core_attention: bool = False
    """Runs inside the core attention, which selective recomputation re-runs."""
    in_mlp: bool = False
    """A per-layer collective of the tensor-parallel dense MLP: in a mixture-of-experts layer it runs only
    for the shared experts (Megatron-LM ``core/transformer/moe/shared_experts.py``: the same gather and
    reduce-scatter over the TP group as the dense MLP); the routed experts' are the dispatcher's."""

    def reruns_under(self, recompute: Recompute) -> bool:
        """Whether ``recompute`` runs this forward collective again in backward."""
        if self.phase is not Phase.FORWARD or self.scope not in (Scope.LAYER, Scope.MOE_LAYER):
            return False
        if recompute is Recompute.OP:  # torchtitan's op-level policy saves the reduce-scatters' outputs
            return self.op is not Collective.REDUCE_SCATTER and not self.in_core_attention
        return recompute is Recompute.FULL or (recompute is Recompute.SELECTIVE and self.in_core_attention)


AR, AG, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER
A2A, P2P = Collective.ALL_TO_ALL, Collective.SEND_RECV
FWD, BWD = Phase.FORWARD, Phase.BACKWARD

_LAYERS = "Megatron-LM core/tensor_parallel/layers.py"
_MAPPINGS = "Megatron-LM core/tensor_parallel/mappings.py"
_COLUMN = f"{_LAYERS} LinearWithGradAccumulationAndAsyncCommunication"
_DGRAD = f"{_COLUMN}.backward allreduce_dgrad"
_STYLE = "torch/distributed/tensor/parallel/style.py"
_PLAN = "torchtitan models/llama3/infra/parallelize.py apply_tp"
_FROM_LOCAL = (
    f"{_STYLE} ColwiseParallel: DTensor.from_local backward, Partial to Replicate, one per projection"
)

TP_LAYER: dict[tuple[TpStyle, bool], tuple[MeshCall, ...]] = {
    (TpStyle.MEGATRON, False): (
        MeshCall(AR, FWD, "attention output", Size.HIDDEN,
                 f"{_MAPPINGS} _ReduceFromModelParallelRegion (RowParallelLinear linear_proj)"),
        MeshCall(AR, FWD, "MLP output", Size.HIDDEN,
                 f"{_MAPPINGS} _ReduceFromModelParallelRegion (RowParallelLinear linear_fc2)", in_mlp=True),
        MeshCall(AR, BWD, "MLP input gradient", Size.HIDDEN, f"{_DGRAD} (linear_fc1)", in_mlp=True),
        MeshCall(AR, BWD, "attention input gradient", Size.HIDDEN,
                 f"{_DGRAD} (linear_qkv)"),
    ),
    (TpStyle.MEGATRON, True): (
        MeshCall(AG, FWD, "attention input", Size.HIDDEN, f"{_COLUMN}.forward (linear_qkv)"),
        MeshCall(RS, FWD, "attention output", Size.HIDDEN,
                 f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion (RowParallelLinear linear_proj)"),
        MeshCall(AG, FWD, "MLP input", Size.HIDDEN, f"{_COLUMN}.forward (linear_fc1)", in_mlp=True),
        MeshCall(RS, FWD, "MLP output", Size.HIDDEN,
                 f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion (RowParallelLinear linear_fc2)",
                 in_mlp=True),
        MeshCall(AG, BWD, "MLP output gradient", Size.HIDDEN,
                 f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion.backward (linear_fc2)", in_mlp=True),
        MeshCall(AG, BWD, "MLP input, gathered again", Size.HIDDEN,
                 f"{_COLUMN}.backward: for the weight gradient (linear_fc1)", in_mlp=True),
        MeshCall(RS, BWD, "MLP input gradient", Size.HIDDEN, f"{_COLUMN}.backward (linear_fc1)", in_mlp=True),
        MeshCall(AG, BWD, "attention output gradient", Size.HIDDEN,
                 f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion.backward (linear_proj)"),
        MeshCall(AG, BWD, "attention input, gathered again", Size.HIDDEN,
                 f"{_COLUMN}.backward: for the weight gradient (linear_qkv)"),
        MeshCall(RS, BWD, "attention input gradient", Size.HIDDEN, f"{_COLUMN}.backward (linear_qkv)"),
    ),
    (TpStyle.DTENSOR, False): (
        MeshCall(AR, FWD, "attention output", Size.HIDDEN,
                 f"{_STYLE} RowwiseParallel, output Replicate"),
        MeshCall(AR, FWD, "MLP output", Size.HIDDEN, f"{_STYLE} RowwiseParallel, output Replicate",
                 in_mlp=True),
        MeshCall(AR, BWD, "MLP input gradient", Size.HIDDEN,
                 _FROM_LOCAL,
                 count=Count.MLP_INPUTS, in_mlp=True),
        MeshCall(AR, BWD, "attention input gradient", Size.HIDDEN,
                 _FROM_LOCAL,
                 count=Count.ATTENTION_INPUTS),
    ),
    (TpStyle.DTENSOR, True): (
        MeshCall(AG, FWD, "attention input", Size.HIDDEN,
                 f"{_PLAN}: PrepareModuleInput Shard(1) to Replicate"),
        MeshCall(RS, FWD, "attention output", Size.HIDDEN,
                 f"{_PLAN}: RowwiseParallel, output Shard(1)"),
        MeshCall(AG, FWD, "MLP input", Size.HIDDEN, f"{_PLAN}: PrepareModuleInput Shard(1) to Replicate",
                 in_mlp=True),
        MeshCall(RS, FWD, "MLP output", Size.HIDDEN, f"{_PLAN}: RowwiseParallel, output Shard(1)",
                 in_mlp=True),
        MeshCall(AG, BWD, "MLP output gradient", Size.HIDDEN, f"{_PLAN}: Shard(1) output's gradient",
                 in_mlp=True),
        MeshCall(RS, BWD, "MLP input gradient", Size.HIDDEN, f"{_PLAN}: PrepareModuleInput's gradient",
                 in_mlp=True),
        MeshCall(AG, BWD, "attention output gradient", Size.HIDDEN, f"{_PLAN}: Shard(1) output's gradient"),
        MeshCall(RS, BWD, "attention input gradient", Size.HIDDEN, f"{_PLAN}: PrepareModuleInput's gradient"),
    ),
}  # fmt: skip
"""What one layer's tensor-parallel linears communicate per micro-batch, by whose layers and whether
sequence parallelism is on. Megatron-LM: ``ColumnParallelLinear`` (linear_qkv, linear_fc1) and
``RowParallelLinear`` (linear_proj, linear_fc2) through ``LinearWithGradAccumulationAndAsyncCommunication``
(the input all-gathered in forward and again in backward under sequence parallelism, its gradient
all-reduced or reduce-scattered) and ``mappings.py``. DTensor: the ``ColwiseParallel`` / ``RowwiseParallel``
styles, and torchtitan's plan under sequence parallelism, where one ``PrepareModuleInput`` all-gathers the
input of attention and of the MLP and its backward reduce-scatters their summed gradients."""

_MLA = "Megatron-LM core/transformer/multi_latent_attention.py MLASelfAttention"
_TE_COLUMN = "Transformer Engine LayerNormLinear (TELayerNormColumnParallelLinear)"
_K_ROPE = f"{_MLA}.get_query_key_value_tensors: gather_from_sequence_parallel_region(k_pos_emb)"
TP_LATENT_FORWARD: tuple[MeshCall, ...] = (
    MeshCall(AG, FWD, "latent attention: q latent, normed", Size.Q_LATENT,
             f"{_MLA}: linear_q_up_proj, {_TE_COLUMN}.forward, sequence_parallel"),
    MeshCall(AG, FWD, "latent attention: kv latent, normed", Size.KV_LATENT,
             f"{_MLA}: linear_kv_up_proj, {_TE_COLUMN}.forward, sequence_parallel"),
    MeshCall(AG, FWD, "latent attention: rotary key", Size.K_ROPE, _K_ROPE),
    MeshCall(RS, FWD, "attention output", Size.HIDDEN,
             f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion (TERowParallelLinear linear_proj)"),
)  # fmt: skip
TP_LATENT_BACKWARD: tuple[MeshCall, ...] = (
    MeshCall(AG, BWD, "attention output gradient", Size.HIDDEN,
             f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion.backward (linear_proj)"),
    MeshCall(RS, BWD, "latent attention: rotary key gradient", Size.K_ROPE,
             f"{_MAPPINGS} _GatherFromSequenceParallelRegion.backward (k_pos_emb)"),
    MeshCall(AG, BWD, "latent attention: kv latent, gathered again", Size.KV_LATENT,
             f"{_TE_COLUMN}.backward: for the weight gradient (linear_kv_up_proj)"),
    MeshCall(RS, BWD, "latent attention: kv latent gradient", Size.KV_LATENT,
             f"{_TE_COLUMN}.backward (linear_kv_up_proj)"),
    MeshCall(AG, BWD, "latent attention: q latent, gathered again", Size.Q_LATENT,
             f"{_TE_COLUMN}.backward: for the weight gradient (linear_q_up_proj)"),
    MeshCall(RS, BWD, "latent attention: q latent gradient", Size.Q_LATENT,
             f"{_TE_COLUMN}.backward (linear_q_up_proj)"),
)  # fmt: skip
"""What one layer's multi-head latent attention communicates per micro-batch under Megatron-LM's tensor and
sequence parallelism, in place of the attention rows of :data:`TP_LAYER` (the framework's record,
``latent_attention_tp``; read at d98e8a6). ``linear_q_down_proj`` and ``linear_kv_down_proj`` are
``TELinear(parallel_mode="duplicated")`` (``gpt_layer_specs.py``: ``backend.linear()``): every rank holds
them whole and runs them on its own [s/t, b, h] shard, so the layer's input is never gathered; the q and kv
norms are fused into ``linear_q_up_proj`` / ``linear_kv_up_proj`` (``qk_layernorm``:
``TELayerNormColumnParallelLinear``), which norm the s/t-row latents and all-gather the normed rows (b·s·r_q,
b·s·r_kv), and again in backward for the weight gradient, then reduce-scatter the latents' gradients; the
rotary key (``k_pos_emb``, b·s·d_rope, shared by every head) is gathered by itself and its gradient, partial
on each rank's heads, reduce-scattered; ``linear_proj`` (row-parallel) reduce-scatters the output as
for any attention. A model whose q has no rank runs ``linear_q_proj`` column-parallel on the layer's input,
gathering it (b·s·h) instead of the q latent. The duplicated down projections' gradients (each rank's from
its own tokens) are all-reduced over the TP group with the norms' (:data:`TP_GRADIENTS`: ``TELinear`` sets
``sequence_parallel`` on a duplicated weight)."""


@lru_cache(maxsize=4)
def tp_latent_layer(sequence_parallel: bool) -> tuple[MeshCall, ...]:
    """One layer's tensor-parallel collectives with latent attention under Megatron-LM: its attention's
    (:data:`TP_LATENT_FORWARD`, :data:`TP_LATENT_BACKWARD`; :func:`mesh_problem` refuses it without sequence
    parallelism) around the dense MLP's of :data:`TP_LAYER`."""
    assert sequence_parallel
    mlp = tuple(call for call in TP_LAYER[TpStyle.MEGATRON, True] if call.in_mlp)
    return TP_LATENT_FORWARD + mlp + TP_LATENT_BACKWARD


_CE = "Megatron-LM core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy.forward"
_LOSS = "torch/distributed/tensor/parallel/loss.py (loss_parallel)"
_EMBEDDING = f"{_LAYERS} VocabParallelEmbedding.forward"
_EMBEDDING_REDUCE = f"{_EMBEDDING}: reduce_from_tensor_model_parallel_region"
_CROSS_ENTROPY_MEGATRON = (
    MeshCall(AR, FWD, "cross-entropy: max logit", Size.TOKENS, _CE, carried=Carried.FP32, scope=Scope.MODEL),
    MeshCall(AR, FWD, "cross-entropy: target logit", Size.TOKENS, _CE, carried=Carried.FP32,
             scope=Scope.MODEL),
    MeshCall(AR, FWD, "cross-entropy: Σ exp", Size.TOKENS, _CE, carried=Carried.FP32,
             scope=Scope.MODEL),
)  # fmt: skip
_CROSS_ENTROPY_DTENSOR = (
    MeshCall(AR, FWD, "cross-entropy: max logit", Size.TOKENS, f"{_LOSS} _log_softmax",
             carried=Carried.FP32, scope=Scope.MODEL),
    MeshCall(AR, FWD, "cross-entropy: Σ exp", Size.TOKENS, f"{_LOSS} _log_softmax",
             carried=Carried.FP32, scope=Scope.MODEL),
    MeshCall(AR, FWD, "cross-entropy: target logit", Size.TOKENS, f"{_LOSS} _nll_loss_forward",
             carried=Carried.FP32, scope=Scope.MODEL),
)  # fmt: skip


class _ModelKey(NamedTuple):
    style: TpStyle
    sequence_parallel: bool
    learned_positions: bool
    """Megatron-LM reduce-scatters the word embeddings only without a position table
    (``LanguageModelEmbedding.reduce_scatter_embeddings``); with one it all-reduces them, adds the
    positions and splits the sum (``scatter_to_sequence_parallel_region``)."""


def _megatron_model(sequence_parallel: bool, learned_positions: bool) -> tuple[MeshCall, ...]:
    head = "Megatron-LM core/models/gpt/gpt_model.py output_layer (ColumnParallelLinear)"
    model = Scope.MODEL
    if not sequence_parallel:
        return (
            MeshCall(AR, FWD, "word embeddings", Size.HIDDEN, _EMBEDDING_REDUCE,
                     scope=model),
            *_CROSS_ENTROPY_MEGATRON,
            MeshCall(AR, BWD, "LM head input gradient", Size.HIDDEN, f"{head}: {_COLUMN} allreduce_dgrad",
                     scope=model),
        )  # fmt: skip
    embedding = (
        MeshCall(AR, FWD, "word embeddings", Size.HIDDEN, _EMBEDDING_REDUCE,
                 scope=model)
        if learned_positions
        else MeshCall(RS, FWD, "word embeddings", Size.HIDDEN,
                      f"{_EMBEDDING}: reduce_scatter_embeddings", scope=model)
    )  # fmt: skip
    embedding_grad = (
        f"{_MAPPINGS} _ScatterToSequenceParallelRegion.backward"
        if learned_positions
        else f"{_MAPPINGS} _ReduceScatterToSequenceParallelRegion.backward"
    )
    return (
        embedding,
        MeshCall(AG, FWD, "LM head input", Size.HIDDEN, f"{head}: {_COLUMN}.forward", scope=model),
        *_CROSS_ENTROPY_MEGATRON,
        MeshCall(AG, BWD, "LM head input, gathered again", Size.HIDDEN,
                 f"{head}: {_COLUMN}.backward: for the weight gradient", scope=model),
        MeshCall(RS, BWD, "LM head input gradient", Size.HIDDEN, f"{head}: {_COLUMN}.backward", scope=model),
        MeshCall(AG, BWD, "embeddings' gradient", Size.HIDDEN, embedding_grad, scope=model),
    )  # fmt: skip


def _dtensor_model(sequence_parallel: bool) -> tuple[MeshCall, ...]:
    model = Scope.MODEL
    if not sequence_parallel:
        return (
            MeshCall(AR, FWD, "word embeddings", Size.HIDDEN,
                     f"{_STYLE} RowwiseParallel (nn.Embedding), output Replicate", scope=model),
            *_CROSS_ENTROPY_DTENSOR,
            MeshCall(AR, BWD, "LM head input gradient", Size.HIDDEN,
                     f"{_STYLE} ColwiseParallel: DTensor.from_local backward", scope=model),
        )  # fmt: skip
    return (
        MeshCall(RS, FWD, "word embeddings", Size.HIDDEN,
                 f"{_PLAN}: tok_embeddings RowwiseParallel, output Shard(1)", scope=model),
        MeshCall(AG, FWD, "LM head input", Size.HIDDEN, f"{_PLAN}: output ColwiseParallel, input Shard(1)",
                 scope=model),
        *_CROSS_ENTROPY_DTENSOR,
        MeshCall(RS, BWD, "LM head input gradient", Size.HIDDEN, f"{_PLAN}: output's input gradient",
                 scope=model),
        MeshCall(AG, BWD, "embeddings' gradient", Size.HIDDEN, f"{_PLAN}: Shard(1) output's gradient",
                 scope=model),
    )  # fmt: skip


TP_MODEL: dict[_ModelKey, tuple[MeshCall, ...]] = {
    **{
        _ModelKey(TpStyle.MEGATRON, sp, learned): _megatron_model(sp, learned)
        for sp in (False, True)
        for learned in (False, True)
    },
    **{
        _ModelKey(TpStyle.DTENSOR, sp, learned): _dtensor_model(sp)
        for sp in (False, True)
        for learned in (False, True)
    },
}
"""What the vocabulary-parallel embedding, LM head and cross-entropy communicate once per micro-batch. The
LM head keeps its logits sharded by vocabulary (Megatron ``parallel_output``, torchtitan ``loss_parallel``)
for the vocabulary-parallel cross-entropy, which runs in fp32 (Megatron casts the logits with
``.float()``; torchtitan's loss takes ``pred.float()``)."""

TP_GRADIENTS: dict[TpStyle, MeshCall] = {
    TpStyle.MEGATRON: MeshCall(
        AR, BWD, "norm and row bias gradients", Size.REPLICATED_GRADS,
        "Megatron-LM core/distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads",
        carried=Carried.GRADIENT, scope=Scope.STEP,
    ),
    TpStyle.DTENSOR: MeshCall(
        AR, BWD, "norm weight gradients", Size.REPLICATED_GRAD,
        "torch/distributed/fsdp/_fully_shard/_fsdp_param.py _get_grad_inner_tensor: Partial to Replicate, "
        "one per parameter",
        scope=Scope.SYNC,
    ),
}  # fmt: skip
"""The gradients every tensor-parallel rank computes from its own tokens, of parameters it holds whole.
Megatron-LM all-reduces those marked ``sequence_parallel`` (norms and row-parallel biases, under
sequence parallelism) and per-head q/k norms (``qk_layernorm``, each rank seeing its heads) in one flat
buffer after the last micro-batch; FSDP2 redistributes each sequence-parallel norm weight's Partial
gradient to Replicate, one all_reduce per parameter, where it reduces gradients (in the dtype backward
produced them, the compute dtype)."""
TP_GRADIENTS_LATENT = MeshCall(
    AR, BWD, "norm, row bias and duplicated down-projection gradients", Size.REPLICATED_GRADS,
    TP_GRADIENTS[TpStyle.MEGATRON].source, carried=Carried.GRADIENT, scope=Scope.STEP,
)  # fmt: skip
"""Megatron-LM's with latent attention: its q/kv down projections (``TELinear`` ``parallel_mode=
"duplicated"``, ``sequence_parallel`` set on the weights under sequence parallelism, transformer_engine.py)
join the norms' flat buffer."""

_TE = "Transformer Engine pytorch/attention/dot_product_attention/context_parallel.py"
_TORCH_CP = "torch/distributed/tensor/experimental/_context_parallel/_attention.py"
_TE_AG = f"{_TE} AttnFuncWithCPAndKVAllGather"
_DEEPSPEED = "DeepSpeed deepspeed/sequence/layer.py DistributedAttention (_SeqAllToAll)"
_ULYSSES_FORWARD = (Size.Q_HEADS, Size.K_HEADS, Size.V_HEADS)


def _ulysses(source: str, inside: bool) -> tuple[MeshCall, ...]:
    """Four all-to-alls each way: q, k, v from sequence-sharded to head-sharded and the output back in
    forward; the output's gradient and dq, dk, dv in backward (Jacobs et al. 2023, §3)."""
    names = ("q", "k", "v")
    return (
        *(MeshCall(A2A, FWD, f"{n}: sequence to heads", size, source, in_core_attention=inside)
          for n, size in zip(names, _ULYSSES_FORWARD, strict=True)),
        MeshCall(A2A, FWD, "output: heads to sequence", Size.O_HEADS, source, in_core_attention=inside),
        MeshCall(A2A, BWD, "output gradient: sequence to heads", Size.O_HEADS, source),
        *(MeshCall(A2A, BWD, f"d{n}: heads to sequence", size, source)
          for n, size in zip(names, _ULYSSES_FORWARD, strict=True)),
    )  # fmt: skip


CP_LAYER: dict[tuple[CpFamily, CpImpl], tuple[MeshCall, ...]] = {
    (CpFamily.TRANSFORMER_ENGINE, CpImpl.RING): (
        MeshCall(P2P, FWD, "K, V to the next rank", Size.KV, f"{_TE} AttnFuncWithCPAndKVP2P.forward",
                 count=Count.CP_STEPS, in_core_attention=True),
        MeshCall(P2P, BWD, "K, V (first step)", Size.KV, f"{_TE} AttnFuncWithCPAndKVP2P.backward"),
        MeshCall(P2P, BWD, "K, V with dK, dV", Size.KV_WITH_GRADS, f"{_TE} AttnFuncWithCPAndKVP2P.backward",
                 count=Count.CP_INNER),
        MeshCall(P2P, BWD, "dK, dV (last step)", Size.KV, f"{_TE} AttnFuncWithCPAndKVP2P.backward"),
    ),
    (CpFamily.TRANSFORMER_ENGINE, CpImpl.ALLGATHER): (
        MeshCall(AG, FWD, "K", Size.K_GATHERED, f"{_TE_AG}.forward", in_core_attention=True),
        MeshCall(AG, FWD, "V", Size.V_GATHERED, f"{_TE_AG}.forward", in_core_attention=True),
        MeshCall(AG, BWD, "K, gathered again", Size.K_GATHERED, f"{_TE_AG}.backward"),
        MeshCall(AG, BWD, "V, gathered again", Size.V_GATHERED, f"{_TE_AG}.backward"),
        MeshCall(RS, BWD, "dK", Size.K_GATHERED, f"{_TE_AG}.backward"),
        MeshCall(RS, BWD, "dV", Size.V_GATHERED, f"{_TE_AG}.backward"),
    ),
    (CpFamily.TRANSFORMER_ENGINE, CpImpl.ULYSSES): _ulysses(f"{_TE} AttnFuncWithCPAndQKVOA2A", True),
    (CpFamily.TORCH, CpImpl.ALLGATHER): (
        MeshCall(AG, FWD, "K, V", Size.KV_GATHERED, f"{_TORCH_CP} _AllGatherRotater"),
        MeshCall(AG, BWD, "K, V, gathered again", Size.KV_GATHERED, f"{_TORCH_CP} _AllGatherRotater"),
        MeshCall(P2P, BWD, "dK, dV to the next rank", Size.KV,
                 f"{_TORCH_CP} _templated_ring_attention_backward: _AllToAllRotater (permute_tensor)",
                 count=Count.CP_SIZE, carried=Carried.FP32),
    ),
    (CpFamily.TORCH, CpImpl.RING): (
        MeshCall(P2P, FWD, "K, V to the next rank", Size.KV, f"{_TORCH_CP} _AllToAllRotater (permute_tensor)",
                 count=Count.CP_STEPS),
        MeshCall(P2P, BWD, "K, V to the next rank", Size.KV, f"{_TORCH_CP} _AllToAllRotater (permute_tensor)",
                 count=Count.CP_STEPS),
        MeshCall(P2P, BWD, "dK, dV to the next rank", Size.KV,
                 f"{_TORCH_CP} _templated_ring_attention_backward: _AllToAllRotater (permute_tensor)",
                 count=Count.CP_SIZE, carried=Carried.FP32),
    ),
    (CpFamily.DEEPSPEED, CpImpl.ULYSSES): _ulysses(_DEEPSPEED, False),
}  # fmt: skip
"""What one layer's context-parallel attention communicates per micro-batch. Transformer Engine's ring
sends the K/V buffer c − 1 times in forward; in backward K/V and the dK/dV accumulated so far travel in one
buffer, K/V alone at the first step and dK/dV alone at the last (c calls). Its all-gather variant gathers
K and V apiece, again in backward, and reduce-scatters their gradients. torch's ``context_parallel``
gathers (or rotates) K and V in one buffer and rotates dK/dV with the one-peer ``permute_tensor`` (an
``all_to_all_single``) in fp32 (``_cp_options.convert_to_f32``), c times."""


def _expert_parallel(dispatch: str, combine: str) -> tuple[MeshCall, ...]:
    """The dispatch and combine all-to-alls of one MoE layer, and their gradients in backward (the
    backward of an all-to-all is the all-to-all back)."""
    moe = Scope.MOE_LAYER
    return (
        MeshCall(A2A, FWD, "dispatch: routed tokens to their experts", Size.ROUTED, dispatch, scope=moe),
        MeshCall(A2A, FWD, "combine: expert outputs back", Size.ROUTED, combine, scope=moe),
        MeshCall(A2A, BWD, "combine gradient", Size.ROUTED, f"{combine}, backward", scope=moe),
        MeshCall(A2A, BWD, "dispatch gradient", Size.ROUTED, f"{dispatch}, backward", scope=moe),
    )


def _expert_tensor_parallel(source: str) -> tuple[MeshCall, ...]:
    """The dispatcher's collectives over the expert-tensor-parallel group in one MoE layer (Megatron-LM
    core 0.20.0 ``MoEAlltoAllTokenDispatcher``: ``dispatch_postprocess`` all-gathers the tokens the EP
    all-to-all brought, ``gather_from_sequence_parallel_region(global_input_tokens, group=self.tp_group)``
    with ``self.tp_group = pg_collection.expt_tp``; ``combine_preprocess`` reduce-scatters the experts'
    output back, ``reduce_scatter_to_sequence_parallel_region``), and their gradients in backward (the
    backward of the gather is a reduce-scatter and of the reduce-scatter a gather, ``core/tensor_parallel/
    mappings.py``). The gathered routing probabilities (k values per token) are left out."""
    moe = Scope.MOE_LAYER
    return (
        MeshCall(AG, FWD, "expert TP: received tokens gathered", Size.ROUTED_GATHERED, source, scope=moe),
        MeshCall(RS, FWD, "expert TP: expert outputs reduced", Size.ROUTED_GATHERED, source, scope=moe),
        MeshCall(AG, BWD, "expert TP: output gradient gathered", Size.ROUTED_GATHERED,
                 f"{source}, backward", scope=moe),
        MeshCall(RS, BWD, "expert TP: input gradient reduced", Size.ROUTED_GATHERED,
                 f"{source}, backward", scope=moe),
    )  # fmt: skip


@lru_cache(maxsize=16)
def etp_layer(framework: Framework) -> tuple[MeshCall, ...]:
    """What one MoE layer's expert tensor parallelism communicates per micro-batch under ``framework``
    (its record's ``ExpertParallel.expert_tensor_parallel``)."""
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    assert expert_parallel is not None and expert_parallel.expert_tensor_parallel is not None
    return _expert_tensor_parallel(expert_parallel.expert_tensor_parallel)


@lru_cache(maxsize=16)
def ep_layer(framework: Framework) -> tuple[MeshCall, ...]:
    """What one MoE layer's expert parallelism communicates per micro-batch under ``framework``: its
    token dispatch and combine (the record's :class:`~zerocalc.parallel.framework_records.record.
    ExpertParallel`), all-to-alls over the EP group."""
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    assert expert_parallel is not None  # the parser refuses ep > 1 elsewhere
    return _expert_parallel(expert_parallel.dispatch, expert_parallel.combine)


class MeshShape(NamedTuple):
    """What sizes the tensor- and context-parallel calls of one rank."""

    micro_batch: int
    seq_len: int
    hidden: int
    layers: int
    tp: int
    cp: int
    q_heads: int
    """a/t: attention heads of one TP rank."""
    kv_heads: int
    """kv/t: key/value heads of one TP rank (a/t under latent attention, whose up-projected K and V
    have one head per query head)."""
    qk_dim: int
    v_dim: int
    attention_inputs: int
    mlp_inputs: int
    moe_layers: int = 0
    """L_moe: the layers that route tokens to experts."""
    routed: int = 0
    """The token copies a rank sends to, and its experts receive from, the EP group per MoE layer
    (:func:`~zerocalc.model.activations.routed_rows` of k·T, T = b·(s/c), /t under sequence parallelism)."""
    etp: int = 1
    """ETP: the ranks a routed expert is split over (:attr:`~zerocalc.parallel.mesh.Mesh.etp`)."""
    mlp_layers: int = 0
    """The layers that run a tensor-parallel dense MLP: the dense ones, and the MoE layers with shared
    experts (all L of a dense model)."""
    q_rank: int = 0
    """r_q: latent attention's q rank; h where its q has none (a plain q projection of the layer's input);
    0 without latent attention."""
    kv_rank: int = 0
    """r_kv: latent attention's kv rank (0: no latent attention)."""
    rope_dim: int = 0
    """d_rope: latent attention's rotary key width."""

    @property
    def tokens(self) -> int:
        """b·(s/c): the tokens of a rank's micro-batch."""
        return self.micro_batch * (self.seq_len // self.cp)

    @classmethod
    def of(
        cls, arch: Architecture, mesh: Mesh, micro_batch: int, seq_len: int, capacity_factor: float = 1.0
    ) -> MeshShape:
        latent = arch.latent_attention
        if latent is not None:
            kv_heads, qk_dim, v_dim = arch.num_heads, latent.qk_head_dim, latent.v_head_dim
        else:
            kv_heads, qk_dim, v_dim = arch.kv_heads, arch.dim_per_head, arch.dim_per_head
        gated = arch.mlp is MlpKind.SWIGLU and not arch.fused_gate_up
        moe_layers = sum(arch.is_moe_layer(i) for i in range(arch.num_layers))
        ranks = (0, 0, 0)
        if latent is not None:
            ranks = (latent.q_lora_rank or arch.hidden_size, latent.kv_lora_rank, latent.qk_rope_head_dim)
        return cls(
            micro_batch=micro_batch,
            seq_len=seq_len,
            hidden=arch.hidden_size,
            layers=arch.num_layers,
            tp=mesh.tp,
            cp=mesh.cp,
            q_heads=arch.num_heads // mesh.tp,
            kv_heads=kv_heads // mesh.tp,
            qk_dim=qk_dim,
            v_dim=v_dim,
            attention_inputs=1 if arch.fused_qkv else 3,
            mlp_inputs=2 if gated else 1,
            moe_layers=moe_layers,
            routed=routed_rows(
                arch.experts_per_token * moe_tokens(mesh, micro_batch, seq_len), capacity_factor
            ),
            etp=mesh.etp,
            mlp_layers=arch.num_layers - (0 if arch.num_shared_experts else moe_layers),
            q_rank=ranks[0],
            kv_rank=ranks[1],
            rope_dim=ranks[2],
        )


def moe_tokens(mesh: Mesh, micro_batch: int, seq_len: int) -> int:
    """T: the tokens one rank routes in a mixture-of-experts layer, its b·(s/c), /t under sequence
    parallelism (Megatron-LM core 0.20.0 ``core/transformer/moe/moe_layer.py``: the MoE layer takes the
    [s/t, b, h] hidden states and refuses tensor parallelism without sequence parallelism in training;
    the router's weight is ``sequence_parallel``, each TP rank routing its own tokens)."""
    tokens = micro_batch * (seq_len // mesh.cp)
    return tokens // mesh.tp if mesh.sequence_parallel else tokens


def _elements(size: Size, shape: MeshShape) -> int:
    """S of one call of ``size`` (not the replicated gradients')."""
    tokens = shape.tokens
    kv = tokens * shape.kv_heads * (shape.qk_dim + shape.v_dim)
    match size:
        case Size.HIDDEN:
            return tokens * shape.hidden
        case Size.TOKENS:
            return tokens
        case Size.KV:
            return kv
        case Size.KV_WITH_GRADS:
            return 2 * kv
        case Size.K_GATHERED:
            return shape.cp * tokens * shape.kv_heads * shape.qk_dim
        case Size.V_GATHERED:
            return shape.cp * tokens * shape.kv_heads * shape.v_dim
        case Size.KV_GATHERED:
            return shape.cp * kv
        case Size.Q_HEADS:
            return tokens * shape.q_heads * shape.qk_dim
        case Size.K_HEADS:
            return tokens * shape.kv_heads * shape.qk_dim
        case Size.V_HEADS:
            return tokens * shape.kv_heads * shape.v_dim
        case Size.O_HEADS:
            return tokens * shape.q_heads * shape.v_dim
        case Size.ROUTED:
            return shape.routed * shape.hidden
        case Size.ROUTED_GATHERED:
            return shape.etp * shape.routed * shape.hidden
        case Size.Q_LATENT:
            return tokens * shape.q_rank
        case Size.KV_LATENT:
            return tokens * shape.kv_rank
        case Size.K_ROPE:
            return tokens * shape.rope_dim
    raise AssertionError(size)  # pragma: no cover - the replicated gradients are sized by their tensors


def _calls(count: Count, shape: MeshShape) -> int:
    match count:
        case Count.ONE:
            return 1
        case Count.CP_STEPS:
            return shape.cp - 1
        case Count.CP_SIZE:
            return shape.cp
        case Count.CP_INNER:
            return shape.cp - 2
        case Count.ATTENTION_INPUTS:
            return shape.attention_inputs
        case Count.MLP_INPUTS:
            return shape.mlp_inputs


@lru_cache(maxsize=512)
def replicated_gradients(rank: Architecture, style: TpStyle, sequence_parallel: bool) -> tuple[int, ...]:
    """The elements of each parameter the TP ranks hold whole and compute partial gradients of
    (:data:`TP_GRADIENTS`), in module order: under sequence parallelism every replicated parameter but the
    position table, which sees the whole sequence before it is split (Megatron-LM), or the norms'
    (DTensor's ``SequenceParallel``); Megatron's per-head q/k norms with or without it. Once per (rank's
    architecture, style, sequence parallelism)."""
    sizes = []
    for tensor in parameter_tensors(rank):
        if tensor_parallel_dim(tensor) is not None or tensor.module == "embed_positions":
            continue
        leaf = tensor.module.rsplit(".", 1)[-1]
        qk_norm = leaf in ("q_norm", "k_norm")
        megatron = style is TpStyle.MEGATRON and (sequence_parallel or qk_norm)
        dtensor = style is TpStyle.DTENSOR and sequence_parallel and leaf.endswith("norm") and not qk_norm
        if megatron or dtensor:
            sizes.append(tensor.numel)
    return tuple(sizes)


class MeshCollectiveCost(BaseModel):
    """One tensor- or context-parallel collective of a step: its calls each time it runs (per layer, or
    per micro-batch) and their cost per step."""

    dimension: Dimension
    op: Collective
    phase: Phase
    recomputed: bool = Field(
        description="a forward collective run again in backward (activation recomputation)"
    )
    moves: str = Field(description="what it carries")
    scope: Scope = Field(
        description="runs per layer, per micro-batch, per step, per synchronising micro-batch, or per MoE "
        "layer"
    )
    dtype: DType
    group_size: int = Field(description="t (tp), c (cp), e (ep) or ETP (etp)")
    spans_nodes: bool = Field(description="its group has ranks on more than one node (inter-node bandwidth)")
    elements: list[int] = Field(description="S of each call each time it runs, in elements")
    times_per_step: int = Field(description="L·A (per layer), A (per micro-batch), or 1 (per step)")
    calls_per_step: int
    message_bytes: int = Field(description="Σ S of the calls each time it runs")
    bytes_sent_per_gpu: int = Field(description="each time it runs: Σ factor(n)·S over its calls")
    total_bytes_per_gpu: int = Field(description="per step: times × bytes each time")
    inter_node_bytes_per_gpu: int = Field(
        description="per step, what of total_bytes_per_gpu crosses nodes: all of it for a ring spanning "
        "nodes, the blocks for the e − m ranks of other nodes for an expert-parallel all_to_all "
        "(m of the group's ranks per node), 0 within a node"
    )
    latency_s: float
    bus_bandwidth_Bps: float
    time_s: float = Field(description="per step: calls × α + bytes / β")
    bandwidth_source: BandwidthSource
    source: str = Field(description="the code that issues it")


class MeshRequest(NamedTuple):
    """What sizes and prices the tensor- and context-parallel collectives of a request."""

    mesh: Mesh
    framework: Framework
    shape: MeshShape
    learned_positions: bool
    replicated: tuple[int, ...]
    """:func:`replicated_gradients`."""
    recompute: Recompute
    grad_accum: int
    activation: DType
    gradient: DType
    bandwidths: Bandwidths
    calibration: Calibration | None
    checkpoint_every: int = 1
    """Under full recompute, every N-th layer checkpointed: its collectives alone run again."""


def mesh_problem(arch: Architecture, mesh: Mesh, framework: Framework) -> str | None:
    """What the tensor-parallel schedules do not cover, or None: mixture-of-experts layers under TP where
    the framework's dispatcher under TP is not modelled (its record's ``expert_tensor_parallel``), latent
    attention where its code under TP is not (its record's ``latent_attention_tp``) or without sequence
    parallelism (:data:`TP_LATENT_FORWARD`)."""
    if mesh.tp == 1:
        return None
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    if arch.is_moe and (expert_parallel is None or expert_parallel.expert_tensor_parallel is None):
        names = ", ".join(
            f.value
            for f, record in FRAMEWORKS.items()
            if record.expert_parallel is not None and record.expert_parallel.expert_tensor_parallel
        )
        return (
            f"{{tp}} {mesh.tp} with {{framework}} {framework.value}: {arch.name}'s mixture-of-experts layers "
            "under tensor parallelism are not modelled for it; accepted: {tp} 1, or {framework} "
            f"{names}"
        )
    if arch.latent_attention is not None and not FRAMEWORKS[framework].latent_attention_tp:
        names = ", ".join(f.value for f, record in FRAMEWORKS.items() if record.latent_attention_tp)
        return (
            f"{{tp}} {mesh.tp} with {{framework}} {framework.value}: {arch.name}'s latent attention under "
            "tensor parallelism is not modelled for it; accepted: {tp} 1, or {framework} "
            f"{names}"
        )
    if arch.latent_attention is not None and not mesh.sequence_parallel:
        return (
            f"{{tp}} {mesh.tp} without {{sequence_parallel}}: Megatron-LM's MLASelfAttention reduces the "
            "rotary key's gradient over the TP group only in its sequence-parallel gather (k_pos_emb), "
            "which is not modelled without it; accepted: {sequence_parallel}, or {tp} 1"
        )
    return None


def _group(dimension: Dimension, mesh: Mesh) -> tuple[int, bool]:
    """A dimension's group size and whether it spans nodes (the layout of :mod:`zerocalc.parallel.mesh`)."""
    if dimension is Dimension.TP:
        return mesh.tp, mesh.tp_spans_nodes
    if dimension is Dimension.EP:
        return mesh.ep, mesh.ep_spans_nodes
    if dimension is Dimension.ETP:
        return mesh.etp, mesh.etp_spans_nodes
    return mesh.cp, mesh.cp_spans_nodes


def _off_node_bytes(dimension: Dimension, message_bytes: int, sent: int, mesh: Mesh) -> int:
    """What of one call's ``sent`` bytes leaves the node: for the expert-parallel all_to_all, the blocks of
    S/e for the e − m ranks of the group on other nodes (m = :attr:`Mesh.ep_ranks_per_node`); for the
    other collectives, all of it where their group spans nodes (the ring runs at the inter-node link)."""
    n, spans_nodes = _group(dimension, mesh)
    if not spans_nodes:
        return 0
    if dimension is Dimension.EP:
        return ceil_div(message_bytes * (n - mesh.ep_ranks_per_node), n)
    return sent


def mesh_fit(op: Collective, spans_nodes: bool, size: int, calibration: Calibration) -> CollectiveFit | None:
    """The calibration's fit for ``op`` over groups of this placement and exactly ``size`` ranks (a node's
    groups, or one rank per node or the world's across nodes), if it measured one."""
    if spans_nodes:
        kinds = (RankGroup.ACROSS_NODES, RankGroup.WORLD) if calibration.nodes > 1 else ()
    else:
        kinds = (RankGroup.NODE,) + ((RankGroup.WORLD,) if calibration.nodes == 1 else ())
    fits = (calibration.fit_for(op, kind) for kind in kinds)
    return next((fit for fit in fits if fit is not None and fit.group_size == size), None)


def _link(op: Collective, spans_nodes: bool, size: int, request: MeshRequest) -> LinkFigures:
    fit = mesh_fit(op, spans_nodes, size, request.calibration) if request.calibration is not None else None
    if fit is not None:
        return LinkFigures(
            latency_s=fit.latency_s,
            bus_bandwidth_Bps=fit.bus_bandwidth_Bps,
            source=BandwidthSource.CALIBRATION,
            detail=f"calibration fit of {op.value} over {fit.group_kind.value} groups of {fit.group_size}",
        )
    return request.bandwidths.inter_node if spans_nodes else request.bandwidths.intra_node


def _schedule(request: MeshRequest) -> list[tuple[Dimension, MeshCall]]:
    """Every tensor-, context- and expert-parallel row of the request's mesh, in order: TP per layer, per
    micro-batch and per step, then CP per layer, then EP per MoE layer."""
    mesh = request.mesh
    rows: list[tuple[Dimension, MeshCall]] = []
    if mesh.tp > 1:
        sp = mesh.sequence_parallel
        layer = tp_latent_layer(sp) if request.shape.kv_rank else TP_LAYER[mesh.tp_style, sp]
        rows += [(Dimension.TP, call) for call in layer]
        rows += [
            (Dimension.TP, call) for call in TP_MODEL[_ModelKey(mesh.tp_style, sp, request.learned_positions)]
        ]
        if request.replicated:
            gradients = TP_GRADIENTS_LATENT if request.shape.kv_rank else TP_GRADIENTS[mesh.tp_style]
            rows.append((Dimension.TP, gradients))
    if mesh.cp > 1:
        family = FRAMEWORKS[request.framework].cp_family
        assert family is not None  # the parser refuses cp > 1 elsewhere
        rows += [(Dimension.CP, call) for call in CP_LAYER[family, mesh.cp_impl]]
    if mesh.ep > 1:
        rows += [(Dimension.EP, call) for call in ep_layer(request.framework)]
    if request.shape.moe_layers and mesh.etp > 1:
        rows += [(Dimension.ETP, call) for call in etp_layer(request.framework)]
    return rows


def _sizes(call: MeshCall, request: MeshRequest) -> tuple[int, ...]:
    """S of each call ``call`` makes each time it runs."""
    if call.size is Size.REPLICATED_GRADS:
        return (sum(request.replicated),)
    if call.size is Size.REPLICATED_GRAD:
        return request.replicated
    return (_elements(call.size, request.shape),) * _calls(call.count, request.shape)


def _times(scope: Scope, request: MeshRequest, sync: GradSync, in_mlp: bool = False) -> int:
    match scope:
        case Scope.LAYER:
            layers = request.shape.mlp_layers if in_mlp else request.shape.layers
            return layers * request.grad_accum
        case Scope.MODEL:
            return request.grad_accum
        case Scope.STEP:
            return 1
        case Scope.SYNC:
            return request.grad_accum if sync is GradSync.EVERY else 1
        case Scope.MOE_LAYER:
            return request.shape.moe_layers * request.grad_accum


def _rerun_times(scope: Scope, request: MeshRequest, in_mlp: bool = False) -> int:
    """Calls per step of a layer's forward collective that recomputation runs again: in every layer (of
    those with a dense MLP for an MLP's, or every mixture-of-experts layer) of the rank, or under full
    recompute in every ``checkpoint_every``-th."""
    if scope is Scope.LAYER:
        layers = request.shape.mlp_layers if in_mlp else request.shape.layers
    else:
        layers = request.shape.moe_layers
    if request.recompute is Recompute.FULL:
        layers //= request.checkpoint_every
    return layers * request.grad_accum


def _dtype(carried: Carried, request: MeshRequest) -> DType:
    match carried:
        case Carried.ACTIVATION:
            return request.activation
        case Carried.FP32:
            return DType.FP32
        case Carried.GRADIENT:
            return request.gradient


class MeshRun(NamedTuple):
    """One collective of the mesh's schedule, run once: its calls' sizes, what they send and cost. The same
    at every accumulation and grad sync (which set how many times it runs: :func:`mesh_times`)."""

    dimension: Dimension
    call: MeshCall
    dtype: DType
    group_size: int
    spans_nodes: bool
    sizes: tuple[int, ...]
    sent: int
    """Σ factor(n)·S over its calls, in bytes."""
    off_node: int
    """What of ``sent`` crosses nodes."""
    link: LinkFigures
    seconds: float
    """calls × α + sent / β."""


class MeshTime(NamedTuple):
    """One collective of a step as the step time reads it (:class:`MeshCollectiveCost`'s figures)."""

    dimension: Dimension
    op: Collective
    phase: Phase
    time_s: float
    scope: Scope


_MESH_RUNS: IdentityCache[tuple[MeshRun, ...]] = IdentityCache()


def mesh_runs(request: MeshRequest) -> tuple[MeshRun, ...]:
    """Every tensor-, context- and expert-parallel collective of the request's schedule that moves data,
    run once, in order. Once per request but its accumulation and recompute, which set how many times
    each runs (a plan's candidates of one mesh share them); the calibration, a model holding lists, keyed
    by identity."""
    key = request._replace(calibration=None, grad_accum=1, recompute=Recompute.NONE, checkpoint_every=1)
    cached = _MESH_RUNS.get(request.calibration, key)
    if cached is not None:
        return cached
    runs = []
    for dimension, call in _schedule(request):
        sizes = _sizes(call, request)
        if not sizes:
            continue
        n, spans_nodes = _group(dimension, request.mesh)
        dtype = _dtype(call.carried, request)
        spec = COLLECTIVES[call.op]
        sent = {size: spec.bytes_sent_per_rank(size * dtype.bytes, n) for size in set(sizes)}
        each = sum(sent[size] for size in sizes)
        off_node = sum(
            _off_node_bytes(dimension, size * dtype.bytes, sent[size], request.mesh) for size in sizes
        )
        link = _link(call.op, spans_nodes, n, request)
        seconds = len(sizes) * link.latency_s + each / link.bus_bandwidth_Bps
        runs.append(MeshRun(dimension, call, dtype, n, spans_nodes, sizes, each, off_node, link, seconds))
    return _MESH_RUNS.put(request.calibration, key, tuple(runs))


def _runs_per_step(run: MeshRun, request: MeshRequest, sync: GradSync) -> list[tuple[bool, int]]:
    """(re-run by recomputation, times per step) of each row ``run`` gives: its own, then its re-run
    where activation recomputation runs it again."""
    call = run.call
    times = _times(call.scope, request, sync, call.in_mlp)
    if not times:  # a dense MLP's collective in a model whose every layer routes to experts alone
        return []
    rows = [(False, times)]
    if call.reruns_under(request.recompute):
        rows.append((True, _rerun_times(call.scope, request, call.in_mlp)))
    return rows


def mesh_times(request: MeshRequest, sync: GradSync) -> list[MeshTime]:
    """:func:`mesh_costs`' dimension, op, phase and seconds of each row, without the rest of the row (what
    a plan's step time reads)."""
    return [
        MeshTime(run.dimension, run.call.op, run.call.phase, times * run.seconds, run.call.scope)
        for run in mesh_runs(request)
        for _, times in _runs_per_step(run, request, sync)
    ]


def mesh_costs(request: MeshRequest, sync: GradSync) -> list[MeshCollectiveCost]:
    """The tensor- and context-parallel collectives of a step and their cost (``sync``: when the strategy
    reduces gradients, which paces FSDP2's per-parameter reductions), each forward collective that
    activation recomputation runs again followed by its re-run."""
    costs = []
    for run in mesh_runs(request):
        call, dtype, link = run.call, run.dtype, run.link
        for recomputed, times in _runs_per_step(run, request, sync):
            costs.append(
                MeshCollectiveCost(
                    dimension=run.dimension,
                    op=call.op,
                    phase=call.phase,
                    recomputed=recomputed,
                    moves=call.moves,
                    scope=call.scope,
                    dtype=dtype,
                    group_size=run.group_size,
                    spans_nodes=run.spans_nodes,
                    elements=list(run.sizes),
                    times_per_step=times,
                    calls_per_step=times * len(run.sizes),
                    message_bytes=sum(run.sizes) * dtype.bytes,
                    bytes_sent_per_gpu=run.sent,
                    total_bytes_per_gpu=times * run.sent,
                    inter_node_bytes_per_gpu=times * run.off_node,
                    latency_s=link.latency_s,
                    bus_bandwidth_Bps=link.bus_bandwidth_Bps,
                    time_s=times * run.seconds,
                    bandwidth_source=link.source,
                    source=call.source,
                )
            )
    return costs
