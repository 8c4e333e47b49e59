"""The precision record: which dtype every tensor of a step is kept in.

A :class:`PrecisionRecipe` (``--precision``) names the recipe's dtypes: the compute copy of the
parameters, the gradients backward produces, the master copy and the optimizer states. The bytes per
parameter follow the ZeRO paper (Rajbhandari et al. 2020, section 3.1): mixed-precision Adam keeps 2-byte
parameters and gradients (b_p = b_g = 2) and K = 12 bytes of optimizer state (a 4-byte fp32 master copy
plus 4-byte m and v). The optimizer's own states are counted by ``zerocalc.parallel.optimizers``.

How a framework keeps those tensors is its :class:`ParamLayout` (a field of its record,
:mod:`zerocalc.parallel.framework_records`): 16-bit parameters beside an fp32 master copy (the paper,
DeepSpeed, Megatron-LM), or fp32 parameters cast for compute (PyTorch's FSDP, DDP's autocast). Given the
recipe, the layout and the kind of parameter, :func:`tensor_dtypes` returns the dtype of every
:class:`~zerocalc.base.dtypes.TensorRole` — the one place every memory, communication and time model asks.
A new recipe is an entry of :data:`RECIPES`; a new kind of parameter (frozen, quantised) an entry of
:data:`KIND_RULES`; an FP8 recipe (``--fp8``, on top of the 16-bit recipe) an entry of :data:`FP8_RECIPES`,
which changes the roles of the Linear weights it converts by its library's rule (:data:`FP8_RULES`).
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from zerocalc.base.dtypes import DType, TensorRole


class PrecisionName(StrEnum):
    BF16_MIXED = "bf16-mixed"
    FP16_MIXED = "fp16-mixed"
    FP32 = "fp32"
    BF16_PURE = "bf16-pure"


class PrecisionRecipe(NamedTuple):
    """Which dtype each model-state tensor is kept in."""

    name: PrecisionName
    param_dtype: DType
    """Compute copy of the parameters (b_p = its size)."""
    grad_dtype: DType
    """Gradients as produced by backward and reduced across ranks (b_g = its size)."""
    master_dtype: DType | None
    """fp32 master copy of the parameters kept by the optimizer, or None when it updates them in place."""
    optimizer_state_dtype: DType
    """Dtype of the optimizer's full-precision states (Adam's m and v, SGD's momentum)."""
    note: str


RECIPES: dict[PrecisionName, PrecisionRecipe] = {
    recipe.name: recipe
    for recipe in (
        PrecisionRecipe(
            name=PrecisionName.BF16_MIXED,
            param_dtype=DType.BF16,
            grad_dtype=DType.BF16,
            master_dtype=DType.FP32,
            optimizer_state_dtype=DType.FP32,
            note="bf16 parameters and gradients, fp32 master weights and optimizer states (ZeRO paper §3.1)",
        ),
        PrecisionRecipe(
            name=PrecisionName.FP16_MIXED,
            param_dtype=DType.FP16,
            grad_dtype=DType.FP16,
            master_dtype=DType.FP32,
            optimizer_state_dtype=DType.FP32,
            note=(
                "fp16 parameters and gradients, fp32 master weights and optimizer states; dynamic loss "
                "scaling keeps one scalar, no per-parameter state (Micikevicius et al. 2018)"
            ),
        ),
        PrecisionRecipe(
            name=PrecisionName.FP32,
            param_dtype=DType.FP32,
            grad_dtype=DType.FP32,
            master_dtype=None,
            optimizer_state_dtype=DType.FP32,
            note="fp32 everywhere; the parameters are their own master copy",
        ),
        PrecisionRecipe(
            name=PrecisionName.BF16_PURE,
            param_dtype=DType.BF16,
            grad_dtype=DType.BF16,
            master_dtype=None,
            optimizer_state_dtype=DType.BF16,
            note="bf16 parameters, gradients and optimizer states, no fp32 master copy",
        ),
    )
}


