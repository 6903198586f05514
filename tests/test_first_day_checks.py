"""What a first day with the launcher runs into, through the real CLI: a fraction for a whole
number, a trainer of its own built on verl's config, a misspelt launcher key or recipe file,
the version rule's line, and a recipe command typed without a recipe. None needs Slurm."""

from __future__ import annotations

import json

import pytest

from conftest import RECIPES, refusal

from launcher.checks.verl_schema import FRACTIONAL_OK, snapshot_for, whole_number_key
from launcher.checks.verl_schema import NULL_DEFAULT_COUNTS

DEMO = RECIPES / "sandbox-demo.yaml"
GSM8K = RECIPES / "gsm8k-grpo.yaml"
NO_VERL = "runtime.python=/nonexistent/python"  # verl's own checks (preflight) skipped: launcher's only
VERL_EP = "verl.entrypoint=verl.trainer.main_ppo"
DAPO = "verl.entrypoint=recipe.dapo.main_dapo"  # verl's own recipes: ppo_trainer's config plus keys of their own


def _error(proc) -> str:
    """The refusal as said, without the line after it that names what it kept from being checked
    (launcher.core.recipe.UNCHECKED: verl's own checks, the prior, Slurm), which must be there."""
    from launcher.core.recipe import UNCHECKED

    said = proc.stderr.strip().splitlines()
    assert said[-1] == f"not checked: {UNCHECKED}", proc.stderr
    return "\n".join(said[:-1])


