"""A step's allocated bytes per slot (:mod:`zerocalc.plan.split`) at the model's L layers, from runs of the
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
constant between the runs, so the extrapolation is exact under every framework, not fitted (tests/plan/
compares it with all-L timelines, GPT-2 XL's capped bucket included). ZeroRedundancyOptimizer's greedy
partition of whole tensors over the ranks is such a quantity too: the optimizer states the largest rank keeps.

Run at L' = 4 and 5 layers: each slot outside the inner blocks gives its line in L; each inner block slot its
plane from blocks 1 and 2 at L' = 4 and block 1 at L' = 5, checked on the other inner blocks (2 and 3 at
L' = 5; off the plane by a byte, :meth:`Extrapolation.apply` gives None and the caller runs all L layers).
A slot is known by its hook call's phase, method, unit and label (:class:`~zerocalc.plan.split.Slot`); a
block's slots by their block's place in the stack (:class:`Key`). The slots are the same for every
configuration at one depth, so the plan (:func:`extrapolation`) is built once and applied
to each run's values. The maximum of a plane over the inner blocks is at one of its two ends (the sum of the
two parts' planes is a plane), so the peak at L is the maximum over the slots outside the inner blocks and
those of blocks 1 and L−2. A unit gathered k blocks ahead (the paper's ``--prefetch k``) makes k blocks at
each end edges: deeper than :data:`EDGE`, all L layers are run (:func:`within_edges`).
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from zerocalc.model.architecture import Architecture, count_parameters
from zerocalc.model.traits import traits
from zerocalc.plan.split import NO_EVENT, Slot, Where
from zerocalc.request.model_spec import ModelSpec
from zerocalc.request.training import TrainingRequest, replaced

SMALL_LAYERS = (4, 5)
"""The layer counts simulated (blocks 1 … L'−2 inner: two, then three)."""
EDGE = 1
"""Blocks at each end of the stack taken on their own: the first follows the root (and frees the
embedding's outputs), the last starts backward unprefetched. Measured: every inner block of every model
preset's steady step, under every framework, is on its plane at L' = 4, 5 (tests/plan/test_plan.py compares
the extrapolation with all-L runs)."""
WORTH_IT = 2 * sum(SMALL_LAYERS)
"""Below this many layers simulating all of them is as cheap."""


class End(StrEnum):
    """Where a slot's block is in the stack."""

    OUTSIDE = "outside"
    """Not a block's slot (the root's, or a hook without a unit)."""
    FIRST = "first"
    LAST = "last"
    INNER = "inner"


class Key(NamedTuple):
    """A slot as the runs at different depths share it."""

    slot: Slot
    """The slot, its block's index taken out (``unit`` None)."""
    end: End
    block: int
    """The block's index counted from its end (first, last), its index (inner), −1 (outside)."""
    occurrence: int
    """Among the run's slots of the same ``slot`` and block."""


def homogeneous(request: TrainingRequest) -> bool:
    """Every block has the same tensors (no dense blocks among MoE ones, no sliding-window layers among
    full-attention ones: their cache tensor and Gemma 3's second rotary table follow the layer index) and
    there are more of them than simulated: both parts can be extrapolated (where :func:`within_edges`)."""
    arch = request.architecture
    return not arch.dense_layers and not traits(arch).sliding_pattern and arch.num_layers >= WORTH_IT


def within_edges(request: TrainingRequest) -> bool:
    """No unit is gathered further ahead than the :data:`EDGE` blocks reach (the paper's ``--prefetch``)."""
    return request.buffers.prefetch <= EDGE


def with_layers(request: TrainingRequest, layers: int) -> TrainingRequest:
    """The same request for the same model cut to ``layers`` blocks (its parameters recounted), for the
    step's parts alone: a copy with the model replaced, not checked again (what the checks read of the
    model, its heads, widths, sequence and experts, is the whole model's, which passed them; the cut is no
    request a user gives, and a plan cuts ~10² of them)."""
    model = request.model
    assert model.architecture is not None
    return replaced(request, {"model": _cut(model.architecture, layers, model.name, model.title)})


@lru_cache(maxsize=64)
def _cut(arch: Architecture, layers: int, name: str | None, title: str | None) -> ModelSpec:
    cut = arch.model_copy(update={"num_layers": layers})
    count = count_parameters(cut)
    return ModelSpec(params=count.total, name=name, title=title, architecture=cut, parameter_count=count)


def _keyed(slots: tuple[Slot, ...], layers: int) -> dict[Key, int]:
    """Each slot's key and its index among ``slots``."""
    out: dict[Key, int] = {}
    seen: dict[tuple[Slot, int], int] = {}
    for position, slot in enumerate(slots):
        index = slot.unit if isinstance(slot.unit, int) else -1
        template = slot._replace(unit=None) if index >= 0 else slot
        if index < 0:
            end, block = End.OUTSIDE, -1
        elif index < EDGE:
            end, block = End.FIRST, index
        elif index >= layers - EDGE:
            end, block = End.LAST, layers - 1 - index
        else:
            end, block = End.INNER, index
        k = seen.get((template, index), 0)
        seen[(template, index)] = k + 1
        out[Key(template, end, block, k)] = position
    return out


def _at(key: Key, layers: int) -> Slot:
    """The slot of ``key`` at ``layers`` blocks (an inner key's block as it is)."""
    if key.end is End.FIRST or key.end is End.INNER:
        return key.slot._replace(unit=key.block)
    if key.end is End.LAST:
        return key.slot._replace(unit=layers - 1 - key.block)
    return key.slot


def _inner_slots(*runs: dict[Key, int]) -> list[tuple[Slot, int]]:
    """The (slot, occurrence) of the runs' inner-block slots, in the order they first appear."""
    return list(dict.fromkeys((k.slot, k.occurrence) for run in runs for k in run if k.end is End.INNER))


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
    slots: tuple[Slot, ...]
    """The slots at L, in the order of :meth:`apply`'s values: those outside the inner blocks, then blocks
    1 and L−2 of each inner slot (where its line peaks)."""
    outer_at: tuple[tuple[int, ...], tuple[int, ...]]
    """:attr:`outer` by run: each run's indices of the slots outside the inner blocks."""
    between_hooks: tuple[int, ...]
    """The indices of :attr:`slots` not inside a hook (``Where.IN``): where the model's part alone bounds
    the step's (:meth:`~zerocalc.plan.allocated.StepParts.peaks_up_to`)."""
    after_hooks: tuple[int, ...]
    """Those of them after a hook (``Where.AFTER``): where the framework's part is at least what it holds
    from its first hook on."""

    def apply(self, runs: tuple[list[int], list[int]]) -> list[int] | None:
        """The values at L from the two runs' values; None where they are not affine in L (a slot with
        events at one depth and none at the other, an inner block off its plane)."""
        v0, v1 = runs
        n0, big = SMALL_LAYERS[0], self.big
        deeper = big - n0
        at0, at1 = self.outer_at
        a_s, b_s = [v0[i] for i in at0], [v1[i] for i in at1]
        if [a == NO_EVENT for a in a_s] != [b == NO_EVENT for b in b_s]:
            return None
        out = [a + (b - a) * deeper for a, b in zip(a_s, b_s, strict=True)]
        # v(L, i) = p + q·i + r·L from blocks 1 and 2 at L' = 4 and block 1 at L' = 5, checked on every
        # other inner block of both runs; relative to block 1 at L' = 4: v = a + q·(i − 1) + r·(L − 4)
        last = big - 1 - 2 * EDGE
        for inner in self.inner:
            a = v0[inner.a]
            q, r = v0[inner.q] - a, v1[inner.r] - a
            for run, index, blocks, layers in inner.checks:
                if runs[run][index] != a + q * blocks + r * layers:
                    return None
            first = a + r * deeper  # block EDGE at L
            out += (first, first + q * last)
        return out


@lru_cache(maxsize=64)
def extrapolation(slots: tuple[tuple[Slot, ...], tuple[Slot, ...]], big: int) -> Extrapolation | None:
    """The plan for runs whose slots are ``slots`` (at 4 and 5 layers) to L = ``big`` layers; None where
    the runs' slots do not match (other slots outside the inner blocks, an inner slot missing in a block)."""
    keyed = [_keyed(ss, n) for ss, n in zip(slots, SMALL_LAYERS, strict=True)]
    ordered = [k for k in keyed[0] if k.end is not End.INNER]
    if set(ordered) != {k for k in keyed[1] if k.end is not End.INNER}:
        return None
    outer = tuple((keyed[0][k], keyed[1][k]) for k in ordered)
    inner_slots = _inner_slots(*keyed)
    inner = []
    defining = {(0, EDGE), (0, EDGE + 1), (1, EDGE)}  # (run, block) of a, q and r: on the plane
    for slot, k in inner_slots:
        try:
            checks = tuple(
                (run, keyed[run][Key(slot, End.INNER, i, k)], i - EDGE, n - SMALL_LAYERS[0])
                for run, n in enumerate(SMALL_LAYERS)
                for i in range(EDGE, n - EDGE)
                if (run, i) not in defining
            )
            inner.append(
                _Inner(
                    keyed[0][Key(slot, End.INNER, EDGE, k)],
                    keyed[0][Key(slot, End.INNER, EDGE + 1, k)],
                    keyed[1][Key(slot, End.INNER, EDGE, k)],
                    checks,
                )
            )
        except KeyError:
            return None
    at_l = [_at(k, big) for k in ordered]
    for slot, _ in inner_slots:
        at_l += (slot._replace(unit=EDGE), slot._replace(unit=big - 1 - EDGE))
    at_runs = (tuple(i0 for i0, _ in outer), tuple(i1 for _, i1 in outer))
    between = tuple(i for i, slot in enumerate(at_l) if slot.where is not Where.IN)
    after = tuple(i for i in between if at_l[i].where is Where.AFTER)
    return Extrapolation(big, outer, tuple(inner), tuple(at_l), at_runs, between, after)
