"""Preflight in verl itself (verl 0.9.1, CPU-only, installed by the test extra): misspelt or
invalid verl overrides fail `check` and `submit` with exit 2 and verl's own message, before
anything is queued; the version rules; the trace volume; every shipped recipe passes."""

from __future__ import annotations

import sys

import pytest

from conftest import RECIPES
from launcher import backends
from launcher.checks import preflight
from launcher.core.prepare import prepare_each
from launcher.errors import RecipeError
from launcher.base.overrides import verl_args
from launcher.core.recipe import load
from test_bad_input import _tripwire

pytestmark = pytest.mark.verl  # check's preflight runs verl (the test environment's)

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
    # Calls, not only trajectories: 2 a single-turn trajectory; about 3 a turn with tools.
    assert "about 320 calls and " in proc.stdout and "about 10240 calls and " in every.stdout
    tools = cli("check", RECIPES / "sandbox-tool-agent.yaml", "runtime.python=/usr/bin/python3", env=clean_env)
    assert "about 4 per training step" in tools.stdout and "about 24 calls and " in tools.stdout, tools.stdout
    longer = cli("check", RECIPES / "sandbox-tool-agent.yaml", "runtime.python=/usr/bin/python3",
                 "verl.overrides.actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4", env=clean_env)
    assert "about 48 calls and " in longer.stdout, longer.stdout


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


TOOLS = RECIPES / "gsm8k-tool-agent.yaml"
MT = "verl.overrides.actor_rollout_ref.rollout.multi_turn"
AGENTS = "verl.overrides.actor_rollout_ref.rollout.agent.agent_loop_config_path"


def _tool_cases(tmp):
    (tmp / "bad-tool.yaml").write_text(
        "tools:\n  - class_name: launcher.examples.calculator_tool.NoSuchTool\n"
        "    config: {type: native}\n")
    (tmp / "no-module.yaml").write_text("tools:\n  - class_name: no_such_package.tools.Calc\n    config: {}\n")
    (tmp / "bad-agent.yaml").write_text("- name: mine\n  _target_: no_such_package.loops.MyLoop\n")
    (tmp / "broken_tools.py").write_text("import no_such_module_for_tools\n")
    (tmp / "agents-map.yaml").write_text("mine:\n  _target_: launcher.examples.agent_loop.CheckedAgentLoop\n")
    (tmp / "agents-entry.yaml").write_text("- name: mine\n  _target_: launcher.examples.agent_loop.CheckedAgentLoop\n"
                                           "- launcher.examples.agent_loop.CheckedAgentLoop\n")
    (tmp / "agents-noname.yaml").write_text("- _target_: launcher.examples.agent_loop.CheckedAgentLoop\n")
    (tmp / "agents-twice.yaml").write_text("- name: mine\n  _target_: launcher.examples.agent_loop.CheckedAgentLoop\n"
                                           "- name: mine\n  _target_: verl.experimental.agent_loop.single_turn_agent_loop."
                                           "SingleTurnAgentLoop\n")
    return [  # (override, what the error must name)
        (f"{MT}.max_assistant_turns=0", "multi_turn.max_assistant_turns=0: verl reads 0 as no limit"),
        (f"{MT}.max_assistant_turns=1", "multi_turn.max_assistant_turns=1 with tools"),
        (f"{MT}.tool_config_path={tmp}/missing.yaml", f"multi_turn.tool_config_path: {tmp}/missing.yaml does not exist"),
        (f"{MT}.tool_config_path={tmp}/bad-tool.yaml",
         f"{tmp}/bad-tool.yaml: tool class_name launcher.examples.calculator_tool.NoSuchTool does not import "
         "(ImportError: module launcher.examples.calculator_tool has no NoSuchTool)"),
        (f"{MT}.tool_config_path={tmp}/no-module.yaml",
         "no_such_package.tools.Calc does not import (ModuleNotFoundError: No module named 'no_such_package')"),
        (f"{AGENTS}={tmp}/bad-agent.yaml", f"{tmp}/bad-agent.yaml: agent loop _target_ no_such_package.loops.MyLoop"),
        (f"{AGENTS}={tmp}/agents-map.yaml", f"agent_loop_config_path: {tmp}/agents-map.yaml must be a list of "
         "entries with a name and a _target_ (verl's agent-loop registry), not a mapping"),
        (f"{AGENTS}={tmp}/agents-entry.yaml", f"{tmp}/agents-entry.yaml: entry 2 must be a mapping with a name and "
         "a _target_, not 'launcher.examples.agent_loop.CheckedAgentLoop'"),
        (f"{AGENTS}={tmp}/agents-noname.yaml", f"{tmp}/agents-noname.yaml: entry 1: name must be a non-empty string"),
        (f"{AGENTS}={tmp}/agents-twice.yaml", f"{tmp}/agents-twice.yaml: entry 2: name 'mine' is registered twice "
         "(entries 1 and 2): verl would keep only the last"),
        (f"{MT}.function_tool_path={tmp}/broken_tools.py",
         f"function_tool_path: {tmp}/broken_tools.py does not import (ModuleNotFoundError"),
    ]


