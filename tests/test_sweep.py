"""Sweeps without Slurm: Hydra's grammar expanded into points, each a full recipe with its own
experiment, W&B run id and checkpoint directory; bad sweeps refused (exit 2, nothing written,
nothing queued); verl's preflight in one process for every point."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from conftest import RECIPES
from launcher.errors import RecipeError
from launcher.core.plan import wandb_env
from launcher.core.sweeps import check, expand, experiment_names, labels, load_points, request
from test_bad_input import _tripwire

DEMO = RECIPES / "sandbox-demo.yaml"
GSM8K = RECIPES / "gsm8k-grpo.yaml"
PY = f"runtime.python={sys.executable}"


def test_hydra_expands_lists_ranges_and_choices_in_order():
    swept, points = expand(["a=1,2", "b=range(0,3)", "c=x", "d=choice(p,q)"])
    assert swept == ["a", "b", "d"]
    assert len(points) == 12
    assert points[0] == ["a=1", "b=0", "c=x", "d=p"] and points[-1] == ["a=2", "b=2", "c=x", "d=q"]


@pytest.mark.parametrize("overrides, words", [
    (["a=1"], "needs at least one sweep override"),
    (["a=interval(0,1)"], "lists its values"),
    (["a=1,1"], "points 1 and 2 are the same"),
    (["a=1,2", "a=3,4"], "given twice"),
    (["a=range(0,300)"], "more than --max-points=256"),
    (["a=range(0,1000000000)", "b=1,2"], "2000000000 points"),  # counted, never built
    (["a=[1"], "not Hydra syntax"),
])
def test_bad_sweeps_are_refused(overrides, words):
    with pytest.raises(RecipeError) as e:
        expand(overrides)
    assert words in str(e.value) and e.value.where == "command line"


def test_experiment_names_are_readable_unique_and_safe():
    assert labels(["verl.overrides.actor.optim.lr", "verl.overrides.critic.optim.lr", "cluster.x"]) == \
        ["actor.optim.lr", "critic.optim.lr", "x"]
    swept = ["verl.overrides.a.lr", "verl.overrides.b"]
    names = experiment_names("base", swept, [["verl.overrides.a.lr=1e-06", "verl.overrides.b='x y/z'"],
                                             ["verl.overrides.a.lr=1e-06", "verl.overrides.b='x y:z'"]])
    assert names[0] != names[1] and names[0].startswith("base-lr1e-06-bx_y_z")
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-_") for n in names)
    long = experiment_names("b" * 120, ["k"], [["k=1"], ["k=2"]])
    assert all(len(n) <= 128 for n in long) and len(set(long)) == 2


def test_each_point_is_a_full_recipe_with_its_own_names_and_one_group(tmp_path):
    sw = load_points(DEMO, [PY, f"paths.runs={tmp_path}", "verl.overrides.data.seed=1,2",
                            "wandb.entity=team", "trace.max_samples_per_step_per_worker=1,4"])
    assert len(sw.points) == 4
    recipes = [p.loaded.recipe for p in sw.points]
    assert [r.verl.overrides["data.seed"] for r in recipes] == [1, 1, 2, 2]
    assert [r.trace.max_samples_per_step_per_worker for r in recipes] == [1, 4, 1, 4]
    assert all(r.wandb.entity == "team" for r in recipes)  # a fixed override reaches every point
    experiments = [r.experiment for r in recipes]
    assert len(set(experiments)) == 4 and experiments[0] == "sandbox-demo-seed1-max_samples_per_step_per_worker1"
    envs = [dict(wandb_env(r)) for r in recipes]
    assert len({e["WANDB_RUN_ID"] for e in envs}) == 4
    assert {e["WANDB_RUN_GROUP"] for e in envs} == {sw.name} and {e["WANDB_JOB_TYPE"] for e in envs} == {"sweep"}
    ckpts = {r.verl.overrides["trainer.default_local_dir"] for r in recipes}  # ${wandb.experiment} in it
    assert len(ckpts) == 4
    check(sw, {"WANDB_API_KEY": "k" * 40, "PATH": os.environ["PATH"]}, verl=False)  # each point's plan
    req = request(sw, max_parallel=2)
    assert "#SBATCH --array=0-3%2" in req.script and "#SBATCH --output=%a/slurm-%A_%a.out" in req.script
    assert [str(r.paths.run_dir) for r in req.points] == [str(req.directory / str(i)) for i in range(4)]
    assert all(f"trainer.experiment_name={e}" in r.script for e, r in zip(experiments, req.points))
    assert not tmp_path.joinpath("sandbox-demo").exists()  # planning writes nothing


def test_a_recipes_own_group_and_experiment_are_kept(tmp_path):
    sw = load_points(DEMO, [PY, f"paths.runs={tmp_path}", "wandb.group=mine", "wandb.experiment=exp-a,exp-b"])
    assert [p.experiment for p in sw.points] == ["exp-a", "exp-b"]
    assert {p.loaded.recipe.wandb.group for p in sw.points} == {"mine"}


@pytest.mark.parametrize("overrides, key, words", [
    (["cluster.nodes=1,2"], "cluster.nodes", "(1 in point 1, 2 in point 2)"),
    (["cluster.time=10,20"], "cluster.time", "one allocation"),
    (["verl.overrides.data.seed=1,2", "verl.overrides.trainer.default_local_dir=/ckpt/same"],
     "verl.overrides.trainer.default_local_dir", "would share the checkpoint directory"),
    (["wandb.experiment=a,b", "verl.overrides.data.seed=1,2"], "wandb.experiment", "would share the experiment"),
    (["verl.overrides.data.seed=1,2,1"], "verl.overrides.data.seed", "points 1 and 3 are the same"),
    (["cluster.nodez=1,2"], "cluster.nodez", "unknown key"),
    (["trace.max_samples_per_step_per_worker=1,-1"], "trace.max_samples_per_step_per_worker",
     "(sweep point 2: trace.max_samples_per_step_per_worker=-1)"),
])
def test_points_that_cannot_share_one_array_are_refused(tmp_path, overrides, key, words):
    with pytest.raises(RecipeError) as e:
        sw = load_points(DEMO, [PY, f"paths.runs={tmp_path}", *overrides])
        check(sw, {"WANDB_API_KEY": "k" * 40, "PATH": os.environ["PATH"]}, verl=False)
    assert e.value.key == key and words in str(e.value), str(e.value)


def test_bad_sweeps_exit_2_and_write_or_queue_nothing(cli, tmp_path, clean_env):
    env, marker = _tripwire(tmp_path / "t", clean_env)
    runs = tmp_path / "runs"
    cases = [(["-m", "cluster.nodes=1,2"], "cluster.nodes"), (["-m", "data.seed=1"], "at least one sweep"),
             (["-m", "cluster.nodes=1,2", "--max-points", "1"], "--max-points=1"),
             (["--max-parallel", "2", "cluster.nodes=2"], "--max-parallel is for a sweep"),
             (["cluster.nodes=1,2"], "add -m")]
    for args, words in cases:
        for command in (("submit",), ("check",)):
            if "--max-parallel" in args and command == ("check",):
                continue
            proc = cli(*command, DEMO, PY, f"paths.runs={runs}", *args, env=env, cwd=tmp_path)
            assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, \
                (command, args, proc.stderr)
    assert not marker.exists() and not runs.exists()


def test_dry_run_prints_the_array_and_every_point(cli, tmp_path, clean_env):
    proc = cli("submit", DEMO, PY, f"paths.runs={tmp_path / 'runs'}", "-m", "verl.overrides.data.seed=1,2,3",
               "--dry-run", "--json", "--max-parallel", "2", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["command"].endswith("sbatch --parsable sweep.sbatch") and "--array=0-2%2" in out["script"]
    assert [p["overrides"] for p in out["points"]] == [[f"verl.overrides.data.seed={i}"] for i in (1, 2, 3)]
    assert len({p["experiment"] for p in out["points"]}) == 3
    assert not (tmp_path / "runs").exists()


@pytest.mark.verl  # verl's preflight
def test_verls_preflight_runs_once_for_all_points_and_names_the_rejected_one(cli, tmp_path, clean_env):
    """A wrapper interpreter counts verl's processes: one for the whole sweep; the point verl
    rejects is named, and nothing is queued."""
    log = tmp_path / "calls"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$2\" in *@@preflight*) echo preflight >> '{log}';; esac\n"
                       f"exec '{sys.executable}' \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env, marker = _tripwire(tmp_path / "t", clean_env)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    bad = cli("submit", GSM8K, f"runtime.python={wrapper}", f"paths.runs={tmp_path / 'runs'}", "-m",
              "verl.overrides.data.seed=1,2,3", "verl.overrides.data.train_batch_size=512,1000", env=env, timeout=300)
    assert bad.returncode == 2, bad.stderr
    assert "(sweep point 2: verl.overrides.data.seed=1 verl.overrides.data.train_batch_size=1000)" in bad.stderr
    assert "must be divisible by minimal possible batch size" in bad.stderr
    assert log.read_text().count("preflight") == 1  # six points, one verl process
    assert not marker.exists() and not (tmp_path / "runs").exists()
    ok = cli("check", GSM8K, f"runtime.python={wrapper}", "-m", "verl.overrides.data.seed=1,2,3", env=env, timeout=300)
    assert ok.returncode == 0 and "ok: submit -m would queue this sweep (3 points)" in ok.stdout, ok.stderr
    assert log.read_text().count("preflight") == 2  # three points, one more verl process


def test_a_secret_in_a_point_is_refused_without_showing_any_value(cli, tmp_path, clean_env, wandb_key):
    env = dict(clean_env, HF_AUTH="hf-" + "s" * 30)
    for values in (f"plain,{wandb_key}", f"plain,{env['HF_AUTH']}"):
        proc = cli("submit", DEMO, PY, f"paths.runs={tmp_path / 'runs'}", "secrets=[HF_AUTH]", "-m",
                   f"env.MY_SETTING={values}", "--dry-run", env=env)
        assert proc.returncode == 2 and "holds the value of a secret" in proc.stderr, proc.stderr
        assert "sweep point 2: env.MY_SETTING=<value>" in proc.stderr
        assert values.split(",")[1] not in proc.stdout + proc.stderr
    proc = cli("submit", DEMO, PY, "-m", "env.API_TOKEN=abcdefgh1,abcdefgh2", "--dry-run", env=env)
    assert proc.returncode == 2 and "env.API_TOKEN=<value>" in proc.stderr and "abcdefgh" not in proc.stderr


def test_a_refusal_of_every_point_is_said_once_and_each_other_with_its_point(tmp_path):
    """Every point's refusals at once, the same one (no key anywhere) said once for all."""
    # three points, the allocation swept too: each point's nodes differ from another's
    sw = load_points(DEMO, [PY, f"paths.runs={tmp_path}", "cluster.nodes=2,3,4", "secrets=[HF_TOKEN]"])
    with pytest.raises(RecipeError) as raised:
        check(sw, {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, verl=False)
    said = [str(e) for e in raised.value.each]
    point = f"{DEMO} (sweep point 1: cluster.nodes=2)"
    assert said == [
        f"{point}: wandb: no W&B API key: export WANDB_API_KEY, set wandb.api_key_file, or add api.wandb.ai to "
        "~/.netrc (W&B logging or Weave tracing is on) (and in 2 more point(s))",
        f"{point}: secrets: declared secret $HF_TOKEN is not set in your environment (and in 2 more point(s))",
        "command line: cluster.nodes: differs between points (2 in point 1, 3 in point 2): the points of one sweep "
        "share one job array, so one allocation; sweep it in separate submissions"], said
