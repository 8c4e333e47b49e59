"""Published Megatron-LM pipeline runs: each one's logged peak allocation against zerocalc's prediction for
the pipeline stage that logged it.

The runs are NVIDIA's functional tests of Megatron-LM (repository NVIDIA/Megatron-LM at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553, ``tests/functional_tests/test_cases/gpt/<case>/``): each case's
``model_config.yaml`` holds the whole launch (model, parallelism, batch, precision), and its
``golden_values_dev_dgx_h100.json`` the values its run on a DGX H100 logged per iteration, among them
``mem-max-allocated-bytes``: ``torch.cuda.memory_stats()["allocated_bytes.all.peak"]``
(``megatron/training/training.py`` ``training_log``), never reset, so from the second iteration on the
peak of a step with the optimizer states in place. Only the last rank logs it: the tensorboard writer
exists where ``args.rank == args.world_size - 1`` (``megatron/training/global_vars.py``
``_set_tensorboard_writer``), and with Megatron-LM's rank order ``tp-cp-ep-dp-pp``
(``core/parallel_state.py``) that rank is on the last pipeline stage. Every case runs on one node of
8 GPUs (``tests/test_utils/recipes/h100/gpt.yaml``: ``nodes: 1``, ``gpus: 8``), so dp = 8 / (t·p) and the
micro-batches of a step m = global batch / (micro-batch · dp).

Common to every case: ``--bf16`` (bf16 parameters, fp32 gradient buffer: ``arguments.py`` sets
``accumulate_allreduce_grads_in_fp32`` under bf16), Adam, no activation recomputation, Megatron-LM's
``deallocate_output_tensor``. ``--use-distributed-optimizer`` is zerocalc's ``zero1`` under
``--framework megatron``, its absence ``ddp``. The model files are ``tests/data/megatron-ci/``.

The bound is issue 30's: each prediction within 7% of the logged peak.
"""

from __future__ import annotations

from helpers import DATA

from zerocalc.api import estimate_comm, estimate_peak
from zerocalc.peak.report import StagePeak

MEGATRON = DATA / "megatron-ci"
BOUND = 0.07
SOURCE = (
    "https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/"
    "tests/functional_tests/test_cases/gpt/"
)


def last_stage(model: str, gpus: int, pp: int, **options: object) -> StagePeak:
    """zerocalc's prediction for the last pipeline stage of a Megatron-LM run on an H100."""
    report = estimate_peak(
        str(MEGATRON / model), gpus, pp=pp, framework="megatron", model_impl="megatron", gpu="h100-80gb",
        **options,
    )  # fmt: skip
    (row,) = report.peak.strategies  # type: ignore[union-attr]
    stage = row.stages[-1]
    assert stage.stage == pp - 1 and stage.holds_head
    return stage


def assert_within_bound(predicted: int, logged: int) -> None:
    error = (predicted - logged) / logged
    assert abs(error) < BOUND, f"predicted {predicted:,} B, logged {logged:,} B: {error:+.2%}"


def test_gpt3_7b_tp1_pp4_vpp8_distributed_optimizer() -> None:
    """gpt3_7b_tp1_pp4_memory_speed, the suite's memory test (SOURCE + ``gpt3_7b_tp1_pp4_memory_speed/``).

    32 layers, h 4096, 32 heads, 8 query groups, vocabulary 131,073 (padded 131,200), untied, s 8192;
    t 1, p 4, ``--num-layers-per-virtual-pipeline-stage 1`` (v = 32 / (4·1) = 8), dp 2, micro-batch 1,
    global batch 8 (m = 4), ``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
    ``--overlap-param-gather``, Transformer Engine layers with its default fused attention.
    Logged on DGX H100, iterations 2–25: mem-max-allocated-bytes 60,720,852,992 (iteration 1,
    before Adam's moments exist: 52,931,256,320).
    """
    stage = last_stage(
        "gpt3-7b.toml", 8, pp=4, vpp=8, grad_accum=4, micro_batch=1, seq_len=8192, strategies="zero1",
        flash_attention=True,
    )  # fmt: skip
    assert_within_bound(stage.allocated_peak_bytes, 60_720_852_992)


