"""A step's allocated bytes per event at the model's L layers, from simulations of the same request with
a few layers (pure).

The decoder stack of a model whose blocks are all alike (dense, or mixture-of-experts in every block) is
homogeneous: what block i allocates and frees is the same for every i, and what is alive around it is
what the blocks before it left (activations saved in forward, gradients kept in backward) plus the model
states, a sum over the blocks. So the bytes alive at the k-th event named after block i are affine in i
and L, ``v(L, i) = p + q·i + r·L``, for the inner blocks 2 … L−3 (:data:`EDGE` blocks at each end differ:
block 0 follows the root and frees the embedding's outputs, block L−1 starts backward unprefetched and
block L−2 is prefetched while it is gathered), and the events outside the blocks and those of the edge
blocks are affine in L. Every tensor is rounded to 512 bytes on its own, so the rounding keeps this
exact wherever the model states are a sum over FSDP units (PyTorch's frameworks): there the
extrapolation is exact, not fitted (tests/test_plan.py compares it with all-L simulations).

Simulated at L' = 6 and 7 layers: each event outside the inner blocks gives its line in L; each inner
block event its plane from blocks 2 and 3 at L' = 6 and block 2 at L' = 7, checked on blocks 3 and 4 at
L' = 7 (off by more than :data:`AFFINE_SLACK_BYTES`: :class:`NotAffine`, and the caller simulates all L
layers). ZeroRedundancyOptimizer partitions whole tensors greedily over the ranks, which is not affine in
L: it is never extrapolated. The accountings (the paper, DeepSpeed, Megatron) size their state lines from
Ψ with ``ceil(Ψ/N)``: a few bytes off a line in L (measured: ≤ 2 KiB). The maximum of a plane over the
inner blocks is at one of its two ends, so the peak at L is the maximum over the events outside the
inner blocks and those of blocks 2 and L−3.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from zerocalc.architecture import count_parameters
from zerocalc.frameworks import TorchWrapper
from zerocalc.request import ModelSpec, TrainingRequest
from zerocalc.strategies import STRATEGIES

SMALL_LAYERS = (6, 7)
"""The layer counts simulated (blocks 2 … L'−3 inner: two, then three)."""
EDGE = 2
"""Blocks at each end of the stack taken on their own: the first follows the root (and frees the
embedding's outputs); the last starts backward unprefetched, and the one before it is prefetched while the
last is still gathered."""
WORTH_IT = 2 * sum(SMALL_LAYERS)
"""Below this many layers simulating all of them is as cheap."""
AFFINE_SLACK_BYTES = 64 * 1024
"""The most an event's bytes may leave its line in L and still be extrapolated (the accountings'
``ceil(Ψ/N)`` and 512-byte rounding of Ψ-sized lines); more means the stack is not homogeneous."""

_INDEX = re.compile(r"\b(\d+)\b")

Key = tuple[str, str, str, int]
"""(phase, event name with its block index replaced, where the block is: first/last/inner/none, the
occurrence among events of that name and block)."""


class NotAffine(Exception):
    """The step's bytes are not affine in the layer count for this request (simulate all layers)."""


def homogeneous(request: TrainingRequest) -> bool:
    """Every block has the same tensors (no dense blocks among MoE ones), there are more of them than
    simulated, and the model states are a sum over units (not ZeroRedundancyOptimizer's partition)."""
    arch = request.architecture
    setup = STRATEGIES[request.strategies[0]].frameworks[request.framework].torch
    partitioned = setup is not None and setup.wrapper is TorchWrapper.ZERO_REDUNDANCY_OPTIMIZER
    return not arch.dense_layers and arch.num_layers >= WORTH_IT and not partitioned


def with_layers(request: TrainingRequest, layers: int) -> TrainingRequest:
    """The same request for the same model cut to ``layers`` blocks (its parameters recounted)."""
    arch = request.architecture.model_copy(update={"num_layers": layers})
    count = count_parameters(arch)
    model = ModelSpec(
        params=count.total,
        name=request.model.name,
        title=request.model.title,
        architecture=arch,
        parameter_count=count,
    )
    return request.model_copy(update={"model": model})


def _keyed(events: list[tuple[str, int]], layers: int) -> dict[Key, tuple[int, int]]:
    """Each event under its key, with its block index (−1 outside the blocks)."""
    out: dict[Key, tuple[int, int]] = {}
    seen: dict[tuple[str, str, int], int] = {}
    for name, allocated in events:
        phase, _, event = name.partition(":")
        match = _INDEX.search(event)
        index = int(match.group(1)) if match else -1
        template = _INDEX.sub("#", event, count=1) if match else event
        if index < 0:
            where = "none"
        elif index < EDGE:
            where = f"first{index}"
        elif index >= layers - EDGE:
            where = f"last{layers - 1 - index}"
        else:
            where = "inner"
        k = seen.get((phase, template, index), 0)
        seen[(phase, template, index)] = k + 1
        out[(phase, template, where if where != "inner" else f"inner{index}", k)] = (index, allocated)
    return out


def extrapolated_events(
    request: TrainingRequest, events_of: Callable[[TrainingRequest], list[tuple[str, int]]]
) -> list[tuple[str, int]]:
    """The allocated bytes, at the request's L, of every event that can hold the step's peak: the events
    outside the inner blocks and those of blocks 2 and L−3 (in a fixed order, the same for every
    request of one family). ``events_of`` gives a request's steady-step events ("phase:name", bytes)."""
    if not homogeneous(request):
        raise NotAffine
    big = request.architecture.num_layers
    runs = [_keyed(events_of(with_layers(request, n)), n) for n in SMALL_LAYERS]
    if any(set(_outer(r)) != set(_outer(runs[0])) for r in runs):
        raise NotAffine
    out: list[tuple[str, int]] = []
    n0 = SMALL_LAYERS[0]
    for key in sorted(_outer(runs[0])):
        v0, v1 = runs[0][key][1], runs[1][key][1]
        out.append((":".join(map(str, key)), v0 + (v1 - v0) * (big - n0)))
    # block events: v(L, i) = p + q·i + r·L from blocks 2 and 3 at L' = 6 and block 2 at L' = 7, checked
    # on blocks 3 and 4 at L' = 7
    inner = sorted({(k[0], k[1], k[3]) for run in runs for k in run if k[2].startswith("inner")})
    for phase, template, k in inner:
        try:
            a = runs[0][(phase, template, f"inner{EDGE}", k)][1]
            q = runs[0][(phase, template, f"inner{EDGE + 1}", k)][1] - a
            r = runs[1][(phase, template, f"inner{EDGE}", k)][1] - a
        except KeyError:
            raise NotAffine from None
        p = a - q * EDGE - r * n0
        for n, run in zip(SMALL_LAYERS, runs, strict=True):
            for i in range(EDGE, n - EDGE):
                got = run.get((phase, template, f"inner{i}", k))
                if got is None or abs(got[1] - (p + q * i + r * n)) > AFFINE_SLACK_BYTES:
                    raise NotAffine
        out.append((f"{phase}:{template}:block {EDGE}:{k}", p + q * EDGE + r * big))
        out.append((f"{phase}:{template}:block L-{EDGE + 1}:{k}", p + q * (big - 1 - EDGE) + r * big))
    return out


def _outer(run: dict[Key, tuple[int, int]]) -> dict[Key, tuple[int, int]]:
    return {k: v for k, v in run.items() if not k[2].startswith("inner")}
