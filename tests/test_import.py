"""`verl-launch import` (issue 54): a verl command line becomes a recipe, which `check` takes
exactly when verl takes the command line, and which passes verl the same overrides, in the same
order, plus only the launcher's own.

The command lines are verl's own (tests/data/verl-examples-sample.json, see
tests/test_verl_command_lines.py), as the scripts' shells gave them."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import ROOT
from launcher import api
from launcher.base.overrides import derived
from launcher.core.importer import FIELDS
from launcher.errors import RecipeError

LINES = json.loads((ROOT / "tests" / "data" / "verl-examples-sample.json").read_text())
NO_VERL = "/usr/bin/python3"  # Debian's interpreter: no verl, as on a login node
CWD = "/home/user/verl"  # where the scripts ran
PARSER = OverridesParser.create()


def _argv(line, python=NO_VERL) -> list:
    name = ["--config-name", line["config_name"]] if line["config_name"] else []
    return [python, "-m", "verl.trainer.main_ppo", *name, *line["overrides"]]


def _parsed(overrides) -> list:
    """(key as written, prefix included, value) of each override, as verl's Hydra reads it; a key
    given twice counts where it was given last, with that value (what Hydra ends up with)."""
    out = []
    for o in PARSER.parse_overrides(list(overrides)):
        prefix = "++" if o.input_line.startswith("++") else "+" if o.input_line.startswith("+") else ""
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        out = [(k, v) for k, v in out if k.lstrip("+") != key] + [(prefix + key, o.value())]
    return out


@pytest.mark.parametrize("line", LINES, ids=[x["script"] for x in LINES])
def test_each_verl_example_imports_as_verl_judges_it_and_round_trips(line, tmp_path, clean_env):
    """verl accepts it: imported, and `check` (here without verl) passes the recipe; its verl
    command line is the original's overrides, in order, with only the launcher's own added (and
    the keys the launcher owns carried by its fields, with the same values). verl refuses it:
    refused, naming the key verl's own words name, nothing written."""
    out = tmp_path / "imported.yaml"
    verdict = line["verl_0_9_1"]
    if verdict["verdict"] == "refused":
        with pytest.raises(RecipeError) as e:
            api.import_command(_argv(line), out, cwd=CWD, environ=clean_env)
        key = re.search(r"override '([^']+)'", verdict["why"]).group(1)
        assert f"verl.overrides.{key}:" in str(e.value)
        assert not out.exists()
        return
    done = api.import_command(_argv(line), out, cwd=CWD, environ=clean_env)
    assert done.report.refusal is None, done.report.lines
    text = out.read_text()
    assert text.startswith("# Imported by `verl-launch import`") and text.index("cluster:") < text.index("verl:")
    loaded = api.load(str(out), environ=clean_env)
    args = list(loaded.plan.verl_args)
    options = [a for a in args if a.startswith("--config")]
    assert options == ([f"--config-name={line['config_name'].removesuffix('.yaml')}"] if line["config_name"] else [])
    got = _parsed(a for a in args if not a.startswith("--config"))
    own = set(derived(loaded.recipe))
    given = _parsed(line["overrides"])
    # Every override the launcher does not own reaches verl as given, in the same order.
    theirs = [(k, v) for k, v in given if k.lstrip("+") not in own and k.lstrip("+") not in FIELDS]
    assert [(k, v) for k, v in got if k.lstrip("+") not in own] == [(k, _abs(k, v)) for k, v in theirs]
    # What the launcher owns, it sets to the command line's value (the loggers: kept, wandb as given).
    mine = dict((k.lstrip("+"), v) for k, v in got if k.lstrip("+") in own)
    for k, v in given:
        plain = k.lstrip("+")
        if plain in FIELDS or plain == "actor_rollout_ref.rollout.mode":
            assert mine[plain] == v, (plain, mine[plain], v)
        elif plain == "trainer.logger":
            want = [v] if isinstance(v, str) else v
            assert [x for x in mine[plain] if x != "console"] == [x for x in want if x != "console"]


def _abs(key: str, value):
    """What import makes of a relative path (made absolute from where the script ran)."""
    from launcher.core.importer import HUB_OR_PATH, PATH_KEYS, _absolute

    sure = bool(PATH_KEYS.search(key.lstrip("+")))
    return _absolute(value, CWD, sure) if sure or HUB_OR_PATH.search(key.lstrip("+")) else value


def _import(tmp_path, clean_env, *overrides, runner=(NO_VERL,), name="r.yaml"):
    out = tmp_path / name
    done = api.import_command([*runner, "-m", "verl.trainer.main_ppo", *overrides], out, cwd=str(tmp_path),
                              environ=clean_env)
    return done, yaml.safe_load(out.read_text())


BASE = ["actor_rollout_ref.rollout.name=vllm", "trainer.project_name=p", "trainer.experiment_name=my run"]


