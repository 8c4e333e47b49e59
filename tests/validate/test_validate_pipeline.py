"""`zerocalc validate pipeline` (and `pipeline --fake`) and `validate expert` without processes: the
predictions against hand calculations, the 1F1B order against torch 2.13's ``Schedule1F1B`` read by hand,
every refusal before any rank starts, and the report and exit codes with the spawned ranks faked."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.harness import procs
from zerocalc.parallel.optimizers import OptimizerName
from zerocalc.parallel.precision import PrecisionName
from zerocalc.validate import expert, pipeline, run
from zerocalc.validate.config import RecordedCall
from zerocalc.validate.pipeline import (
    FakePipelineCase,
    P2PCall,
    PipelineJob,
    StageMeasured,
    compare_pipeline,
    kept_outputs_bytes,
    one_f_one_b_calls,
    predicted_p2p,
    predicted_p2p_bytes,
    predicted_reduction,
    predicted_stage_states,
)

runner = CliRunner()
LLAMA = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 96,
         "vocab_size": 1001}  # fmt: skip
"""A Llama shrunk: one block is 64 + 4,096 + 2,048 + 2,048 + 4,096 + 64 + 3 × 6,144 = 30,848 elements (norm,
q, k and v at 2 kv heads of 16, o, norm, gate/up/down); the embedding and the head 1,001 × 64 = 64,064."""


def llama(**changes: int):
    return pipeline.pipeline_architecture("llama-3-8b", {**LLAMA, **changes}, 2)


def job(
    strategy: str = "none", precision: str = "fp32", pp: int = 2, m: int = 4, **changes: int
) -> PipelineJob:
    return PipelineJob(
        arch=llama(**changes), pp=pp, strategy=strategy, precision=PrecisionName(precision),
        optimizer=OptimizerName.ADAM, backend="gloo", timeout_s=60, microbatches=m,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ the schedule
def test_two_stages_send_and_receive_in_the_order_schedule1f1b_issues_them() -> None:
    """Read from ``Schedule1F1B._step_microbatches``: stage 0 has min(4, 2) = 2 warm-up forwards, fires
    the first output at once and holds the second to go out with the first gradient's receive; stage 1
    sends each gradient with the next input's receive."""
    assert one_f_one_b_calls(0, 2, 4) == [
        ("send", 1, 0, "forward"), ("send", 1, 1, "forward"), ("recv", 1, 0, "backward"),
        ("send", 1, 2, "forward"), ("recv", 1, 1, "backward"), ("send", 1, 3, "forward"),
        ("recv", 1, 2, "backward"), ("recv", 1, 3, "backward"),
    ]  # fmt: skip
    assert one_f_one_b_calls(1, 2, 4) == [
        ("recv", 0, 0, "forward"), ("send", 0, 0, "backward"), ("recv", 0, 1, "forward"),
        ("send", 0, 1, "backward"), ("recv", 0, 2, "forward"), ("send", 0, 2, "backward"),
        ("recv", 0, 3, "forward"), ("send", 0, 3, "backward"),
    ]  # fmt: skip


def test_a_middle_stage_receives_and_sends_both_ways() -> None:
    """Stage 1 of 4, m = 4: three warm-up forwards, the third's send fused with gradient 0's receive."""
    f, b = "forward", "backward"
    assert one_f_one_b_calls(1, 4, 4) == [
        ("recv", 0, 0, f), ("send", 2, 0, f), ("recv", 0, 1, f), ("send", 2, 1, f), ("recv", 0, 2, f),
        ("send", 2, 2, f), ("recv", 2, 0, b), ("send", 0, 0, b), ("recv", 0, 3, f), ("send", 2, 3, f),
        ("recv", 2, 1, b), ("send", 0, 1, b), ("recv", 2, 2, b), ("send", 0, 2, b), ("recv", 2, 3, b),
        ("send", 0, 3, b),
    ]  # fmt: skip


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_every_micro_batch_crosses_every_boundary_once_each_way(pp: int, extra: int) -> None:
    m = pp + extra
    for stage in range(pp):
        calls = one_f_one_b_calls(stage, pp, m)
        kinds = {(op, phase) for op, _, _, phase in calls}
        expected = set()
        if stage > 0:
            expected |= {("recv", "forward"), ("send", "backward")}
        if stage < pp - 1:
            expected |= {("send", "forward"), ("recv", "backward")}
        assert kinds == expected
        for kind in kinds:
            assert sorted(mb for op, _, mb, phase in calls if (op, phase) == kind) == list(range(m))
        # a gradient is received only after its forward went out
        for mb in range(m):
            if stage < pp - 1:
                assert calls.index(("send", stage + 1, mb, "forward")) < calls.index(
                    ("recv", stage + 1, mb, "backward")
                )


