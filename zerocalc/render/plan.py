"""A plan's candidate as ``zerocalc plan`` names it: its row's label and the ``memory``/``comm`` commands
that reproduce it (shared by the CLI's table and the HTML figure of every candidate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zerocalc.plan.search import PlanRow


def command(name: str, options: dict[str, str]) -> str:
    """``zerocalc memory --model ... --gpus 8 ...``: a candidate's options as a command line."""
    import shlex

    from zerocalc.request.options import FLAGS, NEGATIVE_FLAGS, OPTIONS, Kind

    flags = {o.name for o in OPTIONS if o.kind is Kind.FLAG}
    parts = ["zerocalc", name]
    for concept, value in options.items():
        if concept in NEGATIVE_FLAGS:  # a switch: its flag, or its negative flag
            parts.append(FLAGS[concept] if value == "true" else NEGATIVE_FLAGS[concept])
        elif concept in flags:  # a flag (--dora): given, or not
            parts += [FLAGS[concept]] if value == "true" else []
        else:
            parts += [FLAGS[concept], shlex.quote(value)]
    return " ".join(parts)


def candidate_label(row: PlanRow) -> str:
    """The Configuration cell of ``plan``'s table: rank, framework, strategy, GPUs and mesh, then b×A and
    what else the candidate sets (recompute, offload, reduce dtype, prefetch, gradient sync)."""
    node = f" g{row.gpus_per_node}" if row.strategy.value == "hybrid_shard" else ""
    extras = [f"b{row.micro_batch}×A{row.grad_accum}"]
    if row.recompute.value != "none":
        extras.append(f"rc {row.recompute.value}")
    if row.offload_optimizer.value != "none":
        extras.append(f"opt→{row.offload_optimizer.value}")
    if row.offload_params.value != "none":
        extras.append(f"params→{row.offload_params.value}")
    if row.reduce_dtype is not None:
        extras.append(f"reduce {row.reduce_dtype.value}")
    if row.prefetch is not None:
        extras.append(f"prefetch {row.prefetch}")
    if row.grad_sync is not None:
        extras.append(f"sync {row.grad_sync.value}")
    if row.fp8.value != "none":
        extras.append(f"fp8 {row.fp8.value}" + ("+ag" if row.fp8_all_gather else ""))
    if row.loss.value != "full":
        extras.append(f"loss {row.loss.value}")
    if row.optimizer_in_backward:
        extras.append("opt in bwd")
    framework = row.framework.value
    named = framework.replace("-", "") in row.title.lower().replace("-", "")  # "FSDP2 HSDP" names fsdp2
    names = (("tp", row.tp), ("cp", row.cp), ("pp", row.pp), ("v", row.vpp), ("ep", row.ep))
    mesh = "".join(f" {name}{degree}" for name, degree in names if degree > 1)
    if row.sequence_parallel:  # its TP degree: ``tp8+sp pp2``
        mesh = mesh.replace(f" tp{row.tp}", f" tp{row.tp}+sp", 1)
    rank = f"{row.rank}. " if row.rank is not None else ""
    head = f"{rank}{'' if named else framework + ' '}{row.title}{node} ×{row.gpus}{mesh}"
    return head + "\n" + " ".join(extras)
