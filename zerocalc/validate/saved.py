"""``zerocalc validate activations``: the activation profile against what real modules save (pure).

:mod:`zerocalc.model.code` says, per decoder layer and outside the layers, which storages a model's forward
keeps for backward. :mod:`zerocalc.validate.saved_measure` runs the real Hugging Face module on the CPU
under ``torch.autograd.graph.saved_tensors_hooks`` and lists every storage saved, with the region whose
forward first saved it. This module predicts the same regions from the profile and compares them, region
by region, to the byte; within a region the predicted terms and the measured storages are matched by size
so that a mismatch names what is missing or extra.

The profile is written for the ``hf`` model code (transformers 5.17.0): the CPU runs its very modules.
Regions (what the profile predicts there, and why it is first saved there):

* ``embedding``: the input ids (``nn.Embedding`` saves its indices; they are the labels too); GPT-2 also
  its position ids (``wpe``) and the embedding dropout mask;
* ``layer <i>``: :func:`zerocalc.model.code.layer_saves` — plus the layer's input where the layer keeps it
  (``keeps_input``: a LayerNorm or a fp32 RMSNorm saves it), plus, in layer 0, the rotary ``cos`` and
  ``sin`` that every layer's ``q * cos`` saves (:meth:`~zerocalc.model.code.ModelCode.shared_saves`);
  Gemma's embedding scale (:func:`~zerocalc.model.code.embedding_saves`) in ``embedding``;
* ``final``: :meth:`zerocalc.model.code.ModelCode.final_saves` (the final norm and the LM head's input),
  plus the last hidden state where a LayerNorm keeps it;
* ``loss``: :func:`zerocalc.model.code.logits_saves` (Gemma 2's logit soft-capping) and
  :func:`zerocalc.model.code.loss_saves` (``ForCausalLMLoss``: log-softmax output, target,
  ``total_weight``).
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.model.architecture import Architecture
from zerocalc.model.code import (
    FP32,
    INT64,
    MODEL_CODES,
    Compiled,
    Device,
    ForwardTuning,
    ModelImplName,
    Shape,
    compiled_final_saves,
    compiled_loss_saves,
    embedding_saves,
    layer_saves,
    logits_saves,
    loss_saves,
    op_sac_layer,
    traced_mask_saves,
    tuned_embedding_saves,
    tuned_final_saves,
    tuned_shared_saves,
)
from zerocalc.model.traits import traits

ACT_BYTES = {"fp32": FP32, "bf16": 2}
"""Compute dtypes measured: fp32, and bf16 (the parameters every op sees under FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16)``; a bf16-cast model saves the same storages)."""
ATTENTIONS = ("sdpa", "eager")
"""``sdpa``: ``scaled_dot_product_attention`` (on the CPU its flash kernel, with the fp32 log-sum-exp, when
there is no mask and no dropout); ``eager``: the softmax probabilities [b, a, s, s] in fp32 and their cast."""

TOKENS = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
_SIZES = {"vocab_size": 1024, "hidden_size": 128, "intermediate_size": 320, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, **TOKENS}  # fmt: skip
TINY_CONFIGS: dict[str, dict] = {
    "llama": {"model_type": "llama", **_SIZES, "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", **_SIZES},
    "qwen2": {"model_type": "qwen2", **_SIZES},
    "qwen3": {"model_type": "qwen3", **_SIZES},
    "phi3": {"model_type": "phi3", **_SIZES},
    "olmo2": {"model_type": "olmo2", **_SIZES},
    "gemma2": {"model_type": "gemma2", **_SIZES},
    "gemma3_text": {"model_type": "gemma3_text", **_SIZES},
    "mixtral": {"model_type": "mixtral", **_SIZES, "intermediate_size": 192, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen2_moe": {"model_type": "qwen2_moe", **_SIZES, "moe_intermediate_size": 96,
                  "shared_expert_intermediate_size": 256, "num_experts": 4, "num_experts_per_tok": 2,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3_moe": {"model_type": "qwen3_moe", **_SIZES, "moe_intermediate_size": 96, "num_experts": 4,
                  "norm_topk_prob": True,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v3": {"model_type": "deepseek_v3", **{k: v for k, v in _SIZES.items()
                                                    if k not in ("num_key_value_heads", "head_dim")},
                    "num_key_value_heads": 8, "num_hidden_layers": 3, "moe_intermediate_size": 96,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                    "first_k_dense_replace": 1, "n_shared_experts": 1, "q_lora_rank": 64,
                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24},
    "gpt2": {"model_type": "gpt2", "vocab_size": 1024, "n_embd": 128, "n_layer": 2, "n_head": 8,
             "n_positions": 4096, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, **TOKENS},
    "gpt_neox": {"model_type": "gpt_neox", **{k: v for k, v in _SIZES.items()
                                              if k not in ("num_key_value_heads", "head_dim")}},
    "falcon": {"model_type": "falcon", "vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 8, **TOKENS},
    "gpt_oss": {"model_type": "gpt_oss", **_SIZES, "intermediate_size": 192, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 16},
}  # fmt: skip
"""Tiny config.json dicts of every family the ``hf`` profile describes
(``zerocalc.model.hf_config.FAMILIES``):
h ≠ f ≠ V and kv < a where the family has both, so that every term has its own size; dropout 0 (on the
CPU, SDPA with dropout falls back to the math kernel, whose [b, a, s, s] tensors the flash path of a GPU
does not keep)."""


NOT_EXACT: dict[tuple[str, str | None], str] = {
    ("falcon", None): "FalconAttention's layouts are not written out term by term: multi-query k and v "
    "keep one head and broadcast, which SDPA's fused kernels refuse, so its math kernel runs (fp32 copies "
    "of q, k and v and fp32 [b, a, s, s] probabilities, on CUDA as on the CPU) and eager attention's "
    "softmax runs in the compute dtype; the new decoder architecture expands k and v to every head and "
    "hands SDPA a [b, 1, s, s] mask; alibi is not measured",
}
"""Model code the ``hf`` profile does not claim to the byte, keyed by (family, attention or None for
both), with the reason. Measured on the tiny configs (torch 2.13 CPU, transformers 5.17, fp32 and bf16,
b=2 s=64 and b=1 s=48, see docs/validation.md): falcon's predicted saved bytes are −37.0% … +31.7% of the
measured ones. gpt_oss (eager only: ``GptOssPreTrainedModel._supports_sdpa`` is False), deepseek_v3 and
gemma2 eager are exact with their records' traits (``zerocalc.model.hf_config`` ``FAMILIES``); Llama's
terms in their place give −20.7% … −6.9%, −5.3% … +0.7% and −9.6% … −5.1%."""


def not_exact_reason(family: str, attention: str) -> str | None:
    """Why the profile is not claimed exact for this family and attention (None: it is claimed exact)."""
    return NOT_EXACT.get((family, attention)) or NOT_EXACT.get((family, None))


class MeasuredStorage(BaseModel):
    """One storage an autograd node saved in the forward (the first save of it)."""

    model_config = ConfigDict(frozen=True)

    region: str = Field(description="embedding, layer <i>, final or loss: whose forward saved it first")
    bytes: int
    dtype: str
    shape: tuple[int, ...] = Field(description="of the tensor saved (a view: its storage may be larger)")
    saved_by: str = Field(default="", description="the autograd nodes that keep it (Mm, Pow, ...)")


class Term(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    bytes: int


class RegionResult(BaseModel):
    """One region: predicted terms and measured storages, and what of each the other side lacks."""

    model_config = ConfigDict(frozen=True)

    region: str
    predicted: int
    measured: int
    terms: tuple[Term, ...]
    storages: tuple[MeasuredStorage, ...]
    unmatched_terms: tuple[Term, ...] = Field(description="terms no storage matches in size")
    unmatched_storages: tuple[MeasuredStorage, ...] = Field(description="measured storages no term explains")

    @property
    def difference(self) -> int:
        return self.measured - self.predicted

    @property
    def ok(self) -> bool:
        return self.measured == self.predicted


class SavedCase(BaseModel):
    """One model × dtype × attention × micro-batch, region by region."""

    model_config = ConfigDict(frozen=True)

    model: str
    family: str
    dtype: str
    attention: str
    micro_batch: int
    seq_len: int
    tuning: str = Field(default="", description="the fine-tuning measured (empty: full training)")
    compiled: str = Field(
        default="", description="torch.compile's setting and the model code, recompute (empty: eager hf)"
    )
    regions: tuple[RegionResult, ...]
    not_exact: str | None = Field(
        default=None, description="why the profile is not claimed exact here (reported, not failed)"
    )

    @property
    def predicted(self) -> int:
        return sum(r.predicted for r in self.regions)

    @property
    def measured(self) -> int:
        return sum(r.measured for r in self.regions)

    @property
    def exact(self) -> bool:
        return all(r.ok for r in self.regions)

    @property
    def ok(self) -> bool:
        """Exact to the byte, or not claimed exact."""
        return self.exact or self.not_exact is not None


class SavedReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    torch: str
    transformers: str
    peft: str = ""
    bitsandbytes: str = ""
    cases: tuple[SavedCase, ...]
    all_match: bool


def predict_regions(
    arch: Architecture, shape: Shape, dtype: str, attention: str, tuning: ForwardTuning | None = None
) -> dict[str, list[Term]]:
    """What the ``hf`` profile says each region's forward saves first (see the module docstring), on the CPU
    (LayerNorm statistics and dropout noise in the compute dtype:
    :data:`zerocalc.model.code.Device`); under ``tuning`` a fine-tuning run's (:func:`tuned_regions`)."""
    if tuning is not None:
        return tuned_regions(arch, shape, dtype, attention, tuning)
    impl = MODEL_CODES[ModelImplName.HF]
    act = ACT_BYTES[dtype]
    device = Device.CPU
    T, h = shape.tokens, arch.hidden_size
    rotary = traits(arch).rotary
    regions: dict[str, list[Term]] = {"embedding": [Term(name="input ids (= labels)", bytes=INT64 * T)]}
    regions["embedding"] += [Term(name=n, bytes=b) for n, b in embedding_saves(impl, arch, act)]
    shared = [Term(name=n, bytes=b) for n, b in impl.shared_saves(arch, shape, act, False, device) if b]
    if not rotary:
        regions["embedding"] += shared
    for i in range(arch.num_layers):
        saves = layer_saves(impl, arch, i, shape, act, device, use_cache=True, flash=attention == "sdpa")
        terms = [Term(name=n, bytes=b) for n, b in saves.saved if b]
        if saves.keeps_input:
            terms.insert(0, Term(name="layer input (kept by its first op)", bytes=act * T * h))
        if i == 0 and rotary:
            terms += shared
        regions[f"layer {i}"] = terms
    final = [Term(name=n, bytes=b) for n, b in impl.final_saves(arch, shape, act, device) if b]
    if traits(arch).norm == "layernorm":
        final.insert(0, Term(name="final norm: input (the last hidden state)", bytes=act * T * h))
    regions["final"] = final
    loss = logits_saves(impl, arch, shape, act) + loss_saves(impl, arch, shape)
    regions["loss"] = [Term(name=n, bytes=b) for n, b in loss if b]
    return regions


