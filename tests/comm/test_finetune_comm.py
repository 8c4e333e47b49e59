"""Fine-tuning's collectives, offload copies and step operations against hand counts (Llama-3-8B: 32 layers,
h 4096, kv 1024, f 14336, V 128256; 8,030,261,248 parameters; LoRA r 8 on every Linear but the head:
20,971,520 adapter parameters; the arithmetic is in the comments, the asserted values are literals)."""

from __future__ import annotations

import pytest
from helpers import one_line_error
from typer.testing import CliRunner

from zerocalc.api import estimate_comm
from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.comm.finetune import offload_copies
from zerocalc.comm.step import request_ops
from zerocalc.compute.finetune import matmul_split
from zerocalc.compute.ops import model_flops_per_token
from zerocalc.network.collectives import Collective
from zerocalc.network.schedule import Phase
from zerocalc.parallel.finetune import parameter_kinds
from zerocalc.request.training import parse_options
from zerocalc.states.memory import finetune_dtypes

runner = CliRunner()
LORA = {"model": "llama-3-8b", "lora_rank": 8, "lora_targets": "all-linear"}
ADAPTERS = 20_971_520
"""32 layers × 8 × (q 4096+4096, k 4096+1024, v 4096+1024, o 4096+4096, gate and up 4096+14336 each,
down 14336+4096) = 32 × 8 × 81,920."""
ROOT = 1_050_677_248
"""The FSDP root unit: embed_tokens and lm_head 128,256 × 4,096 each, the final norm 4,096."""


def _collectives(est, strategy: str) -> dict[tuple[Collective, Phase], tuple[int, int, str]]:
    return {
        (c.op, c.phase): (c.bytes_sent_per_gpu, c.calls_per_step, c.dtype)
        for c in est.row(strategy).collectives
    }


def test_fsdp2_lora_reduce_scatters_only_the_adapters_and_gathers_the_whole_bf16_model() -> None:
    est = estimate_comm(gpus=8, framework="fsdp2", strategies="zero3", **LORA)
    got = _collectives(est, "zero3")
    # reduce-scatter: the adapters' bf16 gradients (MixedPrecisionPolicy reduce_dtype None: the compute
    # dtype), one call per block (the root holds none); every dim 0 (8, 1024, 4096, 14336) divides by 8:
    # 20,971,520 × 2 B × 7/8
    assert got[(Collective.REDUCE_SCATTER, Phase.BACKWARD)] == (36_700_160, 32, "bf16")
    # forward all-gather: the frozen bf16 base and the adapters cast to bf16, 33 units:
    # (8,030,261,248 + 20,971,520) × 2 B × 7/8
    assert got[(Collective.ALL_GATHER, Phase.FORWARD)] == (14_089_657_344, 33, "bf16")
    # backward re-gather: every block but the root: (8,051,232,768 − 1,050,677,248) × 2 × 7/8
    assert got[(Collective.ALL_GATHER, Phase.BACKWARD)] == (12_250_972_160, 32, "bf16")


def test_fsdp1_lora_gathers_and_reduces_each_adapter_unit_of_peft_wrap_policy_apart() -> None:
    # PEFT's fsdp_auto_wrap_policy: each of the 32 × 7 × 2 = 448 lora_A/lora_B Linears its own unit, then the
    # 32 blocks and the root: 481 forward gathers, 480 backward re-gathers, 448 reduce-scatters; at 8 GPUs
    # nothing pads (every flat parameter divides by 8): the bytes of FSDP2's above
    got = _collectives(estimate_comm(gpus=8, framework="fsdp", strategies="zero3", **LORA), "zero3")
    assert got[(Collective.ALL_GATHER, Phase.FORWARD)] == (14_089_657_344, 481, "bf16")
    assert got[(Collective.ALL_GATHER, Phase.BACKWARD)] == (12_250_972_160, 480, "bf16")
    assert got[(Collective.REDUCE_SCATTER, Phase.BACKWARD)] == (36_700_160, 448, "bf16")
    # at 3 GPUs each adapter's flat parameter pads to a multiple of 3 on its own: per layer nine of
    # 32,768 elements (+1 each), two of 8,192 (+1), three of 114,688 (+2): 655,377 not 655,360;
    # 32 × 655,377 = 20,972,064 elements × 2 B × 2/3
    got = _collectives(estimate_comm(gpus=3, framework="fsdp", strategies="zero3", **LORA), "zero3")
    assert got[(Collective.REDUCE_SCATTER, Phase.BACKWARD)] == (27_962_752, 448, "bf16")


