"""Slurm: the only module that runs Slurm commands (sbatch, scontrol, sacct, scancel), and
what their answers mean (states, pending reasons). Nothing here writes a run directory or knows
a recipe: backends/slurm.py schedules a Request through ``sbatch`` and watches it through
``states`` / ``job_info``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Mapping, Optional, Tuple

from ..errors import SlurmError
from ..core.paths import RunPaths


def need(command: str, environ: Optional[Mapping[str, str]] = None) -> None:
    if shutil.which(command) is None:
        raise SlurmError(f"{command} not found on PATH: run this on a Slurm login node")
    conf = (os.environ if environ is None else environ).get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # Slurm's commands would retry it for a minute, then fail
        raise SlurmError(f"SLURM_CONF={conf}: no such file (unset it, or point it at slurm.conf)")


def sbatch(command: List[str], cwd: Path, environ: Optional[Mapping[str, str]] = None) -> str:
    """Run COMMAND (sbatch --parsable ...) in CWD; the job id it printed."""
    need(command[0], environ)
    try:
        proc = subprocess.run([shutil.which(command[0]) or command[0], *command[1:]], cwd=cwd, capture_output=True,
                              text=True, env=dict(environ) if environ is not None else None,
                              stdin=subprocess.DEVNULL, timeout=120)
    except subprocess.TimeoutExpired:
        raise SlurmError("sbatch did not answer within 120 s (is slurmctld up?)") from None
    if proc.returncode != 0:
        raise SlurmError(f"sbatch failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {proc.stdout.strip()!r}")
    return job_id


def cluster_name(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This cluster's ClusterName, read from slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf)
    without asking slurmctld; None where it cannot be read. Job ids repeat across clusters (and
    after a cluster's state is reset), so a run is known by this name and its job id."""
    return _cluster_name((os.environ if environ is None else environ).get("SLURM_CONF") or "/etc/slurm/slurm.conf")


@functools.lru_cache(maxsize=8)
def _cluster_name(path: str) -> Optional[str]:
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"\s*ClusterName\s*=\s*(\S+)", line, re.I)
                if m:
                    return m.group(1).lower()  # Slurm lower-cases it too
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------------- states and reasons
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


# Reasons a PENDING job keeps until someone changes the job or Slurm's configuration: the job
# asks for what the partition, account or QOS can never give (Slurm's "JOB REASON CODES").
# Waiting for them ends nothing; Resources, Priority, *Grp* limits, holds and a down or
# drained node (ReqNodeNotAvail) do clear by themselves.
NEVER_STARTS = {
    "PartitionNodeLimit": "it asks for more (or fewer) nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is above the partition's",
    "PartitionConfig": "it asks for what the partition has not got (nodes, GPUs, memory or CPUs)",
    "BadConstraints": "no node can ever satisfy its constraints (GPUs, CPUs, memory or features per node)",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "AccountNotAllowed": "its account may not use the partition",
    "QOSNotAllowed": "its QOS may not use the partition",
    "DependencyNeverSatisfied": "it depends on a job that can no longer satisfy the dependency",
}
_NEVER_RE = re.compile(r"(?:QOS|Assoc)(?:Max|Min)\w*(?:PerJob|PerNode|PerTask)\w*|(?:QOS|Assoc)MaxWallDurationPerJobLimit")


def never_starts(info: dict) -> Optional[str]:
    """Why a PENDING job can never start, in plain words, with Slurm's reason; None if it may."""
    state, reason = info.get("state"), info.get("reason")
    if state != "PENDING" or not reason:
        return None
    if reason in _NODE_COUNT and not _more_nodes_than_any(info):
        return None  # the same reasons mean down or drained nodes too, which come back
    if reason in NEVER_STARTS:
        return f"{NEVER_STARTS[reason]} (Slurm's reason: {reason})"
    if _NEVER_RE.fullmatch(reason):
        return f"it asks for more than a per-job limit of its QOS or account allows (Slurm's reason: {reason})"
    return None


_NODE_COUNT = ("PartitionNodeLimit", "PartitionConfig")


