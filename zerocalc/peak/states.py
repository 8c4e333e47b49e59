"""The model-state lines of each accounting (:class:`~zerocalc.peak.profiles.StatesModel`), with the
buffers that come with them.

Each builder takes the validated request, the strategy record and its paper-accounting row, and returns
the lines, in the order they are shown. A registry maps each states model to its builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from zerocalc import framework_states as torch_states
from zerocalc.deepspeed_estimator import DEEPSPEED_VERSION, zero2_model_states, zero3_model_states
from zerocalc.frameworks import TORCH_SOURCES, Fsdp1Sharding, TorchWrapper
from zerocalc.memory import Location, StateKind, StrategyMemory
from zerocalc.peak.buffers import STRATEGY_BUFFERS, unit_gradients, units_in_flight
from zerocalc.peak.profiles import StatesModel
from zerocalc.peak.report import LineKind, PeakLine
from zerocalc.precision import RECIPES, PrecisionName
from zerocalc.request import TrainingRequest
from zerocalc.schedule import ZeroPP
from zerocalc.strategies import OffloadTarget, Strategy, StrategyName
from zerocalc.units import ceil_div
from zerocalc.zeropp import hpz_secondary_bytes


class StateLines(NamedTuple):
    lines: list[PeakLine]
    host_bytes_per_node: int | None = None


_PAPER_NAMES = {
    StateKind.PARAMS: "parameters",
    StateKind.GRADS: "gradients",
    StateKind.GRAD_ACCUM: "fp32 gradient accumulation",
    StateKind.OPTIMIZER: "optimizer states",
}


def _paper(request: TrainingRequest, strategy: Strategy, row: StrategyMemory) -> StateLines:
    """ZeRO paper §5 states on the GPU (:mod:`zerocalc.memory`) + the strategy's buffer rule."""
    states = [
        PeakLine(
            kind=LineKind.STATES,
            name=_PAPER_NAMES[s.kind],
            bytes=s.bytes,
            source="ZeRO paper §5 (zerocalc memory)",
        )
        for s in row.states
        if s.location is Location.GPU
    ]
    return StateLines(states + _strategy_buffers(request, strategy))


def _strategy_buffers(request: TrainingRequest, strategy: Strategy) -> list[PeakLine]:
    recipe = RECIPES[request.precision]
    count = request.model.parameter_count
    assert count is not None
    return STRATEGY_BUFFERS[strategy.buffers](
        request, count, recipe.param_dtype.bytes, recipe.grad_dtype.bytes
    )


def _deepspeed(request: TrainingRequest, strategy: Strategy, row: StrategyMemory) -> StateLines:
    """DeepSpeed's estimators, exactly; its ZeRO-2 estimate leaves its own buckets out (marked)."""
    cluster = request.cluster
    nodes, per_node = cluster.nodes, cluster.ranks_per_node
    offload = request.offload_optimizer is not OffloadTarget.NONE
    psi = request.model.params
    if strategy.name is StrategyName.ZERO2:
        ds = zero2_model_states(psi, per_node, nodes, cpu_offload=offload, total_gpus=cluster.world_size)
        states = PeakLine(
            kind=LineKind.STATES,
            name="DeepSpeed estimate_zero2_model_states_mem_needs",
            bytes=ds.gpu_bytes,
            source=f"DeepSpeed {DEEPSPEED_VERSION} stage_1_and_2.py "
            "(2 + 18/N bytes per parameter without offload)",
        )
        outside = [
            line.model_copy(update={"in_framework_estimate": False})
            for line in _strategy_buffers(request, strategy)
        ]
        return StateLines([states, *outside], ds.cpu_bytes)
    count = request.model.parameter_count
    assert count is not None
    ds = zero3_model_states(
        psi,
        count.largest_layer_params,
        per_node,
        nodes,
        cpu_offload=offload,
        cpu_offload_params=request.offload_params is not OffloadTarget.NONE,
        zero_init=request.zero_init,
        total_gpus=cluster.world_size,
    )
    layer = ds.largest_layer_bytes or 0
    lines = [
        PeakLine(
            kind=LineKind.STATES,
            name="DeepSpeed estimate_zero3_model_states_mem_needs (sharded states)",
            bytes=ds.gpu_bytes - layer,
            source=f"DeepSpeed {DEEPSPEED_VERSION} stage3.py "
            f"(18/N bytes per parameter without offload, zero_init={int(request.zero_init)})",
        ),
        PeakLine(
            kind=LineKind.BUFFERS,
            name="DeepSpeed largest-layer term (4 × largest layer)",
            bytes=layer,
            source=f"DeepSpeed {DEEPSPEED_VERSION} stage3.py largest_layer_memory",
        ),
    ]
    if ZeroPP.HPZ in request.zeropp:
        lines.append(
            PeakLine(
                kind=LineKind.BUFFERS,
                name="ZeRO++ hpZ secondary partition",
                bytes=hpz_secondary_bytes(
                    request.architecture,
                    cluster.world_size,
                    per_node,
                    RECIPES[request.precision].param_dtype.bytes,
                ),
                source=f"DeepSpeed {DEEPSPEED_VERSION} partition_parameters.py _partition_param_sec: each "
                "parameter padded to N, over the node's g ranks, in the parameter dtype",
                in_framework_estimate=False,
            )
        )
    return StateLines(lines, ds.cpu_bytes)


