"""Functions and data shared by several test files (the shared fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol, TypeVar

from zerocalc.api import estimate_peak
from zerocalc.base.errors import InputError
from zerocalc.model.architecture import Architecture
from zerocalc.model.code import Device
from zerocalc.parallel.strategies import OffloadTarget
from zerocalc.peak.kinds import TensorKind
from zerocalc.peak.ledger import Ledger
from zerocalc.plan.candidates import Bases, group_requests
from zerocalc.plan.space import Group, PlanRequest
from zerocalc.request.options import Command
from zerocalc.request.presets import load_model
from zerocalc.request.training import parse_options

BIN = Path(sys.executable).parent
"""The virtual environment's scripts (torchrun)."""

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
"""The repository (README.md, docs/, presets/, zerocalc/)."""
DATA = TESTS / "data"
"""Measurements and files the tests read (``tests/data``)."""

LLAMA_2_7B_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
                     "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "intermediate_size": 11008}  # fmt: skip
"""Llama-2-7b's config.json, the keys that decide its count."""
LLAMA_2_7B = 6_738_415_616
"""Llama-2-7b's published parameter count."""

SMALL_PLAN = [
    "plan",
    "--model",
    "gpt2",
    "--gpu",
    "rtx-4090",
    "--gpus",
    "2",
    "--global-batch",
    "8seq",
    "--top",
    "1",
]
"""A plan that searches in a fraction of a second (GPT-2 on two RTX 4090s, 8 sequences, the top row)."""

H100_DATA = DATA / "h100-fsdp2-hf"
H100_STEPS: list[dict[str, Any]] = [
    json.loads(line) for line in (H100_DATA / "steps.jsonl").read_text().splitlines()
]
"""The measured FSDP2 steps on one H100 (``tests/data/h100-fsdp2-hf``), one dict per run."""


class Outcome(Protocol):
    """What a CliRunner result and a finished subprocess both tell (``exit_code`` / ``returncode``)."""

    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


def h100_step_options(m: dict[str, Any]) -> dict[str, Any]:
    """The ``estimate_peak`` keywords of the measured H100 step ``m`` (its model:
    ``H100_DATA / "config.json"`` on one GPU)."""
    return {
        "strategies": "zero3" if m["reshard"] else "shard_grad_op",
        "framework": "fsdp2",
        "micro_batch": m["b"],
        "seq_len": m["s"],
        "recompute": m["recompute"],
        "reduce_dtype": "fp32",
        "model_impl": "hf",
        "flash_attention": True,
        "gpu": "h100-80gb",
        "init": "gpu",  # the measurements' recipe: from_config in fp32 on the GPU, then fully_shard
    }


def h100_step_row(m: dict[str, Any]) -> Any:
    """The predicted peak of the measured H100 step ``m``: FSDP2 on one GPU, its recipe as run."""
    (row,) = estimate_peak(str(H100_DATA / "config.json"), 1, **h100_step_options(m)).peak.strategies
    return row


def shrunk(name: str, sizes: dict[str, int], **changes: int) -> Architecture:
    """The preset ``name`` with ``sizes`` (``num_layers``, ``hidden_size``, ...) and then ``changes``; the
    head dimension follows hidden / heads."""
    arch, _ = load_model(name)
    return Architecture.model_validate({**arch.model_dump(), "head_dim": None, **sizes, **changes})


def one_line_error(result: Outcome, fragment: str = "") -> str:
    """Assert that a refused command exited 2 with nothing on stdout and one line on stderr,
    ``zerocalc: error: ...`` holding ``fragment``, no traceback; returns that line."""
    code = getattr(result, "exit_code", getattr(result, "returncode", None))
    assert code == 2, (code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerocalc: error: "), result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == "", (result.stdout, result.stderr)
    return lines[0]


def clean_env(cache_home: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a real-process test: no launcher's variables (SLURM_*, RANK*,
    WORLD_SIZE*, MASTER_*), the virtual environment's scripts first on PATH, one thread per process,
    ``XDG_CACHE_HOME`` at ``cache_home`` when given, then ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))
    }
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    if cache_home is not None:
        env["XDG_CACHE_HOME"] = str(cache_home)
    return {**env, **extra}


