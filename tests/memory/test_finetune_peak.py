"""The peak of a fine-tuning step by hand: a unit's events written out (its shards at rest, its gathering,
the 4-bit weight dequantised in forward and backward, the gradients of the trained tensors only, their
reduction and the optimizer step), each tensor's bytes for a small QLoRA Llama, the step's start equal to
the states memory counts, and the command line printing the peak of LoRA and QLoRA runs."""

from __future__ import annotations

import json

import pytest
from helpers import steady_step
from typer.testing import CliRunner

from zerocalc.cli import app
from zerocalc.parallel.optimizers import OptimizerImpl
from zerocalc.parallel.precision import ParamKind
from zerocalc.parallel.strategies import STRATEGIES, StrategyName
from zerocalc.peak.finetune import FineTune, FtLayout, FtTensor, FtUnit, forward_transients, ft_units
from zerocalc.peak.ledger import Ledger
from zerocalc.request.training import parse_options
from zerocalc.states.memory import Location, bytes_at, strategy_states

runner = CliRunner()

SMALL = {
    "model_type": "llama", "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "pad_token_id": 0,
    "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False,
}  # fmt: skip


def _tensor(name: str, kind: ParamKind, **sizes: int) -> FtTensor:
    fields: dict[str, object] = dict.fromkeys(FtTensor._fields[3:], 0)
    fields["optimizer"] = ()
    fields.update(sizes)
    return FtTensor(name, kind, sizes.get("numel", 0), **{k: v for k, v in fields.items() if k != "numel"})


def test_a_qlora_units_step_event_by_event() -> None:
    """Two ranks, FSDP: block 0 holds a 4-bit weight (its packed shard 3,000 B and its 1,000 B QuantState
    at rest, 4,000 B gathered, 16,384 B dequantised) and an adapter (200 B shard, 200 B gathered, a 200 B
    gradient reduced as 2 × 100 B and kept as a 200 B shard, two 200 B states, a 200 B foreach
    temporary); the root a frozen tensor (5,000 B shard, 10,000 B gathered)."""
    quantised = _tensor("q", ParamKind.QUANTIZED, numel=8192, resident=4000, quant_state=1000,
                        gathered=4000, shard_copy=2000, dequantized=16384)  # fmt: skip
    adapter = _tensor("lora_A", ParamKind.ADAPTER, numel=100, resident=200, gathered=200, shard_copy=200,
                      grad=200, reduced=100, main_grad=200, optimizer=(200, 200), step_temp=200)  # fmt: skip
    frozen = _tensor("embed", ParamKind.FROZEN_BASE, numel=5000, resident=5000, gathered=10000)
    units = {"0": FtUnit("0", (quantised, adapter)), "root": FtUnit("root", (frozen,))}
    layout = FtLayout(gather=True, world=2, grad_world=2, optimizer_world=2, offload=False, keep_root=False,
                      replicated_buckets=False)  # fmt: skip
    mechanics = FineTune(units, layout, OptimizerImpl.FOREACH)
    led = Ledger(block=1)
    mechanics.resident(led)
    assert led.total == 4000 + 200 + 5000 + 400
    mechanics.pre_forward(led, "root")
    mechanics.pre_forward(led, 0)
    assert led.total == 9600 + 10000 + 4000 + 200  # gathered (the forward's dequantisation: the model's)
    mechanics.post_forward(led, 0)
    mechanics.post_forward(led, "root")
    assert led.total == 9600
    mechanics.pre_backward(led, "root")
    mechanics.pre_backward(led, 0)
    mechanics.param_grad(led, 0, "block#0", 8192)
    mechanics.param_grad(led, 0, "block#1", 100)  # the unit's gradients come once
    assert led.total == 9600 + 10000 + 4200 + 16384 + 200  # dequantised again; only the adapter's grad
    mechanics.post_backward(led, 0)
    mechanics.post_backward(led, "root")
    mechanics.optimizer_step(led, first_step=False)
    mechanics.zero_grad(led)
    events = {e.name: e.allocated for e in led.events}
    assert events["unshard 0"] == 9600 + 10000 + 4200
    # the reduce-scatter input (2 × 100 B) in place of the unsharded gradient (200 B), the unit gathered
    assert events["reduce 0"] == 9600 + 10000 + 4200 + 200
    # the sharded gradient (200 B) and one foreach temporary (200 B) over the resident state
    assert events["optimizer step (foreach: sqrt of every exp_avg_sq)"] == 9600 + 200 + 200
    assert led.total == 9600


