"""What W&B's end of a run costs a job: each node's W&B service (templates/wandb_service.py),
started before Ray and finishing verl's run after it. On the sandbox, recipes/sandbox-demo.yaml
with a Ray actor logging W&B steps as verl's trainer does (demo.wandb_steps), against the W&B
stand-in on the sandbox's bridge, interleaved:

  service   wandb.enabled=true: the service on every node;
  none      wandb.enabled=false: no service (and no W&B run: the baseline's job).

Per job, from its phases: start -> head-up (the head's service starts before its Ray), start ->
ready (every node's), driver-end -> the job's end (Ray stopped, then the services finish the run);
the job's whole time (submit to COMPLETED); and each service's own "finished its runs in X s".
The baseline runs no W&B at all, so "whole" also holds what any W&B run costs its client
(wandb.init in the actor): an upper bound for the service's own share, which start -> ready and
driver-end -> end show.
Medians over --repeat, then service - none. Target: under 10 s added to a job, in all.

    eval "$(bash tests/cluster/sandbox-up.sh)"; python bench/wandb_end_bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.path.insert(0, str(ROOT / "tests"))
from wandb_standin import StandIn  # noqa: E402

BRIDGE = "169.254.77.1"
STEPS = 20


def one(runs: Path, kind: str, key: str, url: str, i: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_API_KEY"] = key
    t0 = time.time()
    proc = subprocess.run(
        [PY, "-m", "launcher.cli", "submit", str(ROOT / "recipes" / "sandbox-demo.yaml"), f"runtime.python={PY}",
         f"paths.runs={runs}", f"wandb.base_url={url}", f"wandb.experiment=bench-{kind}-{i}", "wandb.entity=team", "trace.backend=none",
         *([f"+verl.overrides.demo.wandb_steps={STEPS}"] if kind == "service" else ["wandb.enabled=false"]),
         "--json", "--wait"], capture_output=True, text=True, env=env, timeout=600)
    whole = time.time() - t0
    info = json.loads(proc.stdout.strip().splitlines()[0]) if proc.stdout.strip() else {}
    run_dir = Path(info.get("run_dir") or "")
    if proc.returncode != 0 or not run_dir.is_dir():
        raise SystemExit(f"{kind}: the job did not complete:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    at = {}
    for line in (run_dir / "phases.jsonl").read_text().splitlines():
        p = json.loads(line)
        at.setdefault(p["phase"], p["time"])
    said = run_dir / "logs" / "wandb-service.r0.log"
    finished = [float(m) for m in re.findall(r"finished its runs with exit code \d+ in ([0-9.]+) s",
                                             said.read_text(errors="replace") if said.exists() else "")]
    return {"head-up": at["head-up"] - at["start"], "ready": at["ready"] - at["start"],
            # the Ray steps' last writes: Ray stopped (after the service's finish)
            "end": max(f.stat().st_mtime for f in run_dir.glob("logs/ray-*.log")) - at["driver-end"], "whole": whole,
            "finish": max(finished) if finished else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    key = "local-" + "b" * 40
    got = {"service": [], "none": []}
    with tempfile.TemporaryDirectory(prefix="vl-bench-") as tmp, StandIn(host=BRIDGE, api_key=key) as w:
        for i in range(a.repeat):
            for kind in ("service", "none"):
                r = one(Path(tmp) / "runs", kind, key, w.url, i)
                got[kind].append(r)
                print(f"{kind:8} run {i + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in r.items()), flush=True)
        rows = [r for r in w.runs.values()]
        complete = sum(1 for r in rows if len(r["history"]) == STEPS and r["ends"] == [0])
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in got.items()}
    for kind, m in med.items():
        print(f"median {kind:8}: " + ", ".join(f"{k} {v:.1f} s" for k, v in m.items()))
    added = med["service"]["whole"] - med["none"]["whole"]
    print(f"W&B runs complete ({STEPS} steps, exit code 0): {complete} of {len(got['service'])}")
    print(f"added by the W&B service: start->ready {med['service']['ready'] - med['none']['ready']:+.1f} s, "
          f"driver-end->end {med['service']['end'] - med['none']['end']:+.1f} s, whole job {added:+.1f} s "
          f"(target < 10 s)")
    return 0 if added < 10 and complete == len(got["service"]) else 1


if __name__ == "__main__":
    sys.exit(main())
