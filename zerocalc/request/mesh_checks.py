"""The mesh of a request: ``--gpus`` and ``--gpus-per-node``, the tensor-, context-, pipeline- and expert-
parallel degrees and their options, each combination a framework cannot run, or a model cannot be split
by, one :class:`~zerocalc.base.errors.InputError` (Megatron-LM's and torchtitan's checks, cited at each)."""

from __future__ import annotations

import sys
from functools import lru_cache

from zerocalc.base.errors import InputError, shown
from zerocalc.base.units import (
    parse_fraction,
    parse_whole,
    plural,
)
from zerocalc.model.architecture import (
    MAX_LAYERS,
    Architecture,
    LatentAttention,
    QkNorm,
    is_expert_tensor,
    parameter_tensors,
)
from zerocalc.model.code import MODEL_CODES, ModelImplName
from zerocalc.network.cluster import DEFAULT_GPUS_PER_NODE, Cluster
from zerocalc.parallel.framework_records import (
    FRAMEWORKS,
    frameworks_with,
)
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import PP_SCHEDULE_NAMES, CpImpl, Mesh, PpSchedule
from zerocalc.parallel.pipeline import split_problem
from zerocalc.request.model_spec import ModelSpec
from zerocalc.request.options_model import TrainingOptions
from zerocalc.request.values import MAX_GPUS, MAX_GPUS_PER_NODE, choice


def parse_cluster(gpus: int | str, gpus_per_node: int | str | None) -> Cluster:
    """``gpus`` and ``gpus_per_node`` (default: 8, or N when N is smaller)."""
    world = parse_whole(gpus, "{gpus}", 1, MAX_GPUS, "GPUs")
    per_node = (
        DEFAULT_GPUS_PER_NODE
        if gpus_per_node is None
        else parse_whole(gpus_per_node, "{gpus_per_node}", 1, MAX_GPUS_PER_NODE, "GPUs")
    )
    return Cluster.of(world, per_node)


def parse_mesh(
    o: TrainingOptions, whole: Cluster, framework: Framework, model_impl: ModelImplName, model: ModelSpec
) -> Mesh:
    """The mesh of ``o.gpus`` ranks (:mod:`zerocalc.parallel.mesh`): each degree and option parsed, each
    option given that changes nothing refused (what is checked against the framework, the model and the
    other degrees is :func:`mesh_problem`'s), the others the framework's defaults (:func:`mesh_of`)."""
    tp = parse_whole(o.tp, "{tp}", 1, MAX_GPUS, "ranks")
    cp = parse_whole(o.cp, "{cp}", 1, MAX_GPUS, "ranks")
    pp = parse_whole(o.pp, "{pp}", 1, MAX_GPUS, "stages")
    vpp = parse_whole(o.vpp, "{vpp}", 1, MAX_LAYERS, "virtual stages")
    first, last = (
        None if given is None else parse_whole(given, name, 1, MAX_LAYERS, "layers")
        for given, name in (
            (o.pp_first_stage_layers, "{pp_first_stage_layers}"),
            (o.pp_last_stage_layers, "{pp_last_stage_layers}"),
        )
    )
    stage_layers = _stage_layers(o.pp_stage_layers)
    if stage_layers is not None and (first is not None or last is not None):
        given = "{pp_first_stage_layers}" if first is not None else "{pp_last_stage_layers}"
        raise InputError(f"{{pp_stage_layers}} and {given} both split the layers; accepted: one of them")
    schedule = (
        None
        if o.pp_schedule is None
        else choice(o.pp_schedule, "{pp_schedule}", PpSchedule, None, PP_SCHEDULE_NAMES)
    )
    if pp == 1:
        for name, given in (
            ("{vpp}", vpp > 1),
            ("{pp_schedule}", schedule is not None),
            ("{pp_first_stage_layers}", first is not None),
            ("{pp_last_stage_layers}", last is not None),
            ("{pp_stage_layers}", stage_layers is not None),
        ):
            if given:
                raise InputError(
                    f"{name} changes nothing with {{pp}} 1; accepted: {{pp}} 2 or more, or no {name}"
                )
    if stage_layers is not None and len(stage_layers) != pp * vpp:  # a mesh holds p·v of them
        _pipeline_problem(
            pp, vpp, schedule or default_schedule(vpp), None, None, stage_layers, framework, model
        )
    ep = parse_whole(o.ep, "{ep}", 1, MAX_GPUS, "ranks")
    expert_tp = None if o.expert_tp is None else parse_whole(o.expert_tp, "{expert_tp}", 1, MAX_GPUS, "ranks")
    if expert_tp is not None:
        _expert_tp_problem(expert_tp, tp, ep, framework)
        if expert_tp == tp:
            expert_tp = None  # Megatron-LM's default: one mesh for both
    cp_impl = None if o.cp_impl is None else choice(o.cp_impl, "{cp_impl}", CpImpl)
    if cp_impl is not None and cp == 1:
        raise InputError(
            f"{{cp_impl}} {cp_impl.value} changes nothing with {{cp}} 1; accepted: {{cp}} 2 or more, "
            "or no {cp_impl}"
        )
    return mesh_of(
        framework, model_impl, whole.world_size, whole.ranks_per_node, tp, cp, pp, vpp, ep,
        cp_impl=cp_impl, sequence_parallel=o.sequence_parallel, pp_schedule=schedule,
        first=first, last=last, stage_layers=stage_layers, expert_tp=expert_tp,
    )  # fmt: skip


