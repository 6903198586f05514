"""Bad recipes and overrides: exit 2, name the key and the file, no traceback, nothing written,
nothing submitted. Every case goes through the real CLI, for both `check` and `submit`."""

from __future__ import annotations

import copy
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

import pytest
import yaml

from conftest import RECIPES, refusal

BASE = yaml.safe_load((RECIPES / "sandbox-demo.yaml").read_text())
CMDLINE = "command line"
VERL = "verl.entrypoint=verl.trainer.main_ppo"  # the demo's payload is a stand-in: verl's keys unchecked


@dataclass
class Case:
    id: str
    key: str  # must appear in stderr
    edit: Optional[Callable[[dict], None]] = None  # tweak of the sandbox-demo recipe
    overrides: List[str] = field(default_factory=list)
    raw: Optional[str] = None  # recipe text written verbatim instead of an edited dict
    name: str = "recipe.yaml"  # the recipe's file name
    create: bool = True  # False: the recipe file does not exist
    where: str = "file"  # "file": the recipe's path in stderr; CMDLINE: "command line"


def _set(path: str, value) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
    return edit


def _pop(path: str) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        del d[last]
    return edit


CASES = [
    Case("malformed-yaml", key="line", raw="job:\n  name: [sandbox-demo\ncluster:\n  nodes: 2\n"),
    Case("malformed-yaml-mapping", key="line", raw="job:\n  name: x\n  oops\n"),
    Case("unknown-top-level-key", key="bogus", edit=_set("bogus", 1)),
    Case("unknown-nested-key", key="cluster.nodez", edit=_set("cluster.nodez", 3)),
    Case("unknown-key-plus-override", key="cluster.foo", overrides=["+cluster.foo=1"], where=CMDLINE),
    Case("unknown-key-plain-override", key="cluster.foo", overrides=["cluster.foo=1"], where=CMDLINE),
    Case("wrong-type", key="cluster.nodes", edit=_set("cluster.nodes", "abc")),
    Case("wrong-type-override", key="cluster.nodes", overrides=["cluster.nodes=abc"], where=CMDLINE),
    Case("zero-nodes", key="cluster.nodes", edit=_set("cluster.nodes", 0)),
    Case("zero-nodes-override", key="cluster.nodes", overrides=["cluster.nodes=0"], where=CMDLINE),
    Case("negative-gpus", key="cluster.gpus_per_node", edit=_set("cluster.gpus_per_node", -1)),
    Case("missing-wandb-project", key="wandb.project", edit=_pop("wandb.project")),
    Case("unknown-trace-backend", key="trace.backend", edit=_set("trace.backend", "zipkin")),
    Case("derived-nnodes", key="verl.overrides.trainer.nnodes",
         edit=_set("verl.overrides", {**BASE["verl"]["overrides"], "trainer.nnodes": 3})),
    Case("derived-nnodes-override", key="verl.overrides.trainer.nnodes",
         overrides=["verl.overrides.trainer.nnodes=3"], where=CMDLINE),
    Case("derived-nnodes-plus-override", key="verl.overrides.trainer.nnodes",
         overrides=["+verl.overrides.trainer.nnodes=3"], where=CMDLINE),
    # trainer.logger keeps the recipe's own loggers (wandb follows wandb.enabled): one verl lacks is refused
    Case("unknown-logger", key="verl.overrides.trainer.logger", overrides=[VERL],
         edit=_set("verl.overrides", {**BASE["verl"]["overrides"], "trainer.logger": ["console", "tensorbaord"]})),
    Case("unknown-logger-override", key="verl.overrides.trainer.logger",
         overrides=[VERL, "+verl.overrides.trainer.logger=[console,tensorbaord]"], where=CMDLINE),
    Case("missing-recipe-file", key="not found", create=False),
    Case("not-yaml", key=".yaml", name="recipe.yml"),
    Case("missing-cluster-profile", key="cluster/nope", edit=_set("defaults", [{"cluster": "nope"}, "_self_"])),
    Case("missing-cluster-profile-override", key="cluster/nope", overrides=["cluster=nope"], where=CMDLINE),
    Case("job-name-space", key="job.name", edit=_set("job.name", "my job")),
    Case("job-name-slash", key="job.name", edit=_set("job.name", "a/b")),
    # A trailing newline once slipped past `^...$` patterns into an #SBATCH line.
    Case("job-name-trailing-newline", key="job.name", edit=_set("job.name", "demo\n")),
    Case("partition-trailing-newline", key="cluster.partition", edit=_set("cluster.partition", "gpu\n")),
    Case("bad-network-interface", key="cluster.network_interface", overrides=["cluster.network_interface='eth0 x'"],
         where=CMDLINE),
    Case("port-range-too-small", key="cluster.port_range", overrides=["cluster.port_range=[30000,30100]"],
         where=CMDLINE),
    Case("wandb-project-slash", key="wandb.project", edit=_set("wandb.project", "team/proj")),
    Case("env-wandb-api-key", key="env.WANDB_API_KEY", edit=_set("env.WANDB_API_KEY", "x" * 40)),
    Case("env-wandb-api-key-override", key="env.WANDB_API_KEY", overrides=["env.WANDB_API_KEY=" + "x" * 40],
         where=CMDLINE),
    Case("bad-time", key="cluster.time", edit=_set("cluster.time", "tomorrow")),
    Case("bad-time-override", key="cluster.time", overrides=["cluster.time=4h"], where=CMDLINE),
    Case("sbatch-arg-space", key="cluster.sbatch_args[0]", edit=_set("cluster.sbatch_args", ["--comment=a b"])),
    Case("sbatch-arg-owned", key="cluster.sbatch_args[0]", edit=_set("cluster.sbatch_args", ["--nodes=3"])),
    Case("relative-api-key-file", key="wandb.api_key_file", edit=_set("wandb.api_key_file", "keys/wandb.key")),
    Case("bad-override-syntax", key="cluster.nodes", overrides=["cluster.nodes=[1"], where=CMDLINE),
    Case("bad-verl-override-syntax", key="verl.overrides.data.x", overrides=["verl.overrides.data.x=[1"],
         where=CMDLINE),
    Case("hydra-key-override", key="hydra", overrides=["hydra.job.name=x"], where=CMDLINE),
    # Found in review: YAML 1.1 reads 4:00:00 as base-60 14400 and `false` as a bool.
    Case("time-base60", key="cluster.time", raw="defaults:\n  - cluster: sandbox\njob: {name: t}\n"
         "wandb: {project: p}\ncluster: {time: 4:00:00}\n"),
    Case("env-bool", key="env.FLAG", edit=_set("env.FLAG", False)),
    Case("env-dict", key="env.A", edit=_set("env.A", {"b": 1})),
    Case("verl-sweep-override", key="verl.overrides.data.seed", overrides=["verl.overrides.data.seed=1,2"],
         where=CMDLINE),
    Case("verl-unwritable-dict-key", key="verl.overrides.data.items",
         edit=_set("verl.overrides", {**BASE["verl"]["overrides"], "data.items": [{"it's": 1}]})),
    Case("sbatch-arg-prefix", key="cluster.sbatch_args[0]", overrides=["cluster.sbatch_args=['--outp=/tmp/x']"],
         where=CMDLINE),
    Case("sbatch-arg-export", key="cluster.sbatch_args[0]", edit=_set("cluster.sbatch_args", ["--export=NONE"])),
    Case("file-error-with-group-override", key="cluster.nodes", edit=_set("cluster.nodes", "two"),
         overrides=["cluster=sunk"]),
    # Requeue resumes from checkpoints: they must exist, and be where a restarted job finds them.
    Case("requeue-without-checkpoint-dir", key="verl.overrides.trainer.default_local_dir",
         edit=lambda d: d["verl"]["overrides"].pop("trainer.default_local_dir"), overrides=["cluster.requeue=true"]),
    Case("requeue-without-save-freq", key="verl.overrides.trainer.save_freq",
         overrides=["cluster.requeue=true", "verl.overrides.trainer.save_freq=-1"], where=CMDLINE),
    Case("requeue-resume-disabled", key="verl.overrides.trainer.resume_mode",
         overrides=["cluster.requeue=true", "verl.overrides.trainer.resume_mode=disable"], where=CMDLINE),
    Case("relative-checkpoint-dir", key="verl.overrides.trainer.default_local_dir",
         overrides=["verl.overrides.trainer.default_local_dir=checkpoints/x"], where=CMDLINE),
    Case("signal-seconds-zero", key="cluster.signal_seconds", overrides=["cluster.signal_seconds=0"],
         where=CMDLINE),
    Case("container-mount-comma", key="container.mounts[0]", overrides=["container.image=/x/y.sqsh",
         "container.mounts=['/a:/b,/c:/d']"], where=CMDLINE),
    Case("container-mount-relative", key="container.mounts[0]", overrides=["container.image=/x/y.sqsh",
         "container.mounts=[data:/data]"], where=CMDLINE),
    Case("container-settings-without-image", key="container.mount_home", overrides=["container.mount_home=false"],
         where=CMDLINE),
    Case("container-image-space", key="container.image", edit=_set("container.image", "my image")),
    Case("container-workdir-relative", key="container.workdir", overrides=["container.image=/x/y.sqsh",
         "container.workdir=work"], where=CMDLINE),
    Case("container-run-dir-not-mounted", key="paths.runs", overrides=["container.image=/x/y.sqsh",
         "container.mounts=[/mnt/data:/mnt/data]", "paths.runs=/tmp/runs"], where=CMDLINE),
    Case("count-as-string", key="verl.overrides.reward.num_workers",
         edit=_set("verl.overrides", {**BASE["verl"]["overrides"], "reward.num_workers": "8"}),
         overrides=["verl.entrypoint=verl.trainer.main_ppo"]),
    Case("sbatch-arg-signal", key="cluster.sbatch_args[0]", edit=_set("cluster.sbatch_args", ["--signal=USR1@60"])),
    # A plain value where a section, mapping or list belongs; a recipe that is a list; a
    # group override's bad value, blamed on the command line.
    Case("cluster-profile-in-body", key="cluster: is a section", raw="defaults:\n  - cluster: sandbox\n  - _self_\n"
         "job: {name: t}\nwandb: {project: p}\ncluster: sunk\n"),
    Case("section-as-value", key="wandb: is a section", edit=_set("wandb", "x")),
    Case("overrides-not-a-mapping", key="verl.overrides: must be a mapping", edit=_set("verl.overrides", 3)),
    Case("setup-not-a-list", key="runtime.setup: must be a list", overrides=['runtime.setup="source x"'],
         where=CMDLINE),
    Case("recipe-is-a-list", key="a recipe is a YAML mapping", raw="- job\n- cluster\n"),
    Case("group-override-value", key="Config group override", overrides=["cluster=4"], where=CMDLINE),
    Case("gpu-type-bad", key="cluster.gpu_type", overrides=["cluster.gpu_type='h100 x'"], where=CMDLINE),
    Case("gpu-type-without-gpus", key="cluster.gpu_type", overrides=["cluster.gpu_type=h100",
                                                                     "cluster.gpus_per_node=0"], where=CMDLINE),
    Case("gres-in-sbatch-args", key="cluster.gpu_type", overrides=["cluster.sbatch_args=['--gres=gpu:h100:8']"],
         where=CMDLINE),
    Case("sweep-override", key="is a sweep", overrides=["cluster.nodes=2,4"], where=CMDLINE),
    Case("no-gpus-for-verl", key="cluster.gpus_per_node", overrides=[VERL, "cluster.gpus_per_node=0"], where=CMDLINE),
    Case("env-secret-name", key="env.HF_TOKEN", overrides=["env.HF_TOKEN=hf_" + "a" * 30], where=CMDLINE),
    Case("env-secret-name-in-file", key="env.OPENAI_API_KEY", edit=_set("env.OPENAI_API_KEY", "sk-" + "b" * 30)),
    Case("env-wandb-project", key="wandb.project", overrides=["env.WANDB_PROJECT=other"], where=CMDLINE),
    Case("signal-after-time-limit", key="cluster.signal_seconds",
         overrides=["cluster.requeue=true", "cluster.time=10", "cluster.signal_seconds=600"], where=CMDLINE),
    # verl's keys, against the snapshot of its config (no verl needed): typos with and without
    # `+`, a `+` for a key verl has, an unknown value, a wrong type, in the file and on the line.
    *[Case(f"verl-{name}", key=key, where=where, edit=edit, overrides=[VERL, *ovs]) for name, key, where, edit, ovs in [
        ("plus-typo", "verl.overrides.trainer.total_epoch", CMDLINE, None, ["+verl.overrides.trainer.total_epoch=2"]),
        ("typo", "verl.overrides.trainer.total_epoch", CMDLINE, None, ["verl.overrides.trainer.total_epoch=2"]),
        ("plus-existing", "verl.overrides.trainer.total_epochs", CMDLINE, None,
         ["+verl.overrides.trainer.total_epochs=2"]),
        ("unknown-estimator", "verl.overrides.algorithm.adv_estimator", CMDLINE, None,
         ["verl.overrides.algorithm.adv_estimator=grop"]),
        ("count-as-text", "verl.overrides.trainer.total_epochs", CMDLINE, None,
         ["verl.overrides.trainer.total_epochs=two"]),
        ("file-typo", "verl.overrides.data.max_prompt_lenght", "file",
         _set("verl.overrides", {**BASE["verl"]["overrides"], "data.max_prompt_lenght": 512}), []),
        ("free-form-without-plus", "verl.overrides.actor_rollout_ref.model.override_config.attention_dropout", "file",
         _set("verl.overrides", {**BASE["verl"]["overrides"],
                                 "actor_rollout_ref.model.override_config": {"attention_dropout": 0.0}}), []),
        # the composition the line asks for: an engine verl does not ship, a key another engine has
        ("unknown-engine", "verl.overrides.model_engine", CMDLINE, None, ["verl.overrides.model_engine=megatorn"]),
        ("key-of-another-engine", "verl.overrides.actor_rollout_ref.actor.megatron.tensor_model_parallel_size", CMDLINE,
         None, ["verl.overrides.actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"]),
        ("dict-field-without-plus", "verl.overrides.actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype",
         CMDLINE, None, ["verl.overrides.actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16"]),
    ]],
    Case("config-name-a-path-out", key="verl.config_name", overrides=["verl.config_name=../x"], where=CMDLINE),
    Case("config-name-spaces", key="verl.config_name", edit=_set("verl.config_name", "ppo trainer")),
    Case("ray-auth-off-without-a-reason", key="cluster.ray_auth_off", overrides=["cluster.ray_auth_off=' '"],
         where=CMDLINE),
    Case("config-path-relative", key="verl.config_path", overrides=["verl.config_path=recipe/config"], where=CMDLINE),
]