class ParamLayout(StrEnum):
    """How a framework keeps the parameters a recipe names (a field of each framework's record)."""

    MASTER_COPY = "master_copy"
    """Parameters and gradients in the recipe's 16-bit dtype, a separate fp32 master copy in the optimizer
    (ZeRO paper §3.1; DeepSpeed's bit16 parameters and fp32 partitions, ``runtime/zero/stage_1_and_2.py``;
    Megatron-LM's ``Float16Module`` and ``DistributedOptimizer``)."""
    CAST_FOR_COMPUTE = "cast_for_compute"
    """The parameters stay in the master dtype (fp32) and are cast to the compute dtype for each forward and
    backward: gradients come out in the compute dtype, are reduced in ``reduce_dtype`` and kept in the
    parameters' dtype for the optimizer (FSDP1 ``MixedPrecision``, ``torch/distributed/fsdp/
    _flat_param.py``; FSDP2 ``MixedPrecisionPolicy``, ``_fully_shard/_fsdp_param.py``)."""
    AUTOCAST = "autocast"
    """The parameters stay in the master dtype, autocast casts each op's inputs: gradients accumulate in
    the parameters' dtype and are reduced in it (DDP under ``torch.autocast``;
    ``ZeroRedundancyOptimizer``)."""


LAYOUT_NOTES: dict[ParamLayout, str] = {
    ParamLayout.MASTER_COPY: "{stored} parameters and {gradient} gradients beside an fp32 master copy",
    ParamLayout.CAST_FOR_COMPUTE: "{stored} parameters cast to {compute} for forward and backward, gradients "
    "reduced in {reduce} and kept in {main_gradient}; no separate master copy",
    ParamLayout.AUTOCAST: "{stored} parameters, autocast computing in {compute}; {main_gradient} gradients, "
    "reduced in {reduce}; no separate master copy",
}
"""Each layout in words, its dtypes filled in (:func:`describe_layout`)."""


class ParamKind(StrEnum):
    """Whether a parameter is trained, and how a fine-tuning method keeps it (:data:`KIND_RULES`;
    :func:`zerocalc.parallel.finetune.parameter_kinds` gives each tensor's)."""

    TRAINABLE = "trainable"
    FROZEN = "frozen"
    """``requires_grad=False`` in the layout's storage (a full fine-tune's frozen modules: the model
    loaded as the framework trains it): no gradient, no reduction, no master copy, no optimizer state."""
    FROZEN_BASE = "frozen_base"
    """The frozen base of a PEFT model, loaded in the recipe's compute dtype
    (``from_pretrained(..., dtype=torch.bfloat16)``, as LoRA recipes load it) whatever the layout would
    keep of a trained parameter; PEFT freezes it (peft/tuners/tuners_utils.py
    ``_mark_only_adapters_as_trainable``)."""
    QUANTIZED = "quantized"
    """A frozen weight bitsandbytes stores quantised (``Params4bit``, ``Int8Params``): its storage dtype
    (:class:`QuantDtypes`; its bytes are :mod:`zerocalc.model.quantized`'s parts, not dtype × elements),
    all-gathered as stored (what ``bnb_4bit_quant_storage`` is for), dequantised to the compute dtype for
    each forward and backward (``bnb_4bit_compute_dtype``)."""
    ADAPTER = "adapter"
    """A PEFT adapter: created fp32 on a 16-bit base (``get_peft_model(..., autocast_adapter_dtype=True)``,
    the default: peft/tuners/tuners_utils.py ``cast_adapter_dtype`` upcasts bf16 and fp16 adapters) and
    trained (:data:`KIND_RECIPES`)."""
    SAVED_COPY = "saved_copy"
    """A ``modules_to_save`` copy of a PEFT model: a deep copy of the base's module (peft 0.21.2
    peft/utils/other.py ``ModulesToSaveWrapper.update``: ``copy.deepcopy(self.original_module)``), so in the
    dtype the base was loaded in (:attr:`FROZEN_BASE`'s: the recipe's parameter dtype; fp32 after
    ``prepare_model_for_kbit_training``), and trained as it is stored: torch's Adam creates its states
    ``zeros_like`` the parameter it steps (``torch/optim/adam.py`` ``_init_group``), the master copy where
    the layout keeps one."""