def _moe_tp_problem(mesh: Mesh, framework: Framework, model: ModelSpec) -> None:
    """Megatron-LM's MoE layers under tensor parallelism need sequence parallelism (core 0.20.0
    ``core/transformer/moe/moe_layer.py`` ``MoELayer.forward``: ``if self.training and
    self.attn_tp_group.size() > 1 and not self.config.sequence_parallel: raise ValueError``): the router
    and the token dispatcher take each TP rank's own s/t tokens."""
    arch = model.architecture
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    if (
        mesh.tp > 1
        and not mesh.sequence_parallel
        and arch is not None
        and arch.is_moe
        and expert_parallel is not None
        and expert_parallel.expert_tensor_parallel is not None
    ):
        raise InputError(
            f"{{tp}} {mesh.tp} with {{framework}} {framework.value}: Megatron-LM's MoE layer refuses tensor "
            "parallelism without sequence parallelism in training (moe_layer.py MoELayer.forward raises "
            "ValueError); accepted: {sequence_parallel}, or {tp} 1"
        )


def _expert_tp_problem(expert_tp: int, tp: int, ep: int, framework: Framework) -> None:
    """``--expert-tp``: under a framework whose expert parallelism has an expert-tensor-parallel size of
    its own (Megatron-LM's ``expert_tensor_parallel_size``; the others split the experts over the TP
    group), with expert parallelism, and a divisor of t (the expert grid of
    :mod:`zerocalc.parallel.mesh`; an expert group wider than the attention's TP group is not modelled)."""
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    if expert_tp != tp and (expert_parallel is None or expert_parallel.expert_tensor_parallel is None):
        names = ", ".join(
            f.value
            for f in frameworks_with("expert_parallel")
            if FRAMEWORKS[f].expert_parallel.expert_tensor_parallel is not None  # type: ignore[union-attr]
        )
        raise InputError(
            f"{{expert_tp}} {expert_tp} with {{framework}} {framework.value}: its routed experts are split "
            f"over the tensor-parallel group (an expert-tensor-parallel size of their own is not modelled); "
            f"accepted: {{framework}} {names}, or {{expert_tp}} {tp} (the {{tp}})"
        )
    if expert_tp != tp and ep == 1:
        raise InputError(
            f"{{expert_tp}} {expert_tp} with {{ep}} 1: an expert mesh apart from the attention's is modelled "
            f"with expert parallelism only; accepted: {{ep}} 2 or more, or {{expert_tp}} {tp} (the {{tp}})"
        )
    if tp % expert_tp:
        raise InputError(
            f"{{expert_tp}} {expert_tp} does not divide {{tp}} {tp}: an expert-tensor-parallel group wider "
            f"than the attention's is not modelled; accepted: {{expert_tp}} a divisor of {tp}"
        )


