"""What a rank of ``zerocalc validate`` measures (imports torch): every collective it issues, and the bytes
of the tensors it holds. Shared by the workers of the framework, pipeline and expert-parallel runs.

* :class:`CollectiveRecorder`: every c10d collective of a step, seen by a ``TorchDispatchMode``: the C++
  ``ProcessGroup`` methods, DDP's reducer included, dispatch to the ``c10d::allreduce_`` ... ops
  (``torch/csrc/distributed/c10d/ProcessGroup.hpp``), so the Python mode sees them all, and DTensor's from
  inside its dispatch too; per call, in order, its operation, dtype, S, process group (global ranks) and
  broadcast source. The pipeline and expert workers subclass it for their point-to-point calls and
  all-to-alls.
* :func:`nbytes`, :func:`storage_bytes`, :func:`optimizer_bytes`: sums of tensor bytes (DTensor:
  ``to_local()``); process RSS measures none of this on CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from zerocalc.base.dtypes import DType
from zerocalc.validate.config import RecordedCall

_C10D_OPS: dict[str, tuple[str, int, int, int, int | None]] = {
    "allreduce_": ("all_reduce", 0, 0, 1, None),
    "allreduce_coalesced_": ("all_reduce", 0, 0, 1, None),
    "broadcast_": ("broadcast", 0, 0, 1, 2),
    "reduce_": ("reduce", 0, 0, 1, 3),
    "allgather_": ("all_gather", 1, 0, 2, None),
    "allgather_coalesced_": ("all_gather", 1, 0, 2, None),
    "_allgather_base_": ("all_gather", 1, 0, 2, None),
    "allgather_into_tensor_coalesced_": ("all_gather", 1, 0, 2, None),
    "reduce_scatter_": ("reduce_scatter", 1, 0, 2, None),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 0, 2, None),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 0, 2, None),
    "alltoall_": ("all_to_all", 1, 0, 2, None),
    "alltoall_base_": ("all_to_all", 1, 0, 2, None),
    "gather_": ("gather", 1, 0, 2, 3),
    "scatter_": ("scatter", 1, 0, 2, 3),
}
"""torch 2.13 ``c10d`` op schemas (``torch/csrc/distributed/c10d/Ops.cpp``): the collective, and the argument
positions of its input, output, process group and root (a rank of the group)."""
_FUNCTIONAL_OPS: dict[str, tuple[str, int]] = {
    "all_reduce": ("all_reduce", 2),
    "all_reduce_": ("all_reduce", 2),
    "all_reduce_coalesced": ("all_reduce", 2),
    "all_gather_into_tensor": ("all_gather", 2),
    "all_gather_into_tensor_out": ("all_gather", 2),
    "all_gather_into_tensor_coalesced": ("all_gather", 2),
    "reduce_scatter_tensor": ("reduce_scatter", 3),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 3),
    "all_to_all_single": ("all_to_all", 3),
    "broadcast": ("broadcast", 2),
    "broadcast_": ("broadcast", 2),
}
"""``_c10d_functional`` ops (traceable collectives): the collective and the position of the group name."""
_DTYPES = {f"torch.{d.torch_name}": d.value for d in DType}


def flat_tensors(x: Any) -> list[Any]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in flat_tensors(y)]
    return []


def numel(x: Any) -> int:
    return sum(t.numel() for t in flat_tensors(x))


def dtype_name(x: Any) -> str:
    tensors = flat_tensors(x)
    name = str(tensors[0].dtype) if tensors else "?"
    return _DTYPES.get(name, name.replace("torch.", ""))


def group_ranks(group: Any) -> list[int]:
    if isinstance(group, torch.ScriptObject):
        group = dist.ProcessGroup.unbox(group)
    return list(dist.get_process_group_ranks(group))


class CollectiveRecorder(TorchDispatchMode):
    """Every c10d collective dispatched while the mode is active, with the phase the runner sets."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[RecordedCall] = []
        self.phase = "forward"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if any(issubclass(t, DTensor) for t in types):
            # A mode runs before a tensor subclass and is off while its handler runs: handing a DTensor op
            # back lets DTensor run first, so the collectives it issues inside its dispatch (loss_parallel's
            # all-reduces, implicit redistributions) come here as plain-tensor ops
            # (``torch/distributed/tensor/debug/_comm_mode.py`` ``CommDebugMode`` does the same).
            return NotImplemented
        namespace = getattr(func, "namespace", None)
        name = func._schema.name.split("::")[-1]
        out = func(*args, **(kwargs or {}))
        if namespace == "c10d" and name in _C10D_OPS:
            op, i_in, i_out, i_group, i_root = _C10D_OPS[name]
            source, ranks = args[i_in], group_ranks(args[i_group])
            elements = numel(args[i_out]) if op == "all_gather" else numel(source)
            root = int(args[i_root]) if i_root is not None else None
        elif namespace == "_c10d_functional" and name in _FUNCTIONAL_OPS:
            op, i_group = _FUNCTIONAL_OPS[name]
            source = args[0]
            ranks = group_ranks(torch._C._distributed_c10d._resolve_process_group(args[i_group]))
            elements = numel(out) if op == "all_gather" else numel(source)
            root = None
        else:
            return out
        self.calls.append(
            RecordedCall(
                op=op,
                phase=self.phase,
                dtype=dtype_name(source),
                elements=elements,
                group_ranks=ranks,
                root=root,
            )
        )
        return out


def local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(t: Any) -> int:
    t = local(t)
    return t.numel() * t.element_size()


def storage_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct allocated storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() > 0:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_bytes(optimizer: Any) -> tuple[int, int]:
    """Bytes of ``optimizer.state``'s tensors: (the states, the ``step`` counters)."""
    states = steps = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                if key == "step":
                    steps += nbytes(value)
                else:
                    states += nbytes(value)
    return states, steps