def test_what_the_launcher_owns_goes_to_its_fields(tmp_path, clean_env):
    done, r = _import(tmp_path, clean_env, *BASE, "trainer.nnodes=4", "trainer.n_gpus_per_node=8",
                      "trainer.logger=[console,tensorboard,wandb]", "actor_rollout_ref.rollout.trace.backend=weave",
                      "actor_rollout_ref.rollout.trace.token2text=False", "trainer.default_local_dir=ckpt/run1",
                      "data.train_files=[./a.parquet,/data/b.parquet]", "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
                      "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
                      "++trainer.total_epochs=3", "actor_rollout_ref.rollout.mode=async")
    assert r["job"] == {"name": "my-run"}
    assert (r["cluster"]["nodes"], r["cluster"]["gpus_per_node"]) == (4, 8)
    assert r["cluster"]["cpus_per_task"] == 3 * 8  # verl's legacy trainer (tracing): 3 per GPU bundle
    assert r["wandb"] == {"enabled": True, "project": "p", "experiment": "my run"}
    assert r["trace"] == {"token2text": False, "backend": "weave"}
    ov = r["verl"]["overrides"]
    assert ov["trainer.logger"] == ["console", "tensorboard"]  # wandb follows wandb.enabled
    assert ov["trainer.default_local_dir"] == f"{tmp_path}/ckpt/run1"
    assert ov["data.train_files"] == [f"{tmp_path}/a.parquet", "/data/b.parquet"]
    assert ov["actor_rollout_ref.model.path"] == "Qwen/Qwen3-8B"  # a hub name, not a path
    assert ov["+actor_rollout_ref.model.override_config.attention_dropout"] == 0.1 and ov["++trainer.total_epochs"] == 3
    assert "actor_rollout_ref.rollout.mode" not in ov and "trainer.nnodes" not in ov
    assert r["runtime"] == {"python": NO_VERL}
    said = "\n".join(done.said)
    assert "trainer.nnodes=4 -> cluster.nodes" in said and "ckpt/run1 is relative" in said
    assert "tensorboard kept" in said


def test_a_megatron_config_name_and_an_engine_choice(tmp_path, clean_env):
    tp = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"
    _, r = _import(tmp_path, clean_env, "--config-name", "ppo_megatron_trainer.yaml", *BASE, tp)
    assert r["verl"]["config_name"] == "ppo_megatron_trainer"
    _, r = _import(tmp_path, clean_env, *BASE, "model_engine=veomni", "actor_rollout_ref.actor.veomni.fsdp_size=-1",
                   name="veomni.yaml")
    assert r["verl"]["overrides"]["model_engine"] == "veomni" and "config_name" not in r["verl"]


def test_a_uv_run_line_says_what_runs_it(tmp_path, clean_env):
    done, r = _import(tmp_path, clean_env, *BASE, runner=("uv", "run", "--extra", "vllm", "python3"))
    assert "runtime" not in r
    assert any(s.startswith("runtime.python: uv run --extra vllm python3 ran it here") for s in done.said)


# verl's multi-node guide: `ray job submit --address=... --runtime-env=verl/trainer/runtime_env.yaml
# --no-wait -- python3 -m verl.trainer.main_ppo ...`; the runtime env as verl's own file has it
# (working_dir, excludes, env_vars, pip), with a secret beside.
RUNTIME_ENV = """working_dir: ./
excludes: ["/.git/"]
env_vars:
  TORCH_NCCL_AVOID_RECORD_STREAMS: "1"
  VLLM_USE_V1: 1
  HF_TOKEN: hf_notarealtokenbutlongenough
pip:
  - "peft"
"""


def test_verls_ray_job_submit_form_takes_the_interpreter_after_the_dashes_and_the_runtime_envs_variables(
        tmp_path, clean_env, cli):
    (tmp_path / "verl" / "trainer").mkdir(parents=True)
    (tmp_path / "verl" / "trainer" / "runtime_env.yaml").write_text(RUNTIME_ENV)
    argv = ["RAY_ADDRESS=http://10.0.0.1:8265", "ray", "job", "submit", "--address=http://10.0.0.1:8265",
            "--runtime-env=verl/trainer/runtime_env.yaml", "--no-wait", "--entrypoint-num-cpus", "2", "--",
            "PYTHONUNBUFFERED=1", NO_VERL, "-m", "verl.trainer.main_ppo", *BASE]
    proc = cli("import", "-o", tmp_path / "r.yaml", "--", *argv, env=clean_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "r.yaml").read_text()
    r = yaml.safe_load(text)
    assert r["runtime"] == {"python": NO_VERL}  # what follows `--`, not the whole prefix
    assert r["env"] == {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "VLLM_USE_V1": "1", "PYTHONUNBUFFERED": "1"}
    assert r["verl"]["overrides"] == {"actor_rollout_ref.rollout.name": "vllm"}
    dropped = {ln.split()[2].rstrip(":"): ln for ln in proc.stdout.splitlines() if ln.startswith("not carried ")}
    assert set(dropped) == {"RAY_ADDRESS=http://10.0.0.1:8265", "--address", "--no-wait", "--entrypoint-num-cpus",
                            "--runtime-env", "env.HF_TOKEN"}, proc.stdout
    assert "its own Ray cluster" in dropped["--address"] and "List HF_TOKEN in `secrets`" in dropped["env.HF_TOKEN"]
    for field in ("working_dir", "excludes", "pip"):
        assert re.search(rf"^not carried --runtime-env {field}: ", proc.stdout, re.M), proc.stdout
    assert "hf_notarealtoken" not in text + proc.stdout + proc.stderr  # a secret is never written nor said
    assert "ran it here" not in proc.stdout