def test_cpu_offload_keeps_only_the_quant_state_and_copies_each_shard_in() -> None:
    quantised = _tensor("q", ParamKind.QUANTIZED, numel=8192, resident=3000, quant_state=1000,
                        gathered=4000, shard_copy=2000, dequantized=16384)  # fmt: skip
    adapter = _tensor("lora_A", ParamKind.ADAPTER, numel=100, resident=200, gathered=200, shard_copy=200,
                      grad=200, reduced=100, main_grad=200, optimizer=(200, 200))  # fmt: skip
    layout = FtLayout(gather=True, world=2, grad_world=2, optimizer_world=2, offload=True, keep_root=False,
                      replicated_buckets=False)  # fmt: skip
    mechanics = FineTune({"0": FtUnit("0", (quantised, adapter))}, layout, OptimizerImpl.FOREACH)
    led = Ledger(block=1)
    mechanics.resident(led)
    assert led.total == 1000  # parameters, gradients and optimizer states on the host
    mechanics.pre_forward(led, 0)
    events = {e.name: e.allocated for e in led.events}
    assert events["unshard 0"] == 1000 + 2000 + 200 + 4000 + 200  # the shards copied in, gathered
    mechanics.post_forward(led, 0)
    mechanics.pre_backward(led, 0)
    mechanics.param_grad(led, 0, "block#0", 100)
    mechanics.post_backward(led, 0)
    mechanics.optimizer_step(led, first_step=False)
    assert led.total == 1000  # the gradient went to the host; the step ran there


def test_each_tensor_of_a_small_qlora_llama_by_hand() -> None:
    """NF4 with double quantisation of a 512 × 512 q_proj (262,144 weights, 4,096 blocks of 64): packed
    131,072 B (uint8), a uint8 absmax per block 4,096 B, 16 fp32 second-level absmax 64 B, the nested
    code 1,024 B, the offset 4 B, the code 64 B; dequantised: 262,144 bf16 weights and the 4,096 absmax
    rebuilt in fp32. Its LoRA r 8 adapter: lora_A 8 × 512 fp32."""
    request = parse_options(
        model=dict(SMALL), framework="ddp", lora_rank=8, quantize="nf4", double_quant=True
    )
    _, units = ft_units(request, StrategyName.DDP)
    q = next(t for t in units["0"].tensors if t.name.endswith("q_proj.weight"))
    assert q.kind is ParamKind.QUANTIZED
    assert q.resident == 131_072 + 4_096 + 64 + 1_024 + 4 + 64
    assert q.quant_state == 4_096 + 64 + 1_024 + 4 + 64
    assert q.dequantized == 262_144 * 2 + 4_096 * 4
    assert q.grad == 0 and q.optimizer == ()
    lora_a = next(t for t in units["0"].tensors if "q_proj.lora_A" in t.name)
    assert (lora_a.kind, lora_a.resident, lora_a.grad) == (ParamKind.ADAPTER, 8 * 512 * 4, 8 * 512 * 4)
    assert lora_a.optimizer == (8 * 512 * 4, 8 * 512 * 4)  # torch's AdamW: exp_avg, exp_avg_sq in fp32
    assert units["0"].backward_transient == 1024 * 512 * 2 + 1024 * 512 // 64 * 4  # the MLP's weights


@pytest.mark.parametrize(
    "options",
    [
        {"framework": "ddp", "quantize": "nf4", "double_quant": True, "optimizer": "adamw-8bit"},
        {"framework": "fsdp2", "gpus": 2, "quantize": "nf4", "quant_storage": "bf16"},
        {
            "framework": "fsdp2",
            "gpus": 2,
            "quantize": "nf4",
            "quant_storage": "bf16",
            "offload_params": "cpu",
        },
        {"framework": "fsdp", "gpus": 2},
        {"framework": "ddp", "optimizer": "paged-adamw-8bit"},
    ],
)
def test_the_steps_resident_tensors_and_its_gradients_are_the_states_memory_counts(options: dict) -> None:
    request = parse_options(model=dict(SMALL), lora_rank=8, **options)
    name = request.strategies[0]
    led = Ledger(block=1)
    layout, units = ft_units(request, name)
    FineTune(units, layout, request.optimizer_impl).resident(led)
    grads = 0 if layout.offload else sum(t.main_grad for u in units.values() for t in u.trained)
    assert led.total + grads == bytes_at(strategy_states(STRATEGIES[name], request), Location.GPU)


