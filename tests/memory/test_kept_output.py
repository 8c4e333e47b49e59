"""What the training loop holds of the model's output (``--keep-output``), by hand: the logits of
Llama-3-8B at b = 1, s = 2048 (T·V = 2048 · 128,256) in bf16, 2·T·V bytes, alive from the loss to the end of
the step (``step``) or on into the next forward (``next``); 4·T·V in fp32 training; the refusals and the
JSON. ``validate fake --keep-output`` checks the same against the tracker
(tests/validate/test_validate_fake.py)."""

from __future__ import annotations

import json

import pytest
from helpers import LossLedger, steady_step
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.request.training import parse_options

runner = CliRunner()

TV = 2048 * 128_256  # Llama-3-8B's logits at b = 1, s = 2048
LOSS_FORWARD, LOSS_BACKWARD = "loss forward (nll_loss)", "loss backward (log_softmax_backward)"


def _loss_at(keep_output: str, **kwargs: object) -> dict[str, int]:
    """One steady FSDP2 step of Llama-3-8B on one GPU under full recompute: the loss bytes at each event."""
    request = parse_options(
        **{"model": "llama-3-8b", "framework": "fsdp2", "gpus": 1, "seq_len": 2048, "micro_batch": 1,
           "recompute": "full", "keep_output": keep_output, **kwargs}
    )  # fmt: skip
    return steady_step(request, LossLedger()).loss_at


def test_a_loop_holding_its_output_keeps_the_bf16_logits_through_backward_and_the_step() -> None:
    dropped, held = _loss_at("none"), _loss_at("step")
    assert held["start"] == dropped["start"] == 4  # the previous step's loss, fp32
    assert held[LOSS_FORWARD] == dropped[LOSS_FORWARD]  # the logits are alive at the loss either way
    assert held[LOSS_BACKWARD] - dropped[LOSS_BACKWARD] == 2 * TV
    assert held["zero_grad"] - dropped["zero_grad"] == 2 * TV


def test_a_loop_rebinding_its_output_holds_the_previous_logits_into_the_next_forward() -> None:
    dropped, rebound = _loss_at("none"), _loss_at("next")
    assert rebound["start"] - dropped["start"] == 2 * TV
    assert rebound[LOSS_FORWARD] - dropped[LOSS_FORWARD] == 2 * TV  # the previous and the new logits
    assert rebound[LOSS_BACKWARD] - dropped[LOSS_BACKWARD] == 2 * TV
    assert rebound["zero_grad"] - dropped["zero_grad"] == 2 * TV


def test_fp32_training_holds_fp32_logits() -> None:
    dropped, held = _loss_at("none", precision="fp32"), _loss_at("step", precision="fp32")
    assert held[LOSS_BACKWARD] - dropped[LOSS_BACKWARD] == 4 * TV


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--keep-output", "always"], "--keep-output 'always' is not accepted; accepted: none, step, next"),
        (["--keep-output", "step"], "--keep-output step with --recompute none: the output's DynamicCache"),
        (["--keep-output", "next", "--recompute", "full", "--model-impl", "torchtitan"],
         "--keep-output next with --model-impl torchtitan: its training loop keeps only the loss"),
        (["--keep-output", "step", "--recompute", "full", "--loss", "chunked"],
         "--keep-output step with --loss chunked: the saver's recipe drops the output"),
        (["--keep-output", "step", "--recompute", "full", "--offload-activations"],
         "--keep-output step with --offload-activations: torchtune's recipes drop the logits"),
        (["--keep-output", "step", "--recompute", "full", "--pp", "2"],
         "--keep-output step with --pp 2: a pipeline schedule calls the loss itself"),
    ],
)  # fmt: skip
def test_the_kept_outputs_refusals_are_one_line(args: list[str], fragment: str) -> None:
    base = ["memory", "--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2"]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2
    assert fragment in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_json_echoes_the_kept_output_only_where_set() -> None:
    base = ["memory", "--model", "llama-3-8b", "--gpus", "8", "--framework", "fsdp2", "--recompute", "full"]
    plain = json.loads(runner.invoke(app, [*base, "--json"]).output)
    held = json.loads(runner.invoke(app, [*base, "--keep-output", "next", "--json"]).output)
    assert "keep_output" not in plain["options"]
    assert held["options"]["keep_output"] == "next"
    grown = held["peak"]["strategies"][0]["start_bytes"] - plain["peak"]["strategies"][0]["start_bytes"]
    # the previous output's bf16 logits (memory's default s = 2048), and up to the 1 MiB remainder of a
    # block the caching allocator hands out whole
    assert 2 * TV <= grown <= 2 * TV + 2**20