# ----------------------------------------------------------------------------- 1. whole numbers
@pytest.mark.parametrize("override,shown", [
    ("verl.overrides.trainer.total_epochs=2.5", "2.5"),  # verl: range(2.5) fails after the queue wait
    ("verl.overrides.trainer.total_epochs=2.0", "2.0"),
    ("verl.overrides.data.train_batch_size=64.5", "64.5"),
    ("verl.overrides.trainer.test_freq=0.5", "0.5"),
    ("verl.overrides.actor_rollout_ref.actor.ppo_mini_batch_size=3.5", "3.5"),  # a dataclass int
])
@pytest.mark.parametrize("command", ["check", "submit"])
def test_a_fraction_for_a_whole_number_verl_key_is_refused(cli, clean_env, tmp_path, command, override, shown):
    extra = ["--dry-run"] if command == "submit" else []
    proc = cli(command, GSM8K, NO_VERL, override, f"paths.runs={tmp_path / 'runs'}", *extra, env=clean_env)
    key = override.split("=")[0]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _error(proc) == f"error: command line: {key}: must be a whole number, got {shown}", proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_fraction_in_the_recipe_file_names_the_file(cli, clean_env, tmp_path):
    text = GSM8K.read_text().replace("total_epochs: 15", "total_epochs: 2.5")
    assert "total_epochs: 2.5" in text, "gsm8k-grpo.yaml no longer sets total_epochs: 15"
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(text)
    (tmp_path / "cluster").symlink_to(RECIPES / "cluster")
    proc = cli("check", recipe, NO_VERL, env=clean_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {recipe}: verl.overrides.trainer.total_epochs: must be a whole number, got 2.5" in proc.stderr


@pytest.mark.parametrize("override", [
    "verl.overrides.trainer.total_epochs=-1",  # whole, if odd: verl's own checks decide
    "verl.overrides.trainer.test_freq=-1",  # verl's "never" sentinel
    "verl.overrides.data.train_max_samples=null",  # null: always verl's to judge
    "verl.overrides.actor_rollout_ref.nccl_timeout=600.5",  # seconds: verl takes a float
    "verl.overrides.trainer.esi_redundant_time=2.5",
    "verl.overrides.trainer.v1.colocate_async.num_warmup_batches=0.5",  # `int | float` in verl
    "verl.overrides.actor_rollout_ref.rollout.gpu_memory_utilization=0.45",  # a float key
    "verl.overrides.actor_rollout_ref.model.lora.alpha=16.5",
])
def test_keys_verl_takes_as_any_number_or_null_still_pass(cli, clean_env, override):
    proc = cli("check", GSM8K, NO_VERL, override, env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_only_int_keys_are_held_to_whole_numbers():
    schema, _ = snapshot_for("0.9.1")
    whole = {k for k, spec in schema.keys.items() if whole_number_key(k, spec)}
    assert {"trainer.total_epochs", "trainer.save_freq", "data.train_batch_size"} <= whole
    assert all(schema.keys[k]["type"] == "int" for k in whole)
    # the exceptions name keys that exist, and each is an int-defaulted key of verl's
    for name in FRACTIONAL_OK:
        found = [k for k, s in schema.keys.items() if k.rpartition(".")[2] == name and s["type"] == "int"]
        assert found and not any(k in whole for k in found if schema.keys[k]["from"] == "default"), name



@pytest.mark.parametrize("override,shown", [
    ("verl.overrides.trainer.total_training_steps=2.5", "2.5"),  # null by default: verl's step limit
    ("verl.overrides.trainer.max_actor_ckpt_to_keep=1.5", "1.5"),  # verl: isinstance(.., int) or keep all
    ("verl.overrides.data.gen_batch_size=64.0", "64.0"),
    ("verl.overrides.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0.5", "0.5"),
    ("verl.overrides.actor_rollout_ref.rollout.disaggregation.decode_tensor_model_parallel_size=1.5", "1.5"),
    ("verl.overrides.reward_model.rollout.tensor_model_parallel_size=2.5", "2.5"),  # the legacy section
])
def test_a_fraction_for_a_null_defaulted_count_is_refused(cli, clean_env, override, shown):
    proc = cli("check", GSM8K, NO_VERL, override, env=clean_env)
    key = override.split("=")[0]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _error(proc) == f"error: command line: {key}: must be a whole number, got {shown}", proc.stderr


@pytest.mark.parametrize("override", [
    "verl.overrides.trainer.total_training_steps=3",
    "verl.overrides.trainer.total_training_steps=null",
    "verl.overrides.trainer.max_critic_ckpt_to_keep=-1",
    "verl.overrides.data.seed=42",
    "verl.overrides.algorithm.rollout_correction.rollout_rs_threshold=0.5",  # null-defaulted, not a count
])
def test_null_defaulted_counts_take_whole_numbers_and_null(cli, clean_env, override):
    proc = cli("check", GSM8K, NO_VERL, override, env=clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_null_defaulted_counts_name_untyped_null_keys_of_the_snapshot():
    schema, _ = snapshot_for("0.9.1")
    for key in NULL_DEFAULT_COUNTS:  # a typo, or a key the snapshot types itself, fails here
        assert key in schema.keys, key
        assert schema.keys[key]["default"] is None and schema.keys[key]["type"] == "any", (key, schema.keys[key])
    # the legacy reward keys: migrate_legacy_reward_impl copies each into an int field of reward.*
    legacy = {"reward_model.num_workers": "reward.num_workers", "sandbox_fusion.": "reward.sandbox_fusion.",
              "reward_model.rollout.": "reward.reward_model.rollout.", "reward_model.": "reward.reward_model."}
    for key in NULL_DEFAULT_COUNTS:
        old = next((o for o in legacy if key.startswith(o)), None)
        if old:
            new = legacy[old] + key[len(old):]
            assert schema.keys[new]["type"] == "int", (key, new)


def test_requeue_says_save_freq_must_be_whole(cli, clean_env):
    proc = cli("check", DEMO, "cluster.requeue=true", "verl.overrides.trainer.default_local_dir=/tmp/ck",
               "verl.overrides.trainer.save_freq=2.5", env=clean_env)
    assert proc.returncode == 2
    assert _error(proc) == ("error: command line: verl.overrides.trainer.save_freq: must be a whole number "
                                   "of steps, got 2.5"), proc.stderr


@pytest.mark.parametrize("override,shown", [
    ("cluster.nodes=2.5", "2.5"), ("cluster.cpus_per_task=1.5", "1.5"), ("wandb.reach_timeout=2.5", "2.5"),
    ("cluster.nodes=two", "'two'"),
])
def test_the_launchers_own_whole_numbers(cli, clean_env, override, shown):
    proc = cli("check", DEMO, override, env=clean_env)
    key = override.split("=")[0]
    assert proc.returncode == 2
    assert _error(proc) == f"error: command line: {key}: must be a whole number, got {shown}", proc.stderr


# ----------------------------------------------------------------------------- 2. other entrypoints
def test_a_verl_recipe_module_gets_its_verl_key_typos_as_warnings(cli, clean_env, tmp_path):
    proc = cli("submit", GSM8K, NO_VERL, DAPO, "verl.overrides.trainer.totl_epochs=2",
               "+verl.overrides.dapo_own.x=1",  # outside verl's sections: the trainer's own
               "+verl.overrides.data.gen_batch_size=512",  # DAPO's own key under verl's data section
               "--dry-run", "--json", f"paths.runs={tmp_path / 'runs'}", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dry_run"]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, proc.stderr  # `+data.gen_batch_size`: Hydra takes '+' on verl's null key
    assert ("warning: command line: verl.overrides.trainer.totl_epochs: is not a key of verl 0.9.1's config "
            "(verl's Hydra would refuse it): did you mean trainer.total_epochs? (not refused: the entrypoint "
            "recipe.dapo.main_dapo is not verl's own") in warnings[0]
    assert "dapo_own" not in proc.stderr


def test_check_says_how_a_verl_recipe_modules_keys_were_checked(cli, clean_env):
    proc = cli("check", GSM8K, NO_VERL, DAPO, "verl.overrides.trainer.total_epochs=2.5",
               "verl.extra_keys=[data.gen_batch_size]", "+verl.overrides.data.gen_batch_size=512", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("verl keys"))
    assert ("entrypoint recipe.dapo.main_dapo is not verl's own: checked as warnings only, against a snapshot of "
            "verl 0.9.1's config: 1 warning(s) (on stderr)") in line, line
    assert proc.stderr.count("warning: ") == 1 and "must be a whole number, got 2.5" in proc.stderr


def test_the_same_typo_is_refused_for_verls_own_entrypoint(cli, clean_env):
    proc = cli("check", GSM8K, NO_VERL, VERL_EP, "verl.overrides.trainer.totl_epochs=2", env=clean_env)
    assert proc.returncode == 2 and "did you mean trainer.total_epochs?" in proc.stderr


def test_the_launchers_stand_in_says_it_is_not_checked(cli, clean_env):
    proc = cli("check", DEMO, "+verl.overrides.trainer.totl_epochs=2", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert ("verl keys   not checked: entrypoint launcher.demo_payload is the launcher's own stand-in, "
            "not a verl trainer") in proc.stdout
    assert "warning" not in proc.stderr


def test_the_python_api_warns_too(clean_env, tmp_path, capfd):
    import launcher

    req = launcher.dryrun(str(GSM8K), [NO_VERL, DAPO, "verl.overrides.trainer.totl_epochs=2"],
                          check=False, environ=clean_env)
    assert len(req.warnings) == 1 and "trainer.totl_epochs" in req.warnings[0]
    assert "did you mean trainer.total_epochs?" in capfd.readouterr().err


# ----------------------------------------------------------------------------- 3. did you mean
@pytest.mark.parametrize("override,hint", [
    ("cluster.node=2", "cluster.nodes"),
    ("wandb.projet=x", "wandb.project"),
    ("clustr.nodes=2", "cluster"),
    ("trace.backnd=none", "trace.backend"),
])
def test_a_misspelt_launcher_key_gets_a_suggestion(cli, clean_env, override, hint):
    proc = cli("check", DEMO, override, env=clean_env)
    assert proc.returncode == 2
    assert refusal(proc.stderr).endswith(f": did you mean {hint}?"), proc.stderr
    assert proc.stderr.startswith(f"error: command line: {override.split('=')[0].split('.')[0]}"), proc.stderr


def test_a_misspelt_key_in_the_file_names_the_file(cli, clean_env, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("job: {name: x}\nwandb: {project: p}\ncluster:\n  node: 2\n"
                      "verl: {entrypoint: launcher.demo_payload}\n")
    proc = cli("check", recipe, env=clean_env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {recipe}: cluster.node: unknown key")
    assert refusal(proc.stderr).endswith("did you mean cluster.nodes?")


@pytest.mark.parametrize("command", ["check", "submit", "render"])
def test_a_misspelt_recipe_file_gets_a_suggestion(cli, clean_env, command):
    proc = cli(command, "recipes/gsm8k-grop.yaml", env=clean_env, cwd=RECIPES.parent)
    assert proc.returncode == 2
    assert _error(proc) == ("error: recipes/gsm8k-grop.yaml: recipe file not found: did you mean "
                                   "recipes/gsm8k-grpo.yaml?"), proc.stderr


def test_a_recipe_name_without_its_folder_finds_the_shipped_one(cli, clean_env):
    proc = cli("check", "sandbox-demo.yaml", env=clean_env, cwd=RECIPES.parent)
    assert proc.returncode == 2
    assert refusal(proc.stderr).endswith("did you mean recipes/sandbox-demo.yaml?"), proc.stderr


def test_nothing_near_no_suggestion(cli, clean_env, tmp_path):
    proc = cli("check", tmp_path / "qqqq.yaml", env=clean_env)
    assert proc.returncode == 2 and _error(proc) == f"error: {tmp_path / 'qqqq.yaml'}: recipe file not found"


# ----------------------------------------------------------------------------- 4. the version rule
def test_the_version_rule_is_said_in_plain_words(cli, clean_env):
    from launcher.base.verl_versions import RULES

    proc = cli("check", GSM8K, NO_VERL, env=clean_env)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("trainer "))
    assert "rollout traces, which verl 0.9's default V1 trainer does not" in line, line
    assert line.endswith("set trace.backend=none to use the V1 trainer"), line
    assert RULES[0].line == ("trainer     verl's legacy trainer (trainer.use_v1=false): it records rollout traces, "
                             "which verl 0.9's default V1 trainer does not; set trace.backend=none to use the "
                             "V1 trainer")
    off = cli("check", GSM8K, NO_VERL, "trace.backend=none", env=clean_env)
    assert off.returncode == 0 and "rollout traces" not in off.stdout


def test_a_contradicted_rule_says_where_it_is_chosen(cli, clean_env):
    proc = cli("check", GSM8K, NO_VERL, "verl.overrides.trainer.use_v1=true", env=clean_env)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: command line: verl.overrides.trainer.use_v1: contradicts the "
                                          "launcher's derived value false, set from trace.backend: verl's legacy")
    assert refusal(proc.stderr).endswith("set trace.backend=none to use the V1 trainer"), proc.stderr


# ----------------------------------------------------------------------------- 5. no recipe given
@pytest.mark.parametrize("args", [["submit"], ["check"], ["render"], ["submit", "--dry-run"], ["check", "-m"]])
def test_a_recipe_command_without_a_recipe_says_what_to_type(cli, clean_env, args):
    proc = cli(*args, env=clean_env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"usage: verl-launch {args[0]} "), proc.stderr
    assert proc.stderr.strip().endswith(f"verl-launch {args[0]}: error: give a recipe file, e.g. "
                                        f"verl-launch {args[0]} recipes/sandbox-demo.yaml"), proc.stderr
    assert "required" not in proc.stderr and not proc.stdout
