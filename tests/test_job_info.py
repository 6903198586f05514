"""One shape of job info, whoever asked Slurm: one job's `scontrol show job` (Run.wait, logs -f)
and the batched states (status, list, SweepRun.wait) give the same keys, which never_starts,
ended and the wait's state text read. The lines are scontrol's own --oneliner output."""

from __future__ import annotations

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
