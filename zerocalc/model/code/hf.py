"""``hf``: Hugging Face transformers 5.17.0 (``models/<family>/modeling_<family>.py``,
``loss/loss_utils.py::ForCausalLMLoss``, ``integrations/sdpa_attention.py``, ``integrations/moe.py``),
measured op by op with ``torch.autograd.graph.saved_tensors_hooks`` on CPU for Llama, Qwen2, GPT-2, Mixtral
and Qwen2-MoE (exact to the byte) and checked against eight H100 runs (every phase exact).

Under tensor parallelism (transformers 5.17 ``base_model_tp_plan``: q/k/v, gate/up ``colwise``, o/down
``rowwise``, ``distributed/tensor_parallel.py`` DTensor styles; no sequence parallelism, the norms
replicated) the column-parallel linears keep the replicated input, L·h. Families whose plan differs
(gathered or packed outputs, mixture-of-experts, no plan) are refused
(:func:`~zerocalc.model.code.parallel.dense_plan_unsupported`).
"""

from __future__ import annotations

from zerocalc.model.architecture import Architecture
from zerocalc.model.code.attention import SDPA_NO_MASK
from zerocalc.model.code.base import (
    AttentionKernel,
    Device,
    LayerSaves,
    ModelCode,
    ModelImplName,
    Program,
    Saves,
    Transient,
    Ulysses,
)
from zerocalc.model.code.layer import module_layer
from zerocalc.model.code.outside import module_final_saves, module_shared_saves
from zerocalc.model.code.parallel import dense_plan_unsupported, torch_context_parallel_transients
from zerocalc.model.code.program import transformers_program
from zerocalc.model.code.shape import Shape

HF_ATTENTION: dict[str, str] = {
    "llama": "models/llama/modeling_llama.py",
    "mistral": "models/mistral/modeling_mistral.py",
    "mixtral": "models/mixtral/modeling_mixtral.py",
    "qwen2": "models/qwen2/modeling_qwen2.py",
    "gpt2": "models/gpt2/modeling_gpt2.py",
    "gemma2": "models/gemma2/modeling_gemma2.py",
    "gemma3_text": "models/gemma3/modeling_gemma3.py",
    "phi3": "models/phi3/modeling_phi3.py",
    "qwen3": "models/qwen3/modeling_qwen3.py",
    "qwen3_moe": "models/qwen3_moe/modeling_qwen3_moe.py",
    "qwen2_moe": "models/qwen2_moe/modeling_qwen2_moe.py",
    "deepseek_v3": "models/deepseek_v3/modeling_deepseek_v3.py",
    "olmo2": "models/olmo2/modeling_olmo2.py",
    "falcon": "models/falcon/modeling_falcon.py",
    "gpt_neox": "models/gpt_neox/modeling_gpt_neox.py",
}
"""The transformers 5.17 modeling file of each family: every one runs attention through SDPA by default
(``_supports_sdpa``; ``ALL_ATTENTION_FUNCTIONS["sdpa"]``, Falcon's ``FalconAttention`` calls
``scaled_dot_product_attention`` itself) with ``create_causal_mask``'s result, None for a causal training
batch without padding: SDPA gets ``is_causal`` and no mask (:data:`~zerocalc.model.code.attention.
SDPA_NO_MASK`)."""

HF_EAGER_ONLY: dict[str, str] = {"gpt_oss": "models/gpt_oss/modeling_gpt_oss.py"}
"""The transformers 5.17 families whose code has no SDPA path (``GptOssPreTrainedModel._supports_sdpa =
False``; ``from_config`` then builds eager attention, and ``attn_implementation="sdpa"`` is refused): eager
attention unless a flash or flex kernel is asked for."""


