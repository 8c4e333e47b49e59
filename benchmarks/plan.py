"""Candidates per second of `zerocalc plan`, side by side with one `zerocalc memory` evaluation.

Run: python benchmarks/plan.py [--repeat 3]. In-process, one core. For each case: the search's wall time,
candidates resolved per second (each with its communication and step time; a peak exact, fitted or not
needed), peaks per second (exact + fitted), and the time of one `evaluate(request)` of the same model
(every default strategy), which the search would repeat per candidate without its fitted path.
"""

from __future__ import annotations

import argparse
import statistics
import time

from zerocalc.peak.evaluate import evaluate
from zerocalc.plan.search import search
from zerocalc.plan.space import plan_options
from zerocalc.request import parse_options

CASES = [
    dict(model="gpt2", gpu="rtx-4090", gpus=16, global_batch="512seq", seq_len=1024),
    dict(model="llama-3-8b", gpu="h100-80gb", gpus=16, global_batch="1048576", seq_len=8192),
    dict(model="llama-3-8b", gpu="h100-80gb", gpus=64, global_batch="4194304", seq_len=8192),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for case in CASES:
        plan = plan_options(**case)
        runs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = search(plan)
            runs.append(time.perf_counter() - start)
        seconds = statistics.median(runs)
        request = parse_options(
            model=case["model"], gpu=case["gpu"], gpus=8, seq_len=case["seq_len"], framework="fsdp2"
        )
        start = time.perf_counter()
        evaluate(request)
        one = time.perf_counter() - start
        peaks = result.exact_peaks + result.fitted_peaks
        print(
            f"{case['model']} ≤{case['gpus']}×{case['gpu']}: {result.candidates_evaluated:,} candidates in "
            f"{seconds:.2f} s = {result.candidates_evaluated / seconds:,.0f}/s (peaks: {result.exact_peaks} "
            f"exact + {result.fitted_peaks} fitted = {peaks / seconds:,.0f}/s; {result.not_needed:,} not "
            f"needed); one evaluate() (fsdp2, 8 GPUs, all strategies): {one * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
