"""A verl command line as a recipe: what the launcher owns goes to its fields, the rest to
verl.overrides, in the order given, `+`/`++` kept.

Pure but for two reads: the current directory's name (relative paths are made absolute from
it) and verl's defaults in the launcher's snapshot of verl's config (a project, a node count the
command line leaves to verl). The command line is taken as the script's own shell resolved it;
Hydra's own parser reads each override, so a value means what it meant to verl.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..base.overrides import LOGGER, TRACE
from ..errors import RecipeError

# verl keys the launcher owns: key -> the recipe field it becomes.
FIELDS = {
    "trainer.nnodes": "cluster.nodes",
    "trainer.n_gpus_per_node": "cluster.gpus_per_node",
    "trainer.project_name": "wandb.project",
    "trainer.experiment_name": "wandb.experiment",
    f"{TRACE}.backend": "trace.backend",
    f"{TRACE}.token2text": "trace.token2text",
    f"{TRACE}.max_samples_per_step_per_worker": "trace.max_samples_per_step_per_worker",
}
MODE = "actor_rollout_ref.rollout.mode"
# Keys whose value is a path verl opens on the nodes: a relative one is made absolute from the
# current directory (the job's directory is not the script's). A model or tokenizer "path" may
# be a hub name (Qwen/Qwen3-8B): only one written ./ or ../ is a path for sure.
PATH_KEYS = re.compile(r"(^|\.)(default_local_dir|train_files|val_files|tool_config_path|function_tool_path|"
                       r"agent_loop_config_path|save_path|custom_reward_function\.path|custom_cls\.path|"
                       r"resume_from_path|default_hdfs_dir)$")
HUB_OR_PATH = re.compile(r"(^|\.)(model\.path|tokenizer_path|model_path)$")


@dataclass
class Imported:
    recipe: Dict[str, Any]  # the recipe, launcher fields first
    said: List[str] = field(default_factory=list)  # what was mapped, and why
    dropped: List[str] = field(default_factory=list)  # what was not carried, and why


@dataclass
class Command:
    """A verl command line as the shell gave it: what runs it, the module, Hydra's options, the overrides."""
    runner: List[str]  # what came before `-m` (python3, or `uv run ... python`)
    module: str
    overrides: List[str]
    config_name: Optional[str] = None
    config_path: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)  # what it sets for verl: VAR=value, a Ray runtime env's env_vars
    dropped: List[str] = field(default_factory=list)  # what of the line is not carried, and why


_PYTHON = re.compile(r"(.*/)?python[0-9.]*$")
_OPTIONS = {"--config-name": "config_name", "-cn": "config_name", "--config-path": "config_path", "-cp": "config_path"}
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def parse_command(argv: List[str], where: str = "command line", cwd: Optional[str] = None) -> Command:
    """ARGV: `python3 -m verl.trainer.main_ppo [--config-name N] [--config-path P] override...`, also
    after `uv run ...`, VAR=value assignments, or `ray job submit [options] --` (verl's multi-node
    form: its runtime env's env_vars are read, from CWD); a module of verl's (verl.*) or of its
    recipes (recipe.*). Anything else is a RecipeError naming the argument."""
    from .ray_submit import strip_ray_submit

    env: Dict[str, str] = {}
    said: List[str] = []
    argv, ray_env = _assignments(list(argv))
    if argv[:1] and posixpath.basename(argv[0]) == "ray" and argv[1:3] == ["job", "submit"]:
        said += [f"{k}={v if not _secret(k) else '...'}: it set `ray job submit`'s own environment, not the job's"
                 for k, v in ray_env.items()]
        argv, env, more = strip_ray_submit(argv[3:], where, cwd or os.getcwd())
        said += more
        argv, assigned = _assignments(argv)
        env.update(assigned)
    else:
        env = ray_env
    cmd = _parse_python(argv, where)
    cmd.env, cmd.dropped = env, said
    return cmd


def _assignments(argv: List[str]):
    """The VAR=value words before a command (`env` first too), and the command."""
    env: Dict[str, str] = {}
    i = 1 if argv[:1] == ["env"] else 0
    while i < len(argv) and _ASSIGN.fullmatch(argv[i]) and "-m" in argv[i + 1:]:
        k, v = _ASSIGN.fullmatch(argv[i]).groups()
        env[k] = v
        i += 1
    return (argv[i:], env) if env or i == 0 else (argv, env)


def _secret(name: str) -> bool:
    from ..checks.secrets import SECRET_NAME

    return bool(SECRET_NAME.search(name))


