"""Requeue and preemption on the real sandbox: Slurm's own time-limit signal leads to a second run
(restart count 1) with new log files, the resume overrides, and the same W&B run id; and the
job's checkpoint limit, on verl's own checkpoints, without Slurm. `scontrol requeue` and a
requeue by USR1, with verl's own resume, are the resume run's (test_verl_resume.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json


def _phases(run_dir: str) -> list:
    try:
        return [json.loads(line) for line in Path(run_dir, "phases.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def _wait_phase(sandbox, job_id: str, run_dir: str, name: str, restart: int, timeout: float = 240) -> None:
    """Wait for phase NAME of restart RESTART; release a requeued job from Slurm's begin-time hold."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p["phase"] == name and p["restart"] == restart for p in _phases(run_dir)):
            return
        sandbox.release_requeued(job_id)  # requeued jobs wait ~2 min otherwise
        if sandbox.job_field(job_id, "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(1)
    out = Path(run_dir, f"slurm-{job_id}.out")
    pytest.fail(f"no phase {name} of restart {restart}; phases: {_phases(run_dir)}\n"
                f"{out.read_text()[-3000:] if out.exists() else ''}")


def _submit(cli, sandbox, clean_env, tmp_path, *overrides) -> dict:
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    return submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "cluster.nodes=1", "cluster.requeue=true",
                           "verl.overrides.demo.hold=600", *overrides, "--json", env=env))


def _assert_resumed(run_dir: str) -> dict:
    """The second run: restart count 1, its own log files, the resume override, and the W&B
    run id the script exports for every run of the job. Returns its report."""
    run = Path(run_dir)
    second = json.loads((run / "demo-report.r1.json").read_text())
    for log in ("driver.r1.log", "ray-head.r0.log", "ray-head.r1.log"):
        assert (run / "logs" / log).stat().st_size > 0, log
    assert second["driver"]["SLURM_RESTART_COUNT"] == "1"
    assert second["overrides"]["trainer.resume_mode"] == "auto"
    assert second["config"]["trainer"]["default_local_dir"] == str(run.parent.parent / "checkpoints" / "sandbox-demo")
    run_id = re.search(r"^export WANDB_RUN_ID=(\w+)$", (run / "job.sbatch").read_text(), re.M).group(1)
    assert second["driver"]["WANDB_RUN_ID"] == run_id and second["driver"]["WANDB_RESUME"] == "allow"
    names = [(p["phase"], p["restart"]) for p in _phases(run_dir)]
    assert names.index(("teardown", 0)) < names.index(("restart", 1)) < names.index(("driver-start", 1))
    return second


def _verl_checkpoints(ckpt: Path, *steps: int, latest: int) -> dict:
    """Checkpoints written by verl's own FSDP checkpoint manager; the tracker at LATEST (a
    newer step is one whose save was cut short before verl updated the tracker)."""
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fsdp_checkpoints.py")), str(ckpt),
                           *map(str, steps)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(latest))
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def test_time_limit_signal_tears_down_and_requeues_itself(cli, sandbox, clean_env, tmp_path):
    # Slurm sends USR1 when 30 s are left of 2 minutes, "up to 60 s early": 30-90 s after each
    # run starts, so after its driver is up (~10 s here).
    info = _submit(cli, sandbox, clean_env, tmp_path, "cluster.time=2", "cluster.signal_seconds=30")
    job, run_dir = info["job_id"], info["run_dir"]
    try:
        _wait_phase(sandbox, job, run_dir, "driver-start", 1, timeout=300)
        _wait_until(lambda: _reported(run_dir, 1))
        second = _assert_resumed(run_dir)
        names = [(p["phase"], p["restart"]) for p in _phases(run_dir)]
        assert names.index(("preempt", 0)) < names.index(("teardown", 0)) < names.index(("requeue", 0))
        # verl's checkpoint-before-expiry deadline: the moment this run's USR1 is due.
        start = next(p["time"] for p in _phases(run_dir) if p["phase"] == "start" and p["restart"] == 1)
        deadline = int(second["driver"]["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"])
        assert abs(deadline - (start + 120 - 30)) <= 5, (deadline, start)
    finally:
        sandbox.run("scancel", job)
        sandbox.wait(job)


