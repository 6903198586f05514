"""How the command line is typed and read (issue 12): flags anywhere among the overrides, a
closed pipe, a recipe reached through a link, and what `submit` tells you to run next."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import RECIPES, ROOT

DEMO = RECIPES / "sandbox-demo.yaml"


def test_flags_may_come_between_and_after_the_overrides(cli, clean_env, tmp_path):
    proc = cli("submit", DEMO, "--dry-run", "cluster.nodes=3", "--json", f"paths.runs={tmp_path / 'runs'}",
               env=clean_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["dry_run"] and "#SBATCH --nodes=3" in out["script"] and str(tmp_path / "runs") in out["run_dir"]
    assert not (tmp_path / "runs").exists()
    bad = cli("submit", DEMO, "--dry-run", "--bogus", env=clean_env)
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_closed_pipe_ends_quietly(clean_env, unbuffered):
    # `verl-launch check R | head -1`, the reader gone before the output: whether Python writes
    # line by line or all at the end, no traceback, and exit 141 (128 + SIGPIPE) as Unix tools
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "check", str(RECIPES / "gsm8k-grpo.yaml"),
                           "runtime.python=/usr/bin/python3"], env=dict(clean_env, PYTHONUNBUFFERED=unbuffered),
                          stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60)
    os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_a_linked_recipe_finds_its_profiles_beside_the_file(cli, clean_env, tmp_path):
    real = tmp_path / "team" / "mine.yaml"
    (real.parent / "cluster").mkdir(parents=True)
    (real.parent / "cluster" / "ours.yaml").write_text("partition: ours\nnodes: 3\ngpus_per_node: 2\n")
    real.write_text("defaults:\n  - cluster: ours\n  - _self_\njob: {name: mine}\nwandb: {project: p}\n"
                    "verl: {entrypoint: launcher.demo_payload}\n")
    link = tmp_path / "elsewhere" / "link.yaml"
    link.parent.mkdir()
    link.symlink_to(real)
    proc = cli("render", link, env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=ours" in proc.stdout and "#SBATCH --nodes=3" in proc.stdout


def test_a_home_relative_path_on_the_command_line(cli, clean_env, tmp_path):
    # the README's own default is ~/verl-launch/runs: `paths.runs=~/r` is what people type
    proc = cli("submit", DEMO, "paths.runs=~/r", "--dry-run", "--json", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["run_dir"].startswith(str(tmp_path / "home" / "r") + "/")
    # and verl's checkpoints, ${paths.runs}/checkpoints in the demo, under that same absolute path
    assert f"trainer.default_local_dir={tmp_path / 'home' / 'r'}/checkpoints/" in out["script"]


def test_list_n_must_be_positive(cli, clean_env):
    proc = cli("list", "-n", "-5", env=clean_env)
    assert proc.returncode == 2 and "positive whole number" in proc.stderr


def test_a_secret_looking_name_that_is_not_one_is_fine(cli, clean_env):
    for ov in ("env.TOKENIZERS_PARALLELISM='false'", "env.GOOGLE_APPLICATION_CREDENTIALS=/etc/creds.json",
               "env.WANDB_MODE=offline"):
        proc = cli("render", DEMO, ov, env=clean_env)
        assert proc.returncode == 0, (ov, proc.stderr)


def test_the_job_toolkit_says_when_slurm_cannot_be_asked(cli, clean_env, tmp_path):
    """A controller that does not answer is exit 1 with why, never a table of UNKNOWN; a run
    that does not exist is bad input (2); `logs` before the output exists says so."""
    conf = tmp_path / "slurm.conf"  # a controller nobody listens for (no sandbox needed)
    conf.write_text("ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=6999\n"
                    "MessageTimeout=2\nNodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n")
    state = tmp_path / "state"
    state.mkdir()
    run_dir = tmp_path / "runs" / "demo" / "1"
    run_dir.mkdir(parents=True)
    (state / "runs.jsonl").write_text(json.dumps({"job_id": "41", "run_dir": str(run_dir), "job_name": "demo",
                                                  "created": 1, "submitted": 2}) + "\n")
    env = dict(clean_env, SLURM_CONF=str(conf), VERL_LAUNCH_STATE=str(state))
    for args in (["list"], ["status", "41"]):
        proc = cli(*args, env=env, timeout=60)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "could not ask Slurm" in proc.stderr and "Unable to contact" in proc.stderr, proc.stderr
    unknown = cli("status", "999", env=env)
    assert unknown.returncode == 2 and "no run with job id" in unknown.stderr
    logs = cli("logs", "41", env=env, timeout=60)
    assert logs.returncode == 1 and "no output yet" in logs.stderr, logs.stderr


def test_local_dry_run_says_what_runs_here_and_what_local_changed(cli, clean_env, tmp_path):
    proc = cli("submit", DEMO, "--local", "--dry-run", "cluster.nodes=2", f"paths.runs={tmp_path / 'runs'}",
               env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# would run: bash job.sbatch (here, without Slurm, in ") and "sbatch --" not in \
        proc.stdout.splitlines()[0], proc.stdout[:300]
    assert "--local: cluster.nodes=1 here (the recipe asks for 2)" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_status_of_a_local_run_whose_runner_or_directory_is_gone(cli, clean_env, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no runner holds
    host = __import__("socket").gethostname().split(".")[0]
    state = tmp_path / "state"
    state.mkdir()
    kept, gone = tmp_path / "runs" / "kept", tmp_path / "runs" / "gone"
    kept.mkdir(parents=True)
    runner = {"host": host, "pid": dead.pid}
    (kept / "run.json").write_text(json.dumps({"job_id": "7", "local": True, "runner": runner}))
    (state / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"job_id": "7", "run_dir": str(kept), "local": True, "runner": runner},
        {"job_id": "8", "run_dir": str(gone), "local": True, "runner": runner})))
    env = dict(clean_env, VERL_LAUNCH_STATE=str(state))
    ended = cli("status", "7", env=env)
    assert ended.returncode == 0 and f"UNKNOWN (its runner (pid {dead.pid}) ended without recording an end)" \
        in ended.stdout, ended.stdout
    lost = json.loads(cli("status", "8", "--json", env=env).stdout)
    assert lost["state"] == "UNKNOWN" and lost["reason"] == "its run directory is gone"
    # `list` (local runs need no Slurm): a long name is cut with an ellipsis, a short one is not
    with open(state / "runs.jsonl", "a") as f:
        f.write(json.dumps({"job_id": "9", "run_dir": str(kept), "local": True, "runner": runner,
                            "job_name": "a-very-long-job-name-indeed", "experiment": "short"}) + "\n")
    table = cli("list", env=env).stdout
    assert "a-very-long-job\u2026 short " in table, table
    # no wandb.entity: status says where the run is, and how to find the entity
    with open(state / "runs.jsonl", "a") as f:
        f.write(json.dumps({"job_id": "10", "run_dir": str(kept), "local": True, "runner": runner,
                            "project": "proj"}) + "\n")
    links = cli("status", "10", env=env).stdout
    assert "W&B project https://wandb.ai/<entity>/proj (no wandb.entity: the run is under your W&B key's " \
           "default entity, shown at https://wandb.ai/settings" in links, links
    assert "W&B traces  https://wandb.ai/<entity>/proj/weave/traces" in links, links
