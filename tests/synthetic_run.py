"""A run directory as a job leaves it, written from a plan (tests/test_report.py, bench/report_bench.py):
the phases, each attempt's driver log with verl's step lines, the watchdog's step times, and the
allocations Slurm's accounting would give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from launcher.core.paths import RunPaths

# verl's timings of one step (seconds); the step's own time is their sum plus REST
TIMING = {"gen": 20.0, "old_log_prob": 3.0, "ref": 1.0, "update_actor": 5.0, "update_weights": 0.5}
REST = 0.5


def step_line(step: int, validate: bool = False, save: bool = False) -> tuple:
    """verl's console line of STEP, and its wall seconds (verl's step timer holds the save, not the
    validation after it)."""
    t = dict(TIMING, **({"save_checkpoint": 2.0} if save else {}))
    timer = sum(t.values()) + REST
    t.update({"testing": 4.0} if validate else {})
    pairs = [f"training/global_step:{step}"] + [f"timing_s/{k}:np.float64({v})" for k, v in t.items()]
    pairs += [f"timing_s/step:{timer}", "perf/total_num_tokens:600", f"perf/time_per_step:{timer}"]
    return f"(TaskRunner pid=42) step:{step} - " + " - ".join(pairs) + "\n", timer + t.get("testing", 0.0)


def write_run(run_dir: Path, attempts: List[dict], *, nodes: int = 2, gpus: int = 1, job: str = "42",
              t0: float = 1_800_000_000.0, step_times: bool = True) -> List[dict]:
    """Each attempt: steps (the step numbers it logs), saves (steps it saves at), validate (steps
    it validates at), unlogged (seconds trained after its last logged step), tail (seconds from
    its last step to the driver's end), ends ("driver-end rc=0", "preempt", "teardown rc=143").
    Returns the allocations ({start, end, nodes, submit})."""
    paths = RunPaths(run_dir)
    paths.logs.mkdir(parents=True, exist_ok=True)
    run_dir.joinpath(RunPaths.RECORD).write_text(json.dumps({"job_id": job, "run_dir": str(run_dir), "nodes": nodes,
                                                             "gpus_per_node": gpus, "submitted": t0 - 30}))
    marks, allocs, t = [], [], t0
    for r, a in enumerate(attempts):
        start = t
        def mark(name: str, at: float, detail: str = "") -> None:
            marks.append({"phase": name, "time": at, "job": job, "restart": r, "detail": detail})
        mark("start", t + 1)
        mark("nodes", t + 1.1, "node1 node2")
        mark("inputs-check", t + 1.5)
        mark("wandb-check", t + 2.0)
        mark("head-up", t + 6.0)
        mark("workers-up", t + 12.0)
        mark("ready", t + 12.1)
        mark("driver-start", t + 12.2)
        t += 12.2 + a.get("verl_start", 100.0)
        lines, ends = [], []
        for s in a.get("steps", []):
            line, secs = step_line(s, validate=s in a.get("validate", ()), save=s in a.get("saves", ()))
            t += secs
            lines.append(f"(TaskRunner pid=42) some other line\n{line}")
            ends.append({"step": s, "time": round(t + 1.0, 3)})  # seen within the watchdog's poll
        t += a.get("unlogged", 0.0) + a.get("tail", 3.0)
        how = a.get("ends", "driver-end rc=0")
        name, _, detail = how.partition(" ")
        mark(name, t, detail)
        mark("teardown", t + 0.1, "rc=0" if how == "driver-end rc=0" else "rc=143")
        t += a.get("teardown", 5.0)
        (paths.logs / RunPaths.DRIVER_LOG.format(restart=r)).write_text("".join(lines))
        if step_times:
            (paths.logs / RunPaths.STEPS.format(restart=r)).write_text("".join(json.dumps(e) + "\n" for e in ends))
        allocs.append({"start": start, "end": t, "nodes": nodes, "submit": t0 - 30 if r == 0 else start})
        t += 10  # queued again
    paths.phases.write_text("".join(json.dumps(m) + "\n" for m in marks))
    return allocs


def seconds(step: int, attempt: Optional[dict] = None) -> float:
    a = attempt or {}
    return step_line(step, validate=step in a.get("validate", ()), save=step in a.get("saves", ()))[1]
