"""The command line of the job toolkit (list, status, logs, cancel) and of `submit --wait`: each
calls the API and prints what it returns."""

from __future__ import annotations

import json
import sys
import time

from .. import api
from .console import redact


def cmd_list(args) -> int:
    rows = api.runs(args.n)
    if rows.note:
        print(f"note: {rows.note}", file=sys.stderr)
    if args.json:
        print(json.dumps(list(rows)))
        return 0
    states = []
    for r in rows:
        state = r["state"] + (f" r{r['restart']}" if r["restart"] else "")  # it restarted
        if r.get("kind") == "sweep":
            state = f"sweep: {r['summary']}"
        states.append(state)
    width = max([14] + [len(s) for s in states])
    print(f"{'JOBID':>8}  {'NAME':<16} {'EXPERIMENT':<22} {'STATE':<{width}} {'STEP':>9} {'NODES':>5} {'ELAPSED':>9}  "
          "RUN DIR")
    for r, state in zip(rows, states):
        print(f"{r['job_id']:>8}  {_cut(r['name'], 16):<16} {_cut(r['experiment'], 22):<22} "
              f"{state:<{width}} {r.get('step') or '-':>9} {str(r['nodes']):>5} {r['elapsed']:>9}  {r['run_dir']}")
    return 0


def _cut(value, width: int) -> str:
    """VALUE in WIDTH columns; a longer one ends in an ellipsis, so a cut is never mistaken for a name."""
    text = str(value)
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def cmd_status(args) -> int:
    run = api.run(args.ref)
    if isinstance(run, api.SweepRun):
        return _sweep_status(run, args)
    row = run.status()
    if args.json:
        print(redact(json.dumps(row)))
        return 0
    state = row["state"] + (f" ({row['reason']})" if row["state"] in ("PENDING", "UNKNOWN") and row["reason"] else "")
    ended = row["exit_code"] is not None
    print(f"job        {row['job_id']} ({row['name']}, experiment {row['experiment']})")
    print(f"state      {state}" + (f", exit code {row['exit_code']}" if ended and row["exit_code"] else ""))
    if row["never_starts"]:
        print(f"waiting    {api.never_starts_text(row['never_starts'], row['job_id'])}")
    if row["phase"]:
        print(redact(f"phase      {row['phase']}" + (f" ({row['phase_detail']})" if row["phase_detail"] else "")
                     + (f", restart {row['restart']}" if row["restart"] else "")))
    for label, key in (("progress", "progress"), ("step", "outcome")):
        if row[key]:
            print(f"{label:<10} {row[key]}")
    if row["stopped"]:
        print(redact(f"stopped    {row['stopped']}"))
    for b in row["bad_nodes"]:  # what each restart was put down to (excluded when it requeued)
        print(redact(f"bad node   {b['node']} (run {b['restart']}): {b['why']}"))
    print(f"elapsed    {row['elapsed']}")
    if row.get("goodput"):
        print(f"goodput    {row['goodput']}")
    print(f"run dir    {row['run_dir']}")
    print(f"output     {row['stdout']}")
    shown = row["links"] or row["link_templates"]
    for name, url in shown.items():
        note = f" ({row['links_note']})" if name == "project" and row["links_note"] else ""
        print(f"W&B {name:<7} {url}{note}")
    if row["links_note"] and "project" not in shown:
        print(f"W&B note    {row['links_note']}")
    if row.get("wandb_offline"):
        print(f"W&B sync   {row['wandb_offline']}")
    if row.get("traces"):
        print(redact(f"traces     {row['traces']['text']}"))
        if row["traces"].get("volume"):
            print(f"volume     {row['traces']['volume']}")
    for m in row["merges"]:
        done = f"merged, {m['parameters']:,} parameters" if m.get("parameters") else m["state"]
        served = m.get("serve_check")
        if served:
            done += (f"; {served['engine']} served it: {served['prompt']!r} -> {served['output'][:60]!r}"
                     if served.get("ok") else f"; vLLM did not serve it: {str(served.get('error'))[:200]}")
        print(redact(f"merge      step {m['step']} -> {m['target']}: {done} (job {m['job_id']})"))
    return 0