def test_gpt3_small_tp1_pp4_vpp3() -> None:
    """gpt3_mcore_te_tp1_pp4_vp1 (SOURCE + ``gpt3_mcore_te_tp1_pp4_vp1/``).

    12 layers, h 512, 8 heads, GPT-2 vocabulary (padded 50,304), tied, s 1024; t 1, p 4,
    ``--num-layers-per-virtual-pipeline-stage 1`` (v = 3), dp 2, micro-batch 4, global batch 32 (m = 4),
    no distributed optimizer, Transformer Engine layers with ``--attention-backend unfused``.
    Logged on DGX H100, iterations 2–50: mem-max-allocated-bytes 4,161,191,424.
    """
    stage = last_stage(
        "gpt3-small.toml", 8, pp=4, vpp=3, grad_accum=4, micro_batch=4, seq_len=1024, strategies="ddp",
        flash_attention=False,
    )  # fmt: skip
    assert_within_bound(stage.allocated_peak_bytes, 4_161_191_424)


def test_gpt3_small_tp1_pp4_vpp3_distributed_optimizer() -> None:
    """gpt3_mcore_te_tp1_pp4_vp1_dist_optimizer_overlap_grad_reduce_param_gather_overlap_optimizer
    (SOURCE + that folder).

    The model and mesh of gpt3_mcore_te_tp1_pp4_vp1 (t 1, p 4, v 3, dp 2, micro-batch 4, m = 4,
    unfused attention) with ``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
    ``--overlap-param-gather``, ``--overlap-param-gather-with-optimizer-step``.
    Logged on DGX H100, iterations 2–50: mem-max-allocated-bytes 3,942,493,696.
    """
    stage = last_stage(
        "gpt3-small.toml", 8, pp=4, vpp=3, grad_accum=4, micro_batch=4, seq_len=1024, strategies="zero1",
        flash_attention=False,
    )  # fmt: skip
    assert_within_bound(stage.allocated_peak_bytes, 3_942_493_696)


def test_gpt3_small_tp1_pp4_local_layers() -> None:
    """gpt3_mcore_tp1_pp4 (SOURCE + ``gpt3_mcore_tp1_pp4/``).

    The 12-layer model, t 1, p 4 (1F1B), dp 2, micro-batch 4, global batch 32 (m = 4), no distributed
    optimizer, ``--transformer-impl local`` (Megatron-LM's own attention: the softmax and dropout of
    b·a·s² kept), ``--apply-query-key-layer-scaling``.
    Logged on DGX H100, iterations 2–50: mem-max-allocated-bytes 2,746,575,872.
    """
    stage = last_stage(
        "gpt3-small.toml", 8, pp=4, grad_accum=4, micro_batch=4, seq_len=1024, strategies="ddp",
        flash_attention=False,
    )  # fmt: skip
    assert_within_bound(stage.allocated_peak_bytes, 2_746_575_872)


def test_gpt3_small_tp1_pp2_local_layers() -> None:
    """gpt3_mcore_tp1_pp2 (SOURCE + ``gpt3_mcore_tp1_pp2/``).

    The model and options of gpt3_mcore_tp1_pp4 with p 2: dp 4, so m = 32 / (4·4) = 2.
    Logged on DGX H100, iterations 2–50: mem-max-allocated-bytes 3,633,177,600.
    """
    stage = last_stage(
        "gpt3-small.toml", 8, pp=2, grad_accum=2, micro_batch=4, seq_len=1024, strategies="ddp",
        flash_attention=False,
    )  # fmt: skip
    assert_within_bound(stage.allocated_peak_bytes, 3_633_177_600)


