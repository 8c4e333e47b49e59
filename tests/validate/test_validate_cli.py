"""`zerocalc validate frameworks` and `validate tp` without processes: every refusal before any rank starts,
and the report, progress and exit codes with the spawned ranks faked (their figures are the predictions;
the hooks make them differ); the subcommands' options (each takes only its own) and the old spelling's
refusal."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.harness import procs
from zerocalc.validate import run
from zerocalc.validate.config import PERTURB_ENV, Job

runner = CliRunner()


@pytest.fixture()
def worlds() -> list[int]:
    """How many configurations each faked spawned world was given, one entry per world."""
    return []


@pytest.fixture()
def spawned(monkeypatch: pytest.MonkeyPatch, perfect: Callable, worlds: list[int]) -> list[tuple[str, int]]:
    """A CPU node of 2 cores, not under torchrun; each configuration of a spawned world "measures" exactly
    the prediction (the ddp configuration fails, and the ones after it go on in a fresh world). Returns
    (strategy · precision, nproc) per configuration run."""
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(run, "visible_gpus", lambda: 0)
    monkeypatch.setattr(procs, "usable_cpus", lambda: 2)
    calls: list[tuple[str, int]] = []

    def spawn_series(
        module: str,
        payloads: list[str],
        nproc: int,
        timeout_s: float,
        collect: Callable[[str], object],
        on_done: Callable[[int, object, float], None],
    ) -> None:
        assert module == "zerocalc.validate.worker"
        worlds.append(len(payloads))
        for index, payload in enumerate(payloads):
            job = Job.model_validate_json(payload)
            calls.append((f"{job.strategy} · {job.precision}", nproc))
            if job.strategy == "ddp":
                on_done(
                    index, procs.RanksFailed("rank 1 exited with code 1; the other ranks were stopped"), 0.5
                )
                if index + 1 < len(payloads):
                    worlds.append(len(payloads) - index - 1)
                continue
            figures = [m.model_dump() for m in perfect(job, nproc)]
            on_done(index, collect(json.dumps(figures)), 0.5)

    monkeypatch.setattr(procs, "spawn_series", spawn_series)
    return calls


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frameworks", "--strategies", "zero2"],
         "--strategies 'zero2' is not accepted; accepted: all, or ddp, zero1"),
        (["frameworks", "--precision", "fp16-mixed"], "--precision 'fp16-mixed' is not accepted"),
        (["frameworks", "--optimizer", "sgd"], "--optimizer 'sgd' is not accepted"),
        (["frameworks", "--nproc", "1"], "--nproc 1 is not accepted; accepted: 2 or more processes"),
        (["frameworks", "--nproc", "two"], "--nproc 'two' is not accepted; accepted: a whole number"),
        (
            ["frameworks", "--nproc", "1000000000"],
            "--nproc 1000000000 is more processes than this node can run (4 per CPU core, 2 usable); "
            "accepted: 2 to 8",
        ),
        (["frameworks", "--timeout", "1e400"],
         "--timeout inf is not accepted; accepted: seconds > 0 and at most 86400"),
        (["frameworks", "--timeout", "nan"], "--timeout nan is not accepted"),
        (["frameworks", "--timeout", "0"], "--timeout 0 is not accepted"),
        (["frameworks", "--timeout", "86401"], "--timeout 86401 is not accepted"),
        (["frameworks", "--timeout", "soon"], "--timeout 'soon' is not accepted; accepted: seconds > 0"),
        (["frameworks", "--hidden", "64"], "--hidden 64 is not a multiple of --heads 3"),
        (["frameworks", "--heads", "3", "--kv-heads", "2"],
         "3 heads are not a multiple of 2 key/value heads"),
        (["frameworks", "--layers", "0"], "--layers 0 is not accepted; accepted: a whole number ≥ 1"),
        (["frameworks", "--layers", "2.5"], "--layers '2.5' is not accepted; accepted: a whole number"),
        (["frameworks", "--grad-sync", "sometimes"],
         "--grad-sync 'sometimes' is not accepted; accepted: every, last"),
        (["frameworks", "--grad-accum", "0"],
         "--grad-accum 0 is not accepted; accepted: 1 to 1,000,000 micro-batches"),
        (["frameworks", "--gpus-per-node", "3"], "--gpus-per-node 3 does not divide the 2 ranks"),
        (
            ["frameworks", "--strategies", "fsdp2-hsdp"],
            "fsdp2-hsdp shards inside a node and replicates across nodes: 2 ranks of 2 per node are one node",
        ),
        (
            ["frameworks", "--model", "mixtral-8x7b", "--layers", "1", "--hidden", "64", "--vocab", "101"],
            "mixture-of-experts",
        ),
        (["frameworks", "--model", "llama-2-7b"],
         "llama-2-7b has 6,738,415,616 parameters, too many to train on CPU"),
        (["frameworks", "--lora-rank", "8", "--strategies", "fsdp2,zero1"],
         "--strategies zero1 with --lora-rank is not accepted (its fine-tuning states are not modelled rank "
         "by rank); accepted: ddp, fsdp1-no-shard, fsdp1-shard-grad-op, fsdp1-full-shard, "
         "fsdp1-hybrid-shard, fsdp2-no-reshard, fsdp2, fsdp2-hsdp"),
        (["frameworks", "--lora-rank", "8", "--model", "gpt2"],
         "--lora-rank with gpt2 (gpt2) is not accepted: validate's model mirrors transformers' modules of "
         "llama, mistral, qwen2 only"),
        (["frameworks", "--lora-targets", "q_proj"],
         "--lora-targets describes LoRA, which is off without a rank"),
        (["frameworks", "--lora-rank", "8", "--lora-targets", "nothing"],
         "--lora-targets ['nothing'] match no module PEFT 0.21 can adapt in this llama"),
        (["frameworks", "--quantize", "nf4"], "No such option: --quantize"),
        (["tp", "--tp", "0"], "--tp 0 is not accepted; accepted: 2 to 1,048,576 tensor-parallel ranks"),
        (["tp", "--tp", "1"], "(zerocalc validate frameworks runs without TP)"),
        (["tp", "--tp", "2,4"], "--tp '2,4' is not accepted; accepted: a whole number"),
        (["tp", "--nproc", "4", "--tp", "3"], "--tp 3 does not divide the 4 ranks; accepted: a divisor ≥ 2"),
        (
            ["tp", "--nproc", "4", "--strategies", "fsdp2,zero1"],
            "--strategies 'fsdp2,zero1' is not accepted; accepted: all, or fsdp2-no-reshard, fsdp2",
        ),
        (["tp", "--nproc", "4", "--kv-heads", "1"], "--kv-heads 1 is not a multiple of --tp 2"),
        (["tp", "--nproc", "4", "--ffn", "175"], "--ffn 175 is not a multiple of --tp 2"),
        (
            ["tp", "--nproc", "4", "--model", "gpt2", "--layers", "1", "--vocab", "101"],
            "gpt2 (--layers 1, --vocab 101) has an LM head tied to the embedding, learned position",
        ),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2_before_any_rank_starts(
    args: list[str], message: str, spawned: list[tuple[str, int]]
) -> None:
    one_line_error(runner.invoke(app, ["validate", *args]), message)
    assert spawned == []


def test_lora_runs_the_strategies_that_model_it_on_shrunk_llama(spawned: list[tuple[str, int]]) -> None:
    """all under --lora-rank: DDP, FSDP1 and FSDP2 (ZeRO-1 left out; the hybrid ones need two nodes), each
    job carrying the LoRA and the model Llama shrunk (GPT-2's fused c_attn is not validate's model); every
    rank's frozen line is compared (the faked ranks measure the prediction; ddp's world fails by the
    fixture's design)."""
    result = runner.invoke(app, ["validate", "frameworks", "--nproc", "2", "--lora-rank", "8", "--json"])
    assert result.exit_code == 1, result.output  # the faked ddp configurations fail
    configs = [c for c, _ in spawned]
    assert configs == [
        f"{s} · {p}"
        for s in (
            "ddp",
            "fsdp1-no-shard",
            "fsdp1-shard-grad-op",
            "fsdp1-full-shard",
            "fsdp2-no-reshard",
            "fsdp2",
        )
        for p in ("fp32", "bf16-mixed")
    ]
    report = json.loads(result.stdout)
    assert report["model"].startswith("llama-3-8b (")
    for config in report["configs"][2:]:
        assert config["status"] == "match"
        lines = [line["line"] for line in config["ranks"][0]["lines"]]
        assert lines == ["params", "grads", "optimizer", "step", "frozen", "unsharded_after_forward"]


