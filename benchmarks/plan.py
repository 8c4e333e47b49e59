"""Candidates per second of `zerocalc plan`, side by side with one `zerocalc memory` evaluation.

Run: python benchmarks/plan.py [--repeat 5]. One core. For each case, the candidates, each given its peak
(the framework's part once per configuration plus the model's once per micro-batch and recompute:
zerocalc.plan.allocated), its step's lower bound, and the communication and step time of each one the walk
reaches, per second of the search:

* cold: the first search of a fresh Python process (what `zerocalc plan` does: the per-model caches —
  units, models cut to 4 and 5 layers, layouts — are filled by it), the median over ``--repeat`` processes;
* warm: later searches of the same plan in one process, the median of ``--repeat``.

Then the walk's exact evaluations (memory's full model, allocator replay) of the rows printed, timed apart.
With ``--baseline OTHER_CHECKOUT`` (the root of another version, e.g. a ``git worktree`` of an older commit):
each case's first search by both versions in turn, their candidates per second and walk seconds. With
``--runs``: the work of each case's first search, counted (not timed, so the same on any machine): the
timeline runs of the model's part and of the framework's, the framework mechanics built and the peaks
combined (zerocalc.plan.allocated); with ``--baseline`` too, both versions'.

Beside them, one `estimate_memory` call (the model states of every strategy, `zerocalc memory` without the
peak) and one `evaluate(request)` of the same model (every default FSDP2 strategy, the peak).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from zerocalc.api import estimate_memory
from zerocalc.peak.evaluate import evaluate
from zerocalc.plan.search import search
from zerocalc.plan.space import plan_options
from zerocalc.request.training import parse_options

LLAMA_16 = dict(model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=8192)
CASES = [
    dict(model="gpt2", gpu="rtx-4090", gpus=16, global_batch="512seq", seq_len=1024),
    LLAMA_16,
    dict(model="llama-3-8b", gpu="h100-80gb", gpus=64, global_batch="4194304", seq_len=8192),
    dict(LLAMA_16, frameworks="fsdp2"),
    dict(LLAMA_16, frameworks="megatron,fsdp2", tp="1,2,4,8", pp="1,2,4"),
    dict(LLAMA_16, global_batch="64seq", frameworks="megatron,fsdp2", tp="1,2,4", cp="1,2"),
    dict(model="qwen3-30b-a3b", gpu="h100-80gb", gpus=16, global_batch="512seq", seq_len=4096,
         frameworks="megatron,fsdp2", ep="auto"),
    dict(model="llama-3.1-405b", gpu="h100-80gb", gpus=512, global_batch="2048seq", seq_len=8192,
         frameworks="megatron,fsdp2", tp="4,8", pp="auto"),
    dict(model="qwen3-30b-a3b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=4096,
         frameworks="megatron,fsdp2", ep="auto"),
    dict(model="llama-3.1-405b", gpu="h100-80gb", gpus=512, global_batch="2048seq", seq_len=8192,
         tp="auto", pp="auto"),
]  # fmt: skip
"""The default frameworks (fsdp2, torch-zero1, deepspeed), then README's `plan` example (FSDP2 alone), then
mesh spaces (Megatron-LM and FSDP2 over tp × pp, over tp × cp, a MoE model over every ep, and Llama 3.1
405B over tp 4, 8 × every pipeline degree on up to 512 GPUs), then the MoE model over every ep at a
global batch of 1,048,576 tokens, and the 405B model over every tp × pp degree under the default
frameworks."""


def _label(case: dict) -> str:
    frameworks = f" [{case['frameworks']}]" if "frameworks" in case else ""
    mesh = "".join(f" {name} {case[name]}" for name in ("tp", "cp", "pp", "vpp", "ep") if name in case)
    return f"{case['model']} ≤{case['gpus']}×{case['gpu']}{frameworks}{mesh}"


def _first_search(index: int, source: str | None = None) -> dict[str, float] | None:
    """Case ``index``'s first search in a fresh process (its seconds, and the walk's), with zerocalc
    imported from ``source`` (a checkout's root) or as installed; None where that version fails on it."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(index)], capture_output=True, text=True, env=env
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


def _cold(index: int, repeat: int) -> float:
    """The median over ``repeat`` fresh processes of their first search's seconds."""
    runs = [_first_search(index) for _ in range(repeat)]
    return statistics.median(r["search_seconds"] for r in runs if r is not None)


def compare(baseline: str, repeat: int) -> None:
    """Each case's first search by this checkout and by ``baseline`` (another checkout's root), in turn
    (interleaved, so machine noise hits both alike): candidates per second of the search, and the walk's
    seconds (the exact peaks of the rows shown), medians of ``repeat``."""
    here = str(Path(__file__).resolve().parent.parent)
    for index, case in enumerate(CASES):
        runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
        failed = False
        for _ in range(repeat):
            for name, source in (("this", here), ("baseline", baseline)):
                result = _first_search(index, source)
                if result is None:
                    failed = failed or name == "baseline"
                    continue
                runs[name].append(result)
        line = [f"{_label(case)}:"]
        for name, results in runs.items():
            if not results:
                line.append(f"{name} fails")
                continue
            n = results[0]["candidates"]
            search_s = statistics.median(r["search_seconds"] for r in results)
            walk_s = statistics.median(r["exact_seconds"] for r in results)
            line.append(f"{name} {n / search_s:,.0f} candidates/s, walk {walk_s:.2f} s")
        print("  ".join(line) + ("  (the baseline fails on this case)" if failed else ""))


RUNS = ("model_run", "model_values", "framework_mechanics", "framework_run", "peak_of")
"""The functions of zerocalc.plan.allocated whose calls ``--runs`` counts: a hooked and an unhooked run of the
model's part, a framework's mechanics built and run, a peak combined from the two parts."""


def _count_runs(index: int) -> None:
    """Case ``index``'s first search in this (fresh) process, each of :data:`RUNS` counted: JSON on stdout."""
    import zerocalc.plan.allocated as allocated

    counts = dict.fromkeys(RUNS, 0)

    def counted(name: str):
        function = getattr(allocated, name)

        def call(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return call

    for name in RUNS:
        setattr(allocated, name, counted(name))
    search(plan_options(**CASES[index]))
    print(json.dumps(counts))


def count_runs(baseline: str | None) -> None:
    """Each case's counted work (:data:`RUNS`), this checkout's and, with ``baseline``, that one's."""
    here = str(Path(__file__).resolve().parent.parent)
    sources = [("this", here)] + ([("baseline", baseline)] if baseline is not None else [])
    for index, case in enumerate(CASES):
        line = [f"{_label(case)}:"]
        for name, source in sources:
            out = subprocess.run(
                [sys.executable, __file__, "--count", str(index)],
                capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=source),
            )  # fmt: skip
            if out.returncode != 0:
                line.append(f"{name} fails")
                continue
            counts = json.loads(out.stdout)
            line.append(f"{name} " + ", ".join(f"{key} {counts[key]}" for key in RUNS))
        print("  ".join(line))


def _one(index: int) -> None:
    """One search of case ``index`` in this (fresh) process: its times as JSON on stdout."""
    result = search(plan_options(**CASES[index]))
    times = {"search_seconds": result.search_seconds, "exact_seconds": result.exact_seconds}
    print(json.dumps({**times, "candidates": result.candidates_evaluated}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--runs", action="store_true", help="count each search's part runs instead of timing")
    parser.add_argument(
        "--baseline", default=None, help="another checkout's root: time its first searches beside this one's"
    )
    args = parser.parse_args()
    if args.count is not None:
        _count_runs(args.count)
        return
    if args.runs:
        count_runs(args.baseline)
        return
    if args.baseline is not None:
        compare(args.baseline, args.repeat)
        return
    if args.one is not None:
        _one(args.one)
        return
    for index, case in enumerate(CASES):
        cold = _cold(index, args.repeat)
        plan = plan_options(**case)
        search(plan)  # the process's first search: fills the per-model caches
        runs = [search(plan) for _ in range(args.repeat)]
        warm = statistics.median(r.search_seconds for r in runs)
        exact = statistics.median(r.exact_seconds for r in runs)
        result = runs[-1]
        request = parse_options(
            model=case["model"], gpu=case["gpu"], gpus=8, seq_len=case["seq_len"], framework="fsdp2"
        )
        start = time.perf_counter()
        estimate_memory(model=case["model"], gpus=8, gpu=case["gpu"])
        states = time.perf_counter() - start
        start = time.perf_counter()
        evaluate(request)
        one = time.perf_counter() - start
        n = result.candidates_evaluated
        print(
            f"{_label(case)}: {n:,} candidates ({result.groups} groups)\n"
            f"  every candidate (peak bound; comm + time of those that can fit), cold: {cold:.3f} s = "
            f"{n / cold:,.0f} candidates/s; "
            f"warm: {warm:.3f} s = {n / warm:,.0f}/s\n"
            f"  then {result.exact_peaks} exact peaks for the rows: {exact:.3f} s\n"
            f"  one estimate_memory() (model states, 8 GPUs, every strategy): {states * 1000:.1f} ms\n"
            f"  one evaluate() (fsdp2, 8 GPUs, all strategies): {one * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