_Source = str | TensorRole | DType | None
"""Where a role's dtype comes from: a :class:`PrecisionRecipe` field (by name), another role's dtype, a
dtype, or None (no such tensor)."""
_MASTER_OR_PARAM = "master_or_param"
"""The recipe's master dtype where it has one, else its parameter dtype."""

_STEPPED = "stepped"
"""The dtype of the tensor the optimizer steps: the master copy where the layout keeps one, else the stored
parameter."""

_QUANT_STORAGE = "quant_storage"
"""The quantised storage dtype (:attr:`QuantDtypes.storage`)."""
_QUANT_COMPUTE = "quant_compute"
"""The dtype a quantised weight is dequantised to (:attr:`QuantDtypes.compute`; the recipe's parameter
dtype where unset)."""


class QuantDtypes(NamedTuple):
    """The dtypes of a quantised frozen weight."""

    storage: DType
    """What the packed data is held in: uint8 (bitsandbytes' 4-bit default), ``bnb_4bit_quant_storage``
    (bf16 under FSDP), int8 (LLM.int8)."""
    compute: DType | None = None
    """``bnb_4bit_compute_dtype`` (None: the recipe's parameter dtype)."""


_R = TensorRole
LAYOUT_RULES: dict[ParamLayout, dict[TensorRole, _Source]] = {
    ParamLayout.MASTER_COPY: {
        _R.STORED: "param_dtype",
        _R.COMPUTE: "param_dtype",
        _R.MODULE_WEIGHT: _R.COMPUTE,
        _R.GEMM_INPUT: _R.COMPUTE,
        _R.ACTIVATION: _R.COMPUTE,
        _R.GRADIENT: "grad_dtype",
        _R.MAIN_GRADIENT: _R.GRADIENT,
        _R.REDUCE: _R.MAIN_GRADIENT,
        _R.ALL_GATHER: _R.COMPUTE,
        _R.MASTER: "master_dtype",
        _R.OPTIMIZER_STATE: "optimizer_state_dtype",
    },
    ParamLayout.CAST_FOR_COMPUTE: {
        _R.STORED: _MASTER_OR_PARAM,
        _R.COMPUTE: "param_dtype",
        _R.MODULE_WEIGHT: _R.COMPUTE,
        _R.GEMM_INPUT: _R.COMPUTE,
        _R.ACTIVATION: _R.COMPUTE,
        _R.GRADIENT: "grad_dtype",
        _R.MAIN_GRADIENT: _R.STORED,
        _R.REDUCE: _R.GRADIENT,
        _R.ALL_GATHER: _R.COMPUTE,
        _R.MASTER: None,
        _R.OPTIMIZER_STATE: "optimizer_state_dtype",
    },
    ParamLayout.AUTOCAST: {
        _R.STORED: _MASTER_OR_PARAM,
        _R.COMPUTE: "param_dtype",
        _R.MODULE_WEIGHT: _R.STORED,
        _R.GEMM_INPUT: _R.COMPUTE,
        _R.ACTIVATION: _R.COMPUTE,
        _R.GRADIENT: _R.STORED,
        _R.MAIN_GRADIENT: _R.STORED,
        _R.REDUCE: _R.STORED,
        _R.ALL_GATHER: _R.STORED,
        _R.MASTER: None,
        _R.OPTIMIZER_STATE: "optimizer_state_dtype",
    },
}
"""Each layout's rule per role. Under FSDP's ``MixedPrecision`` the unsharded gradients are in
``param_dtype`` and the reduction in ``reduce_dtype``, which defaults to ``param_dtype`` (FSDP2
``MixedPrecisionPolicy.reduce_dtype`` None: "the gradient reduction uses the compute dtype"); DDP reduces
``.grad``, in the parameters' own dtype (``torch/csrc/distributed/c10d/reducer.cpp``)."""

_UNTRAINED: dict[TensorRole, _Source] = {
    _R.GRADIENT: None,
    _R.MAIN_GRADIENT: None,
    _R.REDUCE: None,
    _R.MASTER: None,
    _R.OPTIMIZER_STATE: None,
}
"""A frozen weight keeps none of the trained tensors."""

