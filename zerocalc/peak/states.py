"""The model-state lines of each accounting (:class:`~zerocalc.parallel.profiles.StatesModel`).

Each builder takes the validated request and the strategy record, and returns
the lines in the order they are shown, each with the kind of tensor it is. For the accountings (the
paper's, DeepSpeed's and Megatron's) these lines, with the buffers they keep resident, are what the step
timeline holds from start to end; PyTorch's own frameworks are simulated tensor by tensor
(:mod:`zerocalc.peak.mechanics`) and their lines say what each rank holds, exactly. A registry maps each
states model to its builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from zerocalc.base.units import ceil_div
from zerocalc.network.schedule import ZeroPP
from zerocalc.parallel.frameworks import TORCH_SOURCES
from zerocalc.parallel.optimizers import OptimizerImpl
from zerocalc.parallel.precision import RECIPES
from zerocalc.parallel.profiles import StatesModel
from zerocalc.parallel.strategies import OffloadTarget, Strategy, StrategyName
from zerocalc.parallel.zeropp import hpz_secondary_bytes
from zerocalc.peak.buffers import STRATEGY_BUFFERS
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.report import StateLine
from zerocalc.request.training import TrainingRequest
from zerocalc.states import framework as torch_states
from zerocalc.states.deepspeed import DEEPSPEED_VERSION, zero2_model_states, zero3_model_states
from zerocalc.states.memory import Location, StateKind, strategy_states


class StateLines(NamedTuple):
    lines: list[StateLine]
    host_bytes_per_node: int | None = None


_PAPER_LINES = {
    StateKind.PARAMS: ("parameters", TensorKind.PARAMETERS),
    StateKind.GRADS: ("gradients", TensorKind.GRADIENTS),
    StateKind.GRAD_ACCUM: ("fp32 gradient accumulation", TensorKind.GRADIENTS),
    StateKind.OPTIMIZER: ("optimizer states", TensorKind.OPTIMIZER_STATES),
}


def _paper(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """ZeRO paper §5 states on the GPU (:func:`zerocalc.states.memory.strategy_states`, the states of memory's
    row) + the buckets the strategy keeps."""
    states = [
        StateLine(
            kind=_PAPER_LINES[s.kind][1],
            name=_PAPER_LINES[s.kind][0],
            bytes=s.bytes,
            source="ZeRO paper §5 (zerocalc memory)",
        )
        for s in strategy_states(strategy, request)
        if s.location is Location.GPU
    ]
    return StateLines(states + _resident_buffers(request, strategy))


def _resident_buffers(request: TrainingRequest, strategy: Strategy) -> list[StateLine]:
    recipe = RECIPES[request.precision]
    return STRATEGY_BUFFERS[strategy.buffers](
        request, request.model.params, recipe.param_dtype.bytes, recipe.grad_dtype.bytes
    )


def _deepspeed(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """DeepSpeed's estimators, exactly; its ZeRO-2 estimate leaves its own buckets out (marked)."""
    cluster = request.cluster
    nodes, per_node = cluster.nodes, cluster.ranks_per_node
    offload = request.offload_optimizer is not OffloadTarget.NONE
    psi = request.model.params
    if strategy.name is StrategyName.ZERO2:
        ds = zero2_model_states(psi, per_node, nodes, cpu_offload=offload, total_gpus=cluster.world_size)
        source = f"DeepSpeed {DEEPSPEED_VERSION} stage_1_and_2.py estimate_zero2_model_states_mem_needs"
        lines = [
            StateLine(kind=TensorKind.PARAMETERS, name="fp16/bf16 parameters", bytes=2 * psi, source=source)
        ]
        if ds.gpu_bytes > 2 * psi:
            lines.append(
                StateLine(
                    kind=TensorKind.OPTIMIZER_STATES,
                    name="sharded: 16-bit + fp32 gradients, fp32 parameters, Adam (18/N)",
                    bytes=ds.gpu_bytes - 2 * psi,
                    source=source,
                )
            )
        outside = [
            line.model_copy(update={"in_framework_estimate": False})
            for line in _resident_buffers(request, strategy)
        ]
        return StateLines([*lines, *outside], ds.cpu_bytes)
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
    sharded = ds.gpu_bytes - layer
    source = f"DeepSpeed {DEEPSPEED_VERSION} stage3.py estimate_zero3_model_states_mem_needs"
    lines = [
        StateLine(
            kind=TensorKind.GATHERED,
            name="largest layer gathered: 16-bit parameters + gradients (4 × its parameters)",
            bytes=layer,
            source=f"{source} (largest_layer_memory)",
        )
    ]
    if sharded:
        lines.insert(
            0,
            StateLine(
                kind=TensorKind.PARAMETERS if offload else TensorKind.OPTIMIZER_STATES,
                name="sharded 16-bit parameters (2/N; the rest offloaded)"
                if offload
                else "sharded: 16-bit + fp32 gradients, fp32 parameters, Adam (18/N)",
                bytes=sharded,
                source=source,
            ),
        )
    if ZeroPP.HPZ in request.zeropp:
        lines.append(
            StateLine(
                kind=TensorKind.PARAMETERS,
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


def _megatron(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """Megatron-LM distributed optimizer docs: bf16 params (2) + fp32 main grads (4) + 12/d optimizer."""
    psi = request.model.params
    d = request.cluster.group_size(strategy.optimizer)
    source = "Megatron-LM docs, distributed optimizer: 6 + 12/d bytes per parameter (18 without)"
    return StateLines(
        [
            StateLine(kind=TensorKind.PARAMETERS, name="bf16 parameters", bytes=2 * psi, source=source),
            StateLine(kind=TensorKind.GRADIENTS, name="fp32 main gradients", bytes=4 * psi, source=source),
            StateLine(
                kind=TensorKind.OPTIMIZER_STATES,
                name="fp32 master + Adam m, v" + (" (distributed)" if d > 1 else ""),
                bytes=12 * ceil_div(psi, d),
                source=source,
            ),
        ]
    )


def _torch(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """What the largest rank holds, exactly (:mod:`zerocalc.states.framework`).

    fp32 sharded parameters are the master copy under ``MixedPrecision``/``MixedPrecisionPolicy`` (and
    autocast for DDP), so mixed precision has 4 + 4 + 8 bytes of states per parameter and no separate
    master (FSDP docs, "MixedPrecision"); the low-precision copies, buckets and gathered units are the
    timeline's. Adam's ``step`` counters are on the device only with ``fused`` (else CPU tensors).
    """
    setup = strategy.frameworks[request.framework].torch
    assert setup is not None
    world = request.cluster.group_size(setup.shard_group) if setup.shard_group else request.cluster.world_size
    rank = torch_states.largest_rank_states(
        request.architecture, setup, world, request.precision, request.optimizer
    )
    source = TORCH_SOURCES[setup.wrapper]
    lines = [
        (TensorKind.PARAMETERS, "parameters (fp32 master)", rank.params),
        (TensorKind.GRADIENTS, "gradients (fp32), from backward to zero_grad", rank.grads),
        (TensorKind.OPTIMIZER_STATES, "optimizer states (Adam exp_avg, exp_avg_sq)", rank.optimizer_states),
    ]
    if request.optimizer_impl is OptimizerImpl.FUSED:
        lines.append((TensorKind.OPTIMIZER_STATES, "Adam step counters (fused: on the device)", rank.step))
    return StateLines(
        [
            StateLine(kind=kind, name=name, bytes=line.bytes, source=f"{source}: {line.explanation}")
            for kind, name, line in lines
        ]
    )


StateBuilder = Callable[[TrainingRequest, Strategy], StateLines]

STATE_BUILDERS: dict[StatesModel, StateBuilder] = {
    StatesModel.PAPER: _paper,
    StatesModel.DEEPSPEED_ESTIMATOR: _deepspeed,
    StatesModel.MEGATRON_DISTRIBUTED_OPTIMIZER: _megatron,
    StatesModel.TORCH_EXACT: _torch,
}