def test_fsdp1_dora_gathers_each_adapter_twice_in_the_forward_when_it_reshards() -> None:
    # DoRA adds a magnitude unit per adapted Linear: 448 + 224 = 672 trained units, 705 with the blocks and
    # the root; PEFT's get_lora_weight runs lora_B(lora_A(eye)) before the LoRA path, and FULL_SHARD
    # reshards each unit after its forward, so the 448 lora_A/lora_B units are gathered again; SHARD_GRAD_OP
    # keeps them gathered
    est = estimate_comm(gpus=8, framework="fsdp", strategies="zero3,shard_grad_op", dora=True, **LORA)
    full, kept = _collectives(est, "zero3"), _collectives(est, "shard_grad_op")
    assert full[(Collective.ALL_GATHER, Phase.FORWARD)][1] == 705 + 448
    assert full[(Collective.ALL_GATHER, Phase.BACKWARD)][1] == 704
    assert kept[(Collective.ALL_GATHER, Phase.FORWARD)][1] == 705
    assert full[(Collective.REDUCE_SCATTER, Phase.BACKWARD)][1] == 672


def test_fsdp2_lora_reduces_in_fp32_with_an_fp32_reduce_dtype() -> None:
    est = estimate_comm(gpus=8, framework="fsdp2", strategies="zero3", reduce_dtype="fp32", **LORA)
    assert _collectives(est, "zero3")[(Collective.REDUCE_SCATTER, Phase.BACKWARD)] == (73_400_320, 32, "fp32")


def test_ddp_all_reduces_the_fp32_adapters_only() -> None:
    # autocast: PEFT's fp32 adapters keep fp32 gradients; 20,971,520 × 4 B × 2 × 7/8
    est = estimate_comm(gpus=8, framework="ddp", **LORA)
    ((sent, _, dtype),) = _collectives(est, "ddp").values()
    assert (sent, dtype) == (146_800_640, "fp32")


@pytest.mark.parametrize("storage", ["bf16", "uint8"])
def test_qlora_gathers_the_packed_4bit_weights_at_their_storage_bytes(storage: str) -> None:
    # 224 decoder Linear weights of 6,979,321,856 elements packed two per byte: 3,489,660,928 B (bf16
    # storage: n/4 elements of 2 B; uint8: n/2 of 1 B; the QuantState is not gathered); the embedding,
    # the head and 65 norms (1,050,939,392, fp32 after prepare_model_for_kbit_training) and the adapters
    # gathered in bf16: 1,071,910,912 × 2 B; (3,489,660,928 + 2,143,821,824) × 7/8
    est = estimate_comm(
        gpus=8, framework="fsdp2", strategies="zero3", quantize="nf4", double_quant=True,
        quant_storage=storage, **LORA,
    )  # fmt: skip
    sent, calls, dtype = _collectives(est, "zero3")[(Collective.ALL_GATHER, Phase.FORWARD)]
    # bf16 storage: one dtype, sized in bf16 elements; uint8 beside bf16: gathered as bytes (uint8)
    assert (sent, calls, dtype) == (4_929_297_408, 33, "bf16" if storage == "bf16" else "uint8")
    assert _collectives(est, "zero3")[(Collective.REDUCE_SCATTER, Phase.BACKWARD)][0] == 36_700_160


def test_zero2_gathers_only_the_updated_adapters_after_the_step() -> None:
    # the paper's ZeRO-2: reduce-scatter of the bf16 adapter gradients and all-gather of the updated bf16
    # adapters, 20,971,520 × 2 × 7/8 each
    est = estimate_comm(gpus=8, framework="paper", strategies="zero2", **LORA)
    sent = sorted(b for b, _, _ in _collectives(est, "zero2").values())
    assert sent == [36_700_160, 36_700_160]


def test_fsdp_cpu_offload_copies_each_shard_in_its_stored_dtype() -> None:
    request = parse_options(gpus=2, framework="fsdp2", offload_params="cpu", **LORA)
    kinds = {k.kind for k in parameter_kinds(request.architecture, request.finetune)}
    dtypes = {kind: finetune_dtypes(request, kind) for kind in kinds}
    copies = offload_copies(
        request.architecture, request.finetune, 2,
        tuple((k, d.stored) for k, d in dtypes.items()), tuple((k, d.reduce) for k, d in dtypes.items()),
    )  # fmt: skip
    # to the GPU per all-gather: the bf16 base and the fp32 adapters, halved:
    # (8,030,261,248 × 2 + 20,971,520 × 4) / 2; back per reduction: bf16 adapter gradients, halved
    assert copies == (8_072_204_288, 20_971_520)


def _ops(**options: object):
    return request_ops(parse_options(gpus=1, micro_batch=1, seq_len=4096, framework="ddp", **options))


