"""Candidates per second of `zerocalc plan`, side by side with one `zerocalc memory` evaluation.

Run: python benchmarks/plan.py [--repeat 3]. In-process, one core; the median of the repeats and the first
run (which also fills the per-model caches: units, models cut to 6 and 7 layers). For each case: the
candidates, each given its peak (the framework's part once per configuration plus the model's once per
micro-batch and recompute: zerocalc.plan.fitted), its communication and step time, per second of the
search; then the walk's exact evaluations (memory's full model, allocator replay) of the rows printed,
timed apart. Beside them, one `estimate_memory` call (the model states of every strategy, `zerocalc memory`
without the peak) and one `evaluate(request)` of the same model (every default FSDP2 strategy, the peak).
"""

from __future__ import annotations

import argparse
import statistics
import time

from zerocalc.api import estimate_memory
from zerocalc.peak.evaluate import evaluate
from zerocalc.plan.search import search
from zerocalc.plan.space import plan_options
from zerocalc.request import parse_options

CASES = [
    dict(model="gpt2", gpu="rtx-4090", gpus=16, global_batch="512seq", seq_len=1024),
    dict(model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=8192),
    dict(model="llama-3-8b", gpu="h100-80gb", gpus=64, global_batch="4194304", seq_len=8192),
]


def _median(plan: object, repeat: int) -> tuple[float, float, float, object]:
    runs, result = [], None
    for _ in range(repeat):
        result = search(plan)  # type: ignore[arg-type]
        runs.append((result.search_seconds, result.exact_seconds))
    median = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    return runs[0][0], *median, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for case in CASES:
        plan = plan_options(**case)
        first, seconds, exact_s, result = _median(plan, args.repeat)
        request = parse_options(
            model=case["model"], gpu=case["gpu"], gpus=8, seq_len=case["seq_len"], framework="fsdp2"
        )
        start = time.perf_counter()
        estimate_memory(model=case["model"], gpus=8, gpu=case["gpu"])
        states = time.perf_counter() - start
        start = time.perf_counter()
        evaluate(request)
        one = time.perf_counter() - start
        n = result.candidates_evaluated  # type: ignore[union-attr]
        print(
            f"{case['model']} ≤{case['gpus']}×{case['gpu']}: {n:,} candidates ({result.groups} groups)\n"  # type: ignore[union-attr]
            f"  every candidate (peak + comm + time): {seconds:.3f} s = {n / seconds:,.0f} candidates/s "
            f"(first run: {n / first:,.0f}/s)\n"
            f"  then {result.exact_peaks} exact peaks for the rows: {exact_s:.3f} s\n"  # type: ignore[union-attr]
            f"  one estimate_memory() (model states, 8 GPUs, every strategy): {states * 1000:.1f} ms\n"
            f"  one evaluate() (fsdp2, 8 GPUs, all strategies): {one * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