def _parse_python(argv: List[str], where: str) -> Command:
    if "-m" not in argv or argv.index("-m") + 1 >= len(argv):
        shown = " ".join(argv[:3]) or "(nothing)"
        raise RecipeError(f"{shown!r} is not a verl command line: give `python3 -m verl.trainer.main_ppo ...` "
                          "after `--`", where=where, key="command")
    at = argv.index("-m")
    runner, module = argv[:at], argv[at + 1]
    if not runner or not _PYTHON.fullmatch(runner[-1]):
        raise RecipeError(f"{' '.join(runner) or '-m'!r}: `-m` must follow a Python interpreter (python3 -m ...)",
                          where=where, key="command")
    if not re.fullmatch(r"(verl|recipe)(\.\w+)+", module):
        raise RecipeError(f"-m {module}: not a verl entrypoint (verl.trainer.main_ppo, another verl.* module, or a "
                          "verl recipe's recipe.*)", where=where, key="-m")
    cmd = Command(runner=runner, module=module, overrides=[])
    rest = argv[at + 2:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if name in _OPTIONS:
            if not eq:
                if i + 1 >= len(rest):
                    raise RecipeError(f"{arg} needs a value", where=where, key=arg)
                value, i = rest[i + 1], i + 1
            setattr(cmd, _OPTIONS[name], value)
        elif arg.startswith("-") and not arg.startswith("--config"):
            raise RecipeError(f"{arg}: not a Hydra override nor --config-name/--config-path (the launcher runs one "
                              "job of one config: a sweep is `verl-launch submit -m`)", where=where, key=arg)
        elif arg.startswith("--config"):
            raise RecipeError(f"{arg}: Hydra's options here are --config-name and --config-path", where=where, key=arg)
        else:
            cmd.overrides.append(arg)
        i += 1
    return cmd


def _prefix(line: str) -> str:
    return "++" if line.startswith("++") else ("+" if line.startswith("+") else "")


def _absolute(value: Any, cwd: str, sure: bool) -> Any:
    def one(v):
        if not isinstance(v, str) or not v or "://" in v or v.startswith(("/", "~", "$")):
            return v
        if sure or v.startswith(("./", "../")):
            return posixpath.normpath(posixpath.join(cwd, v))
        return v
    return [one(v) for v in value] if isinstance(value, list) else one(value)


def from_overrides(overrides: List[str], config_name: Optional[str] = None, config_path: Optional[str] = None,
                   cwd: Optional[str] = None, where: str = "command line") -> Imported:
    """The recipe for a verl command line: its Hydra OVERRIDES (as the shell gave them), its
    --config-name and --config-path. A bad override is a RecipeError naming it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    cwd = cwd or os.getcwd()
    parser = OverridesParser.create()
    fields: Dict[str, Any] = {}
    verl: Dict[str, Any] = {}
    said: List[str] = []
    loggers: Optional[list] = None
    for line in overrides:
        try:
            o = parser.parse_override(line)
        except HydraException as e:
            raise RecipeError(f"{line!r} is not a Hydra override verl could read: {str(e).splitlines()[0]}",
                              where=where, key=line.split("=", 1)[0]) from None
        key, prefix = o.key_or_group, _prefix(line)
        if o.is_delete() or o.is_sweep_override():
            raise RecipeError(f"{line!r}: a deletion or a sweep is not one run's setting; "
                              "take it out, or sweep the recipe with -m", where=where, key=key)
        value = o.value()
        if "${" in repr(value):  # the recipe resolves ${...} itself (against the recipe), not verl's config
            raise RecipeError(f"{line!r} holds an interpolation, which a recipe would resolve against itself, not "
                              "verl's config: write its value (the script's shell may)", where=where, key=key)
        if key in FIELDS:
            fields[FIELDS[key]] = value
            said.append(f"{key}={line.split('=', 1)[1]} -> {FIELDS[key]} (the launcher sets it on verl's command line)")
            continue
        if key == LOGGER:
            loggers = [value] if isinstance(value, str) else list(value or [])
            said.append(f"{LOGGER}={line.split('=', 1)[1]} -> wandb.enabled: {str('wandb' in loggers).lower()}")
            continue
        if key == MODE and value == "async":
            said.append(f"{MODE}=async: the launcher always runs verl's async rollout")
            continue
        if PATH_KEYS.search(key) or HUB_OR_PATH.search(key):
            fixed = _absolute(value, cwd, sure=bool(PATH_KEYS.search(key)))
            if fixed != value:
                said.append(f"{key}: {value} is relative; made absolute from {cwd}, as the nodes need it")
                value = fixed
        for seen in [k for k in verl if k.lstrip("+") == key]:  # Hydra takes the last: so does the recipe
            said.append(f"{key}: given again; the last, {line.split('=', 1)[1]}, as verl's Hydra takes it")
            del verl[seen]
        verl[prefix + key] = value
    recipe = _launcher_fields(fields, loggers, verl, said)
    v = recipe["verl"]
    if config_path:
        v["config_path"] = _absolute(config_path, cwd, sure=True)
    if config_name:
        v["config_name"] = config_name[:-len(".yaml")] if config_name.endswith(".yaml") else config_name
    v["overrides"] = verl
    return Imported(recipe, said)


def from_command(cmd: Command, cwd: Optional[str] = None, where: str = "command line") -> Imported:
    """The recipe for a parsed verl command line (parse_command), what runs it included."""
    from ..checks.fields import env_problems

    imported = from_overrides(cmd.overrides, cmd.config_name, cmd.config_path, cwd, where)
    r = imported.recipe
    imported.dropped += cmd.dropped
    for k, v in cmd.env.items():
        why = env_problems(k, v)
        if why:  # a secret's value is never written, nor said
            imported.dropped.append(f"env.{k}: {why[0]}")
        else:
            r.setdefault("env", {})[k] = v
            imported.said.append(f"env.{k}: {v}, as the command line set it for verl")
    if cmd.module != "verl.trainer.main_ppo":
        r["verl"] = {"entrypoint": cmd.module, **r["verl"]}
    python = cmd.runner[-1]
    if len(cmd.runner) > 1:
        imported.said.append(f"runtime.python: {' '.join(cmd.runner)} ran it here; give the nodes' interpreter "
                             "(runtime.python=/path/to/venv/bin/python) or the lines that set it up (runtime.setup)")
    elif python.startswith("/"):
        r["runtime"] = {"python": python}
        imported.said.append(f"runtime.python: {python}, as the command line ran it (the nodes need it at that path)")
    return imported


HEADER = """\
# Imported by `verl-launch import` from a command line of {module} with {count} override(s),
# run in {cwd}. The launcher's own fields come first (nodes, GPUs, W&B, tracing); everything
# else is verl's, in verl.overrides, as the command line gave it. `verl-launch check` this file.
"""


def to_yaml(imported: Imported, cmd: Command, cwd: str) -> str:
    """The recipe's text: a comment on where it came from, then the recipe, fields in order."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):  # a multi-line or odd string stays one quoted scalar
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if "\n" in value else None)

    Dumper.add_representer(str, text)
    order = ("job", "cluster", "runtime", "env", "wandb", "trace", "verl")
    recipe = {k: imported.recipe[k] for k in (*order, *imported.recipe) if k in imported.recipe}
    body = yaml.dump(recipe, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=1000,
                     allow_unicode=True)
    shown = cwd if cwd.isprintable() else repr(cwd)
    return HEADER.format(module=cmd.module, count=len(cmd.overrides), cwd=shown) + body


