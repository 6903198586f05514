"""The job toolkit on the real sandbox: list, status, logs -f, cancel, submit --wait; bounded
Slurm queries for many runs; a job id reused by Slurm does not leak into an old run."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json


@pytest.fixture
def env(sandbox, clean_env, tmp_path):
    return sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))


def _submit(cli, env, tmp_path, *overrides):
    return submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "wandb.entity=team", *overrides, "--json", env=env))


@pytest.mark.sandbox_shared
def test_list_status_logs_and_cancel(cli, sandbox, env, tmp_path):
    a = _submit(cli, env, tmp_path)
    # as a person submits: the plain output names the job and the commands to follow it
    plain = cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                f"paths.runs={tmp_path / 'runs'}", "verl.overrides.demo.hold=300", "job.name=long-one", env=env)
    assert plain.returncode == 0, plain.stderr
    b = {"job_id": re.search(r"^Submitted batch job (\d+)$", plain.stdout, re.M).group(1),
         "run_dir": re.search(r"^  run dir  (\S+)$", plain.stdout, re.M).group(1)}
    assert f"Follow it: verl-launch logs -f {b['job_id']}" in plain.stdout, plain.stdout
    follow = cli("logs", a["job_id"], "-f", env=env, timeout=180)  # returns when the job ends
    assert follow.returncode == 0 and "phase driver-end (rc=0)" in follow.stdout
    st = json.loads(cli("status", a["job_id"], "--json", env=env).stdout)
    assert st["state"] == "COMPLETED" and st["exit_code"] == "0:0" and st["phase"] == "teardown"
    assert st["links"]["traces"] == "https://wandb.ai/team/verl-launch-demo/weave/traces"
    # one status asks Slurm once: its state and the goodput line share one scontrol (the job's only
    # attempt, which the controller still knows: accounting is not asked); b is still running
    counted, calls = _counting_path(tmp_path, env)
    for job in (a["job_id"], b["job_id"]):
        calls.write_text("")
        shown = cli("status", job, env=counted)
        assert shown.returncode == 0 and "goodput    not known" not in shown.stdout, shown.stdout
        assert job == b["job_id"] or re.search(r"^goodput +\d+% of [\d,]+ node-s allocated", shown.stdout, re.M), \
            shown.stdout
        assert calls.read_text().split() == ["scontrol"], (job, calls.read_text())
    assert json.loads(cli("status", a["run_dir"], "--json", env=env).stdout)["job_id"] == a["job_id"]
    driver = cli("logs", a["job_id"], "--driver", env=env)
    assert "verl-launch sandbox demo" in driver.stdout
    # the other node's own log: its own address (Slurm's NodeAddr for it)
    nodes = sandbox.nodes(a["job_id"])  # the head first: another test's job may hold node1
    addr = re.search(r"\bNodeAddr=(\S+)", sandbox.run("scontrol", "show", "node", nodes[1]).stdout).group(1)
    assert addr.startswith("169.254.77.") and addr in cli("logs", a["job_id"], "--node", nodes[1], env=env).stdout
    typo = cli("logs", a["job_id"], "--node", "node9", env=env)  # not the head's log: an error
    assert typo.returncode == 2 and f"ran on {', '.join(nodes)}" in typo.stderr and not typo.stdout, typo.stderr
    rows = json.loads(cli("list", "--json", env=env).stdout)
    assert [r["job_id"] for r in rows] == [b["job_id"], a["job_id"]]
    assert rows[0]["name"] == "long-one" and rows[0]["state"] in ("PENDING", "RUNNING")
    table = cli("list", env=env).stdout
    assert a["job_id"] in table and "COMPLETED" in table
    cancel = cli("cancel", b["job_id"], env=env, timeout=180)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout
    assert json.loads(Path(b["run_dir"], "run.json").read_text())["final_state"] == "CANCELLED"
    assert json.loads(cli("status", b["job_id"], "--json", env=env).stdout)["state"] == "CANCELLED"
    unknown = cli("status", "999999", env=env)
    assert unknown.returncode == 2 and "no run" in unknown.stderr


@pytest.mark.sandbox_shared
def test_submit_wait_reports_the_end_and_exit_code(cli, sandbox, env, tmp_path):
    proc = cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
               f"paths.runs={tmp_path / 'runs'}", "verl.overrides.demo.exit_code=4", "--wait", env=env, timeout=240)
    assert proc.returncode == 1
    assert "RUNNING" in proc.stdout and "FAILED exit code 4:0" in proc.stdout


def _counting_path(tmp_path: Path, env: dict) -> tuple[dict, Path]:
    """Wrappers that log each call of Slurm's query commands, then run the real one."""
    bindir, log = tmp_path / "count-bin", tmp_path / "calls.log"
    bindir.mkdir()
    for cmd in ("scontrol", "sacct", "squeue"):
        real = next(Path(d, cmd) for d in env["PATH"].split(os.pathsep) if Path(d, cmd).is_file())
        w = bindir / cmd
        w.write_text(f'#!/bin/sh\necho {cmd} >> "{log}"\nexec "{real}" "$@"\n')
        w.chmod(w.stat().st_mode | stat.S_IXUSR)
    return dict(env, PATH=f"{bindir}{os.pathsep}{env['PATH']}"), log


