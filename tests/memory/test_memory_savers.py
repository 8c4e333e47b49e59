"""The memory savers of fine-tuning recipes by hand: torchtune's chunked cross-entropy and Liger's fused
linear cross-entropy (``--loss``) against the full-logits loss, the optimizer stepped in backward
(``--optimizer-in-backward``), each tensor's bytes counted for Llama-3-8B at b = 1, s = 2048 (T·V =
2048 · 128,256) or a small Llama; the command line's options, refusals and JSON."""

from __future__ import annotations

import json

import pytest
from helpers import steady_step
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.model.code import chunked_rows, liger_chunk_rows
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.ledger import Ledger
from zerocalc.request.training import parse_options

runner = CliRunner()

T, V, H = 2048, 128_256, 4096  # Llama-3-8B at b = 1, s = 2048
TV = T * V
LABELS = 8 * (T + 1)  # the labels padded with −100; b = 1: the shifted target is a view of them
SMALL = {
    "model_type": "llama", "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "pad_token_id": 0,
    "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False,
}  # fmt: skip


class _KindLedger(Ledger):
    """A ledger without rounding that keeps, at each event, the loss tensors alive and the transient."""

    def __init__(self) -> None:
        super().__init__(block=1)
        self.at: dict[str, tuple[int, int]] = {}

    def event(self, name: str, transient: int = 0, transient_kind: str = "transient") -> None:
        super().event(name, transient, transient_kind)
        self.at.setdefault(name, (self.by_kind.get(TensorKind.LOSS, 0), transient))


def _step(**kwargs: object) -> _KindLedger:
    return _ledger(**{"model": "llama-3-8b", "seq_len": 2048, "micro_batch": 1, **kwargs})


def _ledger(**kwargs: object) -> _KindLedger:
    """One FSDP2 step on one GPU of the request ``kwargs`` describe, replayed into a :class:`_KindLedger`."""
    request = parse_options(**{"framework": "fsdp2", "gpus": 1, **kwargs})
    return steady_step(request, _KindLedger())


def test_torchtunes_chunks_are_tensor_splits_and_liger_s_chunk_follows_v_over_h() -> None:
    """tensor_split(8) of 2048 positions: eight of 256; of 2050: two of 257, then 256. Liger:
    inc_factor = ⌈128,256/4096⌉ = 32, chunk = next power of 2 of ⌈2048/32⌉ = 64, so 32 chunks; its own
    example (BT = 16,384, V = 32,000, H = 4096) gives chunks of 2048."""
    assert chunked_rows(1, 2048, 8) == (256,) * 8
    assert chunked_rows(2, 2050, 8) == (514, 514) + (512,) * 6
    assert liger_chunk_rows(T, V, H) == (64,) * 32
    assert liger_chunk_rows(16_384, 32_000, 4096) == (2048,) * 8
    assert liger_chunk_rows(100, 32_000, 4096) == (16,) * 6 + (4,)


def test_the_full_logits_loss_holds_twelve_bytes_per_logit_at_its_backward() -> None:
    """transformers' ForCausalLMLoss: forward 2·TV bf16 logits + 4·TV fp32 copy + 4·TV log-softmax; backward
    the saved log-softmax, d(log_softmax) and d(logits) in fp32 (12·TV), with the loss and the seed."""
    led = _step()
    assert led.at["loss forward (nll_loss)"] == (10 * TV + LABELS + 3 * 4, 0)
    assert led.at["loss backward (log_softmax_backward)"][0] == 12 * TV + 2 * 4 == 3_152_019_464


def test_torchtunes_chunked_loss_keeps_every_chunks_logits_and_log_softmax_but_one_fp32_copy() -> None:
    """CEWithChunkedOutputLoss, 8 chunks of 256 tokens: at the last chunk's forward the bf16 logits of every
    chunk (2·TV), every chunk's saved log-softmax (4·TV) and total_weight, and one chunk's fp32 copy
    (4·TV/8): 6.5·TV, against the full loss's 12·TV at its backward. Backward, the last chunk first: the
    eight log-softmax outputs, the chunk's d(log_softmax) and fp32 d(logits) (5·TV); the logits were
    dropped before backward (the recipe's del outputs)."""
    led = _step(loss="chunked")
    rV = 256 * V
    forward = 2 * TV + 4 * TV + 8 * 4 + 4 * rV + LABELS + 4 + 4  # + the loss and the previous step's
    assert led.at["loss forward (output chunk7: log_softmax, nll_loss)"] == (forward, 0)
    assert forward == 6 * TV + TV // 2 + 16_432 == 1_707_360_304
    backward = 8 * 4 * rV + 7 * 4 + 2 * 4 * rV + LABELS + 4 + 4  # chunk 7's total_weight freed; + seed
    assert led.at["loss backward (output chunk7: log_softmax_backward)"] == (backward, 0)
    assert backward == 5 * TV + 16_428
    # then every chunk's gradient in bf16 (2·TV) before any output projection's backward runs
    assert led.at["lm_head backward (output chunk7)"][0] == 2 * TV + 4 + 4
    full = _step()
    saved = full.at["loss backward (log_softmax_backward)"][0] - forward
    assert saved == 12 * TV - 6 * TV - TV // 2 - 16_424 == 1_444_659_160  # 1.35 GiB less at the loss


