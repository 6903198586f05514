"""verl's keys checked without verl (issue 11): the committed snapshot is what verl itself
gives, and the launcher refuses what verl would refuse, or would silently ignore, naming the
key, before any verl is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES
from launcher.checks import verl_schema
from launcher.errors import RecipeError
from launcher.base.overrides import verl_args
from launcher.core.recipe import load
from launcher.checks.verl_schema import problem, snapshot_for

GSM8K = RECIPES / "gsm8k-grpo.yaml"
NO_VERL = "runtime.python=/usr/bin/python3"  # Debian's interpreter: no verl, as on a login node
SCHEMA, _ = snapshot_for("0.9.1")


def test_the_committed_snapshot_is_what_verl_gives(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launcher.checks.verl_schema_snapshot", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [fresh] = tmp_path.glob("verl-*.json")
    committed = verl_schema.SNAPSHOTS / fresh.name
    assert committed.exists(), f"no committed {fresh.name}: run python -m launcher.checks.verl_schema_snapshot"
    assert json.loads(fresh.read_text()) == json.loads(committed.read_text())


def test_snapshot_shape():
    assert SCHEMA.version == "0.9.1" and len(SCHEMA.keys) > 500
    assert SCHEMA.keys["trainer.total_epochs"]["type"] == "int"
    assert SCHEMA.keys["actor_rollout_ref.actor.use_dynamic_bsz"]["type"] == "bool"
    for open_ in ("actor_rollout_ref.model.override_config", "actor_rollout_ref.rollout.engine_kwargs",
                  "ray_kwargs.ray_init"):
        assert SCHEMA.sections[open_]["open"], open_
    for closed in ("trainer", "ray_kwargs", "actor_rollout_ref.rollout.val_kwargs", "algorithm.kl_ctrl"):
        assert not SCHEMA.sections[closed]["open"], closed
    assert "grpo" in SCHEMA.enums["algorithm.adv_estimator"]
    assert "vllm" in SCHEMA.enums["actor_rollout_ref.rollout.name"]
    # The dataclass fields behind a section that verl's YAML does not list are keys too, marked.
    sleep = SCHEMA.keys["actor_rollout_ref.rollout.enable_sleep_mode"]
    assert sleep["yaml"] is False and sleep["type"] == "bool" and sleep["default"] is True
    assert "yaml" not in SCHEMA.keys["actor_rollout_ref.rollout.free_cache_engine"]
    assert sum(k.get("yaml") is False for k in SCHEMA.keys.values()) > 150


def test_versions_without_their_own_snapshot():
    same, note = snapshot_for("0.9.7")  # a later patch release: its series' newest snapshot
    assert same is SCHEMA and "nearest" in note
    newest, note = snapshot_for(None)
    assert newest is not None and note == ""
    none, note = snapshot_for("0.8.5")
    assert none is None and "verl_schema_snapshot" in note and "0.9.1" in note


@pytest.mark.parametrize("key,value,expect", [
    ("trainer.total_epochs", 2, None),
    ("+trainer.total_epoch", 2, "did you mean trainer.total_epochs"),
    ("trainer.total_epoch", 2, "did you mean trainer.total_epochs"),
    ("++trainer.total_epoch", 2, "verl never reads it"),
    ("+trainer.total_epochs", 2, "drop the '+'"),
    ("++trainer.total_epochs", 2, None),
    ("actor_rollout_ref.actor.ppo_mini_batch_sise", 2, "did you mean actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("+data.seeed", 1, "did you mean data.seed"),
    ("+actor_rollout_ref.model.override_config.attention_dropout", 0.0, None),
    ("actor_rollout_ref.model.override_config.attention_dropout", 0.0, "add it with '+'"),
    ("+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager", True, None),
    ("+ray_kwargs.ray_init.num_cpus", 8, None),
    ("+ray_kwargs.num_cpus", 8, "verl never reads it"),
    ("+actor_rollout_ref.rollout.val_kwargs.temprature", 0.5, "did you mean"),
    ("algorithm.adv_estimator", "grop", "'grop' is not one verl 0.9.1 knows"),
    ("algorithm.adv_estimator", "grpo", None),
    ("algorithm.adv_estimator", "${oc.env:EST}", None),  # resolved later: verl's checks see it
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "gspo", None),
    ("actor_rollout_ref.actor.loss_agg_mode", "token-avg", "not one verl 0.9.1 knows"),
    ("trainer.total_epochs", "two", "must be a number"),
    ("trainer.total_epochs", True, "must be a number"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 2.5, "must be a whole number"),
    ("actor_rollout_ref.actor.optim.lr", 1, None),  # a whole number for a float is fine
    ("actor_rollout_ref.actor.use_dynamic_bsz", "yes", "must be true or false"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", None, None),  # null: verl's own checks decide
    ("trainer.val_before_train", "false", "must be true or false"),
    ("data.train_files", ["/a.parquet", "/b.parquet"], None),
    ("trainer", 3, "is a section"),
    ("trainer.logger[0]", "console", None),
    # read by verl (RolloutConfig.enable_sleep_mode, verl/workers/config/rollout.py) but not in its YAML
    ("+actor_rollout_ref.rollout.enable_sleep_mode", False, None),
    ("actor_rollout_ref.rollout.enable_sleep_mode", False, "add it with '+'"),
    ("+actor_rollout_ref.rollout.enable_sleep_mode", "no", "must be true or false"),
    ("+actor_rollout_ref.rollout.enable_sleep_mod", False, "did you mean actor_rollout_ref.rollout.enable_sleep_mode"),
])
def test_problem(key, value, expect):
    got = problem(SCHEMA, key, value)
    if expect is None:
        assert got is None, got
    else:
        assert got and expect in got, got


def test_extra_keys_leave_a_forks_keys_to_verl():
    flat = {"+myfork.reward.scale": 2, "+trainer.my_flag": True}
    with pytest.raises(RecipeError) as e:
        verl_schema.check(flat, "0.9.1")
    assert e.value.key == "verl.overrides.myfork.reward.scale" and "verl.extra_keys" in str(e.value)
    line = verl_schema.check(flat, "0.9.1", ["myfork", "trainer.my_flag"])
    assert "verl 0.9.1" in line


def _check(cli, *args, env):
    return cli("check", GSM8K, NO_VERL, *args, env=env)


def test_check_without_verl_finds_a_plus_typo_that_verl_itself_lets_through(cli, clean_env):
    typo = "+verl.overrides.trainer.total_epoch=2"
    proc = _check(cli, typo, env=clean_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err == ("error: command line: verl.overrides.trainer.total_epoch: is not a key of verl 0.9.1's "
                   "config (a '+' adds it, but verl never reads it): did you mean trainer.total_epochs?"), err
    # verl's own checks (composing, validating, building the dataclasses) pass it: the run
    # would keep its default epochs. That is why the snapshot check exists.
    script = Path(verl_schema.__file__).with_name("verl_preflight.py").read_text()
    overrides = verl_args(load(GSM8K).recipe) + ["+trainer.total_epoch=2"]
    own = subprocess.run([sys.executable, "-c", script], input=json.dumps({"points": [overrides]}),
        capture_output=True, text=True, timeout=300, cwd="/")
    verdict = json.loads(own.stdout.strip().splitlines()[-1].split(" ", 1)[1])
    assert verdict["ok"], verdict


def test_check_without_verl_names_a_file_typo_and_an_unknown_value(cli, clean_env, tmp_path):
    recipe = tmp_path / "r.yaml"
    text = GSM8K.read_text()
    assert "algorithm.adv_estimator: grpo" in text
    recipe.write_text(text.replace("algorithm.adv_estimator: grpo", "algorithm.adv_estimator: grop"))
    proc = cli("check", recipe, NO_VERL, env=clean_env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {recipe}: verl.overrides.algorithm.adv_estimator: 'grop'"), proc.stderr
    ok = cli("check", recipe, NO_VERL, "verl.extra_keys=[algorithm.adv_estimator]", env=clean_env)
    assert ok.returncode == 0, ok.stderr
    assert "verl keys   checked against a snapshot of verl 0.9.1's config" in ok.stdout


def test_an_unknown_verl_version_is_checked_by_verl_alone(cli, clean_env):
    proc = _check(cli, "verl.version=0.10.0", "+verl.overrides.trainer.total_epoch=2", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert "verl keys   no snapshot of verl 0.10.0's config" in proc.stdout
