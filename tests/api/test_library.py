"""The library: what dir() shows, rows by any alias, errors that name the keywords, results in one line."""

from __future__ import annotations

import pytest
from helpers import LLAMA_2_7B, LLAMA_2_7B_CONFIG


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), stderr
    return lines[0]


# ------------------------------------------------------------------------------------- library
def test_dir_shows_the_api() -> None:
    import zerocalc

    assert {"estimate_memory", "estimate_peak", "estimate_comm", "InputError"} <= set(dir(zerocalc))


@pytest.mark.parametrize("alias", ["fsdp", "full_shard", "FULL-SHARD", "zero3", "zero-3", "stage3"])
@pytest.mark.parametrize("function", ["estimate_memory", "estimate_comm"])
def test_row_takes_every_alias_strategies_takes(function: str, alias: str) -> None:
    import zerocalc
    from zerocalc.request.values import strategy_named

    estimate = getattr(zerocalc, function)("7B", 8, strategies=alias)
    assert estimate.row(alias).strategy is strategy_named(alias).name


@pytest.mark.parametrize("function", ["estimate_memory", "estimate_comm"])
def test_an_absent_row_is_a_key_error_naming_the_rows(function: str) -> None:
    import zerocalc

    estimate = getattr(zerocalc, function)("7B", 8, strategies="zero1,zero3")
    with pytest.raises(KeyError, match="no ddp row in this result; its rows: zero1, zero3"):
        estimate.row("ddp")
    with pytest.raises(zerocalc.InputError, match="'bogus' is not a strategy"):
        estimate.row("bogus")


@pytest.mark.parametrize(
    ("function", "value"), [("estimate_memory", "llama-3-8b"), ("estimate_comm", "gpt2")]
)
def test_a_model_given_as_params_hints_the_model_keyword(function: str, value: str) -> None:
    import zerocalc

    with pytest.raises(zerocalc.InputError, match=f"accepted: model '{value}'"):
        getattr(zerocalc, function)(value)


def test_estimate_peak_takes_a_config_dict() -> None:
    """``AutoConfig.to_dict()``'s keys (transformers 5.17 LlamaConfig): Llama-2-7B's count."""
    from zerocalc import estimate_peak

    config = {**LLAMA_2_7B_CONFIG, "_name_or_path": "meta-llama/Llama-2-7b-hf",
              "transformers_version": "5.17.0",
              "dtype": "bfloat16", "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
              "use_cache": True, "return_dict": True, "output_hidden_states": False,
              "output_attentions": False,
              "chunk_size_feed_forward": 0, "is_encoder_decoder": False, "problem_type": None,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "pretraining_tp": 1,
              "mlp_bias": False, "attention_bias": False, "head_dim": 128, "num_key_value_heads": 32,
              "tie_word_embeddings": False, "hidden_act": "silu", "rms_norm_eps": 1e-5}  # fmt: skip
    report = estimate_peak(config, 8, strategies="zero3")
    assert report.model is not None and report.model.parameter_count.total == LLAMA_2_7B
    assert report.model.name == "Llama-2-7b-hf" and report.model.title == "LlamaForCausalLM, a config dict"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        # 7e9 × 16 bytes (bf16 params and grads, fp32 master + Adam's two states) / 2^30 = 104.31 GiB
        (lambda z: z.estimate_memory("7B", 8, strategies="ddp"),
         "MemoryEstimate(params='7B', gpus=8, ddp='104.31 GiB')"),
        # 2Ψ bf16 all-reduce, ring: 2·(7/8)·14e9 B = 22.82 GiB; 24.5e9 B / 450e9 B/s + 20 µs = 54.46 ms
        (lambda z: z.estimate_comm("7B", 8, strategies="ddp"),
         "CommEstimate(params='7B', gpus=8, framework='paper', ddp='22.82 GiB in 54.46 ms')"),
    ],
)  # fmt: skip
def test_results_show_in_one_line(call, expected: str) -> None:
    from rich.pretty import pretty_repr

    import zerocalc

    result = call(zerocalc)
    assert repr(result) == expected
    assert pretty_repr(result, max_width=200) == expected


def test_a_peak_report_shows_each_peak_and_verdict_in_one_line() -> None:
    from zerocalc import estimate_peak

    report = estimate_peak("gpt2", 2, gpu="h100-80gb", strategies="zero3")
    shown = repr(report)
    assert shown.startswith("MemoryReport(model='gpt2', gpus=2, zero3='") and shown.endswith(" GiB (fits)')")
    assert len(shown) < 120