def test_gpt3_small_tp2_pp2_fused_attention() -> None:
    """gpt3_mcore_te_tp2_pp2_resume_torch_dist, its first run (SOURCE +
    ``gpt3_mcore_te_tp2_pp2_resume_torch_dist/``).

    The 12-layer model (vocabulary padded to 50,432 at t 2), t 2 without sequence parallelism, p 2, dp 2,
    micro-batch 4, global batch 32 (m = 4), no distributed optimizer, Transformer Engine layers with their
    default fused attention. The run saves at iteration 50 and resumes; before the save it logged on DGX
    H100, iterations 2–50: mem-max-allocated-bytes 1,427,384,832.
    """
    stage = last_stage(
        "gpt3-small.toml", 8, pp=2, tp=2, grad_accum=4, micro_batch=4, seq_len=1024, strategies="ddp",
        flash_attention=True,
    )  # fmt: skip
    assert_within_bound(stage.allocated_peak_bytes, 1_427_384_832)


def test_vocab_parallel_cross_entropy_turns_its_softmax_into_the_gradient() -> None:
    """The loss's tensors behind these matches (Megatron-LM ``core/tensor_parallel/cross_entropy.py``):
    the forward keeps the LM head's bf16 logits (2·T·V) and their fp32 copy (4·T·V), which
    ``calculate_predicted_logits`` and ``calculate_cross_entropy_loss`` turn into the softmax in place and
    ``save_for_backward`` keeps; the backward's ``calculate_gradients`` turns that softmax into the
    gradient in place, and ``.float()``'s backward adds the bf16 gradient (2·T·V). So the backward's
    loss peak is the forward's: the bf16 logits freed, the bf16 gradient allocated, nothing in fp32.
    T·V = 4·1024 × 50,304 on one GPU; each tensor rounded to the allocator's 2 MiB for large blocks;
    512 B: the previous step's loss, freed in between."""
    report = estimate_peak(
        str(MEGATRON / "gpt3-small.toml"), 1, framework="megatron", model_impl="megatron", strategies="ddp",
        micro_batch=4, seq_len=1024, gpu="h100-80gb",
    )  # fmt: skip
    (row,) = report.peak.strategies  # type: ignore[union-attr]
    at = {event.event: event.allocated_bytes for event in row.timeline}
    bf16_logits = -(-2 * 4 * 1024 * 50_304 // 2**21) * 2**21
    forward = at["loss forward (nll_loss)"]
    in_place = at["loss backward (vocab-parallel cross-entropy, in place)"]
    assert abs(forward - bf16_logits - in_place) <= 512  # the bf16 logits gone, no new fp32 tensor
    assert abs(at["logits.float() backward"] - in_place - bf16_logits) <= 512  # + the bf16 gradient
    assert max(e.allocated_bytes for e in row.timeline if e.phase.value == "backward") <= forward


def test_gpt3_7b_tp1_pp4_vpp8_iteration_time() -> None:
    """The memory test's logged ``iteration-time`` (``golden_values_dev_dgx_h100.json`` at NVIDIA/Megatron-LM
    commit 070712a0bf439eb310ca4f2c16d9446f1ddc5b8f, iterations 4–24: 1.056–1.092 s, median 1.0606 s)
    against ``comm``'s step for that launch on the ``h100-80gb`` table (a DGX H100's part), with Transformer
    Engine's fused attention (``--transformer-impl transformer_engine``: ``--flash-attention``) and the
    launch's ``--overlap-grad-reduce --overlap-param-gather``: 0.868 s, 18% under (0.881 s without them:
    their 13 ms of data-parallel collectives, exposed, become 0.6 ms). The launch is a test configuration
    the step model has none of: ``--deterministic-mode`` (deterministic attention backward),
    ``CUDA_DEVICE_MAX_CONNECTIONS=1``, ``--no-gradient-accumulation-fusion``, LayerNorm SM margins of 16.
    Bound: 20% (issue 31 asks 15% of tuned runs)."""
    row = estimate_comm(
        None, 8, model=str(MEGATRON / "gpt3-7b.toml"), gpu="h100-80gb", framework="megatron",
        strategies="zero1",
        pp=4, vpp=8, grad_accum=4, micro_batch=1, seq_len=8192, flash_attention=True,
        overlap_grad_reduce=True, overlap_param_gather=True,
    ).row("zero1")  # fmt: skip
    assert row.step is not None
    logged = 1.0606
    error = (row.step.step_s - logged) / logged
    assert -0.20 < error < 0, f"predicted {row.step.step_s:.3f} s, logged {logged} s: {error:+.1%}"
