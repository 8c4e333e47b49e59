"""Defects a new user hit (issue 32), one parametrised test each: every case fails on the code before its
fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m zerocalc ARGS`` in a process of its own (real standard streams), this checkout first."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "zerocalc", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), stderr
    return lines[0]


# ------------------------------------------------------------------ 1. COLUMNS=0 / 1…20: a sane width
@pytest.mark.parametrize("columns", ["0", "1", "20", "59", "abc"])
@pytest.mark.parametrize(
    "args",
    [
        ["memory", "--params", "7B", "--gpus", "8", "--gpu", "h100-80gb"],
        ["comm", "--params", "7B", "--gpus", "16"],
        ["presets", "list"],
    ],
)
def test_narrow_or_zero_columns_print_whole_tables(args: list[str], columns: str) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    assert result.stdout.strip(), "printed nothing"
    assert "…" not in result.stdout  # no number (nor header) cut
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_check_at_zero_columns_prints_its_verdict(tmp_path: Path) -> None:
    """``check`` under a CI job's COLUMNS=0: a table and the count line, never exit 0 having printed
    nothing (one scenario, copied, to keep it short)."""
    presets = ROOT / "presets"
    for folder in ("scenarios", "expected"):
        (tmp_path / folder).mkdir()
    name = "gpt2-xl-2x4090"
    for folder, suffix in (("scenarios", ".toml"), ("expected", ".json")):
        (tmp_path / folder / f"{name}{suffix}").write_bytes(
            (presets / folder / f"{name}{suffix}").read_bytes()
        )
    result = runner.invoke(app, ["check", str(tmp_path)], env={"COLUMNS": "0"})
    assert result.exit_code == 0, result.output
    assert name in result.stdout and "1 of 1 scenario match" in result.stdout


# -------------------------------------------------- 4. notes name flags (CLI) or keywords (library)
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


# --------------------------------------------------------------------- 5. output errors, encodings
MEMORY_7B = ["memory", "--params", "7B", "--gpus", "8"]


@pytest.mark.parametrize(
    "args", [MEMORY_7B, [*MEMORY_7B, "--json"], ["comm", "--params", "7B", "--gpus", "8"]]
)
def test_full_disk_is_one_line_and_exit_1(args: list[str]) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "zerocalc", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    assert result.returncode == 1
    assert "cannot write the output (No space left on device)" in _one_line(result.stderr)


@pytest.mark.parametrize(
    "args", [MEMORY_7B, ["memory", "--model", "gpt2"], ["comm", "--params", "7B", "-n", "8"]]
)
def test_closed_stdout_is_one_line_and_exit_1(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "zerocalc", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        pass_fds=(),
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 1
    assert "standard output is closed" in _one_line(result.stderr)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_json_in_a_narrow_encoding_is_escaped_not_a_traceback(encoding: str) -> None:
    result = _run([*MEMORY_7B, "--json"], PYTHONIOENCODING=encoding)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["assumptions"][0].startswith("Ψ = 7,000,000,000")  # the value itself, escaped as \u03a8


@pytest.mark.parametrize(
    ("args", "fallback"),
    [(MEMORY_7B, "Psi = 7,000,000,000"), (["comm", "--params", "7B", "-n", "8"], "alpha = 20.0 us")],
)
def test_tables_in_ascii_write_symbols_in_ascii(args: list[str], fallback: str) -> None:
    result = _run(args, PYTHONIOENCODING="ascii", COLUMNS="200")
    assert result.returncode == 0, result.stderr
    assert fallback in result.stdout and "Traceback" not in result.stderr


# ------------------------------------------------------- 2. tiny buckets with --params: bounded work
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--ddp-bucket", "0", "-s", "ddp", "--framework", "torch-zero1"], "--ddp-bucket from 280000B"),
        (["--framework", "deepspeed", "-s", "zero2", "--reduce-bucket", "1"], "--reduce-bucket from 70,000"),
        (["--gpus", "1048576", "--framework", "torch-zero1", "-s", "zero1"], "--gpus up to 100,000"),
    ],
)
def test_tiny_buckets_of_a_flat_model_are_refused_in_one_line(args: list[str], fragment: str) -> None:
    """7e9 elements cut into 1-element buckets (4-byte fp32 DDP buckets: 7e9 × 4 / 100,000 = 280,000 B)."""
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "8", *args])
    assert result.exit_code == 2, result.output
    assert fragment in _one_line(result.stderr)


@pytest.mark.parametrize(
    ("args", "buckets"),
    [
        # 7e9 fp32 elements in 280,000-byte (70,000-element) buckets: 100,000 of them
        (["--ddp-bucket", "280000B", "-s", "ddp", "--framework", "torch-zero1"], 100_000),
        (["--framework", "deepspeed", "-s", "zero2", "--reduce-bucket", "70000"], 100_000),
    ],
)
def test_the_smallest_accepted_bucket_runs(args: list[str], buckets: int) -> None:
    from zerocalc import estimate_comm

    keywords = {"ddp_bucket": "280000B"} if "--ddp-bucket" in args else {"reduce_bucket": "70000"}
    framework = args[args.index("--framework") + 1]
    strategy = args[args.index("-s") + 1]
    estimate = estimate_comm("7B", 8, framework=framework, strategies=strategy, **keywords)
    reduce = estimate.row(strategy).collectives[0]
    assert reduce.calls_per_step == buckets


# ------------------------------------------------------------- 3. absurd layer counts: one line
@pytest.mark.parametrize("layers", [513, 10_000, 2_147_483_647])
@pytest.mark.parametrize("key", ["num_hidden_layers", "n_layer"])
def test_absurd_layer_counts_are_refused_at_once(tmp_path: Path, layers: int, key: str) -> None:
    config = (
        {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_head": 12, "n_positions": 1024}
        if key == "n_layer"
        else {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "num_attention_heads": 32,
              "intermediate_size": 11008}
    )  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, key: layers}))
    result = runner.invoke(app, ["memory", "--model", str(path), "--gpus", "8"])
    assert result.exit_code == 2
    assert f"{key} {layers} is not accepted; accepted: a whole number of layers from 1 to 512" in _one_line(
        result.stderr
    )


def test_a_model_beyond_the_params_bound_is_refused(tmp_path: Path) -> None:
    big = {"model_type": "llama", "vocab_size": 2**31 - 1, "hidden_size": 2**31 - 1, "num_hidden_layers": 2,
           "num_attention_heads": 1, "intermediate_size": 1}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(big))
    result = runner.invoke(app, ["memory", "--model", str(path)])
    assert result.exit_code == 2
    assert "accepted: a model of at most 10,000,000,000,000,000" in _one_line(result.stderr)


# ---------------------------------------------- 7. bandwidths in a physical range, durations, headers
@pytest.mark.parametrize("rate", ["1e-30GB/s", "0.5MB/s", "7bit/s", "2000TB/s"])
@pytest.mark.parametrize("option", ["--intra-node-bw", "--inter-node-bw"])
def test_bandwidth_outside_the_physical_range_is_refused(option: str, rate: str) -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "16", option, rate])
    assert result.exit_code == 2
    assert "from 1 MB/s to 1 PB/s" in _one_line(result.stderr)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (54.46e-3, "54.46 ms"),
        (2.5, "2.500 s"),
        (90.0, "1.5 min"),
        (6.8 * 3600, "6.8 h"),
        (3 * 86_400, "3.0 d"),
        (2.45e31, "2.8e+26 d"),  # 2.45e31 s / 86,400 s per day
    ],
)
def test_durations_are_short(seconds: float, shown: str) -> None:
    from zerocalc.base.units import format_seconds

    assert format_seconds(seconds) == shown


def test_slowest_link_keeps_headers_and_times_whole_at_80_columns() -> None:
    """7B over 1 MB/s: an all_reduce of 2·7/8·14 GB = 24.5 GB (ring) takes 24,500 s = 6.8 h."""
    args = ["comm", "--params", "7B", "--gpus", "8", "--intra-node-bw", "1MB/s", "-s", "ddp"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["collective", "tensor", "group"] for line in lines if line.strip())
    assert any(line.startswith("AR bwd") and line.split()[-3:] == ["6.8", "h", "flag"] for line in lines)


# ------------------------------------------------------------------- 9. what people type, accepted
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--reduce-dtype", "bf16", "--precision", "fp32"], "accepted: fp32"),
        (["--reduce-dtype", "fp16", "--precision", "bf16-mixed"], "accepted: fp32, bf16"),
    ],
)
def test_accepted_dtypes_are_named_once(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, ["comm", "--params", "7B", "--gpus", "8", *args])
    assert result.exit_code == 2
    line = _one_line(result.stderr)
    assert line.endswith(fragment)


@pytest.mark.parametrize(("typed", "tokens"), [("8k", 8192), ("8K", 8192), ("128k", 131_072), ("1M", 2**20),
                                               ("1.5k", 1536), ("4096", 4096)])  # fmt: skip
def test_seq_len_takes_k_as_1024(typed: str, tokens: int) -> None:
    from zerocalc.request.training import parse_options

    assert parse_options(model="llama-3-8b", seq_len=typed).activations.seq_len == tokens


@pytest.mark.parametrize("typed", ["1.0001k", "0k", "100000k", "8kb"])
def test_seq_len_refuses_what_is_not_a_whole_token_count(typed: str) -> None:
    result = runner.invoke(app, ["memory", "--model", "gpt2", "--seq-len", typed])
    assert result.exit_code == 2
    assert f"--seq-len {typed!r} is not accepted; accepted: a whole number of tokens" in _one_line(
        result.stderr
    )


@pytest.mark.parametrize("latency", ["20µs", "20μs", "20us"])  # U+00B5, U+03BC, ASCII
def test_micro_sign_and_greek_mu_are_both_microseconds(latency: str) -> None:
    from zerocalc import estimate_comm

    assert estimate_comm("7B", 8, latency=latency).request.bandwidths.intra_node.latency_s == pytest.approx(
        20e-6
    )


LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
                "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "intermediate_size": 11008}  # fmt: skip
LLAMA_2_7B = 6_738_415_616  # Llama-2-7b's published count


@pytest.mark.parametrize("spelling", ["folder", "config-without-suffix", "stdin-dash", "stdin-path"])
def test_model_as_a_folder_a_plain_file_or_standard_input(tmp_path: Path, spelling: str) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (folder / "config").write_text(json.dumps(LLAMA_CONFIG))
    model, stdin = {
        "folder": (str(folder), None),
        "config-without-suffix": (str(folder / "config"), None),
        "stdin-dash": ("-", json.dumps(LLAMA_CONFIG)),
        "stdin-path": ("/dev/stdin", json.dumps(LLAMA_CONFIG)),
    }[spelling]
    result = subprocess.run(
        [sys.executable, "-m", "zerocalc", "memory", "--model", model, "--json"],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"]["parameter_count"]["total"] == LLAMA_2_7B
    assert data["model"]["title"].startswith("LlamaForCausalLM, ")  # not "cfg"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "-"], "reads config.json from standard input, which is empty"),
        (["--model", "EMPTY_FOLDER"], "is a folder without a readable config.json"),
        (["--params", "7B", "--reserve", "1GiB"], "--reserve '1GiB' changes nothing here"),
    ],
)
def test_options_that_would_be_ignored_are_refused(tmp_path: Path, args: list[str], fragment: str) -> None:
    args = [str(tmp_path) if a == "EMPTY_FOLDER" else a for a in args]
    result = runner.invoke(app, ["memory", *args], input="")
    assert result.exit_code == 2, result.output
    assert fragment in _one_line(result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["--params", "7B", "--reserve", "1GiB", "--gpu", "h100-80gb"],
        ["--model", "gpt2", "--reserve", "1GiB"],
    ],
)
def test_the_same_options_where_they_apply_are_accepted(args: list[str]) -> None:
    result = runner.invoke(app, ["memory", *args])
    assert result.exit_code == 0, result.output


# --------------------------------------------------------------------- 10. 80 columns, as read
@pytest.mark.parametrize("command", [[], ["memory"], ["comm"], ["presets"], ["presets", "list"], ["check"]])
def test_help_shows_no_type_for_flags(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "--help" in result.stdout


# ------------------------------------------------ 6. bench --out checked before the run, no new folders
@pytest.mark.parametrize(
    ("out", "fragment"),
    [
        ("/proc/version", "cannot be created in '/proc'"),
        ("/dev/null", "is not a regular file"),
        ("MISSING/dir/cal.json", "MISSING/dir' does not exist"),
    ],
)
def test_bench_out_is_checked_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, fragment: str
) -> None:
    import zerocalc.cli.bench as bench_cli

    started: list[object] = []
    monkeypatch.setattr(bench_cli, "_measure", lambda *args: started.append(args))
    out = out.replace("MISSING", str(tmp_path / "missing"))
    result = runner.invoke(app, ["bench", "--backend", "gloo", "--out", out])
    assert result.exit_code == 2, result.output
    assert fragment.replace("MISSING", str(tmp_path / "missing")) in _one_line(result.stderr)
    assert started == [] and not (tmp_path / "missing").exists()


def test_bench_default_out_folder_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache folder zerocalc chose is created (the user named none)."""
    from zerocalc.cli.bench import _check_out, default_out_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _check_out(default_out_folder() / "calibration.json", parents=True)  # accepted, nothing created yet
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------------- 11. library
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

    config = {**LLAMA_CONFIG, "_name_or_path": "meta-llama/Llama-2-7b-hf", "transformers_version": "5.17.0",
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


# ---------------------------------- 8. a calibration says where it applies, and where it extrapolates
def _gloo_all_gather_calibration(path: Path) -> Path:
    """A gloo sweep of all_gather over 2 ranks from 1 KiB to 1 MiB (×4), its fit at 1 GB/s."""
    from zerocalc.network.calibration import Calibration, CollectiveFit, Measurement, save_calibration
    from zerocalc.network.cluster import RankGroup
    from zerocalc.network.collectives import Collective

    sizes = [2**10 * 4**i for i in range(6)]  # 1 KiB … 1 MiB
    rows = [
        Measurement(collective=Collective.ALL_GATHER, group_kind=RankGroup.WORLD, group_size=2, size_bytes=s,
                    count=s // 2, dtype="bf16", time_s=1e-4 + s / 2e9, algbw_Bps=1.0, busbw_Bps=1.0)
        for s in sizes
    ]  # fmt: skip
    fit = CollectiveFit(collective=Collective.ALL_GATHER, group_kind=RankGroup.WORLD, group_size=2,
                        latency_s=1e-4, bus_bandwidth_Bps=1e9, peak_busbw_Bps=1e9,
                        points=len(sizes))  # fmt: skip
    calibration = Calibration(
        created_at="2026-11-26T00:00:00+00:00", backend="gloo", device_name="Test CPU",
        torch_version="2.13.0", world_size=2, nodes=1, gpus_per_node=2, dtype="bf16", measurements=rows,
        fits=[fit],
    )  # fmt: skip
    return save_calibration(calibration, path)


@pytest.mark.parametrize("strategy", ["zero3", "zero1"])
def test_a_calibration_beyond_its_sweep_says_so(tmp_path: Path, strategy: str) -> None:
    """7B at N = 2: zero3's all_gathers move Ψ bf16 = 14e9 B = 13.0 GiB each call, the sweep stopped at
    1 MiB; its reduce_scatter has no fit and runs at the stated NVLink default."""
    path = _gloo_all_gather_calibration(tmp_path / "cal.json")
    args = ["comm", "--params", "7B", "--gpus", "2", "-s", strategy, "--calibration", str(path)]
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert (
        f"calibration {path} measured all_gather over world groups of 2 from 1.0 KiB to 1.0 MiB per call; "
        "these calls move 13.0 GiB to 13.0 GiB: its fit is extrapolated"
    ) in out
    assert "was measured with gloo on Test CPU; the collectives it has no fit for use NCCL-class" in out
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[-1] for line in out.splitlines()
            if line.startswith(("AG ", "RS "))}  # fmt: skip
    assert set(rows.values()) == {"fit", "default"}


def test_a_calibration_within_its_sweep_adds_no_warning(tmp_path: Path) -> None:
    """Ψ = 500K at N = 2: each all_gather moves 500,000 bf16 = 1,000,000 B, inside the 1 KiB – 1 MiB sweep."""
    from zerocalc import estimate_comm

    path = _gloo_all_gather_calibration(tmp_path / "cal.json")
    estimate = estimate_comm("500K", 2, strategies="zero3", calibration=str(path))
    assert not any("extrapolated" in note for note in estimate.notes), estimate.notes


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (
            ["memory", "--params", "7B", "--gpus", "8", "--fp32-grad-accum"],
            ["b_p = 2,", "b_g = 2,", "K = 12"],
        ),
        (["memory", "--model", "llama-3-8b", "--gpus", "8"], ["Ψ = 8,030,261,248 (8.03B),", "s = 2048,"]),
        (["comm", "--model", "llama-3-8b", "--gpus", "8"], ["Ψ = 8,030,261,248 (8.03B),", "(g = 8),"]),
    ],
)
def test_headings_break_between_phrases_at_80_columns(args: list[str], phrases: list[str]) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for phrase in phrases:
        assert any(phrase in line for line in lines), phrase
    assert not any(line.rstrip().endswith("=") or line.startswith("= ") for line in lines)


