"""The command line of a sweep (`check -m`, `submit -m`): printing and exit codes only; the
sweep itself is sweep.py, its Slurm calls slurm.py."""

from __future__ import annotations

import json
import os
import sys

from . import sweep
from .console import fail
from .errors import EXIT_FAILED, EXIT_NEVER_STARTS, SlurmError


def _load(args) -> sweep.Sweep:
    extra = []
    if getattr(args, "local", False):
        from .local import local_overrides

        extra = local_overrides(os.environ)
    return sweep.load_points(args.recipe, args.overrides, extra, max_points=args.max_points)


def _table(sw: sweep.Sweep, out) -> None:
    print(f"{'POINT':>5}  {'EXPERIMENT':<40} OVERRIDES", file=out)
    for p in sw.points:
        print(f"{p.index:>5}  {p.experiment:<40} {p.label()}", file=out)


def _verl_line(sw: sweep.Sweep) -> str:
    pre = [p.preflight for p in sw.points if p.preflight is not None]
    if not pre:
        return "skipped (--no-check)"
    first = pre[0]
    return f"{first.status}: {first.message}" + (f" ({len(sw.points)} points, one verl process)"
                                                 if first.status == "ok" else "")


def cmd_check(args) -> int:
    sw = _load(args)
    sweep.check(sw, os.environ)
    r = sw.points[0].loaded.recipe
    c = r.cluster
    print(f"recipe      {r.source}")
    print(f"sweep       {sw.name}: {len(sw.points)} points, one job array; each {c.nodes} node(s) x "
          f"{c.gpus_per_node} GPU(s)")
    print(f"W&B         project={r.wandb.project} group={r.wandb.group} job_type={r.wandb.job_type}")
    print(f"preflight   {_verl_line(sw)}")
    _table(sw, sys.stdout)
    print(f"ok: submit -m would queue this sweep ({len(sw.points)} points)")
    return 0


def cmd_submit(args) -> int:
    from .slurm import schedule_sweep

    sw = _load(args)
    sweep.check(sw, os.environ, verl=not args.no_check)
    print(f"preflight   {_verl_line(sw)}", file=sys.stderr)
    req = sweep.plan(sw, args.max_parallel)
    if args.dry_run:
        if args.local:
            command = f"each point's {req.requests[0].paths.SCRIPT} here, one after another, without Slurm"
        else:
            command = str(req)
        if args.json:
            print(json.dumps({"dry_run": True, "command": command, "sweep_dir": str(req.sweep_dir),
                              "script": req.script, "points": [req.point_info(p, None) for p in sw.points]}))
        else:
            print(f"# would run: {command}")
            sys.stdout.write(req.script)
            _table(sw, sys.stdout)
        return 0
    if args.local:
        return _run_local(req, args)
    try:
        rec = schedule_sweep(req)
    except (SlurmError, OSError) as e:
        return fail(f"error: {e}", EXIT_FAILED)
    out = sys.stderr if args.json else sys.stdout
    info = {"job_id": rec["job_id"], "sweep_dir": rec["sweep_dir"], "name": rec["name"], "points": rec["points"]}
    if args.json and not args.wait:
        print(json.dumps(info))
        return 0
    print(f"Submitted batch job {rec['job_id']} (a job array: sweep {rec['name']}, {len(sw.points)} points"
          + (f", at most {args.max_parallel} at once" if args.max_parallel else "") + ")", file=out)
    print(f"  sweep dir {rec['sweep_dir']}", file=out)
    _table(sw, out)
    if not args.wait:
        print(f"Follow it: verl-launch status {rec['job_id']}   (a point's output: verl-launch logs -f "
              f"{rec['job_id']}_0, stop all: verl-launch cancel {rec['job_id']})", file=out)
        return 0
    final = _wait(rec, out)
    info["states"] = final
    if args.json:
        print(json.dumps(info))
    return 0 if all(s == "COMPLETED" for s in final.values()) else EXIT_FAILED


def _wait(rec: dict, out) -> dict:
    """Until every point has ended: one line whenever the points' states change."""
    import time

    from . import registry
    from .slurm import TERMINAL, never_starts, states, watch_many

    points = [r for r in registry.runs() if r.get("sweep") == rec["sweep_dir"]]
    t0 = time.monotonic()

    def show(counts: dict) -> None:
        text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        print(f"  [{time.monotonic() - t0:6.1f}s] {text}", file=out, flush=True)

    try:
        final = watch_many(points, show, stop_if_never_starts=True)
    except KeyboardInterrupt:
        try:
            queued = all(i.get("state") in ("PENDING",) + tuple(TERMINAL) for i in states(points).values())
        except (SlurmError, KeyboardInterrupt):
            queued = False
        print(f"\ndetached; sweep {rec['job_id']} " + ("stays queued (remove it" if queued else "keeps running (stop it")
              + f": verl-launch cancel {rec['job_id']})", file=out)
        raise SystemExit(0)
    if not all(s in TERMINAL for s in final.values()):  # every point still waiting can never start
        why = {never_starts(i) for i in states(points).values() if i.get("state") not in TERMINAL}
        print(f"sweep {rec['job_id']} will not start: {'; '.join(sorted(w for w in why if w))}. Stopped waiting; "
              f"its points stay queued (remove them: verl-launch cancel {rec['job_id']})", file=out)
        raise SystemExit(EXIT_NEVER_STARTS)
    print(f"sweep {rec['job_id']}: " + ", ".join(f"{p['job_id']} {final[p['run_dir']]}" for p in points), file=out)
    return {p["job_id"]: final[p["run_dir"]] for p in points}


def _run_local(req: sweep.SweepRequest, args) -> int:
    """The points one after another on this machine, as `submit --local` runs one."""
    from . import local, registry
    from .paths import SweepPaths

    out = sys.stderr if args.json else sys.stdout
    sp = SweepPaths(req.sweep_dir)
    sp.create(req.script)
    record = req.record(None)
    record["local"] = True
    sp.write_record(record)
    registry.record({k: v for k, v in record.items() if k != "points"})
    results = []
    n = len(req.points)
    for p, point in zip(req.points, req.requests):  # numbered 1..N of N; the index (its directory) stays
        print(f"point {p.index + 1}/{n} ({p.label()}): running locally in {point.paths.run_dir}",
              file=out, flush=True)
        rec = local.run(point, p.loaded.plan, os.environ, out)
        print(f"point {p.index + 1}/{n} {rec['final_state']} exit code {rec['exit_code']} in {rec['elapsed']} s",
              file=out)
        results.append({"index": p.index, "job_id": rec["job_id"], "run_dir": rec["run_dir"],
                        "final_state": rec["final_state"], "exit_code": rec["exit_code"]})
    if args.json:
        print(json.dumps({"sweep_dir": str(req.sweep_dir), "name": req.name, "points": results}))
    return 0 if all(r["final_state"] == "COMPLETED" for r in results) else EXIT_FAILED