@lru_cache(maxsize=4096)
def mesh_of(
    framework: Framework,
    model_impl: ModelImplName,
    world: int,
    gpus_per_node: int,
    tp: int = 1,
    cp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    ep: int = 1,
    *,
    cp_impl: CpImpl | None = None,
    sequence_parallel: bool | None = None,
    pp_schedule: PpSchedule | None = None,
    first: int | None = None,
    last: int | None = None,
    stage_layers: tuple[int, ...] | None = None,
    expert_tp: int | None = None,
) -> Mesh:
    """The mesh of these degrees under ``framework``, what is not given the parser's default: the
    framework's CP implementation and tensor-parallel layers (its record), its sequence parallelism with
    TP (:func:`default_sequence_parallel`), 1F1B (interleaved with virtual stages); ``gpus_per_node`` at
    most ``world``. The one builder of a mesh, for :func:`parse_mesh` and ``zerocalc plan``'s candidates
    (once per shape: a plan's candidates share theirs)."""
    record = FRAMEWORKS[framework]
    if pp_schedule is None:
        pp_schedule = default_schedule(vpp)
    if sequence_parallel is None:
        sequence_parallel = default_sequence_parallel(framework, tp, model_impl)
    return Mesh(
        world=world,
        gpus_per_node=min(gpus_per_node, world),
        tp=tp,
        cp=cp,
        sequence_parallel=sequence_parallel,
        cp_impl=record.default_cp_impl if cp_impl is None else cp_impl,
        tp_style=record.layers_tp_style,
        pp=pp,
        vpp=vpp,
        pp_schedule=pp_schedule,
        pp_first_stage_layers=first,
        pp_last_stage_layers=last,
        pp_stage_layers=stage_layers,
        ep=ep,
        expert_tp=expert_tp,
    )


def default_schedule(vpp: int) -> PpSchedule:
    """The pipeline schedule when ``--pp-schedule`` is not given: 1F1B, interleaved with virtual stages."""
    return PpSchedule.INTERLEAVED_1F1B if vpp > 1 else PpSchedule.ONE_F_ONE_B


def default_sequence_parallel(framework: Framework, tp: int, model_impl: ModelImplName) -> bool:
    """Sequence parallelism when ``--sequence-parallel`` is not given: the framework's default
    (``sequence_parallel_default``) with TP and a model code that has it (transformers' tensor-parallel
    plans replicate the norms: none in hf code)."""
    return (
        tp > 1
        and FRAMEWORKS[framework].sequence_parallel_default
        and MODEL_CODES[model_impl].sequence_parallel
    )


def refuse_unmodelled(option: str, degree: int, framework: Framework, field: str, dimension: str) -> None:
    """Refuses ``--option degree`` (above 1) under a framework whose record does not compose ``dimension``
    (its ``field`` unset)."""
    if degree > 1 and not getattr(FRAMEWORKS[framework], field):
        names = ", ".join(f.value for f in frameworks_with(field))
        raise InputError(
            f"{{{option}}} {degree} with {{framework}} {framework.value}: its {dimension} is not modelled; "
            f"accepted: {{framework}} {names}, or {{{option}}} 1"
        )


