"""The caching allocator's model (zerocalc/peak/allocator.py): its rules by hand, and a traced H200 run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from zerocalc.model.model_impl import MODEL_IMPLS, Device, ModelImplName, Shape, layer_saves
from zerocalc.peak.allocator import CachingAllocator
from zerocalc.request.presets import load_model

MiB = 2**20
H200 = Path(__file__).parent / "data" / "h200-fsdp2-hf"


def test_a_large_block_taken_whole_counts_its_remainder() -> None:
    """``should_split``: a large-pool block is split only when more than 1 MiB (kSmallSize) remains;
    ``memory_allocated`` counts the block handed out (``alloc_found_block``)."""
    allocator = CachingAllocator()
    allocator.malloc("x", 30 * MiB, "default")  # ≥ 10 MiB: a segment of its size rounded to 2 MiB
    allocator.free("x")
    allocator.malloc("y", 29 * MiB + 512, "default")  # 1 MiB − 512 B would remain: taken whole
    assert (allocator.allocated, allocator.remainder, allocator.reserved) == (30 * MiB, MiB - 512, 30 * MiB)
    allocator.free("y")
    allocator.malloc("z", 28 * MiB, "default")  # 2 MiB remain: split off
    assert (allocator.allocated, allocator.remainder, allocator.reserved) == (28 * MiB, 0, 30 * MiB)


def test_the_traced_h200_run_is_replayed_to_the_byte() -> None:
    """The allocator trace of the H200 llama-1b b1 s2048 run (model creation and three steps): its
    max_memory_reserved and max_memory_allocated (steps.jsonl) from the requests alone."""
    trace = json.loads(gzip.decompress((H200 / "allocator-trace-llama-1b-b1-s2048.json.gz").read_bytes()))
    (measured,) = [
        step
        for step in map(json.loads, (H200 / "steps.jsonl").read_text().splitlines())
        if (step["model"], step["b"], step["s"]) == ("llama-1b", 1, 2048)
    ]
    allocator = CachingAllocator()
    for entry in trace["entries"]:
        if entry[0] == "alloc":
            _, address, nbytes, stream = entry
            allocator.malloc(str(address), -(-nbytes // 512) * 512, str(stream))
        else:
            allocator.free(str(entry[1]))
    assert allocator.max_reserved == measured["max_reserved"] == 29_454_499_840
    assert allocator.max_allocated == measured["max_allocated"]
    assert allocator.allocated == measured["start_allocated"]  # after the last step: the next one's start


def test_the_llama_family_layer_program_keeps_the_saved_tensors_and_peaks_where_the_lump_did() -> None:
    """model_impl.forward_program: its kept tensors are the layer's saved ones; with autograd keeping them,
    the most alive at once is the saved tensors plus ``forward_excess`` (the mid residual, the down
    projection's output and the new hidden state); under checkpointing every kept tensor is released;
    other code (GPT-2, Mixtral's experts) has none."""
    impl = MODEL_IMPLS[ModelImplName.HF]

    def rounded(nbytes: int) -> int:
        return -(-nbytes // 512) * 512

    for name in ("llama-3-8b", "qwen2.5-7b", "qwen3-8b"):
        arch, _ = load_model(name)
        hidden = 2 * 2048 * arch.hidden_size
        for use_cache in (True, False):
            saves = layer_saves(impl, arch, 0, Shape(2, 1024), 2, Device.CUDA, use_cache=use_cache)
            kept = [(n, b) for verb, n, b in saves.program if verb == "keep"]
            assert sorted(kept) == sorted(saves.saved), name
            released = {n for verb, n, _ in saves.program if verb == "release"}
            assert released == {n for n, _ in saves.saved}, name
            sizes = {n: b for verb, n, b in saves.program if verb in ("keep", "temp")}
            total = most = 0
            for verb, n, b in saves.program:
                total += {"keep": rounded(b), "temp": rounded(b), "output": rounded(hidden)}.get(verb, 0)
                total -= rounded(sizes[n]) if verb == "drop" else 0
                most = max(most, total)
            assert most == sum(rounded(b) for _, b in saves.saved) + saves.forward_excess, name
    for name in ("gpt2", "mixtral-8x7b"):
        arch, _ = load_model(name)
        assert layer_saves(impl, arch, 0, Shape(2, 1024), 2, Device.CUDA).program == ()
