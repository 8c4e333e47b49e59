"""``zerocalc validate fake``: FSDP2 at any world size under fake tensors, tracked by PyTorch's own
``FSDPMemTracker``, against the step timeline to the byte.

The pure tests assert the timeline's figures against what the real tracker gave for the same case (torch
2.13.0, transformers 5.17.0, tiny configs of ``zerocalc/validate/saved.py``); the torch tests run the real
thing at worlds 2, 8 and 64 on a dense (llama) and a mixture-of-experts (qwen3_moe) family.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from zerocalc.base.dtypes import DType
from zerocalc.cli import app
from zerocalc.model.activations import Recompute
from zerocalc.model.code import Device, OutputKept
from zerocalc.model.code.finetune import tuned_layer
from zerocalc.model.hf_config import architecture_from_hf_dict
from zerocalc.parallel.finetune import PEFT_ALONE, ForwardWeights, forward_tuning
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.precision import Fp8RecipeName
from zerocalc.parallel.strategies import StrategyName
from zerocalc.peak.simulate import activation_shape
from zerocalc.validate import fake
from zerocalc.validate.phases import AllocatedPhases
from zerocalc.validate.saved import TINY_CONFIGS

HAS_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers")
GIB = 2**30


def _case(
    family: str, world: int, b: int, s: int, recompute: str = "none", reshard: bool = True, **sizes: int
):
    config = dict(TINY_CONFIGS[family], **sizes)
    arch = architecture_from_hf_dict(config, family, family)
    case = fake.FakeCase(
        model=family, world=world, micro_batch=b, seq_len=s, recompute=Recompute(recompute), reshard=reshard
    )
    return config, fake.request_for(arch, case), case


def _predicted(family: str, world: int, b: int, s: int, **sizes: int) -> AllocatedPhases:
    _, request, case = _case(family, world, b, s, **sizes)
    return fake.predict(request, case)[0]


def _tracker(start: int, fwd: int, after_fwd: int, bwd: int, after_bwd: int, opt: int) -> AllocatedPhases:
    return AllocatedPhases(
        start_allocated=start, forward_peak=fwd, after_forward=after_fwd, backward_peak=bwd,
        after_backward=after_bwd, optimizer_peak=opt,
    )  # fmt: skip


# ------------------------------------------------------------------------------ the timeline, pure
def test_the_root_prefetches_the_last_block_before_the_loss_backward() -> None:
    """World ≥ 2: FSDPState._pre_backward → FSDPParamGroup._backward_prefetch gathers the last block when
    the loss's gradient reaches the root, so its padded bf16 all-gather output is alive in the loss
    backward. Tiny llama (q 128×128, k and v 32×128, o 128×128, gate/up/down 320×128, two norms of 128:
    164,096 elements per block) at world 8, b=1 s=512: the tracker's backward peak."""
    world8 = _predicted("llama", 8, 1, 512)
    assert world8 == _tracker(701_440, 12_514_816, 8_777_728, 13_558_272, 932_352, 1_164_288)
    _, request, case = _case("llama", 8, 1, 512)
    *_, step = fake.predict(request, case)
    backward = [(e, a) for p, e, a in step.events if p.value == "backward"]
    names = [e for e, _ in backward]
    at = dict(backward)
    assert names[:5] == [
        "all-gather root", "unshard root (copy-out)", "all-gather 1", "prefetch 1",
        "loss backward (log_softmax_backward)",
    ]  # fmt: skip
    block = 2 * 164_096  # bf16; every dim of the block divides by 8: no padding
    root_output = 262_656  # the root's all-gather output, freed after its copy-out: 2 × 131,200 B → 512 B
    assert at["prefetch 1"] - at["unshard root (copy-out)"] == block - root_output
    assert at["loss backward (log_softmax_backward)"] == world8.backward_peak
    # world 1: FSDP2's fast path allocates nothing when it prefetches (the tracker's backward peak)
    assert _predicted("llama", 1, 1, 512).backward_peak == 18_046_976


