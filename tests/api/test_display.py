"""Results in a notebook and on a Rich console: the CLI's tables (HTML through Rich's export), and the
tables' values as rows under the CLI's column names."""

from __future__ import annotations

import html
import io
import re
import sys

import pytest
from typer.testing import CliRunner

from zerocalc import estimate_comm, estimate_memory, estimate_peak
from zerocalc.cli import app
from zerocalc.peak.kinds import TensorKind
from zerocalc.states.memory import StateKind

runner = CliRunner()
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?%?")
GiB = 2**30


def _numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def _html_text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def _deepspeed_states():
    """What ``memory --params 7B --framework deepspeed`` computes: DeepSpeed's own accounting of Ψ."""
    from zerocalc.peak.evaluate import evaluate
    from zerocalc.request.training import parse_options

    return evaluate(parse_options(params="7B", gpus=4, framework="deepspeed"))


CASES = [
    (
        ["memory", "--params", "7B", "--gpus", "8", "--gpu", "h100-80gb"],
        lambda: estimate_memory("7B", 8, gpu="h100-80gb"),
    ),
    (["memory", "--params", "7B", "--gpus", "4", "--framework", "deepspeed"], lambda: _deepspeed_states()),
    (
        ["memory", "--model", "gpt2", "--gpus", "4", "--framework", "fsdp2", "--gpu", "h100-80gb"],
        lambda: estimate_peak("gpt2", 4, framework="fsdp2", gpu="h100-80gb"),
    ),
    (["comm", "--params", "7B", "--gpus", "16", "-g", "8"], lambda: estimate_comm("7B", 16, 8)),
]


@pytest.mark.parametrize(("args", "compute"), CASES, ids=["states", "deepspeed-states", "peak", "comm"])
def test_the_html_holds_every_number_the_cli_prints(args, compute) -> None:
    printed = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert printed.exit_code == 0, printed.output
    shown = _html_text(compute()._repr_html_())
    cli_numbers = _numbers(printed.stdout)
    assert len(cli_numbers) > 20
    missing = [n for n in cli_numbers if n not in _numbers(shown)]
    assert not missing, missing
    for line in printed.stdout.splitlines():
        if "┃" in line or "│" in line or "─" in line:  # the tables themselves, line for line
            assert line.rstrip() in shown


def test_in_a_notebook_the_html_is_returned_not_displayed(monkeypatch) -> None:
    """Inside Jupyter a Rich console displays what it prints by itself (``rich.jupyter.display``); the
    recording console must not, or the notebook would show the tables twice."""
    import rich.console
    import rich.jupyter

    shown: list[object] = []
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    monkeypatch.setattr(rich.jupyter, "display", lambda *args: shown.append(args))
    markup = estimate_memory("7B", 8)._repr_html_()
    assert "104.31" in _html_text(markup) and shown == []


def test_the_html_shows_the_hand_computed_model_states() -> None:
    """7B, bf16-mixed AdamW: 16 bytes per parameter under DDP = 112e9 bytes = 104.31 GiB; ZeRO-3 over 8
    GPUs: 14e9 bytes = 13.04 GiB (ZeRO paper §5, Ψ(2 + 2 + 12)/N_d)."""
    shown = _html_text(estimate_memory("7B", 8)._repr_html_())
    assert f"{112e9 / GiB:.2f}" == "104.31" and "104.31" in shown
    assert f"{14e9 / GiB:.2f}" == "13.04" and "13.04" in shown


def test_a_rich_console_prints_the_tables_at_its_width() -> None:
    from rich.console import Console

    result = estimate_memory("7B", 8)
    for width in (80, 120):
        out = Console(file=io.StringIO(), width=width, highlight=False)
        out.print(result)
        text = out.file.getvalue()
        assert "ZeRO-3" in text and "104.31" in text
        assert max(len(line) for line in text.splitlines()) <= width


def test_memory_rows_are_the_result_fields() -> None:
    result = estimate_memory("7B", 8, gpu="h100-80gb", offload_optimizer="cpu")
    rows = result.to_rows()
    assert [r["strategy"] for r in rows] == [s.strategy.value for s in result.strategies]
    for row, strategy in zip(rows, result.strategies, strict=True):
        assert row["Strategy"] == strategy.title
        assert row["Params"] == strategy.bytes_of(StateKind.PARAMS)
        assert row["Grads"] == strategy.bytes_of(StateKind.GRADS)
        assert row["Total / GPU"] == strategy.gpu_bytes
        assert row["vs DDP"] == strategy.fraction_of_ddp
        assert row["CPU / GPU"] == strategy.cpu_bytes_per_gpu
        assert row["CPU / node"] == strategy.cpu_bytes_per_node
        assert row["Free"] == strategy.headroom_bytes
    zero3 = rows[[r["strategy"] for r in rows].index("zero3")]
    assert zero3["Params"] == 7_000_000_000 * 2 // 8  # bf16 parameters over 8 GPUs
    assert zero3["Optimizer"] == 0  # offloaded: "→ cpu" in the table, its bytes under "CPU / GPU"
    assert zero3["CPU / GPU"] == 7_000_000_000 * (12 + 2) // 8  # ZeRO-Offload: optimizer states and grads


def test_peak_rows_carry_the_peak_tables_under_their_labels() -> None:
    result = estimate_peak("gpt2", 4, framework="fsdp2", gpu="h100-80gb")
    assert result.peak is not None
    for row, peak in zip(result.to_rows(), result.peak.strategies, strict=True):
        assert row["strategy"] == peak.strategy.value
        assert row["Peak in"] == f"{peak.peak_phase.value}: {peak.peak_event}"
        assert row["Device"] == row["= device (cudaMemGetInfo)"] == peak.peak_bytes
        assert row["allocated (max_allocated)"] == peak.allocated_peak_bytes
        assert row["+ allocator reserve"] == peak.allocator_reserve_bytes
        assert row["activations"] == peak.term(TensorKind.ACTIVATIONS)
        assert row["Of GPU"] == peak.verdict and row["Free"] == peak.headroom_bytes
        terms = sum(row[t.kind.value] for t in peak.terms)
        assert terms == peak.allocated_peak_bytes


def test_comm_rows_are_the_summary_table() -> None:
    result = estimate_comm("7B", 16, 8)
    rows = result.to_rows()
    for row, strategy in zip(rows, result.strategies, strict=True):
        assert row["strategy"] == strategy.strategy.value
        assert row["sent/GPU"] == strategy.total_bytes_per_gpu
        assert row["inter-node"] == strategy.inter_node_bytes_per_gpu
        assert row["vs DDP"] == strategy.ratio_to_ddp
        assert row["time"] == strategy.time_s
    ddp = rows[0]
    assert ddp["sent/GPU"] == 2 * 15 * 7_000_000_000 * 2 // 16  # ring all-reduce 2(n-1)/n · 2Ψ bytes


def test_to_frame_without_pandas_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"to_frame\(\) needs pandas.*to_rows\(\)"):
        estimate_memory("7B", 8).to_frame()


def test_to_frame_with_pandas_is_the_rows() -> None:
    pandas = pytest.importorskip("pandas")
    result = estimate_memory("7B", 8)
    frame = result.to_frame()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.index) == [r["strategy"] for r in result.to_rows()]
    assert frame.loc["zero3", "Total / GPU"] == result.row("zero3").gpu_bytes


def test_computing_a_result_imports_no_renderer() -> None:
    import subprocess

    code = (
        "import sys; from zerocalc import estimate_peak; estimate_peak('gpt2', 2); "
        "print(sorted(m for m in sys.modules if m.startswith(('zerocalc.render', 'rich'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
