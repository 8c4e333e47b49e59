"""A step's allocated bytes per slot (:mod:`zerocalc.peak.split`) at the model's L layers, from runs of the
same request with a few layers (pure).

The decoder stack of a model whose blocks are all alike (dense, or mixture-of-experts in every block) is
homogeneous: what block i allocates and frees is the same for every i, and what is alive around it is what the
blocks before it left (activations saved in forward, gradients kept in backward) plus the model states, a sum
over the blocks. So the bytes alive at the k-th slot named after block i are affine in i and L,
``v(L, i) = p + q·i + r·L``, for the inner blocks 1 … L−2 (:data:`EDGE` block at each end differs: block 0
follows the root and frees the embedding's outputs, block L−1 starts backward unprefetched), and the events
outside the blocks and those of the edge blocks are affine in L; so is each part of a slot (the framework's,
the model's) on its own. Every tensor is rounded to 512 bytes on its own, so the rounding keeps this exact for
the blocks' own tensors. What is not a sum over blocks is not affine in L: the accountings' state lines
(``ceil(Ψ/N)``, each rounded once; DeepSpeed's buckets ``min(bucket, Ψ)``, capped at L but not at a few layers
for a small model), DDP's reducer buffer (one tensor). The framework's runs at a few blocks therefore keep
every such quantity at the whole model's value (:func:`zerocalc.peak.simulate.mechanics_for` with ``blocks``):
constant between the runs, so the extrapolation is exact under every framework, not fitted (tests/test_plan.py
compares it with all-L timelines, GPT-2 XL's capped bucket included). ZeroRedundancyOptimizer's greedy
partition of whole tensors over the ranks is such a quantity too: the optimizer states the largest rank keeps.

Run at L' = 4 and 5 layers: each slot outside the inner blocks gives its line in L; each inner block slot its
plane from blocks 1 and 2 at L' = 4 and block 1 at L' = 5, checked on the other inner blocks (2 and 3 at
L' = 5; off the plane by a byte: :class:`NotAffine`, and the caller runs all L layers). The slots' names are
the same for every configuration at one depth, so the plan (:func:`extrapolation`) is built once and applied
to each run's values. The maximum of a plane over the inner blocks is at one of its two ends (the sum of the
two parts' planes is a plane), so the peak at L is the maximum over the slots outside the inner blocks and
those of blocks 1 and L−2. A unit gathered k blocks ahead (the paper's ``--prefetch k``) makes k blocks at
each end edges: deeper than :data:`EDGE`, all L layers are run (:func:`within_edges`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from zerocalc.model.architecture import Architecture, count_parameters
from zerocalc.peak.split import NO_EVENT
from zerocalc.request.training import ModelSpec, TrainingRequest

SMALL_LAYERS = (4, 5)
"""The layer counts simulated (blocks 1 … L'−2 inner: two, then three)."""
EDGE = 1
"""Blocks at each end of the stack taken on their own: the first follows the root (and frees the
embedding's outputs), the last starts backward unprefetched. Measured: every inner block of every model
preset's steady step, under every framework, is on its plane at L' = 4, 5 (tests/test_plan.py compares
the extrapolation with all-L runs)."""
WORTH_IT = 2 * sum(SMALL_LAYERS)
"""Below this many layers simulating all of them is as cheap."""

_INDEX = re.compile(r"\b(\d+)\b")

Key = tuple[str, str, str, int]
"""(phase, event name with its block index replaced, where the block is: first/last/inner/none, the
occurrence among events of that name and block)."""


class NotAffine(Exception):
    """The step's bytes are not affine in the layer count for this request (simulate all layers)."""


def homogeneous(request: TrainingRequest) -> bool:
    """Every block has the same tensors (no dense blocks among MoE ones) and there are more of them than
    simulated: both parts can be extrapolated (where :func:`within_edges`)."""
    arch = request.architecture
    return not arch.dense_layers and arch.num_layers >= WORTH_IT


def within_edges(request: TrainingRequest) -> bool:
    """No unit is gathered further ahead than the :data:`EDGE` blocks reach (the paper's ``--prefetch``)."""
    return request.buffers.prefetch <= EDGE


def with_layers(request: TrainingRequest, layers: int) -> TrainingRequest:
    """The same request for the same model cut to ``layers`` blocks (its parameters recounted)."""
    model = request.model
    assert model.architecture is not None
    return request.model_copy(update={"model": _cut(model.architecture, layers, model.name, model.title)})


@lru_cache(maxsize=64)
def _cut(arch: Architecture, layers: int, name: str | None, title: str | None) -> ModelSpec:
    cut = arch.model_copy(update={"num_layers": layers})
    count = count_parameters(cut)
    return ModelSpec(params=count.total, name=name, title=title, architecture=cut, parameter_count=count)


def _keyed(names: tuple[str, ...], layers: int) -> dict[Key, int]:
    """Each slot's key and its index among ``names``."""
    out: dict[Key, int] = {}
    seen: dict[tuple[str, str, int], int] = {}
    for position, name in enumerate(names):
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
            where = f"inner{index}"
        k = seen.get((phase, template, index), 0)
        seen[(phase, template, index)] = k + 1
        out[(phase, template, where, k)] = position
    return out


def _outer_keys(run: dict[Key, int]) -> set[Key]:
    """A run's slots outside the inner blocks."""
    return {k for k in run if not k[2].startswith("inner")}


def _inner_slots(*runs: dict[Key, int]) -> list[tuple[str, str, int]]:
    """The (phase, event, occurrence) of the runs' inner-block slots, in order."""
    return sorted({(k[0], k[1], k[3]) for run in runs for k in run if k[2].startswith("inner")})


def _names_at_l(outer: list[Key], inner: list[tuple[str, str, int]]) -> tuple[str, ...]:
    """The slots at L: those outside the inner blocks, then blocks 1 and L−2 of each inner slot (where its
    line peaks)."""
    names = [":".join(map(str, key)) for key in outer]
    for phase, template, k in inner:
        names += [f"{phase}:{template}:block {EDGE}:{k}", f"{phase}:{template}:block L-{EDGE + 1}:{k}"]
    return tuple(names)


class _Inner(NamedTuple):
    a: int
    """Block 1 at L' = 4 (index into that run's values)."""
    q: int
    """Block 2 at L' = 4."""
    r: int
    """Block 1 at L' = 5."""
    checks: tuple[tuple[int, int, int, int], ...]
    """(run, index, block − 1, L' − 4) of every other inner block of both runs (the three above define the
    plane: they are on it)."""


class Extrapolation(NamedTuple):
    """Which values of the 4- and 5-layer runs give each slot at L (built once per model and depth)."""

    big: int
    outer: tuple[tuple[int, int], ...]
    """Per slot outside the inner blocks: its index in each run."""
    inner: tuple[_Inner, ...]
    names: tuple[str, ...]
    """The slots at L, in the order of :meth:`apply`'s values."""

    def apply(self, runs: tuple[list[int], list[int]]) -> list[int]:
        """The values at L from the two runs' values (:class:`NotAffine` where an inner block leaves its
        plane)."""
        v0, v1 = runs
        n0, big = SMALL_LAYERS[0], self.big
        out = []
        for i0, i1 in self.outer:
            a, b = v0[i0], v1[i1]
            if (a == NO_EVENT) != (b == NO_EVENT):
                raise NotAffine  # a slot with events at one depth and none at the other
            out.append(a + (b - a) * (big - n0))
        # v(L, i) = p + q·i + r·L from blocks 1 and 2 at L' = 4 and block 1 at L' = 5, checked on every
        # other inner block of both runs; relative to block 1 at L' = 4: v = a + q·(i − 1) + r·(L − 4)
        deeper, last = big - n0, big - 1 - 2 * EDGE
        for inner in self.inner:
            a = v0[inner.a]
            q, r = v0[inner.q] - a, v1[inner.r] - a
            for run, index, blocks, layers in inner.checks:
                if runs[run][index] != a + q * blocks + r * layers:
                    raise NotAffine
            first = a + r * deeper  # block EDGE at L
            out += (first, first + q * last)
        return out


@lru_cache(maxsize=64)
def extrapolation(names: tuple[tuple[str, ...], tuple[str, ...]], big: int) -> Extrapolation:
    """The plan for runs whose slots are ``names`` (at 4 and 5 layers) to L = ``big`` layers."""
    keyed = [_keyed(ns, n) for ns, n in zip(names, SMALL_LAYERS, strict=True)]
    outer_keys = [_outer_keys(run) for run in keyed]
    if outer_keys[0] != outer_keys[1]:
        raise NotAffine
    ordered = sorted(outer_keys[0])
    outer = tuple((keyed[0][k], keyed[1][k]) for k in ordered)
    slots = _inner_slots(*keyed)
    inner = []
    defining = {(0, EDGE), (0, EDGE + 1), (1, EDGE)}  # (run, block) of a, q and r: on the plane
    for phase, template, k in slots:
        try:
            checks = tuple(
                (run, keyed[run][(phase, template, f"inner{i}", k)], i - EDGE, n - SMALL_LAYERS[0])
                for run, n in enumerate(SMALL_LAYERS)
                for i in range(EDGE, n - EDGE)
                if (run, i) not in defining
            )
            inner.append(
                _Inner(
                    keyed[0][(phase, template, f"inner{EDGE}", k)],
                    keyed[0][(phase, template, f"inner{EDGE + 1}", k)],
                    keyed[1][(phase, template, f"inner{EDGE}", k)],
                    checks,
                )
            )
        except KeyError:
            raise NotAffine from None
    return Extrapolation(big, outer, tuple(inner), _names_at_l(ordered, slots))