def _sweep_status(run, args) -> int:
    out = run.status()
    if args.json:
        print(redact(json.dumps(out)))
        return 0
    rec, rows = run.record, out["points"]
    counts = ", ".join(f"{n} {s}" for s, n in sorted(out["counts"].items()))
    print(f"sweep      {rec.get('name')} (job array {rec['job_id'] or '- (local)'}): {len(rows)} points, {counts}")
    if out["experiment"] != rec.get("name"):
        print(f"experiment {out['experiment']} (each point's name starts with it)")
    print(f"sweep dir  {rec['run_dir']}")
    print(f"{'POINT':>5}  {'JOBID':<10} {'STATE':<11} {'PHASE':<14} {'EXIT':<6} {'STEP':<9} OVERRIDES")
    for r in rows:
        print(redact(f"{r['point']:>5}  {r['job_id']:<10} {_cut(r['state'], 11):<11} {_cut(r['phase'] or '-', 14):<14} "
                     f"{r['exit_code'] or '-':<6} {r['step'] or '-':<9} {' '.join(r['overrides'])}"))
    return 0


def cmd_logs(args) -> int:
    run = api.run(args.ref)
    if not args.follow:
        sys.stdout.write(run.logs(driver=args.driver, node=args.node))
        return 0
    for chunk in run.logs(follow=True, driver=args.driver, node=args.node,
                          note=lambda text: print(text, file=sys.stderr, flush=True)):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0


def cmd_sync(args) -> int:
    run = api.run(args.ref)
    done = run.sync(wait=args.wait, python=args.python,
                    on_change=lambda text: print(f"job {run.job_id}: {text}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(done))
        return 0
    for d in done["synced"]:
        print(f"synced     {d}")
    for d in done["already"]:
        print(f"already    {d} (synced before: nothing sent)")
    print(f"W&B run    {done['run_id']}: " + ("sent" if done["synced"] else "nothing new to send"))
    return 0


def cmd_cancel(args) -> int:
    run = api.run(args.ref)
    final = run.cancel()
    if isinstance(run, api.SweepRun):
        for job_id, state in final.items():
            print(f"job {job_id} {state}")
        return 0 if all(s in api.TERMINAL for s in final.values()) else 1
    print(f"job {run.job_id} {final}")
    return 0 if final in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT") else 1


def follow(run, out) -> dict:
    """`submit --wait`: the job's state and phase as they change (on a terminal, the driver's
    progress is one line rewritten in place), then its end; its status. Ctrl-C detaches."""
    t0 = time.monotonic()
    live = out.isatty()
    open_line, seen = [False], [None]

    def show(text: str) -> None:
        seen[0] = text.split(maxsplit=1)[0].rstrip(":") if text.strip() else None  # "PENDING (BeginTime)"
        line = redact(f"  [{time.monotonic() - t0:6.1f}s] {text}")
        if live and text.startswith(("RUNNING: driver-start - ", "RUNNING: training - ")):
            print(f"\r\033[K{line}", end="", file=out, flush=True)
            open_line[0] = True
            return
        print(("\n" if open_line[0] else "") + line, file=out, flush=True)
        open_line[0] = False

    try:
        run.wait(poll=2.0, on_change=show)
    except KeyboardInterrupt:
        # The state the wait last saw, not a new Slurm query: Ctrl-C detaches at once, however
        # slow slurmctld (or sacct) answers just then.
        print(("\n" if open_line[0] else "") + f"\n{_detached(run.job_id, seen[0])}", file=out)
        raise SystemExit(0)
    except api.SlurmError as e:
        if not getattr(e, "never_starts", None):
            print(f"error: {e}; job {run.job_id} keeps running", file=out)
            raise SystemExit(api.EXIT_FAILED)
        print(("\n" if open_line[0] else "") + redact(f"{e}. Stopped waiting"), file=out)
        raise SystemExit(api.EXIT_NEVER_STARTS)
    st = run.status()
    why = st["stopped"] if st["state"] != "COMPLETED" else None
    print(("\n" if open_line[0] else "") + redact(f"job {run.job_id} {st['state']} exit code {st['exit_code']}"
                                                  + (f" - {why}" if why else "") + f"; output in {st['stdout']}"),
          file=out)
    if st.get("traces"):
        print(redact(f"traces     {st['traces']['text']}"), file=out)
    return st


def _detached(job_id: str, state) -> str:
    """What Ctrl-C on --wait leaves: a queued job stays queued, a running one keeps running."""
    if state == "PENDING":
        return f"detached; job {job_id} stays queued (remove it: verl-launch cancel {job_id})"
    return f"detached; job {job_id} keeps running (stop it: verl-launch cancel {job_id})"