def test_torchtunes_chunk_count_divides_the_fp32_copy() -> None:
    """--loss-chunks 4: a quarter of the fp32 copy at the last chunk's forward (4·TV/4)."""
    led = _step(loss="chunked", loss_chunks=4)
    assert (
        led.at["loss forward (output chunk3: log_softmax, nll_loss)"][0] == 6 * TV + TV + 4 * 4 + LABELS + 8
    )


def test_ligers_fused_linear_loss_keeps_one_chunk_of_logits_and_the_gradients_it_made() -> None:
    """fused_linear_cross_entropy_forward, chunks of 64 tokens: grad_input (bf16 [T, h]), grad_weight (bf16
    [V, h]: the head is trained), loss_1d (fp32 [T]), target_mask (bool [T]), one chunk's logits (bf16
    [64, V]); the moment's largest temporary is torch.mm(grad_logits.t(), x).float(): [V, h] in bf16 and in
    fp32 (6·V·h)."""
    led = _step(loss="fused-linear")
    kept = LABELS + 2 * T * H + 2 * V * H + 4 * T + T + 2 * 64 * V + 4  # + the previous step's loss
    assert led.at["loss forward (fused linear cross-entropy, a chunk)"] == (kept, 6 * V * H)
    assert kept == 1_083_893_772 and 6 * V * H == 3_152_019_456
    assert "loss forward (fused linear cross-entropy, the last chunk)" not in led.at  # 32 equal chunks
    # backward: the gradients it made are handed on, no logits ever
    assert led.at["loss backward (fused linear cross-entropy: the forward's gradients)"][0] == 4 + 4


def test_a_frozen_head_makes_no_weight_gradient_in_ligers_forward() -> None:
    """LoRA (the head frozen): no grad_weight and no [V, h] temporary, only grad_input (bf16 [T, h]) and
    one chunk's logits; the final norm's output held by the base model's output through the loss."""
    led = _step(loss="fused-linear", lora_rank=8, framework="fsdp2")
    kept = LABELS + 2 * T * H + 4 * T + T + 2 * 64 * V + 4
    assert led.at["loss forward (fused linear cross-entropy, a chunk)"] == (kept, 2 * 64 * H)


def _small(**kwargs: object) -> _KindLedger:
    return _ledger(**{"model": dict(SMALL), "seq_len": 64, **kwargs})


PSI = 2 * 1000 * 512 + 512 + 2 * (2 * 512 * 512 + 2 * 512 * 128 + 3 * 512 * 1024 + 2 * 512)


def test_the_optimizer_in_backward_frees_each_units_gradients_as_it_steps() -> None:
    """FSDP2 on one GPU, the small Llama (Ψ = 5,483,008): without, every fp32 gradient (4Ψ) is kept to the
    step, whose foreach sqrt is 4Ψ more; stepped in backward, each unit's are freed after its reduction,
    each parameter's step holding one fp32 temporary of its shard (a block's largest: 512 × 1024; the
    root's: the 1000 × 512 embedding or head)."""
    assert PSI == 5_483_008
    plain, early = _small(), _small(optimizer_in_backward=True)
    after = {
        id(led): next(e.allocated for e in led.events if e.name == "after backward") for led in (plain, early)
    }
    assert after[id(plain)] - after[id(early)] == 4 * PSI
    step = {id(led): max(e.allocated for e in led.events if e.phase == "optimizer") for led in (plain, early)}
    assert step[id(plain)] - after[id(plain)] == 4 * PSI and step[id(early)] == after[id(early)]
    assert early.at["optimizer step in backward (0)"][1] == 4 * 512 * 1024
    assert early.at["optimizer step in backward (root)"][1] == 4 * 1000 * 512
    assert not any(name.startswith("optimizer step in backward") for name in plain.at)


