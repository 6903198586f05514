"""What the last step's trace flush costs a run's end, and what it saves. On the sandbox,
recipes/sandbox-tool-agent.yaml (2 steps, no checkpoint: verl's driver ends right after its last
step) against the W&B stand-in, with two busy processes beside the job from step 1 on (CI's
load), interleaved:

  flush     trace.flush_timeout=60 (the default): every agent-loop worker sends a step's traces
            before it hands the step's rollouts back (templates/trace_flush.py);
  none      trace.flush_timeout=0: no flush, as before issue 56.

Per job: seconds from the last step's line in verl's log to the driver's end (phase driver-end)
and to the job's end; the flushes' own seconds (their records: the slowest worker's per step,
summed over the steps), the last step's own seconds; the last step's trajectories that arrived
against check's estimate.

    eval "$(bash tests/cluster/sandbox-up.sh)"; python bench/trace_end_bench.py [--repeat 2]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from verl_train import BRIDGE, Busy, bench_args, job_env, phases, train  # noqa: E402
from wandb_standin import StandIn  # noqa: E402

RECIPE = ROOT / "recipes" / "sandbox-tool-agent.yaml"
STEPS, PER_STEP = 2, 4  # the recipe's steps; check's estimate (cap 1 x 2 workers x rollout.n 2)


def one(kind: str, i: int, node_python: str, smoke: Path, tmp: Path) -> dict:
    key = "local-" + "c" * 40
    env = job_env(os.environ, wandb_key=key, smoke=smoke, tmp=tmp / f"{kind}{i}")
    busy = Busy(at=1)
    with StandIn(host=BRIDGE, api_key=key) as w:
        try:
            job = train(node_python=node_python, runs=tmp / "runs", env=env, timeout=900, standin=w, recipe=RECIPE,
                        during=busy, overrides=[f"trace.flush_timeout={60 if kind == 'flush' else 0}",
                                                f"wandb.experiment=bench-{kind}-{i}"])
        finally:
            busy.stop()
    if job.returncode != 0 or STEPS not in job.first_log:
        raise SystemExit(f"{kind}: the job did not complete:\n{job.out[-2000:]}{job.err[-2000:]}")
    at = {p["phase"]: p["time"] for p in phases(job.run_dir)}
    last = job.first_log[STEPS]
    flushes = [json.loads(x) for f in (job.run_dir / "logs").glob("trace-flush-*.r0.jsonl")
               for x in f.read_text().splitlines()]
    arrived = sum(1 for c in job.trajectories if c["attributes"].get("step") == STEPS)
    return {"to-driver-end": at["driver-end"] - last, "to-job-end": job.submitted_at + job.seconds - last,
            # what the workers' flushes held each step back, the slowest worker's, summed over the steps
            "flush": sum(max((r["seconds"] for r in flushes if r["step"] == s), default=0.0)
                         for s in range(1, STEPS + 1)),
            "step": job.first_log[STEPS] - job.first_log[STEPS - 1], "last-step-traces": arrived}


def main() -> int:
    args, smoke = bench_args(__doc__)
    got = {"flush": [], "none": []}
    with tempfile.TemporaryDirectory(prefix="vl-bench-") as tmp:
        for i in range(args.repeat):
            for kind in got:
                t0 = time.time()
                r = one(kind, i, args.node_python, smoke, Path(tmp))
                got[kind].append(r)
                print(f"{kind:6} run {i + 1} ({time.time() - t0:.0f} s): " + ", ".join(
                    f"{k} {v:.1f} s" if isinstance(v, float) else f"{k} {v}/{PER_STEP}" for k, v in r.items()),
                      flush=True)
    for kind, rows in got.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "last-step-traces"}
        whole = sum(1 for r in rows if r["last-step-traces"] == PER_STEP)
        print(f"median {kind:6}: " + ", ".join(f"{k} {v:.1f} s" for k, v in med.items())
              + f"; last step whole in {whole} of {len(rows)} runs")
    return 0 if all(r["last-step-traces"] == PER_STEP for r in got["flush"]) else 1


if __name__ == "__main__":
    sys.exit(main())