def test_one_message_is_a_micro_batchs_hidden_states() -> None:
    arch = llama()
    assert predicted_p2p_bytes(arch, 2, 16, DType.FP32) == 2 * 16 * 64 * 4 == 8_192
    assert pipeline.activation_dtype("fsdp2", PrecisionName.BF16_MIXED) is DType.BF16
    assert pipeline.activation_dtype("ddp", PrecisionName.BF16_MIXED) is DType.FP32  # autocast's residual
    # world 4 = pp 2 × dp 2: rank 1 (stage 0, dp 1) talks to rank 3 (stage 1, dp 1)
    calls = predicted_p2p(arch, 2, 2, 1, 4, 2, 16, DType.BF16)
    assert {c.peer for c in calls} == {3} and {c.bytes for c in calls} == {4_096} and len(calls) == 8


# ------------------------------------------------------------------------------------------ the states
def test_stage_states_are_the_stages_tensors() -> None:
    arch = llama()
    first = predicted_stage_states(arch, 2, 0, "none", 1, 0, PrecisionName.FP32, OptimizerName.ADAM)
    last = predicted_stage_states(arch, 2, 1, "ddp", 2, 1, PrecisionName.FP32, OptimizerName.ADAM)
    assert first.params.bytes == (64_064 + 30_848) * 4 == 379_648  # embedding + block 0
    assert last.params.bytes == (30_848 + 64 + 64_064) * 4 == 379_904  # block 1 + final norm + head
    assert first.optimizer_states.bytes == 2 * first.params.bytes
    assert (first.step.bytes, last.step.bytes) == (10 * 4, 11 * 4)  # 1 + 9 tensors, 9 + 2
    # FSDP2 over 2 ranks: the embedding's 1,001 rows split 501 / 500, the block's dims are even
    ranks = [
        predicted_stage_states(arch, 2, 0, "fsdp2", 2, r, PrecisionName.FP32, OptimizerName.ADAM).params.bytes
        for r in (0, 1)
    ]
    assert ranks == [(501 * 64 + 15_424) * 4, (500 * 64 + 15_424) * 4] == [189_952, 189_696]


def test_the_gradient_reduction_is_the_stages_once_per_step() -> None:
    assert predicted_reduction(job("ddp"), 2, 0) == ("all_reduce", [64_064 + 30_848])
    # FSDP2: the block, then the root (final norm 64 + the head's 1,001 rows padded to 1,002)
    assert predicted_reduction(job("fsdp2"), 2, 1) == ("reduce_scatter", [30_848, 64 + 1_002 * 64])
    assert predicted_reduction(job("none"), 2, 1) == ("none", [])


def test_the_last_stage_keeps_every_micro_batchs_output() -> None:
    case = FakePipelineCase(world=8, pp=2, stage=1, microbatches=4, micro_batch=2, seq_len=16,
                            precision=PrecisionName.FP32, reshard=True)  # fmt: skip
    logits = 2 * 16 * 1_001 * 4  # 128,128 B, 251 blocks of 512
    assert kept_outputs_bytes(llama(), case) == 4 * 251 * 512 == 514_048 > 4 * logits
    bf16 = case.model_copy(update={"precision": PrecisionName.BF16_MIXED})
    assert kept_outputs_bytes(llama(), bf16) == 4 * 126 * 512  # 64,064 B in 126 blocks


def test_a_stage_keeps_a_receive_buffer_per_micro_batch_and_direction() -> None:
    """b × s × h = 2 × 16 × 64 fp32 = 8,192 B per buffer; the token batch m × b × s int64; the last stage's
    previous logits m × 2 × 16 × 1,001 fp32 (251 blocks of 512 B each)."""
    arch = llama()

    def case(stage: int, pp: int = 3, m: int = 5, precision: str = "fp32") -> FakePipelineCase:
        return FakePipelineCase(world=2 * pp, pp=pp, stage=stage, microbatches=m, micro_batch=2, seq_len=16,
                                precision=PrecisionName(precision), reshard=True)  # fmt: skip

    tokens = 3 * 512  # 5 × 2 × 16 × 8 = 1,280 B
    assert pipeline.pipeline_buffers(arch, case(0)) == 5 * 8_192 + tokens
    assert pipeline.pipeline_buffers(arch, case(1)) == 2 * 5 * 8_192
    assert pipeline.pipeline_buffers(arch, case(2)) == 5 * 8_192 + tokens + 5 * 251 * 512
    assert pipeline.pipeline_buffers(arch, case(1, precision="bf16-mixed")) == 2 * 5 * 4_096


