"""What a norm keeps for backward, and the final norm's backward transient."""

from __future__ import annotations

from zerocalc.model.architecture import Architecture
from zerocalc.model.code.base import FP32, Device, ModelCode
from zerocalc.model.code.shape import Shape
from zerocalc.model.traits import traits


def norm_saves(
    kind: str, rows: int, width: int, act: int, device: Device, fp32_copy: bool, input_kept: bool = False
) -> list[tuple[str, int]]:
    """Storages a norm over ``rows`` × ``width`` keeps, named (its output, the next op's input, is not
    included). ``input_kept``: the norm reads the layer's input, which the layer keeps anyway
    (:attr:`LayerSaves.keeps_input`), so a storage that *is* that input is not counted again.

    * ``llama`` (``LlamaRMSNorm.forward``): ``x.to(float32)`` (saved by ``pow`` and ``mul``; in fp32 it is
      ``x`` itself), ``rsqrt(var + eps)`` [rows, 1] fp32, ``normalized.to(dtype)`` (saved by ``weight *``);
    * ``gemma`` (``Gemma2RMSNorm`` / ``Gemma3RMSNorm``: ``output * (1.0 + self.weight.float())``): the
      normalised tensor in fp32, and ``1 + weight`` [width] in fp32 (saved by that product);
    * ``olmo`` (``Olmo2RMSNorm``: ``(self.weight * x).to(dtype)``): the normalised tensor in fp32;
    * ``layernorm`` (``native_layer_norm``): its input, and mean and rstd [rows, 1] in fp32 on CUDA (the
      accumulate type) but in the input dtype on the CPU (``aten/src/ATen/native/cpu/layer_norm_kernel.cpp``);
    * fused kernels (megatron, torchtitan ``nn.RMSNorm`` on CUDA: ``_fused_rms_norm``): the input and
      rstd only.
    """
    elements = rows * width
    if kind == "layernorm":
        stats = FP32 if device is Device.CUDA else act
        kept = [("mean", stats * rows), ("rstd", stats * rows)]
        return kept if input_kept else [("input", act * elements), *kept]
    if not fp32_copy:
        return [("input", act * elements), ("rstd (fp32)", FP32 * rows)]
    copy = 0 if act == FP32 and input_kept else FP32 * elements
    normalized = FP32 * elements if kind in ("gemma", "olmo") else act * elements
    parts = [
        ("input in fp32" if act == FP32 else "x.float() copy", copy),
        ("rsqrt (fp32)", FP32 * rows),
        ("normalized (fp32)" if normalized != act * elements or act == FP32 else "normalized", normalized),
    ]
    if kind == "gemma":
        parts.append(("1 + weight (fp32)", FP32 * width))
    return [(name, b) for name, b in parts if b]


def norm_backward_excess(impl: ModelCode, arch: Architecture, shape: Shape, act: int) -> int:
    """The final norm's backward transient: RMSNorm's fp32 input gradient accumulates through pow, mean
    and mul (3 · fp32 · T·h, measured); LayerNorm's: the input gradient (act·T·h); T is the norm's rows
    on the rank (:attr:`Shape.sequence_tokens`)."""
    if not impl.transients:
        return 0
    T, h = shape.sequence_tokens, arch.hidden_size
    if traits(arch).norm == "layernorm":
        return act * T * h
    return 3 * FP32 * T * h if impl.norm_fp32_copy else act * T * h
