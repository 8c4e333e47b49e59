"""The dense Llama block: the one block torchtitan's op-level selective checkpointing
(:mod:`zerocalc.model.code.op_sac`) and torch.compile's saves (:mod:`zerocalc.model.code.compiled`) are
modelled for."""

from __future__ import annotations

from zerocalc.model.architecture import Architecture, BlockLayout, MlpKind, QkNorm, layer_tensors

OP_SAC_MATMUL_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The order torchtitan's Llama block calls its linears (``models/llama3/model/model.py``:
``Attention.forward`` ``self.wq(x), self.wk(x), self.wv(x)`` … ``self.wo(output)``; ``FeedForward.forward``
``self.w2(F.silu(self.w1(x)) * self.w3(x))``), under zerocalc's names of its weights (wq … wo, w1 gate,
w3 up, w2 down). Each is one ``aten.mm`` (``nn.Linear`` without bias on a [b, s, in] input folds to a 2-D
``mm``)."""


def dense_llama_block(arch: Architecture) -> bool:
    """The dense Llama block: pre-norm, separate q, k, v, o, gate, up and down linears (no q/k norm, no
    fused projections, no experts, no latent attention), SwiGLU."""
    return not (
        arch.is_moe
        or arch.latent_attention is not None
        or arch.fused_qkv
        or arch.fused_gate_up
        or arch.qk_norm is not QkNorm.NONE
        or arch.mlp is not MlpKind.SWIGLU
        or arch.block_layout is not BlockLayout.PRE_NORM
        or {
            t.module.rsplit(".", 1)[-1]
            for t in layer_tensors(arch, 0)
            if t.name == "weight" and len(t.shape) == 2
        }
        != set(OP_SAC_MATMUL_ORDER)
    )
