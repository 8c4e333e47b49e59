"""zerocalc.comm.calls: a rule's calls on a small hand-made layout, every size computed by hand."""

from __future__ import annotations

from zerocalc.comm.calls import CallContext, Layout, rule_calls
from zerocalc.model.architecture import ParamTensor
from zerocalc.network.cluster import RankGroup
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import Calls, Padding, Phase, Quantization, Repeat, ScheduledCollective, Tensor
from zerocalc.states.framework import zero1_owners

TENSORS = [
    ParamTensor(module="layers.0.attn", name="weight", shape=(6, 4)),
    ParamTensor(module="layers.0.norm", name="weight", shape=(5,)),
    ParamTensor(module="layers.1.attn", name="weight", shape=(6, 4)),
    ParamTensor(module="layers.1.norm", name="weight", shape=(5,)),
    ParamTensor(module="final_norm", name="weight", shape=(5,)),
]
"""Two blocks of 24 + 5 elements, then a root of 5 (63 in all)."""


def _layout() -> Layout:
    units = (("layers.0", (0, 1)), ("layers.1", (2, 3)), ("root", (4,)))
    return Layout(tensors=tuple(TENSORS), units=units, from_architecture=True)


def _rule(op: Collective, calls: Calls, padding: Padding, **extra: object) -> ScheduledCollective:
    return ScheduledCollective(
        op=op, phase=Phase.FORWARD, tensor=Tensor.PARAMETERS, group=RankGroup.WORLD,
        repeat=Repeat.PER_MICRO_BATCH, behaviour="test", calls=calls, padding=padding, **extra,
    )  # fmt: skip


def _ctx(ranks: int) -> CallContext:
    return CallContext(
        world_size=ranks, group_size=ranks, shard_size=1, element_bytes=2, ddp_bucket_bytes=0,
        ddp_first_bucket_bytes=0, deepspeed_bucket_elements=0,
    )  # fmt: skip


def _calls(rule: ScheduledCollective, ranks: int) -> list[tuple[str, int, int | None]]:
    made = rule_calls(rule, _layout(), _ctx(ranks))
    assert made is not None and made[1] is None
    return list(made[0].each())


def test_unit_calls_pad_each_blocks_shapes_alike() -> None:
    dim0 = _calls(_rule(Collective.ALL_GATHER, Calls.UNIT, Padding.DIM0), 4)
    assert dim0 == [("layers.0", 8 * 4 + 8, None), ("layers.1", 40, None), ("root", 8, None)]
    flat = _calls(_rule(Collective.ALL_GATHER, Calls.UNIT, Padding.FLAT), 4)  # 29 → 32, 5 → 8
    assert flat == [("layers.0", 32, None), ("layers.1", 32, None), ("root", 8, None)]
    aligned = _calls(_rule(Collective.ALL_GATHER, Calls.UNIT, Padding.PER_TENSOR), 4)  # 24 + 8, 8
    assert [c[1] for c in aligned] == [32, 32, 8]
    made = rule_calls(_rule(Collective.ALL_GATHER, Calls.UNIT, Padding.DIM0), _layout(), _ctx(4))
    assert made is not None
    assert list(made[0].by_size()) == [(40, 2), (8, 1)]  # the two blocks sized once


def test_whole_and_broadcast_calls() -> None:
    assert _calls(_rule(Collective.ALL_GATHER, Calls.WHOLE, Padding.TWICE_GROUP), 4) == [
        ("all parameters", 64, None)  # 63 to a multiple of 2·4
    ]
    # sorted 24 (0), 24 (2), 5 (1), 5 (3), 5 (4): rank 0 takes 0, 1, 4 (34), rank 1 takes 2, 3 (29)
    broadcasts = _calls(_rule(Collective.BROADCAST, Calls.PARAMETER, Padding.NONE), 2)
    assert broadcasts == [
        ("rank 0", 24, 0),
        ("rank 0", 5, 0),
        ("rank 0", 5, 0),
        ("rank 1", 24, 1),
        ("rank 1", 5, 1),
    ]


def test_qwz_scales_are_one_per_block_of_each_ranks_partition() -> None:
    rule = _rule(Collective.ALL_GATHER, Calls.UNIT, Padding.DIM0, quantization=Quantization.INT8_BLOCKS)
    made = rule_calls(rule, _layout(), _ctx(4), quantized=True)
    assert made is not None and made[1] is not None
    data, scales = made
    assert [c[1] for c in data.each()] == [40, 40, 8]
    assert [c[1] for c in scales.each()] == [4, 4, 4]  # one block of 10 (or 2) elements on each of 4 ranks


def test_zero1_owners_are_positions_of_the_greedy_partition() -> None:
    # sorted: 9 (1), 9 (2), 5 (0), 3 (3), 1 (4) → r0 9, r1 9, r0 +5 = 14, r1 +3 = 12, r1 +1 = 13
    assert zero1_owners([5, 9, 9, 3, 1], 2) == [[1, 0], [2, 3, 4]]
