"""The vocabulary of a collective schedule: one rule per collective a strategy issues in a step.

A rule (:class:`ScheduledCollective`) says which collective runs, when (phase, how often per optimizer
step), over which ranks, on which tensors (all parameters, every FSDP unit but the root, DeepSpeed's
persistent parameters, ...), in how many calls (one for everything, one per FSDP unit, DDP bucket,
parameter or module), how the array is padded and in which dtype. The Strategy records
(:mod:`zerocalc.parallel.strategies`) write each framework's schedule in these terms, citing its source;
:mod:`zerocalc.comm.calls` turns a rule into the calls it makes and :mod:`zerocalc.comm.estimate` costs them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.base.dtypes import TensorRole
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    AFTER_STEP = "after_step"
    """In or right after ``optimizer.step()``."""


class Tensor(StrEnum):
    GRADIENTS = "gradients"
    PARAMETERS = "parameters"


class GradSync(StrEnum):
    """Which micro-batches of an optimizer step synchronise (reduce) gradients."""

    EVERY = "every"
    """Every micro-batch: the PyTorch wrappers' default (DDP and FSDP reduce in every backward)."""
    LAST = "last"
    """Only the last: the first A-1 run under DDP/FSDP1 ``no_sync()`` or FSDP2
    ``set_requires_gradient_sync(False)``."""


class Repeat(StrEnum):
    """How many times per optimizer step (A micro-batches) a rule runs."""

    PER_STEP = "per_step"
    """Once."""
    PER_MICRO_BATCH = "per_micro_batch"
    """A times."""
    PER_SYNC = "per_sync"
    """Once per micro-batch that synchronises gradients: A under ``every``, 1 under ``last``."""
    AFTER_FIRST_MICRO_BATCH = "after_first_micro_batch"
    """A - 1 times: micro-batches 2..A."""


class Calls(StrEnum):
    """How a rule's tensors are split into calls (the latency term counts calls)."""

    WHOLE = "whole"
    """One call carrying every selected parameter (the ZeRO paper's accounting; one param group)."""
    UNIT = "unit"
    """One call per FSDP unit (FSDP1 flat parameter, FSDP2 parameter group)."""
    DDP_BUCKET = "ddp_bucket"
    """One call per DDP gradient bucket (``bucket_cap_mb``)."""
    DEEPSPEED_BUCKET = "deepspeed_bucket"
    """One call per DeepSpeed gradient bucket (``reduce_bucket_size`` elements)."""
    PARAMETER = "parameter"
    """One call per parameter tensor (from the rank that owns it, for a broadcast)."""
    MODULE = "module"
    """One call per module holding selected parameters (DeepSpeed ZeRO-3's fetches)."""
    MEGATRON_BUCKET = "megatron_bucket"
    """One call per Megatron-LM bucket: the whole buffer without ``--overlap-grad-reduce``, else buckets
    closed once they reach the bucket size (:func:`~zerocalc.parallel.framework_records.megatron.
    bucket_elements`)."""


class Padding(StrEnum):
    """How the array a call carries is padded (S counts the padding: it is sent)."""

    NONE = "none"
    FLAT = "flat"
    """The call's array padded to a multiple of the group size (FSDP1 ``FlatParameter``; the paper)."""
    DIM0 = "dim0"
    """Each parameter's dim 0 padded to a multiple of the group size (FSDP2 ``fully_shard``)."""
    PER_TENSOR = "per_tensor"
    """Each parameter padded to a multiple of the group size (DeepSpeed ZeRO-3 partitions)."""
    TWICE_GROUP = "twice_group"
    """The flat parameter group padded to a multiple of 2 × the group size (DeepSpeed ZeRO-1/2)."""
    MEGATRON_BUFFER = "megatron_buffer"
    """Megatron-LM's distributed-optimizer buffer: each parameter starts at a multiple of 64 elements, the
    bucket ends at a multiple of lcm(group size, 128)."""


