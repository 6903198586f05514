"""The command line of a sweep once submitted (`submit -m`): what was queued, and `--wait` over its
points, and the points' table (check -m and the dry-run print it too). It calls the API and prints."""

from __future__ import annotations

import json
import time

from .. import api
from .console import redact


def submitted(run, req, args, out) -> int:
    """The job array queued: its points, then how to follow it (or --wait for them all)."""
    info = {"job_id": run.job_id, "sweep_dir": run.run_dir, "name": req.meta["name"],
            "points": req.record(run.job_id)["points"]}  # each with its job id and run dir
    if args.json and not args.wait:
        print(json.dumps(info))
        return 0
    print(f"Submitted batch job {run.job_id} (a job array: sweep {req.meta['name']}, {len(req.points)} points"
          + (f", at most {args.max_parallel} at once" if args.max_parallel else "") + ")", file=out)
    print(f"  sweep dir {run.run_dir}", file=out)
    points_table(req.point_rows(), out)
    if not args.wait:
        print(f"Follow it: verl-launch status {run.job_id}   (a point's output: verl-launch logs -f "
              f"{run.job_id}_0, stop all: verl-launch cancel {run.job_id})", file=out)
        return 0
    info["states"] = _wait(run, out)
    if args.json:
        print(json.dumps(info))
    return 0 if all(s == "COMPLETED" for s in info["states"].values()) else api.EXIT_FAILED


def points_table(rows, out) -> None:
    """A sweep's points, (number, experiment, overrides) each, as check -m and submit -m show them."""
    print(f"{'POINT':>5}  {'EXPERIMENT':<40} OVERRIDES", file=out)
    for number, experiment, label in rows:
        print(f"{number:>5}  {experiment:<40} {label}", file=out)


def _wait(run, out) -> dict:
    """Until every point has ended: one line whenever the points' states change."""
    t0 = time.monotonic()

    def show(counts: dict) -> None:
        text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        print(f"  [{time.monotonic() - t0:6.1f}s] {text}", file=out, flush=True)

    try:
        final = run.wait(on_change=show)
    except KeyboardInterrupt:
        try:
            queued = all(p.state() in ("PENDING",) + tuple(api.TERMINAL) for p in run.points())
        except (api.SlurmError, KeyboardInterrupt):
            queued = False
        print(f"\ndetached; sweep {run.job_id} " + ("stays queued (remove it" if queued else "keeps running (stop it")
              + f": verl-launch cancel {run.job_id})", file=out)
        raise SystemExit(0)
    except api.SlurmError as e:
        if not getattr(e, "never_starts", None):
            raise
        print(redact(f"{e}. Stopped waiting"), file=out)
        raise SystemExit(api.EXIT_NEVER_STARTS)
    print(f"sweep {run.job_id}: " + ", ".join(f"{job} {state}" for job, state in final.items()), file=out)
    return final