def run_zerocalc(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m zerocalc ARGS`` in a fresh process (:func:`clean_env` unless ``env``), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "zerocalc", *args],
        capture_output=True,
        text=True,
        env=clean_env() if env is None else env,
        timeout=timeout,
    )


# ------------------------------------------------------------------------------- plan's candidates
def candidate_options(plan: PlanRequest, group: Group, b: int, command: Command) -> dict[str, object]:
    """The options of the group's candidate at b as the command line types them, from the group's fields
    (the reference the candidate's requests are checked against)."""
    out: dict[str, object] = {
        "model": plan.model, "gpu": plan.gpu, "seq_len": str(plan.seq_len), "gpus": str(group.world),
        "gpus_per_node": str(group.gpus_per_node), "framework": group.framework.value,
        "strategies": group.strategy.value, "micro_batch": str(b),
        "grad_accum": str(group.accumulation(plan.global_batch_sequences, b)),
        "recompute": group.recompute.value,
    }  # fmt: skip
    for name in ("offload_optimizer", "offload_params", "reduce_dtype", "grad_sync"):
        value = getattr(group, name)
        if value not in (None, OffloadTarget.NONE):
            out[name] = value.value
    if group.prefetch is not None and command is Command.MEMORY:
        out["prefetch"] = str(group.prefetch)
    for name in ("tp", "cp", "pp", "vpp", "ep"):
        if getattr(group, name) > 1:
            out[name] = str(getattr(group, name))
    if group.tp > 1:
        out["sequence_parallel"] = group.sequence_parallel
    if group.end_stage_layers is not None:
        out["pp_first_stage_layers"] = out["pp_last_stage_layers"] = str(group.end_stage_layers)
    if group.fp8.on:
        out["fp8"] = group.fp8.recipe.value
        out["fp8_all_gather"] = group.fp8.all_gather
    out.update(plan.finetune_options)
    if plan.calibration_path is not None and command is Command.COMM:
        out["calibration"] = plan.calibration_path
    return out


def candidate_requests_or_error(plan: PlanRequest, group: Group, bases: Bases | None = None) -> object:
    """The group's candidates' (memory, comm) requests by b, or the line refusing them (``bases``: shared
    by the groups asked for in turn, as a search's are: each group's requests varied from the last's)."""
    try:
        return {c.b: (c.memory, c.comm) for c in group_requests(plan, group, bases or Bases.of(plan))}
    except InputError as exc:
        return str(exc)


def parsed_candidate_or_error(plan: PlanRequest, group: Group) -> object:
    """The requests parsing each candidate's typed options gives, by b, or the parser's line."""
    try:
        return {
            b: tuple(
                parse_options(**candidate_options(plan, group, b, command), estimate=command.value)
                for command in (Command.MEMORY, Command.COMM)
            )
            for b in group.micro_batches
        }
    except InputError as exc:
        return str(exc)


QWEN_MOE_TP = dict(model="qwen3-30b-a3b", framework="megatron", sequence_parallel=True, strategies="zero1")
"""Qwen3-30B-A3B under Megatron-LM with sequence parallelism and ZeRO-1, the MoE-under-TP tests' job.

Qwen3-30B-A3B: E = 128, k = 8, h = 2048, f = 768, 48 layers, every one MoE, no shared experts; one expert
3·h·f = 4,718,592, every layer's 128: 603,979,776, the 48 layers' 28,991,029,248. Its other parameters on
one of t = 2 tensor-parallel ranks (Megatron layers, the vocabulary 151,936 padded to a multiple of 128·2 =
152,064): per layer q 2048·4096 + k, v 2·2048·512 + o 4096·2048 = 18,874,368 / 2 = 9,437,184, norms
2·2048 + q/k norms 2·128 and the router 128·2048 replicated: 9,703,680; × 48 = 465,776,640; the embedding
and the untied head 2 · 76,032 · 2048 = 311,427,072; the final norm 2048: 777,205,760.

b = 1, s = 2048, bf16: under t = 2 with sequence parallelism a rank routes its T = 1024 tokens, k·T = 8192
copies of h = 2048: one all-to-all buffer S = 33,554,432 bytes.
"""
QWEN_EXPERT = 4_718_592
"""One Qwen3-30B-A3B expert's parameters, 3·h·f."""
QWEN_DENSE_PER_TP_RANK = 777_205_760
"""Its other parameters on one of t = 2 tensor-parallel ranks."""
QWEN_A2A_BUFFER = 8 * 1024 * 2048 * 2
"""One all-to-all buffer at b 1, s 2048, t 2 with sequence parallelism (bytes)."""


