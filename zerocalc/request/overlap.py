"""The frameworks' communication-overlap options, parsed and checked against the request they belong to
(pure).

What each hides is its framework record's (:mod:`zerocalc.parallel.framework_records.megatron`,
:mod:`~zerocalc.parallel.framework_records.deepspeed`); the step prices it (:mod:`zerocalc.comm.step`).
Megatron-LM's own checks (``megatron/training/arguments.py`` ``validate_args``) are kept:
``--overlap-param-gather`` needs the distributed optimizer and ``--overlap-grad-reduce``,
``--tp-comm-overlap`` sequence parallelism. DeepSpeed's ``overlap_comm`` is on by default for ZeRO-3 and
off below (``DeepSpeedZeroConfig.overlap_comm_valid``): ``--overlap-comm`` turns it on for ZeRO-1/2.
torchtitan's async TP (``--async-tp``, ``parallelism.enable_async_tensor_parallel``) is torchtitan's code
under FSDP2, needs the blocks compiled (v0.2.2 ``distributed/tensor_parallel.py::maybe_enable_async_tp``:
"Async TP requires 'model' in --compile.components and --compile.enable") and sequence-parallel TP (the
all-gathers and reduce-scatters it pipelines).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from zerocalc.base.errors import InputError
from zerocalc.model.code import Compiled, ModelImplName
from zerocalc.parallel.framework_records.deepspeed import OVERLAP_COMM_STRATEGIES
from zerocalc.parallel.frameworks import Framework
from zerocalc.parallel.mesh import Mesh
from zerocalc.parallel.strategies import StrategyName


class OverlapOptions(BaseModel):
    """Which communication overlaps beyond its framework's defaults the run turns on (all off: the
    defaults)."""

    model_config = ConfigDict(frozen=True)

    grad_reduce: bool = False
    """``--overlap-grad-reduce``: bucketed gradient reductions beside backward."""
    param_gather: bool = False
    """``--overlap-param-gather``: the distributed optimizer's parameter all-gathers in the next forward."""
    tp_comm: bool = False
    """``--tp-comm-overlap``: Transformer Engine's userbuffers, TP collectives beside the layers' GEMMs."""
    deepspeed_comm: bool = False
    """``--overlap-comm``: DeepSpeed ZeRO-1/2's reductions on their own stream, beside backward."""
    async_tp: bool = False
    """``--async-tp``: torchtitan's async TP, the layers' TP collectives in pieces beside their matmuls."""


def parse_overlap(
    grad_reduce: bool,
    param_gather: bool,
    tp_comm: bool,
    deepspeed_comm: bool,
    framework: Framework,
    mesh: Mesh,
    strategies: tuple[StrategyName, ...],
    async_tp: bool = False,
    model_code: ModelImplName | None = None,
    compiled: Compiled = Compiled.NONE,
) -> OverlapOptions:
    """The overlap options of a request, or an :class:`InputError` naming the first that cannot apply."""
    if async_tp:
        _async_tp_check(framework, mesh, model_code, compiled)
    if deepspeed_comm and framework is not Framework.DEEPSPEED:
        raise InputError(
            f"{{overlap_comm}} is DeepSpeed's zero_optimization.overlap_comm, not {framework.value}'s; "
            "accepted: {framework} deepspeed, or no {overlap_comm}"
        )
    if deepspeed_comm and not OVERLAP_COMM_STRATEGIES & set(strategies):
        raise InputError(
            "{overlap_comm} changes nothing here: DeepSpeed overlaps ZeRO-3's collectives by default, and "
            f"{{strategies}} {','.join(s.value for s in strategies)} runs no ZeRO-1/2; accepted: "
            "{strategies} zero1 or zero2, or no {overlap_comm}"
        )
    given = [
        name
        for name, on in (
            ("{overlap_grad_reduce}", grad_reduce),
            ("{overlap_param_gather}", param_gather),
            ("{tp_comm_overlap}", tp_comm),
        )
        if on
    ]
    if given and framework is not Framework.MEGATRON:
        raise InputError(
            f"{given[0]} is Megatron-LM's option, not {framework.value}'s; accepted: {{framework}} megatron, "
            f"or no {given[0]}"
        )
    if param_gather and not grad_reduce:
        raise InputError(
            "{overlap_param_gather} needs {overlap_grad_reduce} (Megatron-LM arguments.py: 'Must use "
            "--overlap-param-gather with --overlap-grad-reduce'); accepted: both, or neither"
        )
    if param_gather and StrategyName.ZERO1 not in strategies:
        raise InputError(
            "{overlap_param_gather} overlaps the distributed optimizer's parameter all-gather, which "
            f"{{strategies}} {','.join(s.value for s in strategies)} does not run; accepted: {{strategies}} "
            "zero1 (--use-distributed-optimizer), or no {overlap_param_gather}"
        )
    if tp_comm and not (mesh.tp > 1 and mesh.sequence_parallel):
        raise InputError(
            "{tp_comm_overlap} needs tensor parallelism with sequence parallelism (Megatron-LM "
            "arguments.py: 'Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled'); accepted: {tp} 2 or more with {sequence_parallel}, or no "
            "{tp_comm_overlap}"
        )
    return OverlapOptions(
        grad_reduce=grad_reduce,
        param_gather=param_gather,
        tp_comm=tp_comm,
        deepspeed_comm=deepspeed_comm,
        async_tp=async_tp,
    )


def _async_tp_check(
    framework: Framework, mesh: Mesh, model_code: ModelImplName | None, compiled: Compiled
) -> None:
    """``--async-tp`` where torchtitan would not run it: an :class:`InputError`."""
    if framework is not Framework.FSDP2 or model_code is not ModelImplName.TORCHTITAN:
        raise InputError(
            "{async_tp} is torchtitan's parallelism.enable_async_tensor_parallel, not "
            f"{framework.value}'s with {model_code.value if model_code else 'its'} model code; accepted: "
            "{framework} fsdp2 with {model_impl} torchtitan, or no {async_tp}"
        )
    if not compiled.model:
        raise InputError(
            "{async_tp} needs the blocks compiled (torchtitan: 'Async TP requires 'model' in "
            "--compile.components and --compile.enable'); accepted: {compile} model or model,loss, or no "
            "{async_tp}"
        )
    if not (mesh.tp > 1 and mesh.sequence_parallel):
        raise InputError(
            f"{{async_tp}} with {{tp}} {mesh.tp}: async TP pipelines the "
            "sequence-parallel all-gathers and reduce-scatters of tensor parallelism, which this mesh does "
            "not run; accepted: {tp} 2 or more (with sequence parallelism), or no {async_tp}"
        )
