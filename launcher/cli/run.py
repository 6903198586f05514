"""The command line of one run (render, check, submit) and of merge and image: each calls the API
and prints what it returns; the exit code follows (0 ok, 1 failed, 2 bad input, 3 never starts)."""

from __future__ import annotations

import json
import os
import sys

from .. import api
from .console import fail
from .sweep import points_table, submitted


def cmd_render(args) -> int:
    sys.stdout.write(api.script(args.recipe, args.overrides, environ=os.environ, notes=sys.stderr))
    return 0


def cmd_check(args) -> int:
    """Everything `submit` checks, in the same order, with what would run; the exit code and
    the last line are `submit`'s verdict (a missing key: 2, as `submit` refuses)."""
    report = api.check(args.recipe, args.overrides, environ=os.environ, multirun=args.multirun, max_points=args.max_points, notes=sys.stderr)
    for label, text in report.lines:
        print(f"{label:<11} {text}")
    if report.points:
        points_table(report.points, sys.stdout)
    elif report.verl_args or report.ok:
        print("verl args")
        for a in report.verl_args:
            print(f"  {a}")
    if not report.ok:
        return fail(report.verdict, api.EXIT_BAD_INPUT)
    print(report.verdict)
    return 0


def cmd_import(args) -> int:
    """The recipe written, what was mapped and why, what was not carried and why, then check's
    report on it (as `check`)."""
    done = api.import_command(args.argv, args.output, force=args.force, environ=os.environ)
    print(f"{'imported':<11} {done.path}")
    for line in done.said:
        print(f"{'mapped':<11} {line}")
    for line in done.dropped:
        print(f"{'not carried':<11} {line}")
    for label, text in done.report.lines:
        print(f"{label:<11} {text}")
    print(done.report.verdict)
    return 0


def cmd_submit(args) -> int:
    req = api.dryrun(args.recipe, args.overrides, args.local, not args.no_check, os.environ, sys.stderr,
                     start=args.start, multirun=args.multirun, max_parallel=args.max_parallel,
                     max_points=args.max_points, resume_from=args.resume_from)
    if args.dry_run:
        if args.json:
            print(json.dumps({"dry_run": True, "command": str(req), **_where(req), "script": req.script,
                              **({"points": [p.meta["point"] for p in req.points]} if req.is_sweep else {})}))
        else:
            print(f"# would run: {req}")
            sys.stdout.write(req.script)
            if req.is_sweep:
                points_table(req.point_rows(), sys.stdout)
        return 0
    out = sys.stderr if args.json else sys.stdout
    if req.runs_here:
        if not req.is_sweep:
            print(f"Running locally (no Slurm) in {req.directory}", file=out, flush=True)
        return _ended(api.submit(req, environ=os.environ, out=out), args, out)
    try:
        run = api.submit(req, environ=os.environ)
    except OSError as e:
        return fail(f"error: {e}", api.EXIT_FAILED)
    if req.is_sweep:

        return submitted(run, req, args, out)
    info = {"job_id": run.job_id, **_where(req), "script": str(req.paths.script),
            "stdout": str(req.paths.stdout(run.job_id)), "logs": str(req.paths.logs), "phases": str(req.paths.phases)}
    if args.json and not args.wait:
        print(json.dumps(info))
        return 0
    print(f"Submitted batch job {run.job_id}", file=out)
    for label, key in (("run dir ", "run_dir"), ("script  ", "script"), ("output  ", "stdout"), ("ray logs", "logs")):
        print(f"  {label} {info[key]}", file=out)
    if not args.wait:
        print(f"Follow it: verl-launch logs -f {run.job_id}   (state: verl-launch status {run.job_id}, "
              f"stop: verl-launch cancel {run.job_id})", file=out)
        return 0
    from .jobs import follow

    st = follow(run, out)
    info.update(state=st["state"], exit_code=st["exit_code"])
    if args.json:
        print(json.dumps(info))
    return 0 if st["state"] == "COMPLETED" else api.EXIT_FAILED


def _where(req) -> dict:
    return {"sweep_dir": str(req.directory)} if req.is_sweep else {"run_dir": str(req.directory)}