def test_expert_tensors_pad_to_the_world_and_three_gathers_coexist_in_forward() -> None:
    """Stacked experts [4, 192, 128] and [4, 128, 96] are gathered as 64 rows each at world 64; at a
    block's copy-out the previous block's all-gather output is still alive (wait_for_unshard's local
    ``prev_all_gather_state``), beside this block's output and its unsharded parameters."""
    assert _predicted("qwen3_moe", 64, 1, 256) == _tracker(
        972_800, 17_786_368, 5_574_656, 22_967_296, 1_292_800, 1_615_872
    )
    assert _predicted("mixtral", 64, 1, 256) == _tracker(
        1_851_392, 32_956_928, 6_729_728, 43_003_904, 2_466_304, 3_082_240
    )


WIDE_MOE = {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "moe_intermediate_size": 128,
            "num_experts": 16, "num_experts_per_tok": 4, "num_hidden_layers": 3}  # fmt: skip
"""Qwen3-MoE's layout scaled down (h 256, 16 experts of 128, 4 per token, 3 layers) so that at b 2, s 128 a
layer's experts hold the backward peak, as in Qwen3-30B-A3B (h 2048, 128 experts of 768, 8 per token)."""
WIDE_MIXTRAL = {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "intermediate_size": 256,
                "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3}  # fmt: skip
"""Mixtral's layout scaled down (h 256, 8 experts of 256, 2 per token, fp32 routing weights, 3 layers)."""
WIDE_UNTIED = {"hidden_size": 1024, "intermediate_size": 2816, "head_dim": 128, "vocab_size": 32_000,
               "num_hidden_layers": 4, "tie_word_embeddings": False}  # fmt: skip
"""The tiny Llama untied with a 32,000 × 1,024 LM head (as Llama-3-8B's and Qwen2.5-7B's are untied)."""
SHORT_DENSE = {"hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8, "head_dim": 64,
               "num_hidden_layers": 3, "tie_word_embeddings": False}  # fmt: skip
"""A Llama of h 512 whose layers' weights outweigh a short sequence's activations (b 1, s 128), as
Llama-3-8B's and Qwen2.5-7B's do at s 512."""


def _events(family: str, world: int, b: int, s: int, **kw: Any) -> dict[str, int]:
    """The backward's events of the timeline, each name at its largest."""
    _, request, case = _case(family, world, b, s, **kw)
    *_, step = fake.predict(request, case)
    at: dict[str, int] = {}
    for phase, name, allocated in step.events:
        if phase.value == "backward":
            at[name] = max(allocated, at.get(name, 0))
    return at


def test_the_experts_weight_gradients_meet_the_saved_tensors_in_backward() -> None:
    """Stands for Qwen3-30B-A3B cut to 4 layers at worlds 4 and 128 (b 2, s 537): 0.76% and 1.61% low
    before, now exact (docs/validate-fake.md). The experts' backward (``grouped_mm_experts_forward``) gives
    both expert weight gradients while the layer's other saved tensors are alive: at the gate/up
    ``GroupedMmBackward0``, above the layer's start (T 256, S = 4T = 1,024, h 256, f 128, 16 experts, bf16):
    the gradients 2·16·(2f·h + h·f) = 3,145,728 B and the [S, 2f] and [S, h] input gradients (524,288 B
    each) with the routing weights' [S] (2,048), less the saved tensors their nodes have freed: the inverse
    permutation (8,192), the sorted routing weights (2,048), the down output [S, h] (524,288), the down
    input and the activation [S, f] (262,144 each) and the gate/up output [S, 2f] (524,288). Forward: at
    the gather by the inverse permutation, the weighted output and its gather [S, h] beside the router's
    and the sort's tensors. The tracker's figures (torch 2.13.0, transformers 5.17.0)."""
    assert _predicted("qwen3_moe", 4, 2, 128, **WIDE_MOE) == _tracker(
        17_558_528, 39_800_832, 31_764_480, 46_277_120, 23_407_104, 29_258_752
    )
    assert _predicted("qwen3_moe", 128, 2, 128, **WIDE_MOE) == _tracker(
        3_676_160, 90_297_856, 17_882_112, 119_331_328, 4_895_744, 6_119_936
    )
    at = _events("qwen3_moe", 4, 2, 128, **WIDE_MOE)
    gradients, inputs, freed = 3_145_728, 2 * 524_288 + 2_048, 8_192 + 2_048 + 2 * 524_288 + 2 * 262_144
    assert at["layer 1 experts backward"] == max(at.values())
    assert at["layer 1 experts backward"] - at["prefetch 0"] == gradients + inputs - freed == 2_613_248


def test_mixtral_experts_at_world_6_under_full_recompute() -> None:
    """Stands for Mixtral-8x7B cut to 4 layers at world 6 with full recompute (b 2, s 537): 0.42% low
    before, now exact. The recomputed layer's backward reaches the experts' gate/up gradient with fp32
    routing weights (the combine's [S, h] gradients in fp32). The tracker's figures."""
    assert _predicted("mixtral", 6, 2, 128, recompute="full", **WIDE_MIXTRAL) == _tracker(
        16_437_248, 33_293_312, 18_440_704, 46_321_152, 21_913_600, 27_391_488
    )


def test_mixtral_experts_forward_peak_in_fp32() -> None:
    """Mixtral's fp32 routing weights make the weighted expert output and its gather by the inverse
    permutation fp32 [S, h]: with more tokens (b 4, s 256, world 8) the forward peaks there, at layer 2
    (was 998,912 B high: a fp32 [T, h] sum counted beside them). The tracker's figures."""
    assert _predicted("mixtral", 8, 4, 256, vocab_size=512, **WIDE_MIXTRAL) == _tracker(
        8_385_536, 58_496_512, 49_271_808, 60_788_736, 11_175_936, 13_967_872
    )


def test_foreach_reduce_keeps_the_last_gradient_through_the_reduce_scatter_output() -> None:
    """Stands for llama-3-8b at world 2 (no reshard, +1,050,673,152 B before) and qwen2.5-7b at world 3
    (+363,329,536 B): ``foreach_reduce``'s shard-dim loop (world > 1) leaves the last gradient of the
    root's list, the untied LM head's [V, h], bound to its loop variable while the reduce-scatter output
    is allocated. World 2 (V 32,000, h 1,024): the output, 4·(2·V·h + h)/2 = 131,074,048 B, replaces the
    embedding's gradient (65,536,000) and the final norm's (2,048) but not the LM head's. The tracker's
    figures."""
    assert _predicted("llama", 2, 1, 16, **WIDE_UNTIED) == _tracker(
        663_805_952, 971_092_480, 668_818_944, 1_212_758_528, 885_073_920, 1_106_341_888
    )
    at = _events("llama", 2, 1, 16, **WIDE_UNTIED)
    assert at["reduce root output"] - at["reduce root (copy-in)"] == 131_074_048 - 65_536_000 - 2_048
    assert at["reduce root output"] == max(at.values())


def test_the_first_norm_backward_holds_every_gradient_of_its_layer() -> None:
    """Stands for llama-3-8b at world 4 (b 1, s 512, no reshard: 24·h·T = 50,331,648 B low before) and
    qwen2.5-7b at worlds 3, 4, 8: the input norm's backward runs last in its layer, when every weight of
    the layer has its gradient, with its saved fp32 input and five fp32 [T, h] gradients of its chain:
    6·4·T·h = 1,572,864 B above the layer's gradients (T 128, h 512). The tracker's figures."""
    assert _predicted("llama", 4, 1, 128, reshard=False, **SHORT_DENSE) == _tracker(
        28_521_472, 64_752_640, 57_087_488, 67_239_424, 38_027_776, 47_534_080
    )
    at = _events("llama", 4, 1, 128, reshard=False, **SHORT_DENSE)
    assert at["layer 1 first norm backward"] - at["layer 1 gradients"] == 6 * 4 * 128 * 512
    assert at["layer 1 first norm backward"] == max(at.values())


def test_gemma3_keeps_two_rotary_tables_and_its_embedding_scale() -> None:
    """2 layers (all sliding-window): one table; 6 layers: a local and a global one. Both keep the fp32
    0-dim ``embed_scale`` buffer, and each sliding layer's cache tensor until the output is dropped."""
    assert _predicted("gemma3_text", 1, 1, 256) == _tracker(
        5_529_088, 13_468_160, 11_631_104, 13_988_352, 7_369_728, 9_211_392
    )
    assert _predicted("gemma3_text", 8, 1, 256, num_hidden_layers=6) == _tracker(
        1_733_120, 19_427_840, 17_260_032, 19_946_496, 2_293_760, 2_869_760
    )


def test_cuda_extras_are_named_and_account_for_the_difference_with_zerocalc_memory() -> None:
    _, request, case = _case("llama", 8, 2, 64)
    bare, cuda, _ = fake.predict(request, case)
    extras = fake.cuda_extras(request, case)
    assert [e.name.split(" (")[0] for e in extras] == [
        "cuBLAS workspace", "unattributed at the step start", "SDPA philox seed and offset",
    ]  # fmt: skip
    whole_step = sum(e.bytes * e.count for e in extras if e.lifetime == "the whole step")
    assert cuda.start_allocated - bare.start_allocated == whole_step == 2 * 32 * 2**20 + 512
    layers = 2 * 1024  # two layers' philox seed and offset, alive at the loss
    assert cuda.forward_peak - bare.forward_peak == whole_step + layers


def test_what_is_not_claimed() -> None:
    config, request, case = _case("llama", 8, 1, 64, recompute="full")
    assert fake.not_claimed(config, request.architecture, case) is None
    config, request, case = _case("mixtral", 8, 1, 64, recompute="full")
    assert "checkpointing" in (fake.not_claimed(config, request.architecture, case) or "")
    config, request, case = _case("qwen3_moe", 8, 1, 64, reshard=False)  # its experts are traced
    assert fake.not_claimed(config, request.architecture, case) is None
    config, request, case = _case("qwen2_moe", 8, 1, 64, reshard=False)  # shared experts: not traced
    assert "mixture of experts" in (fake.not_claimed(config, request.architecture, case) or "")
    config, request, case = _case("mistral", 8, 1, 64)  # MistralConfig's sliding_window is 4096
    assert "sliding-window" in (fake.not_claimed(config, request.architecture, case) or "")
    config, request, case = _case("gemma3_text", 8, 1, 64)  # its layer types are modelled
    assert fake.not_claimed(config, request.architecture, case) is None


def test_presets_are_written_back_as_the_config_json_transformers_builds() -> None:
    from zerocalc.base.errors import InputError
    from zerocalc.request.presets import load_model
    from zerocalc.validate.hf_export import hf_config_of

    for name in ("llama-3-8b", "llama-2-7b", "mixtral-8x7b", "qwen3-30b-a3b", "qwen2.5-7b"):
        arch, _ = load_model(name)
        back = architecture_from_hf_dict(hf_config_of(arch, name), name, arch.name)
        assert back.model_dump(exclude={"head_dim", "num_kv_heads"}) == arch.model_dump(
            exclude={"head_dim", "num_kv_heads"}
        )
    with pytest.raises(InputError, match="gpt2"):
        hf_config_of(load_model("gpt2")[0], "--model gpt2")


# ------------------------------------------------------------------------- the real runs (torch)
CI_CASES = [(family, world) for family in ("llama", "qwen3_moe") for world in (2, 8, 64)]


@needs_torch
@pytest.mark.parametrize(("family", "world"), CI_CASES, ids=[f"{f}-w{w}" for f, w in CI_CASES])
def test_the_tracker_agrees_with_the_timeline_to_the_byte(family: str, world: int) -> None:
    from zerocalc.validate import fake_step

    config, request, case = _case(family, world, 1, 256)
    measured, seconds = fake_step.run(config, world, 1, 256, reshard=True, recompute=False)
    result = fake.compare(request, case, measured, seconds, config)
    assert result.not_claimed is None
    assert result.exact, [(line.line, line.measured - line.predicted) for line in result.lines]


@needs_torch
@pytest.mark.parametrize("kept", [OutputKept.STEP, OutputKept.NEXT])
def test_a_loop_that_holds_its_output_agrees_to_the_byte(kept: OutputKept) -> None:
    """``output = model(...)`` held to the step's end, or rebound by the next forward: the logits it holds
    are the timeline's at every phase (full recompute: no DynamicCache)."""
    from zerocalc.validate import fake_step

    config = TINY_CONFIGS["llama"]
    arch = architecture_from_hf_dict(config, "llama", "llama")
    case = fake.FakeCase(
        model="llama", world=8, micro_batch=2, seq_len=128, recompute=Recompute.FULL, reshard=True,
        keep_output=kept,
    )  # fmt: skip
    measured, seconds = fake_step.run(config, 8, 2, 128, True, True, keep_output=kept)
    result = fake.compare(fake.request_for(arch, case), case, measured, seconds, config)
    assert result.not_claimed is None
    assert result.exact, [(line.line, line.measured - line.predicted) for line in result.lines]
    dropped = case.model_copy(update={"keep_output": OutputKept.NONE})
    logits = 2 * 128 * config["vocab_size"] * 2  # b · s · V in bf16
    without = fake.predict(fake.request_for(arch, dropped), dropped)[0]
    assert measured.after_forward - without.after_forward == logits


@needs_torch
def test_torchaos_fp8_all_gather_agrees_to_the_byte_where_no_cast_meets_a_peak() -> None:
    """torchao 0.18 float8 (tensorwise, ``enable_fsdp_float8_all_gather``) on the tiny Llama at world 8: the
    blocks gathered at 1 B per fp8 weight and one fp32 scale per fp8 weight kept between all-gathers, every
    phase to the byte (its casts' transients stay below the loss's peaks here; not claimed in general)."""
    from zerocalc.validate import fake_step

    config = TINY_CONFIGS["llama"]
    arch = architecture_from_hf_dict(config, "llama", "llama")
    case = fake.FakeCase(
        model="llama", world=8, micro_batch=2, seq_len=64, recompute=Recompute.NONE, reshard=True,
        fp8=Fp8RecipeName.TENSORWISE, fp8_all_gather=True,
    )  # fmt: skip
    request = fake.request_for(arch, case)
    measured, seconds = fake_step.run(config, 8, 2, 64, True, False, ("tensorwise", True))
    result = fake.compare(request, case, measured, seconds, config)
    assert result.not_claimed is not None and "fp8 casts" in result.not_claimed
    assert result.exact, [(line.line, line.measured - line.predicted) for line in result.lines]
    plain = fake.predict(
        fake.request_for(arch, case.model_copy(update={"fp8": Fp8RecipeName.NONE, "fp8_all_gather": False})),
        case,
    )[0]
    assert measured.start_allocated - plain.start_allocated == 7 * 2 * 512  # 14 scales, 512 B blocks


LORA_STATE_LINES = ("start_allocated", "after_forward", "after_backward", "optimizer_peak")
"""The lines a LoRA step's model states and saved tensors decide (not the peaks: ``fake.not_claimed``):
the tracker's figures of the tiny Llama, LoRA r 8 (PEFT 0.21, default targets q_proj and v_proj, bf16
base) at b 2 × 64, torch 2.13.0, transformers 5.17.0."""


def _lora_case(world: int) -> tuple[Any, Any, Any]:
    config = TINY_CONFIGS["llama"]
    arch = architecture_from_hf_dict(config, "llama", "llama")
    case = fake.FakeCase(
        model="llama", world=world, micro_batch=2, seq_len=64, recompute=Recompute.NONE, reshard=True,
        lora_rank=8,
    )  # fmt: skip
    return config, fake.request_for(arch, case), case


@pytest.mark.parametrize(("world", "start", "after_backward", "optimizer"),
                         [(8, 132_096, 136_192, 140_288), (64, 34_816, 37_888, 41_984)])  # fmt: skip
def test_a_lora_steps_model_states_are_the_trackers(world: int, start: int, after_backward: int,
                                                    optimizer: int) -> None:  # fmt: skip
    """World 8: the bf16 base's shards 121,344 B, the adapters' AdamW states 16 × 512 B (two per adapter,
    each its own 512 B block), the inputs and buffers; after backward the adapters' sharded fp32 gradients
    (one reduce-scatter output per block), then the foreach temporaries."""
    _, request, case = _lora_case(world)
    predicted = fake.predict(request, case)[0]
    assert (predicted.start_allocated, predicted.after_backward, predicted.optimizer_peak) == (
        start,
        after_backward,
        optimizer,
    )
    assert "LoRA" in (fake.not_claimed(TINY_CONFIGS["llama"], request.architecture, case) or "")


def test_a_lora_steps_saved_tensors_are_the_trackers() -> None:
    """After forward at world 8 the tracker holds 1,663,488 B. FSDP2's MixedPrecisionPolicy gathers the
    fp32 adapters in bf16, so PEFT casts no LoRA input (``x.to(lora_A.weight.dtype)`` is x): per layer
    the bf16 q/v input once (T·h·2 = 128·128·2 = 32,768 B, the frozen base Linears keep none) and two
    bf16 lora_A outputs (T·r·2 = 2,048 B each), where fp32 adapters would keep an fp32 copy per adapter
    (65,536 B) and fp32 outputs (4,096 B): 2 layers × (2 × 69,632 − 32,768 − 2 × 2,048) = 204,800 B
    more, which the prediction held before the adapters' forward dtype came from the precision record."""
    _, request, case = _lora_case(8)
    assert request.forward_weights is not None and request.forward_weights.adapter is DType.BF16
    assert fake.predict(request, case)[0].after_forward == 1_663_488

    arch, shape = request.architecture, activation_shape(request)

    def saved(weights: ForwardWeights) -> int:
        tuning = forward_tuning(arch, request.finetune, weights=weights)
        layers = (tuned_layer(arch, i, shape, 2, Device.CUDA, False, tuning) for i in range(arch.num_layers))
        return sum(n for layer in layers for _, n in layer.saves.saved)

    assert saved(PEFT_ALONE) - saved(request.forward_weights) == 2 * (2 * 69_632 - 32_768 - 2 * 2_048)
    ddp = request.with_(framework=Framework.DDP, strategies=(StrategyName.DDP,))
    assert ddp.forward_weights == PEFT_ALONE  # autocast leaves the fp32 adapters fp32


@needs_torch
@pytest.mark.slow
def test_peft_lora_under_fake_tensors_and_fsdp2_at_world_8() -> None:
    from zerocalc.validate import fake_step

    config, request, case = _lora_case(8)
    measured, seconds = fake_step.run(config, 8, 2, 64, True, False, None, 8)
    result = fake.compare(request, case, measured, seconds, config)
    lines = {line.line: line for line in result.lines}
    exact = [label for label, field in fake.ALLOCATED_LINES if field in LORA_STATE_LINES]
    assert all(lines[label].ok for label in exact), [
        (line.line, line.measured - line.predicted) for line in result.lines
    ]
    assert not result.exact and result.ok  # the activation lines: shown, not claimed


SLOW_CASES = [
    ("llama", 8, "full", True), ("llama", 8, "none", False), ("llama", 64, "full", False),
    ("mixtral", 64, "none", True), ("gemma3_text", 8, "none", True), ("qwen3", 8, "full", True),
]  # fmt: skip


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize(("family", "world", "recompute", "reshard"), SLOW_CASES)
def test_more_families_and_modes_agree(family: str, world: int, recompute: str, reshard: bool) -> None:
    from zerocalc.validate import fake_step

    config, request, case = _case(family, world, 2, 64, recompute=recompute, reshard=reshard)
    measured, seconds = fake_step.run(config, world, 2, 64, reshard=reshard, recompute=recompute == "full")
    result = fake.compare(request, case, measured, seconds, config)
    assert result.not_claimed is None and result.exact, [
        (line.line, line.measured - line.predicted) for line in result.lines
    ]


HELD_OUT = [
    # (what it stands for, family, sizes, world, b, s, recompute, reshard)
    ("Qwen3-30B-A3B, 4 layers, world 2", "qwen3_moe", WIDE_MOE, 2, 2, 128, "none", True),
    ("Qwen3-30B-A3B, 4 layers, world 4", "qwen3_moe", WIDE_MOE, 4, 2, 128, "none", True),
    ("Qwen3-30B-A3B, 4 layers, world 128", "qwen3_moe", WIDE_MOE, 128, 2, 128, "none", True),
    ("Qwen3-30B-A3B without resharding", "qwen3_moe", WIDE_MOE, 2, 2, 128, "none", False),
    ("Mixtral-8x7B, 4 layers, world 6, full recompute", "mixtral", WIDE_MIXTRAL, 6, 2, 128, "full", True),
    ("Mixtral's fp32 forward peak", "mixtral", dict(WIDE_MIXTRAL, vocab_size=512), 8, 4, 256, "none", True),
    ("llama-3-8b world 2, qwen2.5-7b world 3: the LM head", "llama", WIDE_UNTIED, 2, 1, 16, "none", True),
    ("llama-3-8b world 4, s 512: the first norm", "llama", SHORT_DENSE, 4, 1, 128, "none", False),
]  # fmt: skip


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "sizes", "world", "b", "s", "recompute", "reshard"),
    [case[1:] for case in HELD_OUT],
    ids=[f"{c[1]}-w{c[3]}-{c[6]}-{'reshard' if c[7] else 'no-reshard'}" for c in HELD_OUT],
)
def test_the_held_out_shapes_agree_to_the_byte(
    family: str, sizes: dict[str, Any], world: int, b: int, s: int, recompute: str, reshard: bool
) -> None:
    """Each stands for a held-out run that was 0.1-1.6% low (HELD_OUT names it): the real FSDP2 step under
    the tracker, every line exact."""
    from zerocalc.validate import fake_step

    config, request, case = _case(family, world, b, s, recompute=recompute, reshard=reshard, **sizes)
    measured, seconds = fake_step.run(config, world, b, s, reshard=reshard, recompute=recompute == "full")
    result = fake.compare(request, case, measured, seconds, config)
    assert result.exact, [(line.line, line.measured - line.predicted) for line in result.lines]
    assert (result.not_claimed is None) == (recompute == "none")


