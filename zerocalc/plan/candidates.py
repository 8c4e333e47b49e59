"""Each candidate of ``zerocalc plan`` as the requests ``zerocalc memory`` and ``zerocalc comm`` parse from
its printed commands (pure).

A candidate is the plan's parsed base varied by :meth:`~zerocalc.request.training.TrainingRequest.with_`:
its framework, strategy, mesh (:func:`~zerocalc.request.mesh_checks.mesh_of`, the parser's defaults but
the sequence parallelism searched), micro-batch and accumulation, recompute, offload, reduce dtype,
prefetch, grad sync, FP8 setting and memory savers (the fine-tuning method is the base's); the memory request
holds memory's options, the comm request comm's (:func:`~zerocalc.request.unparse.for_command`). Its
printed options are those requests written back as options (:func:`~zerocalc.request.unparse.
options_text`): parsing them gives the same requests (tests/test_plan.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from zerocalc.parallel.fp8 import Fp8Setting
from zerocalc.parallel.frameworks import Estimate
from zerocalc.parallel.mesh import Mesh
from zerocalc.plan.space import Group, PlanRequest
from zerocalc.request.fp8 import fp8_notes
from zerocalc.request.mesh_checks import mesh_of
from zerocalc.request.model_spec import ModelSpec, rank_models
from zerocalc.request.options import Command
from zerocalc.request.training import TrainingRequest, replaced
from zerocalc.request.unparse import for_command, options_text

PRINTED = (
    "model", "gpu", "gpu_memory", "precision", "seq_len", "gpus", "gpus_per_node", "framework",
    "strategies", "micro_batch", "grad_accum", "recompute", "offload_optimizer", "offload_params",
    "reduce_dtype", "prefetch", "grad_sync", "tp", "sequence_parallel", "cp", "pp", "vpp", "ep",
    "pp_first_stage_layers", "fp8", "fp8_all_gather", "loss", "optimizer_in_backward",
    "pp_last_stage_layers", "init", "model_impl", "flash_attention", "compile", "calibration",
    "compute_calibration",
)  # fmt: skip
"""The options a candidate's commands give, in their order; each command takes those of them its options
record names (``prefetch`` and ``init`` memory's, the calibrations comm's). The GPU's (:data:`GIVEN`) are
the plan's (:meth:`~zerocalc.plan.space.PlanRequest.gpu_options`)."""

GIVEN = ("gpu", "gpu_memory", "precision")
"""Printed as the plan gives them, where it does."""

ALWAYS = frozenset({"seq_len", "gpus", "gpus_per_node", "framework", "strategies", "micro_batch",
                    "grad_accum", "recompute"})  # fmt: skip
"""Printed even at their defaults (the prefetch too where the space searches it, the sequence parallelism
with TP)."""


class CandidateRequests:
    """One candidate's memory and comm requests, each made from its group's (at the group's first b) when
    first asked for: a candidate whose bound rules it out is never priced, and most candidates' peaks are
    their group's step parts', which need no memory request at their own b."""

    __slots__ = ("_comm", "_group", "_memory", "accum", "b")

    def __init__(self, b: int, accum: int, group: tuple[TrainingRequest, TrainingRequest]):
        self.b, self.accum = b, accum
        self._group = group
        """The group's memory and comm requests."""
        first = group[0].activations.micro_batch == b
        self._memory: TrainingRequest | None = group[0] if first else None
        self._comm: TrainingRequest | None = group[1] if first else None

    def _at_b(self, request: TrainingRequest) -> TrainingRequest:
        activations = replaced(request.activations, {"micro_batch": self.b})
        return request.with_(activations=activations, grad_accum=self.accum)

    @property
    def memory(self) -> TrainingRequest:
        if self._memory is None:
            self._memory = self._at_b(self._group[0])
        return self._memory

    @property
    def comm(self) -> TrainingRequest:
        if self._comm is None:
            self._comm = self._at_b(self._group[1])
        return self._comm


class AtBatch(Mapping[int, TrainingRequest]):
    """A group's candidates' comm requests by micro-batch (each made when asked for)."""

    def __init__(self, candidates: list[CandidateRequests]):
        self._by_b = {c.b: c for c in candidates}

    def __getitem__(self, b: int) -> TrainingRequest:
        return self._by_b[b].comm

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_b)

    def __len__(self) -> int:
        return len(self._by_b)


