"""A fine-tuning run's model states by hand: trained, frozen and quantised parameters apart, gradients and
optimizer states of the trained ones only, bitsandbytes' optimizers tensor by tensor, FSDP's CPU offload,
and the refusals where a framework's accounting does not model fine-tuning."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerocalc.base.errors import InputError
from zerocalc.cli import app
from zerocalc.request.training import parse_options
from zerocalc.states.memory import Location, StateKind, evaluate_memory

runner = CliRunner()

# Llama-3-8B (hidden 4096, 32 layers, 32 heads of 128, 8 KV heads, MLP 14336, vocabulary 128,256, untied)
LAYERS, D, KV, F, V = 32, 4096, 1024, 14336, 128_256
ALL_LINEAR_R8 = 8 * LAYERS * ((D + D) * 2 + (D + KV) * 2 + (D + F) * 3)  # q, o; k, v; gate, up, down
NOT_QUANTISED = 2 * V * D + (2 * LAYERS + 1) * D  # embeddings, LM head; two norms per layer and the last
QUANTISED = LAYERS * (2 * D * D + 2 * D * KV + 3 * D * F)
NF4_DQ = QUANTISED // 2 + QUANTISED // 64 + QUANTISED // 64 // 256 * 4 + 224 * (256 * 4 + 4 + 16 * 4)
"""packed 0.5 B per weight; a uint8 absmax per 64; an fp32 second-level absmax per 256 blocks; per module
the nested code (256 fp32), the offset (one fp32) and the code (16 fp32)."""


def _row(**options: object):
    estimate = evaluate_memory(parse_options(model="llama-3-8b", **options))
    return estimate, estimate.strategies[0]


def _bytes(row, kind: StateKind, location: Location = Location.GPU) -> int:
    return sum(s.bytes for s in row.states if s.kind is kind and s.location is location)


def test_qlora_of_llama_3_8b_keeps_each_kind_apart_by_hand() -> None:
    assert ALL_LINEAR_R8 == 20_971_520 and NF4_DQ == 3_600_661_376
    estimate, row = _row(
        lora_rank=8, lora_targets="all-linear", quantize="nf4", double_quant=True, strategies="ddp"
    )
    # the paper's bf16-mixed: 2 + 2 + 12 bytes per trained parameter
    assert _bytes(row, StateKind.PARAMS) == 2 * ALL_LINEAR_R8
    assert _bytes(row, StateKind.GRADS) == 2 * ALL_LINEAR_R8
    assert _bytes(row, StateKind.OPTIMIZER) == 12 * ALL_LINEAR_R8
    # prepare_model_for_kbit_training: every parameter but the 4-bit weights in fp32
    assert _bytes(row, StateKind.FROZEN) == 4 * NOT_QUANTISED
    assert _bytes(row, StateKind.QUANTIZED) == NF4_DQ
    assert row.gpu_bytes == 16 * ALL_LINEAR_R8 + 4 * NOT_QUANTISED + NF4_DQ
    assert estimate.finetune is not None
    counts = estimate.finetune.counts
    assert (counts.trainable, counts.frozen, counts.quantized.weights) == (
        ALL_LINEAR_R8,
        QUANTISED + NOT_QUANTISED,
        QUANTISED,
    )
    unprepared = _row(
        lora_rank=8, lora_targets="all-linear", quantize="nf4", kbit_prepare=False, strategies="ddp"
    )[1]
    assert _bytes(unprepared, StateKind.FROZEN) == 2 * NOT_QUANTISED  # loaded in bf16


def test_lora_under_fsdp2_shards_every_kind_and_offload_moves_all_to_the_host() -> None:
    common = {"lora_rank": 8, "lora_targets": "all-linear", "framework": "fsdp2", "gpus": 2}
    _, row = _row(**common, strategies="zero3")
    # fp32 adapters, fp32 gradients, Adam's two fp32 moments; the bf16 base sharded over the 2 ranks
    assert _bytes(row, StateKind.PARAMS) == _bytes(row, StateKind.GRADS) == 4 * ALL_LINEAR_R8 // 2
    assert _bytes(row, StateKind.OPTIMIZER) == 8 * ALL_LINEAR_R8 // 2
    assert _bytes(row, StateKind.FROZEN) == 2 * (QUANTISED + NOT_QUANTISED) // 2
    _, offloaded = _row(**common, strategies="zero3", offload_params="cpu")
    assert offloaded.gpu_bytes == 0 and offloaded.cpu_bytes_per_gpu == row.gpu_bytes


def _bnb_8bit(n: int) -> int:
    """bitsandbytes' AdamW8bit states of one tensor of n elements: two uint8 states and two fp32 absmax
    per 256, or two fp32 states under 4,096 elements."""
    return 2 * n + 2 * 4 * -(-n // 256) if n >= 4096 else 2 * 4 * n


def test_bitsandbytes_8bit_keeps_32bit_states_for_small_tensors_and_pages_large_ones() -> None:
    _, row = _row(lora_rank=8, lora_targets="all-linear", dora=True, optimizer="adam-8bit", strategies="ddp")
    per_layer = []  # lora_A (r × in), lora_B (out × r), DoRA's magnitude (out) of each adapted Linear
    for fan_in, fan_out in [(D, D), (D, KV), (D, KV), (D, D), (D, F), (D, F), (F, D)]:
        per_layer += [8 * fan_in, fan_out * 8, fan_out]
    assert sorted(n for n in per_layer if n < 4096) == [KV, KV]  # k's and v's magnitudes: 32-bit
    master = 4 * sum(per_layer) * LAYERS  # the paper's fp32 master copy of each trained parameter
    states = sum(_bnb_8bit(n) for n in per_layer) * LAYERS
    assert _bytes(row, StateKind.OPTIMIZER) == master + states + 2 * 256 * 4  # + the two quantisation maps
    # paged 32-bit AdamW at r 64: q's lora_A and lora_B and k's lora_A (262,144 ≥ 10⁵ elements) are paged,
    # k's lora_B (65,536) is not
    _, paged = _row(lora_rank=64, lora_targets="q_proj,k_proj", optimizer="paged-adamw", strategies="ddp")
    unified = _bytes(paged, StateKind.OPTIMIZER, Location.UNIFIED)
    assert unified == LAYERS * 3 * 8 * 64 * D
    assert paged.unified_bytes_per_gpu == unified and paged.gpu_bytes == sum(
        s.bytes for s in paged.states if s.location is Location.GPU
    )
    trained = LAYERS * (3 * 64 * D + KV * 64)
    assert _bytes(paged, StateKind.OPTIMIZER) == 4 * trained + LAYERS * 8 * KV * 64


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"framework": "deepspeed"}, "deepspeed does not model fine-tuning"),
        ({"framework": "megatron"}, "megatron does not model fine-tuning"),
        ({"tp": 2, "gpus": 2}, "fine-tuning is modelled over data-parallel ranks"),
        (
            {"framework": "fsdp2", "optimizer": "adam-8bit"},
            "adam-8bit is not modelled with framework fsdp2",
        ),
        ({"framework": "ddp", "offload_params": "cpu"}, "ddp does not offload"),
        (
            {"framework": "fsdp", "offload_optimizer": "cpu"},
            "offloads parameters, gradients and the optimizer",
        ),
    ],
)
def test_a_framework_that_does_not_model_fine_tuning_is_refused(options: dict, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        parse_options(model="llama-3-8b", lora_rank=8, **options)


def test_paged_optimizers_need_a_fine_tuning_run() -> None:
    with pytest.raises(InputError, match="pages tensor by tensor"):
        parse_options(params="7B", optimizer="paged-adamw-8bit")


def test_the_json_carries_the_trained_count_and_the_quantised_bytes() -> None:
    args = ["memory", "--model", "llama-3-8b", "--lora-rank", "8", "--lora-targets", "all-linear"]
    result = runner.invoke(app, [*args, "--quantize", "nf4", "--double-quant", "--json"])
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert data["finetune"]["counts"]["trainable"] == ALL_LINEAR_R8
    quantized = data["finetune"]["counts"]["quantized"]
    assert sum(quantized["parts"].values()) == NF4_DQ and quantized["weights"] == QUANTISED
    assert data["finetune"]["method"]["lora"]["rank"] == 8
    kinds = {s["kind"] for s in data["strategies"][0]["states"]}
    assert {"params", "frozen", "quantized", "grads", "optimizer"} == kinds


@settings(max_examples=25, deadline=None)
@given(
    rank=st.integers(1, 64),
    targets=st.sampled_from(["all-linear", "q_proj,v_proj", "gate_proj,up_proj,down_proj"]),
    dora=st.booleans(),
    quantize=st.sampled_from(["none", "nf4", "fp4", "int8"]),
    framework=st.sampled_from(["paper", "ddp", "fsdp2"]),
    gpus=st.sampled_from([1, 2, 8]),
)
def test_a_fine_tuning_run_never_holds_more_than_full_training(
    rank: int, targets: str, dora: bool, quantize: str, framework: str, gpus: int
) -> None:
    """Adapters, a frozen (or quantised) base and the trained tensors' gradients and states: never more
    than training every parameter, for every strategy; and each row is the sum of its states."""
    common = {"model": "llama-3-8b", "framework": framework, "gpus": gpus}
    full = {r.strategy: r.gpu_bytes for r in evaluate_memory(parse_options(**common)).strategies}
    tuned = evaluate_memory(
        parse_options(**common, lora_rank=rank, lora_targets=targets, dora=dora, quantize=quantize)
    )
    for row in tuned.strategies:
        assert row.gpu_bytes <= full[row.strategy]
        assert row.gpu_bytes == sum(s.bytes for s in row.states if s.location is Location.GPU)
        assert all(s.bytes == sum(s.parts.values()) for s in row.states)


def test_fsdp_qlora_of_llama_2_70b_on_two_cards_with_cpu_offload_by_hand() -> None:
    """The recipe of PEFT's "FSDP + QLoRA" guide: 4-bit NF4 with double quantisation stored in bf16 (so
    FSDP can flatten it), no prepare_model_for_kbit_training (the base stays bf16), LoRA on all-linear,
    FSDP1 full sharding over 2 GPUs with CPU offload of parameters."""
    h, layers, kv, f, v = 8192, 80, 1024, 28672, 32000
    trained = 16 * layers * ((h + h) * 2 + (h + kv) * 2 + (h + f) * 3)
    weights = layers * (2 * h * h + 2 * h * kv + 3 * h * f)
    nf4 = weights // 2 + weights // 64 + weights // 64 // 256 * 4 + 7 * layers * (256 * 4 + 4 + 16 * 4)
    unquantised = 2 * v * h + (2 * layers + 1) * h
    request = parse_options(
        model="llama-2-70b", framework="fsdp", gpus=2, lora_rank=16, lora_targets="all-linear",
        quantize="nf4", double_quant=True, quant_storage="bf16", kbit_prepare=False, offload_params="cpu",
        strategies="zero3",
    )  # fmt: skip
    row = evaluate_memory(request).strategies[0]
    # the packed data is the parameter, sharded and offloaded; the QuantState (absmax, nested absmax, code
    # tables) is an attribute of it, whole on each GPU (bitsandbytes 0.50 nn/modules.py Params4bit)
    packed = weights // 2
    assert row.gpu_bytes == nf4 - packed
    host = {s.kind: s.bytes for s in row.states if s.location is Location.CPU}
    assert host == {
        StateKind.PARAMS: 4 * trained // 2,
        StateKind.FROZEN: 2 * unquantised // 2,
        StateKind.QUANTIZED: packed // 2,
        StateKind.GRADS: 4 * trained // 2,
        StateKind.OPTIMIZER: 8 * trained // 2,
    }
    assert row.cpu_bytes_per_node == 2 * row.cpu_bytes_per_gpu == 2 * sum(host.values())


@pytest.mark.parametrize(
    ("framework", "precision", "upcast", "in_base_dtype"),
    [
        # (params, grads, AdamW) bytes per adapter element: PEFT's fp32 adapters, or the bf16 base's dtype
        ("fsdp2", "bf16-mixed", (4, 4, 8), (2, 2, 4)),  # MixedPrecisionPolicy casts a bf16 one to bf16
        ("fsdp2", "bf16-pure", (4, 4, 8), (2, 2, 4)),
        ("ddp", "bf16-mixed", (4, 4, 8), (2, 2, 4)),  # autocast: the parameter's own dtype
        ("fsdp2", "fp32", (4, 4, 8), (4, 4, 8)),  # an fp32 base: fp32 either way
        ("paper", "bf16-mixed", (2, 2, 12), (2, 2, 12)),  # the 16-bit copy and its fp32 master either way
    ],
)
def test_adapters_in_the_base_dtype_by_hand(
    framework: str, precision: str, upcast: tuple[int, int, int], in_base_dtype: tuple[int, int, int]
) -> None:
    common = {"lora_rank": 8, "lora_targets": "all-linear", "framework": framework, "precision": precision}
    for autocast, per_element in ((True, upcast), (False, in_base_dtype)):
        _, row = _row(**common, autocast_adapter_dtype=autocast)
        kinds = (StateKind.PARAMS, StateKind.GRADS, StateKind.OPTIMIZER)
        assert tuple(_bytes(row, k) for k in kinds) == tuple(b * ALL_LINEAR_R8 for b in per_element)
        frozen = 4 if precision == "fp32" else 2
        assert _bytes(row, StateKind.FROZEN) == frozen * (QUANTISED + NOT_QUANTISED)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"framework": "fsdp2", "precision": "fp16-mixed"}, "on an fp16 base are fp16 parameters"),
        ({"quantize": "int8"}, "its int8 weight leaves them fp32"),
        (
            {"quantize": "nf4", "lora_targets": "q_proj,lm_head"},
            "on lm_head, which is not quantised and prepare_model_for_kbit_training makes fp32",
        ),
        ({"lora_rank": 0}, "autocast_adapter_dtype describes LoRA, which is off without a rank"),
    ],
)
def test_adapters_in_the_base_dtype_are_refused_where_they_are_not_one_16_bit_dtype(
    options: dict, fragment: str
) -> None:
    with pytest.raises(InputError, match=fragment):
        parse_options(model="llama-3-8b", **{"lora_rank": 8, **options}, autocast_adapter_dtype=False)


def test_dora_with_dropout_on_a_conv1d_read_in_its_own_dtype_is_refused() -> None:
    """GPT-2's Conv1D under DoRA with dropout: where the forward reads the weight in its own dtype, PEFT's
    transpose makes a new Parameter each forward (tests/memory/test_finetune_states_real.py), refused;
    where it casts the weight to the fp32 adapters first (DDP's autocast), modelled."""
    dora = {"model": "gpt2", "lora_rank": 8, "dora": True, "lora_dropout": 0.1}
    for options in ({"framework": "fsdp2"}, {"framework": "ddp", "precision": "fp32"}):
        with pytest.raises(InputError, match="transpose makes a new Parameter each forward"):
            parse_options(**dora, **options)
    assert parse_options(**dora, framework="ddp").finetune is not None
    assert parse_options(**{**dora, "lora_dropout": 0}, framework="fsdp2").finetune is not None