def _megatron(request: TrainingRequest, strategy: Strategy, row: StrategyMemory) -> StateLines:
    """Megatron-LM distributed optimizer docs: bf16 params (2) + fp32 main grads (4) + 12/d optimizer."""
    psi = request.model.params
    d = request.cluster.group_size(strategy.optimizer)
    source = "Megatron-LM docs, distributed optimizer: 6 + 12/d bytes per parameter (18 without)"
    return StateLines(
        [
            PeakLine(kind=LineKind.STATES, name="bf16 parameters", bytes=2 * psi, source=source),
            PeakLine(kind=LineKind.STATES, name="fp32 main gradients", bytes=4 * psi, source=source),
            PeakLine(
                kind=LineKind.STATES,
                name="fp32 master + Adam m, v" + (" (distributed)" if d > 1 else ""),
                bytes=12 * ceil_div(psi, d),
                source=source,
            ),
        ]
    )


def _torch(request: TrainingRequest, strategy: Strategy, row: StrategyMemory) -> StateLines:
    """Model states of the largest rank and the framework's buffers, exact to the element.

    fp32 sharded parameters are the master copy under ``MixedPrecision``/``MixedPrecisionPolicy`` (and
    autocast for DDP), so mixed precision has 4 + 4 + 8 bytes of states per parameter and no separate
    master; the low-precision copies are buffers (FSDP docs, "MixedPrecision").
    """
    setup = strategy.frameworks[request.framework].torch
    assert setup is not None
    arch = request.architecture
    world = request.cluster.group_size(setup.shard_group) if setup.shard_group else request.cluster.world_size
    mixed = request.precision is not PrecisionName.FP32
    b_r = request.reduce_dtype.bytes if request.reduce_dtype is not None else None
    rank = torch_states.largest_rank_states(arch, setup, world, request.precision, request.optimizer)
    source = TORCH_SOURCES[setup.wrapper]
    lines = [
        PeakLine(kind=LineKind.STATES, name=name, bytes=line.bytes, source=f"{source}: {line.explanation}")
        for name, line in (
            ("parameters (fp32 master)", rank.params),
            ("gradients (fp32)", rank.grads),
            ("optimizer states (Adam m, v)", rank.optimizer_states),
            ("Adam step counters", rank.step),
        )
    ]
    if setup.wrapper in torch_states.REPLICATED_WRAPPERS:
        buckets = torch_states.reducer_buckets(rank)
        lines.append(
            PeakLine(
                kind=LineKind.BUFFERS,
                name="DDP reducer gradient buckets",
                bytes=buckets.bytes,
                source=buckets.explanation,
            )
        )
        return StateLines(lines)
    compute = RECIPES[request.precision].param_dtype
    units = {
        name: torch_states.padded_unit_numel(unit, world, setup.wrapper)
        for name, unit in torch_states.fsdp_units(arch)
    }
    root = units.pop("root")
    block = max(units.values(), default=0)
    no_shard = setup.wrapper is TorchWrapper.FSDP1 and setup.sharding is Fsdp1Sharding.NO_SHARD
    if no_shard and not mixed:
        return StateLines(lines)  # the flat parameters and their gradients are used in place
    keeps_all = setup.sharding is Fsdp1Sharding.SHARD_GRAD_OP or not setup.reshard_after_forward
    if keeps_all:
        return StateLines(
            [
                *lines,
                PeakLine(
                    kind=LineKind.BUFFERS,
                    name="unsharded parameters of every unit (kept from forward to backward)",
                    bytes=rank.unsharded_after_forward.bytes,
                    source=f"{source}: {rank.unsharded_after_forward.explanation}",
                ),
                unit_gradients(max(block, root), compute.bytes, source, b_r),
            ]
        )
    copies = f"{compute.value} copies of" if no_shard else "gathered"
    return StateLines(
        lines
        + units_in_flight(
            block, root, compute.bytes, compute.bytes, request.buffers.prefetch, source, copies, b_r
        )
    )


StateBuilder = Callable[[TrainingRequest, Strategy, StrategyMemory], StateLines]

STATE_BUILDERS: dict[StatesModel, StateBuilder] = {
    StatesModel.PAPER: _paper,
    StatesModel.DEEPSPEED_ESTIMATOR: _deepspeed,
    StatesModel.MEGATRON_DISTRIBUTED_OPTIMIZER: _megatron,
    StatesModel.TORCH_EXACT: _torch,
}
