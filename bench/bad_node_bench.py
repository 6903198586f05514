"""From a bad node to the restarted job's Ray ready, on the sandbox (issue 16), side by side
with a plain requeue of the same job:

- bad node: a 2-node job (requeue on) whose worker raylet is SIGKILLed mid-run; the job puts
  the failure down to that node, requeues itself without it, and restarts on two others;
- plain requeue: the same job, `scontrol requeue` from outside (the node stays eligible).

Both are timed from the kill / the requeue command to the restarted run's `ready` phase. A
requeued job waits on Slurm's begin-time hold (about 2 minutes) before it can start again; the
bench releases it after 3 s (`scontrol update StartTime=now`; sooner, slurmd may refuse the
job's new credential), as the tests do, so the figures are the launcher's and Slurm's
scheduling, not that hold. One run each.

    eval "$(tests/cluster/sandbox-up.sh)"   # or: make sandbox-up, then export SLURM_CONF
    python bench/bad_node_bench.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.path.insert(0, str(ROOT / "tests"))
from sandbox_procs import RequeueHold, raylet_of  # noqa: E402


def sh(*cmd) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout


release = RequeueHold(sh)  # polled: frees a requeued job from its begin-time hold, safely


def field(job: str, name: str) -> str:
    for tok in sh("scontrol", "show", "job", job).split():
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return ""


def phases(run_dir: str) -> list:
    try:
        return [json.loads(x) for x in Path(run_dir, "phases.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def one(runs: Path, how: str) -> float:
    env = dict(os.environ, WANDB_API_KEY=os.environ.get("WANDB_API_KEY") or "bench-" + "0" * 40)
    info = json.loads(subprocess.run(
        [PY, "-m", "launcher.cli", "submit", str(ROOT / "recipes" / "sandbox-demo.yaml"), f"runtime.python={PY}",
         f"paths.runs={runs}", "cluster.requeue=true", "+verl.overrides.demo.hold_first=600", "--json"],
        check=True, capture_output=True, text=True, env=env).stdout)
    job, run_dir = info["job_id"], info["run_dir"]
    try:
        deadline = time.monotonic() + 240
        while not Path(run_dir, "demo-report.r0.json").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job}: the first run never reached its driver")
            time.sleep(0.3)
        t0 = time.time()
        if how == "bad node":
            pid = raylet_of(job, "node2")
            if pid is None:
                raise SystemExit(f"no raylet of job {job} on node2")
            os.kill(pid, signal.SIGKILL)
        else:
            sh("scontrol", "requeue", job)
        while True:
            ready = [p for p in phases(run_dir) if p["phase"] == "ready" and p["restart"] == 1]
            if ready:
                nodes = [h for h in sh("scontrol", "show", "hostnames", field(job, "NodeList")).split()]
                print(f"{how}: restarted on {','.join(nodes)}; kill/requeue -> ready {ready[0]['time'] - t0:.1f} s",
                      flush=True)
                return ready[0]["time"] - t0
            release(job)
            if time.time() - t0 > 300:
                raise SystemExit(f"job {job}: no restarted run within 300 s ({field(job, 'JobState')})")
            time.sleep(0.3)
    finally:
        sh("scancel", job)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="vl-bench-") as tmp:
        bad = one(Path(tmp) / "runs", "bad node")
        plain = one(Path(tmp) / "runs", "plain requeue")
    print(f"kill -> restarted Ray ready: bad node {bad:.1f} s, plain requeue {plain:.1f} s "
          f"(ratio {bad / plain:.2f}; the begin-time hold released after 3 s in both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