# ------------------------------------------------------------------------------------- the command line
def _memory(*args: str):
    return runner.invoke(app, ["memory", "--model", "llama-3-8b", "--framework", "fsdp2", *args])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--loss", "chunky"], "--loss 'chunky' is not accepted; accepted: full, chunked, fused-linear"),
        (["--loss-chunks", "4"], "--loss-chunks 4 with --loss full"),
        (
            ["--loss", "chunked", "--loss-chunks", "0"],
            "--loss-chunks '0' is not accepted; accepted: a whole number of chunks from 1",
        ),
        (["--loss", "fused-linear", "--model-impl", "torchtitan"], "accepted: --model-impl hf"),
        (["--loss", "chunked", "--tp", "2", "--gpus", "2"], "accepted: --tp 1, or --loss full"),
        (["--loss", "fused-linear", "--framework", "ddp"], "autocast keeps the LM head's weight in fp32"),
        (["--optimizer-in-backward", "--grad-accum", "2"], "accepted: --grad-accum 1"),
        (["--optimizer-in-backward", "--framework", "ddp"], "accepted: --framework fsdp2"),
        (["--optimizer-in-backward", "--framework", "deepspeed"], "accepted: --framework fsdp2"),
    ],
)
def test_the_savers_refusals_are_one_line(args: list[str], fragment: str) -> None:
    result = _memory(*args)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert fragment in result.stderr


def test_the_json_echoes_the_savers_only_where_set() -> None:
    plain = json.loads(_memory("--json").stdout)
    assert not {"loss", "loss_chunks", "optimizer_in_backward"} & set(plain["options"])
    result = _memory("--loss", "chunked", "--loss-chunks", "16", "--optimizer-in-backward", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["options"]["loss"] == "chunked" and data["options"]["loss_chunks"] == 16
    assert data["options"]["optimizer_in_backward"] is True
    events = [e["event"] for e in data["peak"]["strategies"][0]["timeline"]]
    assert "loss forward (output chunk15: log_softmax, nll_loss)" in events
    assert (
        "optimizer step (in backward)" in events
        and "optimizer step (foreach: sqrt of every exp_avg_sq)" not in events
    )


def test_the_savers_peaks_name_their_sources_in_the_table() -> None:
    result = runner.invoke(
        app,
        [
            "memory",
            "--model",
            "llama-3-8b",
            "--framework",
            "fsdp2",
            "--gpus",
            "1",
            "--lora-rank",
            "8",
            "--loss",
            "chunked",
            "--optimizer-in-backward",
        ],
    )
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert "CEWithChunkedOutputLoss" in result.stdout.replace("\n", " ")


def test_torchtitans_early_step_in_backward_is_the_flag(tmp_path) -> None:
    """torchtitan v0.2.2 ``optimizer.early_step_in_backward`` (``OptimizersInBackwardContainer``: one
    optimizer per parameter stepped in its post-accumulate-grad hook) gives ``--optimizer-in-backward``'s
    peak."""
    path = tmp_path / "job.toml"
    path.write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\n[optimizer]\nname = "AdamW"\n'
        "early_step_in_backward = true\n"
        '[training]\nlocal_batch_size = 1\nseq_len = 2048\n[activation_checkpoint]\nmode = "full"\n'
        "[parallelism]\ndata_parallel_shard_degree = 8\n"
    )
    argv = ["memory", "--model", "llama-3-8b", "--gpus", "8", "--json"]
    from_file = runner.invoke(app, [*argv, "--torchtitan", str(path)])
    assert from_file.exit_code == 0, from_file.output
    flags = [
        "--framework",
        "fsdp2",
        "--model-impl",
        "torchtitan",
        "--strategy",
        "zero3",
        "--micro-batch",
        "1",
    ]
    flags += ["--seq-len", "2048", "--recompute", "full", "--reduce-dtype", "fp32", "--optimizer", "adamw"]
    flags += ["--optimizer-impl", "fused", "--optimizer-in-backward"]
    from_flags = runner.invoke(app, [*argv, *flags])
    assert from_flags.exit_code == 0, from_flags.output
    file_data, flag_data = json.loads(from_file.stdout), json.loads(from_flags.stdout)
    assert file_data["options"]["optimizer_in_backward"] is True
    assert file_data["peak"] == flag_data["peak"]


# ------------------------------------------------------------------- activation offloading (torchtune)
HIDDEN = 2 * 64 * 512  # a layer input of the small Llama at s = 64, bf16


class _InputsLedger(Ledger):
    """A ledger without rounding that keeps, at each event, the layer inputs alive (the checkpoints')."""

    def __init__(self) -> None:
        super().__init__(block=1)
        self.inputs: dict[str, list[str]] = {}

    def event(self, name: str, transient: int = 0, transient_kind: str = "transient") -> None:
        super().event(name, transient, transient_kind)
        alive = sorted(n for n in self.live if n.startswith(("hidden ", "embedding output")))
        self.inputs.setdefault(name, alive)