def tuned_regions(
    arch: Architecture, shape: Shape, dtype: str, attention: str, tuning: ForwardTuning
) -> dict[str, list[Term]]:
    """A fine-tuning run's regions (:mod:`zerocalc.model.code.finetune`): the embedding's indices where its
    weight is trained; each layer's saves, its input where the layer keeps it, and the rotary cos and sin
    in the first layer that keeps them; the final norm's and the LM head's; the loss's as in full
    training."""
    impl = MODEL_CODES[ModelImplName.HF]
    act = ACT_BYTES[dtype]
    device = Device.CPU
    T, h = shape.tokens, arch.hidden_size
    stream = FP32 if tuning.fp32_stream else act
    regions: dict[str, list[Term]] = {
        "embedding": [Term(name=n, bytes=b) for n, b in tuned_embedding_saves(arch, shape, tuning)]
    }
    rotary_layer, shared = tuned_shared_saves(arch, shape, act, device, tuning)
    for i in range(arch.num_layers):
        saves = layer_saves(impl, arch, i, shape, act, device, flash=attention == "sdpa", tuning=tuning)
        terms = [Term(name=n, bytes=b) for n, b in saves.saved if b]
        if saves.keeps_input:
            terms.insert(0, Term(name="layer input (kept by its first op)", bytes=stream * T * h))
        if i == rotary_layer:
            terms += [Term(name=n, bytes=b) for n, b in shared]
        regions[f"layer {i}"] = terms
    final, keeps_last = tuned_final_saves(arch, shape, act, device, tuning)
    regions["final"] = [Term(name=n, bytes=b) for n, b in final if b]
    if keeps_last:
        regions["final"].insert(
            0, Term(name="final norm: input (the last hidden state)", bytes=stream * T * h)
        )
    loss = logits_saves(impl, arch, shape, act) + loss_saves(impl, arch, shape)
    regions["loss"] = [Term(name=n, bytes=b) for n, b in loss if b]
    return regions