def test_memory_prints_the_peak_of_a_qlora_step_and_its_json_carries_it() -> None:
    args = ["memory", "--model", "llama-3-8b", "--lora-rank", "16", "--quantize", "nf4", "--gpu", "rtx-4090",
            "--framework", "ddp", "--gpus", "1", "--recompute", "full", "--seq-len", "2048"]  # fmt: skip
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.stdout
    assert "Peak of one training step" in shown.stdout
    assert "trained 6,815,744" in shown.stdout  # r 16 on q_proj, v_proj: 16 · 32 · (2·4096 + 4096 + 1024)
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    peak = data["peak"]["strategies"][0]
    assert peak["peak_bytes"] > peak["allocated_peak_bytes"] > 0
    # 6,979,321,856 decoder Linear weights: 0.5 B packed, an fp32 absmax per 64, 16 fp32 codes per module
    assert data["finetune"]["quantized_bytes"] == 6_979_321_856 // 2 + 6_979_321_856 // 64 * 4 + 224 * 64
    timeline = runner.invoke(app, [*args, "--timeline"])
    assert timeline.exit_code == 0 and "one training step" in timeline.stdout


def test_the_forward_dequantises_past_bitsandbytes_fused_kernel_limit_and_the_backward_always() -> None:
    """bitsandbytes 0.50 gemm_4bit: more than 1,536 tokens, dequantise and F.linear; fewer, the fused
    kernel; MatMul4Bit.backward dequantises in every case."""
    mlp = 1024 * 512 * 2  # the largest 4-bit weight of a block (gate, up, down: 1024 × 512), in bf16
    for seq, dequantizes in ((2048, True), (1536, False)):
        request = parse_options(model=dict(SMALL), framework="ddp", lora_rank=8, quantize="nf4", seq_len=seq)
        assert forward_transients(request) == ((mlp, mlp) if dequantizes else (0, 0))
        layout, units = ft_units(request, StrategyName.DDP)
        mechanics = FineTune(units, layout, request.optimizer_impl)
        led = Ledger(block=1)
        mechanics.pre_backward(led, 0)
        assert led.total == units["0"].backward_transient == mlp


def test_the_optimizer_step_in_backward_frees_each_gradient_as_its_unit_reduces() -> None:
    """torchtune's optimizer_in_bwd (a post-accumulate-grad hook steps each parameter): after the unit's
    reduction no sharded gradient is kept, its step's temporary is alive for a moment, and the optimizer
    phase allocates nothing."""
    adapter = _tensor("lora_A", ParamKind.ADAPTER, numel=100, resident=200, gathered=200, grad=200,
                      reduced=100, main_grad=200, optimizer=(200, 200), step_temp=200)  # fmt: skip
    layout = FtLayout(gather=True, world=2, grad_world=2, optimizer_world=2, offload=False, keep_root=False,
                      replicated_buckets=False)  # fmt: skip
    mechanics = FineTune({"0": FtUnit("0", (adapter,))}, layout, OptimizerImpl.FOREACH, in_backward=True)
    led = Ledger(block=1)
    mechanics.resident(led)
    mechanics.pre_backward(led, 0)
    mechanics.param_grad(led, 0, "block#0", 100)
    mechanics.post_backward(led, 0)
    mechanics.optimizer_step(led, first_step=False)
    events = {e.name: e.allocated for e in led.events}
    # the shard and the states, the unit still gathered (200 B), the step's temporary (200 B)
    assert events["optimizer step in backward (0)"] == 600 + 200 + 200
    assert events["optimizer step (in backward)"] == led.total == 600


def test_a_model_code_without_fine_tuning_saves_is_refused_in_one_line() -> None:
    result = runner.invoke(app, ["memory", "--model", "llama-3-8b", "--lora-rank", "8", "--model-impl",
                                 "torchtitan"])  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "zerocalc: error: the peak of a fine-tuning step: --model-impl torchtitan: the saved tensors of a "
        "fine-tuning forward are written out for transformers' code; accepted: --model-impl hf"
    ]


