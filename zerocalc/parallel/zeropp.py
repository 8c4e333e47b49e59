"""DeepSpeed ZeRO++ (Wang et al. 2023, arXiv 2306.10209) for ZeRO-3: the facts its communication and
memory follow, read from DeepSpeed 0.19.8 (pure, no torch).

* **qwZ** (``zero_quantized_weights``): every ZeRO-3 parameter all-gather sends int8 values and one fp32
  scale per block (``partition_parameters.py`` ``_all_gather_coalesced(quantize=True)``,
  ``CUDAQuantizer.quantize``), the scales in a second all-gather.
* **hpZ** (``zero_hpz_partition_size`` = GPUs per node): a parameter released after its forward keeps a
  secondary partition of ``aligned_numel / h`` elements in the parameter dtype (``_partition_param_sec``);
  later gathers of the step use the node's ranks only (``all_gather_coalesced``: ``use_secondary_tensor``
  → ``zero_param_process_group``); ``_post_step`` → ``invalidate_secondary_tensor`` drops them.
* **qgZ** (``zero_quantized_gradients``): gradients are quantized to int4 and reduced with two
  all-to-alls, inside the node then across nodes (``runtime/comm/coalesced_collectives.py``
  ``all_to_all_quant_reduce``), used by ``stage3.py`` ``__avg_scatter_grads`` only when the world spans
  more than one node.

The paper's headline: ZeRO-3 moves 3M per step across the full group (forward and backward all-gathers
and the gradient reduce-scatter, M = the fp16 model's bytes); ZeRO++ 0.75M (int8 forward gather 0.5M,
backward gather inside the node 0, int4 gradients 0.25M).
"""

from __future__ import annotations

from math import isqrt

from zerocalc.base.units import ceil_div
from zerocalc.model.architecture import Architecture, parameter_tensors
from zerocalc.network.cluster import Cluster
from zerocalc.network.schedule import ZeroPP

QWZ_TARGET_BLOCK = 8000
"""``CUDAQuantizer.target_group_size``: at most 8000 elements per block ("the optimal size is 4k")."""


def qwz_blocks(numel: int) -> int:
    """Blocks (one fp32 scale each) ``CUDAQuantizer.quantize`` cuts ``numel`` elements into.

    ``ceil(numel / 8000)`` blocks, increased until ``8 × blocks`` divides ``numel``, then doubled while
    ``16 × blocks`` divides it and blocks hold more than 8000 elements. (DeepSpeed asserts that the blocks
    divide ``numel`` in multiples of 8; a size it cannot cut gets ``ceil(numel / 8000)`` here.)
    """
    if numel <= 0:
        return 0
    start = ceil_div(numel, QWZ_TARGET_BLOCK)
    # DeepSpeed counts up from ``start`` one block at a time; 8·blocks divides numel exactly when blocks
    # divides numel/8, so the count stops at the smallest such divisor (none: the fallback). Found from
    # the divisors up to √(numel/8): milliseconds where counting took minutes on a large prime shard.
    blocks = _smallest_divisor_from(numel // 8, start) if numel % 8 == 0 else None
    if blocks is None:
        return start
    while numel % (16 * blocks) == 0 and numel / blocks > QWZ_TARGET_BLOCK:
        blocks *= 2
    return blocks


def _smallest_divisor_from(m: int, start: int) -> int | None:
    """The smallest divisor of ``m`` that is at least ``start`` (None when ``start > m``)."""
    best = None
    for i in range(1, isqrt(m) + 1):
        if m % i == 0:
            for d in (i, m // i):
                if d >= start and (best is None or d < best):
                    best = d
    return best


def qgz_quantizes(shape: tuple[int, ...], world_size: int) -> bool:
    """Whether qgZ quantizes a gradient of this shape: 2-D or more and numel divisible by 2N; the others
    fall back to ``reduce_scatter_coalesced`` (``all_to_all_quant_reduce``, DeepSpeed PR 5056)."""
    numel = 1
    for dim in shape:
        numel *= dim
    return len(shape) >= 2 and numel % (2 * world_size) == 0


def qgz_groups(shape: tuple[int, ...], world_size: int) -> int:
    """Scales (fp32, one per group) of the first qgZ hop: ``max(rows, cols, N)``
    (``all_to_all_quant_reduce``: ``intra_quant_group``); the second hop has ``groups // g``."""
    return max(shape[0], shape[1], world_size)


def aligned_numel(numel: int, world_size: int) -> int:
    """A ZeRO-3 parameter padded to a multiple of N (``partition_parameters.py`` ``_aligned_size``): what
    its partitions are cut from and what an all-gather of it returns."""
    return ceil_div(numel, world_size) * world_size


def hpz_secondary_elements(numels: list[int], world_size: int, partition_size: int) -> int:
    """Elements of every parameter's hpZ secondary partition on one GPU: each parameter padded to a multiple
    of N (:func:`aligned_numel`), divided over the ``h`` ranks of its secondary group
    (``_partition_param_sec``: ``secondary_partition_size = aligned_size // num_ranks_in_param_group``)."""
    return sum(aligned_numel(n, world_size) // partition_size for n in numels)


def hpz_secondary_bytes(arch: Architecture, world_size: int, partition_size: int, dtype_bytes: int) -> int:
    """Bytes per GPU of the hpZ secondary partition of every parameter of ``arch``, held in the parameter
    dtype from the first forward to the optimizer step."""
    numels = [t.numel for t in parameter_tensors(arch)]
    return hpz_secondary_elements(numels, world_size, partition_size) * dtype_bytes


def active_features(requested: frozenset[ZeroPP], cluster: Cluster) -> tuple[frozenset[ZeroPP], list[str]]:
    """The requested features that change the communication, and a note for each that does not."""
    notes = []
    active = set(requested)
    if ZeroPP.QGZ in active and cluster.nodes == 1:
        active.discard(ZeroPP.QGZ)
        notes.append(
            "qgZ does nothing on one node: __avg_scatter_grads reduce-scatters unless the world spans nodes"
        )
    return frozenset(active), notes
