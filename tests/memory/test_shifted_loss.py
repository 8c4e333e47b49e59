"""``--loss shifted``: transformers 4.36-4.45's loss in ``LlamaForCausalLM.forward`` (4.45.2
``models/llama/modeling_llama.py``: ``logits = logits.float()``, ``logits[..., :-1, :].contiguous()``,
``CrossEntropyLoss``), counted by hand for Llama-3-8B on one GPU at s = 2048: T·V = 2048 · 128,256 logits,
T'·V = b·2047 · 128,256 shifted; against 5.17's ``ForCausalLMLoss`` (``--loss full``); its refusals.
tests/validate/test_shifted_loss_torch.py runs the same lines under torch.profiler."""

from __future__ import annotations

import pytest
from helpers import LossLedger, one_line_error, steady_step
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.request.training import parse_options

runner = CliRunner()

V = 128_256
LOSS_FORWARD, LOSS_BACKWARD = "loss forward (nll_loss)", "loss backward (log_softmax_backward)"
SCALARS = 4 + 4 + 4  # the previous step's loss, this one's, total_weight (fp32)


def _loss_at(b: int = 1, **kwargs: object) -> dict[str, int]:
    """One steady FSDP2 step of Llama-3-8B on one GPU under full recompute: the loss bytes at each event."""
    request = parse_options(
        **{"model": "llama-3-8b", "framework": "fsdp2", "gpus": 1, "seq_len": 2048, "micro_batch": b,
           "recompute": "full", **kwargs}
    )  # fmt: skip
    return steady_step(request, LossLedger()).loss_at


def test_the_forward_holds_fp32_logits_their_shifted_copy_and_the_log_softmax() -> None:
    TV, shifted = 2048 * V, 2047 * V
    at = _loss_at(loss="shifted")
    assert at["logits.float()"] == 4 + 2 * TV + 4 * TV  # the bf16 head output and its fp32 copy, at once
    # the bf16 logits gone with their name; a one-row batch's shifted labels are a view of the input ids
    assert at[LOSS_FORWARD] == 4 * TV + 4 * shifted + 4 * shifted + SCALARS
    full = _loss_at(loss="full")  # 5.17: bf16 logits, an fp32 copy, the padded labels, log_softmax
    assert full[LOSS_FORWARD] == 2 * TV + 4 * TV + 8 * 2049 + 4 * TV + SCALARS
    assert at[LOSS_FORWARD] - full[LOSS_FORWARD] == 2 * TV - 8 * V - 8 * 2049


def test_a_batch_of_two_copies_its_shifted_labels() -> None:
    TV, shifted = 2 * 2048 * V, 2 * 2047 * V
    at = _loss_at(b=2, loss="shifted")
    assert at[LOSS_FORWARD] == 4 * TV + 8 * shifted + 8 * 2 * 2047 + SCALARS


def test_the_backward_writes_the_shifted_gradient_into_the_whole_logits_then_casts_it() -> None:
    TV, shifted = 2048 * V, 2047 * V
    seed_and_loss = 4 + 4  # the gradient seed and this step's loss
    dropped = _loss_at(loss="shifted")  # Trainer's compute_loss: the output goes as it returns
    assert dropped[LOSS_BACKWARD] == 3 * 4 * shifted + seed_and_loss
    assert dropped["loss backward (slice_backward)"] == 4 * shifted + 4 * TV + seed_and_loss
    assert dropped["logits.float() backward"] == 4 * TV + 2 * TV + seed_and_loss
    held = _loss_at(loss="shifted", keep_output="step")  # the output's fp32 logits through backward
    for event in (LOSS_BACKWARD, "loss backward (slice_backward)", "logits.float() backward", "zero_grad"):
        assert held[event] - dropped[event] == 4 * TV


def test_a_fp32_head_is_not_copied_by_float() -> None:
    """QLoRA in pure bf16 under ``prepare_model_for_kbit_training``: the head is fp32 and so are its
    logits; ``Tensor.float`` returns them themselves (no 16-bit logits beside), and their gradient needs
    no cast."""
    at = _loss_at(loss="shifted", lora_rank=8, quantize="nf4", kbit_prepare=True, framework="ddp")
    assert "logits.float()" not in at and "logits.float() backward" not in at
    assert at["loss backward (slice_backward)"] == 4 * 2047 * V + 4 * 2048 * V + 4 + 4


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model-impl", "torchtitan"], "--loss shifted with --model-impl torchtitan: it is the loss of"),
        (["--model", "gpt2"], "--loss shifted with the gpt2 family: its transformers 4.45 forward does not"),
        (["--model", "gpt3-175b"], "--loss shifted with a model of no family"),
        (["--cp", "2"], "--loss shifted with --cp 2: transformers 4.45 trained its models on one rank's"),
        (["--compile", "model"], "--loss shifted: a loss other than the model code's under compile"),
    ],
)  # fmt: skip
def test_the_shifted_losss_refusals_are_one_line(args: list[str], fragment: str) -> None:
    base = ["memory", "--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2", "--loss", "shifted"]
    one_line_error(runner.invoke(app, [*base, *args]), fragment)