KIND_RULES: dict[ParamKind, dict[TensorRole, _Source]] = {
    ParamKind.TRAINABLE: {},
    ParamKind.FROZEN: _UNTRAINED,
    ParamKind.FROZEN_BASE: {**_UNTRAINED, _R.STORED: "param_dtype"},
    ParamKind.QUANTIZED: {
        **_UNTRAINED,
        _R.STORED: _QUANT_STORAGE,
        _R.COMPUTE: _QUANT_COMPUTE,
        _R.GEMM_INPUT: _R.COMPUTE,
        _R.ACTIVATION: _R.COMPUTE,
        _R.ALL_GATHER: _R.STORED,
    },
    ParamKind.ADAPTER: {},
    ParamKind.SAVED_COPY: {_R.STORED: "param_dtype", _R.OPTIMIZER_STATE: _STEPPED},
}
"""What a kind of parameter changes of its layout's rules."""

KIND_RECIPES: dict[ParamKind, dict[PrecisionName, PrecisionName]] = {
    ParamKind.ADAPTER: {PrecisionName.BF16_PURE: PrecisionName.FP32},
}
"""The recipe a kind is kept under where it differs from the run's. PEFT's fp32 adapters are trained as
any parameter under a mixed recipe (the layouts' fp32 copies: autocast, FSDP's cast for compute); under
bf16-pure, whose parameters are neither cast nor autocast, they stay fp32 parameters with fp32 gradients
and states, and the LoRA path computes in fp32 (peft/tuners/lora/layer.py ``Linear.forward``:
``x = self._cast_input_dtype(x, lora_A.weight.dtype)``)."""

BASE_DTYPE_ADAPTER_RECIPES: dict[ParamLayout, dict[PrecisionName, PrecisionName]] = {
    ParamLayout.AUTOCAST: {PrecisionName.BF16_MIXED: PrecisionName.BF16_PURE},
    ParamLayout.CAST_FOR_COMPUTE: {PrecisionName.BF16_MIXED: PrecisionName.BF16_PURE},
    ParamLayout.MASTER_COPY: {},
}
"""The adapters' recipe where PEFT leaves them in the base layer's dtype (``get_peft_model(...,
autocast_adapter_dtype=False)``, and every PEFT before 0.12, which had no upcast), in place of
:data:`KIND_RECIPES`: peft 0.21.2 ``tuners/tuners_utils.py`` ``_move_adapter_to_device_of_base_layer``
moves each new adapter to the base weight's floating dtype (bitsandbytes ``Linear4bit``'s
``compute_dtype``), and ``cast_adapter_dtype`` returns at once. On a bf16 base they are bf16 parameters:
under autocast and FSDP's cast for compute (a cast to ``param_dtype`` of a bf16 parameter is none)
their gradients and AdamW's states (``zeros_like``) are bf16, bf16-pure's; under bf16-pure and fp32 they
are the run's own; a master-copy framework casts every parameter to its 16-bit dtype and keeps its own
fp32 copy whatever PEFT made (DeepSpeed's engine ``module.bfloat16()``), so nothing changes there. An
fp16 base's adapters (fp16-mixed) have no recipe here: refused (zerocalc.request.finetune)."""


def kind_recipe(
    kind: ParamKind, precision: PrecisionName, layout: ParamLayout, adapter_autocast: bool = True
) -> PrecisionName:
    """The recipe a tensor of ``kind`` is kept under in a run of ``precision`` by a framework of
    ``layout``; ``adapter_autocast``: PEFT upcasts its adapters to fp32 (:data:`KIND_RECIPES`), else
    they keep the base's dtype (:data:`BASE_DTYPE_ADAPTER_RECIPES`)."""
    if kind is ParamKind.ADAPTER and not adapter_autocast:
        return BASE_DTYPE_ADAPTER_RECIPES[layout].get(precision, precision)
    return KIND_RECIPES.get(kind, {}).get(precision, precision)