def _match(terms: list[Term], storages: list[MeasuredStorage]) -> tuple[list[Term], list[MeasuredStorage]]:
    """Pair terms and storages of equal size; return what is left on each side."""
    sizes = Counter(s.bytes for s in storages)
    unmatched_terms = []
    for term in terms:
        if sizes[term.bytes] > 0:
            sizes[term.bytes] -= 1
        else:
            unmatched_terms.append(term)
    wanted = Counter(t.bytes for t in terms)
    unmatched_storages = []
    for storage in storages:
        if wanted[storage.bytes] > 0:
            wanted[storage.bytes] -= 1
        else:
            unmatched_storages.append(storage)
    return unmatched_terms, unmatched_storages


def compare(
    model: str,
    arch: Architecture,
    shape: Shape,
    dtype: str,
    attention: str,
    measured: list[MeasuredStorage],
    tuning: ForwardTuning | None = None,
    tuning_label: str = "",
) -> SavedCase:
    """Region by region: the profile's bytes against the measured storages."""
    predicted = predict_regions(arch, shape, dtype, attention, tuning)
    family = arch.family or ""
    case = SavedCase(
        model=model, family=family, not_exact=not_exact_reason(family, attention), dtype=dtype,
        attention=attention, micro_batch=shape.b, seq_len=shape.s, tuning=tuning_label, regions=(),
    )  # fmt: skip
    return with_regions(case, predicted, measured)


