"""torchtune's activation-offloading hook, its pack side written as ``OffloadActivations.pack_tensor``
writes it (torchtune v0.6.0-rc1-220-gbd2a0fc7 ``training/_activation_offloading.py``: an id per pack,
offloaded at ≥ 1024 B and not a parameter, ``fwd_stash`` let go 5 ids later; ``NoOpManager`` around the LM
head), run on CPU over transformers' Llama under gradient checkpointing (``use_reentrant=False``): what it
packs and what its stash still holds after forward are the timeline's (:mod:`zerocalc.peak.offload`)."""

from __future__ import annotations

import pytest
from helpers import tiny_llama_config

from zerocalc.model.code import Device
from zerocalc.peak.offload import FWD_STASH, MIN_OFFLOAD_BYTES
from zerocalc.peak.simulate import activation_bytes, step_shape
from zerocalc.peak.timeline import offloaded_host_bytes
from zerocalc.request.training import parse_options

pytestmark = pytest.mark.slow

S, H, LAYERS = 512, 64, 8
TINY = tiny_llama_config(256, H, LAYERS)


def test_the_hook_packs_each_checkpoint_input_and_the_final_norms_tensors_as_the_timeline_counts() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.autograd.graph import saved_tensors_hooks

    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    packs: list[tuple[int, bool, bool]] = []  # (bytes, offloaded, a parameter)
    stash: dict[int, torch.Tensor] = {}
    tracker: dict[int, torch.Tensor] = {}

    def pack(activation: torch.Tensor) -> int:
        tensor_id = len(packs) + 1
        nbytes = activation.element_size() * activation.nelement()
        parameter = isinstance(activation, torch.nn.Parameter)
        offloaded = nbytes >= MIN_OFFLOAD_BYTES and not parameter
        packs.append((nbytes, offloaded, parameter))
        if offloaded:
            for old in [k for k in stash if k <= tensor_id - FWD_STASH]:
                del stash[old]
            tracker[tensor_id] = activation.detach().to("cpu", copy=True)
            stash[tensor_id] = activation
        else:
            tracker[tensor_id] = activation
        return tensor_id

    def unpack(tensor_id: int) -> torch.Tensor:
        return tracker.pop(tensor_id)

    noop = saved_tensors_hooks(lambda t: t, lambda t: t)
    model.lm_head.register_forward_pre_hook(lambda *args: noop.__enter__())
    model.lm_head.register_forward_hook(lambda *args: noop.__exit__(None, None, None), always_call=True)
    ids = torch.randint(0, 256, (1, S))
    with saved_tensors_hooks(pack, unpack):
        logits = model(input_ids=ids).logits
    T = S
    layer_inputs = [(2 * T * H, True, False)] * LAYERS
    # LlamaRMSNorm: pow saves x.float(); rsqrt its output; mul the output then x.float(); weight * x the
    # normalized tensor then the weight (a parameter: an id, not offloaded)
    final = [(4 * T * H, True, False), (4 * T, True, False), (4 * T, True, False), (4 * T * H, True, False)]
    final += [(2 * T * H, True, False), (2 * H, False, True)]
    assert packs == [(8 * T, True, False), *layer_inputs, *final]  # the indices, 8 inputs, the final norm
    assert sorted(stash) == list(range(LAYERS + 2, LAYERS + 7))  # the final norm's only
    logits.float().sum().backward()
    assert not tracker

    request = parse_options(
        model=TINY, seq_len=S, framework="fsdp2", gpus=1, recompute="full", offload_activations=True
    )
    step = step_shape(request, activation_bytes(request), Device.CUDA)
    assert offloaded_host_bytes(step) == sum(nbytes for nbytes, offloaded, _ in packs if offloaded)