def _eight_layers(offload: bool) -> _InputsLedger:
    request = parse_options(
        model={**SMALL, "num_hidden_layers": 8}, seq_len=64, framework="fsdp2", gpus=1, recompute="full",
        offload_activations=offload,
    )  # fmt: skip
    return steady_step(request, _InputsLedger())


def test_offloading_keeps_the_last_five_checkpoint_inputs_in_forward_and_two_in_backward() -> None:
    """OffloadActivations (max_fwd_stash_size 5): the input ids (512 B < 1024: not offloaded) take id 1,
    layer i's checkpoint input id i + 2; at layer 7's pack those of ids ≤ 4 leave the GPU, so layers 3 to 7
    and the embedding output, which transformers' inputs_embeds holds to the base model's return. The
    final norm's packs (x.float() twice, rsqrt twice under 1024 B, normalized) free the rest: none after
    forward, 8 × 65,536 B fewer. Backward: layer 6's recompute brings its input back while layer 7's
    waits for that node's hook; each on the copy stream."""
    plain, off = _eight_layers(False), _eight_layers(True)
    forward = "layer 7 forward (checkpointed)"
    assert off.inputs[forward] == [
        "embedding output",
        "hidden 3",
        "hidden 4",
        "hidden 5",
        "hidden 6",
        "hidden 7",
    ]
    assert len(plain.inputs[forward]) == 8
    after = {
        id(led): next(e.allocated for e in led.events if e.name == "after forward") for led in (plain, off)
    }
    assert off.inputs["after forward"] == [] and after[id(plain)] - after[id(off)] == 8 * HIDDEN
    assert off.inputs["layer 7 recompute"] == ["hidden 7"]
    assert off.inputs["layer 6 recompute"] == ["hidden 6", "hidden 7"]
    assert off.inputs["layer 6 backward"] == ["hidden 6"]
    assert off.inputs["embedding backward"] == ["embedding output"]
    recompute = {
        id(led): next(e.allocated for e in led.events if e.name == "layer 6 recompute")
        for led in (plain, off)
    }
    assert recompute[id(plain)] - recompute[id(off)] == 5 * HIDDEN  # 0 to 6 against 6 and 7
    streams = {a.name: a.stream for a in off.log if getattr(a, "stream", None) == "offload"}
    assert set(streams) == {f"hidden {i}" for i in range(1, 8)} | {"embedding output"}


def test_offloaded_host_bytes_are_one_copy_per_pack_of_at_least_1024_bytes() -> None:
    """Llama-3-8B, b 1, s 2048 (T·h = 8,388,608): 32 checkpoint inputs in bf16 (2·T·h each), the final
    norm's x.float() twice (4·T·h) and normalized (2·T·h), rsqrt twice (4·T), the input ids (8·T)."""
    T, h = 2048, 4096
    result = _memory("--gpus", "8", "--recompute", "full", "--offload-activations", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = 32 * 2 * T * h + 2 * 4 * T * h + 2 * T * h + 2 * 4 * T + 8 * T
    assert data["peak"]["offloaded_activations_host_bytes"] == expected == 620_789_760
    assert data["options"]["offload_activations"] is True
    plain = json.loads(_memory("--gpus", "8", "--recompute", "full", "--json").stdout)
    assert "offload_activations" not in plain["options"]
    assert "offloaded_activations_host_bytes" not in plain["peak"]
    saved = (
        plain["peak"]["strategies"][0]["after_forward_bytes"]
        - data["peak"]["strategies"][0]["after_forward_bytes"]
    )
    assert saved == 32 * 2 * T * h


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["--recompute", "none"],
            "torchtune refuses it without activation checkpointing; accepted: --recompute full",
        ),
        (["--framework", "ddp"], "accepted: --framework fsdp2"),
        (["--framework", "deepspeed"], "accepted: --framework fsdp2"),
        (["--model-impl", "torchtitan"], "accepted: --model-impl hf"),
        (["--checkpoint-every", "2"], "accepted: --checkpoint-every 1"),
        (["--pp", "2", "--gpus", "2"], "accepted: --pp 1"),
    ],
)
def test_offloading_refusals_are_one_line(args: list[str], fragment: str) -> None:
    base = (
        ["--offload-activations", "--recompute", "full"]
        if "--recompute" not in args
        else ["--offload-activations"]
    )
    result = _memory(*base, *args)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert fragment in result.stderr