@pytest.mark.usefixtures("torch_hidden")
@pytest.mark.parametrize("command", ["frameworks", "tp"])
def test_missing_torch_is_one_line_and_exit_2(spawned: list[tuple[str, int]], command: str) -> None:
    result = runner.invoke(app, ["validate", command, "--nproc", "2"])
    assert result.exit_code == 2
    assert result.stderr == (
        "zerocalc: error: zerocalc validate needs PyTorch; install it with: pip install 'zerocalc[bench]'\n"
    )


def test_the_configurations_share_one_world_and_piped_progress_is_one_line_each(
    spawned: list[tuple[str, int]], worlds: list[int]
) -> None:
    result = runner.invoke(
        app, ["validate", "frameworks", "--strategies", "zero1,fsdp2", "--nproc", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert spawned == [(f"{s} · {p}", 3) for s in ("zero1", "fsdp2") for p in ("fp32", "bf16-mixed")]
    assert worlds == [4]
    report = json.loads(result.stdout)
    assert report["world_size"] == 3 and report["all_match"] is True and report["backend"] == "gloo"
    assert [len(c["ranks"]) for c in report["configs"]] == [3, 3, 3, 3]
    lines = result.stderr.splitlines()
    assert [line.split(": ")[1] for line in lines] == [name for name, _ in spawned]
    assert lines[0].startswith("zerocalc validate: zero1 · fp32: match (") and lines[-1].endswith(
        ", 4/4 configurations"
    )


def test_a_dp_by_tp_mesh_runs_the_fsdp2_configurations_and_reports_the_mesh(
    spawned: list[tuple[str, int]],
) -> None:
    result = runner.invoke(
        app, ["validate", "tp", "--nproc", "4", "--tp", "2", "--no-loss-parallel", "--json"]
    )
    assert result.exit_code == 0, result.output
    strategies, precisions = ("fsdp2-no-reshard", "fsdp2"), ("fp32", "bf16-mixed")
    assert spawned == [(f"{s} · {p}", 4) for s in strategies for p in precisions]
    report = json.loads(result.stdout)
    assert report["tp_plan"] == {"dp": 2, "tp": 2, "sequence_parallel": True, "loss_parallel": False}
    assert report["model"].startswith("llama-3-8b (--layers 2, --hidden 66, --heads 6, --kv-heads 2")
    assert all(c["status"] == "match" and c["call_order_ok"] for c in report["configs"])
    groups = {c["group"] for config in report["configs"] for c in config["collectives"]}
    assert groups == {"dp", "tp"}
    text = runner.invoke(
        app, ["validate", "tp", "--nproc", "4", "--strategies", "fsdp2", "--precision", "fp32"],
        env={"COLUMNS": "80"},
    )  # fmt: skip
    assert text.exit_code == 0, text.output
    assert "mesh dp 2 × tp 2, sequence parallel, loss parallel; TP innermost" in text.stdout
    assert "every rank issued the predicted calls in the predicted order ✓" in text.stdout
    assert all(len(line) <= 80 for line in text.stdout.splitlines())


def test_hybrid_configurations_need_two_nodes_and_gradient_accumulation_runs_both_modes(
    spawned: list[tuple[str, int]],
) -> None:
    result = runner.invoke(
        app, ["validate", "frameworks", "--precision", "fp32", "--json"]
    )  # one node: no hybrid
    assert result.exit_code == 1, result.output  # the faked ddp world fails
    assert len(spawned) == 7 and not any("hsdp" in name or "hybrid" in name for name, _ in spawned)
    spawned.clear()
    args = [
        "validate",
        "frameworks",
        "--nproc",
        "4",
        "-g",
        "2",
        "--precision",
        "fp32",
        "-A",
        "2",
        "--grad-sync",
        "every,last",
    ]
    result = runner.invoke(app, [*args, "--strategies", "fsdp1-hybrid-shard,fsdp2-hsdp", "--json"])
    assert result.exit_code == 0, result.output
    assert [name for name, _ in spawned] == [
        f"{s} · fp32" for s in ("fsdp1-hybrid-shard", "fsdp2-hsdp") for _ in "el"
    ]
    report = json.loads(result.stdout)
    assert [(c["grad_accum"], c["grad_sync"]) for c in report["configs"]] == [(2, "every"), (2, "last")] * 2
    across = [next(x for x in c["collectives"] if x["group"] == "across_nodes") for c in report["configs"]]
    assert [(x["op"], x["group_size"], x["predicted_calls"]) for x in across] == [
        ("all_reduce", 2, 6),
        ("all_reduce", 2, 3),
    ] * 2
    assert "fsdp2-hsdp · fp32 · A=2 last: match" in result.stderr


def test_a_wrong_prediction_is_a_marked_mismatch_with_exit_1(
    spawned: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PERTURB_ENV, "grads")
    result = runner.invoke(
        app, ["validate", "frameworks", "--strategies", "fsdp1-no-shard", "--precision", "fp32"]
    )
    assert result.exit_code == 1, result.output
    assert result.stdout.count("✗ OFF") == 2  # the grads line of each rank
    assert "0 configurations match, 1 mismatch, 0 failed: NOT all match" in result.stdout
    assert result.stderr.startswith("zerocalc validate: fsdp1-no-shard · fp32: mismatch (")


def test_a_failed_configuration_is_reported_and_the_others_still_run(
    spawned: list[tuple[str, int]], worlds: list[int]
) -> None:
    result = runner.invoke(
        app, ["validate", "frameworks", "--strategies", "ddp,fsdp2", "--precision", "fp32"]
    )
    assert result.exit_code == 1, result.output
    assert len(spawned) == 2 and worlds == [2, 1]  # fsdp2 in a fresh world
    assert "✗ ddp · fp32: failed: rank 1 exited with code 1; the other ranks were stopped" in result.stdout
    assert "1 configuration match, 0 mismatch, 1 failed" in result.stdout


def test_ctrl_c_is_one_line_and_exit_130(
    spawned: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(procs, "spawn_series", interrupted)
    result = runner.invoke(app, ["validate", "frameworks"])
    assert (result.exit_code, result.stderr) == (
        130,
        "zerocalc: interrupted; every spawned process was stopped\n",
    )


SUBCOMMANDS = ("frameworks", "tp", "activations", "cuda", "fake", "pipeline", "expert")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["frameworks", "--world", "8"], "--world"),
        (["frameworks", "--tp", "2"], "--tp"),
        (["frameworks", "-b", "4"], "-b"),
        (["tp", "--grad-accum", "2"], "--grad-accum"),
        (["tp", "-g", "2"], "-g"),
        (["activations", "--nproc", "3"], "--nproc"),
        (["activations", "--snapshot-out", "x.pickle"], "--snapshot-out"),
        (["cuda", "--family", "llama"], "--family"),
        (["cuda", "--precision", "fp32"], "--precision"),
        (["fake", "--nproc", "4"], "--nproc"),
        (["fake", "--pp", "2"], "--pp"),
        (["pipeline", "--ep", "2"], "--ep"),
        (["pipeline", "--grad-sync", "last"], "--grad-sync"),
        (["expert", "--strategies", "ddp"], "--strategies"),
        (["expert", "--fake"], "--fake"),
    ],
)  # fmt: skip
def test_each_subcommand_refuses_an_option_of_another_in_one_line(args: list[str], option: str) -> None:
    line = one_line_error(runner.invoke(app, ["validate", *args]), f"No such option: {option}")
    assert line.endswith(f"(see `zerocalc validate {args[0]} --help`)")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["pipeline", "--fake", "--nproc", "2"],
         "--nproc is not read with --fake; accepted with --fake: --model, --layers"),
        (["pipeline", "--fake", "--strategies", "ddp"], "--strategies is not read with --fake"),
        (["pipeline", "--world", "8"],
         "--world is read only with --fake; accepted: --fake --world, or no --world"),
        (["pipeline", "-b", "4"], "--micro-batch is read only with --fake"),
    ],
)  # fmt: skip
def test_the_pipeline_s_fake_run_and_its_real_run_each_refuse_the_other_s_options(
    args: list[str], line: str
) -> None:
    one_line_error(runner.invoke(app, ["validate", *args]), line)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["--nproc", "2", "--strategies", "fsdp2"],
         "zerocalc validate frameworks --nproc 2 --strategies fsdp2"),
        (["--json"], "zerocalc validate frameworks --json"),
        (["--nproc", "4", "--tp", "2"], "zerocalc validate tp --nproc 4 --tp 2"),
        (["--fake", "--world", "8"], "zerocalc validate fake --world 8"),
        (["--fake", "--tp", "2,8", "--world", "8"], "zerocalc validate fake --tp 2,8 --world 8"),
        (["--fake", "--pp", "2", "--world", "8"], "zerocalc validate pipeline --fake --pp 2 --world 8"),
        (["--activations", "--family", "llama"], "zerocalc validate activations --family llama"),
        (["--device", "cpu"], "zerocalc validate activations"),
        (["--device", "cuda", "--model", "c.json"], "zerocalc validate cuda --model c.json"),
        (["--nproc", "4", "--pp", "2"], "zerocalc validate pipeline --nproc 4 --pp 2"),
        (["--nproc", "4", "--ep", "2"], "zerocalc validate expert --nproc 4 --ep 2"),
    ],
)  # fmt: skip
def test_the_old_single_command_s_spelling_is_refused_naming_the_new_one(old: list[str], new: str) -> None:
    line = one_line_error(runner.invoke(app, ["validate", *old]))
    assert line.startswith(f"zerocalc: error: zerocalc validate takes a subcommand first; accepted: {new} (")
    assert "subcommands: " + ", ".join(SUBCOMMANDS) in line


def test_bare_validate_prints_its_subcommands_and_exits_2() -> None:
    """As bare ``zerocalc`` and ``zerocalc presets`` do: the group's help, exit code 2."""
    result = runner.invoke(app, ["validate"], env={"COLUMNS": "80"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Usage: zerocalc validate [OPTIONS] COMMAND [ARGS]..." in result.output
    assert all(f"│ {name} " in result.output for name in SUBCOMMANDS)
    help_text = runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "80"})
    assert help_text.exit_code == 0 and all(f"│ {name} " in help_text.stdout for name in SUBCOMMANDS)
    one_line_error(runner.invoke(app, ["validate", "frame"]), "No such command 'frame'")


@pytest.mark.parametrize(
    ("path", "line"),
    [("", "--snapshot-out '' names no file"), ("/", "--snapshot-out '/' names no file")],
)
def test_cuda_refuses_a_snapshot_path_that_names_no_file(path: str, line: str) -> None:
    one_line_error(
        runner.invoke(app, ["validate", "cuda", "--model", "c.json", "--snapshot-out", path]), line
    )
