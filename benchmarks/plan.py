"""Candidates per second of `zerocalc plan`, side by side with one `zerocalc memory` evaluation.

Run: python benchmarks/plan.py [--repeat 3]. In-process, one core. For each case, two searches:

* as `zerocalc plan` runs it: every candidate's communication and step time (exact: comm's schedule costed
  once per key and every A derived), fitted peaks for the groups the walk reaches, exact peaks (the full
  memory model, allocator replay included) for the candidates it evaluates — the rows printed;
* ``fit_all``: the same plus a fitted peak for every candidate ("full" candidates: peak + comm + time),
  the issue's measure. Fitted peaks come from 6- and 7-layer simulations extrapolated to L
  (zerocalc.plan.layers) where the stack allows it, else from all-layer simulations.

Beside them, the time of one `evaluate(request)` of the same model (every default FSDP2 strategy).
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


def _median(plan: object, repeat: int, fit_all: bool) -> tuple[float, object]:
    runs, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = search(plan, fit_all=fit_all)  # type: ignore[arg-type]
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for case in CASES:
        plan = plan_options(**case)
        seconds, result = _median(plan, args.repeat, fit_all=False)
        full_s, full = _median(plan, args.repeat, fit_all=True)
        request = parse_options(
            model=case["model"], gpu=case["gpu"], gpus=8, seq_len=case["seq_len"], framework="fsdp2"
        )
        start = time.perf_counter()
        evaluate(request)
        one = time.perf_counter() - start
        n = result.candidates_evaluated  # type: ignore[union-attr]
        peaks = result.exact_peaks + result.fitted_peaks  # type: ignore[union-attr]
        full_peaks = full.exact_peaks + full.fitted_peaks  # type: ignore[union-attr]
        print(
            f"{case['model']} ≤{case['gpus']}×{case['gpu']}: {n:,} candidates\n"
            f"  plan as run: {seconds:.2f} s = {n / seconds:,.0f} candidates/s (comm + time for all; peaks: "
            f"{result.exact_peaks} exact + {result.fitted_peaks} fitted = {peaks / seconds:,.0f}/s; "  # type: ignore[union-attr]
            f"{result.not_needed:,} not needed)\n"  # type: ignore[union-attr]
            f"  every candidate fitted: {full_s:.2f} s = {n / full_s:,.0f} full candidates/s (peak + comm + "
            f"time; {full.exact_peaks} exact + {full.fitted_peaks} fitted = {full_peaks / full_s:,.0f} "  # type: ignore[union-attr]
            f"peaks/s)\n"
            f"  one evaluate() (fsdp2, 8 GPUs, all strategies): {one * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