def test_what_the_agent_loop_workers_would_import_is_imported_by_check(cli, clean_env, tmp_path):
    # A tool or agent loop that does not import fails in a Ray worker minutes into the job; a
    # turn limit that never lets a tool run, or that verl reads as none, is a recipe's mistake.
    # `check` refuses each, exit 2, naming the key or the file, the class and the error: the first
    # through the CLI, the rest through the same preparation all at once (one verl process, as a
    # sweep's points: each case through the CLI was a verl start of its own, 2 minutes in all).
    (override, text), *rest = _tool_cases(tmp_path)
    proc = cli("check", TOOLS, PY, override, env=clean_env, timeout=300)
    assert proc.returncode == 2, (override, proc.stdout[-500:], proc.stderr)
    assert "verl 0.9.1 rejects the overrides (imports)" in proc.stderr and text in proc.stderr, (override, proc.stderr)
    assert f"{TOOLS}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    backend = backends.choose(False)
    prepared = prepare_each([backend.load(str(TOOLS), [PY, o], clean_env) for o, _ in rest], clean_env)
    for (override, text), p in zip(rest, prepared):
        said = "\n".join(map(str, p.problems))
        assert "verl 0.9.1 rejects the overrides (imports)" in said and text in said, (override, said)
        assert f"{TOOLS}" in said and "Traceback" not in said, said
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "agents-entry.yaml", "agents-map.yaml", "agents-noname.yaml", "agents-twice.yaml", "bad-agent.yaml",
        "bad-tool.yaml", "broken_tools.py", "no-module.yaml"]  # nothing written
    # The shipped tool config imports; a copy of it passes, and once edited to name a class that
    # is not there, fails: the cached verdict follows the file's content, not only its path.
    copy = tmp_path / "tools.yaml"
    copy.write_text((RECIPES / "tools" / "calculator.yaml").read_text())
    for _ in range(2):  # the second time from the cache
        proc = cli("check", TOOLS, PY, f"{MT}.tool_config_path={copy}", env=clean_env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert "(cached: this verl passed these overrides before)" in proc.stdout
    copy.write_text(copy.read_text().replace("CalculatorTool", "CalculatorTol"))
    proc = cli("check", TOOLS, PY, f"{MT}.tool_config_path={copy}", env=clean_env, timeout=300)
    assert proc.returncode == 2 and "CalculatorTol does not import" in proc.stderr, proc.stderr


def test_multi_turn_without_tools_says_what_verl_will_do(cli, clean_env):
    proc = cli("check", TOOLS, PY, f"{MT}.tool_config_path=null", env=clean_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("note")]
    assert len(notes) == 1 and "verl's ToolAgentLoop runs with no tools" in notes[0] \
        and '"Unknown function"' in notes[0], proc.stdout
    proc = cli("check", GSM8K, PY, f"{MT}.enable=true", env=clean_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "rows without an agent_name run single_turn_agent, as without it" in proc.stdout, proc.stdout
    proc = cli("check", TOOLS, PY, env=clean_env, timeout=300)  # tools named: nothing to say
    assert proc.returncode == 0 and "note" not in proc.stdout, proc.stdout


def test_a_row_whose_agent_name_no_loop_has_is_named_at_check(cli, clean_env, tmp_path):
    """verl asserts the name at its first rollout, minutes into the job: check names the file,
    the name and its rows; the data's edit is seen through the preflight's cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "agent_name": ["tool_agent", "tool_agnet", "tool_agnet"]}),
                   data)
    proc = cli("check", TOOLS, PY, f"verl.overrides.data.train_files={data}", env=clean_env, timeout=300)
    assert proc.returncode == 2, proc.stdout[-500:]
    assert (f"data.train_files: {data}: 2 row(s) with agent_name 'tool_agnet': no agent loop of that name is "
            "registered (registered: single_turn_agent, tool_agent): verl would fail at its first rollout") \
        in proc.stderr, proc.stderr
    pq.write_table(pa.table({"prompt": ["a"], "agent_name": ["tool_agent"]}), data)
    proc = cli("check", TOOLS, PY, f"verl.overrides.data.train_files={data}", env=clean_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = cli("check", TOOLS, PY, "verl.overrides.actor_rollout_ref.rollout.agent.default_agent_loop=tools",
               env=clean_env, timeout=300)
    assert proc.returncode == 2 and "actor_rollout_ref.rollout.agent.default_agent_loop='tools': no agent loop" \
        in proc.stderr, proc.stderr


def test_a_note_is_said_again_when_the_verdict_comes_from_the_cache(cli, clean_env):
    for _ in range(2):
        proc = cli("check", GSM8K, PY, f"{MT}.enable=true", env=clean_env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "rows without an agent_name run single_turn_agent, as without it" in proc.stdout, proc.stdout
    assert "(cached: this verl passed these overrides before)" in proc.stdout
