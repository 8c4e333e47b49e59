"""Optimizer states per parameter: one table, one place.

Each optimizer is a list of state tensors kept per parameter element. A state either has a fixed dtype
(8-bit Adam's quantised moments) or follows the precision record's optimizer-state dtype (fp32 for the
mixed and fp32 recipes, bf16 for ``bf16-pure``). Block-wise quantisation scales are counted per block.
The fp32 master copy of mixed precision is added by ``zerocalc.states.memory`` from the precision record,
not here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from zerocalc.base.dtypes import DType
from zerocalc.base.units import ceil_div


class OptimizerName(StrEnum):
    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"
    SGD_NO_MOMENTUM = "sgd-no-momentum"
    ADAFACTOR = "adafactor"
    ADAM_8BIT = "adam-8bit"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    PAGED_ADAMW = "paged-adamw"


class OptimizerImpl(StrEnum):
    """How ``torch.optim.Adam``/``AdamW`` runs its step (``torch/optim/adam.py``), which decides the step's
    temporaries."""

    FOREACH = "foreach"
    """The default on CUDA (``_multi_tensor_adam``): ``_foreach_sqrt(exp_avg_sq)`` allocates one fp32 tensor
    per parameter, all alive together."""
    FUSED = "fused"
    """``fused=True``: one kernel, no temporaries; the ``step`` counters are device scalars."""
    FOR_LOOP = "for-loop"
    """``foreach=False`` (``_single_tensor_adam``): two temporaries of one parameter at a time."""


class StateTensor(NamedTuple):
    """One per-parameter optimizer state."""

    name: str
    dtype: DType | None = None
    """Fixed dtype, or None to follow the recipe's optimizer-state dtype."""
    block_size: int | None = None
    """If set, one element of ``dtype`` per block of this many parameters (a quantisation scale)."""

    def bytes_for(self, n_elements: int, state_dtype: DType) -> int:
        """Bytes of this state for ``n_elements`` parameters, ``state_dtype`` the precision's optimizer-state
        dtype (the precision record's)."""
        dtype = self.dtype or state_dtype
        count = n_elements if self.block_size is None else ceil_div(n_elements, self.block_size)
        return count * dtype.bytes


class OptimizerSpec(NamedTuple):
    name: OptimizerName
    states: tuple[StateTensor, ...]
    assumption: str
    """What the count assumes, shown to the user."""
    small_tensor_states: tuple[StateTensor, ...] | None = None
    """The states of a tensor of fewer than :data:`BNB_MIN_8BIT_SIZE` elements, where they differ
    (bitsandbytes' 8-bit optimizers keep 32-bit states for them)."""
    paged: bool = False
    """bitsandbytes' paged optimizer: the states of tensors of at least :data:`BNB_PAGED_FROM` elements are
    held in CUDA unified memory (``F.get_paged``), outside PyTorch's caching allocator."""

    def state_bytes(self, n_elements: int, state_dtype: DType) -> dict[str, int]:
        """Bytes of each state for a shard of ``n_elements`` parameters."""
        return {state.name: state.bytes_for(n_elements, state_dtype) for state in self.states}

    def tensor_state_bytes(self, numel: int, state_dtype: DType) -> dict[str, int]:
        """Bytes of each state of one tensor of ``numel`` elements (bitsandbytes decides by the tensor:
        ``Optimizer2State.init_state``); a paged state's name ends in ``_paged``."""
        small = self.small_tensor_states is not None and numel < BNB_MIN_8BIT_SIZE
        states = self.small_tensor_states if small else self.states
        paged = self.paged and numel >= BNB_PAGED_FROM
        return {
            f"{state.name}_paged" if paged and state.block_size is None else state.name: state.bytes_for(
                numel, state_dtype
            )
            for state in states or ()
        }


_ADAM_MOMENTS = (StateTensor(name="exp_avg"), StateTensor(name="exp_avg_sq"))