def _tripwire(d: Path, env: dict) -> tuple[dict, Path]:
    """A fake `sbatch` first on PATH that leaves a marker if anything calls it."""
    bindir = d / "bin"
    bindir.mkdir(parents=True)
    marker = d / "sbatch-was-called"
    fake = bindir / "sbatch"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > '{marker}'\necho 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return dict(env, PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}"), marker


@pytest.fixture
def sbatch_tripwire(tmp_path, clean_env):
    return _tripwire(tmp_path, clean_env)


def _write_recipe(case: Case, d: Path, runs: Path) -> Path:
    path = d / "recipes" / case.name
    path.parent.mkdir(parents=True)
    if not case.create:
        return path
    if case.raw is not None:
        path.write_text(case.raw)
        return path
    data = copy.deepcopy(BASE)
    data["paths"]["runs"] = str(runs)
    if case.edit:
        case.edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run_rejected(cli, case: Case, command: tuple, d: Path, clean_env: dict) -> str:
    """Run `verl-launch COMMAND` on the case in its own directory ``d`` and check the outcome;
    return the verdict (the last line of stderr, with ``d`` as "<dir>")."""
    env, marker = _tripwire(d, clean_env)
    runs = d / "runs"
    recipe = _write_recipe(case, d, runs)
    proc = cli(command[0], recipe, *case.overrides, *command[1:], env=env, cwd=d)
    err = proc.stderr
    what = f"{' '.join(command)}: exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{err}"
    assert proc.returncode == 2, what
    assert "Traceback" not in err, what
    assert err.startswith("error: "), what
    assert case.key in err, f"stderr does not name {case.key!r}; {what}"
    where = CMDLINE if case.where == CMDLINE else str(recipe)
    assert where in err, f"stderr does not name {where!r}; {what}"
    assert not marker.exists(), f"{command}: sbatch was called"
    assert not runs.exists(), f"{command}: wrote {list(runs.rglob('*'))}"
    # nothing else appeared where it ran (a relative paths.runs would land here)
    assert sorted(p.name for p in d.iterdir()) == ["bin", "recipes"], f"{command}: {list(d.iterdir())}"
    return err.strip().splitlines()[-1].replace(str(d), "<dir>")


