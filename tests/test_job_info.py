"""One shape of job info, whoever asked Slurm: one job's `scontrol show job` (Run.wait, logs -f)
and the batched states (status, list, SweepRun.wait) give the same keys, which never_starts,
ended and the wait's state text read. The lines are scontrol's own --oneliner output and sacct's
-P output (tests/test_jobs.py asserts the same shape from the sandbox's own Slurm, accounting
included)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launcher.backends import slurm_commands as slurm
from launcher.backends.slurm import _state_text
from launcher.core.paths import RunPaths

PENDING = ("JobId=12 JobName=big UserId=root(0) JobState=PENDING Reason=PartitionNodeLimit Dependency=(null) "
           "Requeue=1 Restarts=0 ExitCode=0:0 SubmitTime=2026-12-05T10:00:00 StartTime=Unknown EndTime=Unknown "
           "Partition=debug NumNodes=99 WorkDir=/tmp/run")
REQUEUED = ("JobId=13 JobName=r JobState=RUNNING Reason=None Requeue=1 Restarts=2 ExitCode=0:0 "
            "SubmitTime=2026-12-05T10:00:00 StartTime=2026-12-05T10:01:00 EndTime=Unknown Partition=debug NumNodes=2")
PREEMPTED = "JobId=14 JobState=PREEMPTED Reason=None Requeue=1 Restarts=0 ExitCode=0:15 Partition=debug NumNodes=1"


def test_one_jobs_info_and_the_batched_states_share_one_shape(monkeypatch, tmp_path):
    infos = [slurm._info(slurm._fields(line)) for line in (PENDING, REQUEUED, PREEMPTED)]
    assert {k for i in infos for k in i} == set(infos[0]) >= {"state", "exit_code", "reason", "restarts", "requeue"}
    pending, running, preempted = infos
    assert (pending["state"], pending["reason"], running["reason"]) == ("PENDING", "PartitionNodeLimit", None)
    monkeypatch.setattr(slurm, "_more_nodes_than_any", lambda info: int(info["num_nodes"]) > 4)  # no sinfo here
    assert "PartitionNodeLimit" in slurm.never_starts(pending)
    assert slurm.never_starts(dict(pending, num_nodes="2")) is None  # down nodes come back
    assert slurm.never_starts(running) is None
    assert not slurm.ended(preempted) and slurm.ended(dict(preempted, requeue="0"))  # Slurm requeues it itself
    paths = RunPaths(Path(tmp_path))
    assert _state_text(running, paths) == "RUNNING [restart 2]"
    assert _state_text(pending, paths) == "PENDING (PartitionNodeLimit)"


# sacct -D -n -P -o JobID,State,ExitCode,WorkDir,Start,End,Submit,Partition,NNodes,Reason: job 15
# ran, was requeued, ran again (two records under one id); 16 is an array's tasks 1-2.
SACCT = ("15|REQUEUED|0:0|/tmp/run15|2026-12-05T10:01:00|2026-12-05T10:02:00|2026-12-05T10:00:00|debug|2|None\n"
         "15|COMPLETED|0:0|/tmp/run15|2026-12-05T10:03:00|2026-12-05T10:04:00|2026-12-05T10:00:00|debug|2|None\n"
         "16_[1-2]|PENDING|0:0|/tmp/sweep|Unknown|Unknown|2026-12-05T10:00:00|debug|1|Priority\n")


def test_the_batched_paths_give_the_one_jobs_shape(monkeypatch):
    """scontrol for every job (_controller_jobs) and accounting (_accounting) build the same keys
    as one job's scontrol, with a requeued job's restarts counted from its records."""
    def run(cmd, timeout_ok=False):
        out = "\n".join((PENDING, REQUEUED, PREEMPTED)) if cmd[0] == "scontrol" else SACCT
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(slurm, "_run", run)
    one = slurm._info(slurm._fields(PENDING))
    ctl = slurm._controller_jobs()
    acc = slurm._accounting(["15", "16"])
    infos = [*ctl.values(), *(i for records in acc.values() for i in records)]
    assert len(infos) == 3 + 2 + 2 and all(set(i) == set(one) for i in infos), [set(i) ^ set(one) for i in infos]
    assert [(i["state"], i["restarts"], i["num_nodes"], i["partition"]) for i in acc["15"]] == \
        [("REQUEUED", "0", "2", "debug"), ("COMPLETED", "1", "2", "debug")]
    assert acc["16_2"][0]["reason"] == "Priority" and acc["15"][0]["reason"] is None
    assert ctl["13"]["restarts"] == "2" and ctl["12"]["reason"] == "PartitionNodeLimit"


def test_the_watcher_forgets_what_it_kept_once_a_job_is_submitted_or_cancelled(monkeypatch):
    """The watcher keeps one controller list a second for every question (status's state and its
    goodput line). A list kept from before an sbatch lacks the new job: its state read UNKNOWN
    where the job was PENDING (test_api's held job, CI)."""
    from types import SimpleNamespace

    from launcher.backends import slurm as backend

    queue = [PENDING]
    monkeypatch.setattr(slurm, "_run", lambda cmd, timeout_ok=False: subprocess.CompletedProcess(
        cmd, 0, "\n".join(queue), ""))
    monkeypatch.setattr(slurm, "sbatch", lambda command, cwd, environ=None: queue.append(REQUEUED) or "13")
    monkeypatch.setattr(slurm, "cancel", lambda job_id: queue.pop())
    watcher = backend.Watcher(min_interval=3600)
    monkeypatch.setattr(backend, "WATCHER", watcher)
    assert set(watcher.controller()) == {"12"}
    assert set(watcher.controller()) == {"12"}  # kept: asked once
    job = backend.SlurmBackend()._sbatch(SimpleNamespace(command=["sbatch"], directory=Path("/")), {})
    assert job == "13" and set(watcher.controller()) == {"12", "13"}
    backend.SlurmBackend().cancel({"job_id": "13"})
    assert set(watcher.controller()) == {"12"}