@pytest.mark.sandbox_shared
def test_a_requeue_that_would_start_over_stops_before_ray_and_the_way_out_resumes(cli, sandbox, clean_env, tmp_path):
    """A checkpoint the job saved without verl's tracker (async_save, verl#7952): the requeued run
    stops in its resume check, before Ray, naming it and the way out; a resubmit with that way out
    has the job write the tracker, and say so, before its driver starts."""
    ckpt = tmp_path / "runs" / "checkpoints" / "sandbox-demo"
    info = _submit(cli, sandbox, clean_env, tmp_path)
    job, run_dir = info["job_id"], info["run_dir"]
    try:
        _wait_phase(sandbox, job, run_dir, "driver-start", 0)
        (ckpt / "global_step_3").mkdir(parents=True)  # saved by this run; no tracker written
        sandbox.run("scontrol", "requeue", job)
        _wait_phase(sandbox, job, run_dir, "error", 1)
        names = [(p["phase"], p["restart"]) for p in _phases(run_dir)]
        error = next(p["detail"] for p in _phases(run_dir) if p["phase"] == "error" and p["restart"] == 1)
        assert error == (f"resume check: requeued, and {ckpt} holds a checkpoint this job saved that verl would not "
                         f"resume from: it holds global_step_3 but no latest_checkpointed_iteration.txt: verl would "
                         "start from scratch (verl#7952); the newest complete checkpoint is global_step_3. Stopped "
                         "rather than start over; to resume from it: submit --resume-from global_step_3 (or "
                         "--resume-from latest-complete; in a recipe, cluster.resume_from)"), error
        assert ("driver-start", 1) not in names and ("nodes", 1) in names
        assert not (Path(run_dir) / "logs" / "ray-head.r1.log").exists()
        assert not (ckpt / "latest_checkpointed_iteration.txt").exists()  # nothing repaired
        status = cli("status", job, env=sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state"))))
        assert "Stopped rather than start over" in status.stdout, status.stdout
    finally:
        sandbox.run("scancel", job)
        sandbox.wait(job)
    again = _submit(cli, sandbox, clean_env, tmp_path, "--resume-from", "global_step_3")
    job, run_dir = again["job_id"], again["run_dir"]
    try:
        _wait_phase(sandbox, job, run_dir, "driver-start", 0)
        said = [(p["phase"], p["detail"]) for p in _phases(run_dir)]
        assert ("resume-check", "wrote latest_checkpointed_iteration.txt = 3 (there was none; cluster.resume_from=3); "
                                "verl resumes from global_step_3") in said, said
        assert [n for n, _ in said].index("resume-check") < [n for n, _ in said].index("driver-start")
        assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "3"
    finally:
        sandbox.run("scancel", job)
        sandbox.wait(job)


def _reported(run_dir: str, restart: int) -> bool:
    """The demo driver of that restart has written its report and printed its summary."""
    log = Path(run_dir, "logs", f"driver.r{restart}.log")
    return Path(run_dir, f"demo-report.r{restart}.json").exists() and "holding for" in (
        log.read_text() if log.exists() else "")


def _wait_until(cond, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


# ----------------------------------------------------------------------------- no sandbox
def _prune_function() -> str:
    """prune_checkpoints as the job script defines it, cut from a rendered script."""
    from launcher.core.recipe import load
    from launcher.core.render import render

    script = render(load(RECIPES / "sandbox-demo.yaml", [f"runtime.python={sys.executable}", "cluster.requeue=true",
                                                         "verl.overrides.trainer.max_actor_ckpt_to_keep=2"]).plan)
    m = re.search(r"^prune_checkpoints\(\) \{.*?^\}$", script, re.M | re.S)
    assert m, "no prune_checkpoints in the rendered script"
    return m.group(0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Steps 1-4 as verl's own FSDP checkpoint manager writes them, and each step's files."""
    ckpt = tmp_path_factory.mktemp("saved") / "ckpt"
    return ckpt, _verl_checkpoints(ckpt, 1, 2, 3, 4, latest=0)


@pytest.mark.parametrize("tracker, want_left, phase", [
    # verl's limit over the steps up to the one verl resumes from; step 4, saved after the tracker
    # was last written (a save cut short), is not verl's yet: untouched
    ("3", [2, 3, 4], "prune removed global_step_1; kept the newest 2 up to global_step_3"),
    ("2", [1, 2, 3, 4], None),  # two up to the tracker: nothing to remove
    (None, [1, 2, 3, 4], None),  # nothing saved yet as far as verl knows
    ("three", [1, 2, 3, 4], None),  # a tracker verl could not read either
])
def test_the_jobs_checkpoint_limit_spares_the_resume_step_and_any_newer_one(saved, tmp_path, tracker, want_left,
                                                                            phase):
    """What the job runs at a restart and at teardown (the resume run, test_verl_resume, shows
    it there): here on verl's own FSDP checkpoints, every case of the tracker."""
    ckpt, files = tmp_path / "ckpt", saved[1]
    shutil.copytree(saved[0], ckpt)
    tracker_file = ckpt / "latest_checkpointed_iteration.txt"
    tracker_file.unlink()
    if tracker is not None:
        tracker_file.write_text(tracker + "\n")
    proc = subprocess.run(["bash", "-c", _prune_function() + '\nphase() { echo "$*" >> "$PHASES"; }\n'
                           'prune_checkpoints "$1" 2', "prune", str(ckpt)],
                          env=dict(os.environ, PHASES=str(tmp_path / "phases")), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(int(p.name.split("_")[-1]) for p in ckpt.glob("global_step_*")) == want_left
    for step in want_left:  # what is kept is kept whole
        d = ckpt / f"global_step_{step}"
        assert sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) == files[step]
    said = (tmp_path / "phases").read_text().strip() if (tmp_path / "phases").exists() else None
    assert said == phase