# --------------------------------------------------------------------------------- dp × tp meshes
TP_CONFIG = dict(TINY_CONFIGS["llama"], tie_word_embeddings=False, num_key_value_heads=8)
"""The tiny llama untied with 8 key/value heads: hidden 128 (8 heads of 16), MLP 320, vocabulary 1,024."""


def _tp_case(world: int, tp: int, **switches: bool) -> fake.FakeCase:
    return fake.FakeCase(model="tiny llama", world=world, micro_batch=1, seq_len=256,
                         recompute=Recompute.NONE, reshard=True, tp=tp, **switches)  # fmt: skip


def test_model_states_on_a_dp_by_tp_mesh_by_hand() -> None:
    """Rank 0 of dp 4 × tp 2: the tp shard, then its dim-0 chunk over dp. Embedding and LM head [1024, 128]
    → 512 → 128 rows (65,536 B); q, k, v [128, 128] → 64 → 16 rows (8,192 B); o [128, 128] → [128, 64]
    → 32 rows (8,192 B); gate, up [320, 128] → 160 → 40 rows (20,480 B); down [128, 320] → [128, 160] →
    32 rows (20,480 B); each norm [128] → 32 elements (128 B, a 512 B block). Gradients: one fp32
    reduce-scatter output per unit, rounded once."""
    arch = architecture_from_hf_dict(TP_CONFIG, "tiny", "tiny")
    block = 4 * 8_192 + 3 * 20_480 + 2 * 512
    params = 2 * 65_536 + 2 * block + 512
    block_grads = (4 * 2_048 + 3 * 5_120 + 2 * 32) * 4  # 94,464 B → 185 blocks of 512 B
    root_grads = (2 * 16_384 + 32) * 4  # 131,200 B → 257 blocks
    assert (block_grads, root_grads) == (184.5 * 512, 256.25 * 512)
    grads = (2 * 185 + 257) * 512
    assert fake.predicted_tracked_states(arch, _tp_case(8, 2)) == fake.TrackedStates(
        params=params, optimizer=2 * params, grads=grads
    )
    assert (params, grads) == (322_048, 321_024)


