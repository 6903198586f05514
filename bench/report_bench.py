"""`verl-launch report RUN` at a long run's scale: a run of 1,000 steps (and more with --steps)
over three attempts (requeued twice, a few steps redone), its files written as a job leaves them
(tests/synthetic_run.py: phases, verl's step lines in each attempt's driver log, the watchdog's
step times). Target: under 1 s, reading only local files.

- build_s: launcher.jobs.report.build over the run's files (what `report` itself computes), read
  whole (the first time);
- again_s: the same again, with what the first read kept (jobs/step_lines.py): what each `status`
  after the first pays for its goodput line, nothing new in the logs; grown_s: the same after the
  last log gained a line of ~4 KB;
- cli_s: `python -m launcher.cli report RUN --json` end to end, interpreter start included, with
  no Slurm on PATH (the report then says so and times each attempt by the job's marks);
- log_mb: the driver logs' size (verl's step lines as on the sandbox, about 4.2 KB each there;
  here the lines carry only what the report reads, padded to that size).

    python bench/report_bench.py [--steps 1000 10000] [--repeat 3]
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
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from launcher.core.paths import RunPaths  # noqa: E402
from launcher.jobs import report  # noqa: E402
from synthetic_run import write_run  # noqa: E402

PAD = " - " + " - ".join(f"actor/metric_{i}:np.float64(0.{i:04d})" for i in range(110))  # verl logs ~100 keys, ~4 KB a line


def plan(steps: int) -> list:
    third = steps // 3
    return [{"steps": list(range(1, third + 1)), "saves": [third - 1], "ends": "preempt", "tail": 20.0},
            {"steps": list(range(third - 1, 2 * third + 1)), "saves": [2 * third], "ends": "preempt"},
            {"steps": list(range(2 * third + 1, steps + 1)), "saves": [steps], "validate": [steps]}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PATH"] = "/usr/bin:/bin"  # no sacct here: the job's marks alone
    env["PYTHONPATH"] = str(ROOT)
    for n in args.steps:
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            allocs = write_run(run, plan(n))
            for log in (run / "logs").glob("driver.r*.log"):  # as long as verl's own lines
                log.write_text(log.read_text().replace("\n(TaskRunner pid=42) some", PAD + "\n(TaskRunner pid=42) some"))
            size = sum(f.stat().st_size for f in (run / "logs").glob("driver.r*.log")) / 1e6
            paths = RunPaths(run)
            builds, agains, growns, clis = [], [], [], []
            last = sorted(paths.logs.glob("driver.r*.log"))[-1]
            for i in range(args.repeat):
                for kept in paths.logs.glob("steps-read.r*.json"):  # a first read: the whole logs
                    kept.unlink()
                t0 = time.perf_counter()
                rep = report.build(paths, paths.read_record(), allocs)
                builds.append(time.perf_counter() - t0)
                t0 = time.perf_counter()  # status again, nothing new: what was read is kept
                report.build(paths, paths.read_record(), allocs)
                agains.append(time.perf_counter() - t0)
                with open(last, "a") as f:  # status again, a step later (a validation line, as verl logs)
                    f.write(f"(TaskRunner pid=42) validation {i}: nothing the report reads{PAD}\n")
                t0 = time.perf_counter()
                report.build(paths, paths.read_record(), allocs)
                growns.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "launcher.cli", "report", str(run), "--json"], env=env,
                                     capture_output=True, text=True, cwd=tmp)
                clis.append(time.perf_counter() - t0)
                assert out.returncode == 0, out.stderr
            d = json.loads(out.stdout)
            assert d["steps_kept"] == n and rep.steps_kept == n, (d["steps_kept"], rep.steps_kept)
            print(json.dumps({"steps": n, "log_mb": round(size, 1), "build_s": round(statistics.median(builds), 3),
                              "again_s": round(statistics.median(agains), 4),
                              "grown_s": round(statistics.median(growns), 4),
                              "cli_s": round(statistics.median(clis), 3), "repeat": args.repeat}))


if __name__ == "__main__":
    main()