def test_plan_rows_keep_their_title_whole_and_name_the_framework_once() -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "16", "--global-batch", "64seq",
            "--framework", "fsdp2", "--top", "3"]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    keys = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    firsts = [key for key in keys if key[:2] in ("1.", "2.", "3.")]
    assert [key[:15] for key in firsts] == [f"{n}. FSDP2 HSDP g" for n in "123"]
    assert all(key.endswith("×16") for key in firsts)  # the rank, title, nodes and GPUs on one line
    assert all(key.startswith("b") for key in keys[1:2])  # then b×A and the options
    assert "global batch 131,072 tokens (64 × 2,048)," in result.stdout


@pytest.mark.parametrize("name", ["llama-3-8b", "h100-80gb", "llama-3-8b-fsdp-no-sync-16xh100"])
def test_presets_show_prints_its_file_path_whole(name: str) -> None:
    result = runner.invoke(app, ["presets", "show", name], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.endswith(".toml") and "/presets/" in first


def test_check_keeps_scenario_names_whole_and_shows_progress(tmp_path: Path) -> None:
    """The longest shipped name at 80 columns; progress on stderr, one line per scenario when piped."""
    name = "llama-3-8b-fsdp-no-sync-16xh100"
    for folder, suffix in (("scenarios", ".toml"), ("expected", ".json")):
        (tmp_path / folder).mkdir()
        shipped = ROOT / "presets" / folder / f"{name}{suffix}"
        (tmp_path / folder / f"{name}{suffix}").write_bytes(shipped.read_bytes())
    result = runner.invoke(app, ["check", str(tmp_path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert any(f"│ {name} │ ok" in line for line in result.stdout.splitlines())
    assert result.stderr == f"zerocalc check: {name}: 1/1 scenarios\n"


def test_a_progress_bar_names_what_runs_now() -> None:
    import io

    from zerocalc.harness.procs import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = Progress("zerocalc validate", 2, Terminal())
    bar.running("ddp · fp32")
    bar.step("ddp · fp32", "match")
    bar.running("fsdp2 · fp32")  # the one now running, not the one finished
    assert bar._bar.tasks[0].description == "fsdp2 · fp32" and bar._bar.tasks[0].completed == 1
    bar.close()


def test_validate_collective_headers_are_distinct() -> None:
    from zerocalc.cli.validate import _collective_table
    from zerocalc.parallel.precision import PrecisionName
    from zerocalc.validate.compare import CollectiveResult, ConfigResult

    collective = CollectiveResult(op="all_reduce", phase="backward", dtype="fp32", group="world",
                                  group_size=2,
                                  predicted_calls=1, measured_calls=[1, 1], predicted_bytes=[8, 8],
                                  measured_bytes=[8, 8], ok=True, explanation="")  # fmt: skip
    config = ConfigResult(
        strategy="ddp", precision=PrecisionName.FP32, status="match", collectives=[collective]
    )
    headers = [str(column.header) for column in _collective_table(config).columns if str(column.header)]
    assert len(headers) == len(set(headers))
    assert "calls\nmeas." in headers and "bytes/rank\nmeas." in headers


def test_model_dash_at_a_terminal_is_refused_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from zerocalc.base.errors import InputError
    from zerocalc.request import presets

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    presets._load_hf_stdin.cache_clear()
    with pytest.raises(InputError, match=r"reads config\.json from standard input, which is a terminal"):
        presets.load_model("-")
