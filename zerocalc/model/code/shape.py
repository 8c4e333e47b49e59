"""One micro-batch and one rank's share of it under tensor, sequence, context and expert parallelism."""

from __future__ import annotations

from typing import NamedTuple

from zerocalc.model.activations import CpImpl, exact_split, routed_rows
from zerocalc.model.architecture import Architecture


class Shape(NamedTuple):
    """One micro-batch: b sequences of s tokens, and how one rank's share of it is split."""

    b: int
    s: int
    tp: int = 1
    """t, the tensor-parallel degree."""
    sequence_parallel: bool = False
    """The norm, dropout and residual regions split along the sequence over the t ranks (Korthikanti
    et al. 2022 §4.2.2; torchtitan's ``SequenceParallel`` norms)."""
    cp: int = 1
    """c, the context-parallel degree: each rank holds s/c tokens of every sequence."""
    cp_impl: CpImpl = CpImpl.RING
    ep: int = 1
    """e, the expert-parallel degree: the rank computes the tokens routed to its E/e experts."""
    capacity_factor: float = 1.0
    """Under expert parallelism, the tokens the rank's experts receive over the balanced k·b·s/c
    (:func:`~zerocalc.model.activations.routed_rows`)."""

    @property
    def tokens(self) -> int:
        """The micro-batch's tokens, b·s."""
        return self.b * self.s

    @property
    def local_tokens(self) -> int:
        """This rank's tokens, b·s/c: the rows of the tensor-parallel region, the logits and the loss."""
        return exact_split(self.tokens, self.cp, "b·s")

    @property
    def sequence_tokens(self) -> int:
        """Rows of the hidden states, norms and residual dropouts on this rank: b·s/c, /t under sequence
        parallelism."""
        if self.sequence_parallel and self.tp > 1:
            return exact_split(self.local_tokens, self.tp, "b·s/c")
        return self.local_tokens

    def split(self, columns: int, what: str) -> int:
        """A column-parallel width on one rank: ``columns`` / t exactly, else ``ValueError``."""
        return exact_split(columns, self.tp, what)

    def expert_rows(self, pairs: int) -> int:
        """The token-expert pairs the rank's experts compute when each rank routes ``pairs``: those pairs
        without expert parallelism; with it, the pairs the EP group routes to the rank's experts
        (:func:`~zerocalc.model.activations.routed_rows`)."""
        return pairs if self.ep == 1 else routed_rows(pairs, self.capacity_factor)


def hidden_bytes(arch: Architecture, shape: Shape, act: int) -> int:
    """One hidden state between layers on one rank (the embedding output, each layer's output, the input
    full recomputation keeps): act · R · h, R = :attr:`Shape.sequence_tokens` (Megatron-LM's hidden
    states are [s/t, b, h] under sequence parallelism; torchtitan's ``tok_embeddings``
    ``RowwiseParallel(output_layouts=Shard(1))`` hands the layers Shard(1) hidden states)."""
    return act * shape.sequence_tokens * arch.hidden_size