# ------------------------------------------------------------------------------------------ comparison
def perfect(j: PipelineJob, world: int) -> list[StageMeasured]:
    """What each rank would measure if the prediction were exact."""
    dp = world // j.pp
    figures = []
    for rank in range(world):
        stage, dp_rank = divmod(rank, dp)
        states = predicted_stage_states(
            j.arch, j.pp, stage, j.strategy, dp, dp_rank, j.precision, j.optimizer,
            j.first_stage_layers, j.last_stage_layers,
        )  # fmt: skip
        dtype = pipeline.activation_dtype(j.strategy, j.precision)
        calls = [
            c.model_copy(update={"micro_batch": None})
            for c in predicted_p2p(j.arch, j.pp, dp, rank, j.microbatches, j.batch, j.seq, dtype)
        ]
        op, sizes = predicted_reduction(j, dp, stage)
        group = [stage * dp + i for i in range(dp)]
        reductions = [
            RecordedCall(op=op, phase="backward", dtype="fp32", elements=n, group_ranks=group)
            for n in sizes
            if op != "none"
        ]
        figures.append(
            StageMeasured(
                rank=rank, stage=stage, params=states.params.bytes, grads=states.grads.bytes,
                optimizer=states.optimizer_states.bytes, step=states.step.bytes, p2p=calls,
                collectives=reductions,
            )
        )  # fmt: skip
    return figures


def test_a_call_out_of_order_is_a_mismatch_named_by_its_position() -> None:
    j = job("fsdp2")
    figures = perfect(j, 4)
    assert compare_pipeline(j, 4, figures, 1.0).status == "match"
    calls = figures[0].p2p
    figures[0] = figures[0].model_copy(update={"p2p": [calls[0], calls[2], calls[1], *calls[3:]]})
    result = compare_pipeline(j, 4, figures, 1.0)
    assert result.status == "mismatch"
    assert result.stages[0].p2p_difference == (
        "call 2: predicted send forward 2,048 fp32 (micro-batch 1) with rank 2, measured recv backward "
        "2,048 fp32 with rank 2"
    )
    assert all(s.p2p_in_order for s in result.stages[1:])


def test_a_reduction_per_micro_batch_or_a_byte_more_is_a_mismatch() -> None:
    j = job("ddp")
    figures = perfect(j, 4)
    twice = figures[2].collectives * 2
    figures[2] = figures[2].model_copy(update={"collectives": twice})
    assert [s.reduction_ok for s in compare_pipeline(j, 4, figures, 1.0).stages] == [True, True, False, True]
    figures = perfect(j, 4)
    figures[3] = figures[3].model_copy(update={"optimizer": figures[3].optimizer + 4})
    result = compare_pipeline(j, 4, figures, 1.0)
    assert result.status == "mismatch"
    assert [line.ok for line in result.stages[3].lines] == [True, True, False, True]


# ------------------------------------------------------------------------------------------ experts
def test_balanced_routing_sends_a_kth_of_the_tokens_to_each_rank() -> None:
    j = expert.ExpertJob(ep=4, routing="balanced", tokens=128, backend="gloo", timeout_s=60)
    assert j.experts == 8
    for rank in range(4):
        assert expert.tokens_per_expert(j, rank) == [32] * 8  # 128 tokens × 2 choices over 8 experts
        assert expert.send_rows(j, rank) == expert.recv_rows(j, rank) == [64] * 4
        counts, dispatch, combine, combine_back, dispatch_back = expert.predicted_calls(j, rank)
        assert counts.splits == (2, 2, 2, 2) and counts.dtype == "int64"
        assert dispatch.splits == combine.splits == (64 * 64,) * 4
        out = dispatch.bytes_to_others(rank)
        assert out == 3 * 64 * 64 * 4 == expert.predicted_dispatch_bytes(128, 2, 64, DType.FP32, 4) == 49_152
        assert combine.bytes_to_others(rank) == combine_back.bytes_to_others(rank) == out
        assert dispatch_back.phase == "backward"


