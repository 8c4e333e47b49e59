"""Frameworks and how PyTorch runs a strategy: the vocabulary the Strategy records are written in.

:class:`Framework` is whose accounting (and, for the PyTorch ones, whose implementation) an estimate
follows. :class:`TorchSetup` says which PyTorch wrapper and options one strategy is under a PyTorch
framework; :mod:`zerocalc.states.framework` predicts, from it, exactly what each rank holds, and
``zerocalc validate`` builds the same configuration for real.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.network.cluster import RankGroup


class Framework(StrEnum):
    """Whose accounting a memory estimate, and whose collective schedule a comm estimate, follows
    (``--framework``)."""

    PAPER = "paper"
    """The ZeRO paper (Rajbhandari et al. 2020) §5, with FSDP's unit-by-unit gathering for buffers."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed's own estimators (``estimate_zero2/zero3_model_states_mem_needs``), exactly."""
    MEGATRON = "megatron"
    """Megatron-LM's distributed optimizer (bf16 params, fp32 main gradients)."""
    FSDP = "fsdp"
    """PyTorch FSDP1 ``FullyShardedDataParallel`` as it really allocates."""
    FSDP2 = "fsdp2"
    """PyTorch FSDP2 ``fully_shard`` as it really allocates."""
    TORCH_ZERO1 = "torch-zero1"
    """PyTorch DDP and ``ZeroRedundancyOptimizer`` as they really allocate."""
    DDP = "ddp"
    """PyTorch ``DistributedDataParallel`` on its own (the DDP of ``torch-zero1``)."""


class Estimate(StrEnum):
    """What a request is for: the command (or library function) it was parsed for."""

    MEMORY = "memory"
    """Model states and the peak of a step (``zerocalc memory``)."""
    COMM = "comm"
    """Collectives per step (``zerocalc comm``)."""


class TorchWrapper(StrEnum):
    """The PyTorch class that wraps the model (or the optimizer) for data parallelism."""

    DDP = "ddp"
    """``torch.nn.parallel.DistributedDataParallel`` with a plain optimizer."""
    ZERO_REDUNDANCY_OPTIMIZER = "zero_redundancy_optimizer"
    """DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer``."""
    FSDP1 = "fsdp1"
    """``FullyShardedDataParallel`` (``use_orig_params=False``), one unit per block + the root."""
    FSDP2 = "fsdp2"
    """``fully_shard`` per block, then on the root."""


class Fsdp1Sharding(StrEnum):
    """FSDP1 ``ShardingStrategy`` (HYBRID_SHARD is FULL_SHARD over a node's ranks)."""

    NO_SHARD = "no_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    FULL_SHARD = "full_shard"


class TorchSetup(NamedTuple):
    """How PyTorch runs one strategy: the wrapper and its options."""

    wrapper: TorchWrapper
    sharding: Fsdp1Sharding | None = None
    """FSDP1 only."""
    reshard_after_forward: bool = True
    """FSDP2 only (FSDP1's follows from ``sharding``)."""
    shard_group: RankGroup | None = RankGroup.WORLD
    """The ranks a parameter is sharded over: NODE for hybrid sharding, None when nothing is sharded."""
    validate_name: str | None = None
    """This configuration's name in ``zerocalc validate --strategies`` (None: validate does not run it)."""


TORCH_SOURCES: dict[TorchWrapper, str] = {
    TorchWrapper.DDP: "torch 2.13 DDP",
    TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER: "torch 2.13 ZeroRedundancyOptimizer (largest rank)",
    TorchWrapper.FSDP1: "torch 2.13 FSDP1",
    TorchWrapper.FSDP2: "torch 2.13 FSDP2 (largest rank)",
}
"""How a line computed from a wrapper's real allocations names its source."""

TORCH_NO_SYNC: dict[TorchWrapper, str] = {
    TorchWrapper.DDP: "DDP.no_sync()",
    TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER: "DDP.no_sync()",
    TorchWrapper.FSDP1: "FullyShardedDataParallel.no_sync()",
    TorchWrapper.FSDP2: "FSDPModule.set_requires_gradient_sync(False)",
}
"""What a training loop calls on the first A-1 micro-batches to reduce gradients only on the last
(``torch/nn/parallel/distributed.py`` ``no_sync``; ``torch/distributed/fsdp/fully_sharded_data_parallel.py``
``no_sync``, root instance; ``torch/distributed/fsdp/_fully_shard/_fully_shard.py``
``set_requires_gradient_sync``). Without it every backward reduces."""