def with_regions(
    case: SavedCase, predicted: dict[str, list[Term]], measured: list[MeasuredStorage]
) -> SavedCase:
    """``case`` with its regions: the predicted terms against the measured storages, region by region
    (a region only one side has is compared with nothing)."""
    names = list(predicted) + [m.region for m in measured if m.region not in predicted]
    regions = []
    for name in dict.fromkeys(names):
        terms = predicted.get(name, [])
        storages = [m for m in measured if m.region == name]
        unmatched_terms, unmatched_storages = _match(terms, storages)
        regions.append(
            RegionResult(
                region=name,
                predicted=sum(t.bytes for t in terms),
                measured=sum(s.bytes for s in storages),
                terms=tuple(terms),
                storages=tuple(storages),
                unmatched_terms=tuple(unmatched_terms),
                unmatched_storages=tuple(unmatched_storages),
            )
        )
    return case.model_copy(update={"regions": tuple(regions)})


def predict_compiled_regions(
    code: str,
    arch: Architecture,
    shape: Shape,
    dtype: str,
    recompute: str,
    compiled: Compiled,
    fp8: bool = False,
) -> dict[str, list[Term]]:
    """What zerocalc says a compiled step saves (:mod:`zerocalc.model.code.compiled`), in the regions
    :mod:`zerocalc.validate.compiled` measures, on one rank.

    ``torchtitan`` (per-block compile): ``embedding``, the token ids (``nn.Embedding`` saves its
    indices); ``layer <i>``, a compiled block's saves (:func:`~zerocalc.model.code.layer_saves` with
    ``compiled``), under ``full`` its input only, under ``op`` its input and the policy's kept outputs
    (:func:`~zerocalc.model.code.op_sac_layer`); ``loss``: the compiled loss's logits, labels and
    :func:`~zerocalc.model.code.compiled_loss_saves`, or eager's ``log_softmax`` output, labels and
    ``total_weight``. The final norm and head stay eager (CPU's composite ``nn.RMSNorm``): not predicted.
    ``hf`` (the whole forward one graph): every term in ``compiled forward``: the input ids, the traced
    causal mask, each layer's compiled saves, the final norm's input and rstd, the LM head's input, and
    the compiled loss's logits, padded labels, row statistics and fp32 scalar. ``fp8``: torchtitan's
    blocks with torchao's tensorwise ``Float8Linear`` (``fp8_matmuls``)."""
    act = ACT_BYTES[dtype]
    T, h, V = shape.tokens, arch.hidden_size, arch.vocab_size
    impl = MODEL_CODES[ModelImplName(code)]

    def terms(saves: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> list[Term]:
        return [Term(name=n, bytes=b) for n, b in saves if b]

    layers: dict[str, list[Term]] = {}
    R = shape.sequence_tokens  # the block input's rows on this rank (b·s on one rank)
    for i in range(arch.num_layers):
        if recompute == "full":
            layers[f"layer {i}"] = [Term(name="layer input (the checkpoint's)", bytes=act * R * h)]
        elif recompute == "op":
            op = op_sac_layer(impl, arch, i, shape, act, compiled.model, fp8)
            layers[f"layer {i}"] = [Term(name="layer input (the checkpoint's)", bytes=act * R * h)]
            layers[f"layer {i}"] += terms(op.kept)
        else:
            saves = layer_saves(impl, arch, i, shape, act, compiled=compiled.model, fp8_matmuls=fp8)
            layers[f"layer {i}"] = terms(saves.saved)
    ids = [Term(name="input ids", bytes=INT64 * T)]
    if code == ModelImplName.TORCHTITAN:
        labels = Term(name="labels", bytes=INT64 * T)
        if compiled.loss:
            loss = [Term(name="logits", bytes=act * T * V), labels, *terms(compiled_loss_saves(T))]
        else:
            loss = [Term(name="log_softmax output (fp32)", bytes=FP32 * T * V), labels]
            loss.append(Term(name="total_weight (fp32)", bytes=FP32))
        return {"embedding": ids, **layers, "loss": loss}
    whole = ids + terms(traced_mask_saves(shape.b, shape.s, act))
    for layer in layers.values():
        whole += layer
    final = impl.final_saves(arch, shape, act, Device.CPU)
    whole += terms(compiled_final_saves(list(final), act, T, h))
    whole += [Term(name="logits", bytes=act * T * V), *terms(compiled_loss_saves(T))]
    whole += [Term(name="labels padded", bytes=INT64 * shape.b * (shape.s + 1))]
    whole += [Term(name="total_weight (fp32)", bytes=FP32)]
    return {"compiled forward": whole}
