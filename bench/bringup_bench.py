"""Time from job start to "Ray ready" on the sandbox, for 1, 2 and 4 nodes, next to the
approach of verl's own Slurm example (head, `sleep 10`, then workers one by one with
`sleep 5` each), re-created here as a real sbatch job on the same sandbox.

Targets: ready(4 nodes) <= 1.3 x ready(1 node), and <= 0.5 x the fixed-sleep baseline at 4.

    eval "$(tests/cluster/sandbox-up.sh)"   # or: make sandbox-up, then export SLURM_CONF
    python bench/bringup_bench.py [--repeat N]

"Start" is the first thing the batch script does (the `start` phase / the baseline's first
line); "ready" is our `ready` phase, and for the baseline the moment it would start the driver
(after its last sleep), checked to have every node in Ray.
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

BASELINE = """#!/bin/bash
#SBATCH --job-name=verl-example-baseline
#SBATCH --nodes={n}
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --gpus-per-node=2
#SBATCH --output=slurm-%j.out
# verl's examples/tutorial/slurm/ray_on_slurm.slurm bring-up, with this sandbox's Python.
T0=$(date +%s.%N)
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_node=${{nodes[0]}}
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)
port=6379
ip_head=$head_node_ip:$port
srun --nodes=1 --ntasks=1 -w "$head_node" {py} -m ray.scripts.scripts start --head --node-ip-address="$head_node_ip" \\
  --port=$port --num-cpus=1 --num-gpus=2 --include-dashboard=false --temp-dir=/tmp/vlb-$SLURM_JOB_ID --block &
sleep 10
worker_num=$((SLURM_JOB_NUM_NODES - 1))
for ((i = 1; i <= worker_num; i++)); do
  node_i=${{nodes[$i]}}
  srun --nodes=1 --ntasks=1 -w "$node_i" {py} -m ray.scripts.scripts start --address "$ip_head" \\
    --num-cpus=1 --num-gpus=2 --block &
  sleep 5
done
T1=$(date +%s.%N)
ALIVE=$(RAY_ADDRESS=$ip_head {py} -c 'import ray; ray.init(logging_level="ERROR"); print(sum(n["Alive"] for n in ray.nodes()))')
echo "BASELINE start=$T0 ready=$T1 alive=$ALIVE"
kill $(jobs -p) 2>/dev/null; wait
"""


def sh(*cmd, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def wait_job(job: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sh("squeue", "-h", "-j", job).strip():
            return
        time.sleep(0.5)
    sh("scancel", job)
    raise SystemExit(f"job {job} did not finish")


def ours(n: int, runs: Path) -> float:
    env = dict(os.environ, WANDB_API_KEY=os.environ.get("WANDB_API_KEY") or "bench-" + "0" * 40)
    out = sh(PY, "-m", "launcher.cli", "submit", str(ROOT / "recipes" / "sandbox-demo.yaml"),
             f"runtime.python={PY}", f"paths.runs={runs}", f"cluster.nodes={n}", "--json", env=env)
    info = json.loads(out)
    wait_job(info["job_id"])
    ph = {}
    for line in Path(info["phases"]).read_text().splitlines():
        p = json.loads(line)
        ph.setdefault(p["phase"], p["time"])
    if "ready" not in ph:
        raise SystemExit(f"{n}-node job never got ready: {info['stdout']}")
    return ph["ready"] - ph["start"]


def baseline(n: int, work: Path) -> float:
    script = work / f"baseline-{n}.sbatch"
    script.write_text(BASELINE.format(n=n, py=PY))
    job = sh("sbatch", "--parsable", script.name, cwd=work).strip()
    wait_job(job)
    line = next(ln for ln in (work / f"slurm-{job}.out").read_text().splitlines() if ln.startswith("BASELINE"))
    kv = dict(tok.split("=") for tok in line.split()[1:])
    if int(kv["alive"]) != n:
        print(f"  (baseline {n} nodes: only {kv['alive']} alive when it would start the driver)")
    return float(kv["ready"]) - float(kv["start"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    if "SLURM_CONF" not in os.environ:
        raise SystemExit("export SLURM_CONF first (eval \"$(tests/cluster/sandbox-up.sh)\")")
    work = Path(tempfile.mkdtemp(prefix="vl-bench-"))
    res = {}
    for n in args.nodes:
        res[n] = ([ours(n, work / "runs") for _ in range(args.repeat)],
                  [baseline(n, work) for _ in range(args.repeat)])
    print(f"{'nodes':>5} {'verl-launch s':>14} {'fixed-sleep s':>14} {'ratio':>6}")
    med = {n: (statistics.median(o), statistics.median(b)) for n, (o, b) in res.items()}
    for n, (o, b) in med.items():
        print(f"{n:>5} {o:>14.1f} {b:>14.1f} {o / b:>6.2f}")
    ok = True
    if 1 in med and 4 in med:
        scale = med[4][0] / med[1][0]
        vs = med[4][0] / med[4][1]
        print(f"ready(4)/ready(1) = {scale:.2f} (target <= 1.3); ready(4)/baseline(4) = {vs:.2f} (target <= 0.5)")
        ok = scale <= 1.3 and vs <= 0.5
    print(f"medians of {args.repeat} runs each; sandbox on {os.cpu_count()} cores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
