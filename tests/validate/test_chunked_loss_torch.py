"""torchtune's chunked cross-entropy, run as its source writes it (``CEWithChunkedOutputLoss.forward`` and
``TransformerDecoder.chunked_output``: the head applied to ``h.tensor_split(n, dim=1)``, each chunk upcast
and its cross-entropy summed) on CPU, its live bytes read from torch.profiler's memory events: the forward's
and the backward's peaks are the timeline's loss tensors at its last chunk (the autograd engine runs every
chunk's loss backward before any head backward), within the few scalars the two count apart."""

from __future__ import annotations

import pytest
from helpers import LossLedger, profiled_memory_deltas, steady_step, tiny_llama_config

from zerocalc.model.code import Device
from zerocalc.request.training import parse_options

pytestmark = pytest.mark.slow

S, H, V, CHUNKS = 256, 64, 4096, 8
TINY = tiny_llama_config(V, H)
MARK = 12_345  # a uint8 tensor between forward and backward


def _chunked_cross_entropy(F, logits: list, labels):
    """``CEWithChunkedOutputLoss.forward`` (its locals gone when it returns)."""
    total_elements = (labels != -100).sum()
    chunks = [c.reshape(-1) for c in labels.tensor_split(CHUNKS, dim=1)]
    logits = [c.reshape(-1, c.size(-1)) for c in logits]
    total = 0.0
    for chunk, target in zip(logits, chunks, strict=True):
        total += F.cross_entropy(chunk.float(), target, ignore_index=-100, reduction="sum")
    return total / total_elements


def _measured(S: int = S, H: int = H, V: int = V, ignored: int = 0) -> tuple[int, int]:
    """The peak live bytes of the loss's forward and of its backward (the inputs and logits' weight
    aside); the labels held only by what saves them, as in transformers' loss function. ``ignored``: the
    size of a CPU kernel's scratch, left out (each allocation and free of exactly that many bytes)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from torch.profiler import ProfilerActivity, profile

    h = torch.randn(1, S, H, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, V, (1, S))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        logits = [F.linear(chunk, weight) for chunk in h.tensor_split(CHUNKS, dim=1)]
        padded = F.pad(ids, (0, 1), value=-100)  # transformers' labels, as the timeline counts them
        labels = padded[..., 1:].contiguous()
        loss = _chunked_cross_entropy(F, logits, labels)
        del logits, padded, labels
        mark = torch.empty(MARK, dtype=torch.uint8)
        loss.backward()
        del mark
    live, peaks, phase = 0, [0, 0], 0
    for nbytes in profiled_memory_deltas(prof):
        if ignored and abs(nbytes) == ignored:
            continue
        phase = phase or int(nbytes == MARK)
        live += nbytes
        peaks[phase] = max(peaks[phase], live)
    return peaks[0], peaks[1] - MARK


def test_torchtunes_chunked_loss_peaks_as_the_timeline_counts() -> None:
    forward, backward = _measured()
    request = parse_options(model=dict(TINY), gpus=1, seq_len=S, micro_batch=1, loss="chunked")
    led = steady_step(request, LossLedger(), Device.CPU)
    TV = S * V
    counted = led.loss_at["loss forward (output chunk7: log_softmax, nll_loss)"] - 4  # less the last step's
    assert counted == 6 * TV + 4 * TV // CHUNKS + 8 * (S + 1) + 4 + CHUNKS * 4
    assert abs(forward - counted) <= 64, (forward, counted)
    counted = led.loss_at["loss backward (output chunk7: log_softmax_backward)"]
    assert counted == 4 * TV + 8 * TV // CHUNKS + 8 * (S + 1) + 4 + 4 + (CHUNKS - 1) * 4
    assert abs(backward - counted) <= 64, (backward, counted)


def _gemm_scratch(m: int, k: int, n: int) -> int:
    """The bytes a bf16 ``m × k · k × n`` product on this CPU allocates beyond its output while it runs: 0
    where the CPU multiplies bf16 natively, an fp32 buffer of the output where oneDNN accumulates it in
    fp32 first (a CPU kernel's scratch; on CUDA cuBLAS works in its own workspace, which the timeline counts
    as the runtime's)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(k, n, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = a @ b
    live = peak = 0
    for nbytes in profiled_memory_deltas(prof):
        live += nbytes
        peak = max(peak, live)
    return peak - out.numel() * out.element_size()


def test_the_chunks_head_backward_and_slice_backward_peak_as_the_timeline_writes_them() -> None:
    """Where the head dominates (V = 256, h = 1024, s = 256, 8 chunks of 32): after every chunk's loss
    backward, each chunk's head backward makes its d h (2·32·h) and the weight gradient (2·V·h, the later
    ones added from a temporary of that size); then tensor_split's slice backward writes each d h into a
    zero [1, s, h] summed into the first: at the second, the weight gradient, the sum, the new zeros and
    seven chunks' d h are alive (the timeline's ``slice backward (output chunk6, added)``). Where this
    CPU's bf16 product of the weight gradient allocates a scratch (:func:`_gemm_scratch`), it is left out."""
    r = 256 // CHUNKS
    _, backward = _measured(256, 1024, 256, ignored=_gemm_scratch(256, r, 1024))
    counted = 2 * 256 * 1024 + 2 * 256 * 1024 + 7 * 2 * r * 1024 + 2 * 256 * 1024
    assert abs(backward - counted) <= 64, (backward, counted)
