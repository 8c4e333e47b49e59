"""``zerocalc validate expert``: the all-to-alls of an expert-parallel MoE layer, predicted and compared
(pure, no torch).

A tiny MoE layer (:data:`EXPERTS_PER_RANK` experts per rank, top-:data:`TOP_K`, hidden :data:`HIDDEN`,
MLP :data:`FFN`) is sharded over e expert-parallel ranks, carved from the data-parallel ranks as
torchtitan and Megatron-LM carve them: consecutive ranks form a group (rank r is rank r mod e of group
⌊r/e⌋), and EP rank j holds experts j·E/e … (j+1)·E/e − 1. Each rank routes its own b·s tokens, each to
k experts, and exchanges them as torchtitan's ``ExpertParallel`` does
(``torchtitan/distributed/expert_parallel.py`` ``_token_dispatch`` / ``_token_combine``, with
``torch.distributed._functional_collectives``):

1. ``all_to_all_single`` of the tokens-per-expert counts (E int64, E/e to each rank), forward only;
2. dispatch: ``all_to_all_single_autograd`` of the routed tokens (k·b·s rows of h, sorted by expert, so
   by destination rank), split by how many go to each rank;
3. combine: the experts' outputs back, the reverse split;

and in backward the combine's gradient (split as the dispatch) and then the dispatch's (split as the
combine). The router is fixed, so every split is known before the run (:func:`routed_experts`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from zerocalc.base.dtypes import DType
from zerocalc.base.errors import InputError
from zerocalc.harness import procs
from zerocalc.harness.series import run_series
from zerocalc.model.activations import routed_rows
from zerocalc.network.collectives import COLLECTIVES, Collective
from zerocalc.validate.compare import LineResult

EXPERTS_PER_RANK = 2
TOP_K = 2
HIDDEN = 64
FFN = 96
ROUTINGS = ("balanced", "skewed")
"""The fixed routings (:func:`routed_experts`)."""
COUNTS, DISPATCH, COMBINE = "counts", "dispatch", "combine"


def check_expert(ep: int, world: int) -> None:
    """One line (InputError) for an expert-parallel degree validate cannot build: 2 or more, dividing the
    ranks."""
    if ep < 2 or world % ep:
        raise InputError(
            f"--ep {ep} with {world} ranks is not accepted; accepted: 2 or more expert-parallel ranks "
            "dividing --nproc"
        )


class ExpertJob(BaseModel):
    """One configuration: e expert-parallel ranks and a routing."""

    model_config = ConfigDict(frozen=True)

    ep: int = Field(ge=2)
    routing: str = Field(description="balanced or skewed")
    tokens: int = Field(ge=1, description="b·s: the tokens each rank routes")
    backend: str
    timeout_s: float = Field(gt=0)
    experts_per_rank: int = EXPERTS_PER_RANK
    top_k: int = TOP_K
    hidden: int = HIDDEN
    ffn: int = FFN
    seed: int = 0

    @property
    def experts(self) -> int:
        return self.ep * self.experts_per_rank

    @property
    def title(self) -> str:
        return f"ep {self.ep} · {self.experts} experts, top-{self.top_k} · {self.routing} routing"


def routed_experts(routing: str, rank: int, tokens: int, experts: int, top_k: int) -> list[tuple[int, ...]]:
    """The k experts of each of ``rank``'s tokens. ``balanced``: choice i of token t goes to expert
    (t·k + i + rank) mod E, a round robin (each expert gets k·T/E of a rank's choices when E divides
    k·T); ``skewed``: every token goes to experts 0 … k−1, those of the first EP rank (for k ≤ E/e)."""
    if routing == "skewed":
        return [tuple(range(top_k)) for _ in range(tokens)]
    return [tuple((t * top_k + i + rank) % experts for i in range(top_k)) for t in range(tokens)]


def tokens_per_expert(job: ExpertJob, ep_rank: int) -> list[int]:
    """How many of ``ep_rank``'s routed tokens each expert gets."""
    counts = [0] * job.experts
    for chosen in routed_experts(job.routing, ep_rank, job.tokens, job.experts, job.top_k):
        for expert in chosen:
            counts[expert] += 1
    return counts