class Select(StrEnum):
    """Which parameters a rule moves."""

    ALL = "all"
    NON_ROOT = "non_root"
    """Every FSDP unit but the root, which FSDP never reshards after forward."""
    NON_PERSISTENT = "non_persistent"
    """DeepSpeed ZeRO-3: parameters above ``param_persistence_threshold`` (the others stay gathered)."""
    RELEASED_AFTER_FORWARD = "released_after_forward"
    """DeepSpeed ZeRO-3: non-persistent parameters released after their forward, because they are not
    used again within ``max_reuse_distance`` elements of the trace."""
    PERSISTENT = "persistent"
    """DeepSpeed ZeRO-3: parameters at or below ``param_persistence_threshold``."""
    QUANTIZABLE_GRADIENTS = "quantizable_gradients"
    """ZeRO++ qgZ: gradients it quantizes (2-D or more, numel divisible by 2N)."""
    UNQUANTIZABLE_GRADIENTS = "unquantizable_gradients"
    """ZeRO++ qgZ: the others (1-D, or numel not divisible by 2N), reduce-scattered one by one."""


class Quantization(StrEnum):
    NONE = "none"
    INT8_BLOCKS = "int8_blocks"
    """ZeRO++ qwZ: int8, symmetric, plus one fp32 scale per block of at most 8000 elements; the scales are
    all-gathered in a second call."""
    INT4_GROUPS = "int4_groups"
    """ZeRO++ qgZ: int4 (two per byte), symmetric, plus one fp32 scale per group; the scales travel in a
    second all_to_all."""


class ZeroPP(StrEnum):
    """DeepSpeed ZeRO++ (Wang et al. 2023) features of ZeRO-3."""

    QWZ = "qwz"
    """Quantized weight all-gather (``zero_quantized_weights``)."""
    HPZ = "hpz"
    """Hierarchical secondary partition inside the node (``zero_hpz_partition_size``)."""
    QGZ = "qgz"
    """Quantized gradients, all-to-all in two hops (``zero_quantized_gradients``)."""


class ScheduledCollective(NamedTuple):
    """One rule of a strategy's schedule under one framework."""

    op: Collective
    phase: Phase
    tensor: Tensor
    group: RankGroup
    repeat: Repeat
    behaviour: str
    """Which framework behaviour the rule follows, with its source."""
    shard_of: RankGroup | None = None
    """The message is one rank's shard of the array partitioned over this group (HYBRID_SHARD's
    all_reduce; the second qgZ hop)."""
    dtype: TensorRole | None = None
    """The role whose dtype the tensor travels in (the precision record); None: REDUCE for gradients,
    ALL_GATHER for parameters."""
    calls: Calls = Calls.WHOLE
    padding: Padding = Padding.NONE
    select: Select = Select.ALL
    quantization: Quantization = Quantization.NONE
    quantized_by: ZeroPP | None = None
    """With this ZeRO++ feature on, the rule runs quantized (``quantization``); off, it does not."""
    requires: ZeroPP | None = None
    """The rule runs only with this ZeRO++ feature on."""
    replaced_by: ZeroPP | None = None
    """The rule runs only with this ZeRO++ feature off."""

    @property
    def dtype_role(self) -> TensorRole:
        if self.dtype is not None:
            return self.dtype
        return TensorRole.REDUCE if self.tensor is Tensor.GRADIENTS else TensorRole.ALL_GATHER

    def quantized_with(self, zeropp: frozenset[ZeroPP]) -> bool:
        """Whether the rule runs quantized with these ZeRO++ features on."""
        if self.quantization is Quantization.NONE:
            return False
        return self.quantized_by is None or self.quantized_by in zeropp

    def runs_with(self, zeropp: frozenset[ZeroPP]) -> bool:
        """Whether the rule runs with these ZeRO++ features on."""
        if self.requires is not None and self.requires not in zeropp:
            return False
        return self.replaced_by is None or self.replaced_by not in zeropp