class HfCode(ModelCode):
    """Hugging Face transformers: the family's modeling file, trained as ``from_config`` builds it."""

    name = ModelImplName.HF
    title = "Hugging Face transformers"
    library = "transformers 5.17.0"
    source = (
        "transformers 5.17.0 modeling_<family>.py, loss_utils.ForCausalLMLoss, sdpa_attention, "
        "moe (measured with saved_tensors_hooks; eight H100 runs reproduced)"
    )
    norm_fp32_copy = True
    """``LlamaRMSNorm.forward`` (and its copies): ``x.to(float32)``, kept by ``pow`` and ``mul``."""
    kv_cache_copies = True
    """``use_cache`` defaults to True in training forwards too: ``DynamicLayer.update`` concatenates k and
    v into the cache, and attention keeps those copies."""
    embedding_output_alive = True
    """``LlamaModel.forward``'s ``inputs_embeds`` stays referenced until the base model returns."""
    transformers_modules = True
    loss = "hf_upcast"
    """``ForCausalLMLoss``: ``logits.float()``, then cross-entropy on the shifted labels."""
    loss_savers = True
    transients = True
    """Measured on CPU op by op (the same aten ops run on CUDA)."""
    fused_kernels = False
    sequence_parallel = False
    """``base_model_tp_plan`` leaves the norms replicated: no sequence-parallel plan."""
    ulysses = Ulysses.REPEATS_KV
    """DeepSpeed's ``UlyssesSPAttentionHF`` wraps transformers' attention."""
    sharded_logits = False
    """``lm_head`` is ``colwise_gather_output`` (``LlamaForCausalLM._tp_plan``): every rank holds all V
    columns."""
    pads_vocab = False
    loss_parallel_fp32_copies = 0
    saves_received_input = False
    op_sac_memory = False

    def default_attention(self, arch: Architecture) -> tuple[AttentionKernel, str]:
        """SDPA with no mask for every family of :data:`HF_ATTENTION` (flash); eager for the families of
        :data:`HF_EAGER_ONLY` and for an architecture with no transformers family (a GPT-3 preset): the
        softmax kept."""
        eager_only = HF_EAGER_ONLY.get(arch.family or "")
        if eager_only is not None:
            return AttentionKernel.EAGER, f"transformers 5.17 {eager_only}: _supports_sdpa = False, eager"
        source = HF_ATTENTION.get(arch.family or "")
        if source is None:
            return AttentionKernel.EAGER, "no transformers code for this architecture"
        return AttentionKernel.FLASH, f"transformers 5.17 {source}: {SDPA_NO_MASK}"

    def layer(
        self,
        arch: Architecture,
        index: int,
        shape: Shape,
        act: int,
        device: Device,
        use_cache: bool,
        flash: bool,
    ) -> LayerSaves:
        """The modules' saved tensors (:func:`~zerocalc.model.code.layer.module_layer`)."""
        return module_layer(self, arch, index, shape, act, device, use_cache, flash)

    def forward_program(
        self,
        arch: Architecture,
        index: int,
        shape: Shape,
        act: int,
        copies: bool,
        flash: bool,
        saved: tuple[tuple[str, int], ...],
        device: Device,
    ) -> Program:
        """The Llama family's and GPT-2's decoder layers op by op
        (:func:`~zerocalc.model.code.program.transformers_program`)."""
        return transformers_program(arch, index, shape, act, copies, flash, saved, device)

    def shared_saves(
        self, arch: Architecture, shape: Shape, act: int, checkpointed: bool, device: Device
    ) -> Saves:
        """The rotary tables or GPT-2's position ids (:func:`~zerocalc.model.code.outside.
        module_shared_saves`)."""
        return module_shared_saves(arch, shape, act, checkpointed, device)

    def final_saves(self, arch: Architecture, shape: Shape, act: int, device: Device) -> Saves:
        """The final norm's tensors and the replicated LM head input (:func:`~zerocalc.model.code.outside.
        module_final_saves`)."""
        return module_final_saves(self, arch, shape, act, device)

    def embedding_excess(self, arch: Architecture, shape: Shape, act: int) -> int:
        """The embedding has no tensor-parallel plan (replicated): nothing."""
        return 0

    def tensor_parallel_unsupported(self, arch: Architecture, shape: Shape) -> str | None:
        """No sequence parallelism (:attr:`sequence_parallel`), and the dense plan only."""
        if shape.sequence_parallel and not self.sequence_parallel:
            return (
                "transformers' tensor-parallel plans have no sequence parallelism (the norms are replicated)"
            )
        return dense_plan_unsupported(self, arch)

    def tensor_parallel_transients(self, arch: Architecture, shape: Shape, act: int) -> tuple[Transient, ...]:
        """None beyond the layer's measured excess, which holds the reductions' buffers
        (:func:`~zerocalc.model.code.excess.tensor_parallel_forward_excess`)."""
        return ()

    def context_parallel_transients(
        self, arch: Architecture, shape: Shape, act: int
    ) -> tuple[Transient, ...]:
        """accelerate's torch context parallelism (:func:`~zerocalc.model.code.parallel.
        torch_context_parallel_transients`)."""
        return torch_context_parallel_transients(arch, shape, act)


HF = HfCode()
