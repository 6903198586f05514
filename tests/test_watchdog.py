"""The watchdog's verdicts beyond Ray's placement (see test_verl_job.py for those): a trainer that
waits on something that will never come ends the job, on the real sandbox with the demo driver
(verl's own console logger prints its steps). A stalled run (no training step for
cluster.stall_timeout, counted from the first step only), and a dead Ray actor the driver holds
(Ray's actor table: WORKER_DIED). A dead vLLM engine under verl's own trainer is in
test_dead_engine.py. Bad values of cluster.stall_timeout are refused before anything is written."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from sandbox_procs import job_processes


def _submit(cli, sandbox, clean_env, tmp_path, *overrides) -> tuple:
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    info = submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", *overrides, "--json", env=env))
    return info, env


def _phases(info) -> list:
    p = Path(info["run_dir"], "phases.jsonl")
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _ended(sandbox, info, timeout=180) -> tuple:
    state = sandbox.wait(info["job_id"], timeout=timeout)
    out = Path(info["stdout"]).read_text()
    return state, out


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan", "true"])
def test_a_stall_timeout_that_is_not_positive_seconds_is_refused(cli, clean_env, tmp_path, value):
    proc = cli("check", RECIPES / "sandbox-demo.yaml", f"cluster.stall_timeout={value}", env=clean_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cluster.stall_timeout" in proc.stderr and "'auto'" in proc.stderr and "'off'" in proc.stderr
    assert "command line" in proc.stderr


@pytest.mark.parametrize("value, script", [("auto", "auto"), ("off", "off"), ("90", "90"), ("2.5", "2.5")])
def test_stall_timeout_reaches_the_watchdog(cli, clean_env, value, script):
    proc = cli("render", RECIPES / "sandbox-demo.yaml", f"cluster.stall_timeout={value}", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert f'"$LOG_DIR/lost-nodes.r$RESTART.txt" \\\n  {script} "$ENGINE_FILE" "$LOG_DIR/steps.r$RESTART.jsonl" \\\n  20 <<' in proc.stdout


@pytest.mark.parametrize("value, ok", [("0", True), ("7", True), ("-1", False), ("soon", False), ("2.5", False)])
def test_death_grace_reaches_the_watchdog_or_is_refused(cli, clean_env, value, ok):
    proc = cli("render", RECIPES / "sandbox-demo.yaml", f"cluster.death_grace={value}", env=clean_env)
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert f'"$LOG_DIR/steps.r$RESTART.jsonl" \\\n  {value} <<' in proc.stdout
    else:
        assert proc.returncode == 2 and "cluster.death_grace" in proc.stderr, proc.stdout + proc.stderr
        assert proc.stdout == ""


def test_a_run_with_no_new_step_for_stall_timeout_ends_and_a_slow_start_does_not(cli, sandbox, clean_env, tmp_path):
    # 20 s before the first step (a slow start) with a 10 s stall_timeout: not a stall. Then 3
    # steps, and a driver that holds: the stall, 10 s after step 3.
    info, env = _submit(cli, sandbox, clean_env, tmp_path, "cluster.stall_timeout=10", "+verl.overrides.demo.warmup=20",
                        "+verl.overrides.demo.train_steps=3", "verl.overrides.demo.hold=600")
    state, out = _ended(sandbox, info)
    assert state == "FAILED", out[-3000:]
    hang = [p for p in _phases(info) if p["phase"] == "hang"]
    assert len(hang) == 1, out[-3000:]
    assert hang[0]["detail"].startswith("no training step for 1"), hang  # 10-13 s
    assert "after step 3 (cluster.stall_timeout=10: 10 s)" in hang[0]["detail"]
    log = Path(info["run_dir"], "logs", "driver.r0.log").read_text()
    assert "step:3 " in log and "holding for 600 s" in log
    start = next(p["time"] for p in _phases(info) if p["phase"] == "driver-start")
    assert hang[0]["time"] - start >= 20 + 3 + 10 - 1  # not before the first step, nor sooner after the last
    assert hang[0]["time"] - start < 20 + 3 + 10 + 30
    assert not any(p["phase"] == "bad-node" for p in _phases(info))  # a stall blames no node
    assert job_processes(info["job_id"]) == []
    st = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    assert st["stopped"].startswith("hang: no training step for")


def test_an_actor_the_driver_holds_dying_ends_the_job_naming_it(cli, sandbox, clean_env, tmp_path):
    info, env = _submit(cli, sandbox, clean_env, tmp_path, "+verl.overrides.demo.actor_dies=true",
                        "verl.overrides.demo.hold=600", "cluster.death_grace=3")
    state, out = _ended(sandbox, info)
    assert state == "FAILED", out[-3000:]
    err = [p for p in _phases(info) if p["phase"] == "driver-error"]
    assert len(err) == 1, out[-3000:]
    assert err[0]["detail"].startswith("Ray actor Doomed on node2 died (WORKER_DIED: "), err
    killed = next(ln for ln in Path(info["run_dir"], "logs", "driver.r0.log").read_text().splitlines()
                  if "(demo.actor_dies)" in ln)
    assert "169.254.77.12" in killed  # on node2, as the verdict says
    # 3 s of grace (cluster.death_grace) for the driver to fail on its own, then the job ends (not at hold's 600 s).
    killed_at = next(p["time"] for p in _phases(info) if p["phase"] == "driver-start")
    assert err[0]["time"] - killed_at < 90
    assert job_processes(info["job_id"]) == []
    names = [p["phase"] for p in _phases(info)]
    assert "bad-node" not in names  # no node evidence
    # the cause, first of all deaths, in the words its log kept: none, for a SIGKILL (issue 65)
    first = [p["detail"] for p in _phases(info) if p["phase"] == "first-death"]
    assert len(first) == 1 and first[0].startswith("Ray actor Doomed on node2 (pid ") and \
        "died first: no last words in its log: killed from outside, as by SIGKILL" in first[0], first


def test_a_death_with_gpu_hardware_words_blames_the_node_and_requeues_without_it(cli, sandbox, clean_env, tmp_path):
    """The dead actor's node said a GPU hardware error (an Xid) first: the evidence points at the
    node, so with cluster.requeue the job requeues itself without it, as for bad nodes."""
    info, env = _submit(cli, sandbox, clean_env, tmp_path, "cluster.requeue=true", "cluster.death_grace=3",
                        "+verl.overrides.demo.actor_dies=true",
                        "+verl.overrides.demo.actor_says='NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.'",
                        "verl.overrides.demo.hold_first=600")
    try:
        deadline = time.monotonic() + 180
        # "exclude" is the phase written once Slurm took the ExcNodeList, after "requeue".
        while not any(p["phase"] == "exclude" for p in _phases(info)) and time.monotonic() < deadline:
            time.sleep(1)
        names = {p["phase"]: p for p in _phases(info)}
        assert "requeue" in names and "exclude" in names, Path(info["stdout"]).read_text()[-3000:]
        assert names["exclude"]["detail"] == "node2"
        assert names["driver-error"]["detail"].startswith("Ray actor Doomed on node2 died (WORKER_DIED")
        assert names["bad-node"]["detail"].startswith("node2: driver-error: Ray actor Doomed on node2 died")
        assert sandbox.job_field(info["job_id"], "ExcNodeList") == "node2"
    finally:
        sandbox.run("scancel", info["job_id"])
        sandbox.wait(info["job_id"])
