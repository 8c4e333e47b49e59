"""DeepSpeed's own model-state estimators, reproduced exactly (for the ``deepspeed`` framework profile).

Source: DeepSpeed 0.19.8, ``deepspeed/runtime/zero/stage_1_and_2.py::estimate_zero2_model_states_mem_needs``
and ``deepspeed/runtime/zero/stage3.py::estimate_zero3_model_states_mem_needs``. DeepSpeed has no estimator
of stage 1, which runs the same optimizer (``DeepSpeedZeroOptimizer``) with ``partition_gradients`` off:
:func:`zero1_model_states` is the ZeRO-2 estimator's terms with the 16-bit gradients whole on every rank.
The arithmetic below follows theirs operation by operation (Python floats, then ``int()``), so the bytes
are identical to what DeepSpeed returns; its ``*_all_cold`` printers show them divided by 2**30 but
labelled "GB".

What the DeepSpeed estimator leaves out (and zerocalc's step timeline adds): activations and the loss,
communication buckets and prefetch buffers beyond one "largest layer", the CUDA context and NCCL
communicators, and the caching allocator's reserve. Its per-GPU sharded term is 18 bytes per parameter
(2 fp16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam states) where the ZeRO paper's accounting has
2 + 12 = 14; the extra 4 are DeepSpeed's fp32 gradient partition. ``largest_layer_params`` is
DeepSpeed's: the most parameters held directly (``recurse=False``) by any one module, e.g. the embedding
matrix.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from zerocalc.network.cluster import Cluster
from zerocalc.parallel.strategies import OffloadTarget, Strategy, StrategyName
from zerocalc.parallel.zeropp import hpz_secondary_bytes
from zerocalc.request.training import TrainingRequest
from zerocalc.states.memory import state_parts

DEEPSPEED_VERSION = "0.19.8"
ZERO2_SOURCE = f"DeepSpeed {DEEPSPEED_VERSION} stage_1_and_2.py estimate_zero2_model_states_mem_needs"
ZERO3_SOURCE = f"DeepSpeed {DEEPSPEED_VERSION} stage3.py estimate_zero3_model_states_mem_needs"
ZERO1_SOURCE = (
    f"DeepSpeed {DEEPSPEED_VERSION} stage_1_and_2.py, stage 1 (partition_gradients off: each 16-bit gradient "
    "whole until the boundary's reduction); no estimator of its own: the ZeRO-2 estimator's terms"
)
HPZ_SOURCE = (
    f"DeepSpeed {DEEPSPEED_VERSION} partition_parameters.py _partition_param_sec: each parameter padded to "
    "N, over the node's g ranks, in the parameter dtype"
)
ADDITIONAL_BUFFER_FACTOR = 1.5
"""DeepSpeed's unexplained default safety factor on host memory."""
PARAMS_16BIT_BYTES = 2
"""``params_16bit``: the estimators' 2 bytes per fp16/bf16 parameter."""
SHARDED_BYTES = 18
"""Bytes per parameter the estimators partition over the GPUs: 2 grads_16bit + 4 grads_32bit + 4
params_32bit + 8 optimizer states."""
GRADS_16BIT_BYTES = 2
"""The 2 bytes per parameter of the 16-bit gradients (``grads_16bit``), whole under stage 1."""
LARGEST_LAYER_BYTES = 4
"""Bytes per parameter of the largest layer gathered (ZeRO-3): its 16-bit parameters and gradients."""


