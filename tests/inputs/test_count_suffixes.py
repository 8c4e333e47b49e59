"""One suffix rule for every count (zerocalc.base.units.COUNT_RULE): k and M are 1,024 and 1,048,576 for
tokens and sequences, K, M, B and T powers of 1,000 for parameters and elements; each count option's help
states it."""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.plan.space import plan_options
from zerocalc.request.training import parse_options

runner = CliRunner()


@pytest.mark.parametrize(
    ("global_batch", "seq_len", "sequences"),
    [("1024k", "8k", 128), ("4M", "4096", 1024), ("16M", "8k", 2048), ("2kseq", "2048", 2048),
     ("512seq", "2048", 512), ("1048576", "8192", 128)],
)  # fmt: skip
def test_a_token_batch_and_a_sequence_length_read_k_alike(
    global_batch: str, seq_len: str, sequences: int
) -> None:
    """``--global-batch 1024k --seq-len 8k``: 1,024 × 1,024 tokens in sequences of 8 × 1,024, exactly 128;
    Llama 3's 4M-token batches of 4,096-token sequences are 4·2²⁰ / 4,096 = 1,024 sequences (and 16M of
    8,192, 2,048)."""
    request = plan_options(
        model="llama-3-8b", gpu="h100-80gb", gpus=8, global_batch=global_batch, seq_len=seq_len
    )
    assert request.global_batch_sequences == sequences


def test_tokens_per_step_reads_m_as_a_power_of_1024() -> None:
    request = parse_options(params="7B", gpus=8, tokens_per_step="4M", tflops=400)
    assert request.tokens_per_step == 4 * 2**20


@pytest.mark.parametrize(
    ("keywords", "field", "value"),
    [({"params": "7B"}, "params", 7 * 10**9), ({"params": "124M"}, "params", 124 * 10**6),
     ({"params": "7B", "reduce_bucket": "500M", "framework": "deepspeed", "strategies": "zero2"},
      "reduce_bucket", 5 * 10**8)],
)  # fmt: skip
def test_parameters_and_elements_read_suffixes_as_powers_of_1000(
    keywords: dict, field: str, value: int
) -> None:
    request = parse_options(gpus=8, **keywords)
    got = request.model.params if field == "params" else request.buffers.reduce_bucket_elements
    assert got == value


def test_a_token_batch_that_is_no_whole_number_of_sequences_is_refused() -> None:
    """4,000,000 tokens are not a whole number of 4,096-token sequences: refused, never rounded."""
    result = runner.invoke(
        app, ["plan", "--model", "gpt2", "--gpu", "rtx-4090", "--global-batch", "4000000", "--seq-len", "1k"]
    )
    one_line_error(result, "(4,000,000 tokens) is not a whole number of sequences")


@pytest.mark.parametrize(
    ("command", "flag", "rule"),
    [("memory", "--params", "powers of 1,000"), ("memory", "--seq-len", "k = 1,024"),
     ("plan", "--global-batch", "k = 1,024"), ("comm", "--tokens-per-step", "k = 1,024"),
     ("memory", "--reduce-bucket", "powers of 1,000"), ("memory", "--allgather-bucket", "powers of 1,000")],
)  # fmt: skip
def test_each_count_option_states_its_suffix_rule(command: str, flag: str, rule: str) -> None:
    from zerocalc.request.options import Command, options_for

    (option,) = [o for o in options_for(Command(command)) if o.flag == flag]
    assert rule in option.help
