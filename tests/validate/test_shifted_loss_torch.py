"""``--loss shifted`` against the lines it models, run on CPU: transformers 4.45.2
``LlamaForCausalLM.forward``'s loss (``models/llama/modeling_llama.py``: ``logits = logits.float()``,
``shift_logits = logits[..., :-1, :].contiguous()``, ``shift_labels = labels[..., 1:].contiguous()``,
``CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))``), its live bytes read from
torch.profiler's memory events: the forward's and the backward's peaks are the timeline's loss tensors at
its ``nll_loss`` and ``log_softmax_backward`` events, within the few scalars the two count apart."""

from __future__ import annotations

import pytest
from helpers import LossLedger, profiled_memory_deltas, steady_step, tiny_llama_config

from zerocalc.model.code import Device
from zerocalc.request.training import parse_options

pytestmark = pytest.mark.slow

B, S, H, V = 2, 256, 64, 4096
TINY = tiny_llama_config(V, H)
MARK = 12_345  # a uint8 tensor between forward and backward


def _measured(keep_output: bool) -> tuple[int, int]:
    """The peak live bytes of the loss's forward and of its backward (the head's input and weight aside),
    the output's logits dropped before backward or (``keep_output``) held through it."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from torch.profiler import ProfilerActivity, profile

    hidden = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, V, (B, S))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        logits = F.linear(hidden, weight)  # lm_head
        logits = logits.float()
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = torch.nn.CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))
        del shift_logits, shift_labels  # the forward's locals, gone as it returns
        if not keep_output:
            del logits
        mark = torch.empty(MARK, dtype=torch.uint8)
        loss.backward()
        del mark
    live, peaks, phase = 0, [0, 0], 0
    for nbytes in profiled_memory_deltas(prof):
        phase = phase or int(nbytes == MARK)
        live += nbytes
        peaks[phase] = max(peaks[phase], live)
    return peaks[0], peaks[1] - MARK


@pytest.mark.parametrize("keep_output", ["none", "step"])
def test_the_shifted_loss_peaks_as_the_timeline_counts(keep_output: str) -> None:
    forward, backward = _measured(keep_output == "step")
    request = parse_options(
        model=dict(TINY),
        gpus=1,
        seq_len=S,
        micro_batch=B,
        loss="shifted",
        keep_output=keep_output,
        recompute="full",
    )
    led = steady_step(request, LossLedger(), Device.CPU)
    TV, shifted = B * S * V, B * (S - 1) * V
    counted = led.loss_at["loss forward (nll_loss)"] - 4  # less the previous step's loss
    assert counted == 4 * TV + 8 * shifted + 8 * B * (S - 1) + 4 + 4
    assert abs(forward - counted) <= 64, (forward, counted)
    counted = led.loss_at["loss backward (log_softmax_backward)"]
    held = 4 * TV if keep_output == "step" else 0
    assert counted == held + 12 * shifted + 4 + 4  # and the loss, the gradient's seed
    assert abs(backward - counted) <= 64, (backward, counted)
