"""Bad input is refused in one line (exit 2) or reported, never a traceback, never silently ignored."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()


def _one_line_exit_2(args: list[str], fragment: str, env: dict[str, str] | None = None) -> None:
    one_line_error(runner.invoke(app, args, env=env), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["memory", "--params", "1e400"], "--params '1e400' is out of range"),
        (["comm", "--params", "1e400"], "--params '1e400' is out of range"),
        (["memory", "--params", "1e30T"], "is more than"),
        (["memory", "--params", "7B", "--gpu-memory", "1e400GiB"], "--gpu-memory '1e400GiB'"),
        (["memory", "--params", "7B", "--gpu-memory", "80"], "--gpu-memory '80' has no unit"),
        (["comm", "--params", "7B", "--gpus", "8", "--intra-node-bw", "450"], "has no unit"),
        (["comm", "--params", "7B", "--gpus", "8", "--intra-node-bw", "1e400GB/s"], "out of range"),
        (["comm", "--params", "7B", "--gpus", "8", "--latency", "1e400"], "--latency '1e400'"),
        (["comm", "--params", "7B", "--tokens-per-step", "1M", "--tflops", "1e400"], "--tflops '1e400'"),
        (["memory", "--params", "7B", "--gpus", "1000000000"], "--gpus '1000000000'"),
        (["memory", "--params", "7B", "--gpus", "²"], "--gpus '²' is not accepted; accepted: a whole"),
        (["plan", "--model", "gpt2", "--gpu", "rtx-4090", "--global-batch", "8seq", "--gpus", "+-4"], "+-4"),
        (["memory", "--params", "7B", "--seq-len", "٣"], "--seq-len '٣' is not accepted"),
        (["comm", "--params", "7B", "--gpus", "8", "-A", "1000000000000000000000000"], "--grad-accum"),
        (["memory", "--params", "7B", "--units", ""], "--units ''"),
        (["memory", "--params", "7B", "-s", ""], "--strategy '' names no strategy"),
        (["memory", "--params", "7B", "-s", "all,zero1"], "'all' stands alone"),
        (["memory", "--params", "7B", "--framework", "nonsense"], "--framework 'nonsense'"),
        (["memory", "--params", "7B", "--framework", "fsdp2"], "--model NAME or config.json"),
        (["memory", "--params", "7B", "--seq-len", "0"], "--seq-len '0'"),
        (["memory", "--params", "7B", "--micro-batch", "0"], "--micro-batch '0'"),
        (["memory", "--params", "7B", "--recompute", "bogus"], "--recompute 'bogus'"),
        (["memory", "--params", "7B", "--wrap", "bogus"], "--wrap 'bogus'"),
        (["memory", "--params", "7B", "--prefetch", "-3"], "--prefetch '-3'"),
        (["memory", "--params", "7B", "--model-impl", "keras"], "--model-impl 'keras'"),
        (["memory", "--params", "7B", "--optimizer-impl", "apex"], "--optimizer-impl 'apex'"),
        (["memory", "--params", "7B", "--grad-sync", "never"], "--grad-sync 'never'"),
        (["comm", "--params", "7B", "--gpus", "8", "--calibration", ""], "--calibration ''"),
        (
            ["comm", "--params", "7B", "--gpus", "8", "--calibration", "/no/such/calibration.json"],
            "cannot be read (No such file or directory); accepted: a file written by `zerocalc bench`",
        ),
        (
            ["plan", "--model", "gpt2", "--gpu", "rtx-4090", "--global-batch", "8seq", "--calibration", "/c"],
            "--calibration '/c' cannot be read (No such file or directory); accepted:",
        ),
        (
            ["memory", "--model", "/no/such/config.json", "--gpus", "8"],
            "cannot be read (No such file or directory); accepted: a preset name or a readable config.json",
        ),
        (["check", "/no/such/folder"], "does not exist"),
        (["comm", "--params", "7B", "--gpus", "8", "--calibration", "\x00"], "cannot be read (embedded null"),
        (["memory", "--model", "a\x00.json", "--gpus", "8"], "cannot be read (embedded null byte); accepted"),
        (["bench", "--out", "\x00"], "--out '\\x00' contains a NUL byte; accepted: a file path"),
        (["presets", "show", "nonsense"], "is not a model, GPU or scenario preset"),
    ],
)
def test_refused_in_one_line(args: list[str], fragment: str) -> None:
    _one_line_exit_2(args, fragment)


def test_a_run_smaller_than_a_node_records_its_real_gpus_per_node() -> None:
    result = runner.invoke(app, ["memory", "--params", "7B", "--gpus", "4", "-g", "16", "--json"])
    assert json.loads(result.stdout)["request"]["cluster"] == {"world_size": 4, "gpus_per_node": 4}


def test_deepspeed_counts_the_real_gpus_of_a_partial_node() -> None:
    """12 GPUs on nodes of 8: DeepSpeed's ZeRO-2 estimate 2Ψ + 18Ψ/12, not /16 (Llama-2-7B)."""
    args = ["memory", "--model", "llama-2-7b", "--gpus", "12", "-g", "8", "--framework", "deepspeed"]
    data = json.loads(runner.invoke(app, [*args, "-s", "zero2", "--json"]).stdout)
    assert data["peak"]["strategies"][0]["framework_estimate_bytes"] == 23_584_454_656


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("zerocalc ")


