"""The job toolkit's commands: list, status, logs, cancel. Slurm is asked through slurm.py
(batched), runs are found through the registry."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from .errors import EXIT_FAILED, RecipeError, SlurmError
from .paths import RunPaths
from .secrets import redact
from . import registry, slurm


def _run_or_fail(ref: str) -> dict:
    run = registry.find(ref)
    if run is None:  # what was typed names nothing: bad input, as a bad recipe is
        raise RecipeError(f"no run with job id or run directory {ref!r} in {registry.registry_file()}",
                          where="command line")
    return run


def _elapsed(run: dict, info: dict) -> str:
    start, end = slurm.slurm_time(info.get("start")), slurm.slurm_time(info.get("end"))
    if start is None:
        return "-"
    secs = int((end or time.time()) - start)
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"


def _row(run: dict, info: dict) -> dict:
    paths = RunPaths(Path(run["run_dir"]))
    phase = paths.last_phase()
    state = info.get("state", "UNKNOWN")
    ended = state in slurm.TERMINAL
    restart = phase.get("restart", 0) if phase else 0
    progress = paths.progress(restart, running=phase["phase"] == "driver-start" and not ended) if phase else None
    step = _last_step(paths, restart) if phase else None
    return {"job_id": run["job_id"], "name": run.get("job_name"), "experiment": run.get("experiment"),
            "state": state, "exit_code": info.get("exit_code") if ended else None,  # none until it ends
            "reason": slurm.reason_of(info.get("reason")), "never_starts": slurm.never_starts(info),
            "phase": slurm.shown_phase(phase["phase"], f"training step {step}" if step and not ended else progress)
            if phase else None,
            "phase_marker": phase["phase"] if phase else None,  # the job's own marker (phases.jsonl)
            "phase_detail": phase.get("detail") if phase else None,
            "restart": restart, "nodes": run.get("nodes"),
            "stopped": paths.stop_reason(), "bad_nodes": paths.bad_nodes(),
            "progress": progress, "step": step, "outcome": _outcome(state, step),
            "elapsed": _elapsed(run, info), "run_dir": run["run_dir"], "source": info.get("source")}


_STEP_LINE = re.compile(rb"(?<![\w/])step:(\d+) - ")  # verl's console logger (not 'timing_s/step:2.4')


def _last_step(paths: RunPaths, restart: int = 0) -> Optional[str]:
    """The last training step known of the latest run, '37/120' (or '37' without verl's total):
    from the driver's own log (it outlives the watchdog, which may miss the last steps of a
    short run), else the watchdog's state file."""
    step = total = None
    try:
        state = json.loads(paths.ray_state(restart).read_text())
        step, total = state.get("step"), state.get("total_steps")
    except (OSError, ValueError, AttributeError):
        pass
    log = paths.driver_log(restart)
    try:
        size = log.stat().st_size
        with open(log, "rb") as f:
            found = re.findall(rb"Total training steps: (\d+)", f.read(1 << 20))
            total = int(found[-1]) if found else total
            f.seek(max(0, size - 65536))
            steps = _STEP_LINE.findall(f.read())
            step = int(steps[-1]) if steps else step
    except OSError:
        pass
    if step is None:
        return None
    return f"{step}/{total}" if total else str(step)


def _outcome(state: str, step: Optional[str]) -> Optional[str]:
    """How far an ended run got: 'completed 3/3', 'failed at step 37/120'."""
    if state not in slurm.TERMINAL or not step:
        return None
    return f"completed {step}" if state == "COMPLETED" else f"{state.lower()} at step {step}"


def _states(runs: list) -> dict:
    """Each run's state by run dir: Slurm's for submitted runs (batched), the run's own record
    for local ones (Slurm never knew them)."""
    queued = [r for r in runs if not r.get("local")]
    out = slurm.states(queued) if queued else {}
    for run in runs:
        if run.get("local"):
            try:
                rec = json.loads(RunPaths(Path(run["run_dir"])).record.read_text())
            except (OSError, ValueError):
                rec = {}
            state, reason = rec.get("final_state"), None
            if state is None:
                state, reason = _local_state(run, rec)
            out[run["run_dir"]] = {"state": state, "exit_code": rec.get("exit_code"), "reason": reason,
                                   "source": "local"}
    return out


