"""Notes name what the user typed: flags at the command line, keywords in the library."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


# -------------------------------------------------- notes name flags (CLI) or keywords (library)
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--gpus", "10", "-g", "8"],
            "HYBRID_SHARD left out: --gpus 10 is not a multiple of --gpus-per-node 8",
        ),
        (["--gpus", "8", "--offload-params", "cpu"], "HYBRID_SHARD shards parameters within each node"),
        (["--gpus", "8", "--offload-params", "cpu"], "DDP left out: --offload-params cpu: DDP keeps whole"),
    ],
)
def test_notes_render_flags_not_templates(args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["memory", "--params", "7B", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "{" not in result.stdout and expected in result.stdout


@pytest.mark.parametrize(
    ("keywords", "expected"),
    [
        ({"gpus": 10, "gpus_per_node": 8}, "gpus 10 is not a multiple of gpus_per_node 8"),
        ({"gpus": 8, "offload_params": "cpu"}, "offload_params cpu: HYBRID_SHARD shards parameters"),
    ],
)
def test_library_notes_name_keywords(keywords: dict[str, object], expected: str) -> None:
    from zerocalc import estimate_memory

    notes = estimate_memory("7B", **keywords).notes  # type: ignore[arg-type]
    assert any(expected in note for note in notes), notes
    assert not any("{" in note for note in notes)


def test_peak_notes_name_flags() -> None:
    result = runner.invoke(app, ["memory", "--model", "gpt2", "--gpus", "2", "--wrap", "model"])
    assert result.exit_code == 0, result.output
    assert "--wrap model gathers" in result.stdout and "no --gpu:" in result.stdout
    assert "{" not in result.stdout