COMMANDS = (("check",), ("submit",), ("submit", "--dry-run"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, cli, tmp_path, clean_env):
    # check, submit and submit --dry-run; check's verdict is submit's, word for word
    verdicts = [_run_rejected(cli, case, command, tmp_path / "-".join(command), clean_env) for command in COMMANDS]
    assert len(set(verdicts)) == 1, verdicts
    # the default paths.runs (~/verl-launch/runs) under the test's HOME stays untouched too
    assert not (Path(clean_env["HOME"]) / "verl-launch").exists()


def _several(d: dict) -> None:
    """Problems of two kinds in one recipe: a bad value (the launcher's values), and a container
    that would not see the run's files or the checkpoints (what the job needs of them)."""
    d.setdefault("cluster", {})["nodes"] = 0
    d["container"] = {"image": "nvcr.io/nvidia/pytorch:25.01-py3", "mounts": ["/data:/data"]}
    d.setdefault("verl", {}).setdefault("overrides", {})["trainer.default_local_dir"] = "/elsewhere/ckpt"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_problem_is_said_at_once(command, cli, tmp_path, clean_env):
    """The first problem hides none behind it: one resubmission fixes them all."""
    case = Case("several", key="4 problems", edit=_several, overrides=["wandb.entity=a b"])
    _run_rejected(cli, case, command, tmp_path, clean_env)
    env, _ = _tripwire(tmp_path / "again", clean_env)
    err = cli(command[0], tmp_path / "recipes" / case.name, *case.overrides, *command[1:], env=env).stderr
    recipe = tmp_path / "recipes" / case.name
    said = refusal(err).splitlines()
    assert said[0] == "error: 4 problems, each to fix before it can run:", err
    assert said[1:] == [f"  {recipe}: cluster.nodes: must be at least 1, got 0",
                        "  command line: wandb.entity: 'a b' is not a valid W&B entity (letters, digits, '_' or '-')",
                        f"  {recipe}: paths.runs: {tmp_path / 'runs'} is not inside a container.mounts entry mounted "
                        "at the same path (/data:/data): the container would not see it",
                        f"  {recipe}: verl.overrides.trainer.default_local_dir: /elsewhere/ckpt is not inside a "
                        "container.mounts entry mounted at the same path (/data:/data): the container would not see "
                        "it"], err


def _demo(tmp_path: Path, **wandb) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    d = copy.deepcopy(BASE)
    d["paths"]["runs"] = str(runs)
    d["wandb"].update(wandb)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path, runs


def test_submit_without_key(cli, tmp_path, sbatch_tripwire):
    env, marker = sbatch_tripwire
    env = dict(env)
    del env["WANDB_API_KEY"]
    recipe, runs = _demo(tmp_path)
    proc = cli("submit", recipe, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "WANDB_API_KEY" in proc.stderr
    assert str(recipe) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists() and not runs.exists()


@pytest.mark.parametrize("bad_key", ["short", "not a key but long enough 0123456789", "x" * 39])
def test_submit_with_malformed_key(cli, tmp_path, sbatch_tripwire, bad_key):
    env, marker = sbatch_tripwire
    env = dict(env, WANDB_API_KEY=bad_key)
    recipe, runs = _demo(tmp_path)
    proc = cli("submit", recipe, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "WANDB_API_KEY" in proc.stderr
    assert bad_key not in proc.stderr and bad_key not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert not marker.exists() and not runs.exists()


@pytest.mark.parametrize("what", ["no-key", "malformed-key", "secret-unset", "secret-in-recipe", "valid"])
def test_check_gives_submits_verdict_on_the_environment(what, cli, tmp_path, clean_env):
    """What only the environment decides (the W&B key, declared secrets): `check` exits as
    `submit --dry-run` does, its last line the same error, after showing what would run."""
    env, marker = _tripwire(tmp_path, clean_env)
    overrides = []
    if what == "no-key":
        del env["WANDB_API_KEY"]
    elif what == "malformed-key":
        env["WANDB_API_KEY"] = "short"
    elif what == "secret-unset":
        overrides = ["secrets=[HF_TOKEN]"]
    elif what == "secret-in-recipe":
        env["HF_TOKEN"] = "hf_" + "s3cr3t" * 6
        overrides = ["secrets=[HF_TOKEN]", f"env.OTHER={env['HF_TOKEN']}"]
    recipe, runs = _demo(tmp_path)
    check = cli("check", recipe, *overrides, env=env, cwd=tmp_path)
    dry = cli("submit", recipe, *overrides, "--dry-run", env=env, cwd=tmp_path)
    assert check.returncode == dry.returncode == (0 if what == "valid" else 2), (check.stderr, dry.stderr)
    if what == "valid":
        assert check.stdout.strip().splitlines()[-1] == "ok: submit would queue this job"
    else:
        last = refusal(check.stderr).splitlines()[-1]
        assert last.startswith("error: ") and last == refusal(dry.stderr).splitlines()[-1], (check.stderr, dry.stderr)
        # what would have run is shown before the verdict; not a recipe that holds a secret
        assert ("verl args" in check.stdout) == (what != "secret-in-recipe"), check.stdout
    for secret in (env.get("WANDB_API_KEY"), env.get("HF_TOKEN")):
        assert not secret or secret not in check.stdout + check.stderr + dry.stderr
    assert not marker.exists() and not runs.exists()
