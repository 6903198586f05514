"""Sweeps on the real Slurm sandbox: one job array, at most --max-parallel points at once, each
point with its own values, experiment, W&B run id, checkpoint dir and Ray ports, one W&B group;
status, list, logs and cancel of the whole sweep."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import launcher
from conftest import RECIPES, as_process_env, submit_json
from sandbox_procs import job_processes


DEMO = RECIPES / "sandbox-demo.yaml"


@pytest.fixture
def env(clean_env, sandbox, tmp_path):
    return sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))


def _sweep(cli, env, tmp_path, *args) -> dict:
    # one node a point: four fit on the sandbox at once, so only --max-parallel holds them back
    return submit_json(cli("submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
                           "cluster.nodes=1", "-m", *args, "--json", env=env))


def _running(sandbox, array: str) -> int:
    return len(sandbox.run("squeue", "-h", "-r", "-t", "R", "-j", array, "-o", "%i").stdout.split())


def _until_gone(sandbox, array: str, timeout: float = 240) -> int:
    """Wait until no task of ARRAY is queued or running; the most seen running at once."""
    most, deadline = 0, time.monotonic() + timeout
    while sandbox.run("squeue", "-h", "-r", "-j", array, "-o", "%i").stdout.split():
        assert time.monotonic() < deadline, sandbox.run("squeue", "-r").stdout
        most = max(most, _running(sandbox, array))
        time.sleep(0.5)
    return most


@pytest.mark.sandbox_shared
def test_a_sweep_is_one_array_with_its_own_values_names_and_ports_per_point(cli, sandbox, env, tmp_path,
                                                                          monkeypatch):
    # submitted through the Python API (launcher.sweep: what `submit -m` calls), then read back
    # by the CLI and by the API
    as_process_env(monkeypatch, env)
    sw = launcher.sweep(str(DEMO), [f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
                                    "cluster.nodes=1", "verl.overrides.data.seed=1,2",
                                    "trace.max_samples_per_step_per_worker=1,3"], max_parallel=2)
    assert isinstance(sw, launcher.SweepRun)
    # what `submit -m --json` prints: the sweep's own record (sweep.json), its points with their ids
    rec = json.loads((Path(sw.run_dir) / "sweep.json").read_text())
    info = {"job_id": sw.job_id, "sweep_dir": sw.run_dir, "name": rec["name"], "points": rec["points"]}
    array = info["job_id"]
    assert [p["job_id"] for p in info["points"]] == [f"{array}_{i}" for i in range(4)]
    assert _until_gone(sandbox, array) == 2  # the array's %2: two points at once, never more
    reports = [json.loads((Path(p["run_dir"]) / "demo-report.r0.json").read_text()) for p in info["points"]]
    for point, report in zip(info["points"], reports):  # each entrypoint got its own point
        ov = report["overrides"]
        seed, cap = (int(o.split("=")[1]) for o in point["overrides"])
        assert ov["data.seed"] == seed and ov["actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker"] == cap
        assert ov["trainer.experiment_name"] == point["experiment"] == report["driver"]["WANDB_NAME"]
        assert ov["trainer.default_local_dir"].endswith("/" + point["experiment"])
        for seen in [*report["nodes"], report["driver"]]:  # the shared group reached every node
            assert seen["WANDB_RUN_GROUP"] == info["name"] and seen["WANDB_JOB_TYPE"] == "sweep", seen
    assert len({r["driver"]["WANDB_RUN_ID"] for r in reports}) == 4
    assert len({r["overrides"]["trainer.default_local_dir"] for r in reports}) == 4
    # Ray's ports come from each task's own job id: points side by side never share them
    heads = [[json.loads(x) for x in (Path(p["run_dir"]) / "phases.jsonl").read_text().splitlines()]
             for p in info["points"]]
    gcs = [next(ph["detail"] for ph in h if ph["phase"] == "head-up") for h in heads]
    assert len(set(gcs)) == 4, gcs

    st = json.loads(cli("status", array, "--json", env=env).stdout)
    assert st["kind"] == "sweep" and st["counts"] == {"COMPLETED": 4}
    assert [(r["index"], r["state"], r["exit_code"]) for r in st["points"]] == [(i, "COMPLETED", "0:0") for i in range(4)]
    table = cli("status", info["sweep_dir"], env=env).stdout
    assert "4 points, 4 COMPLETED" in table and f"{array}_3" in table and "verl.overrides.data.seed=2" in table
    rows = json.loads(cli("list", "--json", env=env).stdout)
    assert [(r["job_id"], r["state"]) for r in rows] == [(array, "COMPLETED")]  # one line: the sweep
    out = cli("logs", f"{array}_1", env=env)
    assert out.returncode == 0 and f"experiment={info['points'][1]['experiment']} " in out.stdout, out.stdout[-2000:]
    whole = cli("logs", array, env=env)
    assert whole.returncode == 2 and f"e.g. {array}_0" in whole.stderr
    # the API's view of the same sweep
    counts = []
    final = sw.wait(poll=0.5, timeout=60, on_change=counts.append)  # ended: at once
    points = sw.points()
    assert [p.job_id for p in points] == [f"{array}_{i}" for i in range(4)]
    assert final == {p.job_id: "COMPLETED" for p in points} and counts[-1] == {"COMPLETED": 4}, (final, counts)
    status = sw.status()
    assert [p["point"] for p in status["points"]] == [1, 2, 3, 4]
    assert [p["overrides"] for p in status["points"]] == [pt["overrides"] for pt in info["points"]]
    assert all(p.status()["state"] == "COMPLETED" for p in points)
    assert launcher.run(array).run_dir == sw.run_dir
    with pytest.raises(launcher.RecipeError, match=f"is a sweep.*{array}_0"):
        sw.logs()


def test_requeue_of_one_point_and_cancel_of_the_whole_sweep(cli, sandbox, env, tmp_path):
    """A requeued point restarts alone and resumes as itself; then cancel ends every point,
    running or pending, and leaves no process."""
    from test_requeue import _phases, _reported, _wait_phase, _wait_until

    info = _sweep(cli, env, tmp_path, "verl.overrides.data.seed=1,2,3", "cluster.requeue=true",
                  "verl.overrides.demo.hold=300", "--max-parallel", "2")
    array = info["job_id"]
    first, second, _ = info["points"]
    try:
        for p in (first, second):
            _wait_phase(sandbox, p["job_id"], p["run_dir"], "driver-start", 0)
            _wait_until(lambda: _reported(p["run_dir"], 0))
        # the third point waits for a slot (--max-parallel 2): held, it cannot take the requeued one's
        assert sandbox.run("scontrol", "hold", f"{array}_2").returncode == 0
        assert sandbox.run("scontrol", "requeue", second["job_id"]).returncode == 0
        _wait_phase(sandbox, second["job_id"], second["run_dir"], "driver-start", 1)
        _wait_until(lambda: _reported(second["run_dir"], 1))
        assert sandbox.run("scontrol", "release", f"{array}_2").returncode == 0
        again = json.loads((Path(second["run_dir"]) / "demo-report.r1.json").read_text())
        before = json.loads((Path(second["run_dir"]) / "demo-report.r0.json").read_text())
        assert again["driver"]["SLURM_RESTART_COUNT"] == "1"
        assert again["overrides"]["trainer.resume_mode"] == "auto"
        for key in ("trainer.experiment_name", "trainer.default_local_dir", "data.seed"):
            assert again["overrides"][key] == before["overrides"][key]
        assert again["driver"]["WANDB_RUN_ID"] == before["driver"]["WANDB_RUN_ID"]
        assert again["overrides"]["data.seed"] == 2
        # the other point ran on, untouched
        assert {p["restart"] for p in _phases(first["run_dir"])} == {0}
        assert sandbox.job_field(first["job_id"], "JobState") == "RUNNING"
        assert sandbox.job_field(f"{array}_2", "JobState") == "PENDING"  # cancel ends it too
    finally:
        proc = cli("cancel", array, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")[:3]) == [f"job {array}_{i} CANCELLED" for i in range(3)], proc.stdout
    deadline = time.monotonic() + 30
    while job_processes(array, "SLURM_ARRAY_JOB_ID") and time.monotonic() < deadline:
        time.sleep(1)
    assert job_processes(array, "SLURM_ARRAY_JOB_ID") == []
    st = json.loads(cli("status", array, "--json", env=env).stdout)
    assert st["counts"] == {"CANCELLED": 3}


@pytest.mark.accounting
def test_an_ended_sweeps_states_come_from_accounting_after_the_controller_forgets(cli, sandbox, env, tmp_path):
    """Without slurmdbd, only the job-completion log, which knows each task by its own job id."""
    sandbox.reset_controller()
    info = _sweep(cli, env, tmp_path, "verl.overrides.demo.raise_with_env=NOPE,null")
    _until_gone(sandbox, info["job_id"])
    sandbox.reset_controller()
    st = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    states = [(r["overrides"], r["state"], r["source"]) for r in st["points"]]
    assert all(r[2] != "scontrol" for r in states), states
    assert [r[1] for r in states] == ["FAILED", "COMPLETED"], states