class Bases(NamedTuple):
    """The plan's base as memory and comm parse it: what every candidate varies."""

    memory: TrainingRequest
    comm: TrainingRequest
    to_comm: dict[str, Any]
    """The inputs by which comm's base differs from memory's (its estimate, the calibration, memory's
    options at their defaults), and its buffers (a candidate's prefetch is memory's option alone)."""
    last: list[tuple[TrainingRequest, TrainingRequest]]
    """The memory and comm requests of the last group accepted (empty before the first): the next group's
    memory request is varied from its (every group sets the same inputs, so any accepted request is as good a
    start as the base, and :meth:`~zerocalc.request.training.TrainingRequest.with_` re-runs only the checks
    of the inputs by which they differ; the search's groups come in an order where neighbours differ in
    few), its comm request from its memory request."""

    @classmethod
    def of(cls, plan: PlanRequest) -> Bases:
        memory, comm = for_command(plan.base, Command.MEMORY), for_command(plan.base, Command.COMM)
        to_comm = {
            name: getattr(comm, name)
            for name in type(comm).model_fields
            if getattr(comm, name) != getattr(memory, name)
        }
        return cls(memory, comm, {**to_comm, "buffers": comm.buffers}, [])


def group_changes(plan: PlanRequest, group: Group, b: int) -> dict[str, Any]:
    """The typed inputs of the group's candidate at micro-batch ``b`` (its mesh the parser's, with the
    framework's defaults: :func:`~zerocalc.request.mesh_checks.mesh_of`)."""
    base = plan.base
    mesh = mesh_of(
        group.framework, base.model_impl, group.world, group.gpus_per_node,
        group.tp, group.cp, group.pp, group.vpp, group.ep,
        first=group.end_stage_layers, last=group.end_stage_layers,
        sequence_parallel=group.sequence_parallel,
    )  # fmt: skip
    return {
        "mesh": mesh,
        "framework": group.framework,
        "strategies": (group.strategy,),
        "strategies_explicit": True,
        "reduce_dtype": group.reduce_dtype,
        "grad_accum": group.accumulation(plan.global_batch_sequences, b),
        "grad_sync": group.grad_sync,
        "activations": replaced(
            base.activations, {"micro_batch": b, "recompute": group.recompute, "loss": group.loss}
        ),
        "optimizer_in_backward": group.optimizer_in_backward,
        "offload_optimizer": group.offload_optimizer,
        "offload_params": group.offload_params,
        "fp8": group.fp8,
        "notes": (*base.notes, *_fp8_notes(group.fp8, base.model, mesh)) if group.fp8.on else base.notes,
    }


def _fp8_notes(fp8: Fp8Setting, model: ModelSpec, mesh: Mesh) -> tuple[str, ...]:
    """What the FP8 recipe converts of the rank's model, the note parsing adds
    (:func:`~zerocalc.request.fp8.fp8_notes`)."""
    return fp8_notes(fp8, rank_models(model, mesh)[0].architecture)


def group_requests(plan: PlanRequest, group: Group, bases: Bases) -> list[CandidateRequests]:
    """Each candidate of the group: its b, its A and its memory and comm requests, or the parser's
    :class:`~zerocalc.base.errors.InputError` for the group (the first b's requests checked whole, the
    others varied in b and A from them)."""
    first = group.micro_batches[0]
    changes = group_changes(plan, group, first)
    prefetch = {} if group.prefetch is None else {"prefetch": group.prefetch}  # memory's option alone
    buffers = replaced(bases.memory.buffers, prefetch)
    start = bases.last[0][0] if bases.last else bases.memory
    memory = start.with_(**changes, buffers=buffers)
    # the checks of what comm's options change (the others read what memory's request passed): fewer than
    # those of what the group changes
    comm = memory.with_(**bases.to_comm)
    bases.last[:] = [(memory, comm)]
    return [
        CandidateRequests(b, group.accumulation(plan.global_batch_sequences, b), (memory, comm))
        for b in group.micro_batches
    ]


def printed_options(
    plan: PlanRequest, group: Group, request: TrainingRequest, command: Command
) -> dict[str, str]:
    """The candidate's ``zerocalc memory`` or ``zerocalc comm`` options (concept → value as typed): its
    request written back (:func:`~zerocalc.request.unparse.options_text`), the model, the GPU and the
    fine-tuning method as the plan was given them, the node the group's (a node above the world is kept as
    the world by the request)."""
    gpu = plan.gpu_options(Estimate(command.value))
    given = {"model": plan.model, **gpu, "gpus_per_node": str(group.gpus_per_node), **plan.finetune_options}
    always = ALWAYS | ({"prefetch"} if group.prefetch is not None else set())
    always |= {"sequence_parallel"} if group.tp > 1 else set()
    names = [name for name in PRINTED if name in gpu or name not in GIVEN] + list(plan.finetune_options)
    return options_text(request, command, names, given, always)