def _more_nodes_than_any(info: dict) -> bool:
    """The job asks for more nodes than each of its partitions may ever give (node_room); False
    where that cannot be told."""
    m = re.match(r"\d+", str(info.get("num_nodes") or ""))
    names = str(info.get("partition") or "").split(",")
    if not m or not all(names):
        return False
    try:
        rooms = [_room(name) for name in names]
    except SlurmError:
        return False
    return all(r is not None and int(m.group(0)) > r for r in rooms)


@functools.lru_cache(maxsize=32)
def _room(name: str) -> Optional[int]:
    found = partition(name)
    return node_room(found)[0] if found else None


def reason_of(value: Optional[str]) -> Optional[str]:
    """Slurm's Reason field: None for its 'None' (and for nothing)."""
    return None if value in (None, "", "None", "(null)") else value


def ended(info: dict) -> bool:
    """A terminal state; a preempted job that Slurm will requeue is not over."""
    state = info.get("state", "UNKNOWN")
    return state in TERMINAL and not (state == "PREEMPTED" and info.get("requeue") == "1")


def job_info(job_id: str) -> Optional[dict]:
    """``scontrol show job`` of one job as a job info (_info); None if Slurm does not answer or
    no longer knows the job."""
    proc = _run(["scontrol", "show", "job", "--oneliner", job_id], timeout_ok=True)
    if proc is None or proc.returncode != 0:
        return None
    return _info(_fields(proc.stdout))


def _info(f: dict) -> dict:
    """A job's info, one shape whoever asked (scontrol here; sacct's has the same keys): state,
    exit_code, reason (None for Slurm's 'None'), restarts, requeue, work_dir, times, partition."""
    return {"state": f.get("JobState", "UNKNOWN"), "exit_code": f.get("ExitCode"), "reason": reason_of(f.get("Reason")),
            "restarts": f.get("Restarts", "0"), "requeue": f.get("Requeue"), "work_dir": f.get("WorkDir"),
            "start": f.get("StartTime"), "end": f.get("EndTime"), "submit": f.get("SubmitTime"), "source": "scontrol",
            "partition": f.get("Partition"), "num_nodes": f.get("NumNodes")}


def _fields(line: str) -> dict:
    """One `scontrol --oneliner` record: Key=Value tokens (the first of a repeated key wins)."""
    info = {}
    for tok in line.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            info.setdefault(k, v)
    return info


# ----------------------------------------------------------------------------- many runs at once
SACCT_FIELDS = "JobID,State,ExitCode,WorkDir,Start,End,Submit,Partition,NNodes,Reason"
_CHUNK = 300  # job ids per sacct call: bounded command lines, bounded calls


def _run(cmd: List[str], timeout_ok: bool = False) -> Optional[subprocess.CompletedProcess]:
    """A Slurm query; a missing command is an error, and so is a timeout unless the caller
    polls anyway (``timeout_ok``: then None)."""
    need(cmd[0])
    try:
        return subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found on PATH: run this on a Slurm login node") from None
    except subprocess.TimeoutExpired:
        if timeout_ok:
            return None
        raise SlurmError(f"{cmd[0]} did not answer within 60 s (is slurmctld up?)") from None


def _controller_jobs() -> dict:
    """Every job slurmctld still remembers (queued, running, recently ended): one call."""
    out = {}
    proc = _run(["scontrol", "show", "job", "--oneliner"])
    if proc.returncode != 0:  # not "no jobs": slurmctld did not answer; every state would be a guess
        why = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise SlurmError(f"could not ask Slurm for the jobs' states (scontrol: {why})")
    for line in proc.stdout.splitlines():
        info = _fields(line)
        if "JobId" in info:
            entry = _info(info)
            out[info["JobId"]] = entry
            # An array's task is also ARRAY_TASK; its pending tasks share one record (2-3%2).
            if info.get("ArrayJobId") and info.get("ArrayTaskId"):
                for task in array_tasks(info["ArrayTaskId"]):
                    out[f"{info['ArrayJobId']}_{task}"] = entry
    return out


def array_tasks(spec: str) -> List[int]:
    """Slurm's task-id list (`3`, `2-5%2`, `0,4-6`, `0-9:3`) as the task ids."""
    out: List[int] = []
    for part in spec.split("%")[0].strip("[]").split(","):
        lo, _, rest = part.partition("-")
        hi, _, step = rest.partition(":")
        if lo.isdigit() and (not hi or hi.isdigit()) and (not step or step.isdigit()):
            out += range(int(lo), int(hi or lo) + 1, int(step or 1) or 1)
    return out