PLAN_STEP_FIELDS = (
    "compute_s", "matmul_s", "attention_s", "elementwise_s", "optimizer_s", "recompute_s", "exposed_comm_s",
    "bubble_s", "offload_s", "step_s", "tokens_per_s_per_gpu", "mfu",
)  # fmt: skip
"""The step fields a plan row shares with ``comm``'s step."""


def assert_row_is_comms(row: Any) -> None:
    """A plan row's communication time and step fields are those of ``estimate_comm`` on the comm command
    the row prints, to the bit."""
    from zerocalc.api import estimate_comm

    options = {k: v for k, v in row.comm_options.items() if k not in ("gpus", "gpus_per_node")}
    comm = estimate_comm(
        gpus=row.comm_options["gpus"], gpus_per_node=row.comm_options["gpus_per_node"], **options
    ).strategies[0]
    assert comm.time_s == row.comm_s, row.comm_options
    assert comm.step is not None
    assert {f: getattr(comm.step, f) for f in PLAN_STEP_FIELDS} == {
        f: getattr(row, f) for f in PLAN_STEP_FIELDS
    }


def plan_candidates(plan: Any) -> tuple[Any, list[Any]]:
    """The resolver of ``plan``'s search and the candidates of every group it enumerates, none refused."""
    from zerocalc.base.errors import InputError
    from zerocalc.plan.search import _Resolver, _Setting
    from zerocalc.plan.space import enumerate_groups

    setting = _Setting.of(plan)
    groups, _ = enumerate_groups(plan, setting.flash)
    resolver = _Resolver(plan, setting)
    candidates: list[Any] = []
    for group in groups:
        members = resolver.candidates(group)
        assert not isinstance(members, InputError), members
        candidates += members
    return resolver, candidates


LedgerT = TypeVar("LedgerT", bound=Ledger)


def steady_step(request: Any, led: LedgerT, device: Device = Device.CUDA) -> LedgerT:
    """One steady step of ``request``'s first strategy replayed into ``led`` (its resident start, then
    the step's events), without the allocator: the timeline the tests count by hand."""
    from zerocalc.peak.simulate import mechanics_for, step_shape
    from zerocalc.peak.timeline import run_step, steady_start

    mechanics, act = mechanics_for(request, request.strategies[0], ())
    step = step_shape(request, act, device)
    steady_start(step, mechanics, None, led)
    run_step(step, mechanics, None, led)
    return led


class LossLedger(Ledger):
    """A ledger without rounding that keeps, at each event, the bytes of loss tensors alive."""

    def __init__(self) -> None:
        super().__init__(block=1)
        self.loss_at: dict[str, int] = {}

    def event(self, name: str, transient: int = 0, transient_kind: str = "transient") -> None:
        super().event(name, transient, transient_kind)
        self.loss_at.setdefault(name, self.by_kind.get(TensorKind.LOSS, 0))


def profiled_memory_deltas(prof: Any) -> list[int]:
    """The bytes of each allocation (+) and free (−) a ``torch.profiler.profile(profile_memory=True)``
    recorded, in time order."""
    events = prof.profiler.kineto_results.events()
    return [n for _, n in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")]


def tiny_llama_config(vocab: int, hidden: int, layers: int = 1) -> dict[str, Any]:
    """A tiny Llama config.json (intermediate 128, four heads, untied head) for the CPU runs of the
    real code beside the timeline."""
    return {
        "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 128,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4, "pad_token_id": 0,
        "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": False,
    }  # fmt: skip