class DeepSpeedEstimate(BaseModel):
    stage: int = Field(description="ZeRO stage (1, 2 or 3)")
    offload_optimizer: bool = Field(description="DeepSpeed's cpu_offload")
    offload_params: bool = Field(description="DeepSpeed's cpu_offload_params (stage 3)")
    zero_init: bool = Field(description="deepspeed.zero.Init used to build the model (stage 3)")
    cpu_bytes: int = Field(description="host memory per node, as DeepSpeed returns it")
    gpu_bytes: int = Field(description="GPU memory per GPU, as DeepSpeed returns it")
    largest_layer_bytes: int | None = Field(default=None, description="4 x largest_layer_params (stage 3)")
    params_16bit_bytes: int = Field(
        default=0, description="the 16-bit parameters every GPU holds whole: 2 x total_params (stages 1, 2)"
    )
    grads_16bit_bytes: int = Field(
        default=0, description="the 16-bit gradients every GPU holds whole: 2 x total_params (stage 1)"
    )

    @property
    def sharded_bytes(self) -> int:
        """What of ``gpu_bytes`` is partitioned over the GPUs (18/N, 16/N under stage 1, or the 16-bit
        parameters' 2/N when the optimizer is offloaded under stage 3; 0 when nothing stays)."""
        whole = self.params_16bit_bytes + self.grads_16bit_bytes
        return self.gpu_bytes - whole - (self.largest_layer_bytes or 0)


