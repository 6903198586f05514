"""Local mode (`submit --local`): the same script on this machine, without Slurm: Ray up,
the entrypoint, teardown, exit status, logs, phases, and no process left behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import RECIPES
from launcher.backends.local import MARKER

pytestmark = pytest.mark.verl  # local runs

PHASES = ["start", "nodes", "inputs-check", "head-up", "workers-up", "ready", "driver-start", "driver-end", "teardown"]


def _local(cli, env, tmp_path, *overrides):
    proc = cli("submit", "--local", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
               f"paths.runs={tmp_path / 'runs'}", *overrides, "--json",
               env=dict(env, VERL_LAUNCH_STATE=str(tmp_path / "state")), timeout=400)
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc, rec, Path(rec["run_dir"])


def _marked(job_id: str) -> list:
    needle = f"{MARKER}={job_id}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and needle in (d / "environ").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def test_local_run_end_to_end_and_nothing_left_behind(cli, clean_env, tmp_path):
    env = {k: v for k, v in clean_env.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc, rec, run = _local(cli, env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rec["final_state"] == "COMPLETED" and rec["exit_code"] == "0:0"
    phases = [json.loads(x)["phase"] for x in (run / "phases.jsonl").read_text().splitlines()]
    assert phases == PHASES
    for log in ("ray-head.r0.log", "driver.r0.log", "nodes.txt"):
        assert (run / "logs" / log).stat().st_size > 0, log
    assert "phase teardown (rc=0)" in (run / f"slurm-{rec['job_id']}.out").read_text()
    report = json.loads((run / "demo-report.r0.json").read_text())
    assert len(report["nodes"]) == 1 and report["cluster_gpus"] == 2  # the recipe's count: none visible
    assert report["config"]["trainer"]["nnodes"] == 1
    # The script's own teardown stopped Ray: nothing had to be killed afterwards, nothing is left.
    assert rec["leftovers"] == 0 and _marked(rec["job_id"]) == []
    listed = json.loads(cli("list", "--json", env=dict(env, VERL_LAUNCH_STATE=str(tmp_path / "state"))).stdout)
    assert listed[0]["state"] == "COMPLETED" and listed[0]["run_dir"] == str(run)


def test_local_run_takes_the_visible_gpus_and_keeps_a_failure(cli, clean_env, tmp_path):
    env = dict(clean_env, CUDA_VISIBLE_DEVICES="3")
    proc, rec, run = _local(cli, env, tmp_path, "verl.overrides.demo.exit_code=5")
    assert proc.returncode == 1
    assert rec["final_state"] == "FAILED" and rec["exit_code"] == "5:0"
    report = json.loads((run / "demo-report.r0.json").read_text())
    assert report["cluster_gpus"] == 1 and report["config"]["trainer"]["n_gpus_per_node"] == 1
    assert "exiting 5 as asked" in (run / "logs" / "driver.r0.log").read_text()
    assert _marked(rec["job_id"]) == []


def test_local_sweep_runs_the_points_one_after_another(cli, clean_env, tmp_path):
    env = dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state"))
    proc = cli("submit", "--local", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
               f"paths.runs={tmp_path / 'runs'}", "-m", "verl.overrides.demo.exit_code=0,5", "--json",
               env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # one point failed
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(p["index"], p["final_state"], p["exit_code"]) for p in out["points"]] == \
        [(0, "COMPLETED", "0:0"), (1, "FAILED", "5:0")]
    runs = [Path(p["run_dir"]) for p in out["points"]]
    assert [r.parent for r in runs] == [Path(out["sweep_dir"])] * 2
    ends = [json.loads((r / "phases.jsonl").read_text().splitlines()[-1])["time"] for r in runs]
    starts = [json.loads((r / "phases.jsonl").read_text().splitlines()[0])["time"] for r in runs]
    assert ends[0] < starts[1]  # one after another, never side by side
    st = json.loads(cli("status", out["sweep_dir"], "--json", env=env).stdout)
    assert st["counts"] == {"COMPLETED": 1, "FAILED": 1}
    assert all(_marked(p["job_id"]) == [] for p in out["points"])


def test_two_local_runs_never_claim_the_same_block_of_ray_ports():
    """Each run holds a lock on its block of Ray ports for its life: two runs starting together
    find the same block free before either Ray binds it (seen when the suite ran local runs side
    by side: one run's readiness check was answered by the other's Ray, InvalidAuthToken)."""
    import os

    from launcher.backends import local
    from launcher.core.recipe import load

    # one block in the whole range (9 fixed ports + 16 worker ports): both runs would take it
    plan = load(RECIPES / "sandbox-demo.yaml", ["cluster.port_range=[31000,31024]", "cluster.worker_ports=16"]).plan
    assert plan.port_slots == 1
    _, lock = local._claim_job_id(plan)
    try:
        with pytest.raises(OSError, match="no free block of Ray ports"):
            local._claim_job_id(plan)
    finally:
        os.close(lock)
    _, lock = local._claim_job_id(plan)  # released with the run
    os.close(lock)
