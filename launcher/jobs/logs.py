"""A run's logs: which file `logs` means (the batch output, the driver's, a node's Ray log; the
names come from paths.py), and following one until the job ends (its backend says when)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from ..errors import RecipeError, SlurmError
from ..core.paths import RunPaths


def log_file(run: dict, driver: bool = False, node: Optional[str] = None) -> Path:
    """The file asked for; SlurmError where the job has not written it yet (a driver's or a
    node's log: the restart's number is in its name)."""
    p = RunPaths(Path(run["run_dir"]))
    if not (driver or node):
        return p.stdout(run["job_id"])
    if driver:
        pattern = p.glob(p.DRIVER_LOG)
    elif _nodes(p) and node not in _nodes(p):  # a typo would print the head's log
        raise RecipeError(f"--node {node}: run {run['job_id']} ran on {', '.join(sorted(_nodes(p)))}",
                          where="command line")
    elif _head(p) == node:  # the head: its Ray's log (it has no worker log)
        pattern = p.glob(p.HEAD_LOG)
    else:  # not the head's log in its place, before the node's is written: -f waits for it
        pattern = p.glob(p.WORKER_LOG, node=node)
    logs = sorted(p.logs.glob(pattern), key=lambda f: f.stat().st_mtime)
    if not logs:
        raise SlurmError(f"no log matching {p.logs / pattern} (yet)")
    return logs[-1]


def wanted(run: dict, driver: bool, node: Optional[str]) -> str:
    """The log -f waits for, before it exists (its restart number is not known yet)."""
    p = RunPaths(Path(run["run_dir"]))
    return str(p.logs / (p.glob(p.DRIVER_LOG) if driver else
                         f"{p.glob(p.WORKER_LOG, node=node)} (or {p.glob(p.HEAD_LOG)})"))


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


def follow(run: dict, backend, driver: bool = False, node: Optional[str] = None,
           note: Callable[[str], None] = lambda text: None, every: float = 5.0) -> Iterator[str]:
    """The log's text as it grows, until the job has ended and all of it was read (BACKEND:
    the run's, asked once every EVERY seconds); NOTE(text) once while the log does not exist
    yet. SlurmError if the job ends without writing it."""
    try:
        path: Optional[Path] = log_file(run, driver, node)
    except SlurmError:  # before the job wrote one: wait for it
        path = None
    pos, last_check, noted = 0, 0.0, False
    while True:
        if path is None:
            try:
                path = log_file(run, driver, node)
            except SlurmError:
                pass
        if path is not None and path.exists():
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            pos += len(chunk)
            if chunk:
                yield chunk.decode(errors="replace")
        if time.monotonic() - last_check >= every:  # one Slurm query every EVERY s, not every read
            last_check = time.monotonic()
            ended, state = backend.ended(run)
            if ended and path is not None and path.exists() and path.stat().st_size == pos:
                return
            if ended:  # it never wrote what was asked for
                raise SlurmError(f"job {run['job_id']} ended ({state}) without writing {path or wanted(run, driver, node)}")
            if not noted and (path is None or not path.exists()):
                note(f"waiting for {path or wanted(run, driver, node)} (job {run['job_id']} {state}; Ctrl-C to stop)")
                noted = True
        time.sleep(1)