def test_a_runtime_env_as_json_and_assignments_before_python_go_to_env(tmp_path, clean_env):
    done, r = _import(tmp_path, clean_env, *BASE, runner=(
        "ray", "job", "submit", "--runtime-env-json", '{"env_vars": {"NCCL_DEBUG": "WARN", "WANDB_PROJECT": "x"}}',
        "--", NO_VERL))
    assert r["env"] == {"NCCL_DEBUG": "WARN"} and r["runtime"] == {"python": NO_VERL}
    assert any(d.startswith("env.WANDB_PROJECT: cannot be set in a recipe (set by the job from wandb.project")
               for d in done.dropped), done.dropped
    _, r = _import(tmp_path, clean_env, *BASE, runner=("env", "HYDRA_FULL_ERROR=1", NO_VERL), name="b.yaml")
    assert r["env"] == {"HYDRA_FULL_ERROR": "1"} and r["runtime"] == {"python": NO_VERL}


@pytest.mark.parametrize("option,content,says", [
    ("--runtime-env=missing.yaml", None, "cannot read the runtime env"),
    ("--runtime-env=env.yaml", "env_vars: [unclosed", "is not YAML Ray could read"),
    ("--runtime-env=env.yaml", "- a list", "must be a mapping"),
    ("--runtime-env=env.yaml", "env_vars: [A, B]", "must map names to values"),
    ("--runtime-env-json={'env_vars': 1}", None, "not JSON Ray could read"),
])
def test_a_runtime_env_that_cannot_be_read_is_exit_2_naming_it(option, content, says, tmp_path, clean_env, cli):
    if content is not None:
        (tmp_path / "env.yaml").write_text(content)
    out = tmp_path / "r.yaml"
    proc = cli("import", "-o", out, "--", "ray", "job", "submit", option, "--", NO_VERL, "-m", "verl.trainer.main_ppo",
               *BASE, env=clean_env, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr and option.split("=")[0] in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_logging_off_without_wandb_and_tracing_follows(tmp_path, clean_env):
    _, r = _import(tmp_path, clean_env, *BASE, "trainer.logger=console")
    assert r["wandb"]["enabled"] is False and r["trace"]["backend"] == "none"


@pytest.mark.parametrize("argv,where,says", [
    (["bash", "run.sh"], "command", "is not a verl command line"),
    (["python3", "-m", "torch.distributed.run", "a=1"], "-m", "not a verl entrypoint"),
    (["python3", "-m", "verl.trainer.main_ppo", "data.train_files=[a,b"], "data.train_files", "not a Hydra override"),
    (["python3", "-m", "verl.trainer.main_ppo", "--multirun", "a=1,2"], "--multirun", "not a Hydra override"),
    (["python3", "-m", "verl.trainer.main_ppo", "trainer.total_epochs=1,2"], "trainer.total_epochs", "a sweep"),
    (["python3", "-m", "verl.trainer.main_ppo", "data.val_batch_size=${data.train_batch_size}"], "data.val_batch_size",
     "holds an interpolation"),
])
def test_bad_command_lines_are_exit_2_naming_the_argument_and_write_nothing(argv, where, says, tmp_path, clean_env, cli):
    out = tmp_path / "r.yaml"
    proc = cli("import", "-o", out, "--", *argv, env=clean_env)
    assert proc.returncode == 2 and says in proc.stderr and where in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_an_existing_recipe_is_replaced_only_with_force(tmp_path, clean_env, cli):
    out = tmp_path / "r.yaml"
    out.write_text("mine\n")
    argv = ["--", NO_VERL, "-m", "verl.trainer.main_ppo", *BASE]
    proc = cli("import", "-o", out, *argv, env=clean_env)
    assert proc.returncode == 2 and "--force" in proc.stderr and out.read_text() == "mine\n"
    proc = cli("import", "-o", out, "--force", *argv, env=clean_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^mapped +trainer.project_name=p -> wandb.project", proc.stdout, re.M)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("ok: submit would queue this job")
    # a recipe check refuses is not written, and one that was there stays as it was
    before = out.read_text()
    proc = cli("import", "-o", out, "--force", *argv, "trainer.total_epoch=2", env=clean_env)
    assert proc.returncode == 2 and "did you mean trainer.total_epochs" in proc.stderr
    assert out.read_text() == before


def test_the_imported_recipe_checks_from_any_folder(tmp_path, clean_env, cli):
    _import(tmp_path, clean_env, *BASE)
    other = tmp_path / "elsewhere"
    other.mkdir()
    proc = cli("check", tmp_path / "r.yaml", env=clean_env, cwd=other)
    assert proc.returncode == 0, proc.stderr
