"""Tensor parallelism in ``zerocalc validate``: the plan the worker applies, the combinations it refuses, and
the per-rank predictions a ``dp × tp`` run is compared with (pure, no torch).

The plan is torchtitan's (``torchtitan/models/llama3/infra/parallelize.py`` ``apply_tp``) on the module names
of :mod:`zerocalc.validate.model`, applied with ``parallelize_module`` on the tp sub-mesh before
``fully_shard`` on the dp sub-mesh (every block, then the root):

* ``embed_tokens``: ``RowwiseParallel(input_layouts=Replicate())``: the weight sharded over the vocabulary
  (``Shard(0)``), output ``Shard(1)`` (sequence parallel) or ``Replicate()``;
* ``attn.{q,k,v}_proj``, ``mlp.{gate,up}_proj`` / ``mlp.fc_in``: ``ColwiseParallel()``: weight and bias
  ``Shard(0)``; ``attn.o_proj``, ``mlp.down_proj`` / ``mlp.fc_out``: ``RowwiseParallel`` (weight
  ``Shard(1)``), output ``Shard(1)`` (sequence parallel) or ``Replicate()``;
* sequence parallel: every norm ``SequenceParallel()`` (its weight a replicated DTensor) and ``attn`` /
  ``mlp`` ``PrepareModuleInput(Shard(1) → Replicate())``; without it the norms stay plain tensors and
  ``attn`` / ``mlp`` get ``PrepareModuleInput(Replicate() → Replicate())``, so the input gradients of
  q, k, v (gate, up) are summed before one all-reduce, as Megatron-LM's ``f`` operator does;
* ``lm_head``: ``ColwiseParallel`` (weight ``Shard(0)``), output ``Shard(-1)`` kept as a DTensor under
  ``loss_parallel()`` (``torch/distributed/tensor/parallel/loss.py``), else ``Replicate()``.

DTensor shards a dimension with ``torch.chunk`` semantics (``ceil(d/t)`` on the first ranks); FSDP2 then
shards each parameter's tp-local tensor on dim 0 over the dp ranks the same way
(``_fully_shard/_fsdp_param.py`` ``FSDPParam._init_sharded_param``: ``_StridedShard`` when both shard dim 0).

:func:`predicted_tp_states` is the analytic core's model states of each rank;
:func:`predicted_tp_calls` lists each rank's collectives in the order it issues them, with the sizes of
the core's tensor shards (their sums per collective and phase are ``zerocalc comm``'s mesh collectives,
tests/validate/test_validate_tp.py).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.base.units import ceil_div
from zerocalc.model.architecture import (
    Architecture,
    ParamTensor,
    TensorParallelRank,
    parameter_tensors,
    tensor_parallel_dim,
    tensor_parallel_shape,
)
from zerocalc.parallel.framework_records.pytorch import FSDP2
from zerocalc.parallel.frameworks import TorchSetup, TorchWrapper
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.states.framework import RankStates, dim0_rows, fsdp_units, predict_rank_states
from zerocalc.validate.config import STRATEGIES, Job, TpPlan

TP_STRATEGIES = ("fsdp2", "fsdp2-no-reshard")
"""The ``--strategies`` of ``validate tp``: FSDP2 over the dp sub-mesh after the TP plan."""
REDUCE_DTYPE = DType.FP32
"""FSDP2's reduce-scatter dtype: fp32 (``MixedPrecisionPolicy(reduce_dtype=float32)`` under bf16-mixed)."""


class TpStyle(StrEnum):
    COLWISE = "colwise"
    ROWWISE = "rowwise"
    REPLICATED = "replicated"


TP_STYLES = {
    "embed_tokens": TpStyle.ROWWISE,
    "q_proj": TpStyle.COLWISE,
    "k_proj": TpStyle.COLWISE,
    "v_proj": TpStyle.COLWISE,
    "o_proj": TpStyle.ROWWISE,
    "gate_proj": TpStyle.COLWISE,
    "up_proj": TpStyle.COLWISE,
    "down_proj": TpStyle.ROWWISE,
    "fc_in": TpStyle.COLWISE,
    "fc_out": TpStyle.ROWWISE,
    "input_norm": TpStyle.REPLICATED,
    "post_attention_norm": TpStyle.REPLICATED,
    "final_norm": TpStyle.REPLICATED,
    "lm_head": TpStyle.COLWISE,
}
"""The plan, by the last part of a module's name in :mod:`zerocalc.validate.model`."""


