"""verl's keys checked without verl (issue 11): the committed snapshot is what verl itself
gives, and the launcher refuses what verl would refuse, or would silently ignore, naming the
key, before any verl is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, refusal
from launcher.checks import verl_schema
from launcher.errors import RecipeError
from launcher.base.overrides import verl_args
from launcher.core.recipe import load
from launcher.checks.verl_schema import problem, snapshot_for

GSM8K = RECIPES / "gsm8k-grpo.yaml"
NO_VERL = "runtime.python=/usr/bin/python3"  # Debian's interpreter: no verl, as on a login node
SCHEMA, _ = snapshot_for("0.9.1")


@pytest.mark.verl  # reads verl's config
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
    # Keys verl's YAML has inside a free-form section are keys (set without '+').
    assert "ray_kwargs.ray_init.runtime_env.py_executable" in SCHEMA.keys
    # A dataclass field typed as a dict is free-form, whatever its name.
    for open_ in ("actor_rollout_ref.actor.fsdp_config.mixed_precision", "distillation.teacher_models"):
        assert SCHEMA.sections[open_]["open"], open_


def test_snapshot_knows_every_config_name_and_group_option_verl_ships():
    """Every PPO config verl 0.9.1 ships in verl/trainer/config, each option of the groups a
    command line chooses, and each composition of the two, read off verl's own Hydra."""
    assert {"ppo_trainer", "ppo_megatron_trainer"} <= set(SCHEMA.configs)
    for name in ("ppo_trainer", "ppo_megatron_trainer"):
        engine = SCHEMA.configs[name]["groups"]["model_engine"]
        assert engine["options"] == ["dp", "megatron", "torchtitan", "veomni"]
        for option in engine["options"]:
            composed = SCHEMA.composed(name, {"model_engine": option})
            assert composed.keys["model_engine"]["default"] == option
            assert ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in composed.keys) == \
                (option == "megatron"), (name, option)
    assert SCHEMA.configs["ppo_megatron_trainer"]["groups"]["model_engine"]["default"] == "megatron"
    assert SCHEMA.configs["ppo_trainer"]["groups"]["model_engine"]["default"] == "dp"
    assert "veomni" in SCHEMA.composed("ppo_trainer", {"model_engine": "veomni"}).sections["actor_rollout_ref.actor"]["dataclass"].lower() \
        or "actor_rollout_ref.actor.veomni" in SCHEMA.composed("ppo_trainer", {"model_engine": "veomni"}).sections


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
    ("+ray_kwargs.num_cpus", 8, "nothing reads it"),  # a warning: verl runs it (ray_init.num_cpus is read)
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
    # Classes of verl's own example command lines that verl runs (issue 53): never refused.
    # A key verl's YAML has inside a free-form section is set without '+', as Hydra allows.
    ("ray_kwargs.ray_init.runtime_env.py_executable", "uv run --extra vllm", None),
    ("+data.gen_batch_size", 4, None),  # Hydra takes '+' for a key whose value is null
    ("+data.train_files", ["/a.parquet"], None),  # ... or for a list or dict value
    # A dict field of verl's dataclasses (FSDPEngineConfig.mixed_precision, .turbo_config)
    ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype", "bf16", None),
    ("actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype", "bf16", "add it with '+'"),
    ("+actor_rollout_ref.actor.fsdp_config.turbo_config.memory.recompute", True, None),
    ("actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size", 1, None),
    ("+distillation.teacher_models.gsm8k.inference.name", "vllm", None),  # a map of teachers
    ("distillation.teacher_models.teacher_model.model_path", "Qwen/Qwen3-32B", None),
    # a name verl's code reads (the DAPO reward's config.reward.get("reward_kwargs"))
    ("+reward_model.reward_kwargs.overlong_buffer_cfg.enable", True, None),
    # a key verl's code never reads: said, not refused (verl runs it; it does nothing); a key of
    # another verl release is no misspelling (more than 2 edits from any key of its section)
    ("+trainer.use_legacy_worker_impl", "disable", "nothing reads it"),
    ("trainer.use_legacy_worker_impl", "disable", "verl's Hydra would refuse it"),
    ("+algorithm.rollout_correction.rollout_token_veto_threshold", 1.0, "nothing reads it"),
    # a section verl builds as a dataclass fails on a field it lacks (verl: unexpected keyword)
    ("+actor_rollout_ref.actor.policy_loss.tau_pos", 1.0, "is not a field of PolicyLossConfig"),
    # a type from the dataclass behind a section whose YAML has no _target_ (str | float)
    ("algorithm.rollout_correction.rollout_is_threshold", "0.5_4.0", None),
])
def test_problem(key, value, expect):
    got = problem(SCHEMA, key, value)
    if expect is None:
        assert got is None, got
    else:
        assert got and expect in got, got
    # Only a `+key` that nothing in verl names is said rather than refused.
    assert isinstance(got, verl_schema.Note) == (expect == "nothing reads it"), (key, got)


