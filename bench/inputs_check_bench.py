"""What the allocation check (phase inputs-check) adds to a 2-node bring-up on the sandbox:
job start to Ray "ready", with every node check on, side by side with all of them off (the
phase then is not in the script at all), alternating, N runs each.

Target: the check adds <= 1 s to the 2-node ready time (median against median).

    eval "$(tests/cluster/sandbox-up.sh)"   # or: make sandbox-up, then export SLURM_CONF
    python bench/inputs_check_bench.py [--repeat N]

The checked recipe is the sandbox demo with a data file and a model directory to read on every
node, and its checkpoint directory on shared storage (token written on the head, read on each).
The ready times vary by a second or two from run to run on a 2-core machine, so the bench also
times the step itself, precisely: inside one 2-node job, the exact srun step the script runs
(its embedded check_node.py, the rendered spec), 5 times.
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
OFF = ["node_checks.inputs=false", "node_checks.shared_storage=false", "node_checks.gpus=false",
       "node_checks.min_free_gb=0"]


def ready_time(runs: Path, data: Path, checks: bool) -> float:
    env = dict(os.environ, WANDB_API_KEY=os.environ.get("WANDB_API_KEY") or "bench-" + "0" * 40)
    cmd = [PY, "-m", "launcher.cli", "submit", str(ROOT / "recipes" / "sandbox-demo.yaml"), f"runtime.python={PY}",
           f"paths.runs={runs}", f"verl.overrides.data.train_files={data / 'train.parquet'}",
           f"verl.overrides.actor_rollout_ref.model.path={data / 'model'}", *([] if checks else OFF), "--json"]
    info = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    deadline = time.monotonic() + 300
    while subprocess.run(["squeue", "-h", "-j", info["job_id"]], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", info["job_id"]])
            raise SystemExit(f"job {info['job_id']} did not finish")
        time.sleep(0.5)
    phases = {p["phase"]: p["time"] for p in map(json.loads, Path(info["phases"]).read_text().splitlines())}
    assert ("inputs-check" in phases) == checks, phases
    return phases["ready"] - phases["start"]


STEP_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --gpus-per-node=2
#SBATCH --output=step-%j.out
export SRUN_CPUS_PER_TASK=1 PY={py}
for i in 1 2 3 4 5; do
  echo x > {run}/.tok
  t0=$(date +%s.%N)
  srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 "$PY" {script} {spec} {run} .tok x || echo FAILED
  t1=$(date +%s.%N)
  echo "STEP $t0 $t1"
done
"""


def step_times(tmp: Path, data: Path) -> list:
    """The check step alone, as the job runs it, 5 times inside one 2-node job."""
    import shlex

    from launcher.core.recipe import load

    plan = load(ROOT / "recipes" / "sandbox-demo.yaml", [f"runtime.python={PY}", f"paths.runs={tmp}/runs",
             f"verl.overrides.data.train_files={data / 'train.parquet'}",
             f"verl.overrides.actor_rollout_ref.model.path={data / 'model'}"]).plan
    run = tmp / "step"
    run.mkdir()
    s = dict(plan.node_check, checkpoints=None)
    (run / "job.sbatch").write_text(STEP_JOB.format(py=shlex.quote(PY), script=ROOT / "templates" / "check_node.py",
                                                    spec=shlex.quote(json.dumps(s)), run=run))
    job = subprocess.run(["sbatch", "--parsable", "--wait", "job.sbatch"], cwd=run, check=True, capture_output=True,
                         text=True, timeout=300).stdout.strip()
    out = (run / f"step-{job}.out").read_text()
    assert "FAILED" not in out, out
    return [float(line.split()[2]) - float(line.split()[1]) for line in out.splitlines() if line.startswith("STEP ")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vl-bench-") as tmp:
        data = Path(tmp) / "data"
        (data / "model").mkdir(parents=True)
        (data / "train.parquet").write_bytes(b"PAR1")
        (data / "model" / "config.json").write_text("{}")
        on, off = [], []
        for i in range(args.repeat):  # alternate, so that load drifts hit both sides alike
            on.append(ready_time(Path(tmp) / "runs", data, True))
            off.append(ready_time(Path(tmp) / "runs", data, False))
            print(f"run {i + 1}: checks on {on[-1]:.2f} s, off {off[-1]:.2f} s", flush=True)
        steps = step_times(Path(tmp), data)
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"the check step alone (2 nodes, in a job), 5 runs: median {statistics.median(steps):.2f} s "
          f"(min {min(steps):.2f}, max {max(steps):.2f})")
    print(f"2-node start->ready, median of {args.repeat}: checks on {m_on:.2f} s "
          f"(min {min(on):.2f}, max {max(on):.2f}); off {m_off:.2f} s (min {min(off):.2f}, max {max(off):.2f})")
    print(f"inputs-check adds {m_on - m_off:+.2f} s (target <= 1.00 s)")
    return 0 if m_on - m_off <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
