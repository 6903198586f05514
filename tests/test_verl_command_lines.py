"""verl's own example command lines pass `check` as verl passes them (issue 53): never stricter
than verl, any config name verl ships, the recipe's own loggers kept.

The command lines are tests/data/verl-examples-sample.json, a copy of the team's
shared/reference/verl-examples/sample.json (24 of verl's own `examples/**/*.sh` and recipes at
verl commit 1dda039b, their variables resolved by each script's own shell, each with verl
0.9.1's verdict; how they were taken: that folder's README); each is moved into a recipe as a
user would (launcher.core.importer: nodes, GPUs, project, experiment and loggers in the
launcher's fields, the rest as verl.overrides). verl's own verdicts are taken again here, by
verl's own main() in the node environment (tests/tools/verl_verdicts.py), not read from the file.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import RECIPES, ROOT
from launcher import backends
from launcher.core.importer import from_overrides
from launcher.core.prepare import prepare_each
from launcher.core.recipe import load
from launcher.errors import RecipeError

SAMPLE = ROOT / "tests" / "data" / "verl-examples-sample.json"
LINES = json.loads(SAMPLE.read_text())
NO_VERL = "/usr/bin/python3"  # Debian's interpreter: no verl, as on a login node
SCRIPT_CWD = "/home/user/verl"  # where the scripts ran (README: the repository at /home/user/verl)


def _recipes(tmp_path: Path, python: str) -> list:
    """Each sample line as a recipe file (what `verl-launch import` writes), with PYTHON."""
    paths = []
    for i, line in enumerate(LINES):
        recipe = from_overrides(line["overrides"], line["config_name"], cwd=SCRIPT_CWD).recipe
        recipe["runtime"] = {"python": python}
        path = tmp_path / f"line{i}.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        paths.append(path)
    return paths


def _check_all(paths, environ) -> list:
    """check's verdict on each recipe (None: passes; else its refusal's text), with verl's
    preflight for all of them in one verl process (prepare_each, as a sweep's points)."""
    backend = backends.choose(False)
    verdicts, loaded, where = [None] * len(paths), [], []
    for i, path in enumerate(paths):
        try:
            loaded.append(backend.load(str(path), [], environ))
            where.append(i)
        except RecipeError as e:  # the launcher's own checks, before verl is asked
            verdicts[i] = str(e)
    for i, p in zip(where, prepare_each(loaded, environ)):
        verdicts[i] = "\n".join(map(str, p.problems)) or None
    return verdicts


def _named_by_verl(why: str) -> str:
    """The key verl's own refusal names ("Could not override 'KEY'")."""
    m = re.search(r"override '([^']+)'", why)
    assert m, why
    return m.group(1)


def test_without_verl_check_agrees_with_verls_recorded_verdicts(tmp_path, clean_env):
    """On a login node (no verl): every line verl accepts passes the launcher's own checks, every
    line verl refuses is refused naming the key verl names."""
    verdicts = _check_all(_recipes(tmp_path, NO_VERL), clean_env)
    for line, got in zip(LINES, verdicts):
        verl = line["verl_0_9_1"]
        if verl["verdict"] == "accepted":
            assert got is None, (line["script"], got)
        else:
            assert got and f"verl.overrides.{_named_by_verl(verl['why'])}:" in got, (line["script"], got)
    assert sum(v is None for v in verdicts) == 19 and sum(v is not None for v in verdicts) == 5


def test_check_with_verl_agrees_with_verls_own_verdicts(tmp_path, clean_env, node_python):
    """verl 0.9.1's own main() judges every line again (one verl process for all), then `check`
    with verl importable (its preflight, one verl process for all): the same verdict on each, and a
    refusal names the key verl's own words name."""
    proc = subprocess.run([str(node_python), str(ROOT / "tests" / "tools" / "verl_verdicts.py")],
                          input=json.dumps([{"config_name": x["config_name"], "overrides": x["overrides"]} for x in LINES]),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**clean_env, "VERL_PLATFORM": "cpu", "WANDB_ERROR_REPORTING": "false",
                               "PYTHONPATH": str(ROOT / "tests" / "cpu_platform")})
    marked = [x for x in proc.stdout.splitlines() if x.startswith("@@verdicts ")]
    assert marked, proc.stdout[-2000:] + proc.stderr[-2000:]
    verl = json.loads(marked[-1][len("@@verdicts "):])
    assert [v["verdict"] for v in verl] == [x["verl_0_9_1"]["verdict"] for x in LINES]  # as recorded
    got = _check_all(_recipes(tmp_path, str(node_python)), clean_env)
    for line, mine, theirs in zip(LINES, got, verl):
        if theirs["verdict"] == "refused":
            assert mine and f"verl.overrides.{_named_by_verl(theirs['why'])}:" in mine, (line["script"], mine)
        elif mine is not None:
            # Only what this machine lacks: a file the script's machine has (verl's main() does not open it)
            assert re.fullmatch(rf".*: {SCRIPT_CWD}/\S+ does not exist", mine.splitlines()[-1]), (line["script"], mine)
            assert line["script"] == "recipe/retool/run_qwen2-32b_dapo.sh"


