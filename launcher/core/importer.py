"""A verl command line as a recipe: what the launcher owns goes to its fields, the rest to
verl.overrides, in the order given, `+`/`++` kept.

Pure: reads nothing but the current directory's name (relative paths are made absolute from it).
The command line is taken as the script's own shell resolved it; Hydra's own parser reads each
override, so a value means what it meant to verl.
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
        if key in FIELDS:
            fields[FIELDS[key]] = value
            continue
        if key == LOGGER:
            loggers = [value] if isinstance(value, str) else list(value or [])
            continue
        if key == MODE and value == "async":
            said.append(f"{MODE}=async: the launcher always runs verl's async rollout")
            continue
        if PATH_KEYS.search(key) or HUB_OR_PATH.search(key):
            fixed = _absolute(value, cwd, sure=bool(PATH_KEYS.search(key)))
            if fixed != value:
                said.append(f"{key}: {value} is relative; made absolute from {cwd}, as the nodes need it")
                value = fixed
        verl[prefix + key] = value
    recipe = _launcher_fields(fields, loggers, verl, said)
    v = recipe["verl"]
    if config_path:
        v["config_path"] = _absolute(config_path, cwd, sure=True)
    if config_name:
        v["config_name"] = config_name[:-len(".yaml")] if config_name.endswith(".yaml") else config_name
    v["overrides"] = verl
    return Imported(recipe, said)


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