def _local_state(run: dict, rec: dict) -> tuple:
    """A local run without a final state: RUNNING while its runner lives (seen from its host);
    else UNKNOWN, and why."""
    if not Path(run["run_dir"]).is_dir():
        return "UNKNOWN", "its run directory is gone"
    runner = rec.get("runner") or run.get("runner") or {}
    if runner.get("host") != socket.gethostname().split(".")[0] or not runner.get("pid"):
        return "RUNNING", None  # another machine's (or an older record's): cannot tell from here
    try:
        cmdline = Path(f"/proc/{runner['pid']}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    if b"launcher" in cmdline or b"verl-launch" in cmdline:
        return "RUNNING", None
    return "UNKNOWN", f"its runner (pid {runner['pid']}) ended without recording an end"


def _points(sweep: dict, everything: Optional[list] = None) -> list:
    """A sweep's points, in order, from the registry."""
    runs = registry.runs() if everything is None else everything
    points = {r["index"]: r for r in runs if r.get("sweep") == sweep["run_dir"]}
    return [points[i] for i in sorted(points)]


STATE_ORDER = ("RUNNING", "PENDING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def counted(counts: dict) -> str:
    """{state: n} in words, busy states first: '1 completed, 1 cancelled'."""
    order = sorted(counts, key=lambda s: (STATE_ORDER.index(s) if s in STATE_ORDER else len(STATE_ORDER), s))
    return ", ".join(f"{counts[s]} {s.lower()}" for s in order)


def _base_experiment(sweep: dict, points: list) -> Optional[str]:
    """The sweep's base experiment name (what each point's name starts with), else None."""
    if sweep.get("base_experiment"):
        return sweep["base_experiment"]
    from .sweep import experiment_names

    bases = set()
    for p in points:
        ovs = p.get("overrides") or []
        tail = experiment_names("", [ov.split("=", 1)[0] for ov in ovs], [ovs])[0] if ovs else ""
        exp = p.get("experiment") or ""
        if not tail or not exp.endswith(tail) or len(exp) == len(tail):
            return None  # swept wandb.experiment, or a name cut short: no common base
        bases.add(exp[:-len(tail)])
    return bases.pop() if len(bases) == 1 else None


def _sweep_row(sweep: dict, rows: list, points: Optional[list] = None) -> dict:
    """A sweep as one run: its points' states counted ("2 RUNNING, 2 PENDING")."""
    counts: dict = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    busy = [s for s in ("RUNNING", "PENDING") if s in counts]
    state = busy[0] if busy else ("COMPLETED" if set(counts) == {"COMPLETED"} else
                                  "FAILED" if counts else "UNKNOWN")
    base = _base_experiment(sweep, points if points is not None else _points(sweep))
    return {"job_id": sweep["job_id"] or "-", "name": sweep.get("job_name"), "experiment": base or sweep.get("name"),
            "sweep": sweep.get("name"), "kind": "sweep", "state": state, "counts": counts,
            "summary": counted(counts), "nodes": sweep.get("nodes"),
            "elapsed": max((r["elapsed"] for r in rows if r["elapsed"] != "-"), default="-",
                           key=lambda e: [int(x) for x in e.split(":")]),
            "run_dir": sweep["run_dir"], "points": rows, "restart": 0}


def cmd_list(args) -> int:
    everything = registry.runs()
    runs = [r for r in everything if not r.get("sweep")][-args.n:] if args.n > 0 else []
    points = {r["run_dir"]: _points(r, everything) for r in runs if r.get("kind") == "sweep"}
    wanted = [r for r in runs if r.get("kind") != "sweep"] + [p for ps in points.values() for p in ps]
    try:
        info = _states(wanted)
    except SlurmError as e:  # no Slurm here (a CI box): the local runs still have their own records
        runs = [r for r in runs if r.get("local")]
        if not runs:
            raise
        left = len([r for r in wanted if not r.get("local")])
        print(redact(f"note: {left} Slurm run(s) not listed: {e}"), file=sys.stderr)
        info = _states([r for r in wanted if r.get("local")])
    rows = []
    for r in reversed(runs):
        if r.get("kind") == "sweep":
            ps = points[r["run_dir"]]
            rows.append(_sweep_row(r, [_row(p, info.get(p["run_dir"], {})) for p in ps], ps))
        else:
            rows.append(_row(r, info.get(r["run_dir"], {})))
    if args.json:
        print(json.dumps(rows))
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


def _tracking(run: dict) -> tuple:
    """(wandb.enabled, trace.backend) of a run: its record, else its resolved recipe.yaml."""
    if "wandb_enabled" in run and "trace_backend" in run:
        return bool(run["wandb_enabled"]), run["trace_backend"]
    import yaml

    try:
        data = yaml.safe_load(RunPaths(Path(run["run_dir"])).recipe.read_text()) or {}
        return bool((data.get("wandb") or {}).get("enabled", True)), (data.get("trace") or {}).get("backend", "weave")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return True, "weave"  # an older run: as before


def wandb_links(run: dict) -> dict:
    """The run's W&B URLs (URLs only; see links_note): the project where W&B logging is on,
    the Weave traces where tracing goes to Weave."""
    project, entity = run.get("project"), run.get("entity")
    enabled, backend = _tracking(run)
    if not project or not (enabled or backend == "weave"):
        return {}
    base = (run.get("wandb_base_url") or "https://wandb.ai").rstrip("/").replace("://api.wandb.ai", "://wandb.ai")
    root = f"{base}/{entity or '<entity>'}/{project}"
    links = {"project": root} if enabled else {}
    if backend == "weave":
        links["traces"] = f"{root}/weave/traces"
    return links


def links_note(run: dict) -> Optional[str]:
    """What the links need said (no wandb.entity: '<entity>' stands for the key's default)."""
    if not wandb_links(run) or run.get("entity"):
        return None
    base = (run.get("wandb_base_url") or "https://wandb.ai").rstrip("/").replace("://api.wandb.ai", "://wandb.ai")
    return (f"no wandb.entity: the run is under your W&B key's default entity, shown at {base}/settings; "
            "set wandb.entity to get full links")


def cmd_status(args) -> int:
    run = _run_or_fail(args.ref)
    if run.get("kind") == "sweep":
        return _sweep_status(run, args)
    row = _row(run, _states([run])[run["run_dir"]])
    shown = wandb_links(run)
    # JSON: URLs only; without wandb.entity they hold a placeholder, so they are templates
    row["links"] = shown if run.get("entity") else {}
    row["link_templates"] = {} if run.get("entity") else shown
    row["links_note"] = links_note(run)
    row["stdout"] = str(RunPaths(Path(run["run_dir"])).stdout(run["job_id"]))
    row["merges"] = _merges(run)
    if args.json:
        print(redact(json.dumps(row)))
        return 0
    state = row["state"] + (f" ({row['reason']})" if row["state"] in ("PENDING", "UNKNOWN") and row["reason"] else "")
    print(f"job        {row['job_id']} ({row['name']}, experiment {row['experiment']})")
    ended = row["state"] in slurm.TERMINAL
    print(f"state      {state}" + (f", exit code {row['exit_code']}" if ended and row["exit_code"] else ""))
    if row["never_starts"]:
        print(f"waiting    it will never start: {row['never_starts']}; it stays queued until changed "
              f"(scontrol update) or removed: verl-launch cancel {row['job_id']}")
    if row["phase"]:
        print(redact(f"phase      {row['phase']}" + (f" ({row['phase_detail']})" if row["phase_detail"] else "")
                     + (f", restart {row['restart']}" if row["restart"] else "")))
    if row["progress"]:
        print(f"progress   {row['progress']}")
    if row["outcome"]:
        print(f"step       {row['outcome']}")
    if row["stopped"]:
        print(redact(f"stopped    {row['stopped']}"))
    for b in row["bad_nodes"]:  # what each restart was put down to (excluded when it requeued)
        print(redact(f"bad node   {b['node']} (run {b['restart']}): {b['why']}"))
    print(f"elapsed    {row['elapsed']}")
    print(f"run dir    {row['run_dir']}")
    print(f"output     {row['stdout']}")
    for name, url in shown.items():
        note = f" ({row['links_note']})" if name == "project" and row["links_note"] else ""
        print(f"W&B {name:<7} {url}{note}")
    if row["links_note"] and "project" not in shown:
        print(f"W&B note    {row['links_note']}")
    for m in row["merges"]:
        done = f"merged, {m['parameters']:,} parameters" if m.get("parameters") else m["state"]
        served = m.get("serve_check")
        if served:
            done += (f"; {served['engine']} served it: {served['prompt']!r} -> {served['output'][:60]!r}"
                     if served.get("ok") else f"; vLLM did not serve it: {str(served.get('error'))[:200]}")
        print(redact(f"merge      step {m['step']} -> {m['target']}: {done} (job {m['job_id']})"))
    return 0


def _merges(run: dict) -> list:
    """The run's merges (`verl-launch merge`), each with its outcome: the merged model's own
    marker when it is there, else the merge job's Slurm state."""
    from .merge_job import MARKER

    try:
        merges = json.loads(RunPaths(Path(run["run_dir"])).record.read_text()).get("merges", [])
    except (OSError, ValueError):
        return []
    out = []
    for m in merges:
        try:
            mark = json.loads((Path(m["target"]) / MARKER).read_text())
        except (OSError, ValueError, KeyError):
            mark = {}
        if mark.get("step") == m.get("step") and str(mark.get("job_id")) == str(m.get("job_id")):
            m = dict(m, state="COMPLETED", parameters=mark.get("parameters"), serve_check=mark.get("serve_check"))
        elif m.get("local"):
            m = dict(m, state="not merged (a local merge that did not finish)")
        else:
            info = slurm.job_info(str(m.get("job_id")))
            m = dict(m, state=info.get("JobState", "UNKNOWN") if info else "UNKNOWN (Slurm no longer knows the job)")
        out.append(m)
    return out


def _sweep_status(sweep: dict, args) -> int:
    points = _points(sweep)
    info = _states(points)
    rows = [_row(p, info.get(p["run_dir"], {})) for p in points]
    for p, row in zip(points, rows):
        row.update(index=p["index"], overrides=p.get("overrides", []))
    out = _sweep_row(sweep, rows, points)
    if args.json:
        print(redact(json.dumps(out)))
        return 0
    counts = ", ".join(f"{n} {s}" for s, n in sorted(out["counts"].items()))
    print(f"sweep      {sweep.get('name')} (job array {sweep['job_id'] or '- (local)'}): {len(rows)} points, {counts}")
    if out["experiment"] != sweep.get("name"):
        print(f"experiment {out['experiment']} (each point's name starts with it)")
    print(f"sweep dir  {sweep['run_dir']}")
    print(f"{'POINT':>5}  {'JOBID':<10} {'STATE':<11} {'PHASE':<14} {'EXIT':<6} {'STEP':<9} OVERRIDES")
    for r in rows:
        print(redact(f"{r['index']:>5}  {r['job_id']:<10} {_cut(r['state'], 11):<11} {_cut(r['phase'] or '-', 14):<14} "
                     f"{(r['exit_code'] or '-') if r['state'] in slurm.TERMINAL else '-':<6} {r['step'] or '-':<9} "
                     f"{' '.join(r['overrides'])}"))
    return 0


def _log_file(run: dict, args) -> Path:
    p = RunPaths(Path(run["run_dir"]))
    if not (args.driver or args.node):
        return p.stdout(run["job_id"])
    if args.driver:
        pattern = "driver.r*.log"
    elif _nodes(p) and args.node not in _nodes(p):  # a typo would print the head's log
        raise RecipeError(f"--node {args.node}: run {run['job_id']} ran on {', '.join(sorted(_nodes(p)))}",
                          where="command line")
    elif _head(p) == args.node:  # the head: its Ray's log (it has no worker log)
        pattern = "ray-head.r*.log"
    else:  # not the head's log in its place, before the node's is written: -f waits for it
        pattern = f"ray-worker-{args.node}.r*.log"
    logs = sorted(p.logs.glob(pattern), key=lambda f: f.stat().st_mtime)
    if not logs:
        raise SlurmError(f"no log matching {p.logs / pattern} (yet)")
    return logs[-1]


def _head(p: RunPaths) -> Optional[str]:
    """The run's head node (its latest run's), from the job's `nodes` phase: the head first."""
    found = [str(ph.get("detail", "")) for ph in p.read_phases() if isinstance(ph, dict) and ph.get("phase") == "nodes"]
    return found[-1].split()[0] if found and found[-1].split() else None


def _nodes(p: RunPaths) -> list:
    """The run's nodes (its latest run's), from the job's own list; [] before it wrote one."""
    try:
        return [line.split()[0] for line in (p.logs / p.NODES).read_text().splitlines() if line.split()]
    except OSError:
        return []


def _not_a_sweep(run: dict, what: str) -> None:
    if run.get("kind") == "sweep":
        first = f"{run['job_id']}_0" if run.get("job_id") else f"{run['run_dir']}/0"
        raise RecipeError(f"{run['job_id'] or run['run_dir']} is a sweep: {what} one of its points, e.g. {first} "
                          f"(verl-launch status {run['job_id'] or run['run_dir']} lists them)", where="command line")


def cmd_logs(args) -> int:
    run = _run_or_fail(args.ref)
    _not_a_sweep(run, "show the output of")
    try:
        path: Optional[Path] = _log_file(run, args)
    except SlurmError:  # --driver/--node before the job wrote one: -f waits for it (below)
        if not args.follow:
            raise
        path = None
    if not args.follow and not path.exists():  # as --driver and --node say: nothing to print yet
        info = None if run.get("local") else slurm.job_info(run["job_id"])
        state = f" (job {info.get('JobState')})" if info else ""
        raise SlurmError(f"no output yet{state}: {path} (logs -f waits for it)")
    pos = 0
    last_check = 0.0
    noted = False
    while True:
        if path is None:
            try:
                path = _log_file(run, args)
            except SlurmError:
                pass
        if path is not None and path.exists():
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if not args.follow:
            return 0
        if time.monotonic() - last_check >= 5:  # one scontrol every 5 s, not every read
            last_check = time.monotonic()
            if run.get("local"):  # ended when its record has the final state
                state = _states([run])[run["run_dir"]]["state"]
                ended = state != "RUNNING"
            else:
                info = slurm.job_info(run["job_id"])
                ended = info is None or slurm.ended(info)
                state = info.get("JobState", "UNKNOWN") if info else "no longer known to Slurm"
            if ended and path is not None and path.exists() and path.stat().st_size == pos:
                return 0
            if ended:  # it never wrote what was asked for
                what = path or _wanted_log(run, args)
                print(f"job {run['job_id']} ended ({state}) without writing {what}", file=sys.stderr)
                return EXIT_FAILED
            if not noted and (path is None or not path.exists()):
                print(f"waiting for {path or _wanted_log(run, args)} (job {run['job_id']} {state}; "
                      "Ctrl-C to stop)", file=sys.stderr, flush=True)
                noted = True
        time.sleep(1)


def _wanted_log(run: dict, args) -> str:
    """The log -f waits for, before it exists (its restart number is not known yet)."""
    logs = RunPaths(Path(run["run_dir"])).logs
    return str(logs / ("driver.r*.log" if args.driver else f"ray-worker-{args.node}.r*.log (or ray-head.r*.log)"))


def cmd_cancel(args) -> int:
    run = _run_or_fail(args.ref)
    if run.get("kind") == "sweep" and not run.get("local"):
        return _cancel_sweep(run)
    if run.get("local"):  # its id is not a Slurm job's: scancel could hit someone else's job
        raise SlurmError(f"run {run['job_id']} ran locally (submit --local), not under Slurm: "
                         "stop it with Ctrl-C where it runs")
    slurm.cancel(run["job_id"])
    paths = RunPaths(Path(run["run_dir"]))
    final = slurm.watch(run["job_id"], paths, lambda text: None, poll=1.0, timeout=120)
    state = final.get("JobState", "UNKNOWN")
    try:
        rec = json.loads(paths.record.read_text())
        rec.update(cancelled=time.time(), final_state=state)
        paths.write_record(rec)
    except (OSError, ValueError):
        pass
    print(f"job {run['job_id']} {state}")
    return 0 if state in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT") else 1


def _cancel_sweep(sweep: dict) -> int:
    """scancel the array (every point, running or pending), then wait until each has ended."""
    slurm.cancel(sweep["job_id"])
    points = _points(sweep)
    final = slurm.watch_many(points, lambda counts: None, poll=1.0, timeout=120)
    for p in points:
        paths = RunPaths(Path(p["run_dir"]))
        try:
            rec = json.loads(paths.record.read_text())
            rec.update(cancelled=time.time(), final_state=final[p["run_dir"]])
            paths.write_record(rec)
        except (OSError, ValueError):
            pass
        print(f"job {p['job_id']} {final[p['run_dir']]}")
    return 0 if all(s in slurm.TERMINAL for s in final.values()) else 1