def test_a_frozen_layer_runs_input_gradients_and_the_adapters_both() -> None:
    ops = _ops(model="llama-3-8b", lora_rank=8, lora_targets="q_proj,v_proj")
    by_count = {layer.layers: layer for layer in ops.layers}
    first, rest = by_count[1], by_count[31]  # layer 0 computes no gradient of its input
    t = 4096

    def backward(layer) -> tuple[int, float]:
        products = [b for g in layer.gemms for b in g.backward()]
        return len(products), sum(b.flops for b in products)

    # layers 1-31: 7 frozen matrices, input gradient only; q and v's lora_A and lora_B, both products each
    base = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096  # 218,103,808
    lora = 8 * (4096 + 4096) + 8 * (4096 + 1024)  # 106,496
    assert backward(rest) == (7 + 8, 2.0 * t * base + 2 * 2.0 * t * lora)
    # layer 0: no input gradient for q, k, v (the embedding's output needs none), nor for q's and v's
    # lora_A: o, gate, up, down's input gradients and each adapter's three other products
    frozen_inputs = 4096 * 4096 + 2 * 1024 * 4096
    assert backward(first) == (4 + 6, 2.0 * t * (base - frozen_inputs + lora + 8 * (4096 + 1024)))


def test_full_training_keeps_both_backward_products() -> None:
    (layer,) = _ops(model="llama-3-8b").layers
    assert sum(len(g.backward()) for g in layer.gemms) == 14


def test_a_quantised_weight_is_dequantised_forward_and_backward() -> None:
    # prepare_model_for_kbit_training turns on the input's gradient: every layer alike
    (layer,) = _ops(model="llama-3-8b", lora_rank=8, quantize="nf4", double_quant=True).layers
    (q,) = [t for t in layer.traffic if t.name == "q_proj dequantize"]
    # 16,777,216 weights: packed 8,388,608 B, uint8 absmax 262,144, nested absmax 1,024 × 4, nested code
    # 256 × 4, offset 4, code 16 × 4 (8,655,940 B read); 16,777,216 × 2 B written in bf16
    assert (q.nbytes, q.backward) == (42_210_372, 42_210_372)


def test_fp32_adapters_run_their_products_in_fp32_under_bf16_pure() -> None:
    ops = _ops(model="llama-3-8b", lora_rank=8, precision="bf16-pure")
    lora = [g for layer in ops.layers for g in layer.gemms if "lora_" in g.name]
    assert lora and {g.dtype for g in lora} == {DType.FP32}
    mixed = _ops(model="llama-3-8b", lora_rank=8)
    assert {g.dtype for layer in mixed.layers for g in layer.gemms if "lora_" in g.name} == {DType.BF16}


def test_comm_prints_a_fine_tuning_step_and_refuses_ddp_offload() -> None:
    result = runner.invoke(
        app, ["comm", "--model", "llama-3-8b", "--gpus", "2", "--framework", "fsdp2", "--lora-rank", "8",
              "--quantize", "nf4", "--quant-storage", "bf16", "--offload-params", "cpu", "--gpu", "rtx-4090",
              "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    import json

    rows = json.loads(result.stdout)["strategies"]
    assert rows and all(row["step"]["offload_s"] > 0 for row in rows)
    assert all(row["step"]["optimizer_s"] == 0 for row in rows)  # the optimizer steps on the host
    one_line_error(
        runner.invoke(app, ["comm", "--model", "llama-3-8b", "--gpus", "2", "--lora-rank", "8",
                            "--framework", "ddp", "--offload-params", "cpu"]),
        "--framework ddp does not offload",
    )  # fmt: skip


def test_frozen_layers_before_the_first_trained_one_run_no_backward() -> None:
    # full fine-tuning with the embedding and layer 0 frozen: layer 0 runs no backward; layer 1's input
    # (layer 0's output) needs no gradient: no input gradient for q, k, v (14 − 3 products); the rest, 14
    first, second, rest = _ops(model="llama-3-8b", freeze="embed_tokens,layers.0").layers
    assert [(layer.layers, layer.backward_runs) for layer in (first, second, rest)] == [
        (1, False), (1, True), (30, True),
    ]  # fmt: skip
    assert [sum(len(g.backward()) for g in layer.gemms) for layer in (second, rest)] == [11, 14]


def test_a_fine_tuning_runs_model_flops_count_4_per_frozen_and_6_per_trained_parameter() -> None:
    request = parse_options(gpus=1, framework="ddp", **LORA)
    arch = request.model.architecture
    count = request.model.parameter_count
    # frozen: the 224 decoder Linear weights (6,979,321,856) and lm_head (525,336,576); adapters 20,971,520
    assert matmul_split(arch, request.finetune) == (7_504_658_432, ADAPTERS)
    full = model_flops_per_token(arch, count, 4096)
    tuned = model_flops_per_token(arch, count, 4096, *matmul_split(arch, request.finetune))
    assert tuned - full == 6 * ADAPTERS - 2 * 7_504_658_432


def test_gradient_checkpointing_turns_the_first_layers_input_gradient_on() -> None:
    # transformers' gradient_checkpointing_enable → enable_input_require_grads: every layer alike, 14 products
    (layer,) = _ops(model="llama-3-8b", freeze="embed_tokens", recompute="full").layers
    assert (layer.layers, sum(len(g.backward()) for g in layer.gemms)) == (32, 14)
