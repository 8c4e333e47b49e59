"""The caching allocator's model (zerocalc/peak/allocator.py): its rules by hand, and a traced H200 run."""

from __future__ import annotations

import gzip
import json

from helpers import DATA

from zerocalc.model.code import MODEL_CODES, Device, ModelImplName, Shape, layer_saves
from zerocalc.peak.allocator import CachingAllocator
from zerocalc.request.presets import load_model

MiB = 2**20
H200 = DATA / "h200-fsdp2-hf"


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


def test_a_segment_past_the_limit_frees_the_unused_cached_segments_first() -> None:
    """``DeviceCachingAllocator::malloc``: where ``cudaMalloc`` fails, ``release_cached_blocks`` returns
    every cached segment none of whose blocks is in use (of any stream), then the allocation is retried;
    a segment still in part in use stays."""
    allocator = CachingAllocator(limit=100 * MiB)
    allocator.malloc("a", 40 * MiB, "default")
    allocator.malloc("b", 30 * MiB, "side")
    allocator.malloc("c", 20 * MiB, "default")
    allocator.free("a")  # its 40 MiB segment cached, whole
    allocator.free("c")  # likewise
    allocator.malloc("d", 50 * MiB, "default")  # no cached block fits; 90 + 50 > 100: release, retry
    assert (allocator.reserved, allocator.max_reserved) == (80 * MiB, 90 * MiB)
    assert not allocator.out_of_memory
    allocator.malloc("e", 30 * MiB, "default")  # 80 + 30 > 100, and nothing cached is whole and unused
    assert allocator.out_of_memory and allocator.reserved == 110 * MiB


def test_without_a_limit_nothing_cached_is_released() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 40 * MiB, "default")
    allocator.free("a")
    allocator.malloc("b", 50 * MiB, "default")
    assert allocator.reserved == allocator.max_reserved == 90 * MiB


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


def _program_check(arch, use_cache: bool, shape: Shape) -> tuple[int, int]:
    """The most a layer program holds at once (autograd keeping the saved tensors), and the saved bytes;
    asserts its kept tensors are the saved ones and that checkpointing releases every one."""
    saves = layer_saves(MODEL_CODES[ModelImplName.HF], arch, 0, shape, 2, Device.CUDA, use_cache=use_cache)
    kept = [(n, b) for verb, n, b in saves.program if verb == "keep"]
    assert sorted(kept) == sorted(saves.saved)
    assert {n for verb, n, _ in saves.program if verb == "release"} == {n for n, _ in saves.saved}
    sizes = {n: b for verb, n, b in saves.program if verb in ("keep", "temp")}
    total = most = 0
    for verb, n, b in saves.program:
        total += {
            "keep": _rounded(b),
            "temp": _rounded(b),
            "output": _rounded(2 * shape.tokens * arch.hidden_size),
        }.get(verb, 0)
        total -= _rounded(sizes[n]) if verb == "drop" else 0
        most = max(most, total)
    return most, sum(_rounded(b) for _, b in saves.saved) + saves.forward_excess


def _rounded(nbytes: int) -> int:
    return -(-nbytes // 512) * 512


def test_the_layer_programs_keep_the_saved_tensors_and_peak_where_the_code_does() -> None:
    """code.program.forward_program: its kept tensors are the layer's saved ones, and checkpointing releases
    every one. Llama family: with autograd keeping them, the most alive at once is the saved tensors plus
    ``forward_excess`` (the mid residual, the down projection's output, the new hidden state). GPT-2 on
    CUDA: the saved tensors plus three [T, h] tensors (the attention's dropout output, the MLP's, and
    the down projection's output or the new hidden state), one fewer than ``forward_excess`` measured on
    the CPU, whose dropout keeps a noise tensor. Other code (Mixtral's experts, GPT-2 on the CPU): none."""
    shape = Shape(2, 1024)
    for name in ("llama-3-8b", "qwen2.5-7b", "qwen3-8b"):
        arch, _ = load_model(name)
        for use_cache in (True, False):
            most, lump = _program_check(arch, use_cache, shape)
            assert most == lump, name
    arch, _ = load_model("gpt2-xl")
    for use_cache in (True, False):
        most, lump = _program_check(arch, use_cache, shape)
        assert lump - most == 2 * shape.tokens * arch.hidden_size
    impl = MODEL_CODES[ModelImplName.HF]
    assert layer_saves(impl, arch, 0, shape, 2, Device.CPU).program == ()
    mixtral, _ = load_model("mixtral-8x7b")
    assert layer_saves(impl, mixtral, 0, shape, 2, Device.CUDA).program == ()


def _step_log(framework: str, **options: object) -> list:
    """The allocation log of one FSDP step of Llama-3-8B on 2 GPUs (its unit buffers' streams)."""
    from helpers import steady_step

    from zerocalc.peak.ledger import Alloc, Ledger
    from zerocalc.request.training import parse_options

    request = parse_options(
        model="llama-3-8b", framework=framework, gpus=2, strategies="zero3", seq_len=256, **options
    )
    led = steady_step(request, Ledger())
    return [op for op in led.log if isinstance(op, Alloc) and op.nbytes]


def test_fsdp1_allocates_its_unit_buffers_on_its_own_streams() -> None:
    """torch 2.13 fsdp/_runtime_utils.py: ``_unshard`` (pre-unshard stream: ``_mp_shard``; unshard stream:
    the padded flat parameter), ``_post_backward_hook`` (the reduce dtype's gradient, the sharded one);
    autograd's unsharded gradients on the default stream. FSDP2's are replayed on the default stream."""
    block = {op.name: op.stream for op in _step_log("fsdp") if op.name.startswith("0.")}
    assert block["0.mp shard"] == "pre_unshard"
    assert block["0.unsharded#0"] == "unshard"
    assert block["0.reduce-scatter input"] == block["0.fp32 grad"] == "post_backward"
    assert block["0.grad block#6"] == "default"
    lora = {op.name: op.stream for op in _step_log("fsdp", lora_rank=8) if op.name.startswith("0.")}
    assert lora["0.unsharded#6"] == "unshard"
    assert lora["0.sharded grad#0"] == lora["0.reduce-scatter input"] == "post_backward"
    assert {op.stream for op in _step_log("fsdp2") if "unsharded" in op.name} == {"default"}