def _accounting(job_ids: List[str]) -> dict:
    """Ended jobs from accounting (slurmdbd), else from the job-completion log (`sacct -c`):
    job id -> every record under that id (Slurm may have reused it)."""
    out: dict = {}
    for i in range(0, len(job_ids), _CHUNK):
        ids = ",".join(job_ids[i:i + _CHUNK])
        for source, extra in (("sacct", ["-X"]), ("jobcomp", ["-c"])):
            # -D: every record of a reused id, not only the newest
            proc = _run(["sacct", *extra, "-D", "-n", "-P", "-j", ids, "-o", SACCT_FIELDS])
            if proc.returncode == 0:
                break
        else:
            return out  # no accounting of any kind: the controller's memory is all there is
        for line in proc.stdout.splitlines():
            jid, state, code, work_dir, start, end, submit, part, nodes, why = (line.split("|") + [""] * 10)[:10]
            m = re.fullmatch(r"(\d+)(?:_(\d+|\[.+\]))?", jid)
            if not m:
                continue
            tasks = array_tasks(m.group(2)) if m.group(2) else []
            for key in [f"{m.group(1)}_{t}" for t in tasks] or [jid]:
                # _info's shape; sacct has no restart count or requeue flag: a requeued job's runs
                # are its records in order (-D), so this record's restarts are the ones before it
                before = sum(1 for r in out.get(key, []) if r["work_dir"] == work_dir)
                out.setdefault(key, []).append({
                    "state": state.split()[0] if state else "UNKNOWN", "exit_code": code, "reason": reason_of(why or None),
                    "restarts": str(before), "requeue": None, "work_dir": work_dir, "start": start, "end": end,
                    "submit": submit, "source": source, "partition": part or None, "num_nodes": nodes or None})
    return out


class Direct:
    """Slurm's two questions, asked each time; the backend's watcher asks each once a moment
    (backends/slurm.Watcher), so that `status` (the state, then the goodput line) asks once."""

    @staticmethod
    def controller() -> dict:
        return _controller_jobs()

    @staticmethod
    def accounting(job_ids: List[str]) -> dict:
        return _accounting(job_ids)


def _by_number(ids) -> List[str]:
    return sorted(set(ids), key=lambda i: [int(x) for x in i.split("_")])


def states(runs: List[dict], ask=Direct) -> dict:
    """Slurm's view of registered runs, keyed by run directory, in a bounded number of Slurm
    calls (one scontrol, then one sacct per 300 ended jobs). A job is matched by its working
    directory, the run's own directory, so a job id that Slurm reused for another job does not
    make an old run report the new job's state."""
    ctl = ask.controller()
    out, rest = {}, []
    for run in runs:
        info = ctl.get(run["job_id"])
        if _mine(run, info):
            out[run["run_dir"]] = info
        else:
            rest.append(run)
    if rest:
        acc = ask.accounting(_by_number(i for r in rest for i in _ids(r)))
        for run in rest:
            # The last record of this run's own; sacct lists a requeued job's runs in order.
            own = [info for i in _ids(run) for info in acc.get(i, []) if _mine(run, info)]
            out[run["run_dir"]] = own[-1] if own else {"state": "UNKNOWN", "source": "none"}
    return out


def _mine(run: dict, info: Optional[dict]) -> bool:
    """Is INFO (Slurm's record of the run's job id) this run's, not another job's under a reused id?"""
    if info is None:
        return False
    if info.get("work_dir"):  # Slurm records the physical path: compare those (a sweep's: its dir)
        return os.path.realpath(info["work_dir"]) == os.path.realpath(run.get("work_dir") or run.get("run_dir") or "")
    # No working directory on record (a job not yet started, in some accounting): its
    # submit time must fall while this run's sbatch ran.
    t = slurm_time(info.get("submit"))
    created, submitted = run.get("created"), run.get("submitted")
    return t is not None and created is not None and submitted is not None \
        and int(created) - 1 <= t <= submitted + 2