def send_rows(job: ExpertJob, ep_rank: int) -> list[int]:
    """The rows ``ep_rank`` dispatches to each EP rank: its tokens routed to that rank's experts."""
    counts, per = tokens_per_expert(job, ep_rank), job.experts_per_rank
    return [sum(counts[d * per : (d + 1) * per]) for d in range(job.ep)]


def recv_rows(job: ExpertJob, ep_rank: int) -> list[int]:
    """The rows ``ep_rank`` receives from each EP rank in the dispatch (and sends back in the combine)."""
    return [send_rows(job, source)[ep_rank] for source in range(job.ep)]


class A2ACall(BaseModel):
    """One all-to-all of a rank: what it sends to each rank of its group, in elements."""

    model_config = ConfigDict(frozen=True)

    what: str = Field(description="counts, dispatch or combine (predicted; a recorded call has none)")
    phase: str
    dtype: str
    splits: tuple[int, ...] = Field(description="elements sent to each rank of the group, itself included")
    group_ranks: tuple[int, ...]

    def key(self) -> tuple[str, str, tuple[int, ...], tuple[int, ...]]:
        return (self.phase, self.dtype, self.splits, self.group_ranks)

    def bytes_to_others(self, rank: int) -> int:
        """Bytes leaving ``rank`` (its own split stays)."""
        size = {d.value: d.bytes for d in DType}.get(self.dtype, 8 if self.dtype == "int64" else 0)
        return sum(n for r, n in zip(self.group_ranks, self.splits, strict=True) if r != rank) * size


def predicted_calls(job: ExpertJob, rank: int) -> list[A2ACall]:
    """``rank``'s all-to-alls in one forward and backward, in order (the module docstring)."""
    ep_rank, first = rank % job.ep, rank - rank % job.ep
    group = tuple(range(first, first + job.ep))
    send = tuple(n * job.hidden for n in send_rows(job, ep_rank))
    recv = tuple(n * job.hidden for n in recv_rows(job, ep_rank))
    fp32 = DType.FP32.value
    return [
        A2ACall(
            what=COUNTS,
            phase="forward",
            dtype="int64",
            splits=(job.experts_per_rank,) * job.ep,
            group_ranks=group,
        ),
        A2ACall(what=DISPATCH, phase="forward", dtype=fp32, splits=send, group_ranks=group),
        A2ACall(what=COMBINE, phase="forward", dtype=fp32, splits=recv, group_ranks=group),
        A2ACall(what=COMBINE, phase="backward", dtype=fp32, splits=send, group_ranks=group),
        A2ACall(what=DISPATCH, phase="backward", dtype=fp32, splits=recv, group_ranks=group),
    ]


def predicted_dispatch_bytes(tokens: int, top_k: int, hidden: int, dtype: DType, ep: int) -> int:
    """Bytes one rank's dispatch sends to the other EP ranks under a balanced routing, as the analytic
    expert-parallel model prices it (:func:`zerocalc.comm.mesh.ep_layer`): S = k·b·s·h elements routed
    (:func:`~zerocalc.model.activations.routed_rows` at capacity factor 1), (e − 1)/e of them to other
    ranks (the all_to_all bus factor; exact when E divides k·b·s); the combine sends as many back, and
    backward repeats both."""
    message = routed_rows(top_k * tokens, 1.0) * hidden * dtype.bytes
    return COLLECTIVES[Collective.ALL_TO_ALL].bytes_sent_per_rank(message, ep)


def expert_param_bytes(job: ExpertJob) -> int:
    """Each rank's expert weights: E/e experts of an h × f and an f × h matrix, fp32."""
    return job.experts_per_rank * 2 * job.hidden * job.ffn * DType.FP32.bytes


class ExpertMeasured(BaseModel):
    rank: int
    params: int
    calls: list[A2ACall] = Field(description="every all-to-all, in order")
    other_collectives: int = Field(description="collectives that are not all-to-alls (none expected)")


class A2AResult(BaseModel):
    what: str
    phase: str
    predicted_splits: tuple[int, ...]
    measured_splits: tuple[int, ...] | None
    predicted_bytes: int = Field(description="sent to the other ranks of the group")
    measured_bytes: int | None
    ok: bool


