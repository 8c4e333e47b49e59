"""ZeRO++ qwZ's quantization blocks: the closed form against DeepSpeed's own count."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from zerocalc.base.units import ceil_div
from zerocalc.parallel.zeropp import QWZ_TARGET_BLOCK, qwz_blocks


def _counted(numel: int) -> int:
    """``CUDAQuantizer.quantize``'s block count as DeepSpeed 0.19.8 finds it: one block at a time."""
    blocks = ceil_div(numel, QWZ_TARGET_BLOCK)
    while blocks < numel and numel % (8 * blocks):
        blocks += 1
    if numel % (8 * blocks):
        return ceil_div(numel, QWZ_TARGET_BLOCK)
    while numel % (16 * blocks) == 0 and numel / blocks > QWZ_TARGET_BLOCK:
        blocks *= 2
    return blocks


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=200_000))
def test_qwz_blocks_equal_deepspeeds_count(numel: int) -> None:
    assert qwz_blocks(numel) == _counted(numel)


def test_qwz_blocks_hand_values() -> None:
    assert qwz_blocks(0) == 0
    assert qwz_blocks(16_000) == 2  # 2000 per 8 → 2 blocks of 8000
    assert qwz_blocks(8 * 7919) == 7919  # 7919 prime: the only divisor ≥ 8 is itself (blocks of 8)
    assert qwz_blocks(8 * 7919 + 1) == ceil_div(8 * 7919 + 1, QWZ_TARGET_BLOCK)  # not a multiple of 8


def test_qwz_blocks_of_a_large_prime_shard_is_fast() -> None:
    """8 × a prime near 10⁸: counting one at a time took minutes (``comm --zeropp qwz`` hung at 12
    nodes of llama-3-8b); the closed form answers at once."""
    prime = 99_999_989
    start = time.perf_counter()
    assert qwz_blocks(8 * prime) == prime
    assert time.perf_counter() - start < 0.5
