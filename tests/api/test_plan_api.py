"""``zerocalc.plan``: the search of ``zerocalc plan`` from Python, returning what ``--json`` prints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zerocalc import InputError, PlanResult, plan
from zerocalc.cli import app

runner = CliRunner()

KEYWORDS = {"gpus": 8, "gpu": "h100-80gb", "global_batch": "256seq", "seq_len": 4096, "top": 2}
TIMINGS = {"seconds", "search_seconds", "exact_seconds", "candidates_per_second"}


def test_plan_returns_the_result_json_prints() -> None:
    result = plan("llama-3-8b", **KEYWORDS)
    assert isinstance(result, PlanResult) and len(result.top) == 2
    flags = [
        "--gpus",
        "8",
        "--gpu",
        "h100-80gb",
        "--global-batch",
        "256seq",
        "--seq-len",
        "4096",
        "--top",
        "2",
    ]
    printed = runner.invoke(app, ["plan", "--model", "llama-3-8b", *flags, "--json"])
    assert printed.exit_code == 0, printed.output
    cli = json.loads(printed.stdout)
    ours = json.loads(result.model_dump_json())
    for key in set(cli) - TIMINGS - {"options", "candidates"}:  # the CLI's --json also lists every candidate
        assert ours[key] == cli[key], key
    assert ours["options"]["global_batch"] == "256seq" and ours["options"]["gpu"] == "h100-80gb"
    assert result.top[0].memory_options["strategies"] == cli["top"][0]["memory_options"]["strategies"]


def test_plan_is_a_lazy_name_of_the_package_even_once_its_subpackage_is_imported() -> None:
    """``zerocalc.plan`` is also the subpackage of the search, bound to that name once any of its modules
    is imported: called, it is the function too."""
    import zerocalc.plan.search

    assert "plan" in zerocalc.__all__ and "plan" in dir(zerocalc)
    from zerocalc import plan as bound

    assert bound("llama-3-8b", **KEYWORDS).top == plan("llama-3-8b", **KEYWORDS).top


def test_plan_names_keywords_in_its_errors() -> None:
    with pytest.raises(InputError, match=r"plan\(\) takes no keyword 'global_batches'"):
        plan("llama-3-8b", gpus=8, gpu="h100-80gb", global_batches="256seq")
    with pytest.raises(InputError, match=r"^global_batch '1000000' \(1,000,000 tokens\)"):
        plan("llama-3-8b", gpus=8, gpu="h100-80gb", global_batch="1000000", seq_len=4096)


def test_plan_keeps_every_candidate_when_asked() -> None:
    everything = plan("llama-3-8b", **KEYWORDS, candidates=True)
    assert everything.candidates is not None
    assert len(everything.candidates) == everything.candidates_evaluated
    assert plan("llama-3-8b", **KEYWORDS).candidates is None