KBIT_PREPARE_RULES: dict[ParamKind, dict[TensorRole, _Source]] = {
    ParamKind.TRAINABLE: {_R.STORED: DType.FP32},
    ParamKind.FROZEN: {_R.STORED: DType.FP32},
    ParamKind.FROZEN_BASE: {_R.STORED: DType.FP32},
    ParamKind.QUANTIZED: {},
    ParamKind.ADAPTER: {},
    ParamKind.SAVED_COPY: {_R.STORED: DType.FP32},
}
"""What ``prepare_model_for_kbit_training`` changes of each kind (peft/utils/other.py: "cast all non INT8
parameters to fp32": every fp16 and bf16 parameter whose class is not ``Params4bit``, before the adapters
are added): the norms, the embeddings, the LM head, the biases and whatever is not quantised are kept in
fp32 (and ``modules_to_save`` copies them so); 4-bit weights (whatever their storage dtype) and int8 ones
keep theirs, adapters are fp32 already."""


# ------------------------------------------------------------------------------------------------- FP8
class Fp8RecipeName(StrEnum):
    """An FP8 training recipe (``--fp8``): its GEMMs run in FP8 on top of the 16-bit recipe."""

    NONE = "none"
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    ROWWISE_GW_HP = "rowwise-gw-hp"
    DELAYED = "delayed"
    CURRENT = "current"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"


class Fp8Library(StrEnum):
    """Whose FP8 Linear layers run a recipe."""

    TORCHAO = "torchao"
    """torchao 0.18 ``torchao/float8/float8_linear.py`` ``Float8Linear`` (``convert_to_float8_training``)."""
    TRANSFORMER_ENGINE = "transformer_engine"
    """Transformer Engine 2.x ``transformer_engine/pytorch/module/linear.py`` ``Linear``."""


class Fp8Recipe(NamedTuple):
    """What an FP8 recipe keeps besides the 16-bit recipe's tensors."""

    name: Fp8RecipeName
    library: Fp8Library
    scaling: str
    """How its scales are laid out, in words."""
    weight_block: int
    """Elements of a weight sharing one scale (0: one scale per tensor)."""
    scale_bytes: int
    """Bytes of one scale (fp32 4; MXFP8's E8M0 1)."""
    amax_history: bool
    """It keeps a history of amaxes per FP8 tensor (DelayedScaling)."""
    all_gather: bool
    """Its weights can be all-gathered in FP8 (torchao ``enable_fsdp_float8_all_gather``, tensorwise only;
    Megatron-LM ``--fp8-param-gather``)."""
    source: str
    min_compute_capability: tuple[int, int] = (8, 9)
    """The CUDA compute capability its GEMMs need: FP8 tensor cores from Ada and Hopper (8.9; torchao
    float8 and Transformer Engine's ``check_fp8_support``); TE's Float8BlockScaling from Hopper (9.0,
    ``check_fp8_block_scaling_support``); MXFP8 from Blackwell (10.0, ``check_mxfp8_support``)
    (transformer_engine/pytorch/fp8.py, Transformer Engine 2.x)."""
    weight_grad_fp8: bool = True
    """Its weight-gradient GEMM runs in FP8 too (the forward and input-gradient GEMMs always do): torchao
    ``ROWWISE_WITH_GW_HP`` disables the grad-weight casts (``cast_config_input_for_grad_weight``,
    ``cast_config_grad_output_for_grad_weight``: ``ScalingType.DISABLED``) and runs it in high precision."""