@pytest.mark.parametrize("target", ["a-file", "missing", ""])
def test_a_presets_variable_that_is_no_folder_is_one_line(tmp_path: Path, target: str) -> None:
    path = tmp_path / target if target else ""
    if target == "a-file":
        Path(path).write_text("x")
    _one_line_exit_2(["memory", "--model", "gpt2"], "ZEROCALC_PRESETS", env={"ZEROCALC_PRESETS": str(path)})


def test_odd_files_in_the_presets_folder(presets_copy: Path) -> None:
    (presets_copy / "models" / "folder.toml").mkdir()
    (presets_copy / "models" / "binary.toml").write_bytes(b"\xff\xfe\x00title")
    env = {"ZEROCALC_PRESETS": str(presets_copy)}
    listed = runner.invoke(app, ["presets", "list", "models"], env=env)
    assert listed.exit_code == 1 and "Traceback" not in listed.output
    assert "binary" in listed.stdout and "not UTF-8" in listed.stdout and "folder" not in listed.stdout
    assert "gpt2" in listed.stdout
    _one_line_exit_2(["memory", "--model", "binary"], "not UTF-8", env=env)


def test_check_update_with_a_broken_scenario_fails(presets_copy: Path) -> None:
    (presets_copy / "scenarios" / "broken.toml").write_text('description = "x"\nmodel = "nope"\n')
    result = runner.invoke(app, ["check", str(presets_copy), "--update"])
    assert result.exit_code == 1 and "broken" in result.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_check_update_into_a_read_only_folder_is_one_line(presets_copy: Path) -> None:
    expected = presets_copy / "expected"
    for file in expected.iterdir():
        file.chmod(0o444)
    expected.chmod(0o555)
    try:
        _one_line_exit_2(["check", str(presets_copy), "--update"], "cannot be written")
    finally:
        expected.chmod(0o755)


def test_check_update_refuses_to_rewrite_the_installed_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    from zerocalc.request import presets

    monkeypatch.setattr(presets, "installed_presets", lambda root: True)
    _one_line_exit_2(["check", "--update"], "would rewrite the presets installed with zerocalc")


def test_a_calibration_that_covers_nothing_says_so(tmp_path: Path, calibration_of) -> None:
    from zerocalc.network.calibration import save_calibration
    from zerocalc.network.collectives import Collective

    calibration = calibration_of(Collective.ALL_REDUCE)
    path = save_calibration(calibration, tmp_path / "cal.json")
    result = runner.invoke(
        app, ["comm", "--params", "7B", "--gpus", "16", "-s", "ddp", "--calibration", str(path), "--json"]
    )
    notes = json.loads(result.stdout)["notes"]
    assert any("covers none of these collectives" in note for note in notes)
