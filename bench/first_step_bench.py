"""The launcher's share of the time to verl's first training step, on the sandbox (issue 22):
recipes/sandbox-verl.yaml (async-rollout GRPO with vLLM's CPU build on 2 nodes, Weave tracing to
a loopback W&B stand-in), timed from running `submit` to the moment verl's console logger prints
`step:1` in the driver's log, and split into

- the launcher's phases, from the run's phases.jsonl: submit (check, render, sbatch), queue
  (Slurm starts the script), Ray ready (Ray on every node; the node addresses, allocation and
  W&B checks run while it comes up), driver start;
- verl's own, from its log: init (driver start to vLLM's first line: verl's Ray actors, the
  model, FSDP), vLLM's start (to the first step's start: the servers, agent loops, reward), and
  the first step itself (verl's own timing_s/step).

    make node-env; eval "$(tests/cluster/sandbox-up.sh)"
    python bench/first_step_bench.py --repeat 2        # make bench-first-step

Its last line: `launcher share X of time-to-first-step Y s` (medians over the runs); the line before
it leaves out submit (verl's preflight, which a resubmit of the same recipe has cached).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from verl_train import bench_args, job_env, plain, train  # noqa: E402

LAUNCHER = ("submit", "queue", "Ray ready", "driver start")
VERL = ("verl init", "vLLM start", "step 1")
# vLLM's own log lines carry "MM-DD HH:MM:SS" (no year): the first from a vLLM server.
VLLM_LINE = re.compile(r"^\(vLLMHttpServer pid=\d+[^)]*\)(?: \([^)]*\))? \w+ (\d\d-\d\d \d\d:\d\d:\d\d) ", re.M)


def split(job) -> dict:
    """Seconds of each phase, launcher's then verl's; raises if the job did not get there."""
    when = {}
    for p in job.phases:
        when.setdefault(p["phase"], p["time"])
    first = job.first_log.get(1)
    if first is None or "driver-start" not in when:
        raise RuntimeError(f"no first step (rc {job.returncode}): {job.out[-2000:]}")
    submitted = json.loads((job.run_dir / "run.json").read_text())["submitted"]
    log = job.log
    m = VLLM_LINE.search(plain(log))
    if m is None:
        raise RuntimeError("no line from a vLLM server in the driver log")
    year = datetime.datetime.fromtimestamp(when["driver-start"]).year
    vllm0 = datetime.datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp()
    step1 = float(job.steps[1]["timing_s/step"])
    t = [job.submitted_at, submitted, when["start"], when["ready"], when["driver-start"], vllm0, first - step1, first]
    return dict(zip(LAUNCHER + VERL, (b - a for a, b in zip(t, t[1:]))))


def main(argv=None) -> int:
    args, smoke = bench_args(__doc__, argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="first-step-") as tmp:
        for i in range(args.repeat):
            env = job_env(os.environ, wandb_key="bench-" + secrets.token_hex(24), smoke=smoke, tmp=tmp)
            job = train(node_python=args.node_python, runs=Path(tmp) / f"runs{i}", env=env)
            parts = split(job)
            runs.append(parts)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                  + f"; job {job.job_id} {'COMPLETED' if job.returncode == 0 else 'rc ' + str(job.returncode)}",
                  flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total = sum(med.values())
    ours = sum(med[k] for k in LAUNCHER)
    width = max(map(len, med))
    print(f"medians of {len(runs)} run(s), seconds:")
    for k, v in med.items():
        print(f"  {'launcher' if k in LAUNCHER else 'verl':8} {k:{width}}  {v:6.1f}  {v / total:5.1%}")
    # submit runs verl's own preflight in a fresh interpreter before anything is queued (cached for
    # an unchanged recipe, but each run here has its own run and checkpoint paths): shown apart.
    in_job = ours - med["submit"]
    print(f"launcher share in the job (queue, Ray ready, driver start: {in_job:.1f} s) {in_job / total:.3f}")
    print(f"launcher share {ours / total:.3f} of time-to-first-step {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
