"""Megatron-LM's accounting of model states with its distributed optimizer (for the ``megatron`` profile).

Source: Megatron-LM docs, "Distributed Optimizer": 16-bit parameters (2 bytes) and fp32 main gradients
(4 bytes) on every data-parallel rank, the fp32 master copy and Adam's m and v (12 bytes) sharded over the
d data-parallel ranks: 6 + 12/d bytes per parameter, 18 without the distributed optimizer. The terms are
the ZeRO paper's states (:mod:`zerocalc.states.memory`): the recipe's parameters replicated, the main
gradient as an fp32 gradient buffer replicated (no separate 16-bit gradient: backward accumulates into
it), and the recipe's optimizer states (K) sharded over the strategy's optimizer group. Under expert
parallelism the routed experts' optimizer states are sharded over the expert-data-parallel group instead
(Megatron-LM ``core/distributed/distributed_data_parallel.py``: the expert parameters' buffers and their
distributed-optimizer shards use ``expert_data_parallel_group``), one row per part
(:func:`~zerocalc.states.memory.state_parts`).

With the optimizer offloaded (Megatron-Core ``OptimizerConfig``: ``optimizer_cpu_offload``,
``optimizer_offload_fraction`` 1.0, ``use_precision_aware_optimizer``;
``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``, ``HybridDeviceOptimizer``) every shard
the rank's distributed optimizer owns is stepped on the host: its fp32 master copy (a pinned clone of the
shard, ``_get_sub_optimizer_param_groups``), Adam's m and v (the host optimizer's) and a pinned fp32 copy
of its main gradient (``_set_sub_optimizer_grads``) are host memory, 16/d bytes per parameter; the 16-bit
parameters and the fp32 main-gradient buffer stay on the GPU, 6 bytes per parameter.
"""

from __future__ import annotations

from zerocalc.parallel.optimizers import OPTIMIZERS
from zerocalc.parallel.strategies import OffloadTarget, Strategy
from zerocalc.request.training import TrainingRequest
from zerocalc.states.fp8 import te_param_parts
from zerocalc.states.memory import (
    LOCATIONS,
    Location,
    StateKind,
    StateShard,
    optimizer_parts,
    state_parts,
    state_shards,
    tensor_parts,
)

SOURCE = "Megatron-LM docs, distributed optimizer: 6 + 12/d bytes per parameter (18 without)"


def megatron_states(request: TrainingRequest, strategy: Strategy) -> list[StateShard]:
    """Parameters, main gradients and optimizer states of one GPU, in that order, then (optimizer
    offloaded) the host copies of the main gradients' shards."""
    dtypes = request.dtypes.trained
    main_grad = dtypes.main_gradient
    rest = state_parts(request)[0].params
    optimizer_location = LOCATIONS[request.offload_optimizer]
    host_grads = []
    if request.offload_optimizer is not OffloadTarget.NONE:
        host_grads = state_shards(
            StateKind.GRADS,
            strategy.optimizer,
            optimizer_location,
            request,
            tensor_parts(f"host_grads_{main_grad.value}", main_grad),
        )
    return [
        *state_shards(StateKind.PARAMS, None, Location.GPU, request, te_param_parts(request, rest)),
        *state_shards(
            StateKind.GRAD_ACCUM,
            None,
            Location.GPU,
            request,
            tensor_parts(f"main_grads_{main_grad.value}", main_grad),
        ),
        *state_shards(
            StateKind.OPTIMIZER,
            strategy.optimizer,
            optimizer_location,
            request,
            optimizer_parts(dtypes, OPTIMIZERS[request.optimizer]),
        ),
        *host_grads,
    ]