class ExpertRankResult(BaseModel):
    rank: int
    params: LineResult
    calls: list[A2AResult]
    ok: bool


class ExpertConfigResult(BaseModel):
    title: str
    routing: str
    status: str = Field(description="match, mismatch or failed")
    error: str | None = None
    seconds: float | None = None
    ranks: list[ExpertRankResult] = []


class ExpertReport(BaseModel):
    world_size: int
    ep: int
    experts: int
    top_k: int
    hidden: int
    tokens_per_rank: int
    backend: str
    configs: list[ExpertConfigResult]
    all_match: bool


def compare_expert(
    job: ExpertJob, measured: list[ExpertMeasured], seconds: float | None
) -> ExpertConfigResult:
    """Each rank's all-to-alls against :func:`predicted_calls`, call by call (phase, dtype, elements to
    each rank, group), and its expert weights against :func:`expert_param_bytes`."""
    ranks = []
    for meas in sorted(measured, key=lambda m: m.rank):
        predicted = predicted_calls(job, meas.rank)
        calls = []
        for index, mine in enumerate(predicted):
            theirs = meas.calls[index] if index < len(meas.calls) else None
            calls.append(
                A2AResult(
                    what=mine.what,
                    phase=mine.phase,
                    predicted_splits=mine.splits,
                    measured_splits=None if theirs is None else theirs.splits,
                    predicted_bytes=mine.bytes_to_others(meas.rank),
                    measured_bytes=None if theirs is None else theirs.bytes_to_others(meas.rank),
                    ok=theirs is not None and theirs.key() == mine.key(),
                )
            )
        weights = expert_param_bytes(job)
        params = LineResult(
            line="params",
            predicted=weights,
            measured=meas.params,
            difference=meas.params - weights,
            ok=meas.params == weights,
            model_state=True,
            explanation=(
                f"{job.experts_per_rank} experts of {job.hidden} × {job.ffn} and {job.ffn} × {job.hidden} "
                "weights, fp32"
            ),
        )
        ok = (
            all(c.ok for c in calls)
            and len(meas.calls) == len(predicted)
            and not meas.other_collectives
            and bool(params.ok)
        )
        ranks.append(ExpertRankResult(rank=meas.rank, params=params, calls=calls, ok=ok))
    return ExpertConfigResult(
        title=job.title,
        routing=job.routing,
        status="match" if all(r.ok for r in ranks) else "mismatch",
        seconds=seconds,
        ranks=ranks,
    )


def run_expert(
    ep: int,
    routings: list[str],
    tokens: int,
    nproc: int,
    timeout_s: float,
    on_result: Callable[[ExpertConfigResult, int, int], None] | None = None,
) -> ExpertReport:
    """Every routing in one world of ``nproc`` spawned ranks (a fresh one after a failure), compared."""
    from zerocalc.validate.run import visible_gpus

    check_expert(ep, nproc)
    procs.check_nproc(nproc, visible_gpus())
    backend = "nccl" if visible_gpus() else "gloo"
    jobs = [
        ExpertJob(ep=ep, routing=r, tokens=tokens, backend=backend, timeout_s=timeout_s) for r in routings
    ]

    def failed(job: ExpertJob, error: str, seconds: float) -> ExpertConfigResult:
        return ExpertConfigResult(
            title=job.title, routing=job.routing, status="failed", error=error, seconds=seconds
        )

    def compared(index: int, measured: list[ExpertMeasured], seconds: float) -> ExpertConfigResult:
        return compare_expert(jobs[index], measured, seconds)

    def collect(text: str) -> list[ExpertMeasured]:
        return [ExpertMeasured.model_validate(m) for m in json.loads(text)]

    module = "zerocalc.validate.expert_worker"
    results = run_series(module, jobs, nproc, timeout_s, collect, failed, compared, on_result)
    first = jobs[0]
    return ExpertReport(
        world_size=nproc,
        ep=ep,
        experts=first.experts,
        top_k=first.top_k,
        hidden=first.hidden,
        tokens_per_rank=tokens,
        backend=backend,
        configs=results,
        all_match=all(r.status == "match" for r in results),
    )
