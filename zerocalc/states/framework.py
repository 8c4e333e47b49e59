"""Exact per-rank model-state bytes of the real PyTorch frameworks (pure: no torch).

``zerocalc memory``'s analytic model counts Ψ·bytes/N. The real implementations differ in small, exact
ways that this module models tensor by tensor, from :func:`zerocalc.model.architecture.parameter_tensors` (the
same list the analytic count uses). Every rule below is read from the torch 2.13 source named in its
docstring (``torch/distributed/...``); ``zerocalc validate`` measures the same quantities on a real run
and compares them line by line.

Wrapping (FSDP1 and FSDP2): one unit per transformer block ``layers.<i>`` (its norms, attention and MLP
parameters), plus the root unit holding everything else: ``embed_tokens`` (shared with the LM head when
tied, counted once), ``embed_positions`` (learned positions), ``final_norm`` and ``lm_head``.

Lines per rank:

* ``params``: bytes of the parameters this rank holds at rest (fp32: the model is built in fp32 and the
  mixed-precision recipes keep the fp32 sharded parameter as the master copy);
* ``grads``: bytes of ``.grad`` of the parameters the optimizer sees, after ``backward`` and ``step``;
* ``optimizer``: Adam/AdamW ``exp_avg`` and ``exp_avg_sq`` of the parameters whose state lives on this
  rank (fp32, shaped like the local parameter);
* ``step``: Adam's ``step`` counters, one 0-dim fp32 tensor per parameter with state
  (``torch/optim/adam.py`` ``Adam._init_group``: ``torch.tensor(0.0, dtype=_get_scalar_dtype())``);
* ``unsharded_after_forward``: bytes of full (all-gathered) parameters the framework still holds after
  the forward pass, in the forward dtype (bf16 under ``bf16-mixed``).
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.base.units import ceil_div
from zerocalc.model.architecture import Architecture, ParamTensor, is_expert_tensor, parameter_tensors
from zerocalc.network.cluster import Cluster
from zerocalc.parallel.framework_records.pytorch import TORCH_OPTIMIZERS, TORCH_PRECISIONS
from zerocalc.parallel.frameworks import Fsdp1Sharding, TorchSetup, TorchWrapper
from zerocalc.parallel.optimizers import OPTIMIZERS, OptimizerName
from zerocalc.parallel.precision import RECIPES, PrecisionName

STATE_LINES = ("params", "grads", "optimizer", "step")
"""The model-state lines: an exact match is expected for each."""
LINES = (*STATE_LINES, "unsharded_after_forward")

STATES_RECIPE = RECIPES[PrecisionName.FP32]
"""The dtypes of the states every rank keeps under each accepted precision (``TORCH_PRECISIONS``): the
fp32 recipe's. The sharded fp32 parameter is the master copy under ``MixedPrecision``/
``MixedPrecisionPolicy`` (and DDP's autocast keeps fp32 parameters), ``.grad`` is in the sharded
parameter's dtype, and Adam creates its states ``zeros_like`` the parameter (``torch/optim/adam.py``
``Adam._init_group``)."""
STEP_BYTES = DType.FP32.bytes
"""One Adam ``step`` counter: a 0-dim fp32 tensor."""
ADAM_STATES = len(OPTIMIZERS[OptimizerName.ADAM].states)
"""``exp_avg`` and ``exp_avg_sq`` (no amsgrad)."""
REPLICATED_WRAPPERS = (TorchWrapper.DDP, TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER)
"""The wrappers that keep whole parameters and gradients on every rank (DDP's reducer)."""


class Line(BaseModel):
    model_config = ConfigDict(frozen=True)

    bytes: int = Field(ge=0)
    explanation: str


class RankStates(BaseModel):
    """What one rank holds, exactly, with a short explanation per line."""

    model_config = ConfigDict(frozen=True)

    setup: TorchSetup
    world_size: int
    rank: int
    precision: PrecisionName
    optimizer: OptimizerName
    params: Line
    grads: Line
    optimizer_states: Line
    step: Line
    unsharded_after_forward: Line
    frozen: Line | None = Field(
        default=None,
        description="fine-tuning: the frozen parameters this rank holds (None: every parameter trained; "
        "zerocalc.states.finetune_ranks)",
    )

    def line(self, name: str) -> Line:
        return self.optimizer_states if name == "optimizer" else getattr(self, name)

    @property
    def model_states(self) -> int:
        """params + grads + optimizer states + step counters (+ a fine-tuning run's frozen parameters)."""
        frozen = self.frozen.bytes if self.frozen is not None else 0
        return sum(self.line(name).bytes for name in STATE_LINES) + frozen


def reducer_buckets(states: RankStates) -> Line:
    """DDP's reducer buckets: with ``gradient_as_bucket_view=False`` (the default) they are a second copy of
    every gradient, not a ``.grad`` (``torch/nn/parallel/distributed.py``; DDP docs); ``bucket_cap_mb`` only
    sets their size. None for the FSDP wrappers."""
    if states.setup.wrapper not in REPLICATED_WRAPPERS:
        return Line(bytes=0, explanation="no DDP reducer")
    return Line(
        bytes=states.grads.bytes,
        explanation="PyTorch DDP docs: with gradient_as_bucket_view=False (default) the buckets are a "
        "second copy of every gradient; bucket_cap_mb only sets their size",
    )


def param_bytes(elements: int) -> int:
    """Bytes of ``elements`` parameter elements as every rank keeps them (:data:`STATES_RECIPE`)."""
    return elements * STATES_RECIPE.param_dtype.bytes


def grad_bytes(elements: int) -> int:
    """Bytes of ``elements`` gradient elements (``.grad`` in the sharded parameter's dtype)."""
    return elements * STATES_RECIPE.grad_dtype.bytes


def optimizer_state_bytes(elements: int, optimizer: OptimizerName) -> int:
    """Bytes of the optimizer's states of ``elements`` parameter elements (Adam: ``exp_avg`` and
    ``exp_avg_sq``, shaped like the fp32 parameter)."""
    return sum(OPTIMIZERS[optimizer].state_bytes(elements, STATES_RECIPE.optimizer_state_dtype).values())


def shard_ranks(cluster: Cluster, setup: TorchSetup) -> int:
    """The ranks a parameter is sharded over (one node's under hybrid sharding); the world where nothing is
    sharded (DDP, and ZeroRedundancyOptimizer, which partitions over the world)."""
    return cluster.group_size(setup.shard_group) if setup.shard_group else cluster.world_size


# ------------------------------------------------------------------------------------------ the rules
def fsdp_units(arch: Architecture) -> list[tuple[str, list[ParamTensor]]]:
    """The wrapping: ``("layers.<i>", block tensors)`` per block, then ``("root", the rest)``."""
    tensors = parameter_tensors(arch)
    return [(name, [tensors[i] for i in unit]) for name, unit in fsdp_unit_positions(tensors)]


def fsdp_unit_positions(tensors: list[ParamTensor]) -> list[tuple[str, list[int]]]:
    """:func:`fsdp_units` of these tensors (in registration order), each unit's as positions in them."""
    blocks: dict[str, list[int]] = {}
    root: list[int] = []
    units: dict[str, str] = {}
    """Each block module's unit, ``layers.<i>`` (a block's tensors share a few modules)."""
    for i, t in enumerate(tensors):
        module = t.module
        if module.startswith("layers."):
            unit = units.get(module)
            if unit is None:
                unit = units[module] = "layers." + module[len("layers.") :].partition(".")[0]
            blocks.setdefault(unit, []).append(i)
        else:
            root.append(i)
    return [*blocks.items(), ("root", root)]


def peft_fsdp1_unit_positions(
    tensors: list[ParamTensor], trained: list[bool], dora_forward: bool = False
) -> list[tuple[str, list[int]]]:
    """FSDP1's units of a PEFT model under PEFT's ``fsdp_auto_wrap_policy`` (peft 0.21.2
    ``utils/other.py``: ``lambda_policy_fn`` wraps every leaf module whose ``weight`` requires grad,
    ``transformer_auto_wrap_policy`` the decoder layers): each module with a trained ``weight`` (an
    adapter's ``lora_A``/``lora_B`` Linear, DoRA's magnitude, a ``modules_to_save`` copy) its own unit of
    all its tensors, named by the module; then the blocks and the root of :func:`fsdp_unit_positions`
    with what is left (the frozen base). ``trained[i]``: whether ``tensors[i]`` requires grad. Every
    tensor of the modelled PEFT models sits in a leaf module (PEFT's layers hold no parameter of their
    own). ``dora_forward``: the forward's gathers,
    where a DoRA module's ``lora_A`` and ``lora_B`` units come twice (peft 0.21.2 ``tuners/lora/dora.py``
    ``get_lora_weight``: ``lora_B(lora_A(x_eye))``, a second call of each adapter unit, which FSDP1
    gathers again under FULL_SHARD, which reshards it after each forward; the backward re-gathers each
    unit once)."""
    leaves = {t.module for t, tr in zip(tensors, trained, strict=True) if tr and t.name == "weight"}
    own: dict[str, list[int]] = {}
    rest: list[int] = []
    for i, t in enumerate(tensors):
        if t.module in leaves:
            own.setdefault(t.module, []).append(i)
        else:
            rest.append(i)
    shared = fsdp_unit_positions([tensors[i] for i in rest])
    again: list[tuple[str, list[int]]] = []
    if dora_forward:
        for name, unit in own.items():
            parent, _, tail = name.rpartition(".")  # X.lora_A.<adapter> → X.lora_magnitude_vector.<adapter>
            base, _, kind = parent.rpartition(".")
            if kind in ("lora_A", "lora_B") and f"{base}.lora_magnitude_vector.{tail}" in own:
                again.append((f"{name} (DoRA's eye pass)", unit))
    return [*own.items(), *again, *((name, [rest[j] for j in unit]) for name, unit in shared)]


def fsdp1_shard_numel(unit_numel: int, world_size: int, sharding: Fsdp1Sharding) -> int:
    """Elements of one FSDP1 ``FlatParameter`` on each rank.

    ``torch/distributed/fsdp/_flat_param.py`` ``FlatParamHandle.shard`` / ``_get_shard``: the flat
    parameter (the unit's parameters concatenated, no alignment padding with ``use_orig_params=False``:
    ``_get_aligned_numel`` applies only with ``align_addresses = use_orig_params``) is cut with
    ``torch.chunk(world_size)`` and each chunk right-padded to the first chunk's size, so every rank holds
    ``ceil(numel / N)`` elements (the flat parameter padded to a multiple of N). ``NO_SHARD`` does not
    shard (``uses_sharded_strategy`` is false): every rank holds the whole flat parameter, unpadded.
    """
    if sharding is Fsdp1Sharding.NO_SHARD:
        return unit_numel
    return fsdp1_padded_numel(unit_numel, world_size) // world_size


def fsdp1_padded_numel(unit_numel: int, world_size: int) -> int:
    """Elements of one sharded FSDP1 ``FlatParameter`` padded to a multiple of N (:func:`fsdp1_shard_numel`):
    what each rank's shard is cut from and what an all-gather returns."""
    return ceil_div(unit_numel, world_size) * world_size


def dim0_rows(rows: int, world_size: int, rank: int) -> int:
    """Rows of a dim-0 ``torch.chunk`` that ``rank`` gets (FSDP2).

    ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` ``FSDPParam._init_sharded_param`` uses
    ``_chunk_with_empty(param, world_size, dim=0)`` (``torch.chunk`` padded with empty chunks): chunk
    size ``ceil(d0 / N)``; the last ranks get fewer rows, or none.
    """
    chunk = ceil_div(rows, world_size)
    return max(0, min(chunk, rows - rank * chunk))


def zero1_partition(tensors: list[ParamTensor], world_size: int) -> list[list[ParamTensor]]:
    """``ZeroRedundancyOptimizer``'s partition of whole tensors over ranks (:func:`zero1_owners`)."""
    return [[tensors[i] for i in owned] for owned in zero1_owners([t.numel for t in tensors], world_size)]


@lru_cache(maxsize=256)
def zero1_rank_elements(arch: Architecture, world_size: int) -> tuple[tuple[int, ...], ...]:
    """The elements of each tensor each rank owns under :func:`zero1_partition` (once per architecture and
    world), rank 0 first."""
    parts = zero1_partition(parameter_tensors(arch), world_size)
    return tuple(tuple(t.numel for t in part) for part in parts)


def zero1_owners(numels: list[int], world_size: int) -> list[list[int]]:
    """``ZeroRedundancyOptimizer``'s partition of tensors of these sizes over ranks: each rank's tensors, as
    positions in ``numels``.

    ``torch/distributed/optim/zero_redundancy_optimizer.py`` ``_partition_parameters``: the (one)
    param group's parameters sorted by ``numel`` largest first (Python's stable sort: ties keep
    ``model.parameters()`` order), each assigned to the rank with the smallest total so far
    (``_get_min_index``: the first such rank).
    """
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    totals = [(0, rank) for rank in range(world_size)]  # a heap: the smallest total, then the first rank
    for i in sorted(range(len(numels)), key=numels.__getitem__, reverse=True):
        total, rank = totals[0]
        ranks[rank].append(i)
        heapq.heapreplace(totals, (total + numels[i], rank))
    return ranks


def _rest(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape[1:]:
        n *= dim
    return n


def dim0_shard_numel(shape: tuple[int, ...], world_size: int, rank: int) -> int:
    """FSDP2: the elements of one tensor's dim-0 shard on ``rank`` (:func:`dim0_rows` rows)."""
    return dim0_rows(shape[0], world_size, rank) * _rest(shape)


def dim0_padded_numel(shape: tuple[int, ...], world_size: int) -> int:
    """FSDP2: one tensor with its dim 0 padded to a multiple of N (:func:`dim0_rows`, ``FSDPParamGroup``'s
    all-gather output)."""
    return ceil_div(shape[0], world_size) * world_size * _rest(shape)


def expert_parallel_degree(arch: Architecture) -> int:
    """e: the expert-parallel ranks the routed experts are split over (E / the experts the rank holds)."""
    return arch.num_experts // arch.local_experts if arch.is_moe else 1


def expert_shard_dim(arch: Architecture, data_ranks: int) -> int:
    """The dimension FSDP2 shards the routed experts on under expert parallelism, with ``data_ranks`` = dp·c
    (torchtitan ``models/llama4/infra/parallelize.py`` ``apply_fsdp``: ``Shard(1)`` when
    ``dp_mod_ep_mesh.size() * ep_degree > num_experts``, the dp·c ranks outnumbering the experts; else
    dim 0, the rank's E/e experts)."""
    return 1 if data_ranks > arch.num_experts else 0


def fsdp2_sharding(
    tensor: ParamTensor, arch: Architecture, world_size: int, expert_world: int, expert_dim: int
) -> tuple[tuple[int, ...], int]:
    """How FSDP2 shards ``tensor`` of rank architecture ``arch``: the shape whose dim 0 it splits (the
    sharded dimension moved first) and the ranks it splits it over.

    Without expert parallelism every tensor is split on dim 0 over the ``world_size`` ranks. With it
    (torchtitan ``models/llama4/infra/parallelize.py`` ``apply_fsdp``) the routed experts are a
    ``fully_shard`` group of their own on the ``dp_shard_mod_ep`` mesh, ``expert_world`` ranks, split on
    ``expert_dim`` (:func:`expert_shard_dim`); the other tensors as without it."""
    if expert_parallel_degree(arch) == 1 or not is_expert_tensor(tensor):
        return tensor.shape, world_size
    return sharded_dim_first(tensor.shape, expert_dim), expert_world


def sharded_dim_first(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """``shape`` with dimension ``dim`` moved first: a tensor sharded on ``dim`` has the chunks and padding
    of this shape sharded on dim 0 (the rest of the shape multiplies each row)."""
    return (shape[dim], *shape[:dim], *shape[dim + 1 :]) if dim else shape


def padded_unit_numel(unit: list[ParamTensor], world_size: int, wrapper: TorchWrapper) -> int:
    """Elements of one unit when all-gathered (unsharded) on ``world_size`` ranks, padding included.

    FSDP1: the flat parameter padded to a multiple of N (:func:`fsdp1_shard_numel`); FSDP2: each tensor's
    dim 0 padded to a multiple of N (:func:`dim0_padded_numel`).
    """
    if wrapper is TorchWrapper.FSDP2:
        return sum(dim0_padded_numel(t.shape, world_size) for t in unit)
    return fsdp1_padded_numel(sum(t.numel for t in unit), world_size)


# ------------------------------------------------------------------------------------------ the model
def _check(
    arch: Architecture, world_size: int, rank: int, precision: PrecisionName, optimizer: OptimizerName
) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise InputError(f"rank {rank} of world {world_size} is not accepted; accepted: 0 ≤ rank < N")
    if precision not in TORCH_PRECISIONS:
        accepted = ", ".join(p.value for p in TORCH_PRECISIONS)
        raise InputError(
            f"{{precision}} {precision.value} is not what PyTorch's MixedPrecision runs; accepted: {accepted}"
        )
    if optimizer not in TORCH_OPTIMIZERS:
        accepted = ", ".join(o.value for o in TORCH_OPTIMIZERS)
        raise InputError(f"{{optimizer}} {optimizer.value} is not modelled here; accepted: {accepted}")


def _rank_states(
    common: dict[str, object],
    optimizer: OptimizerName,
    held: int,
    stepped: int,
    counters: int,
    texts: tuple[str, str, str, str],
    unsharded_after_forward: Line,
) -> RankStates:
    """A rank's lines from its elements: ``held`` parameter (and gradient) elements, ``stepped`` elements
    with optimizer states, ``counters`` step counters; ``texts`` explain params, grads, optimizer, step."""
    params, grads, states, step = texts
    return RankStates(
        **common,  # type: ignore[arg-type]
        params=Line(bytes=param_bytes(held), explanation=params),
        grads=Line(bytes=grad_bytes(held), explanation=grads),
        optimizer_states=Line(bytes=optimizer_state_bytes(stepped, optimizer), explanation=states),
        step=Line(bytes=counters * STEP_BYTES, explanation=step),
        unsharded_after_forward=unsharded_after_forward,
    )


def predict_rank_states(
    arch: Architecture,
    setup: TorchSetup,
    world_size: int,
    rank: int,
    precision: PrecisionName = PrecisionName.FP32,
    optimizer: OptimizerName = OptimizerName.ADAM,
    tensors: list[ParamTensor] | None = None,
    expert_world: int | None = None,
    expert_dim: int | None = None,
) -> RankStates:
    """Exact bytes rank ``rank`` of ``world_size`` holds after one full training step under ``setup``.

    ``world_size`` is the ranks a parameter is sharded over (one node's under hybrid sharding).
    ``tensors``: the parameters the wrapped module holds, in registration order (a pipeline stage's);
    None: every parameter of ``arch``. Under expert parallelism (``arch`` an expert-parallel rank's share)
    ``expert_world`` is the ranks the routed experts are sharded over and ``expert_dim`` the dimension
    (:func:`fsdp2_sharding`; defaults: ``world_size`` / e, and :func:`expert_shard_dim` of ``world_size``,
    as under full sharding); rank ``rank`` holds the experts' shard of index ``rank // e`` there (the EP
    group is innermost).
    """
    _check(arch, world_size, rank, precision, optimizer)
    fwd = RECIPES[precision].param_dtype  # the forward dtype: MixedPrecision's param_dtype, or fp32
    whole_model = tensors is None
    tensors = parameter_tensors(arch) if tensors is None else tensors
    units = (
        fsdp_units(arch)
        if whole_model
        else [(name, [tensors[i] for i in unit]) for name, unit in fsdp_unit_positions(tensors)]
    )
    common: dict[str, object] = {
        "setup": setup,
        "world_size": world_size,
        "rank": rank,
        "precision": precision,
        "optimizer": optimizer,
    }

    if setup.wrapper in REPLICATED_WRAPPERS:
        held = sum(t.numel for t in tensors)
        if setup.wrapper is TorchWrapper.DDP:
            owned = [t.numel for t in tensors]
            how = "every parameter"
        else:
            owned = (
                list(zero1_rank_elements(arch, world_size)[rank])
                if whole_model
                else [tensors[i].numel for i in zero1_owners([t.numel for t in tensors], world_size)[rank]]
            )
            how = f"{len(owned)} of {len(tensors)} whole tensors (greedy partition, largest first)"
        opt_numel = sum(owned)
        return _rank_states(
            common,
            optimizer,
            held,
            opt_numel,
            len(owned),
            (
                f"{held:,} fp32 elements: the whole model, replicated",
                f"{held:,} fp32 elements: all-reduced by DDP",
                f"exp_avg + exp_avg_sq of {how}: 2 × {opt_numel:,} fp32",
                f"{len(owned)} fp32 step counters",
            ),
            Line(bytes=0, explanation="none: DDP never shards parameters"),
        )

    if setup.wrapper is TorchWrapper.FSDP1:
        shard = setup.sharding or Fsdp1Sharding.FULL_SHARD
        local = 0
        kept = 0
        kept_units: list[str] = []
        for name, unit in units:
            numel = sum(t.numel for t in unit)
            local += fsdp1_shard_numel(numel, world_size, shard)
            # ``_runtime_utils._post_forward_reshard``: free after forward only for non-root units of
            # RESHARD_AFTER_FORWARD strategies (FULL_SHARD); SHARD_GRAD_OP keeps every unit unsharded.
            if shard is Fsdp1Sharding.SHARD_GRAD_OP or (shard is Fsdp1Sharding.FULL_SHARD and name == "root"):
                kept += padded_unit_numel(unit, world_size, setup.wrapper)
                kept_units.append(name)
        n_flat = len(units)
        pad_note = "" if shard is Fsdp1Sharding.NO_SHARD else ", padded to a multiple of N"
        if shard is Fsdp1Sharding.NO_SHARD:
            kept_text = "none: NO_SHARD keeps whole flat parameters"
        elif kept_units == ["root"]:
            kept_text = f"the root unit's padded flat parameter ({kept:,} {fwd.value}); blocks resharded"
        else:
            kept_text = f"all {len(kept_units)} padded flat parameters ({kept:,} {fwd.value}): SHARD_GRAD_OP"
        return _rank_states(
            common,
            optimizer,
            local,
            local,
            n_flat,
            (
                f"{n_flat} flat parameters, {local:,} fp32 elements on this rank{pad_note}",
                f"{local:,} fp32: the sharded flat parameters' dtype",
                f"2 × {local:,} fp32 (follow the flat params)",
                f"{n_flat} fp32 step counters (one per flat param)",
            ),
            Line(bytes=kept * fwd.bytes, explanation=kept_text),
        )

    # FSDP2
    ep = expert_parallel_degree(arch)
    experts_world = world_size // ep if expert_world is None else expert_world
    dim = expert_shard_dim(arch, world_size) if expert_dim is None else expert_dim

    def local_numel(t: ParamTensor) -> int:
        shape, ranks = fsdp2_sharding(t, arch, world_size, experts_world, dim)
        return dim0_shard_numel(shape, ranks, rank // ep if is_expert_tensor(t) else rank)

    def padded_numel(t: ParamTensor) -> int:
        return dim0_padded_numel(*fsdp2_sharding(t, arch, world_size, experts_world, dim))

    local = sum(local_numel(t) for t in tensors)
    kept = 0
    for name, unit in units:
        if not setup.reshard_after_forward or name == "root":
            # ``FSDPState._lazy_init``: the root's ``post_forward_mesh_info`` is None (not resharded).
            kept += sum(padded_numel(t) for t in unit)
    kept_text = (
        "every group's padded unsharded parameters (reshard_after_forward=False)"
        if not setup.reshard_after_forward
        else "the root group's padded unsharded parameters (the root is never resharded after forward)"
    )
    return _rank_states(
        common,
        optimizer,
        local,
        local,
        len(tensors),
        (
            f"{len(tensors)} DTensors sharded on dim 0: {local:,} fp32 local elements",
            f"{local:,} fp32: sharded like the parameters",
            f"2 × {local:,} fp32 local shards",
            f"{len(tensors)} fp32 step counters",
        ),
        Line(bytes=kept * fwd.bytes, explanation=f"{kept:,} {fwd.value}: {kept_text}"),
    )


def predict_all_ranks(
    arch: Architecture,
    setup: TorchSetup,
    world_size: int,
    precision: PrecisionName = PrecisionName.FP32,
    optimizer: OptimizerName = OptimizerName.ADAM,
) -> list[RankStates]:
    """:func:`predict_rank_states` for every rank, rank 0 first."""
    return [predict_rank_states(arch, setup, world_size, r, precision, optimizer) for r in range(world_size)]


def largest_rank_states(
    arch: Architecture,
    setup: TorchSetup,
    world_size: int,
    precision: PrecisionName = PrecisionName.FP32,
    optimizer: OptimizerName = OptimizerName.ADAM,
    expert_world: int | None = None,
    expert_dim: int | None = None,
) -> RankStates:
    """The rank holding the most model-state bytes (what a per-GPU peak must use).

    FSDP1 ranks hold equal padded shards and FSDP2's dim-0 chunks are largest on rank 0, so rank 0 is
    the largest there; ZeroRedundancyOptimizer's greedy partition is computed once to find its rank.
    """
    rank = 0
    if setup.wrapper is TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER:
        state_bytes = [
            optimizer_state_bytes(sum(owned), optimizer) + len(owned) * STEP_BYTES
            for owned in zero1_rank_elements(arch, world_size)
        ]
        rank = state_bytes.index(max(state_bytes))
    return predict_rank_states(
        arch, setup, world_size, rank, precision, optimizer, expert_world=expert_world, expert_dim=expert_dim
    )
