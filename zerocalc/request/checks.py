"""The checks of a request that relate its fields to one another, each declared with the fields it reads
(a :class:`~zerocalc.base.parts.Part`): the precision's gradients, the sequence against the model's
positions, the mesh against the framework and the model (:mod:`zerocalc.request.mesh_checks`), which
strategies can run (an explicit one that cannot is an error, one of the default set a note), the
framework's gradient sync and ZeRO++, the interleaved schedule's micro-batches, what the model's code can
run and recomputation. :func:`check` runs them in order; a request varied by
:meth:`~zerocalc.request.training.TrainingRequest.with_` runs those that read what changed."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.base.parts import UNCACHED, Part
from zerocalc.model.activations import Recompute
from zerocalc.model.code import (
    MODEL_CODES,
    AttentionKernel,
    Ulysses,
    op_sac_unsupported,
    parallel_unsupported,
)
from zerocalc.network.cluster import RankGroup
from zerocalc.network.schedule import GradSync, ZeroPP
from zerocalc.parallel.framework_records import FRAMEWORKS, default_strategies, framework_strategies
from zerocalc.parallel.frameworks import Estimate
from zerocalc.parallel.pipeline import INTERLEAVED
from zerocalc.parallel.precision import RECIPES, ParamLayout
from zerocalc.parallel.strategies import STRATEGIES, OffloadTarget, Strategy, StrategyName
from zerocalc.request.compiled import compile_problem
from zerocalc.request.finetune import finetune_problem
from zerocalc.request.fp8 import fp8_gpu_problem, fp8_strategy_problem
from zerocalc.request.mesh_checks import dim1_expert_sharding_problem, mesh_problem
from zerocalc.request.model_spec import seq_len_problem
from zerocalc.request.problems import architecture_problem, offload_record_problem, record_problem
from zerocalc.request.savers import kept_output_problem, savers_problem

if TYPE_CHECKING:
    from zerocalc.request.training import TrainingRequest


def flash_attention_used(request: TrainingRequest) -> bool:
    """``flash_attention`` as asked, else what the model's code runs (its record's ``default_attention``)."""
    asked = request.activations.flash_attention
    if asked is not None:
        return asked
    kernel, _ = MODEL_CODES[request.model_code].default_attention(request.architecture)
    return kernel is AttentionKernel.FLASH


def model_code_problem(request: TrainingRequest) -> str | None:
    """A mesh the model's code cannot run the step of (:func:`~zerocalc.model.code.
    parallel_unsupported`), for the peak of a step; None when it can or no step is simulated."""
    mesh, arch = request.mesh, request.model.architecture
    if request.estimate is not Estimate.MEMORY or arch is None or (mesh.tp == 1 and mesh.cp == 1):
        return None
    impl = MODEL_CODES[request.model_code]
    reason = parallel_unsupported(impl, arch, request.rank_shape, flash_attention_used(request))
    if reason is None:
        return None
    degrees = " and ".join(f"{{{n}}} {d}" for n, d in (("tp", mesh.tp), ("cp", mesh.cp)) if d > 1)
    if "flash attention" in reason:
        accepted = "{flash_attention}"
    elif "sequence parallelism (the norms" in reason:
        accepted = "{sequence_parallel} off, or {model_impl} torchtitan"
    elif "Ulysses" in reason and impl.ulysses is Ulysses.NONE:
        accepted = "{cp_impl} ring or allgather"
    elif "not modelled" in reason:
        accepted = "{model_impl} megatron, or {tp} 1"
    else:
        accepted = "a mesh that divides them"
    return f"{degrees} with {{model_impl}} {impl.name.value}: {reason}; accepted: {accepted}"


def recompute_problem(request: TrainingRequest) -> str | None:
    """``{recompute} op`` where torchtitan's op-level policy is not modelled
    (:func:`~zerocalc.model.code.op_sac_unsupported`): the step's memory for torchtitan's code only,
    its time and collectives for any dense Llama block's; ``{checkpoint_every}`` N > 1 (torchtitan's
    layer-level selective checkpointing, any code's ``checkpoint_wrapper`` on every N-th block) other than
    under full recompute of a dense model; None otherwise."""
    arch, activations = request.model.architecture, request.activations
    code = request.model_code
    every = activations.checkpoint_every
    if every > 1 and activations.recompute is not Recompute.FULL:
        return (
            f"{{checkpoint_every}} {every} with {{recompute}} {activations.recompute.value}: it picks the "
            "layers full recomputation checkpoints; accepted: {checkpoint_every} 1, or {recompute} full"
        )
    if every > 1 and arch is not None and arch.is_moe:
        return (
            f"{{checkpoint_every}} {every} with {arch.name}: every N-th layer of a mixture-of-experts model "
            "is not modelled; accepted: {checkpoint_every} 1"
        )
    if activations.recompute is not Recompute.OP or arch is None:
        return None
    impl = MODEL_CODES[code]
    memory_code = impl if request.estimate is Estimate.MEMORY else None
    reason = op_sac_unsupported(arch, request.rank_shape, flash_attention_used(request), memory_code)
    if reason is None:
        return None
    accepted = "{recompute} none, selective or full"
    if "torchtitan's Llama code" in reason:
        accepted = f"{{model_impl}} torchtitan, or {accepted}"
    return f"{{recompute}} op with {arch.name}: {reason}; accepted: {accepted}"


_GROUP_WORDS = {
    RankGroup.WORLD: "the world",
    RankGroup.NODE: "each node",
    RankGroup.ACROSS_NODES: "groups of one rank per node",
}


def offload_problem(strategy: Strategy, request: TrainingRequest) -> str | None:
    """Why ``strategy`` cannot do the requested offload, or None."""
    if (
        request.offload_optimizer is not OffloadTarget.NONE
        and request.offload_optimizer not in strategy.optimizer_offload
    ):
        can = ", ".join(t.value for t in strategy.optimizer_offload) or "nothing"
        return f"{{offload_optimizer}} {request.offload_optimizer.value}: {strategy.title} can offload {can}"
    if (
        request.offload_params is not OffloadTarget.NONE
        and request.offload_params not in strategy.param_offload
    ):
        if strategy.params is None:
            return (
                f"{{offload_params}} {request.offload_params.value}: {strategy.title} keeps whole parameters "
                "on every GPU; only zero3 can offload parameters"
            )
        return (
            f"{{offload_params}} {request.offload_params.value}: {strategy.title} shards parameters within "
            f"{_GROUP_WORDS[strategy.params]}, and parameter offload is modelled for zero3 only (DeepSpeed "
            "offload_param)"
        )
    return None


def _resolved_strategies(request: TrainingRequest) -> tuple[tuple[StrategyName, ...], tuple[str, ...]]:
    """The strategies that can run and the notes of those left out: an explicit one that cannot is an error,
    one of the framework's default set (strategies not explicit) a note."""
    framework = request.framework
    supported = framework_strategies(framework)
    explicit = request.strategies_explicit
    if explicit:
        for name in request.strategies:
            if name not in supported:
                names = ", ".join(s.value for s in supported)
                raise InputError(
                    f"{{framework}} {framework.value} models {names}; {name.value} is not one of them; "
                    f"accepted: {{strategies}} {names}"
                )
    record = FRAMEWORKS[framework]
    if request.estimate is Estimate.MEMORY:
        problem = record_problem(record, request)
        if problem:
            raise InputError(problem)
    if request.estimate is Estimate.COMM:
        problem = comm_problem(request)
        if problem is None and request.finetune is not None:
            problem = finetune_problem(record, request)
        elif problem is None:
            problem = offload_record_problem(record, request)
        if problem:
            raise InputError(problem)
    chosen: list[StrategyName] = []
    notes: list[str] = []
    for name in request.strategies if explicit else default_strategies(framework):
        strategy = STRATEGIES[name]
        problem = offload_problem(strategy, request)
        if problem is None and request.estimate is Estimate.MEMORY:
            problem = architecture_problem(record, name, request)
        if problem is None and name is StrategyName.HYBRID_SHARD:
            problem = request.cluster.whole_nodes_problem()
        if problem is None:
            chosen.append(name)
        elif explicit:
            raise InputError(problem)
        else:
            notes.append(f"{strategy.title} left out: {problem}")
    if not chosen:
        raise InputError("no strategy can run with these options: " + "; ".join(notes))
    return tuple(chosen), tuple(notes)


def micro_batches_problem(request: TrainingRequest) -> str | None:
    """The interleaved schedules run the micro-batches in groups of p (Megatron-LM
    ``forward_backward_pipelining_with_interleaving``: ``microbatch_group_size_per_vp_stage`` defaults to
    p, and M must be a multiple of it; torch's interleaved schedules split M into rounds of p)."""
    mesh = request.mesh
    if mesh.pp == 1 or mesh.pp_schedule not in INTERLEAVED or request.grad_accum % mesh.pp == 0:
        return None
    return (
        f"{{grad_accum}} {request.grad_accum} with {{pp_schedule}} {mesh.pp_schedule.value} over {{pp}} "
        f"{mesh.pp}: its micro-batches run in groups of {mesh.pp}; accepted: {{grad_accum}} a multiple of "
        f"{mesh.pp}"
    )


def comm_problem(request: TrainingRequest) -> str | None:
    """What the communication model cannot do for this request, or None."""
    record = FRAMEWORKS[request.framework]
    if record.param_layout is ParamLayout.AUTOCAST and request.reduce_dtype is not None:
        stored = record.dtypes(request.precision).stored
        if request.reduce_dtype is not stored:
            return (
                f"{{reduce_dtype}} {request.reduce_dtype.value}: DDP reduces gradients in the parameters' "
                f"dtype, {stored.value} under {request.precision.value} (autocast keeps them); accepted: no "
                "{reduce_dtype} (a comm hook such as bf16_compress_hook is not modelled)"
            )
    return None


def grad_sync_problem(request: TrainingRequest) -> str | None:
    """An explicit strategy whose framework fixes when gradients are reduced, asked to do otherwise."""
    asked = request.grad_sync
    if asked is None or not request.strategies_explicit:
        return None
    record = FRAMEWORKS[request.framework]
    for name in request.strategies:
        fixed = record.setup(name).grad_sync
        if fixed is None and request.mesh.pp > 1:
            fixed = record.pipeline_grad_sync
        if fixed is not None and fixed is not asked:
            when = "every micro-batch" if fixed is GradSync.EVERY else "once per step"
            return (
                f"{{grad_sync}} {asked.value}: {record.title_of(name)} reduces gradients "
                f"{when} under {{framework}} {request.framework.value}; "
                f"accepted: {{grad_sync}} {fixed.value}, or no {{grad_sync}}"
            )
    return None


def _tp_comm_overlap_problem(request: TrainingRequest) -> str | None:
    """``--tp-comm-overlap`` or ``--async-tp`` on a mixture-of-experts model, or with latent attention: each
    overlap is modelled on a dense layer's four TP linears and their collectives (:func:`~zerocalc.comm.
    overlap.userbuffers_exposed`, :func:`~zerocalc.comm.overlap.async_tp_exposed`), not on a MoE layer, whose
    routed experts run the dispatcher's collectives, nor on latent attention's gathers of its low-rank
    latents."""
    arch = request.model.architecture
    overlaps = (
        (request.overlap.tp_comm, "{tp_comm_overlap}", "userbuffer overlap"),
        (request.overlap.async_tp, "{async_tp}", "async TP overlap"),
    )
    for on, option, what in overlaps:
        if on and arch is not None and arch.is_moe:
            return (
                f"{option} with {arch.name}, a mixture of experts: the {what} is modelled for dense layers "
                f"(their four TP linears), not the MoE layers' dispatcher; accepted: no {option}, or a dense "
                "model"
            )
        if on and arch is not None and arch.latent_attention is not None:
            return (
                f"{option} with {arch.name}'s latent attention: the {what} is modelled for a dense layer's "
                "four TP linears, not latent attention's gathers of its latents (comm/mesh.py "
                f"TP_LATENT_FORWARD); accepted: no {option}, or a model without latent attention"
            )
    return None


def zeropp_problem(request: TrainingRequest) -> str | None:
    """ZeRO++ needs DeepSpeed ZeRO-3; hpZ whole nodes; qgZ each tensor's shape."""
    if not request.zeropp:
        return None
    if request.mesh.ep > 1:
        return (
            f"{{zeropp}} with {{ep}} {request.mesh.ep}: ZeRO++ over expert-data-parallel groups is not "
            "modelled; accepted: no {zeropp}, or {ep} 1"
        )
    takes = [n for n in request.strategies if FRAMEWORKS[request.framework].setup(n).zeropp]
    if not takes:
        return (
            "{zeropp} is DeepSpeed ZeRO-3's (ZeRO++); "
            "accepted: {framework} deepspeed with {strategies} zero3, or no {zeropp}"
        )
    cluster = request.cluster
    if ZeroPP.HPZ in request.zeropp and cluster.world_size % cluster.ranks_per_node:
        return (
            f"{{zeropp}} hpz with {{gpus}} {cluster.world_size}: zero_hpz_partition_size "
            f"({{gpus_per_node}} {cluster.gpus_per_node}) must divide the world; "
            f"accepted: {{gpus}} a multiple of {cluster.ranks_per_node}"
        )
    if ZeroPP.QGZ in request.zeropp and request.model.architecture is None:
        return (
            "{zeropp} qgz: its scales follow each gradient's shape; "
            "accepted: {model} NAME or config.json, or {zeropp} without qgz"
        )
    return None


def _fp32_grad_accum_problem(request: TrainingRequest) -> str | None:
    recipe = RECIPES[request.precision]
    if request.fp32_grad_accum and recipe.grad_dtype is DType.FP32:
        return (
            f"{{fp32_grad_accum}} with {{precision}} {request.precision.value}: gradients are already fp32; "
            "accepted with bf16-mixed, fp16-mixed or bf16-pure"
        )
    return None


def _fp8_problem(request: TrainingRequest) -> str | None:
    arch = request.model.architecture
    return fp8_strategy_problem(request.framework, request.fp8, request.strategies, arch is not None)


def _mesh_problem(request: TrainingRequest) -> str | None:
    mesh_problem(request.mesh, request.framework, request.model, request.activations.seq_len,
                 request.tp_across_nodes)  # fmt: skip
    return None


def _expert_sharding_problem(request: TrainingRequest) -> str | None:
    expert_parallel = FRAMEWORKS[request.framework].expert_parallel
    if request.mesh.ep > 1 and expert_parallel is not None and expert_parallel.shards_experts_on_dim1:
        dim1_expert_sharding_problem(request.rank_model, request.mesh)
    return None


_STRATEGY_READS = (
    "estimate", "framework", "strategies", "strategies_explicit", "model", "mesh", "precision", "optimizer",
    "fp32_grad_accum", "offload_optimizer", "offload_params", "reduce_dtype", "buffers.wrap",
    "finetune", "fp8",
)  # fmt: skip
_SHAPE_READS = (
    "mesh", "model", "stage", "framework", "model_impl", "activations.micro_batch", "activations.seq_len",
    "activations.flash_attention",
)  # fmt: skip

BEFORE_STRATEGIES = (
    Part("fp32 gradient accumulation", ("fp32_grad_accum", "precision"),
         lambda r, _: _fp32_grad_accum_problem(r)),
    Part("sequence length", ("model", "activations.seq_len"),
         lambda r, _: seq_len_problem(r.model, r.activations.seq_len)),
    Part("mesh", ("mesh", "framework", "model", "activations.seq_len", "tp_across_nodes"),
         lambda r, _: _mesh_problem(r)),
    Part("experts on dim 1", ("mesh", "framework", "model", "stage"),
         lambda r, _: _expert_sharding_problem(r)),
    Part("TP overlap on experts", ("overlap", "model"), lambda r, _: _tp_comm_overlap_problem(r)),
)  # fmt: skip
"""The checks before the strategies are resolved, in the order they report."""

STRATEGIES_RESOLVED = Part("strategies", _STRATEGY_READS, lambda r, _: _resolved_strategies(r))
"""The strategies that can run and the notes of those left out (:func:`_resolved_strategies`)."""

AFTER_STRATEGIES = (
    Part("grad sync", ("grad_sync", "strategies", "strategies_explicit", "framework", "mesh"),
         lambda r, _: grad_sync_problem(r)),
    Part("ZeRO++", ("zeropp", "mesh", "strategies", "framework", "model"), lambda r, _: zeropp_problem(r)),
    Part("interleaved micro-batches", ("mesh", "grad_accum"), lambda r, _: micro_batches_problem(r)),
    Part("model code", ("estimate", *_SHAPE_READS), lambda r, _: model_code_problem(r)),
    Part("recompute", ("estimate", "activations.recompute", "activations.checkpoint_every", *_SHAPE_READS),
         lambda r, _: recompute_problem(r)),
    Part("fp8 strategies", ("framework", "fp8", "strategies", "model"), lambda r, _: _fp8_problem(r)),
    Part("fp8 on the GPU", ("fp8", "gpu"), lambda r, _: fp8_gpu_problem(r.fp8, r.gpu)),
    Part("memory savers", ("activations.loss", "model_impl", "model", "mesh", "optimizer_in_backward",
                           "framework", "grad_accum", "offload_params", "finetune", "activations.offload",
                           "activations.recompute", "activations.checkpoint_every"),
         lambda r, _: savers_problem(r)),
    Part("kept output", ("activations.keep_output", "activations.loss", "activations.offload",
                         "activations.recompute", "model_impl", "mesh"),
         lambda r, _: kept_output_problem(r)),
    Part("compile", ("estimate", "activations", "model_impl", "framework", "finetune", "fp8", "mesh", "model",
                     "stage"),
         lambda r, _: compile_problem(r, lambda: flash_attention_used(r))),
)  # fmt: skip
"""The checks after, in the order they report."""

CHECKS = (*BEFORE_STRATEGIES, STRATEGIES_RESOLVED, *AFTER_STRATEGIES)
"""Every check of a request, each with the fields it reads (tests/test_parts.py checks them)."""


def check(request: TrainingRequest, changed: frozenset[str] | None = None) -> TrainingRequest:
    """The request with its strategies resolved (:func:`_resolved_strategies`), or one :class:`InputError`
    line naming the first problem, the checks in :data:`CHECKS`' order. ``changed``: the fields (paths) by
    which the request differs from one that passed every check (:meth:`TrainingRequest.with_`); only the
    checks that read one of them run (the others read what passed)."""
    before, resolves, after = _checks_of(changed)
    for part in before:
        problem = part.run(request, UNCACHED)
        if problem:
            raise InputError(problem)
    if resolves:
        strategies, notes = STRATEGIES_RESOLVED.run(request, UNCACHED)
        if strategies != request.strategies or notes != request.strategy_notes:
            request = request.model_copy(update={"strategies": strategies, "strategy_notes": notes})
            if changed is not None:
                after = _checks_of(changed | {"strategies", "strategy_notes"}).after
    for part in after:
        problem = part.run(request, UNCACHED)
        if problem:
            raise InputError(problem)
    return request


class _Checks(NamedTuple):
    """The checks a change runs, in :data:`CHECKS`' order."""

    before: tuple[Part, ...]
    resolves: bool
    """Whether it resolves the strategies again."""
    after: tuple[Part, ...]


_EVERY = _Checks(BEFORE_STRATEGIES, True, AFTER_STRATEGIES)
"""A request checked whole."""

_CHECKS_OF: dict[frozenset[str], _Checks] = {}
"""The checks of each change met (a plan varies its requests in a few hundred ways)."""

_READERS: dict[str, frozenset[Part]] = {}
"""The checks each path reads (a change runs those of any of its paths: a plan's changes are made of a few
dozen paths)."""


def _checks_of(changed: frozenset[str] | None) -> _Checks:
    """The checks that read one of ``changed`` (every one where None), once per change."""
    if changed is None:
        return _EVERY
    checks = _CHECKS_OF.get(changed)
    if checks is None:
        reading: set[Part] = set()
        for path in changed:
            readers = _READERS.get(path)
            if readers is None:
                readers = _READERS[path] = frozenset(part for part in CHECKS if part.reads_any((path,)))
            reading |= readers
        checks = _CHECKS_OF[changed] = _Checks(
            tuple(part for part in BEFORE_STRATEGIES if part in reading),
            STRATEGIES_RESOLVED in reading,
            tuple(part for part in AFTER_STRATEGIES if part in reading),
        )
    return checks
