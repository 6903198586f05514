"""A user's runs as data: the one lookup of a run by job id or directory (runs are known by their
cluster and job id: ids repeat), their records, and each run's state as `status` and `list`
show it (Slurm's or the local runner's, through the run's backend; the job's own phases). The
registry file itself is registry.py; nothing here prints."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Optional, Tuple

from ..base import registry
from ..errors import RecipeError
from ..core.paths import MERGED, RunPaths, SweepPaths, shown_phase
from ..backends.slurm_commands import TERMINAL, cluster_name


# ----------------------------------------------------------------------------- the lookup
def find(ref: str, environ=None) -> Optional[dict]:
    """The run REF names: a run (or sweep) directory, or a job id (`CLUSTER:ID` for another
    cluster's). Job ids repeat (across clusters sharing a home, after a cluster's state is reset):
    an id is this cluster's (ClusterName in slurm.conf) where the records say, and the newest."""
    ref = str(ref)
    path = os.path.abspath(ref) if ("/" in ref or os.path.isdir(ref)) else None
    asked, job = _split(ref)
    here = asked or cluster_name(environ)
    same = []  # newest first
    for run in reversed(registry.runs()):
        if path and run.get("run_dir") == path:
            return run
        if run.get("job_id") == job:
            same.append(run)
    mine = [r for r in same if here and r.get("cluster") == here]
    unsaid = [] if asked else [r for r in same if not r.get("cluster") or r.get("local") or not here]
    if mine or unsaid:
        return (mine or unsaid)[0]
    for name in (RunPaths.RECORD, SweepPaths.RECORD):  # a run (or sweep) dir from elsewhere
        rec = RunPaths(Path(path)).read_record(name) if path else None
        if rec is not None:
            return dict(rec, run_dir=path)  # where it is now (copied from a cluster, moved), not where it ran
    return None


def require(ref: str) -> dict:
    """find(REF), or RecipeError (exit 2: what was typed names nothing, as a bad recipe is bad)."""
    run = find(ref)
    if run is None:
        asked, job = _split(str(ref))
        here = asked or cluster_name()
        elsewhere = sorted({f"{r['cluster']}:{job}" for r in registry.runs()
                            if r.get("job_id") == job and r.get("cluster") and r["cluster"] != here})
        raise RecipeError(f"no run with job id or run directory {ref!r} in {registry.registry_file()}"
                          + (f" on {'cluster' if asked else 'this cluster'} ({here}); another cluster's: "
                             f"{', '.join(elsewhere)}" if elsewhere else ""), where="command line")
    return run


def _split(ref: str):
    """'CLUSTER:ID' -> (cluster, ID); a bare id or a path -> ("", REF)."""
    if re.fullmatch(r"[\w.-]+:\d+(_\d+)?", ref):
        asked, _, job = ref.rpartition(":")
        return asked.lower(), job  # Slurm lower-cases ClusterName
    return "", ref


def points(sweep: dict, everything: Optional[list] = None) -> list:
    """A sweep's points, in order, from the registry."""
    runs = registry.runs() if everything is None else everything
    found = {r["index"]: r for r in runs if r.get("sweep") == sweep["run_dir"]}
    return [found[i] for i in sorted(found)]


def states(runs: list, failed: Optional[dict] = None) -> dict:
    """Each run's state by run dir, each backend asked once for its runs (Slurm's batched,
    local runs' records). FAILED: where a backend that cannot be asked is noted
    ({backend name: (its runs, the SlurmError)}) and its runs left out, rather than raised."""
    from .. import backends
    from ..errors import SlurmError

    by: dict = {}
    for r in runs:
        by.setdefault(backends.of(r).name, []).append(r)
    out: dict = {}
    for name, some in by.items():
        try:
            out.update(backends.of(some[0]).states(some))
        except SlurmError as e:
            if failed is None:
                raise
            failed[name] = (some, e)
    return out


