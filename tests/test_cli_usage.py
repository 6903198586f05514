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