_TORCHAO = "torchao 0.18 torchao/float8/config.py Float8LinearConfig.from_recipe_name"
_TE = "Transformer Engine 2.x transformer_engine/common/recipe/__init__.py"
FP8_RECIPES: dict[Fp8RecipeName, Fp8Recipe] = {
    recipe.name: recipe
    for recipe in (
        Fp8Recipe(Fp8RecipeName.TENSORWISE, Fp8Library.TORCHAO, "one dynamic scale per tensor", 0, 4, False,
                  True, f"{_TORCHAO} (TENSORWISE; float8/fsdp_utils.py WeightWithDynamicFloat8CastTensor)"),
        Fp8Recipe(Fp8RecipeName.ROWWISE, Fp8Library.TORCHAO, "one dynamic scale per row", 0, 4, False, False,
                  f"{_TORCHAO} (ROWWISE)"),
        Fp8Recipe(Fp8RecipeName.ROWWISE_GW_HP, Fp8Library.TORCHAO,
                  "one dynamic scale per row; the weight gradient's GEMM in high precision", 0, 4, False,
                  False, f"{_TORCHAO} (ROWWISE_WITH_GW_HP)", weight_grad_fp8=False),
        Fp8Recipe(Fp8RecipeName.DELAYED, Fp8Library.TRANSFORMER_ENGINE,
                  "one scale per tensor from an amax history", 0, 4, True, True, f"{_TE} DelayedScaling"),
        Fp8Recipe(Fp8RecipeName.CURRENT, Fp8Library.TRANSFORMER_ENGINE, "one current scale per tensor", 0, 4,
                  False, True, f"{_TE} Float8CurrentScaling"),
        Fp8Recipe(Fp8RecipeName.BLOCKWISE, Fp8Library.TRANSFORMER_ENGINE,
                  "1×128 blocks of activations, 128×128 blocks of weights", 128 * 128, 4, False, True,
                  f"{_TE} Float8BlockScaling (DeepSeek-V3's)", min_compute_capability=(9, 0)),
        Fp8Recipe(Fp8RecipeName.MXFP8, Fp8Library.TRANSFORMER_ENGINE, "one E8M0 scale per 32 elements", 32, 1,
                  False, True, f"{_TE} MXFP8BlockScaling (Blackwell)", min_compute_capability=(10, 0)),
    )
}  # fmt: skip


class Fp8Use(NamedTuple):
    """How a converted Linear weight runs an FP8 recipe (the key of its roles' rules)."""

    recipe: Fp8RecipeName
    all_gather: bool = False
    """Its weight is all-gathered in FP8."""
    model_init: bool = False
    """Only the FP8 weight is kept, no high-precision copy (TE ``fp8_model_init``/``quantized_model_init``,
    Megatron-LM ``--fp8-param-gather``)."""


FP8_RULES: dict[Fp8Library, dict[TensorRole, _Source]] = {
    Fp8Library.TORCHAO: {_R.GEMM_INPUT: DType.FP8},
    Fp8Library.TRANSFORMER_ENGINE: {_R.GEMM_INPUT: DType.FP8, _R.ACTIVATION: DType.FP8},
}
"""What a library's FP8 Linear changes of a converted weight's roles. torchao 0.18 ``float8_linear.py``
``matmul_with_hp_or_float8_args.forward``: ``ctx.save_for_backward(input_hp, weight_hp_t)``, the
high-precision input and weight saved, their fp8 casts transient, gradients out in the input's dtype. TE 2.x
``module/linear.py`` ``_Linear.forward``: the input quantised once, its fp8 copy saved for the weight
gradient (``save_for_backward(inputmat, weightmat, ...)``), the output and gradients in the
activation dtype."""
FP8_ALL_GATHER_RULE: dict[TensorRole, _Source] = {_R.ALL_GATHER: DType.FP8, _R.COMPUTE: DType.FP8}
"""The weight all-gathered in FP8 and used as gathered: torchao 0.18 ``fsdp_utils.py``
``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts the shard to fp8 (its scale travels as
metadata) and ``fsdp_post_all_gather`` wraps the gathered bytes as a ``Float8TrainingTensor``; Megatron-LM
``--fp8-param-gather``: the distributed optimizer gathers the fp8 parameters."""
FP8_MODEL_INIT_RULE: dict[TensorRole, _Source] = {_R.STORED: DType.FP8, _R.COMPUTE: DType.FP8}
"""Only the FP8 weight is kept (TE 2.x ``pytorch/quantization.py`` ``quantized_model_init``, formerly
``fp8_model_init``): the stored parameter is the quantised tensor, the optimizer keeps the fp32 master."""


def fp8_rules(use: Fp8Use) -> dict[TensorRole, _Source]:
    """What ``use`` changes of a converted Linear weight's roles."""
    rules = {**FP8_RULES[FP8_RECIPES[use.recipe].library]}
    if use.all_gather:
        rules.update(FP8_ALL_GATHER_RULE)
    if use.model_init:
        rules.update(FP8_MODEL_INIT_RULE)
    return rules


