"""A bad node costs one restart, not the run (issue 16), on the real sandbox (4 nodes): a
failure put down to a node makes the job requeue itself without that node and resume; a
failure that is not a node's (the driver's own error) does not requeue; and a job whose
partition has no other node to give fails, saying so."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from sandbox_procs import raylet_of

# Not again with slurmdbd (the `accounting` pass): exclusion reads the job from scontrol, not
# accounting, and the requeue with slurmdbd is test_requeue's; once keeps `make test` < 45 min.


def _submit(cli, sandbox, env, tmp_path, *overrides) -> dict:
    return submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "cluster.requeue=true", *overrides, "--json",
                           env=sandbox.env(env)))


def _phases(run_dir) -> list:
    try:
        return [json.loads(x) for x in Path(run_dir, "phases.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def _until(cond, what: str, timeout: float = 240, release=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if release:
            release()
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def env(clean_env, tmp_path):
    return dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state"))


def _kill_worker_raylet(sandbox, info) -> float:
    job, run_dir = info["job_id"], info["run_dir"]
    _until(lambda: Path(run_dir, "demo-report.r0.json").exists(), "the first run's driver")
    pid = raylet_of(job, "node2")
    assert pid, f"no raylet of job {job} on node2"
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def test_a_killed_worker_node_is_excluded_and_the_job_resumes_elsewhere(cli, sandbox, env, tmp_path):
    info = _submit(cli, sandbox, env, tmp_path, "+verl.overrides.demo.hold_first=600")
    job, run_dir = info["job_id"], info["run_dir"]
    try:
        _kill_worker_raylet(sandbox, info)
        _until(lambda: sandbox.job_field(job, "JobState") == "COMPLETED", "the restarted run to complete",
               release=lambda: sandbox.release_requeued(job))
    finally:
        sandbox.run("scancel", job)
    phases = _phases(run_dir)
    names = [(p["phase"], p["restart"]) for p in phases]
    bad = [p["detail"] for p in phases if p["phase"] == "bad-node"]
    assert bad == ["node2: ray-lost: its Ray ended during the run (raylet [exit code=-9])"], phases
    assert names.index(("ray-lost", 0)) < names.index(("bad-node", 0)) < names.index(("teardown", 0)) \
        < names.index(("requeue", 0)) < names.index(("exclude", 0)) < names.index(("restart", 1))
    assert [p["detail"] for p in phases if p["phase"] == "exclude"] == ["node2"]
    assert sandbox.job_field(job, "ExcNodeList") == "node2"
    first = json.loads(Path(run_dir, "demo-report.r0.json").read_text())
    second = json.loads(Path(run_dir, "demo-report.r1.json").read_text())
    assert [n["hostname"] for n in first["nodes"]] == ["node1", "node2"]
    hosts = [n["hostname"] for n in second["nodes"]]
    assert len(hosts) == 2 and "node2" not in hosts, hosts  # two other nodes, never the failed one
    assert second["overrides"]["trainer.resume_mode"] == "auto"  # resumes from its checkpoint
    assert second["driver"]["WANDB_RUN_ID"] == first["driver"]["WANDB_RUN_ID"]  # one W&B run
    st = json.loads(cli("status", job, "--json", env=sandbox.env(env)).stdout)
    assert st["state"] == "COMPLETED" and st["restart"] == 1
    assert st["bad_nodes"] == [{"restart": 0, "node": "node2", "why": bad[0].split(": ", 1)[1]}]
    text = cli("status", job, env=sandbox.env(env)).stdout
    assert "bad node   node2 (run 0): ray-lost: its Ray ended during the run" in text
    listed = cli("list", env=sandbox.env(env)).stdout
    assert any(line.split()[0] == job and "COMPLETED r1" in line for line in listed.splitlines()), listed


@pytest.mark.sandbox_shared
def test_the_drivers_own_error_is_not_requeued(cli, sandbox, env, tmp_path):
    info = _submit(cli, sandbox, env, tmp_path, "+verl.overrides.demo.exit_code=3")
    assert sandbox.wait(info["job_id"]) == "FAILED"
    phases = [p["phase"] for p in _phases(info["run_dir"])]
    assert "bad-node" not in phases and "requeue" not in phases, phases
    assert sandbox.job_field(info["job_id"], "Restarts") == "0"
    assert sandbox.job_field(info["job_id"], "ExitCode") == "3:0"


def test_no_node_left_to_exclude_fails_saying_so(cli, sandbox, env, tmp_path):
    info = _submit(cli, sandbox, env, tmp_path, "+verl.overrides.demo.hold_first=600",
                   "cluster.sbatch_args=['--exclude=node3,node4']")
    try:
        _kill_worker_raylet(sandbox, info)
        assert sandbox.wait(info["job_id"], timeout=120) == "FAILED"
    finally:
        sandbox.run("scancel", info["job_id"])
    phases = _phases(info["run_dir"])
    assert [p["phase"] for p in phases if p["phase"] in ("requeue", "exclude")] == []
    errors = [p["detail"] for p in phases if p["phase"] == "error"]
    assert errors == ["not requeued: excluding node3 node4 node2 leaves 1 node(s) of partition debug for this "
                      "2-node job"], phases
    assert sandbox.job_field(info["job_id"], "Restarts") == "0"
    st = json.loads(cli("status", info["job_id"], "--json", env=sandbox.env(env)).stdout)
    assert st["stopped"].startswith("error: not requeued: excluding node3 node4 node2")