def never_starts_text(why: str, job_id: str, who: Optional[str] = None) -> str:
    """What is said of a job Slurm can never start (wait, status, the API): built here only."""
    lead = f"{who} will not start" if who else "it will never start"
    return f"{lead}: {why}; it stays queued (remove it: verl-launch cancel {job_id})"


# ----------------------------------------------------------------------------- one run's state
def row(run: dict, info: dict) -> dict:
    """What `status --json` and `list` say of RUN, with INFO its state (states())."""
    from ..backends.slurm_commands import never_starts, reason_of

    paths = RunPaths(Path(run["run_dir"]))
    phase = paths.last_phase()
    state = info.get("state", "UNKNOWN")
    ended = state in TERMINAL
    restart = phase.get("restart", 0) if phase else 0
    progress = paths.progress(restart, running=phase["phase"] == "driver-start" and not ended) if phase else None
    done, total = last_step(paths, restart) if phase else (None, None)
    step = None if done is None else f"{done}/{total}" if total else str(done)
    return {"job_id": run["job_id"], "name": run.get("job_name"), "experiment": run.get("experiment"),
            "state": state, "exit_code": info.get("exit_code") if ended else None,  # none until it ends
            "reason": reason_of(info.get("reason")), "never_starts": never_starts(info),
            "phase": shown_phase(phase["phase"], f"training step {step}" if step and not ended else progress)
            if phase else None,
            "phase_marker": phase["phase"] if phase else None,  # the job's own marker (phases.jsonl)
            "phase_detail": phase.get("detail") if phase else None,
            "restart": restart, "nodes": run.get("nodes"), "cluster": run.get("cluster"),
            "stopped": paths.stop_reason(), "bad_nodes": paths.bad_nodes(),
            "progress": progress, "step": step, "steps_done": done, "total_steps": total,
            "outcome": outcome(state, step),
            "elapsed": elapsed(info), "run_dir": run["run_dir"], "source": info.get("source")}


def elapsed(info: dict) -> str:
    from ..backends.slurm_commands import slurm_time

    start, end = slurm_time(info.get("start")), slurm_time(info.get("end"))
    if start is None:
        return "-"
    secs = int((end or time.time()) - start)
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"


_STEP_LINE = re.compile(rb"(?<![\w/])step:(\d+) - ")  # verl's console logger (not 'timing_s/step:2.4')


def last_step(paths: RunPaths, restart: int = 0) -> Tuple[Optional[int], Optional[int]]:
    """The last training step known of the latest run and verl's total, (37, 120) (total None
    where verl did not say it): from the driver's own log (it outlives the watchdog, which may miss the last steps of a
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
    return (None, None) if step is None else (int(step), int(total) if total else None)


def outcome(state: str, step: Optional[str]) -> Optional[str]:
    """How far an ended run got: 'completed 3/3', 'failed at step 37/120'."""
    if state not in TERMINAL or not step:
        return None
    return f"completed {step}" if state == "COMPLETED" else f"{state.lower()} at step {step}"


# ----------------------------------------------------------------------------- sweeps and the list
STATE_ORDER = ("RUNNING", "PENDING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def counted(counts: dict) -> str:
    """{state: n} in words, busy states first: '1 completed, 1 cancelled'."""
    order = sorted(counts, key=lambda s: (STATE_ORDER.index(s) if s in STATE_ORDER else len(STATE_ORDER), s))
    return ", ".join(f"{counts[s]} {s.lower()}" for s in order)


def sweep_row(sweep: dict, rows: list) -> dict:
    """A sweep as one run: its points' states counted ("2 RUNNING, 2 PENDING")."""
    counts: dict = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    busy = [s for s in ("RUNNING", "PENDING") if s in counts]
    state = busy[0] if busy else ("COMPLETED" if set(counts) == {"COMPLETED"} else
                                  "FAILED" if counts else "UNKNOWN")
    return {"job_id": sweep["job_id"] or "-", "name": sweep.get("job_name"),
            "experiment": sweep.get("base_experiment") or sweep.get("name"),  # submit recorded it
            "sweep": sweep.get("name"), "kind": "sweep", "state": state, "counts": counts,
            "summary": counted(counts), "nodes": sweep.get("nodes"),
            "elapsed": max((r["elapsed"] for r in rows if r["elapsed"] != "-"), default="-",
                           key=lambda e: [int(x) for x in e.split(":")]),
            "run_dir": sweep["run_dir"], "points": rows, "restart": 0}