# ----------------------------------------------------------------------------- loggers
@pytest.mark.parametrize("given,enabled,want", [
    (None, True, ["console", "wandb"]),
    (None, False, ["console"]),
    (["console", "tensorboard"], True, ["console", "tensorboard", "wandb"]),
    (["tensorboard", "wandb", "file"], False, ["console", "tensorboard", "file"]),
    ("mlflow", True, ["console", "mlflow", "wandb"]),
    (["console", "wandb"], True, ["console", "wandb"]),
])
def test_the_recipes_own_loggers_are_kept_and_wandb_follows_wandb_enabled(given, enabled, want):
    """trainer.logger as verl gets it: the recipe's loggers in their order, console always (the
    job reads its steps from it), wandb exactly when wandb.enabled."""
    ovs = [f"wandb.enabled={str(enabled).lower()}", "trace.backend=none"]
    if given is not None:
        ovs.append(f"verl.overrides.trainer.logger={json.dumps(given)}")
    args = load(RECIPES / "gsm8k-grpo.yaml", ovs).plan.verl_args
    loggers = [a for a in args if a.startswith("trainer.logger=")]
    assert loggers == [f"trainer.logger=[{','.join(want)}]"], args


# ----------------------------------------------------------------------------- config names
def test_the_config_name_reaches_verls_command_line_first(tmp_path):
    """verl.config_name (and _path) become Hydra's own options, before every override."""
    plan = load(RECIPES / "gsm8k-grpo.yaml", ["verl.config_name=ppo_megatron_trainer",
                                              "verl.config_path=/opt/recipe/config"]).plan
    assert list(plan.verl_args[:2]) == ["--config-path=/opt/recipe/config", "--config-name=ppo_megatron_trainer"]
    assert not any(a.startswith("--config") for a in plan.verl_args[2:])
    assert "not checked: verl.config_path /opt/recipe/config is a config folder of its own" in \
        load(RECIPES / "gsm8k-grpo.yaml", ["verl.config_path=/opt/recipe/config"]).verl_keys


def test_a_megatron_recipe_is_checked_against_megatrons_config(cli, clean_env, node_python, tmp_path):
    """verl's own Megatron example, its engine chosen by --config-name ppo_megatron_trainer
    instead of model_engine=megatron: it passes, by the snapshot and by verl's own composition of
    that config (the preflight). Under ppo_trainer it is refused, naming the key; under a config
    folder of its own (here verl's own, by path) the snapshot says it cannot know, and verl's own
    words refuse it."""
    [line] = [x for x in LINES if x["script"] == "examples/grpo_trainer/run_qwen3_vl_8b_megatron.sh"]
    recipe = from_overrides([o for o in line["overrides"] if o != "model_engine=megatron"], "ppo_megatron_trainer",
                            cwd=SCRIPT_CWD).recipe
    recipe["runtime"] = {"python": str(node_python)}
    path = tmp_path / "megatron.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    ok = cli("check", path, env=clean_env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "as composed for ppo_megatron_trainer" in ok.stdout and re.search(r"verl 0\.9\.1 with .*: composed", ok.stdout)
    bad = cli("check", path, "verl.config_name=ppo_trainer", env=clean_env)
    assert bad.returncode == 2 and "verl.overrides.actor_rollout_ref.actor.megatron.tensor_model_parallel_size:" in bad.stderr
    folder = subprocess.run([str(node_python), "-c", "import os, verl; print(os.path.dirname(verl.__file__))"],
                            capture_output=True, text=True, check=True).stdout.strip() + "/trainer/config"
    other = cli("check", path, "verl.config_name=ppo_trainer", f"verl.config_path={folder}", env=clean_env)
    assert other.returncode == 2, other.stdout + other.stderr
    assert "rejects the overrides (compose): ConfigCompositionException: Could not override " \
           "'actor_rollout_ref.actor.megatron." in other.stderr, other.stderr