def mesh_problem(
    mesh: Mesh, framework: Framework, model: ModelSpec, seq_len: int, tp_across_nodes: bool
) -> None:
    """Each combination of the mesh a framework cannot run, or a model cannot be split by, one
    :class:`InputError`: the degrees dividing the GPUs, the pipeline (:func:`_pipeline_problem`), expert
    parallelism (:func:`_expert_problem`), tensor and context parallelism modelled under the framework, its
    CP implementation, sequence parallelism with TP, the model's split (:func:`model_split_problem`) and a
    TP group inside a node."""
    tp, cp, pp, n, per_node = mesh.tp, mesh.cp, mesh.pp, mesh.world, mesh.gpus_per_node
    if n % (tp * cp * pp):
        ranks = tp * cp * pp
        degrees = [f"{{{name}}} {d}" for name, d in (("pp", pp), ("tp", tp), ("cp", cp)) if d > 1]
        product = " × ".join(degrees) + (f" = {ranks}" if len(degrees) > 1 else "")
        raise InputError(
            f"{{gpus}} {n} is not a multiple of {product}; accepted: {{gpus}} a multiple of {ranks}"
        )
    if pp > 1:
        first, last, layers = mesh.pp_first_stage_layers, mesh.pp_last_stage_layers, mesh.pp_stage_layers
        _pipeline_problem(pp, mesh.vpp, mesh.pp_schedule, first, last, layers, framework, model)
    if mesh.ep > 1:
        carved = "dp × cp" if mesh.etp == tp else f"tp/expert_tp ({tp // mesh.etp}) × dp × cp"
        _expert_problem(mesh.ep, framework, model, n // (mesh.etp * pp), cp, carved)
    refuse_unmodelled("tp", tp, framework, "tp_style", "tensor parallelism")
    refuse_unmodelled("cp", cp, framework, "cp_impls", "context parallelism")
    impls = FRAMEWORKS[framework].cp_impls
    if cp > 1 and mesh.cp_impl not in impls:
        names = ", ".join(i.value for i in impls)
        raise InputError(
            f"{{cp_impl}} {mesh.cp_impl.value}: {{framework}} {framework.value} does not implement it; "
            f"accepted: {{cp_impl}} {names}"
        )
    if mesh.sequence_parallel and tp == 1:
        raise InputError(
            "{sequence_parallel} shards over the tensor-parallel group, and {tp} is 1; "
            "accepted: {tp} 2 or more, or no {sequence_parallel}"
        )
    if tp > 1 or cp > 1:
        model_split_problem(model, tp, cp, mesh.cp_impl, mesh.sequence_parallel, seq_len)
    _moe_tp_problem(mesh, framework, model)
    tp_fits = per_node % tp == 0
    if tp_across_nodes and tp_fits:
        raise InputError(
            f"{{tp_across_nodes}} changes nothing: {{tp}} {tp} ranks fit in a node of {per_node}; "
            "accepted: no {tp_across_nodes}"
        )
    if not tp_fits and not tp_across_nodes:
        raise InputError(
            f"{{tp}} {tp} does not fit the nodes' {per_node} GPUs: a TP group would span nodes; accepted: "
            f"{{tp}} a divisor of {per_node}, or {{tp_across_nodes}}"
        )


def _pipeline_problem(
    pp: int,
    vpp: int,
    schedule: PpSchedule,
    first: int | None,
    last: int | None,
    stage_layers: tuple[int, ...] | None,
    framework: Framework,
    model: ModelSpec,
) -> None:
    """The pipeline modelled under the framework, its schedule and virtual stages, and the first and last
    stage's layers and each virtual stage's checked against the stages and the model's layers as Megatron-LM
    checks them (``core/transformer/transformer_config.py``: layers divisible by p, and by p·v interleaved;
    with uneven stages or each stage's layers, :func:`~zerocalc.parallel.pipeline.split_problem`)."""
    refuse_unmodelled("pp", pp, framework, "pipeline", "pipeline parallelism")
    if vpp > 1 and schedule in (PpSchedule.GPIPE, PpSchedule.ONE_F_ONE_B):
        raise InputError(
            f"{{vpp}} {vpp} with {{pp_schedule}} {schedule.value}: it runs one stage per rank; accepted: "
            "{pp_schedule} interleaved-1f1b or zero-bubble, or {vpp} 1"
        )
    if vpp == 1 and schedule is PpSchedule.INTERLEAVED_1F1B:
        raise InputError(
            "{pp_schedule} interleaved-1f1b needs virtual stages; accepted: {vpp} 2 or more, or "
            "{pp_schedule} 1f1b"
        )
    arch = model.architecture
    if arch is None:
        raise InputError(
            f"{{pp}} {pp} splits the model's layers, which needs its architecture; accepted: {{model}} NAME, "
            "config.json or a model TOML"
        )
    split_check(arch, pp, vpp, first, last, stage_layers)


def _stage_layers(given: str | list[int | str] | tuple[int | str, ...] | None) -> tuple[int, ...] | None:
    """``--pp-stage-layers``: a comma list of whole numbers of layers (each checked against the stages and
    the model by :func:`split_check`)."""
    if given is None:
        return None
    parts = [str(part).strip() for part in given] if isinstance(given, (list, tuple)) else given.split(",")
    refused = InputError(
        f"{{pp_stage_layers}} {shown(given)} is not accepted; accepted: a comma list of whole numbers of "
        "layers, one per virtual stage (8,9,8,7)"
    )
    if not parts or any(not part.strip() for part in parts):
        raise refused
    try:
        return tuple(parse_whole(part, "{pp_stage_layers}", 0, MAX_LAYERS, "layers") for part in parts)
    except InputError:
        raise refused from None


def split_check(
    arch: Architecture,
    pp: int,
    vpp: int,
    first: int | None,
    last: int | None,
    stage_layers: tuple[int, ...] | None = None,
) -> None:
    """The model's layers over p ranks of v chunks, ``first`` and ``last`` on the first and last rank, or
    ``stage_layers`` on the p·v virtual stages (:func:`~zerocalc.parallel.pipeline.split_problem`,
    Megatron-LM's checks), or one :class:`InputError`."""
    problem = split_problem(arch.num_layers, pp, vpp, first, last, stage_layers)
    if problem is None:
        return
    if stage_layers is not None:
        shape = f"{{pp}} {pp}" + (f" × {{vpp}} {vpp}" if vpp > 1 else "")
        raise InputError(
            f"{{pp_stage_layers}} {','.join(map(str, stage_layers))} with {shape}: {problem}; accepted: "
            f"{pp * vpp} counts of at least 1 layer summing to {arch.name}'s {arch.num_layers}"
        )
    if first is None and last is None:
        raise InputError(
            f"{{pp}} {pp} × {{vpp}} {vpp}: {arch.name}'s {problem}; accepted: {{pp}} × {{vpp}} a divisor of "
            f"{arch.num_layers}, or {{pp_first_stage_layers}} and {{pp_last_stage_layers}}, or "
            "{pp_stage_layers}"
        )
    given = " and ".join(
        f"{name} {n}"
        for name, n in (("{pp_first_stage_layers}", first), ("{pp_last_stage_layers}", last))
        if n is not None
    )
    middle = pp - (first is not None) - (last is not None)
    accepted = (
        f"values that leave {plural(middle, 'middle stage')} an equal share"
        if middle
        else f"{{pp_first_stage_layers}} + {{pp_last_stage_layers}} = {arch.num_layers}"
    )
    raise InputError(
        f"{given} with {{pp}} {pp}{f' × {{vpp}} {vpp}' if vpp > 1 else ''}: of {arch.name}'s "
        f"{arch.num_layers} layers, {problem}; accepted: {accepted}"
        + (f", every stage's layers a multiple of {{vpp}} {vpp}" if vpp > 1 else "")
    )


def _expert_problem(
    ep: int, framework: Framework, model: ModelSpec, dp_cp: int, cp: int, carved: str = "dp × cp"
) -> None:
    """``ep``: modelled under the framework, a divisor of the experts and of the ``dp_cp`` ranks it is
    carved from, dp × cp, or (t/ETP) × dp × cp under an expert-tensor-parallel size below t (Megatron-LM
    ``core/parallel_state.py``: world_size divisible by ETP·e·p; torchtitan ``ParallelDims``, whose EP
    group takes all of cp)."""
    refuse_unmodelled("ep", ep, framework, "expert_parallel", "expert parallelism")
    arch = model.architecture
    if arch is None or not arch.is_moe:
        what = "a model without its architecture" if arch is None else f"{arch.name}, a dense model"
        raise InputError(
            f"{{ep}} {ep} shards experts, and {{model}} is {what}; accepted: {{model}} a mixture of experts "
            "(mixtral-8x7b, qwen3-30b-a3b, deepseek-v3), or {ep} 1"
        )
    if arch.num_experts % ep:
        raise InputError(
            f"{{ep}} {ep}: {arch.name} has {arch.num_experts} experts, not a multiple of {ep}; "
            f"accepted: {{ep}} a divisor of {arch.num_experts}"
        )
    if dp_cp % ep:
        raise InputError(
            f"{{ep}} {ep} does not divide the {dp_cp} ranks of {carved} it is carved from; "
            f"accepted: {{ep}} a divisor of {dp_cp}"
        )
    expert_parallel = FRAMEWORKS[framework].expert_parallel
    if expert_parallel is not None and expert_parallel.takes_all_cp and ep % cp:
        raise InputError(
            f"{{ep}} {ep} with {{cp}} {cp}: torchtitan's expert-parallel group takes all of the context-"
            f"parallel ranks (ParallelDims: ep % cp == 0); accepted: {{ep}} a multiple of {cp}"
        )


def dim1_expert_sharding_problem(rank_model: ModelSpec, mesh: Mesh) -> None:
    """torchtitan shards the routed experts on dim 1 when the dp·c ranks outnumber the experts
    (``apply_fsdp``: ``Shard(1)``), and FSDP2 shards a dimension other than 0 only evenly
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` ``_init_sharded_param``: "FSDP does not
    support uneven sharding on dim 1"): each expert tensor's dim 1 must divide by the dp·c/e ranks."""
    arch = rank_model.architecture
    assert arch is not None  # ep > 1 needs the architecture
    ranks = mesh.expert_dp
    if mesh.dp * mesh.cp <= arch.num_experts or ranks == 1:
        return
    for tensor in parameter_tensors(arch):
        rows = tensor.shape[1] if is_expert_tensor(tensor) else 0
        if rows % ranks:
            raise InputError(
                f"{{ep}} {mesh.ep} with {{framework}} fsdp2: torchtitan shards the routed experts on dim 1 "
                f"over the {ranks} expert-data-parallel ranks (dp·cp {mesh.dp * mesh.cp} > "
                f"{arch.num_experts} experts), and {tensor.name}'s {rows:,} rows do not split evenly, which "
                f"FSDP2 refuses; accepted: {{gpus}}, {{cp}} and {{ep}} whose dp·cp/ep divides {rows:,}"
            )


def parse_capacity_factor(text: float | str, mesh: Mesh, model: ModelSpec) -> float:
    """``capacity_factor``: with expert parallelism only (a rank without it computes all of its own k·T
    routed tokens, however they are spread over the experts), above 0 and at most the most a rank's E/e
    experts can receive, every token of the EP group that routes to them: e·min(k, E/e)/k."""
    if mesh.ep == 1:
        raise InputError(
            f"{{capacity_factor}} {shown(text)} changes nothing with {{ep}} 1: a rank computes all of its "
            "own routed tokens whatever the routing; accepted: {ep} 2 or more, or no {capacity_factor}"
        )
    arch = model.architecture
    if arch is None or not arch.num_experts:  # ep refused on this model (mesh_problem): any positive value
        return parse_fraction(text, "{capacity_factor}", 0, sys.float_info.max, "a number above 0")
    k, local = arch.experts_per_token, max(1, arch.num_experts // mesh.ep)
    most = mesh.ep * min(k, local) / k
    accepted = (
        f"a number above 0 and at most {most:g} (e·min(k, E/e)/k: every token routed to a rank's experts)"
    )
    value = parse_fraction(text, "{capacity_factor}", 0, most, accepted)
    if value == 0:
        raise InputError(f"{{capacity_factor}} {shown(text)} is not accepted; accepted: {accepted}")
    return value


def model_split_problem(
    model: ModelSpec, tp: int, cp: int, cp_impl: CpImpl, sequence_parallel: bool, seq_len: int
) -> None:
    """The tensor-parallel split of heads and widths, and the context-parallel split of the sequence,
    as Megatron-LM checks them (``core/transformer/transformer_config.py``, ``core/parallel_state.py``)."""
    arch = model.architecture
    if arch is None:
        split = f"{{tp}} {tp} splits the model's tensors" if tp > 1 else f"{{cp}} {cp} splits every sequence"
        raise InputError(
            f"{split}, which needs its architecture; accepted: {{model}} NAME, config.json or a model TOML"
        )
    checks: list[tuple[str, str, int, int]] = []
    if tp > 1:
        latent: LatentAttention | None = arch.latent_attention
        checks.append(("{tp}", "attention heads", arch.num_heads, tp))
        if latent is None:
            checks.append(("{tp}", "key/value heads", arch.kv_heads, tp))
        widths = (arch.intermediate_size, arch.dense_intermediate_size, arch.shared_expert_intermediate_size)
        checks += [("{tp}", "MLP width", width, tp) for width in widths if width]
        if arch.qk_norm is QkNorm.FULL:
            raise InputError(
                f"{{tp}} {tp}: {arch.name}'s q/k norms over all heads are not split by tensor parallelism "
                "here; accepted: {tp} 1"
            )
    if cp > 1 and cp_impl is CpImpl.ULYSSES:
        checks.append(("{cp}", "attention heads", arch.num_heads // tp, cp))
        checks.append(("{cp}", "key/value heads", arch.kv_heads // tp, cp))
    for flag, what, count, ranks in checks:
        if count % ranks:
            per_rank = " per tensor-parallel rank" if flag == "{cp}" and tp > 1 else ""
            raise InputError(
                f"{flag} {ranks}: {arch.name} has {count:,} {what}{per_rank}, not a multiple of {ranks}; "
                f"accepted: {flag} a divisor of {count:,}"
            )
    chunks = 2 * cp if cp > 1 and cp_impl is not CpImpl.ULYSSES else cp
    if sequence_parallel:
        chunks *= tp
    if seq_len % chunks:
        why = "2·c load-balanced chunks" if cp > 1 and cp_impl is not CpImpl.ULYSSES else "c chunks"
        if sequence_parallel:
            why += ", each split t ways by sequence parallelism" if cp > 1 else "t sequence-parallel chunks"
        raise InputError(
            f"{{seq_len}} {seq_len:,} does not split into {why}; accepted: {{seq_len}} a multiple of {chunks}"
        )