def test_skewed_routing_sends_every_token_to_the_first_rank() -> None:
    j = expert.ExpertJob(ep=2, routing="skewed", tokens=32, backend="gloo", timeout_s=60)
    assert expert.send_rows(j, 0) == expert.send_rows(j, 1) == [64, 0]
    assert expert.recv_rows(j, 0) == [64, 64] and expert.recv_rows(j, 1) == [0, 0]
    _, dispatch, combine, _, _ = expert.predicted_calls(j, 1)
    assert dispatch.bytes_to_others(1) == 64 * 64 * 4 and combine.bytes_to_others(1) == 0
    _, dispatch, combine, _, _ = expert.predicted_calls(j, 0)
    assert dispatch.bytes_to_others(0) == 0 and combine.bytes_to_others(0) == 64 * 64 * 4
    assert expert.predicted_calls(j, 3)[1].group_ranks == (2, 3)  # world 4, ep 2: ranks 2, 3


# ------------------------------------------------------------------------------------------ the CLI
@pytest.fixture()
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CPU node of 2 cores, not under torchrun; every spawned rank "measures" the prediction (rank 0's
    optimizer line one element more when the job's strategy is ddp). Returns the jobs' titles."""
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(run, "visible_gpus", lambda: 0)
    monkeypatch.setattr(procs, "usable_cpus", lambda: 2)
    titles: list[str] = []

    def spawn_series(
        module: str, payloads: list[str], nproc: int, timeout_s: float,
        collect: Callable[[str], object], on_done: Callable[[int, object, float], None],
    ) -> None:  # fmt: skip
        for index, payload in enumerate(payloads):
            if module == "zerocalc.validate.pipeline_worker":
                j = PipelineJob.model_validate_json(payload)
                figures = perfect(j, nproc)
                if j.strategy == "ddp":
                    figures[0] = figures[0].model_copy(update={"optimizer": figures[0].optimizer + 4})
                text = json.dumps([f.model_dump() for f in figures])
            else:
                assert module == "zerocalc.validate.expert_worker"
                e = expert.ExpertJob.model_validate_json(payload)
                text = json.dumps(
                    [
                        expert.ExpertMeasured(
                            rank=r, params=expert.expert_param_bytes(e), calls=expert.predicted_calls(e, r),
                            other_collectives=0,
                        ).model_dump()
                        for r in range(nproc)
                    ]
                )  # fmt: skip
                j = e  # type: ignore[assignment]
            titles.append(j.title)
            on_done(index, collect(text), 0.5)

    monkeypatch.setattr(procs, "spawn_series", spawn_series)
    return titles


def test_a_pipeline_run_is_reported_per_rank_and_a_wrong_line_fails(spawned: list[str]) -> None:
    args = ["validate", "pipeline", "--nproc", "4", "--strategies", "fsdp2,ddp", "--precision", "fp32"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 1, result.output
    assert spawned == ["pp 2 · fsdp2 · fp32 · m=4", "pp 2 · ddp · fp32 · m=4"]  # m = 2·p by default
    report = json.loads(result.stdout)
    assert (report["pp"], report["dp"], report["model"]) == (2, 2, report["architecture"]["name"])
    assert "untied head" in report["model"]  # the default GPT-2, its head untied
    assert [c["status"] for c in report["configs"]] == ["match", "mismatch"]
    result = runner.invoke(app, [*args, "-A", "6"], env={"COLUMNS": "80"})
    assert "pp 2 · ddp · fp32 · m=6" in result.stdout and "✗ OFF" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_a_pipeline_of_uneven_stages_is_predicted_per_stage(spawned: list[str]) -> None:
    # validate's default model (tests/validate/test_validate_pipeline_processes.py): a block 48,447
    # elements, the
    # embeddings 127,575, the final norm and head 63,189; 4 blocks over 3 stages as 1, 2, 1 (Megatron-LM
    # get_num_layers_to_build), fp32: 4 bytes each
    block, embeddings, head = 48_447, 127_575, 126 + 63_063
    args = ["validate", "pipeline", "--nproc", "3", "--pp", "3", "--layers", "4", "--pp-first-stage-layers",
            "1", "--pp-last-stage-layers", "1", "--strategies", "none", "--precision", "fp32"]  # fmt: skip
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert spawned == ["pp 3 · blocks 1, 2, 1 · none · fp32 · m=6"]
    report = json.loads(result.stdout)
    assert report["stage_blocks"] == [1, 2, 1]
    stages = report["configs"][0]["stages"]
    params = [next(x["predicted"] for x in stage["lines"] if x["line"] == "params") for stage in stages]
    assert params == [4 * (embeddings + block), 4 * 2 * block, 4 * (block + head)]
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and "3 stages of 1, 2, 1 blocks" in text.stdout


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--pp-first-stage-layers", "2", "--pp-last-stage-layers", "2"],
         "--pp-first-stage-layers 2 and --pp-last-stage-layers 2 with --pp 3: of the 4 blocks, 0 layers "
         "left for 1 middle stage"),
        (["--pp-first-stage-layers", "0"], "--pp-first-stage-layers 0 is not accepted"),
    ],
)  # fmt: skip
def test_an_uneven_split_validate_cannot_build_is_one_line(
    spawned: list[str], extra: list[str], fragment: str
) -> None:
    args = ["validate", "pipeline", "--nproc", "3", "--pp", "3", "--layers", "4", *extra]
    one_line_error(runner.invoke(app, args), fragment)
    assert spawned == []


def test_an_expert_parallel_run_matches_when_the_prediction_is_exact(spawned: list[str]) -> None:
    result = runner.invoke(app, ["validate", "expert", "--nproc", "4", "--ep", "2", "-s", "16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [c["routing"] for c in report["configs"]] == ["balanced", "skewed"]
    assert report["tokens_per_rank"] == 32 and report["experts"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pipeline", "--pp", "3"],
         "--pp 3 with --nproc 2 is not accepted; accepted: 2 or more stages dividing --nproc"),
        (["pipeline", "--pp", "1"], "--pp 1 with --nproc 2 is not accepted"),
        (["pipeline", "--pp", "two"], "--pp 'two' is not accepted; accepted: a whole number"),
        (["pipeline", "--model", "gpt2"], "gpt2 ties its LM head to the embedding"),
        (["pipeline", "-A", "1"],
         "--grad-accum 1 micro-batches with --pp 2 is not accepted; accepted: at least 2"),
        (["pipeline", "-A", "2000000"], "--grad-accum 2,000,000 is not accepted; accepted: 2 to 1,000,000"),
        (["pipeline", "--layers", "3"],
         "--pp 2 does not divide the 3 blocks; accepted: --layers a multiple of 2"),
        (["pipeline", "--strategies", "zero1"],
         "--strategies 'zero1' is not accepted; accepted: all, or none, ddp, fsdp2"),
        (["pipeline", "--pp-first-stage-layers", "x"],
         "--pp-first-stage-layers 'x' is not accepted; accepted: a whole number"),
        (["pipeline", "--ep", "2"], "No such option: --ep"),
        (["pipeline", "--grad-sync", "last"], "No such option: --grad-sync"),
        (["expert", "--ep", "3"],
         "--ep 3 with 2 ranks is not accepted; accepted: 2 or more expert-parallel ranks"),
        (["expert", "--routing", "uniform"],
         "--routing 'uniform' is not accepted; accepted: all, or balanced, skewed"),
        (["expert", "-b", "1024", "-s", "1024"], "accepted: b ≥ 1, s ≥ 1 and b·s ≤ 65,536 tokens"),
        (["expert", "--strategies", "ddp"], "No such option: --strategies"),
        (["pipeline", "--fake", "--world", "3"], "--world '3' with --pp 2 is not accepted"),
        (["pipeline", "--fake", "--reshard", "all"], "--reshard 'all' is not accepted; accepted: yes, no"),
        (["pipeline", "--fake", "-s", "1"], "accepted: b ≥ 1 and s ≥ 2"),
        (["pipeline", "--fake", "--nproc", "2"], "--nproc is not read with --fake"),
        (["activations", "--pp", "2"], "No such option: --pp"),
        (["fake", "--ep", "2"], "No such option: --ep"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2_before_any_rank_starts(
    args: list[str], message: str, spawned: list[str]
) -> None:
    one_line_error(runner.invoke(app, ["validate", *args]), message)
    assert spawned == []


def test_the_pipeline_records_are_what_the_worker_sends() -> None:
    """The pure side parses what the torch side writes (the JSON a rank hands back)."""
    call = P2PCall(op="send", peer=1, phase="forward", dtype="bf16", elements=10)
    assert call.bytes == 20 and call.key() == ("send", 1, "forward", "bf16", 10)
    assert P2PCall(op="recv", peer=0, phase="forward", dtype="float64", elements=3).bytes == 0  # not modelled
