"""The sandbox's job processes, found by their environment (never by name alone): shared by the
tests and the benches (bench/ puts tests/ on its path)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional


def raylets_of(job_id: str, node: str) -> list:
    """The PIDs of job JOB_ID's raylets on sandbox node NODE."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()}
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().strip() == "raylet" \
                    and want <= set((p / "environ").read_bytes().split(b"\0")):
                found.append(int(p.name))
        except OSError:
            continue
    return found


def raylet_of(job_id: str, node: str) -> Optional[int]:
    """The PID of job JOB_ID's raylet on sandbox node NODE, or None."""
    return next(iter(raylets_of(job_id, node)), None)


def job_processes(job_id: str, var: str = "SLURM_JOB_ID") -> list:
    """Live processes started for this job (found by SLURM_JOB_ID in their environment; a job
    array's, all its tasks': var="SLURM_ARRAY_JOB_ID")."""
    found = []
    marker = f"{var}={job_id}".encode()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] in "ZX":
                continue
            if marker in (p / "environ").read_bytes().split(b"\0"):
                found.append((int(p.name), (p / "comm").read_text().strip()))
        except OSError:
            continue
    return found


class RequeueHold:
    """Releases a requeued job from Slurm's begin-time hold (about 2 minutes), but not at once:
    slurmd refuses a credential issued in the same second it revoked the job's last one, and
    Slurm then kills the job outright ("Job credential revoked"), which is what the hold is for.
    RUN runs a Slurm command and returns its stdout. Call it in a polling loop."""

    def __init__(self, run: Callable[..., str], settle: float = 3.0):
        self.run, self.settle, self.pending_since = run, settle, {}

    def __call__(self, job_id: str) -> None:
        fields = dict(tok.split("=", 1) for tok in self.run("scontrol", "show", "job", "-o", job_id).split()
                      if "=" in tok)
        if fields.get("JobState") != "PENDING":
            self.pending_since.pop(job_id, None)
            return
        since = self.pending_since.setdefault(job_id, time.monotonic())
        if time.monotonic() - since >= self.settle:
            self.run("scontrol", "update", f"jobid={job_id}", "StartTime=now")
