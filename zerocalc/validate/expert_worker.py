"""The torch side of ``zerocalc validate expert``: one rank of an expert-parallel MoE layer with a fixed
router (imports torch).

Run as ``python -m zerocalc.validate.expert_worker JOB_JSON...`` by
:func:`zerocalc.harness.procs.spawn_series`. The ranks form a (world/e, e) device mesh, the expert-parallel
dimension innermost; each rank holds its E/e experts (an h × f and an f × h weight each, GELU between),
makes b·s random hidden states (requiring grad), routes each to the k experts
:func:`zerocalc.validate.expert.routed_experts` names (gate 1/k), and runs one forward and backward of the
layer with torchtitan's exchange (:mod:`zerocalc.validate.expert`): counts, dispatch, the local experts on
the rows they received, combine, the weighted sum per token, ``loss = out.pow(2).mean()``. Every
``_c10d_functional.all_to_all_single`` is recorded (its input split sizes, in elements; the group's
ranks), and any other collective is counted. The rest of a rank (the jobs, the world, the hand-back, the
tear-down) is :mod:`zerocalc.validate.rank_main`'s.
"""

from __future__ import annotations

import gc
from typing import Any

from zerocalc.harness import procs

if __name__ == "__main__":
    procs.exit_quietly_on_ctrl_c()  # before torch's slow import

import torch
import torch.nn.functional as F

from zerocalc.bench.topology import Placement
from zerocalc.validate.expert import A2ACall, ExpertJob, ExpertMeasured, routed_experts
from zerocalc.validate.measure import CollectiveRecorder, dtype_name, group_ranks
from zerocalc.validate.rank_main import rank_main


class AllToAllRecorder(CollectiveRecorder):
    """Every ``_c10d_functional.all_to_all_single`` with what it sends to each rank; other collectives are
    recorded by :class:`CollectiveRecorder`."""

    def __init__(self) -> None:
        super().__init__()
        self.all_to_all: list[A2ACall] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if getattr(func, "namespace", None) != "_c10d_functional" or name != "all_to_all_single":
            return super().__torch_dispatch__(func, types, args, kwargs)
        out = func(*args, **(kwargs or {}))
        source, input_splits, group_name = args[0], args[2], args[3]
        ranks = group_ranks(torch._C._distributed_c10d._resolve_process_group(group_name))
        row = source[0].numel() if source.dim() > 1 and source.shape[0] else 1
        splits = (
            tuple(int(n) * row for n in input_splits)
            if input_splits is not None
            else (source.numel() // len(ranks),) * len(ranks)
        )
        self.all_to_all.append(
            A2ACall(
                what="", phase=self.phase, dtype=dtype_name(source), splits=splits, group_ranks=tuple(ranks)
            )
        )
        return out


def _measure(job: ExpertJob, placement: Placement, device: Any) -> ExpertMeasured:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        device.type, (placement.world_size // job.ep, job.ep), mesh_dim_names=("edp", "ep")
    )
    group = mesh["ep"].get_group()
    ep_rank, per, h = placement.rank % job.ep, job.experts_per_rank, job.hidden
    gen = torch.Generator().manual_seed(job.seed + placement.rank)
    w_in = torch.nn.Parameter((torch.randn(per, h, job.ffn, generator=gen) * 0.02).to(device))
    w_out = torch.nn.Parameter((torch.randn(per, job.ffn, h, generator=gen) * 0.02).to(device))
    x = torch.randn(job.tokens, h, generator=gen).to(device).requires_grad_(True)
    chosen = routed_experts(job.routing, ep_rank, job.tokens, job.experts, job.top_k)
    pairs = sorted((expert, token) for token, experts in enumerate(chosen) for expert in experts)
    pair_tokens = torch.tensor([token for _, token in pairs], device=device)
    counts = torch.zeros(job.experts, dtype=torch.int64)
    for expert, _ in pairs:
        counts[expert] += 1
    recorder = AllToAllRecorder()
    with recorder:
        recorder.phase = "forward"
        received_counts = funcol.wait_tensor(funcol.all_to_all_single(counts.to(device), None, None, group))
        send = counts.view(job.ep, per).sum(1).tolist()
        by_source = received_counts.view(job.ep, per).cpu()
        recv = by_source.sum(1).tolist()
        routed = x[pair_tokens]  # sorted by expert: by destination rank
        received = funcol.wait_tensor(funcol.all_to_all_single_autograd(routed, recv, send, group))
        # received rows: source by source, each source's rows expert by expert
        starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.int64), by_source.flatten()]), 0).tolist()
        rows_of = [
            [r for s in range(job.ep) for r in range(starts[s * per + e], starts[s * per + e + 1])]
            for e in range(per)
        ]
        order = [r for rows in rows_of for r in rows]
        outputs = [
            F.gelu(received[torch.tensor(rows, dtype=torch.long, device=device)] @ w_in[e]) @ w_out[e]
            for e, rows in enumerate(rows_of)
        ]
        back = torch.empty_like(received)
        back = back.index_copy(0, torch.tensor(order, dtype=torch.long, device=device), torch.cat(outputs))
        returned = funcol.wait_tensor(funcol.all_to_all_single_autograd(back, send, recv, group))
        out = torch.zeros_like(x).index_add(0, pair_tokens, returned / job.top_k)
        loss = out.pow(2).mean()
        recorder.phase = "backward"
        loss.backward()
    figures = ExpertMeasured(
        rank=placement.rank,
        params=sum(p.numel() * p.element_size() for p in (w_in, w_out)),
        calls=recorder.all_to_all,
        other_collectives=len(recorder.calls),
    )
    del w_in, w_out, x, loss, out, received, returned
    gc.collect()
    return figures


def main(argv: list[str] | None = None) -> int:
    """A spawned rank: every expert-parallel configuration given (one JSON job per argument) in one world."""
    return rank_main(ExpertJob, _measure, argv)


if __name__ == "__main__":
    procs.exit_now(main())