def sweep_status(sweep: dict) -> dict:
    """`status` of a sweep: its row, each point's with its task index, point number and overrides."""
    pts = points(sweep)
    info = states(pts)
    rows = [row(p, info.get(p["run_dir"], {})) for p in pts]
    for p, r in zip(pts, rows):
        r.update(index=p["index"], point=p["index"] + 1, overrides=p.get("overrides", []))
    return sweep_row(sweep, rows)


def listing(n: int = 20) -> tuple:
    """`list`: the newest N runs (a sweep as one row), newest first, and a note where Slurm
    could not be asked (its runs are then left out; the local ones have their own records)."""
    from .. import backends
    from ..checks.secrets import redact

    everything = registry.runs()
    runs = [r for r in everything if not r.get("sweep")][-n:] if n > 0 else []
    pts = {r["run_dir"]: points(r, everything) for r in runs if r.get("kind") == "sweep"}
    wanted = [r for r in runs if r.get("kind") != "sweep"] + [p for ps in pts.values() for p in ps]
    note, failed = None, {}
    info = states(wanted, failed)
    if failed:
        runs = [r for r in runs if backends.of(r).name not in failed]
        if not runs:
            raise next(iter(failed.values()))[1]
        note = "; ".join(redact(f"{len(lost)} {backends.of(lost[0]).title} run(s) not listed: {e}")
                         for lost, e in failed.values())
    rows = []
    for r in reversed(runs):
        if r.get("kind") == "sweep":
            rows.append(sweep_row(r, [row(p, info.get(p["run_dir"], {})) for p in pts[r["run_dir"]]]))
        else:
            rows.append(row(r, info.get(r["run_dir"], {})))
    return rows, note


# ----------------------------------------------------------------------------- links and merges
def tracking(run: dict) -> tuple:
    """(wandb.enabled, trace.backend) of a run: its record, else its resolved recipe.yaml."""
    if "wandb_enabled" in run and "trace_backend" in run:
        return bool(run["wandb_enabled"]), run["trace_backend"]
    data = RunPaths(Path(run["run_dir"])).resolved_recipe()  # an older run: as before where it says nothing
    return (bool((data.get("wandb") or {}).get("enabled", True)) if isinstance(data.get("wandb"), dict) else True,
            (data.get("trace") or {}).get("backend", "weave") if isinstance(data.get("trace"), dict) else "weave")


def wandb_links(run: dict) -> dict:
    """The run's W&B URLs (URLs only; see links_note): the project where W&B logging is on,
    the Weave traces where tracing goes to Weave."""
    project, entity = run.get("project"), run.get("entity")
    enabled, backend = tracking(run)
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


def merges(run: dict) -> list:
    """The run's merges (`verl-launch merge`), each with its outcome: the merged model's own
    marker when it is there, else the merge job's Slurm state."""

    merges = (RunPaths(Path(run["run_dir"])).read_record() or {}).get("merges", [])
    out = []
    for m in merges:
        try:
            mark = json.loads((Path(m["target"]) / MERGED).read_text())
        except (OSError, ValueError, KeyError):
            mark = {}
        if mark.get("step") == m.get("step") and str(mark.get("job_id")) == str(m.get("job_id")):
            m = dict(m, state="COMPLETED", parameters=mark.get("parameters"), serve_check=mark.get("serve_check"))
        else:
            from .. import backends

            m = dict(m, state=backends.of(m).merge_state(m))
        out.append(m)
    return out
