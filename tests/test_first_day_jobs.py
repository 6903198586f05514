"""A first day with the job toolkit, through the real CLI: `logs --driver -f` right after submit,
progress that outlives the run, `status --json` a program can read, `--wait` on a job that can
never start (and Ctrl-C on a queued one), `list` on a box without Slurm, a local sweep's
numbering, and `merge` before any checkpoint exists."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import launcher
from conftest import RECIPES, as_process_env, submit_json

DEMO = RECIPES / "sandbox-demo.yaml"


def _submit(cli, env, tmp_path, *overrides, wait=False):
    args = ["submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}", *overrides]
    if wait:
        return cli(*args, "--wait", env=env, timeout=180)
    return submit_json(cli(*args, "--json", env=env))


def _status(cli, env, job):
    proc = cli("status", job, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def env(sandbox, clean_env, tmp_path):
    return sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))


def test_follow_the_driver_at_once_and_progress_after_the_end(cli, sandbox, env, tmp_path):
    quiet = ("wandb.enabled=false", "trace.backend=none")  # no W&B run, no Weave traces: no links
    done = _submit(cli, env, tmp_path, "verl.overrides.demo.train_steps=3", "wandb.entity=team", *quiet)
    # beside it on the sandbox's other 2 nodes (CI's time), training long enough to be seen training
    # once the first has been followed to its end
    failing = _submit(cli, env, tmp_path, "verl.overrides.demo.train_steps=6", "verl.overrides.demo.step_seconds=5",
                      "+verl.overrides.demo.exit_code=3", "job.name=fails", *quiet)
    try:
        # right after submit, before the job wrote its driver log: -f waits for it, then follows it to the end
        follow = cli("logs", "--driver", "-f", done["job_id"], env=env, timeout=180)
        assert follow.returncode == 0, follow.stderr
        assert "waiting for " in follow.stderr and "driver.r*.log" in follow.stderr, follow.stderr
        assert len(follow.stderr.strip().splitlines()) == 1, follow.stderr  # one note, not one per poll
        assert "step:3 - " in follow.stdout, follow.stdout[-2000:]
        # while it trains: phase 'training', no exit code yet, no reason as the string "None"
        deadline = time.monotonic() + 120
        while True:
            st = _status(cli, env, failing["job_id"])
            if st["step"] and st["phase_marker"] == "driver-start":
                break
            assert time.monotonic() < deadline, st
            time.sleep(1)
        assert st["phase"] == "training" and st["phase_marker"] == "driver-start", st
        assert st["exit_code"] is None and st["reason"] is None, st
        assert "phase      training" in cli("status", failing["job_id"], env=env).stdout
        assert sandbox.wait(failing["job_id"]) == "FAILED"
    finally:
        sandbox.run("scancel", failing["job_id"])
    assert sandbox.wait(done["job_id"]) == "COMPLETED"
    st = _status(cli, env, done["job_id"])
    assert st["state"] == "COMPLETED" and st["exit_code"] == "0:0" and st["reason"] is None
    assert st["step"] == "3/3" and st["outcome"] == "completed 3/3", st
    assert (st["steps_done"], st["total_steps"]) == (3, 3), st  # typed: what the traces tally reads
    assert st["links"] == {} and st["link_templates"] == {} and st["links_note"] is None, st
    text = cli("status", done["job_id"], env=env).stdout
    assert "step       completed 3/3" in text and "W&B" not in text, text
    bad = _status(cli, env, failing["job_id"])
    assert bad["state"] == "FAILED" and bad["outcome"] == "failed at step 6/6" and bad["exit_code"] == "3:0", bad
    table = cli("list", env=env).stdout.splitlines()
    line = {ln.split()[0]: ln for ln in table[1:]}
    assert " 3/3 " in line[done["job_id"]] and " 6/6 " in line[failing["job_id"]], table
    # a run with W&B on and an entity: URLs only in links, nothing else in them
    assert "STEP" in table[0]


@pytest.mark.sandbox_shared
def test_wait_stops_for_a_job_that_can_never_start_and_leaves_it_queued(cli, sandbox, env, tmp_path, monkeypatch):
    proc = _submit(cli, env, tmp_path, "cluster.nodes=8", "wandb.entity=team", wait=True)  # the sandbox has 4
    job = re.search(r"^Submitted batch job (\d+)$", proc.stdout, re.M).group(1)
    try:
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        assert re.search(rf"job {job} will not start: .*\(Slurm's reason: Partition\w+\)", proc.stdout), proc.stdout
        assert f"stays queued (remove it: verl-launch cancel {job})" in proc.stdout, proc.stdout
        assert sandbox.job_field(job, "JobState") == "PENDING"  # left queued
        st = _status(cli, env, job)
        assert st["state"] == "PENDING" and st["reason"].startswith("Partition") and st["never_starts"], st
        assert st["exit_code"] is None
        assert all(u.startswith("https://") and " " not in u for u in st["links"].values()), st["links"]
        assert st["links"]["traces"] == "https://wandb.ai/team/verl-launch-demo/weave/traces"
        text = cli("status", job, env=env).stdout
        # Slurm may name the partition's limit anew between two queries (PartitionConfig, PartitionNodeLimit)
        assert re.search(r"^state      PENDING \(Partition\w+\)$", text, re.M) and "it will never start" in text, text
        # the Python API on the same job (the CLI prints it): Run.wait raises, saying the same
        as_process_env(monkeypatch, env)
        with pytest.raises(launcher.SlurmError) as e:
            launcher.Run(job, st["run_dir"]).wait(poll=0.5, timeout=60)
        assert e.value.never_starts and str(e.value).startswith(f"job {job} will not start: "), str(e.value)
        assert re.search(r"Slurm's reason: Partition\w+", str(e.value)), str(e.value)
        assert f"verl-launch cancel {job}" in str(e.value)  # built once: state.never_starts_text
        assert sandbox.job_field(job, "JobState") == "PENDING"  # still left queued: the user decides
    finally:
        assert cli("cancel", job, env=env, timeout=180).returncode == 0


@pytest.mark.sandbox_shared
def test_ctrl_c_on_wait_for_a_queued_job_says_it_stays_queued(sandbox, env, tmp_path):
    cmd = [sys.executable, "-m", "launcher.cli", "submit", str(DEMO), f"runtime.python={sys.executable}",
           f"paths.runs={tmp_path / 'runs'}", "cluster.sbatch_args=['--begin=now+3600']", "--wait"]
    # Ctrl-C as a terminal sends it, to a process that has not inherited SIGINT ignored (pytest
    # run as a background job `&` has: the launcher would never see the signal)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    job, seen = None, []
    try:
        for line in proc.stdout:
            seen.append(line)
            m = re.match(r"Submitted batch job (\d+)$", line.strip())
            job = m.group(1) if m else job
            if "PENDING (BeginTime)" in line:
                break
        assert job, "".join(seen) + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        assert proc.returncode == 0, out
        assert f"detached; job {job} stays queued (remove it: verl-launch cancel {job})" in out, out
        assert "scancel" not in out and "keeps running" not in out, out
        assert sandbox.job_field(job, "JobState") == "PENDING"
    finally:
        sandbox.run("scancel", job)


def _bare_path(tmp_path: Path) -> str:
    """A PATH with python and bash only: no Slurm command anywhere on it."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for name in ("python", "python3", "bash", "sh", "env"):
        found = sys.executable if name.startswith("python") else subprocess.run(
            ["bash", "-c", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bare / name).symlink_to(found)
    return str(bare)


@pytest.mark.verl  # local runs and a merge
def test_local_sweep_list_without_slurm_and_merge_before_a_checkpoint(cli, clean_env, tmp_path):
    """A local sweep (two real local runs): numbered 1/2, 2/2; `list` on a box without Slurm lists
    it (and says once that Slurm's runs could not be asked for); `merge` before any checkpoint
    says there is none at all yet."""
    state = tmp_path / "state"
    env = {k: v for k, v in clean_env.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["VERL_LAUNCH_STATE"] = str(state)
    proc = cli("submit", "--local", "-m", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
               "verl.overrides.data.seed=1,2", "verl.overrides.demo.train_steps=2",
               "verl.overrides.demo.step_seconds=0.2", env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert re.search(r"^point 1/2 \(.*seed=1\): running locally", proc.stdout, re.M), proc.stdout[-3000:]
    assert re.search(r"^point 2/2 COMPLETED exit code 0:0", proc.stdout, re.M), proc.stdout[-3000:]
    assert not re.search(r"^point \d+/1\b|^point 0/", proc.stdout, re.M)
    # a Slurm run in the registry too, which this box cannot ask about
    slurm_dir = tmp_path / "runs" / "slurm-one"
    slurm_dir.mkdir(parents=True)
    with open(state / "runs.jsonl", "a") as f:
        f.write(json.dumps({"job_id": "41", "run_dir": str(slurm_dir), "job_name": "queued-one",
                            "created": 1, "submitted": 2}) + "\n")
    bare = dict({k: v for k, v in env.items() if not k.startswith("SLURM_")}, PATH=_bare_path(tmp_path))
    listed = cli("list", env=bare)
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr.count("note: 1 Slurm run(s) not listed") == 1, listed.stderr
    assert "scontrol" in listed.stderr, listed.stderr  # why
    row = [ln for ln in listed.stdout.splitlines() if "sweep" in ln]
    assert len(row) == 1 and "sweep: 2 completed" in row[0], listed.stdout
    assert re.search(r"\ssandbox-demo\s+sweep: ", row[0]), row  # the base experiment, not the sweep's name
    assert "queued-one" not in listed.stdout
    rows = json.loads(cli("list", "--json", env=bare).stdout)
    assert rows[0]["kind"] == "sweep" and rows[0]["experiment"] == "sandbox-demo" and rows[0]["counts"] == {
        "COMPLETED": 2}
    assert [p["step"] for p in rows[0]["points"]] == ["2/2", "2/2"]
    # only Slurm runs and no Slurm: still an error, with why
    only = tmp_path / "state-slurm-only"
    only.mkdir()
    (only / "runs.jsonl").write_text(json.dumps({"job_id": "41", "run_dir": str(slurm_dir)}) + "\n")
    nothing = cli("list", env=dict(bare, VERL_LAUNCH_STATE=str(only)))
    assert nothing.returncode == 1 and "scontrol" in nothing.stderr, nothing.stderr
    # the sweep's status: each point's last step, after the end
    sweep_dir = rows[0]["run_dir"]
    table = cli("status", sweep_dir, env=bare).stdout
    assert re.search(r"^\s+1\s.*COMPLETED.*\s2/2\s", table, re.M), table  # points count 1..N (issue 29)
    # merge before any checkpoint (the demo saves none): no --step suggestion, where it looked
    point = rows[0]["points"][0]
    merge = cli("merge", point["job_id"], "--local", env=bare)
    assert merge.returncode == 2, merge.stderr
    assert "no checkpoint at all yet" in merge.stderr and "trainer.default_local_dir" in merge.stderr, merge.stderr
    assert "trainer.save_freq" in merge.stderr and "--step" not in merge.stderr, merge.stderr
    ckpt = Path(re.search(r"nothing saved in (\S+) ", merge.stderr).group(1))
    (ckpt / "global_step_10" / "actor").mkdir(parents=True)  # a save under way: now --step is worth saying
    started = cli("merge", point["job_id"], "--local", env=bare)
    assert started.returncode == 2 and "steps started there: 10" in started.stderr and "--step" in started.stderr


@pytest.mark.verl  # a local merge (torch, verl's checkpoint)
def test_merge_without_wait_says_how_to_follow_it(cli, tmp_path):
    from test_merge import _make

    ckpt = _make(tmp_path / "ckpt", 1, 2, port=29651)
    proc = cli("merge", ckpt, "--local", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    follow = re.search(r"^Follow it: tail -f (\S+) .*--wait", proc.stdout, re.M)
    assert follow, proc.stdout
    assert "here in the background, pid" in proc.stdout
    target = ckpt / "global_step_2" / "huggingface_merged"
    deadline = time.monotonic() + 300  # it finishes without us; wait for it (nothing left running)
    while not (target / "verl-launch-merge.json").exists():
        assert time.monotonic() < deadline, Path(follow.group(1)).read_text()[-3000:]
        time.sleep(2)
    assert Path(follow.group(1)).exists()