class TensorDtypes(NamedTuple):
    """The dtype of every role of one kind of parameter under one recipe and layout (None: no such
    tensor)."""

    stored: DType
    compute: DType
    module_weight: DType
    gemm_input: DType
    activation: DType
    gradient: DType | None
    main_gradient: DType | None
    reduce: DType | None
    all_gather: DType
    master: DType | None
    optimizer_state: DType | None

    def of(self, role: TensorRole) -> DType | None:
        return getattr(self, role.value)

    @property
    def trained(self) -> TensorDtypes:
        """These dtypes, asserting the parameters are trained (their gradient roles have dtypes)."""
        assert self.gradient is not None and self.main_gradient is not None and self.reduce is not None
        return self


@lru_cache(maxsize=256)
def tensor_dtypes(
    precision: PrecisionName,
    layout: ParamLayout,
    main_gradient: DType | None = None,
    reduce: DType | None = None,
    kind: ParamKind = ParamKind.TRAINABLE,
    *,
    fp8: Fp8Use | None = None,
    quant: QuantDtypes | None = None,
    kbit_prepared: bool = False,
    adapter_autocast: bool = True,
) -> TensorDtypes:
    """Every role's dtype: the layout's rule for the recipe (:data:`LAYOUT_RULES`; the kind's recipe,
    :data:`KIND_RECIPES`), the framework's own main-gradient dtype where it has one (Megatron-LM's fp32
    ``main_grad``), ``--reduce-dtype`` where given, an FP8 recipe's changes to a Linear weight it converts
    (:func:`fp8_rules`), the kind's changes (:data:`KIND_RULES`, a quantised weight's dtypes from ``quant``)
    and ``prepare_model_for_kbit_training``'s (:data:`KBIT_PREPARE_RULES`); ``adapter_autocast``: PEFT's
    ``autocast_adapter_dtype`` (:func:`kind_recipe`)."""
    recipe = RECIPES[kind_recipe(kind, precision, layout, adapter_autocast)]
    rules: dict[TensorRole, _Source] = {**LAYOUT_RULES[layout]}
    if main_gradient is not None:
        rules[TensorRole.MAIN_GRADIENT] = main_gradient
    if reduce is not None:
        rules[TensorRole.REDUCE] = reduce
    if fp8 is not None:
        rules.update(fp8_rules(fp8))
    rules.update(KIND_RULES[kind])
    if kbit_prepared:
        rules.update(KBIT_PREPARE_RULES[kind])
    if kind is ParamKind.QUANTIZED and quant is None:
        raise ValueError("a quantised parameter's dtypes need its QuantDtypes")
    resolved: dict[TensorRole, DType | None] = {}

    def resolve(role: TensorRole) -> DType | None:
        if role not in resolved:
            source = rules[role]
            if source is None or isinstance(source, DType):
                resolved[role] = source
            elif isinstance(source, TensorRole):
                resolved[role] = resolve(source)
            elif source == _MASTER_OR_PARAM:
                resolved[role] = recipe.master_dtype or recipe.param_dtype
            elif source == _STEPPED:
                resolved[role] = resolve(_R.MASTER) or resolve(_R.STORED)
            elif source == _QUANT_STORAGE:
                resolved[role] = quant.storage  # type: ignore[union-attr]
            elif source == _QUANT_COMPUTE:
                resolved[role] = quant.compute or recipe.param_dtype  # type: ignore[union-attr]
            else:
                resolved[role] = getattr(recipe, source)
        return resolved[role]

    return TensorDtypes(*(resolve(role) for role in TensorRole))  # type: ignore[arg-type]


def describe_layout(layout: ParamLayout, dtypes: TensorDtypes) -> str:
    """How ``layout`` keeps the tensors, in words, with the dtypes of ``dtypes`` (and main gradients of
    their own where the framework keeps them apart from backward's)."""
    values = {
        role.value: (dtype.value if dtype else "no") for role, dtype in zip(TensorRole, dtypes, strict=True)
    }
    if layout is ParamLayout.MASTER_COPY and dtypes.main_gradient is not dtypes.gradient:
        return (
            "{stored} parameters beside an fp32 master copy; backward accumulates {main_gradient} main "
            "gradients, which are reduced and stepped from"
        ).format(**values)
    return LAYOUT_NOTES[layout].format(**values)
