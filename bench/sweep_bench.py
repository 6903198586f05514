"""How long submitting a sweep takes (issue 13): `submit -m` of a 16-point sweep against
`submit` of one run, alternating A B A B ..., N runs each, whole processes on the real sandbox
(real sbatch; the jobs are held, then cancelled, so nothing runs). Both with verl's preflight
and an empty preflight cache, so each pays verl's import; the sweep pays it once for all 16
points (one verl process) and one sbatch call. Target: sweep(16) <= 2 x one run.

    python bench/sweep_bench.py [--repeat N] [--points 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
RECIPE = str(ROOT / "recipes" / "sandbox-verl.yaml")
CLI = [PY, "-m", "launcher.cli", "submit", RECIPE, f"runtime.python={PY}", "cluster.sbatch_args=[--hold]"]


def sandbox_env() -> dict:
    proc = subprocess.run(["bash", str(ROOT / "tests" / "cluster" / "sandbox-up.sh")], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"sandbox-up failed:\n{proc.stderr[-2000:]}")
    return dict(os.environ, SLURM_CONF=proc.stdout.strip().splitlines()[-1].split("=", 1)[1])


def timed(cmd, env) -> float:
    cache = tempfile.mkdtemp(prefix="vl-sweep-bench-cache-")  # verl's preflight each time
    t0 = time.monotonic()
    proc = subprocess.run([*cmd, "--json"], env=dict(env, XDG_CACHE_HOME=cache), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    subprocess.run(["scancel", json.loads(proc.stdout)["job_id"]], env=env, check=True)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--points", type=int, default=16)
    args = ap.parse_args()
    env = sandbox_env()
    with tempfile.TemporaryDirectory(prefix="vl-sweep-bench-") as tmp:
        env.update(VERL_LAUNCH_STATE=str(Path(tmp) / "state"), WANDB_API_KEY="bench" + "0" * 35)
        runs = f"paths.runs={tmp}/runs"
        seeds = ",".join(str(i) for i in range(args.points))
        one = [*CLI, runs]
        many = [*CLI, runs, "-m", f"verl.overrides.data.seed={seeds}"]
        ta, tb = [], []
        for _ in range(args.repeat):
            ta.append(timed(many, env))
            tb.append(timed(one, env))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"submit -m ({args.points} points): median {ma:.2f} s (min {min(ta):.2f}, max {max(ta):.2f})")
    print(f"submit (one run):        median {mb:.2f} s (min {min(tb):.2f}, max {max(tb):.2f})")
    print(f"sweep({args.points})/one {ma / mb:.2f}, target <= 2.0 {'ok' if ma / mb <= 2.0 else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