def tp_style(tensor: ParamTensor) -> TpStyle:
    return TP_STYLES[tensor.module.rsplit(".", 1)[-1]]


def tp_local_shape(tensor: ParamTensor, tp: int, tp_rank: int, arch: Architecture) -> tuple[int, ...]:
    """The tensor's shape on ``tp_rank`` of ``tp``: the analytic core's
    (:func:`~zerocalc.model.architecture.tensor_parallel_shape`: ``torch.chunk`` over the split dim)."""
    return tensor_parallel_shape(tensor, TensorParallelRank(**dict(arch), tp=tp, tp_index=tp_rank))


def _rest(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[1:]:
        n *= d
    return n


def local_numel(tensor: ParamTensor, plan: TpPlan, rank: int, arch: Architecture) -> int:
    """Elements ``rank`` holds at rest: the tp-local tensor's dim-0 chunk over the dp ranks."""
    shape = tp_local_shape(tensor, plan.tp, plan.tp_rank(rank), arch)
    return dim0_rows(shape[0], plan.dp, plan.dp_rank(rank)) * _rest(shape)


def padded_numel(tensor: ParamTensor, plan: TpPlan, rank: int, arch: Architecture) -> int:
    """Elements of the tp-local tensor with dim 0 padded to a multiple of dp (FSDP2's all-gather output)."""
    shape = tp_local_shape(tensor, plan.tp, plan.tp_rank(rank), arch)
    return ceil_div(shape[0], plan.dp) * plan.dp * _rest(shape)


# ------------------------------------------------------------------------------------------ refusals
def plan_for(world: int, tp: int, sequence_parallel: bool, loss_parallel: bool) -> TpPlan:
    """The ``dp × tp`` mesh of ``world`` ranks; one line when ``tp`` does not divide it."""
    if tp < 2 or world % tp:
        raise InputError(
            f"--tp {tp} does not divide the {world} ranks; accepted: a divisor ≥ 2 of the world size "
            "(dp = ranks / tp)"
        )
    return TpPlan(dp=world // tp, tp=tp, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel)


def check_tp(arch: Architecture, plan: TpPlan, strategies: list[str], grad_accum: int) -> None:
    """One line (:class:`InputError`) for a combination ``validate tp`` cannot build or predict."""
    t = plan.tp
    bad = [s for s in strategies if s not in TP_STRATEGIES]
    if bad:
        raise InputError(
            f"--strategies {bad[0]} with --tp {t} is not accepted; accepted: {', '.join(TP_STRATEGIES)} "
            "(FSDP2 over the dp mesh after the TP plan)"
        )
    check_tp_model(arch, t)
    if grad_accum != 1:
        raise InputError(f"--grad-accum {grad_accum} with --tp {t} is not accepted; accepted: --grad-accum 1")


def check_tp_model(arch: Architecture, t: int) -> None:
    """One line for a model the plan cannot split over ``t`` ranks: heads, key/value heads or the MLP width
    not divisible by t; a tied head, learned positions, row-parallel biases; a module the plan does not
    cover."""
    divisible = {
        "--heads": arch.num_heads,
        "--kv-heads": arch.kv_heads,
        "--ffn": arch.intermediate_size,
    }
    for option, value in divisible.items():
        if value % t:
            raise InputError(
                f"{option} {value} is not a multiple of --tp {t}; accepted: {option} divisible by --tp "
                "(heads and the MLP width are split evenly over the tp ranks)"
            )
    beyond = []
    if arch.tied_embeddings:
        beyond.append("an LM head tied to the embedding")
    if arch.learned_position_embeddings:
        beyond.append("learned position embeddings")
    if arch.out_bias or arch.mlp_bias:
        beyond.append("biases on the row-parallel projections (o_proj, down_proj / fc_out)")
    if beyond:
        listed = beyond[0] if len(beyond) == 1 else f"{', '.join(beyond[:-1])} and {beyond[-1]}"
        raise InputError(
            f"{arch.name} has {listed}; --tp builds torchtitan's plan, which has none; "
            "accepted: an untied model with rotary positions (llama, mistral, qwen2: e.g. --model llama-3-8b)"
        )
    uncovered = sorted({m.module.rsplit(".", 1)[-1] for m in parameter_tensors(arch)} - set(TP_STYLES))
    if uncovered:
        raise InputError(
            f"{arch.name} has modules torchtitan's TP plan does not cover ({', '.join(uncovered)}); "
            "accepted: a dense Llama-layout model (llama, mistral, qwen2)"
        )


# ------------------------------------------------------------------------------------- the states
def predicted_tp_states(
    arch: Architecture,
    setup: TorchSetup,
    plan: TpPlan,
    rank: int,
    precision: PrecisionName,
    optimizer: OptimizerName,
) -> RankStates:
    """What the analytic core predicts ``rank`` of a ``dp × tp`` mesh holds after one step of FSDP2 over dp
    after the TP plan: :func:`~zerocalc.states.framework.predict_rank_states` of the rank's
    :class:`~zerocalc.model.architecture.TensorParallelRank` (its tp index's ``torch.chunk`` shards, no
    vocabulary padding) over the dp ranks."""
    if setup.wrapper is not TorchWrapper.FSDP2:
        raise InputError(f"--tp runs FSDP2 only; accepted: {', '.join(TP_STRATEGIES)}")
    share = TensorParallelRank(**dict(arch), tp=plan.tp, tp_index=plan.tp_rank(rank))
    return predict_rank_states(share, setup, plan.dp, plan.dp_rank(rank), precision, optimizer)


# -------------------------------------------------------------------------------- the collectives
class TpCall(BaseModel):
    """One collective a rank issues in the step, in the order it issues it."""

    model_config = ConfigDict(frozen=True)

    op: str
    phase: str
    dtype: str
    group: str = Field(description="dp or tp")
    group_size: int
    elements: int = Field(description="S: the all_gather output, the reduce_scatter input, else the input")
    behaviour: str


def _unit_numel(unit: list[ParamTensor], plan: TpPlan, rank: int, arch: Architecture) -> int:
    return sum(padded_numel(t, plan, rank, arch) for t in unit)


def predicted_tp_calls(
    arch: Architecture,
    setup: TorchSetup,
    plan: TpPlan,
    rank: int,
    precision: PrecisionName,
    batch: int,
    seq: int,
) -> list[TpCall]:
    """Every collective ``rank`` issues in one step of ``batch`` sequences of ``seq`` tokens (loss over the
    first ``seq − 1`` positions), in order.

    TP (``torch/distributed/tensor/parallel/style.py``, ``_redistribute.py``; activations b·s·h in the
    forward dtype): with sequence parallel each block all-gathers its attention and MLP inputs (``Shard(1)
    → Replicate``) and reduce-scatters the row-parallel outputs (``Partial → Shard(1)``) in forward, the
    reverse in backward, and FSDP2's post-backward all-reduces each replicated norm weight's ``Partial``
    gradient over tp (``FSDPParam._get_grad_inner_tensor``) before its reduce-scatter; without it the
    row-parallel outputs are all-reduced in forward and the attention and MLP input gradients in
    backward. ``loss_parallel``'s cross entropy all-reduces the max, the sum of exponentials and the
    target logit (b·(s−1) fp32 each, ``loss.py``); without it the logits are all-gathered over the
    vocabulary, padded to ``t·ceil(V/t)``. FSDP2 over dp (``_fsdp_collectives.py``): per unit an all-gather
    of the padded tp-local shards in the forward dtype, the root first; in backward the root's
    pre-backward prefetches the last block, each block's pre-backward the one before it (when resharded);
    one fp32 reduce-scatter per unit.
    """
    fwd = FSDP2.dtypes(precision).compute.value
    reduce = REDUCE_DTYPE.value
    tokens = batch * seq * arch.hidden_size
    vocab = ceil_div(arch.vocab_size, plan.tp) * plan.tp
    sp, lp, reshard = plan.sequence_parallel, plan.loss_parallel, setup.reshard_after_forward
    units = dict(fsdp_units(arch))
    blocks = [name for name in units if name != "root"]
    replicated = {name: [t for t in unit if tensor_parallel_dim(t) is None] for name, unit in units.items()}
    calls: list[TpCall] = []

    def tp_call(op: str, phase: str, elements: int, behaviour: str, dtype: str = fwd) -> None:
        calls.append(TpCall(op=op, phase=phase, dtype=dtype, group="tp", group_size=plan.tp,
                            elements=elements, behaviour=behaviour))  # fmt: skip

    def dp_call(op: str, phase: str, unit: str) -> None:
        behaviour = (
            f"FSDP2 all-gathers {unit}'s padded tp-local shards over dp"
            if op == "all_gather"
            else f"FSDP2 reduce-scatters {unit}'s gradients over dp in fp32"
        )
        calls.append(TpCall(op=op, phase=phase, dtype=fwd if op == "all_gather" else reduce, group="dp",
                            group_size=plan.dp, elements=_unit_numel(units[unit], plan, rank, arch),
                            behaviour=behaviour))  # fmt: skip

    def grad_all_reduces(unit: str) -> None:
        if sp:
            for t in replicated[unit]:
                tp_call("all_reduce", "backward", t.numel, "SequenceParallel weight's Partial gradient")

    # forward
    dp_call("all_gather", "forward", "root")
    if sp:
        tp_call("reduce_scatter", "forward", tokens, "embedding (vocab-sharded) output → sequence shard")
    else:
        tp_call("all_reduce", "forward", tokens, "embedding (vocab-sharded) output all-reduced")
    for block in blocks:
        dp_call("all_gather", "forward", block)
        for part in ("attention", "MLP"):
            if sp:
                tp_call("all_gather", "forward", tokens, f"{part} input: sequence shard → replicated")
                tp_call("reduce_scatter", "forward", tokens, f"{part} row-parallel output → sequence shard")
            else:
                tp_call("all_reduce", "forward", tokens, f"{part} row-parallel output all-reduced")
    if sp:
        tp_call("all_gather", "forward", tokens, "LM head input: sequence shard → replicated")
    if lp:
        for what in ("max", "sum of exponentials", "target logit"):
            tp_call("all_reduce", "forward", batch * (seq - 1), f"loss_parallel: {what}", DType.FP32.value)
    else:
        tp_call("all_gather", "forward", batch * seq * vocab, "LM head logits gathered over the vocabulary")
    # backward
    if reshard and blocks:
        dp_call("all_gather", "backward", blocks[-1])
    if sp:
        tp_call("reduce_scatter", "backward", tokens, "LM head input gradient → sequence shard")
    else:
        tp_call("all_reduce", "backward", tokens, "LM head input gradient all-reduced")
    for i in reversed(range(len(blocks))):
        if reshard and i > 0:
            dp_call("all_gather", "backward", blocks[i - 1])
        for part in ("MLP", "attention"):
            if sp:
                tp_call("all_gather", "backward", tokens, f"{part} output gradient → replicated")
                tp_call("reduce_scatter", "backward", tokens, f"{part} input gradient → sequence shard")
            else:
                tp_call("all_reduce", "backward", tokens, f"{part} input gradient all-reduced")
        grad_all_reduces(blocks[i])
        dp_call("reduce_scatter", "backward", blocks[i])
    if sp:
        tp_call("all_gather", "backward", tokens, "embedding output gradient → replicated")
    grad_all_reduces("root")
    dp_call("reduce_scatter", "backward", "root")
    return calls


def tp_predictions(job: Job) -> tuple[list[RankStates], list[list[TpCall]]]:
    """Every rank's states and calls for ``job`` (which has a ``tp_plan``), rank 0 first."""
    plan = job.tp_plan
    assert plan is not None
    setup = STRATEGIES[job.strategy][2]
    ranks = range(plan.world)
    return (
        [predicted_tp_states(job.arch, setup, plan, r, job.precision, job.optimizer) for r in ranks],
        [predicted_tp_calls(job.arch, setup, plan, r, job.precision, job.batch, job.seq) for r in ranks],
    )
