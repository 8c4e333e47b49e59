"""Collective operations as small declarative records, shared by the analytic model and ``bench``.

Conventions follow nccl-tests ``doc/PERFORMANCE.md`` (NVIDIA/nccl-tests):

* ``S`` is the size in bytes of the whole array a collective works on: the full tensor of an all_reduce
  or broadcast, the *output* of an all_gather, the *input* of a reduce_scatter, and the per-rank send
  buffer of an all_to_all.
* ``algbw = S / t``; ``busbw = algbw * factor(n)``, where the bus factor is what makes busbw comparable
  with the hardware's peak link bandwidth, whatever ``n``:

  ==============  ===========  ==========================================================
  collective      factor(n)    why (ring algorithm)
  ==============  ===========  ==========================================================
  all_reduce      2(n-1)/n     a reduce-scatter then an all-gather, each (n-1)/n of S
  reduce_scatter  (n-1)/n      each rank sends n-1 chunks of S/n
  all_gather      (n-1)/n      each rank sends n-1 chunks of S/n
  broadcast       1            pipelined: every rank but the last forwards all of S
  all_to_all      (n-1)/n      each rank sends n-1 of its n blocks of S/n
  send_recv       1            each rank sends its S to one peer (and receives as much)
  ==============  ===========  ==========================================================

  ``send_recv`` is the point-to-point exchange of a ring step (context parallelism's K/V rotation,
  ``isend``/``irecv`` or a one-peer ``all_to_all_single``): S is the per-rank send buffer, its bus factor 1
  as nccl-tests' ``sendrecv`` test (``src/sendrecv.cu``: busBw = algBw). ``zerocalc bench`` does not
  measure it (:data:`BENCHMARKED`).

* Consequently the bytes each rank puts on the wire are ``factor(n) * S``, and the time of a collective
  at bus bandwidth ``B`` is ``factor(n) * S / B`` plus latency. That single definition is used both to
  turn a measured time into busbw (``bench``) and to turn a modelled message into a time (``comm``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from fractions import Fraction
from functools import cache
from typing import NamedTuple

from zerocalc.base.errors import InputError
from zerocalc.base.units import ceil_div


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    BROADCAST = "broadcast"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"

    @property
    def spec(self) -> CollectiveSpec:
        return COLLECTIVES[self]


@cache
def _ring_all_reduce(n: int) -> Fraction:
    return Fraction(2 * (n - 1), n)


@cache
def _ring_one_pass(n: int) -> Fraction:
    return Fraction(n - 1, n)


@cache
def _pipelined_broadcast(n: int) -> Fraction:
    return Fraction(1)


@cache
def _point_to_point(n: int) -> Fraction:
    return Fraction(1)


class CollectiveSpec(NamedTuple):
    """What is particular to one collective (cf. nccl-tests' ``struct testColl``)."""

    collective: Collective
    bus_factor_of: Callable[[int], Fraction]
    """nccl-tests' busbw/algbw factor for a group of n ranks (PERFORMANCE.md)."""
    formula: str
    """The factor as written in PERFORMANCE.md, for documentation and tables."""
    input_is_shard: bool
    """The per-rank input holds S/n bytes (all_gather) rather than S."""
    output_is_shard: bool
    """The per-rank output holds S/n bytes (reduce_scatter) rather than S."""
    torch_functions: tuple[str, ...]
    """``torch.distributed`` functions that run it, in order of preference (probed at run time)."""
    benchmarked: bool = True
    """``zerocalc bench`` measures it (a group collective with one call per rank)."""

    def bus_factor(self, n_ranks: int) -> Fraction:
        _check_group(n_ranks)
        return self.bus_factor_of(n_ranks)

    def bytes_sent_per_rank(self, message_bytes: int, n_ranks: int) -> int:
        """Bytes one rank sends for a message of S bytes over n ranks: ceil(factor(n) * S); 0 when n = 1."""
        _check_group(n_ranks)
        if n_ranks == 1:
            return 0
        factor = self.bus_factor_of(n_ranks)
        return ceil_div(message_bytes * factor.numerator, factor.denominator)

    def bus_bandwidth(self, message_bytes: int, n_ranks: int, seconds: float) -> float:
        """busbw = S / t * factor(n), in bytes per second (nccl-tests)."""
        return message_bytes / seconds * float(self.bus_factor(n_ranks))

    def algorithm_bandwidth(self, message_bytes: int, seconds: float) -> float:
        """algbw = S / t, in bytes per second (nccl-tests)."""
        return message_bytes / seconds


def _check_group(n_ranks: int) -> None:
    if n_ranks < 1:
        raise InputError(f"a process group needs at least 1 rank, got {n_ranks}")


COLLECTIVES: dict[Collective, CollectiveSpec] = {
    spec.collective: spec
    for spec in (
        CollectiveSpec(Collective.ALL_REDUCE, _ring_all_reduce, "2(n-1)/n", False, False, ("all_reduce",)),
        CollectiveSpec(
            Collective.REDUCE_SCATTER,
            _ring_one_pass,
            "(n-1)/n",
            False,
            True,
            ("reduce_scatter_single", "reduce_scatter_tensor"),
        ),
        CollectiveSpec(
            Collective.ALL_GATHER,
            _ring_one_pass,
            "(n-1)/n",
            True,
            False,
            ("all_gather_single", "all_gather_into_tensor"),
        ),
        CollectiveSpec(Collective.BROADCAST, _pipelined_broadcast, "1", False, False, ("broadcast",)),
        CollectiveSpec(
            Collective.ALL_TO_ALL, _ring_one_pass, "(n-1)/n", False, False, ("all_to_all_single",)
        ),
        CollectiveSpec(
            Collective.SEND_RECV,
            _point_to_point,
            "1",
            False,
            False,
            ("batch_isend_irecv",),
            benchmarked=False,
        ),
    )
}

BENCHMARKED: tuple[Collective, ...] = tuple(c for c, spec in COLLECTIVES.items() if spec.benchmarked)
"""The collectives ``zerocalc bench`` measures, in order."""


def parse_collective(text: str) -> Collective:
    """Resolve a collective name; ``allreduce``/``all-reduce`` spellings are accepted too."""
    key = text.strip().lower().replace("-", "_")
    for collective in Collective:
        if key in (collective.value, collective.value.replace("_", "")):
            return collective
    accepted = ", ".join(c.value for c in Collective)
    raise InputError(f"collective {text!r} is not known; accepted: {accepted}")
