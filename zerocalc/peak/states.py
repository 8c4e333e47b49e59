"""The model-state lines of each accounting (:class:`~zerocalc.parallel.framework_records.record.
StatesModel`).

Each builder takes the validated request and the strategy record, looks its states up in
:mod:`zerocalc.states` (the bytes are computed there, once) and returns them as the lines shown, in order,
each with the kind of tensor it is on the timeline and its name. For the accountings (the paper's,
DeepSpeed's and Megatron's) these lines, with the buffers they keep resident, are what the step timeline
holds from start to end; PyTorch's own frameworks are simulated tensor by tensor
(:mod:`zerocalc.peak.mechanics`) and their lines say what each rank holds, exactly. A registry maps each
states model to its builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from zerocalc.network.schedule import ZeroPP
from zerocalc.parallel.framework_records.record import StatesModel
from zerocalc.parallel.frameworks import TORCH_SOURCES
from zerocalc.parallel.optimizers import OptimizerImpl
from zerocalc.parallel.strategies import OffloadTarget, Strategy, StrategyName
from zerocalc.peak.buffers import STRATEGY_BUFFERS
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.report import StateLine
from zerocalc.request.training import TrainingRequest
from zerocalc.states import deepspeed, megatron
from zerocalc.states import framework as torch_states
from zerocalc.states.fp8 import te_fp8
from zerocalc.states.memory import Location, StateKind, bytes_at, strategy_states


class StateLines(NamedTuple):
    lines: list[StateLine]
    host_bytes_per_node: int | None = None


_KINDS = {
    StateKind.PARAMS: TensorKind.PARAMETERS,
    StateKind.GRADS: TensorKind.GRADIENTS,
    StateKind.GRAD_ACCUM: TensorKind.GRADIENTS,
    StateKind.OPTIMIZER: TensorKind.OPTIMIZER_STATES,
}
"""The kind of tensor each model state is on the timeline."""

_PAPER_NAMES = {
    StateKind.PARAMS: "parameters",
    StateKind.GRADS: "gradients",
    StateKind.GRAD_ACCUM: "fp32 gradient accumulation",
    StateKind.OPTIMIZER: "optimizer states",
}


EXPERTS_SUFFIX = " of the routed experts"
"""Names a state line of the routed experts' part under expert parallelism
(:func:`~zerocalc.states.memory.state_parts`)."""


def _paper(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """ZeRO paper §5 states on the GPU (:func:`zerocalc.states.memory.strategy_states`, the states of memory's
    row) + the buckets the strategy keeps."""
    states = [
        StateLine(
            kind=_KINDS[s.kind],
            name=_PAPER_NAMES[s.kind] + (EXPERTS_SUFFIX if s.experts else ""),
            bytes=s.bytes,
            source="ZeRO paper §5 (zerocalc memory)",
        )
        for s in strategy_states(strategy, request)
        if s.location is Location.GPU
    ]
    return StateLines(states + _resident_buffers(request, strategy))


def _resident_buffers(request: TrainingRequest, strategy: Strategy) -> list[StateLine]:
    dtypes = request.dtypes.trained
    return STRATEGY_BUFFERS[strategy.buffers](
        request, request.rank_model.params, dtypes.compute.bytes, dtypes.gradient.bytes
    )


_DEEPSPEED_SHARDED = f"sharded: 16-bit + fp32 gradients, fp32 parameters, Adam ({deepspeed.SHARDED_BYTES}/N)"
_STAGE1_SHARDED_BYTES = deepspeed.SHARDED_BYTES - deepspeed.GRADS_16BIT_BYTES
_DEEPSPEED_SHARDED_STAGE1 = f"sharded: fp32 gradients and parameters, Adam ({_STAGE1_SHARDED_BYTES}/N)"


def _deepspeed(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """DeepSpeed's estimators, exactly (:func:`zerocalc.states.deepspeed.deepspeed_estimate`), one line per
    term; its ZeRO-2 estimate leaves its own buckets out (marked)."""
    ds = deepspeed.deepspeed_estimate(request, strategy)
    if strategy.name in (StrategyName.ZERO1, StrategyName.ZERO2):
        stage1 = strategy.name is StrategyName.ZERO1
        source = deepspeed.ZERO1_SOURCE if stage1 else deepspeed.ZERO2_SOURCE
        lines = [
            StateLine(
                kind=TensorKind.PARAMETERS,
                name="fp16/bf16 parameters",
                bytes=ds.params_16bit_bytes,
                source=source,
                in_framework_estimate=not stage1,
            )
        ]
        if stage1:
            lines.append(
                StateLine(
                    kind=TensorKind.GRADIENTS,
                    name="fp16/bf16 gradients (whole until the boundary's reduction)",
                    bytes=ds.grads_16bit_bytes,
                    source=source,
                    in_framework_estimate=False,
                )
            )
        if ds.sharded_bytes > 0:
            lines.append(
                StateLine(
                    kind=TensorKind.OPTIMIZER_STATES,
                    name=_DEEPSPEED_SHARDED_STAGE1 if stage1 else _DEEPSPEED_SHARDED,
                    bytes=ds.sharded_bytes,
                    source=source,
                    in_framework_estimate=not stage1,
                )
            )
        outside = [
            line.model_copy(update={"in_framework_estimate": False})
            for line in _resident_buffers(request, strategy)
        ]
        return StateLines([*lines, *outside], ds.cpu_bytes)
    source = deepspeed.ZERO3_SOURCE
    lines = [
        StateLine(
            kind=TensorKind.GATHERED,
            name="largest layer gathered: 16-bit parameters + gradients "
            f"({deepspeed.LARGEST_LAYER_BYTES} × its parameters)",
            bytes=ds.largest_layer_bytes or 0,
            source=f"{source} (largest_layer_memory)",
        )
    ]
    if ds.sharded_bytes:
        offload = request.offload_optimizer is not OffloadTarget.NONE
        lines.insert(
            0,
            StateLine(
                kind=TensorKind.PARAMETERS if offload else TensorKind.OPTIMIZER_STATES,
                name=f"sharded 16-bit parameters ({deepspeed.PARAMS_16BIT_BYTES}/N; the rest offloaded)"
                if offload
                else _DEEPSPEED_SHARDED,
                bytes=ds.sharded_bytes,
                source=source,
            ),
        )
    if ZeroPP.HPZ in request.zeropp:
        lines.append(
            StateLine(
                kind=TensorKind.PARAMETERS,
                name="ZeRO++ hpZ secondary partition",
                bytes=deepspeed.hpz_partition_bytes(request),
                source=deepspeed.HPZ_SOURCE,
                in_framework_estimate=False,
            )
        )
    return StateLines(lines, ds.cpu_bytes)


_MEGATRON_NAMES = {
    StateKind.PARAMS: "bf16 parameters",
    StateKind.GRAD_ACCUM: "fp32 main gradients",
    StateKind.OPTIMIZER: "fp32 master + Adam m, v",
}


def _megatron(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """Megatron-LM's distributed optimizer (:func:`zerocalc.states.megatron.megatron_states`): the states on
    the GPU, and the host bytes per node of an offloaded optimizer (every rank of the node its own)."""
    states = megatron.megatron_states(request, strategy)
    host = bytes_at(states, Location.CPU)
    return StateLines(
        [
            StateLine(
                kind=_KINDS[s.kind],
                name=_MEGATRON_NAMES[s.kind]
                + (" and fp8 weights" if s.kind is StateKind.PARAMS and te_fp8(request) else "")
                + (EXPERTS_SUFFIX if s.experts else "")
                + (" (distributed)" if s.shard_ranks > 1 else ""),
                bytes=s.bytes,
                source=megatron.SOURCE,
            )
            for s in states
            if s.location is Location.GPU
        ],
        host * request.mesh.gpus_per_node if host else None,
    )


def _torch(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """What the largest rank holds, exactly (:mod:`zerocalc.states.framework`).

    fp32 sharded parameters are the master copy under ``MixedPrecision``/``MixedPrecisionPolicy`` (and
    autocast for DDP), so mixed precision has 4 + 4 + 8 bytes of states per parameter and no separate
    master (FSDP docs, "MixedPrecision"); the low-precision copies, buckets and gathered units are the
    timeline's. Adam's ``step`` counters are on the device only with ``fused`` (else CPU tensors).
    """
    setup = request.framework_record.torch_setup(strategy.name)
    assert setup is not None
    mesh, arch = request.mesh, request.architecture
    world = torch_states.shard_ranks(request.cluster, setup)
    expert_world = torch_states.shard_ranks(mesh.expert_data_cluster(), setup)
    expert_dim = torch_states.expert_shard_dim(arch, mesh.dp * mesh.cp)
    rank = torch_states.largest_rank_states(
        arch, setup, world, request.precision, request.optimizer, expert_world, expert_dim
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


_FINETUNE_NAMES = {
    StateKind.PARAMS: "trained parameters (adapters, copies, unfrozen)",
    StateKind.FROZEN: "frozen parameters",
    StateKind.QUANTIZED: "quantised weights (packed + absmax + code tables)",
    StateKind.GRADS: "gradients of the trained parameters",
    StateKind.GRAD_ACCUM: "fp32 gradient accumulation (trained)",
    StateKind.OPTIMIZER: "optimizer states of the trained parameters",
}
_FINETUNE_KINDS = {
    **_KINDS,
    StateKind.FROZEN: TensorKind.PARAMETERS,
    StateKind.QUANTIZED: TensorKind.PARAMETERS,
}


def _finetune(request: TrainingRequest, strategy: Strategy) -> StateLines:
    """A fine-tuning run's states on the GPU, kind by kind, as ``memory``'s row counts them
    (:func:`zerocalc.states.memory.finetune_states`: the kinds of :func:`~zerocalc.parallel.finetune.
    parameter_kinds`, the dtypes of the precision record), whatever the framework's accounting of full
    training; the step holds them tensor by tensor (:mod:`zerocalc.peak.finetune`). Host bytes per node:
    the states FSDP's CPU offload (or an offloaded optimizer) keeps there, every rank of the node its own."""
    states = strategy_states(strategy, request)
    lines = [
        StateLine(
            kind=_FINETUNE_KINDS[s.kind],
            name=_FINETUNE_NAMES[s.kind],
            bytes=s.bytes,
            source="zerocalc.states.memory.finetune_states (PEFT 0.21, bitsandbytes 0.50)",
        )
        for s in states
        if s.location is Location.GPU and s.bytes
    ]
    host = bytes_at(states, Location.CPU)
    return StateLines(lines, host * request.mesh.gpus_per_node if host else None)


StateBuilder = Callable[[TrainingRequest, Strategy], StateLines]


def _or_finetune(builder: StateBuilder) -> StateBuilder:
    """``builder``, or for a fine-tuning run :func:`_finetune`'s lines (one accounting of its kinds)."""

    def lines(request: TrainingRequest, strategy: Strategy) -> StateLines:
        return _finetune(request, strategy) if request.finetune is not None else builder(request, strategy)

    lines.__doc__ = builder.__doc__
    return lines


STATE_BUILDERS: dict[StatesModel, StateBuilder] = {
    StatesModel.PAPER: _or_finetune(_paper),
    StatesModel.DEEPSPEED_ESTIMATOR: _or_finetune(_deepspeed),
    StatesModel.MEGATRON_DISTRIBUTED_OPTIMIZER: _or_finetune(_megatron),
    StatesModel.TORCH_EXACT: _or_finetune(_torch),
}