TP_CASES = [(8, 2), (64, 8)]


@needs_torch
@pytest.mark.parametrize(("world", "tp"), TP_CASES, ids=[f"w{w}-tp{t}" for w, t in TP_CASES])
def test_the_tracker_follows_dtensor_tp_and_fsdp2_on_a_2d_mesh(world: int, tp: int) -> None:
    from zerocalc.validate import fake_step

    arch = architecture_from_hf_dict(TP_CONFIG, "tiny", "tiny")
    case = _tp_case(world, tp)
    phases, states, seconds = fake_step.run_tp(TP_CONFIG, case)
    result = fake.compare_tp(arch, case, phases, states, seconds)
    assert result.exact, [(line.line, line.measured - line.predicted) for line in result.lines]
    assert phases.start_allocated < phases.after_backward < phases.forward_peak


@needs_torch
@pytest.mark.slow
def test_loss_parallel_saves_the_vocab_sharded_log_probabilities() -> None:
    """After forward the cross entropy's saved fp32 log-probabilities are b·s·V/t elements under
    loss_parallel and b·s·V with the logits gathered: 256 × (1,024 − 512) × 4 B less at tp 2."""
    from zerocalc.validate import fake_step

    after = [
        fake_step.run_tp(TP_CONFIG, _tp_case(8, 2, loss_parallel=lp))[0].after_forward for lp in (True, False)
    ]
    assert after[1] - after[0] == 256 * (1_024 - 512) * 4