def allocations(run: dict, ask=Direct) -> List[dict]:
    """Each start of the run's job, in order (a requeued job's attempts): {start, end, nodes,
    submit} in epoch seconds, from accounting (every attempt that ended) and the controller (the
    one running now: its end is now). [] where Slurm keeps no record of it. Accounting is not
    asked when the controller knows the job's only attempt."""
    out = []
    now = ask.controller().get(run["job_id"])
    first = _mine(run, now) and str(now.get("restarts")) == "0"
    ids = [] if first else _by_number(_ids(run))
    acc = ask.accounting(ids) if ids else {}
    for i in ids:
        for info in acc.get(i, []):
            start, end = slurm_time(info.get("start")), slurm_time(info.get("end"))
            if _mine(run, info) and start and end and end >= start:
                out.append({"start": start, "end": end, "nodes": int(info.get("num_nodes") or 0) or None,
                            "submit": slurm_time(info.get("submit"))})
    start = slurm_time(now.get("start")) if now and _mine(run, now) and now["state"] != "PENDING" else None
    if start and not any(abs(a["start"] - start) < 1 for a in out):
        end = slurm_time(now.get("end")) if ended(now) else time.time()
        out.append({"start": start, "end": max(end or time.time(), start),
                    "nodes": int(now.get("num_nodes") or 0) or None, "submit": slurm_time(now.get("submit"))})
    return sorted(out, key=lambda a: a["start"])


def _ids(run: dict) -> List[str]:
    """The ids accounting may know a run by: an array task's ARRAY_i, and its own job id (the
    job-completion log knows only that one; the job wrote it in its phase markers)."""
    ids = [run["job_id"]]
    if "_" in run["job_id"]:
        phases = RunPaths(Path(run["run_dir"])).read_phases()
        own = str(phases[-1].get("job", "")) if phases else ""
        if own.isdigit():
            ids.append(own)
    return ids


def slurm_time(text: Optional[str]) -> Optional[float]:
    """A Slurm timestamp (local time, 2026-11-29T12:00:00) as epoch seconds; None if unset."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return None


def cancel(job_id: str) -> None:
    proc = _run(["scancel", job_id])
    if proc.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {proc.stderr.strip()}")


def partition(name: Optional[str]) -> Optional[dict]:
    """``scontrol show partition`` of NAME (None: the cluster's default partition) as a dict
    (PartitionName, TotalNodes, MaxNodes, MaxTime, DefaultTime, ...); None where Slurm
    knows no such partition; SlurmError where Slurm does not answer."""
    if name is not None and (not name or name.startswith("-")):  # never an option of scontrol's
        return None
    proc = _run(["scontrol", "show", "partition", "--oneliner"] + ([name] if name else []))
    if proc.returncode != 0:
        said = " ".join((proc.stderr + proc.stdout).split())
        if "not found" in said:
            return None
        raise SlurmError(f"scontrol show partition: {said[-300:] or f'exit code {proc.returncode}'}")
    for line in proc.stdout.splitlines():
        info = _fields(line)
        if info.get("PartitionName") == name if name else info.get("Default") == "YES":
            return info
    return None


def node_room(part: dict) -> Tuple[Optional[int], str]:
    """The most nodes a job may get in partition PART (scontrol's fields), and how it says so;
    (None, "") where it does not say."""
    total = int(part["TotalNodes"]) if str(part.get("TotalNodes", "")).isdigit() else None
    cap = int(part["MaxNodes"]) if str(part.get("MaxNodes", "")).isdigit() else None
    if cap is not None and (total is None or cap < total):
        return cap, f"allows {cap} node(s) a job (MaxNodes)"
    return total, (f"has {total} node(s)" if total is not None else "")


def test_only(script: str) -> Tuple[bool, str]:
    """``sbatch --test-only`` on a job script's text (its directives; nothing is queued):
    (True, when Slurm would start it) or (False, Slurm's refusal)."""
    need("sbatch")
    with tempfile.TemporaryDirectory(prefix="verl-launch-test-only-") as cwd:
        try:
            proc = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True,
                                  cwd=cwd, timeout=60)
        except subprocess.TimeoutExpired:
            raise SlurmError("sbatch --test-only did not answer within 60 s (is slurmctld up?)") from None
    said = " ".join((proc.stderr + proc.stdout).split())
    m = re.search(r"to start at (\S+)", said)
    if proc.returncode == 0 and m:
        return True, m.group(1)
    return False, re.sub(r"^sbatch: (error: )?", "", said) or f"exit code {proc.returncode}"
