"""Median wall time of `zerocalc memory --params 7B --gpus 4` (the start-up-bound command; budget 0.3 s).

Run: python benchmarks/startup.py [--runs 15]. Prints the median and the slowest imports of one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMAND = [sys.executable, "-m", "zerocalc", "memory", "--params", "7B", "--gpus", "4"]
BUDGET_SECONDS = 0.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    subprocess.run(COMMAND, check=True, capture_output=True)  # warm the file cache
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run(COMMAND, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    verdict = "within" if median < BUDGET_SECONDS else "OVER"
    print(
        f"median {median * 1000:.0f} ms over {args.runs} runs "
        f"({verdict} the {BUDGET_SECONDS * 1000:.0f} ms budget)"
    )
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", *COMMAND[1:]], capture_output=True, text=True, check=True
    ).stderr
    rows = [line.split("|") for line in trace.splitlines() if line.startswith("import time:") and "|" in line]
    cumulative = sorted(((int(r[1]), r[2].rstrip()) for r in rows if r[1].strip().isdigit()), reverse=True)
    print("slowest imports (cumulative µs):")
    for micros, name in cumulative[:8]:
        print(f"  {micros:>8}  {name}")
    if "torch" in {name.strip() for _, name in cumulative}:
        print("WARNING: torch is imported at start-up")


if __name__ == "__main__":
    main()