# ---------------------------------------------------------------------------------------- the CLI
@needs_torch
def test_cli_validate_fake_world_8() -> None:
    result = CliRunner().invoke(app, ["validate", "fake", "--world", "8"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "1 of 1 cases exact to the byte (1 claimed exact): every claimed case is exact" in result.output
    assert "tiny llama: FSDP2 world 8" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())


@needs_torch
def test_cli_validate_fake_json_of_a_config_json(tmp_path: Path) -> None:
    path = tmp_path / "qwen3-moe-tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_CONFIGS["qwen3_moe"]))
    result = CliRunner().invoke(
        app, ["validate", "fake", "--model", str(path), "--world", "4", "-b", "1", "-s", "32", "--json"]
    )
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    (case,) = report["cases"]
    assert case["case"]["model"] == "qwen3-moe-tiny" and case["case"]["world"] == 4
    assert all(line["predicted"] == line["measured"] for line in case["lines"])


@needs_torch
def test_cli_validate_fake_dp_by_tp_json() -> None:
    args = ["fake", "--tp", "2", "--world", "4", "-b", "1", "-s", "32", "--no-sequence-parallel", "--json"]
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    assert report["cases"] == []
    (case,) = report["tp_cases"]
    assert (case["case"]["world"], case["case"]["tp"], case["case"]["sequence_parallel"]) == (4, 2, False)
    assert [line["line"] for line in case["lines"]] == ["sharded params", "optimizer states", "sharded grads"]
    assert all(line["predicted"] == line["measured"] for line in case["lines"])


def test_cli_validate_fake_tp_refuses_a_tied_head(tmp_path: Path) -> None:
    path = tmp_path / "tied" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_CONFIGS["llama"]))  # tie_word_embeddings
    result = CliRunner().invoke(app, ["validate", "fake", "--tp", "2", "--model", str(path)])
    assert result.exit_code == 2, result.output
    assert "tied has an LM head tied to the embedding; --tp builds torchtitan's plan" in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["fake", "--nproc", "4"], "No such option: --nproc"),
        (["fake", "--world", "0"], "--world '0' is not accepted"),
        (["fake", "--world", "8,x"], "--world '8,x' is not accepted"),
        (["fake", "--recompute", "selective"], "--recompute 'selective' is not accepted"),
        (["fake", "--reshard", "maybe"], "--reshard 'maybe' is not accepted"),
        (["fake", "--activations"], "No such option: --activations"),
        (["frameworks", "--world", "8"], "No such option: --world"),
        (["fake", "--model", "gpt2"], "--model 'gpt2' is a gpt2 model"),
        (["fake", "--tp", "3", "--world", "8"], "--tp 3 does not divide --world 8"),
        (
            ["fake", "--tp", "2", "--world", "8", "-s", "537"],
            "--seq-len 537 does not split into --tp 2 sequence-parallel chunks",
        ),
        (["fake", "--tp", "2,x"], "--tp '2,x' is not accepted; accepted: a comma list of whole numbers"),
        (["fake", "-b", "0"], "--micro-batch 0 --seq-len 64 is not accepted; accepted: b ≥ 1 and s ≥ 2"),
        (["fake", "--no-loss-parallel"], "--no-loss-parallel without --tp is not accepted"),
        (["fake", "--tp", "2", "--model", "qwen3-8b"], "TP plan does not cover (k_norm, q_norm)"),
        (["fake", "--fp8", "delayed"], "--fp8 'delayed' is not accepted; accepted: none, tensorwise"),
        (["fake", "--fp8", "rowwise", "--fp8-all-gather"], "--fp8-all-gather with --fp8 rowwise"),
        (["fake", "--lora-rank", "8", "--tp", "2"], "--lora-rank with --tp or --fp8: not built here"),
        (["fake", "--lora-rank", "x"], "--lora-rank 'x' is not accepted; accepted: a whole number"),
    ],
)
def test_cli_validate_fake_refuses_in_one_line(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert says in result.stderr
