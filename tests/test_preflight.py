"""Preflight in verl itself (verl 0.9.1, CPU-only, installed by the test extra): misspelt or
invalid verl overrides fail `check` and `submit` with exit 2 and verl's own message, before
anything is queued; the version rules; the trace volume; every shipped recipe passes."""

from __future__ import annotations

import sys

import pytest

from conftest import RECIPES
from launcher import preflight
from launcher.errors import RecipeError
from launcher.overrides import verl_args
from launcher.recipe import load
from test_bad_input import _tripwire

GSM8K = RECIPES / "gsm8k-grpo.yaml"
PY = f"runtime.python={sys.executable}"  # the interpreter with verl: the job's, here

# (override, a piece of verl's own message). verl refuses each; the launcher's snapshot check
# refuses the typos, wrong types and unknown values first, so verl.extra_keys lets them through
# to verl here (as for a fork's own keys): verl's checks stay the second line.
REFUSED = [
    ("trainer.total_epoch=3", "Key 'total_epoch' is not in struct"),
    ("data.max_prompt_lenght=512", "Could not override 'data.max_prompt_lenght'"),
    ("actor_rollout_ref.rollout.temperatur=0.7", "Could not override 'actor_rollout_ref.rollout.temperatur'"),
    # `+` gets past Hydra; only the dataclasses the workers build refuse it.
    ("+actor_rollout_ref.rollout.bogus=1", "unexpected keyword argument 'bogus'"),
    ("+actor_rollout_ref.actor.bogus=1", "unexpected keyword argument 'bogus'"),
    ("+actor_rollout_ref.rollout.trace.bogus=1", "TraceConfig"),
    ("data.train_batch_size=1000", "must be divisible by minimal possible batch size"),
    ("data.train_batch_size=abc", "TypeError"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=2048", "must be >= actor.ppo_mini_batch_size"),
    ("actor_rollout_ref.actor.loss_agg_mode=foo", "Invalid loss_agg_mode: foo"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size=8", "You have set both"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=8", "You have set both"),
]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+")


def _cli_args(*overrides, extra=None) -> list:
    return [PY, *(f"verl.overrides.{o}" if not o.startswith("+") else f"+verl.overrides.{o[1:]}" for o in overrides),
            *([f"verl.extra_keys=[{extra}]"] if extra else [])]


def _check(cli, env, *overrides, extra=None):
    return cli("check", GSM8K, *_cli_args(*overrides, extra=extra), env=env, timeout=300)


def test_misspelt_or_invalid_verl_overrides_fail_check_with_verls_message(cli, clean_env):
    # Every case through verl itself, in one verl process (as a sweep's points are checked)...
    recipes = [load(GSM8K, _cli_args(case, extra=_key(case))).recipe for case, _ in REFUSED]
    for (override, text), res in zip(REFUSED, preflight.run_many(recipes, clean_env)):
        assert isinstance(res, RecipeError), (override, res)
        assert "verl 0.9.1 rejects the overrides" in str(res) and text in str(res), (override, str(res))
    # ...and through the CLI for two of them (Hydra's stage; the dataclasses' stage): exit 2, verl's words
    for override, text in (REFUSED[0], REFUSED[3]):
        proc = _check(cli, clean_env, override, extra=_key(override))
        assert proc.returncode == 2, (override, proc.stdout[-500:], proc.stderr)
        assert "verl 0.9.1 rejects the overrides" in proc.stderr and text in proc.stderr, (override, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_submit_runs_the_preflight_first_and_queues_nothing(cli, clean_env, tmp_path):
    env, marker = _tripwire(tmp_path, clean_env)
    proc = cli("submit", GSM8K, PY, "verl.overrides.data.train_batch_size=1000", f"paths.runs={tmp_path / 'runs'}",
               env=env, timeout=300)
    assert proc.returncode == 2 and "must be divisible by minimal possible batch size" in proc.stderr
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_verls_ok_is_cached_for_the_same_verl_and_overrides(cli, clean_env, tmp_path):
    """check, then submit of the same recipe: verl is imported once. Another override list is
    checked afresh, and a rejection leaves no entry."""
    env, marker = _tripwire(tmp_path, clean_env)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    cache = tmp_path / "cache" / "verl-launch" / "preflight"
    first = cli("check", GSM8K, PY, env=env, timeout=300)
    assert first.returncode == 0 and "preflight   ok: verl 0.9.1" in first.stdout, first.stderr
    assert "(cached" not in first.stdout and len(list(cache.glob("*.json"))) == 1
    again = cli("submit", GSM8K, PY, "--dry-run", env=env, timeout=300)
    assert again.returncode == 0 and "composed, validated, dataclasses built (cached" in again.stderr, again.stderr
    other = cli("check", GSM8K, PY, "verl.overrides.trainer.total_epochs=2", env=env, timeout=300)
    assert other.returncode == 0 and "(cached" not in other.stdout
    assert len(list(cache.glob("*.json"))) == 2
    bad = cli("check", GSM8K, PY, "verl.overrides.data.train_batch_size=1000", env=env, timeout=300)
    assert bad.returncode == 2 and len(list(cache.glob("*.json"))) == 2
    for entry in cache.glob("*.json"):  # verl's version and a few resolved values, no override
        assert "total_epochs" not in entry.read_text() and env["WANDB_API_KEY"] not in entry.read_text()
    assert not marker.exists()


def test_every_shipped_recipe_passes_check(cli, clean_env, monkeypatch):
    monkeypatch.setenv("HOME", clean_env["HOME"])  # recipes read ${oc.env:HOME}: as the CLI below will
    shipped = sorted(RECIPES.glob("*.yaml"))
    # verl's verdicts for all of them in one verl process; `check` then finds them in its cache
    verdicts = preflight.run_many([load(r, [PY]).recipe for r in shipped], clean_env)
    assert not [v for v in verdicts if isinstance(v, RecipeError)], verdicts
    for recipe in shipped:
        proc = cli("check", recipe, PY, env=clean_env, timeout=300)
        assert proc.returncode == 0, (recipe.name, proc.stderr)
        if load(recipe).recipe.verl.entrypoint.startswith("verl."):
            assert "preflight   ok: verl 0.9.1" in proc.stdout and "(cached" in proc.stdout, (recipe.name, proc.stdout)
        else:  # the sandbox demo's stand-in payload is not verl
            assert "preflight   skipped" in proc.stdout


def test_a_recipe_for_another_verl_series_is_refused(cli, clean_env):
    proc = cli("check", GSM8K, PY, "verl.version=0.8.5", env=clean_env, timeout=300)
    assert proc.returncode == 2 and "verl.version" in proc.stderr and "0.9.1" in proc.stderr


def test_without_verl_check_says_so_and_runs_the_launchers_own_checks(cli, clean_env):
    proc = cli("check", GSM8K, "runtime.python=/usr/bin/python3", env=clean_env)  # Debian's: no verl
    assert proc.returncode == 0, proc.stderr
    assert "verl is not importable with /usr/bin/python3" in proc.stdout
    assert "launcher checks only" in proc.stdout
    bad = cli("check", GSM8K, "runtime.python=/usr/bin/python3", "cluster.cpus_per_task=2", env=clean_env)
    assert bad.returncode == 2 and "cluster.cpus_per_task" in bad.stderr and "verl#7398" in bad.stderr


# ----------------------------------------------------------------------------- version rules
def _args(*overrides):
    return verl_args(load(GSM8K, list(overrides)).recipe)


def test_version_rules_follow_the_targeted_verl():
    assert "trainer.use_v1=false" in _args()  # 0.9.x and tracing on: the legacy trainer traces
    assert "trainer.use_v1=false" in _args("verl.version=0.9.0")
    assert not any(a.startswith("trainer.use_v1") for a in _args("verl.version=0.8.5"))  # no such key
    assert not any(a.startswith("trainer.use_v1") for a in _args("trace.backend=none"))


def test_check_says_why_it_turns_the_v1_trainer_off(cli, clean_env):
    proc = cli("check", GSM8K, "runtime.python=/usr/bin/python3", env=clean_env)
    assert "trainer     verl's legacy trainer (trainer.use_v1=false): it records rollout traces, which verl 0.9's " \
        "default V1 trainer does not; set trace.backend=none to use the V1 trainer" in proc.stdout, proc.stdout
    assert proc.stdout.count("\ntrainer ") == 1, proc.stdout  # said once, where the rule chose it


def test_trace_volume_is_printed_and_warned_about(cli, clean_env):
    # 4 samples x 8 agent-loop workers x rollout.n 5
    proc = cli("check", GSM8K, "runtime.python=/usr/bin/python3", env=clean_env)
    assert "about 160 per training step" in proc.stdout and "WARNING" not in proc.stdout
    every = cli("check", GSM8K, "runtime.python=/usr/bin/python3", "trace.max_samples_per_step_per_worker=null",
                env=clean_env)  # every sample: 1024 x 5
    assert "about 5120 per training step" in every.stdout and "above trace.warn_traces_per_step=2000" in every.stdout


@pytest.mark.parametrize("override,key", [
    ("trace.backend=zipkin", "trace.backend"),
    ("wandb.enabled=false", "trace.backend"),  # Weave traces without W&B
    ("~verl.overrides.actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.name"),
    ("verl.overrides.trainer.default_local_dir=ckpt", "trainer.default_local_dir"),
    ("cluster.cpus_per_task=1", "cluster.cpus_per_task"),
])
def test_the_launchers_trap_checks(cli, clean_env, override, key):
    proc = cli("check", GSM8K, "runtime.python=/usr/bin/python3", override, env=clean_env)
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr
