"""Every part of a computation over a request reads only the fields its declaration names: its cache key
(zerocalc.base.parts) is derived from that declaration, so a field read and not named would let a search
share one request's result with another that differs in it (a plan gave candidates another's numbers
twice so: the reduce dtype, then ``checkpoint_every``, missing from hand-written keys).

Each part runs on a proxy of a request that records the path of every field read: a field of the request,
a field of its activations or buffers (``activations.micro_batch``), and through the request's derived
properties (``dtypes``, ``rank_model``, ``cluster`` ...) the fields they read; a method of the request, or
one of its activations or buffers as a whole, is recorded as reading all of it."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest
from pydantic import BaseModel

from zerocalc.base.parts import UNCACHED, Part, PartCache, Same, key_value
from zerocalc.comm.step import STEP_PARTS
from zerocalc.compute.table import ComputeTable
from zerocalc.network.schedule import GradSync
from zerocalc.parallel.framework_records import effective_grad_sync
from zerocalc.parallel.mesh import Mesh
from zerocalc.peak.evaluate import OUTSIDE_BYTES
from zerocalc.peak.simulate import FIRST_STAGE_SAVED, runtime_for
from zerocalc.plan.allocated import FRAMEWORK_PART, MODEL_PART, MODEL_STEP_PARTS
from zerocalc.plan.split import model_run
from zerocalc.request.checks import CHECKS
from zerocalc.request.compute import compute_table
from zerocalc.request.training import (
    DERIVED,
    ActivationOptions,
    BufferOptions,
    TrainingRequest,
    parse_options,
)
from zerocalc.states.memory import STATES_BYTES

TRACED_SUB_MODELS = (ActivationOptions, BufferOptions, Mesh)
"""The request's sub-models whose fields are recorded one by one (parts declare ``activations.seq_len``,
``mesh.tp``); of the others (the model, the GPU, the links) a read is of all of it."""


class Traced:
    """A request, or one of its activations, buffers or mesh, recording the path of each field read into
    ``reads``; ``isinstance`` sees the object it stands for. A derived property the part declares
    (``declared``: ``accumulates``, ``model_code``) is recorded as read itself, the others resolved to what
    they read."""

    __slots__ = ("_declared", "_held", "_path", "_reads")

    def __init__(self, held: BaseModel, path: str, reads: set[str], declared: tuple[str, ...] = ()):
        object.__setattr__(self, "_held", held)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_declared", declared)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(object.__getattribute__(self, "_held"))

    def _whole(self) -> BaseModel:
        """The object itself, recorded as read whole."""
        object.__getattribute__(self, "_reads").add(object.__getattribute__(self, "_path") or "*")
        return object.__getattribute__(self, "_held")

    def __getattr__(self, name: str) -> Any:
        held = object.__getattribute__(self, "_held")
        path = object.__getattribute__(self, "_path")
        reads = object.__getattribute__(self, "_reads")
        kind = type(held)
        full = f"{path}.{name}" if path else name
        if name in kind.model_fields:
            value = getattr(held, name)
            if not path and isinstance(value, TRACED_SUB_MODELS):
                return Traced(value, full, reads)
            reads.add(full)
            return value
        static = inspect.getattr_static(kind, name, None)
        if isinstance(static, property):
            if full in object.__getattribute__(self, "_declared"):  # read as such: in the key
                reads.add(full)
                return getattr(held, name)
            return static.fget(self)  # type: ignore[misc]  # derived: what it reads
        reads.add(path or "*")  # a method or anything else may read all of it
        return getattr(held, name)

    def __setattr__(self, name: str, value: object) -> None:  # pragma: no cover - frozen models
        raise AttributeError(name)

    def __hash__(self) -> int:
        return hash(Traced._whole(self))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Traced):
            other = Traced._whole(other)
        return Traced._whole(self) == other

    def __iter__(self) -> Iterator[Any]:
        return iter(Traced._whole(self))

    def __repr__(self) -> str:
        return f"Traced({object.__getattribute__(self, '_path') or 'request'})"


def reads_of(part: Part, request: TrainingRequest, *args: object) -> set[str]:
    """The paths ``part`` reads of ``request`` (its sub-parts' included) run on a :class:`Traced` proxy."""
    reads: set[str] = set()
    part.run(Traced(request, "", reads, part.reads), UNCACHED, *args)
    return reads


def undeclared(part: Part, request: TrainingRequest, *args: object) -> set[str]:
    """The paths ``part`` reads that its declaration does not name."""
    return {path for path in reads_of(part, request, *args) if not part.names(path)}


@cache
def requests() -> dict[str, TrainingRequest]:
    """Requests that take each part down its branches: data-parallel, tensor-, context-, pipeline- and
    expert-parallel meshes, offload, ZeRO++, interleaved stages, comm's and memory's, FP8 (its all-gather)
    and fine-tuning (LoRA, a 4-bit base)."""
    gpt2 = dict(model="gpt2", seq_len=512)
    return {
        "ddp": parse_options(**gpt2, gpus=4, framework="ddp"),
        "fsdp2 accumulating": parse_options(
            **gpt2, gpus=8, framework="fsdp2", strategies="full_shard", grad_accum=4, grad_sync="last"
        ),
        "paper, no architecture": parse_options(params="7B", gpus=8),
        "deepspeed offload": parse_options(
            **gpt2,
            gpus=8,
            framework="deepspeed",
            strategies="zero3",
            offload_optimizer="cpu",
            offload_params="cpu",
            zeropp="hpz",
            gpus_per_node=4,
        ),
        "megatron tp cp pp": parse_options(
            model="llama-3-8b",
            seq_len=4096,
            gpus=32,
            framework="megatron",
            tp=2,
            cp=2,
            pp=4,
            vpp=2,
            grad_accum=8,
            recompute="full",
            checkpoint_every=2,
        ),
        "fsdp2 ep": parse_options(
            model="qwen1.5-moe-a2.7b",
            seq_len=1024,
            gpus=16,
            framework="fsdp2",
            ep=4,
            strategies="zero3",
            capacity_factor=1.25,
        ),
        "comm": parse_options(
            model="llama-3-8b",
            seq_len=2048,
            gpus=16,
            framework="fsdp2",
            tp=2,
            pp=2,
            estimate="comm",
            reduce_dtype="fp32",
            micro_batch=2,
            grad_accum=2,
        ),
        "fsdp2 fp8 all-gather": parse_options(
            **gpt2,
            gpus=8,
            framework="fsdp2",
            strategies="zero3",
            fp8="tensorwise",
            fp8_all_gather=True,
            fp8_precompute_scales=True,
        ),
        "megatron fp8": parse_options(
            **gpt2, gpus=8, framework="megatron", strategies="zero1", fp8="delayed", fp8_all_gather=True
        ),
        "fsdp2 lora": parse_options(**gpt2, gpus=4, framework="fsdp2", lora_rank=8),
        "ddp qlora": parse_options(**gpt2, gpus=4, framework="ddp", lora_rank=8, quantize="nf4"),
    }


@pytest.mark.parametrize("part", CHECKS, ids=lambda part: part.name)
def test_every_check_reads_only_what_it_declares(part: Part) -> None:
    for name, request in requests().items():
        assert not undeclared(part, request), (name, undeclared(part, request))


def test_the_tracer_records_fields_properties_and_wholes() -> None:
    """The proxy itself: a field, a field of the activations, a derived property resolved to its inputs,
    a sub-model read whole, a method of the request; each property of DERIVED is a property."""
    request = requests()["megatron tp cp pp"]
    reads: set[str] = set()
    traced = Traced(request, "", reads)
    assert isinstance(traced, TrainingRequest) and isinstance(traced.mesh, Mesh)
    assert traced.activations.seq_len == 4096 and traced.dtypes == request.dtypes
    assert reads == {"activations.seq_len", "framework", "precision", "reduce_dtype"}
    assert traced.mesh.tp == 2 and traced.mesh.dp == 2 and "mesh.tp" in reads and "mesh.world" in reads
    traced.mesh.data_cluster()
    assert "mesh" in reads
    assert traced.rank_model == request.rank_model and {"model", "stage"} <= reads
    hash(traced.buffers)
    traced.model_copy()
    assert {"buffers", "*"} <= reads
    assert all(isinstance(inspect.getattr_static(TrainingRequest, name), property) for name in DERIVED)


def test_a_part_undeclared_read_is_found() -> None:
    """The test can fail: a part reading ``grad_accum`` without naming it."""
    careless = Part("careless", ("mesh",), lambda request, parts: (request.mesh.tp, request.grad_accum))
    assert undeclared(careless, requests()["ddp"]) == {"grad_accum"}


def test_a_key_holds_values_and_objects_by_identity() -> None:
    """key_value: numbers, strings, enums, None and tuples of them by value; any other object by identity
    (held, so never another object's)."""
    request = requests()["ddp"]
    assert (
        key_value(3) == 3
        and key_value((1, 2)) == (1, 2)
        and key_value(request.framework) is request.framework
    )
    same = key_value(request.mesh)
    assert isinstance(same, Same) and same == Same(request.mesh) and same != Same(request.mesh.model_copy())
    part = Part("tp and A", ("mesh.tp", "grad_accum"), lambda r, parts: r.mesh.tp * r.grad_accum)
    assert part.key(request) == (1, 1)
    cache = PartCache()
    assert cache.get(part, request) == 1 and cache.get(part, request.with_(grad_accum=2)) == 2
    assert cache.size(part) == 2


def test_with_runs_the_checks_of_what_changed() -> None:
    """request.with_ re-checks what a change can break (the parser's line), and refuses a name that is not
    an input."""
    request = requests()["megatron tp cp pp"]
    with pytest.raises(Exception, match="micro-batches run in groups of 4"):
        request.with_(grad_accum=6)
    with pytest.raises(TypeError, match="cluster"):
        request.with_(cluster=request.cluster)
    assert request.with_(stage=2).rank_model == request.stages[2]


@cache
def _table() -> ComputeTable:
    table = compute_table(None, "h100-80gb")
    assert table is not None
    return table.table


def _sync(request: TrainingRequest) -> GradSync:
    name = request.strategies[0]
    return effective_grad_sync(request.framework, name, request.grad_sync, pipelined=request.mesh.pp > 1)


STEP_ARGS = {
    "pipeline sends": lambda r: (),
    "mesh collectives' request": lambda r: (),
    "mesh collectives": lambda r: (_sync(r),),
    "data-parallel collectives": lambda r: (r.strategies[0],),
    "data-parallel lines": lambda r: (r.strategies[0], _sync(r)),
    "stages' micro-batches": lambda r: (_table(),),
    "stages' computes": lambda r: (_table(), r.strategies[0]),
    "step": lambda r: (_table(), r.strategies[0]),
}
"""Each step part's arguments beside the request."""


@pytest.mark.parametrize("part", STEP_PARTS, ids=lambda part: part.name)
def test_every_part_of_a_step_reads_only_what_it_declares(part: Part) -> None:
    for name, request in requests().items():
        if request.model.architecture is None:
            continue  # no step without an architecture
        args = STEP_ARGS[part.name](request)
        assert not undeclared(part, request, *args), (name, undeclared(part, request, *args))


PEAK_PARTS = {
    OUTSIDE_BYTES: (lambda r: (r.strategies[0],), lambda r: True),
    STATES_BYTES: (lambda r: (), lambda r: True),
    FIRST_STAGE_SAVED: (lambda r: (), lambda r: r.model.architecture is not None),
    MODEL_PART: (lambda r: (), lambda r: r.model.architecture is not None and r.mesh.pp == 1),
    FRAMEWORK_PART: (
        lambda r: (model_run(r, runtime_for(r)).calls,),
        # plan, whose split step this part is, takes no FP8 option (FSDP2's fp8 scales are memory's)
        lambda r: r.model.architecture is not None and r.mesh.pp == 1 and not r.fp8.on,
    ),
    MODEL_STEP_PARTS: (lambda r: (), lambda r: True),
}
"""The peak's parts a plan's candidates share, each with its arguments and the requests it is for (the
step's parts without pipeline stages: a pipelined candidate's peak is the walk's)."""


@pytest.mark.parametrize("part", list(PEAK_PARTS), ids=lambda part: part.name)
def test_every_part_of_a_peak_reads_only_what_it_declares(part: Part) -> None:
    args_of, applies = PEAK_PARTS[part]
    checked = 0
    for name, request in requests().items():
        if applies(request):
            args = args_of(request)
            assert not undeclared(part, request, *args), (name, undeclared(part, request, *args))
            checked += 1
    assert checked >= 3