@pytest.mark.accounting  # Slurm's controller no longer knows the job: sacct answers
def test_status_of_200_runs_takes_a_bounded_number_of_queries(cli, sandbox, env, tmp_path):
    real = _submit(cli, env, tmp_path)
    sandbox.wait(real["job_id"])
    state = Path(env["VERL_LAUNCH_STATE"])
    with open(state / "runs.jsonl", "a") as f:
        for i in range(199):  # runs whose jobs Slurm has long forgotten, and one it knows
            f.write(json.dumps({"job_id": str(500000 + i), "run_dir": str(tmp_path / f"old{i}"),
                                "job_name": "old"}) + "\n")
    counted, log = _counting_path(tmp_path, env)
    rows = json.loads(cli("list", "-n", "200", "--json", env=counted).stdout)
    assert len(rows) == 200
    assert {r["job_id"]: r["state"] for r in rows}[real["job_id"]] == "COMPLETED"
    calls = log.read_text().split()
    assert len(calls) <= 3, calls  # one scontrol, one sacct (and its job-completion fallback)


@pytest.mark.sandbox_shared
@pytest.mark.accounting  # the older run's job is not the controller's: sacct answers
@pytest.mark.jobcomp  # and without slurmdbd, Slurm's job-completion log (sacct -c)
def test_reused_job_id_does_not_report_another_jobs_state(cli, sandbox, env, tmp_path, monkeypatch):
    """Slurm restarts its ids when its state is wiped; a run must match its own job (by its run
    directory), never whatever job now holds the id. And one job's info has one shape whoever
    answered: scontrol for the one job, scontrol for all, and accounting (sacct with slurmdbd, the
    job-completion log without)."""
    from launcher.backends import slurm_commands as slurm

    real = _submit(cli, env, tmp_path)
    sandbox.wait(real["job_id"])
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    one, every = slurm.job_info(real["job_id"]), slurm._controller_jobs()[real["job_id"]]
    [acc] = [a for a in slurm._accounting([real["job_id"]])[real["job_id"]]  # the id's other jobs' too
             if os.path.realpath(a["work_dir"]) == os.path.realpath(real["run_dir"])]
    assert set(one) == set(every) == set(acc), (one, every, acc)
    assert (acc["state"], acc["restarts"], acc["num_nodes"], acc["partition"]) == \
        ("COMPLETED", "0", one["num_nodes"], one["partition"]), (acc, one)
    with open(Path(env["VERL_LAUNCH_STATE"]) / "runs.jsonl", "a") as f:
        f.write(json.dumps({"job_id": real["job_id"], "run_dir": str(tmp_path / "an-older-run"),
                            "job_name": "older"}) + "\n")
    st = json.loads(cli("status", str(tmp_path / "an-older-run"), "--json", env=env).stdout)
    assert st["state"] == "UNKNOWN"
    assert json.loads(cli("status", real["run_dir"], "--json", env=env).stdout)["state"] == "COMPLETED"


@pytest.mark.accounting  # Slurm's controller no longer knows the job: sacct answers
def test_job_id_reused_after_controller_state_loss(cli, sandbox, env, tmp_path):
    """The controller loses its state and hands out job 1 again: each run keeps its own state."""
    sandbox.reset_controller()
    old = _submit(cli, env, tmp_path)
    sandbox.wait(old["job_id"])
    sandbox.reset_controller()
    new = _submit(cli, env, tmp_path, "verl.overrides.demo.hold=300", "job.name=after-reset")
    try:
        assert new["job_id"] == old["job_id"] == "1"
        deadline = time.monotonic() + 60
        while sandbox.job_field(new["job_id"], "JobState") != "RUNNING":
            assert time.monotonic() < deadline, "the new job did not start"
            time.sleep(0.5)
        states = {r["run_dir"]: r["state"] for r in json.loads(cli("list", "--json", env=env).stdout)}
        assert states[new["run_dir"]] == "RUNNING"
        # The old run's own record (job-completion log or slurmdbd), not the new job's state.
        assert states[old["run_dir"]] == "COMPLETED"
        assert json.loads(cli("status", old["run_dir"], "--json", env=env).stdout)["state"] == "COMPLETED"
    finally:
        sandbox.run("scancel", new["job_id"])
        sandbox.wait(new["job_id"])
