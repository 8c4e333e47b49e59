"""Start-up of `zerocalc memory --params 7B --gpus 4`, side by side with the import floor, same run.

Three commands are timed in turn (interleaved, so machine noise hits them alike), each ``--runs`` times:

* ``bare imports``: ``python -c "import typer, rich, pydantic"`` — issue #11's reference;
* ``stack floor``: the least any typer + pydantic + rich command does: one Typer command that validates one
  pydantic model and prints one Rich table (what zerocalc cannot go below while it uses these libraries);
* ``zerocalc memory --params 7B --gpus 4``.

It prints each median, the ratios to the bare imports and to the floor, and the slowest imports of
zerocalc's command. Byte code is written and used as on an installed package (``PYTHONDONTWRITEBYTECODE``
is removed from the children's environment: compiling the sources each run would measure the compiler).

Run: python benchmarks/startup.py [--runs 21]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

BARE = [sys.executable, "-c", "import typer, rich, pydantic"]
FLOOR_SCRIPT = """
import typer
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table

class Request(BaseModel):
    model_config = ConfigDict(frozen=True)
    params: int
    gpus: int

app = typer.Typer()

@app.command()
def memory(params: str = "7", gpus: str = "4") -> None:
    request = Request(params=int(params) * 10**9, gpus=int(gpus))
    table = Table("strategy", "GiB")
    table.add_row("ddp", f"{16 * request.params / 2**30:.2f}")
    Console().print(table)

app()
"""
FLOOR = [sys.executable, "-c", FLOOR_SCRIPT, "--params", "7", "--gpus", "4"]
ZEROCALC = [sys.executable, "-m", "zerocalc", "memory", "--params", "7B", "--gpus", "4"]
COMMANDS = {"bare imports": BARE, "stack floor": FLOOR, "zerocalc memory": ZEROCALC}


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(runs: int) -> dict[str, float]:
    """Median seconds of each command over ``runs`` interleaved runs (after one warm-up run each)."""
    env = _environment()
    for command in COMMANDS.values():
        subprocess.run(command, check=True, capture_output=True, env=env)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, command in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def slowest_imports(count: int = 8) -> list[tuple[int, str]]:
    """The ``count`` largest cumulative import times (µs) of zerocalc's command (``-X importtime``)."""
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", *ZEROCALC[1:]],
        capture_output=True, text=True, check=True, env=_environment(),
    ).stderr  # fmt: skip
    rows = [line.split("|") for line in trace.splitlines() if line.startswith("import time:") and "|" in line]
    return sorted(((int(r[1]), r[2].rstrip()) for r in rows if r[1].strip().isdigit()), reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    medians = measure(args.runs)
    bare, floor = medians["bare imports"], medians["stack floor"]
    for name, seconds in medians.items():
        ratios = f"{seconds / bare:4.2f}× bare  {seconds / floor:4.2f}× floor"
        print(f"{name:16} {seconds * 1000:6.0f} ms  {ratios}")
    print(f"(medians of {args.runs} interleaved runs; issue #11 asks zerocalc memory ≤ 1.50× bare)")
    imports = slowest_imports()
    print("slowest imports of zerocalc memory (cumulative µs):")
    for micros, name in imports:
        print(f"  {micros:>8}  {name}")
    if any(name.strip() == "torch" for _, name in imports):
        print("WARNING: torch is imported at start-up")


if __name__ == "__main__":
    main()
