"""A real ``torch.nn`` transformer built from an :class:`~zerocalc.model.architecture.Architecture` (imports
torch).

Its named parameters are, name for name, shape for shape and in the same order, the list
:func:`zerocalc.model.architecture.parameter_tensors` returns: ``embed_tokens``, ``embed_positions`` (learned
positions), per block ``layers.<i>.input_norm``, ``attn.{q,k,v,o}_proj``, ``post_attention_norm`` and
``mlp.{fc_in,fc_out}`` (GELU) or ``mlp.{gate,up,down}_proj`` (SwiGLU), then ``final_norm`` and ``lm_head``
(absent when tied: the head reuses ``embed_tokens.weight``, counted once). Causal attention with
``scaled_dot_product_attention`` (GQA by repeating k/v heads); no rotary embeddings (they hold no
parameters). Anything beyond these blocks (mixture of experts, latent attention, q/k norms, fused
projections, other norm layouts) is refused with one line (:func:`zerocalc.validate.config.check_buildable`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zerocalc.model.architecture import Architecture, MlpKind, NormKind
from zerocalc.validate.config import check_buildable


def _norm(arch: Architecture) -> nn.Module:
    if arch.norm is NormKind.LAYERNORM:
        return nn.LayerNorm(arch.hidden_size)
    return nn.RMSNorm(arch.hidden_size)


class Attention(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        d, hd = arch.hidden_size, arch.dim_per_head
        self.heads, self.kv_heads, self.head_dim = arch.num_heads, arch.kv_heads, hd
        self.q_proj = nn.Linear(d, arch.num_heads * hd, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(d, arch.kv_heads * hd, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(d, arch.kv_heads * hd, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(arch.num_heads * hd, d, bias=arch.out_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank projects heads / t of them (ColwiseParallel's local
        # output); the ratio of query to key/value heads is the same on every rank
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        d, f, bias = arch.hidden_size, arch.intermediate_size, arch.mlp_bias
        self.gelu = arch.mlp is MlpKind.GELU
        if self.gelu:
            self.fc_in = nn.Linear(d, f, bias=bias)
            self.fc_out = nn.Linear(f, d, bias=bias)
        else:
            self.gate_proj = nn.Linear(d, f, bias=bias)
            self.up_proj = nn.Linear(d, f, bias=bias)
            self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gelu:
            return self.fc_out(F.gelu(self.fc_in(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One transformer block: the FSDP unit."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.input_norm = _norm(arch)
        self.attn = Attention(arch)
        self.post_attention_norm = _norm(arch)
        self.mlp = Mlp(arch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_attention_norm(x))


class Transformer(nn.Module):
    def __init__(self, arch: Architecture):
        super().__init__()
        check_buildable(arch)
        self.tied = arch.tied_embeddings
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.embed_positions = (
            nn.Embedding(arch.max_position_embeddings, arch.hidden_size)
            if arch.learned_position_embeddings
            else None
        )
        self.layers = nn.ModuleList(Block(arch) for _ in range(arch.num_layers))
        self.final_norm = _norm(arch)
        self.lm_head = None if self.tied else nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        if self.embed_positions is not None:
            x = x + self.embed_positions(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        x = self.final_norm(x)
        if self.lm_head is None:
            return F.linear(x, self.embed_tokens.weight)
        return self.lm_head(x)


def build_model(arch: Architecture, seed: int = 0) -> Transformer:
    """The model in fp32 on CPU, with weights from a fixed seed."""
    torch.manual_seed(seed)
    return Transformer(arch)


def loss_fn(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy (in fp32)."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1))