def _launcher_fields(fields: Dict[str, Any], loggers: Optional[list], verl: Dict[str, Any], said: List[str]) -> dict:
    experiment = fields.get("wandb.experiment")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(experiment or "verl-run")).strip("-.") or "verl-run"
    wandb: Dict[str, Any] = {}
    if loggers is not None:
        wandb["enabled"] = "wandb" in loggers
        rest = [x for x in loggers if x not in ("console", "wandb")]
        if rest:
            verl[LOGGER] = ["console", *rest]
            said.append(f"{LOGGER}: {', '.join(rest)} kept beside console; wandb follows wandb.enabled")
    for k in ("project", "experiment"):
        if f"wandb.{k}" in fields:
            wandb[k] = fields[f"wandb.{k}"]
    trace = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("trace.")}
    backend = trace.get("backend")
    trace["backend"] = "none" if backend in (None, "null") else backend
    if backend is None:
        said.append("trace.backend: none, as verl's own default (the command line sets no trace backend); "
                    "trace.backend=weave traces every rollout to Weave")
    if verl.get("trainer.use_v1") in (True, "true", "True") and trace["backend"] != "none":
        trace["backend"] = "none"
        said.append("trace.backend: none, because trainer.use_v1=true: verl's V1 trainer records no traces")
    if wandb.get("enabled", True) and "project" not in wandb:  # verl's own default, as verl would log to
        wandb["project"] = _verl_default("trainer.project_name")
        said.append(f"wandb.project: {wandb['project']}, verl's default (the command line names none)")
    if not wandb.get("enabled", True) and trace["backend"] == "weave":
        wandb["enabled"] = True
        said.append("wandb.enabled: true, because Weave traces live in a W&B project")
    cluster = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("cluster.")}
    cluster.setdefault("nodes", _verl_default("trainer.nnodes"))
    cluster.setdefault("gpus_per_node", _verl_default("trainer.n_gpus_per_node"))
    need = _cpus(cluster, verl, trace["backend"])
    if need is not None:
        cluster["cpus_per_task"] = need.per_node
        said.append(f"cluster.cpus_per_task: {need.per_node}, as {need.explain()} (give more if the nodes have them)")
    return {"job": {"name": name}, "cluster": cluster, "wandb": wandb, "trace": trace, "verl": {}}


def _verl_default(key: str) -> Any:
    from ..checks.verl_schema import snapshot_for

    schema, _ = snapshot_for(None)
    return schema.keys[key]["default"] if schema is not None and key in schema.keys else None


def _cpus(cluster: dict, verl: Dict[str, Any], backend: str):
    """What verl's Ray actors hold per node (checks.verl_resources), None if the counts are not
    whole numbers (check names them)."""
    from ..checks.verl_resources import cpu_need

    plain = {k.lstrip("+"): v for k, v in verl.items()}
    if backend != "none":  # tracing runs verl's legacy trainer (base.verl_versions)
        plain["trainer.use_v1"] = False
    nodes, gpus = cluster["nodes"], cluster["gpus_per_node"]
    counts = [nodes, gpus, *(plain.get(k) for k in ("transfer_queue.backend.SimpleStorage.num_data_storage_units",))]
    if not all(c is None or (isinstance(c, int) and not isinstance(c, bool)) for c in counts) or not nodes:
        return None
    return cpu_need(nodes, gpus, plain, None)