def test_extra_keys_leave_a_forks_keys_to_verl():
    flat = {"+myfork.reward.scale": 2, "+trainer.my_flag": True, "+trainer.total_epoch": 2}
    notes = []
    with pytest.raises(RecipeError) as e:  # a misspelling of verl's key is refused
        verl_schema.check(flat, "0.9.1", note=notes.append)
    assert e.value.key == "verl.overrides.trainer.total_epoch" and "did you mean" in str(e.value)
    assert [n.key for n in notes] == ["verl.overrides.myfork.reward.scale", "verl.overrides.trainer.my_flag"]
    assert all(n.note and "verl.extra_keys" in str(n) for n in notes)
    notes.clear()
    line = verl_schema.check(flat, "0.9.1", ["myfork", "trainer.my_flag", "trainer.total_epoch"], note=notes.append)
    assert "verl 0.9.1" in line and notes == []


MEGATRON_TP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"


def test_the_composition_the_command_line_asks_for_is_the_one_checked():
    """A config name verl ships and the groups the overrides choose (`model_engine`) compose the
    config the keys are checked against, as verl's Hydra composes it."""
    with pytest.raises(RecipeError) as e:  # dp's actor has no megatron section
        verl_schema.check({MEGATRON_TP: 2}, "0.9.1")
    assert e.value.key == f"verl.overrides.{MEGATRON_TP}"
    line = verl_schema.check({"model_engine": "megatron", MEGATRON_TP: 2}, "0.9.1")
    assert "as composed for ppo_trainer model_engine=megatron" in line
    line = verl_schema.check({MEGATRON_TP: 2}, "0.9.1", config_name="ppo_megatron_trainer")
    assert "ppo_megatron_trainer" in line
    line = verl_schema.check({"model_engine": "veomni", "actor_rollout_ref.actor.veomni.fsdp_size": -1}, "0.9.1",
                             config_name="ppo_megatron_trainer.yaml")
    assert "ppo_megatron_trainer model_engine=veomni" in line
    # A key the chosen composition lacks, with verl's nearest keys
    with pytest.raises(RecipeError) as e:
        verl_schema.check({"model_engine": "megatron", "actor_rollout_ref.actor.megatron.grad_offload": True}, "0.9.1")
    assert "did you mean actor_rollout_ref.actor.megatron.param_offload" in str(e.value)
    # An option verl does not ship: refused, naming those it does
    with pytest.raises(RecipeError) as e:
        verl_schema.check({"model_engine": "megatorn"}, "0.9.1")
    assert e.value.key == "verl.overrides.model_engine" and "dp, megatron, torchtitan, veomni" in str(e.value)


@pytest.mark.parametrize("kwargs,flat,why", [
    ({"config_name": "my_trainer"}, {}, "config name 'my_trainer' is not one verl 0.9.1 ships"),
    ({"config_path": "/opt/recipe/config"}, {}, "config folder of its own"),
])
def test_a_composition_the_snapshot_cannot_know_is_not_checked(kwargs, flat, why):
    """Never refused on a guess: the line says why, and verl's preflight decides."""
    line = verl_schema.check({**flat, "trainer.total_epochz": 1}, "0.9.1", **kwargs)
    assert line.startswith("not checked:") and why in line and "preflight" in line


def test_a_group_chosen_by_its_package_leaves_only_that_section_to_verl():
    """actor@actor_rollout_ref.actor=megatron_actor: the actor's keys are verl's to judge, the rest
    are checked as ever."""
    flat = {"actor@actor_rollout_ref.actor": "megatron_actor", "actor_rollout_ref.actor.megatron.grad_offload": True}
    line = verl_schema.check(flat, "0.9.1")
    assert "not checked: the keys under actor_rollout_ref.actor" in line
    with pytest.raises(RecipeError) as e:
        verl_schema.check({**flat, "trainer.total_epochz": 1}, "0.9.1")
    assert e.value.key == "verl.overrides.trainer.total_epochz"


def _check(cli, *args, env):
    return cli("check", GSM8K, NO_VERL, *args, env=env)


@pytest.mark.verl  # verl's own verdict
def test_check_without_verl_finds_a_plus_typo_that_verl_itself_lets_through(cli, clean_env):
    typo = "+verl.overrides.trainer.total_epoch=2"
    proc = _check(cli, typo, env=clean_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = refusal(proc.stderr)
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