def zero2_model_states(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
    total_gpus: int | None = None,
) -> DeepSpeedEstimate:
    """``estimate_zero2_model_states_mem_needs`` (DeepSpeed 0.19.8).

    DeepSpeed takes ``total_gpus = num_nodes · num_gpus_per_node`` (equal nodes); ``total_gpus`` gives the
    real count when the last node is partly used (12 GPUs on nodes of 8: the states are split 12 ways, and
    the host term is the fullest node's).
    """
    total_gpus = total_gpus or num_nodes * num_gpus_per_node
    params_16bit = PARAMS_16BIT_BYTES * total_params
    if cpu_offload:
        gpu_mem = params_16bit
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = params_16bit + int(SHARDED_BYTES * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return DeepSpeedEstimate(
        stage=2,
        offload_optimizer=cpu_offload,
        offload_params=False,
        zero_init=False,
        cpu_bytes=int(cpu_mem),
        gpu_bytes=int(gpu_mem),
        params_16bit_bytes=params_16bit,
    )


def zero1_model_states(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
    total_gpus: int | None = None,
) -> DeepSpeedEstimate:
    """Stage 1 in the ZeRO-2 estimator's terms (:data:`ZERO1_SOURCE`): its 16-bit parameters and gradients
    whole (2 + 2 bytes per parameter), the fp32 gradient and parameter partitions and the optimizer states
    (4 + 4 + 8) over the GPUs; with the optimizer offloaded those go to the host, as the ZeRO-2 estimator
    counts them."""
    zero2 = zero2_model_states(
        total_params, num_gpus_per_node, num_nodes, cpu_offload, additional_buffer_factor, total_gpus
    )
    total_gpus = total_gpus or num_nodes * num_gpus_per_node
    grads_16bit = GRADS_16BIT_BYTES * total_params
    sharded = 0 if cpu_offload else int((SHARDED_BYTES - GRADS_16BIT_BYTES) * total_params / total_gpus)
    return zero2.model_copy(
        update={
            "stage": 1,
            "gpu_bytes": zero2.params_16bit_bytes + grads_16bit + sharded,
            "grads_16bit_bytes": grads_16bit,
        }
    )


def zero3_model_states(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
    total_gpus: int | None = None,
) -> DeepSpeedEstimate:
    """``estimate_zero3_model_states_mem_needs`` (DeepSpeed 0.19.8); ``total_gpus`` as for ZeRO-2."""
    total_gpus = total_gpus or num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = LARGEST_LAYER_BYTES * largest_layer_params
    if cpu_offload:
        # on the host: every sharded byte (18), or all but the 16-bit parameters' partition, which stays
        # on the GPU (16)
        host = SHARDED_BYTES if cpu_offload_params else SHARDED_BYTES - PARAMS_16BIT_BYTES
        gpu_mem = largest_layer_memory
        if not cpu_offload_params:
            gpu_mem += int(PARAMS_16BIT_BYTES * total_params / total_gpus)
        if zero_init:
            cpu_mem = total_params * host * gpus_factor * additional_buffer_factor
        else:
            cpu_mem = total_params * max(4 * num_gpus_per_node, host * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(SHARDED_BYTES * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return DeepSpeedEstimate(
        stage=3,
        offload_optimizer=cpu_offload,
        offload_params=cpu_offload and cpu_offload_params,
        zero_init=zero_init,
        cpu_bytes=int(cpu_mem),
        gpu_bytes=int(gpu_mem),
        largest_layer_bytes=largest_layer_memory,
    )


def deepspeed_estimate(request: TrainingRequest, strategy: Strategy) -> DeepSpeedEstimate:
    """The estimator of the strategy's stage (ZeRO-1 in ZeRO-2's terms, ZeRO-2, else ZeRO-3) for the request:
    its nodes of g GPUs and its real GPU count, offload and ``zero.Init`` as asked; the largest layer is
    DeepSpeed's (the most parameters one module holds directly).

    Under expert parallelism (DeepSpeed-MoE ``ep_size``: ZeRO partitions the expert parameters over
    ``expert_data_parallel_group``, ``runtime/zero/stage_1_and_2.py`` ``_configure_moe_settings`` /
    ``real_dp_process_group``) the estimator, which knows no experts, is applied to each part of the rank's
    parameters over its own ranks (:func:`~zerocalc.states.memory.state_parts`) and the two summed; the
    largest layer is counted once."""
    parts = state_parts(request)
    estimates = [
        _part_estimate(request, strategy, part.params, part.cluster, largest=i == 0)
        for i, part in enumerate(parts)
    ]
    if len(estimates) == 1:
        return estimates[0]
    first, *rest = estimates
    return first.model_copy(
        update={
            name: getattr(first, name) + sum(getattr(e, name) or 0 for e in rest)
            for name in ("cpu_bytes", "gpu_bytes", "params_16bit_bytes", "grads_16bit_bytes")
        }
    )


def _part_estimate(
    request: TrainingRequest, strategy: Strategy, psi: int, cluster: Cluster, largest: bool
) -> DeepSpeedEstimate:
    """The stage's estimator for ``psi`` parameters partitioned over ``cluster`` (with the largest layer's
    gathered term where ``largest``)."""
    nodes, per_node = cluster.nodes, cluster.ranks_per_node
    offload = request.offload_optimizer is not OffloadTarget.NONE
    if strategy.name is StrategyName.ZERO1:
        return zero1_model_states(psi, per_node, nodes, cpu_offload=offload, total_gpus=cluster.world_size)
    if strategy.name is StrategyName.ZERO2:
        return zero2_model_states(psi, per_node, nodes, cpu_offload=offload, total_gpus=cluster.world_size)
    count = request.rank_model.parameter_count
    assert count is not None
    return zero3_model_states(
        psi,
        count.largest_layer_params if largest else 0,
        per_node,
        nodes,
        cpu_offload=offload,
        cpu_offload_params=request.offload_params is not OffloadTarget.NONE,
        zero_init=request.zero_init,
        total_gpus=cluster.world_size,
    )


def hpz_partition_bytes(request: TrainingRequest) -> int:
    """ZeRO++ hpZ's secondary partition on one GPU: every parameter over the node's ranks, in the recipe's
    parameter dtype (:func:`~zerocalc.parallel.zeropp.hpz_secondary_bytes`)."""
    cluster = request.cluster
    return hpz_secondary_bytes(
        request.architecture,
        cluster.world_size,
        cluster.ranks_per_node,
        request.dtypes.stored.bytes,
    )


def zero3_variants(
    total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1
) -> list[DeepSpeedEstimate]:
    """The rows ``estimate_zero3_model_states_mem_needs_all_cold`` prints, in its order."""
    rows = []
    for cpu_offload in (True, False):
        for cpu_offload_params in (True, False):
            if not cpu_offload and cpu_offload_params:
                continue
            for zero_init in (True, False):
                rows.append(
                    zero3_model_states(
                        total_params,
                        largest_layer_params,
                        num_gpus_per_node,
                        num_nodes,
                        cpu_offload,
                        cpu_offload_params,
                        zero_init,
                    )
                )
    return rows


def zero2_variants(
    total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1
) -> list[DeepSpeedEstimate]:
    """The rows ``estimate_zero2_model_states_mem_needs_all_cold`` prints, in its order."""
    return [
        zero2_model_states(total_params, num_gpus_per_node, num_nodes, offload) for offload in (True, False)
    ]
