"""The ledger's tensors allocated and freed together: one by one in the full ledger (the allocator replay
needs each block), as one entry in the slot ledger (plan's runs); the same totals either way."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zerocalc.peak.ledger import CUDA_BLOCK, Ledger, Sizes
from zerocalc.peak.mechanics import Unit
from zerocalc.plan.split import SlotLedger

sizes = st.lists(st.integers(min_value=0, max_value=3 * CUDA_BLOCK), max_size=6)


def test_alloc_each_names_and_rounds_every_tensor() -> None:
    led = Ledger()
    led.alloc_each(("exp_avg", "exp_avg_sq"), [1, 512, 0, 513], "optimizer")
    assert list(led.live) == [
        "exp_avg#0", "exp_avg_sq#0", "exp_avg#1", "exp_avg_sq#1", "exp_avg#3", "exp_avg_sq#3",
    ]  # fmt: skip
    assert led.total == 2 * (512 + 512 + 1024)  # a zero-byte tensor is not allocated
    led.free_each("exp_avg", 4)
    assert led.total == 512 + 512 + 1024


@given(st.lists(st.tuples(st.booleans(), sizes), min_size=1, max_size=8))
def test_the_slot_ledger_keeps_the_full_ledgers_totals(steps: list[tuple[bool, list[int]]]) -> None:
    """Bundles of tensors allocated (two prefixes each) and some freed again: after every step both
    ledgers hold the same bytes."""
    full, slots = Ledger(), SlotLedger(framework=True)
    for step, (free_again, each) in enumerate(steps):
        prefixes = (f"a{step}", f"b{step}")
        for led in (full, slots):
            led.alloc_each(prefixes, each, "kind")
            if free_again:
                led.free_each(prefixes[0], len(each))
        assert slots.total == full.total


def test_free_each_frees_tensors_allocated_one_by_one() -> None:
    """The slot ledger frees a prefix's tensors even when they were allocated one at a time."""
    led = SlotLedger(framework=True)
    for i in range(3):
        led.alloc(f"unsharded#{i}", 100, "gathered")
    led.free_each("unsharded", 3)
    assert led.total == 0 and not led.live


@given(st.lists(st.integers(min_value=0, max_value=3 * CUDA_BLOCK), max_size=6), st.integers(0, 2000))
def test_a_group_allocated_together_is_freed_with_the_others(saved: list[int], extra: int) -> None:
    """A layer's saved activations (alloc_group) and a tensor added to its group alone: the same totals in
    both ledgers, and free_group frees them all."""
    full, slots = Ledger(), SlotLedger(framework=False)
    for led in (full, slots):
        led.alloc("hidden", 1000, "activations")
        led.alloc_group("layer 3", [(f"save {i}", b) for i, b in enumerate(saved)], "activations")
        led.alloc("layer 3.sdpa rng", extra, "activations", group="layer 3")
    assert slots.total == full.total == 1024 + sum(-(-b // 512) * 512 for b in [*saved, extra])
    for led in (full, slots):
        led.free_group("layer 3")
        assert led.total == 1024


def test_a_group_allocated_twice_keeps_both() -> None:
    full, slots = Ledger(), SlotLedger(framework=False)
    for led in (full, slots):
        led.alloc_group("layer 0", [("a", 100), ("b", 600)], "activations")
        led.alloc_group("layer 0", [("c", 1)], "activations")
    assert slots.total == full.total == 512 + 1024 + 512
    for led in (full, slots):
        led.free_group("layer 0")
    assert slots.total == full.total == 0


def test_sizes_keep_their_rounded_total_per_block() -> None:
    """A unit's sizes are rounded once per allocator block: 512 on CUDA, 1 on CPU."""
    sizes = Sizes([1, 512, 0, 513])
    assert Ledger().rounded_total(sizes) == 512 + 512 + 1024
    assert Ledger(block=1).rounded_total(sizes) == 1 + 512 + 513
    assert Ledger().rounded_total(sizes) == 2048  # the CPU total did not replace the CUDA one
    assert list(sizes) == [1, 512, 0, 513]


def test_a_units_bytes_are_its_elements_times_the_element_size() -> None:
    unit = Unit("0", params=[10, 3], local=[5, 2], padded=[10, 4])
    assert unit.bytes_each("local", 4) == (20, 8)
    assert unit.bytes_each("padded", 2) == (20, 8)
    assert unit.bytes_each("params", 2) == (20, 6)
    assert unit.bytes_each("local", 4) is unit.bytes_each("local", 4)  # computed once
    assert unit.numel == 13