# bitsandbytes Adam8bit: uint8 state1/state2 plus one fp32 absmax per 256-element block for each
# (bitsandbytes/optim/optimizer.py, Optimizer2State.init_state, block_wise=True, blocksize = 256).
BNB_BLOCK_SIZE = 256
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes 0.50 ``min_8bit_size`` (optim/adamw.py ``AdamW8bit``, ``PagedAdamW8bit``): a tensor of fewer
elements keeps fp32 state1 and state2 (``Optimizer2State.init_state``: ``p.numel() < min_8bit_size``)."""
BNB_PAGED_FROM = 100_000
"""bitsandbytes 0.50 ``Optimizer8bit.get_state_buffer``: a paged optimizer pages the states of tensors of
at least 1e5 elements (``p.numel() < 1e5`` stay ordinary device tensors); the absmax never."""
_BNB_32BIT = (StateTensor(name="state1", dtype=DType.FP32), StateTensor(name="state2", dtype=DType.FP32))
"""bitsandbytes' 32-bit states: fp32 whatever the parameter's dtype (``get_state_buffer(p, float32)``)."""
BNB_QMAP_BYTES = 2 * 256 * DType.FP32.bytes
"""An 8-bit optimizer's two quantisation maps (``name2qmap`` "dynamic" and "udynamic", 256 fp32 each,
``Optimizer8bit.fill_qmap``): one pair on the device, shared by every 8-bit state."""
_BNB_8BIT = (
    StateTensor(name="state1_uint8", dtype=DType.UINT8),
    StateTensor(name="state2_uint8", dtype=DType.UINT8),
    StateTensor(name="absmax1", dtype=DType.FP32, block_size=BNB_BLOCK_SIZE),
    StateTensor(name="absmax2", dtype=DType.FP32, block_size=BNB_BLOCK_SIZE),
)

OPTIMIZERS: dict[OptimizerName, OptimizerSpec] = {
    spec.name: spec
    for spec in (
        OptimizerSpec(
            name=OptimizerName.ADAM,
            states=_ADAM_MOMENTS,
            assumption="Adam: first and second moments (m, v) per parameter (Kingma & Ba 2015)",
        ),
        OptimizerSpec(
            name=OptimizerName.ADAMW,
            states=_ADAM_MOMENTS,
            assumption="AdamW: first and second moments (m, v) per parameter (Loshchilov & Hutter 2019)",
        ),
        OptimizerSpec(
            name=OptimizerName.SGD,
            states=(StateTensor(name="momentum_buffer"),),
            assumption="SGD with momentum: one momentum buffer per parameter",
        ),
        OptimizerSpec(
            name=OptimizerName.SGD_NO_MOMENTUM,
            states=(),
            assumption="SGD without momentum: no per-parameter state",
        ),
        OptimizerSpec(
            name=OptimizerName.ADAFACTOR,
            states=(),
            assumption=(
                "Adafactor without first moment (beta1=None, Shazeer & Stern 2018): the second moment of "
                "an r x c matrix is factored into r + c values, counted as 0 bytes per parameter "
                "(under 0.1% of the model for transformer-sized matrices)"
            ),
        ),
        OptimizerSpec(
            name=OptimizerName.ADAM_8BIT,
            states=(
                StateTensor(name="state1_uint8", dtype=DType.INT8),
                StateTensor(name="state2_uint8", dtype=DType.INT8),
                StateTensor(name="absmax1", dtype=DType.FP32, block_size=BNB_BLOCK_SIZE),
                StateTensor(name="absmax2", dtype=DType.FP32, block_size=BNB_BLOCK_SIZE),
            ),
            assumption=(
                f"8-bit Adam (bitsandbytes, block-wise): m and v in 1 byte each plus one fp32 scale per "
                f"{BNB_BLOCK_SIZE}-element block for each, 2.03125 bytes per parameter"
            ),
            small_tensor_states=_BNB_32BIT,
        ),
        OptimizerSpec(
            name=OptimizerName.PAGED_ADAMW_8BIT,
            states=_BNB_8BIT,
            assumption=(
                "bitsandbytes PagedAdamW8bit: m and v in 1 byte each plus an fp32 scale per "
                f"{BNB_BLOCK_SIZE} elements (fp32 m and v for tensors under {BNB_MIN_8BIT_SIZE:,} elements); "
                f"the m and v of tensors of {BNB_PAGED_FROM:,} elements or more in CUDA unified memory"
            ),
            small_tensor_states=_BNB_32BIT,
            paged=True,
        ),
        OptimizerSpec(
            name=OptimizerName.PAGED_ADAMW,
            states=_BNB_32BIT,
            assumption=(
                "bitsandbytes PagedAdamW (32-bit): fp32 m and v, those of tensors of "
                f"{BNB_PAGED_FROM:,} elements or more in CUDA unified memory"
            ),
            paged=True,
        ),
    )
}
