"""How much does `verl-launch render` cost over merely importing its libraries?

Times, in fresh interpreters and interleaved (so machine load hits both alike), the floor
`python -c "import hydra, omegaconf, jinja2"` against `verl-launch render` of every shipped
recipe, and reports the medians and their ratio. Target: ratio <= 1.6.

    python bench/render_bench.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.6


def timed(cmd: list) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd="/tmp")
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    py = sys.executable
    floor_cmd = [py, "-c", "import hydra, omegaconf, jinja2"]
    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    floor, render = [], {r.stem: [] for r in recipes}
    timed(floor_cmd)  # warm the page cache
    for _ in range(args.runs):
        for r in recipes:
            floor.append(timed(floor_cmd))
            render[r.stem].append(timed([py, "-m", "launcher.cli", "render", str(r)]))
    f = statistics.median(floor)
    print(f"{'what':<28} {'median s':>9} {'ratio':>6}")
    print(f"{'import hydra+omegaconf+jinja2':<28} {f:>9.3f} {1.0:>6.2f}")
    worst = 0.0
    for name, times in render.items():
        m = statistics.median(times)
        worst = max(worst, m / f)
        print(f"{'render ' + name:<28} {m:>9.3f} {m / f:>6.2f}")
    print(f"worst ratio {worst:.2f} (target <= {TARGET}); {args.runs} runs each, python {sys.version.split()[0]}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
