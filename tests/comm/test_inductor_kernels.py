"""The compiled-kernel rules of ``zerocalc/compute/ops.py`` against Inductor's generated code (torch 2.13,
CPU backend): a torchtitan v0.2.2 ``TransformerBlock`` written out in its model code's layout and
torchtitan's ``cross_entropy_loss``, compiled, run forward and backward; each generated kernel's buffers
read and written (its C++ signature's ``in_ptr``/``out_ptr``/``in_out_ptr``, the element count of each
buffer's allocation, its element size from the signature) summed and compared with the rules' bytes."""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

H, HEADS, KV, F, S = 256, 4, 2, 768, 128
D = H // HEADS
ELEMENT = {"at::BFloat16": 2, "float": 4, "at::Half": 2, "int64_t": 8, "bool": 1, "double": 8}


def _numel(shape: str) -> int:
    return math.prod(int(p) for p in shape.split(",") if p.strip())


def kernel_bytes(code: str) -> int:
    """Bytes every generated kernel of one graph reads and writes, each buffer once per kernel."""
    sizes = {m[1]: _numel(m[2]) for m in re.finditer(r"(\w+) = empty_strided_cpu\(\(([^)]*)\)", code)}
    for m in re.finditer(r"assert_size_stride\((\w+), \(([^)]*)\)", code):
        sizes.setdefault(m[1], _numel(m[2]))
    for _ in range(3):  # buffers reused or viewed under another name
        for m in re.finditer(r"^\s*(\w+) = reinterpret_tensor\((\w+), \(([^)]*)\)", code, re.M):
            sizes.setdefault(m[1], _numel(m[3]))
        for m in re.finditer(r"^\s*(\w+) = (\w+)(;|$)", code, re.M):
            if m[2] in sizes:
                sizes.setdefault(m[1], sizes[m[2]])
    total = 0
    body = code[code.index("def call") :]
    for call in re.finditer(r"^\s*(cpp_fused\w+)\((.*)\)\s*$", body, re.M):
        source = code[code.index(f"{call[1]} = async_compile") :]
        header = source[: source.index("{")]
        types = re.findall(r"((?:const )?[\w:]+)\* ?(in_out_ptr\d+|in_ptr\d+|out_ptr\d+)", header)
        args = re.findall(r"reinterpret_tensor\((\w+), \(([^)]*)\)|(\w+)", call[2])
        for (viewed, shape, plain), (kind, role) in zip(args, types, strict=True):
            n = _numel(shape) if viewed else sizes[plain]
            total += n * ELEMENT[kind.replace("const ", "")] * (2 if role.startswith("in_out") else 1)
    return total


def _compiled(fn, *args):
    from torch._inductor.utils import run_and_get_code

    _, codes = run_and_get_code(fn, *args)
    return [kernel_bytes(code) for code in codes]


def _block_arch():
    """A Llama of the test's sizes (GQA), for validate's torchtitan v0.2.2 ``TransformerBlock``."""
    from zerocalc.model.hf_config import architecture_from_hf_dict

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "intermediate_size": F,
        "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": S,
    }  # fmt: skip
    return architecture_from_hf_dict(config, "config.json", "tiny")


def test_a_compiled_torchtitan_blocks_kernels_move_the_rules_bytes() -> None:
    """Per element of h (T·h), f (T·f) and q, k (rotated): forward the norms and residual adds 18,
    SwiGLU 6, the rotary's generated kernels 12 (``.float()`` r2 w4, ``type_as`` r4 w2; the complex
    product runs as ATen's); backward 30 (16 + 2·3 + 4·2), 10, 12: within 1% (the rest the rstd's floats,
    the norms' weights and gradients, the attention's log-sum-exp)."""
    from zerocalc.compute.ops import COMPILED_BLOCK_BACKWARD, COMPILED_BLOCK_FORWARD, COMPILED_SWIGLU_BACKWARD
    from zerocalc.validate.compiled import TransformerBlock, precompute_freqs_cis

    torch.manual_seed(0)
    block = torch.compile(TransformerBlock(_block_arch()).to(torch.bfloat16), fullgraph=True)
    x = torch.randn(1, S, H, dtype=torch.bfloat16, requires_grad=True)
    freqs_cis = precompute_freqs_cis(D, S)

    def step() -> None:
        out = block(x, freqs_cis)
        out.backward(torch.ones_like(out))

    forward, backward = _compiled(step)
    th, tf, rotated = S * H, S * F, S * (HEADS + KV) * D
    assert forward == pytest.approx(COMPILED_BLOCK_FORWARD * th + 6 * tf + 12 * rotated, rel=0.01)
    block_backward = COMPILED_BLOCK_BACKWARD + 2 * 3 + 4 * 2
    assert backward == pytest.approx(
        block_backward * th + COMPILED_SWIGLU_BACKWARD * tf + 12 * rotated, rel=0.01
    )


def test_torchtitans_compiled_loss_reads_the_logits_once_each_way() -> None:
    """``cross_entropy(pred.flatten(0, 1).float(), labels, reduction="sum")``: forward r2 per logit (the
    CPU backend's two passes over one buffer counted once, as CUDA's online softmax reads it), backward r2
    w2: within 1% (the rest the labels and the rows' statistics)."""
    from zerocalc.compute.ops import COMPILED_LOSS_BACKWARD, COMPILED_LOSS_FORWARD
    from zerocalc.validate.compiled import cross_entropy_loss

    vocab = 1024
    pred = torch.randn(1, S, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, S))
    compiled = torch.compile(cross_entropy_loss)
    forward, backward = _compiled(lambda: compiled(pred, labels).backward())
    assert forward == pytest.approx(COMPILED_LOSS_FORWARD * S * vocab, rel=0.01)
    assert backward == pytest.approx(COMPILED_LOSS_BACKWARD * S * vocab, rel=0.01)