def test_a_qlora_forward_keeps_what_each_layer_of_the_fine_tuning_model_saves_by_hand() -> None:
    """The small Llama in 4-bit with LoRA r 8 on q_proj and v_proj, prepare_model_for_kbit_training (the
    residual stream in fp32), b 1 × s 64, no recompute: after forward the step holds, above its start,

    - layer 0 (its input requires no grad: the embedding is frozen): q_proj's fp32 LoRA input 4·64·512,
      two lora_A outputs 4·64·8, q 4·64·512, k and v 4·64·128, the attention output 4·64·512, the fp32
      log-sum-exp 4·64·8, the MLP norm's fp32 input 4·64·512 and rsqrt 4·64, gate, up and the activation
      output 4·64·1024: 1,382,656 B;
    - layer 1 the same, and its attention norm's rsqrt 256 B, its input (hidden 1, 131,072 B) requiring
      grad now and kept as the norm's ``to(float32)``;
    - the rotary cos and sin kept from layer 0 (its ``q * cos`` records a node): 2 × 4·64·64 in fp32;
    - the last hidden state (131,072 B, the final norm's fp32 input) and the final norm's rsqrt 256 B, no
      LM head input (the head is frozen);
    - the loss's fp32 log_softmax 4·64·1000, the loss and total_weight 4 B each, the padded labels
      8·65 (b 1: the shifted target is a view), less the previous step's loss 4 B."""
    request = parse_options(
        model=dict(SMALL), framework="ddp", lora_rank=8, quantize="nf4", seq_len=64, recompute="none"
    )
    led = steady_step(request, Ledger(block=1))
    events = {e.name: e.allocated for e in led.events}
    layer_0 = 131_072 + 2 * 2_048 + 131_072 + 2 * 32_768 + 131_072 + 2_048 + 131_072 + 256 + 3 * 262_144
    assert layer_0 == 1_382_656
    layer_1 = layer_0 + 256
    hidden = 4 * 64 * 512
    rotary = 2 * 4 * 64 * 64
    loss = 4 * 64 * 1000 + 4 + 4 + 8 * 65 - 4
    expected = layer_0 + layer_1 + 2 * hidden + rotary + 256 + loss
    assert events["after forward"] - events["start"] == expected == 3_317_260


@pytest.mark.parametrize(
    ("framework", "precision", "quantize", "adapter", "fp32_stream"),
    [
        ("fsdp2", "bf16-mixed", "none", "bf16", False),  # MixedPrecisionPolicy gathers all in bf16
        ("fsdp", "bf16-mixed", "none", "bf16", False),  # FSDP1's flat parameter, cast whole
        ("ddp", "bf16-mixed", "none", "fp32", False),  # autocast casts op inputs; the adapters stay fp32
        ("fsdp2", "bf16-pure", "none", "fp32", False),  # no policy: PEFT's fp32 adapters as they are
        ("ddp", "bf16-mixed", "nf4", "fp32", True),  # prepare_model_for_kbit_training's fp32 embeddings
        ("fsdp2", "bf16-mixed", "nf4", "bf16", False),  # ... gathered in bf16 again
    ],
)
def test_the_adapters_compute_in_the_dtype_the_framework_gives_their_weights(
    framework: str, precision: str, quantize: str, adapter: str, fp32_stream: bool
) -> None:
    """PEFT casts each LoRA input to ``lora_A.weight.dtype``: the precision record's module weight."""
    request = parse_options(
        model="llama-3-8b", gpus=8 if framework != "ddp" else 1, framework=framework, precision=precision,
        lora_rank=8, quantize=quantize, seq_len=512,
    )  # fmt: skip
    weights = request.forward_weights
    assert weights is not None
    assert (weights.adapter.value, weights.fp32_stream) == (adapter, fp32_stream)


def test_a_qlora_model_is_loaded_on_the_host_in_bf16_before_it_is_quantised() -> None:
    """The FSDP QLoRA recipe (Llama-2-70B on two 24 GB cards, CPU offload): the host copy at creation is
    the bf16 checkpoint as loaded, every Linear not yet quantised, beside PEFT's fp32 adapters. By hand:
    Llama-2-70B's 68,976,648,192 parameters (80 × 855,654,400 + 2 × 32,000 × 8,192 + 8,192) × 2 B, and
    r 64 on all seven Linears, 80 × 64 × (2 × 16,384 + 2 × 9,216 + 3 × 36,864) = 828,375,040 × 4 B."""
    result = CliRunner().invoke(app, [
        "memory", "--model", "llama-2-70b", "--gpus", "2", "--gpu", "rtx-4090", "--framework", "fsdp",
        "--lora-rank", "64", "--lora-targets", "all-linear", "--quantize", "nf4", "--quant-storage", "bf16",
        "--offload-params", "cpu", "--micro-batch", "1", "--seq-len", "2048", "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    peak = json.loads(result.stdout)["peak"]
    assert peak["init_host_bytes_per_node"] == 68_976_648_192 * 2 + 828_375_040 * 4
    assert peak["init_host_model"] == "the model as loaded (its frozen base bf16, not yet quantised)"
