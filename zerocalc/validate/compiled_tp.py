"""What a ``torch.compile``'d torchtitan block saves per rank under tensor parallelism with sequence
parallelism, measured with real Inductor on the CPU over gloo ranks (imports torch).

The model is :class:`~zerocalc.validate.compiled.TitanLlama` (torchtitan v0.2.2's Llama 3 at tiny size)
with torchtitan v0.2.2's TP plan (``models/llama3/infra/parallelize.py::apply_tp``, :func:`apply_tp`)
applied first, then each block compiled with ``fullgraph=True`` (``apply_compile``), as
``parallelize_llama`` orders them. Each rank runs one step to build the graphs, then one forward under
``saved_tensors_hooks`` (:class:`~zerocalc.validate.compiled._Saved`: DTensors and functional
collectives' results are counted by their local storage), and the storages each block saved are compared
with :func:`~zerocalc.validate.saved.predict_compiled_regions` of that rank's
:class:`~zerocalc.model.code.Shape` (``tp``, ``sequence_parallel``).

The embedding is not measured and not sharded: torchtitan's vocabulary-parallel embedding
(``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``) fails in torch 2.13's backward
when a compiled block reads its output (``Redistribute.backward`` of its ``MaskPartial`` receives a plain
tensor: ``'Tensor' object has no attribute '_local_tensor'``; eager runs), so here a replicated embedding's
output is cut to the rank's sequence shard (``Shard(1)``, what the blocks receive either way). A batch of
one fails to trace (``rms_norm`` on the DTensor: "unhashable type: non-nested SymInt"): measured at b ≥ 2.
Under ``full`` checkpointing torch 2.13 fails to compile the block (AOTAutograd's ``save_from_forward``
meets a ``DeviceMesh`` among the saved tensors): measured for recompute none and op.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from zerocalc.model.architecture import Architecture
from zerocalc.model.code import Compiled, Shape
from zerocalc.validate.compiled import cross_entropy_loss, step_saves, titan_model
from zerocalc.validate.saved import (
    MeasuredStorage,
    SavedCase,
    SavedReport,
    predict_compiled_regions,
    with_regions,
)


def apply_tp(model: Any, mesh: Any, rank: int) -> None:
    """torchtitan v0.2.2 ``apply_tp`` (loss_parallel off, no Float8): per block ``attention_norm`` and
    ``ffn_norm`` ``SequenceParallel()``; ``attention`` ``PrepareModuleInput((Shard(1), None) →
    (Replicate(), None))`` (the sequence-parallel all-gather before q, k, v), ``wq``/``wk``/``wv``
    ``ColwiseParallel()``, ``wo`` ``RowwiseParallel(output_layouts=Shard(1))`` (the reduce-scatter);
    ``feed_forward`` likewise before ``w1``/``w3`` (colwise) and after ``w2`` (rowwise, ``Shard(1)``); the
    final ``norm`` ``SequenceParallel()`` and ``output`` ``ColwiseParallel(input_layouts=Shard(1),
    output_layouts=Replicate())``. The embedding: replicated, its output cut to ``rank``'s sequence shard
    (the module docstring says why)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    world = mesh.size()
    root = {
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    parallelize_module(model, mesh, root)
    for block in model.layers.values():
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        parallelize_module(block, mesh, plan)
    model.tok_embeddings.register_forward_hook(lambda _m, _a, out: out.chunk(world, dim=1)[rank].contiguous())


def measure_rank(
    rank: int, world: int, port: int, arch: Architecture, b: int, s: int, dtype: str, recompute: str
) -> list[MeasuredStorage]:
    """The storages each compiled block of ``rank`` saved in one training forward (regions ``layer <i>``;
    the embedding, the final norm and head and the loss stay eager and are left out)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # each case its own processes: the shapes another case's processes recorded (torch 2.13's on-disk
    # profile-guided automatic dynamic) would make these compile dynamic, which DTensor's rms_norm rejects
    torch._dynamo.config.automatic_dynamic_local_pgo = False
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        model = titan_model(arch, s, dtype, recompute, True, parallelize=lambda m: apply_tp(m, mesh, rank))
        saves = step_saves(model, cross_entropy_loss, arch.vocab_size, b, s)
        return [m for m in saves if m.region.startswith("layer ")]
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, folder: str, args: tuple) -> None:
    import json

    measured = measure_rank(rank, world, port, *args)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump([m.model_dump() for m in measured], f)


def measure_tp(
    arch: Architecture, tp: int, b: int, s: int, dtype: str, recompute: str, port: int = 29533
) -> list[list[MeasuredStorage]]:
    """:func:`measure_rank` on every rank of ``tp`` gloo processes, rank 0 first."""
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(tp, port, folder, (arch, b, s, dtype, recompute)), nprocs=tp)
        out = []
        for rank in range(tp):
            with open(os.path.join(folder, f"rank{rank}.json")) as f:
                out.append([MeasuredStorage(**m) for m in json.load(f)])
    return out


def run_tp_cases(
    models: list[tuple[str, dict[str, Any]]],
    dtypes: list[str],
    recomputes: list[str],
    tp: int,
    shapes: list[tuple[int, int]],
) -> SavedReport:
    """Every model × dtype × recompute × (b, s) measured on each of ``tp`` ranks and compared, block by
    block, with :func:`~zerocalc.validate.saved.predict_compiled_regions` of the rank's shape (t = ``tp``,
    sequence parallel): one case per rank."""
    import transformers

    from zerocalc.model.hf_config import architecture_from_hf_dict

    cases = []
    for name, config in models:
        arch = architecture_from_hf_dict(config, f"--model {name!r}", name)
        for dtype in dtypes:
            for recompute in recomputes:
                for b, s in shapes:
                    shape = Shape(b, s, tp=tp, sequence_parallel=True)
                    predicted = predict_compiled_regions(
                        "torchtitan", arch, shape, dtype, recompute, Compiled.MODEL
                    )
                    layers = {k: v for k, v in predicted.items() if k.startswith("layer ")}
                    for rank, measured in enumerate(measure_tp(arch, tp, b, s, dtype, recompute)):
                        case = SavedCase(
                            model=name, family=arch.family or "", dtype=dtype, attention="sdpa",
                            micro_batch=b, seq_len=s, regions=(),
                            compiled=f"torchtitan --compile model --recompute {recompute} --tp {tp} "
                            f"(sequence parallel) rank {rank}",
                        )  # fmt: skip
                        cases.append(with_regions(case, layers, measured))
    return SavedReport(
        torch=torch.__version__,
        transformers=transformers.__version__,
        cases=tuple(cases),
        all_match=all(c.ok for c in cases),
    )
