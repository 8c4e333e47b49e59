"""A model's blocks of one kind hold the same tensors under their own prefixes: ``layer_tensors`` builds the
first block of each kind (MoE or dense) per architecture and renames it for the others, and
``expert_parameters`` counts one MoE block's experts times the MoE blocks. Each is checked here against
the block built from the architecture itself, for every block of dense, MoE, partly dense MoE, tensor-,
expert- and pipeline-parallel shares of the presets."""

from __future__ import annotations

import pytest

from zerocalc.model.architecture import (
    _BLOCKS,
    _block_tensors,
    embedding_tensors,
    expert_parameters,
    head_tensors,
    is_expert_tensor,
    layer_tensors,
    parameter_tensors,
)
from zerocalc.request.training import parse_options

SHARES = [
    ("llama-3-8b", "1", "1", "1"),
    ("llama-3-8b", "4", "1", "2"),
    ("gpt2", "1", "1", "1"),
    ("qwen3-30b-a3b", "2", "4", "1"),
    ("qwen3-30b-a3b", "1", "8", "4"),
    ("deepseek-v3", "1", "8", "1"),
]


def _architectures(model: str, tp: str, ep: str, pp: str) -> list:
    request = parse_options(
        model=model, gpus=64, gpu="h100-80gb", framework="megatron", tp=tp, ep=ep, pp=pp,
        sequence_parallel=tp != "1",  # Megatron-LM's MoE layer refuses TP without it
    )  # fmt: skip
    return [request.model.architecture, request.architecture, *(s.architecture for s in request.stages)]


@pytest.mark.parametrize("share", SHARES, ids=["-".join(s) for s in SHARES])
def test_every_block_is_the_block_built(share: tuple[str, str, str, str]) -> None:
    for arch in _architectures(*share):
        for order in (range(arch.num_layers), range(arch.num_layers - 1, -1, -1)):  # either block first
            _BLOCKS.clear()
            for index in order:
                built = _block_tensors(arch, index)
                assert layer_tensors(arch, index) == built
                assert all(t.module.startswith(f"layers.{index}.") for t in built)


@pytest.mark.parametrize("share", SHARES, ids=["-".join(s) for s in SHARES])
def test_experts_counted_from_one_block(share: tuple[str, str, str, str]) -> None:
    for arch in _architectures(*share):
        every = sum(t.numel for t in parameter_tensors(arch) if is_expert_tensor(t)) if arch.is_moe else 0
        assert expert_parameters(arch) == every
        if arch.is_moe:
            assert every > 0


def test_a_caller_cannot_change_the_kept_tensors() -> None:
    (arch,) = _architectures("llama-3-8b", "1", "1", "1")[:1]
    for tensors_of in (embedding_tensors, head_tensors, lambda a: layer_tensors(a, 0)):
        first = tensors_of(arch)
        first.clear()
        assert tensors_of(arch)