def _ended(run, args, out) -> int:
    """A run (or sweep) that submit ran to its end here: its line, and the JSON asked for."""
    if isinstance(run, api.SweepRun):
        pts = [json.loads(p.paths.record.read_text()) for p in run.points()]
        if args.json:
            print(json.dumps({"sweep_dir": run.run_dir, "name": run.record.get("name"),
                              "points": [{k: p[k] for k in ("index", "job_id", "run_dir", "final_state", "exit_code")}
                                         for p in pts]}))
        return 0 if all(p["final_state"] == "COMPLETED" for p in pts) else api.EXIT_FAILED
    rec = json.loads(run.paths.record.read_text())
    print(f"local run {rec['job_id']} {rec['final_state']} exit code {rec['exit_code']} in {rec['elapsed']} s; "
          f"output in {run.paths.stdout(rec['job_id'])}", file=out)
    if args.json:
        print(json.dumps({k: rec[k] for k in ("job_id", "run_dir", "final_state", "exit_code", "leftovers")}))
    return 0 if rec["final_state"] == "COMPLETED" else api.EXIT_FAILED


def cmd_image(args) -> int:
    done = api.image_import(args.image, args.output, dry_run=args.dry_run)
    if args.dry_run:
        print(f"# would run: {done['command']}")
        print(f"container.image={done['path']}")
        return 0
    print(f"{'already imported' if done['existed'] else 'imported'}: {done['path']}")
    print(f"use it with: container.image={done['path']}")
    return 0


def cmd_merge(args) -> int:
    out = sys.stderr if args.json else sys.stdout
    if args.dry_run:
        p = api.merge_dryrun(args.ref, args.step, args.target, args.local, args.serve_check)
        spec = p["spec"]
        print(f"would merge step {p['ckpt'].step} of {spec.checkpoint} "
              f"{'here (submitit local executor)' if args.local else 'as a one-node Slurm job'}: "
              f"{p['mem_gb']} GB of memory, {p['gpus']} GPU(s)", file=out)
        print(f"  target       {spec.target}", file=out)
        print(f"  interpreter  {spec.python}", file=out)
        if args.serve_check:
            print(f"  serve check  vLLM loads the merged model and generates ({p['vllm']})"
                  + ("; it asks for 1 GPU: the run's nodes have GPUs" if p["gpus"] else ""), file=out)
        if args.json:
            print(json.dumps({"dry_run": True, "step": p["ckpt"].step, "checkpoint": spec.checkpoint,
                              "target": spec.target, "mem_gb": p["mem_gb"], "gpus": p["gpus"],
                              "python": spec.python, "serve_check": args.serve_check}))
        return 0
    job = api.merge(args.ref, args.step, args.target, args.local, args.serve_check)
    info = job.verl_launch
    where = "here (submitit's local executor)" if args.local else f"as Slurm job {info['job_id']}"
    print(f"merging step {info['step']} of {info['checkpoint']} {where}, {info['mem_gb']} GB of memory"
          + (f", {info['gpus']} GPU" if info["gpus"] else ""), file=out)
    print(f"  target  {info['target']}", file=out)
    print(f"  output  {job.paths.stdout}", file=out)
    if args.serve_check:
        print("  then    vLLM loads it and generates from its chat template (--serve-check)", file=out)
    result = {"job_id": info["job_id"], "target": info["target"], "step": info["step"]}
    if not args.wait:  # it goes on without us: say how to follow it
        where = (f"it runs here in the background, pid {info['job_id']}" if args.local
                 else f"Slurm job {info['job_id']}")
        try:
            status = f"`verl-launch status {args.ref}` shows the result; " if api.run(args.ref) else ""
        except api.RecipeError:  # a checkpoint directory, not a run
            status = ""
        print(f"Follow it: tail -f {job.paths.stdout}   ({where}; {status}merge ... --wait waits for it)", file=out)
    else:
        try:
            api.wait_merge(job, on_change=lambda state: print(f"  {state}", file=out, flush=True))
        except api.SlurmError as e:
            return fail(f"error: {e}", api.EXIT_FAILED)
        print(f"merged: {info['target']}", file=out)
        served = api.served(info["target"])
        if served:
            print(f"served: vLLM answered {served['prompt']!r} with {served['output']!r}", file=out)
            result["serve_check"] = served
    if args.json:
        print(json.dumps(result))
    return 0
