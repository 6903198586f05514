"""`ray job submit [options] -- python3 -m verl...`, verl's own multi-node form, as `import`
reads it: the command after `--` is verl's; the runtime env's `env_vars` (`--runtime-env FILE`,
`--runtime-env-json JSON`) are what verl ran with; every other option is said as not carried,
with why: the job brings up its own Ray on its nodes and starts verl's driver there itself.

Reads one file: the runtime env's YAML (relative to the command line's directory). One that
cannot be read is a RecipeError naming the option (exit 2, nothing written).
"""

from __future__ import annotations

import json
import os
import posixpath
from typing import Dict, List, Tuple

from ..errors import RecipeError

# `ray job submit`'s options that take a value (Ray 2.x's CLI); the rest are flags.
VALUED = {"--address", "--job-id", "--submission-id", "--runtime-env", "--runtime-env-json", "--working-dir",
          "--metadata-json", "--entrypoint-num-cpus", "--entrypoint-num-gpus", "--entrypoint-memory",
          "--entrypoint-resources", "--entrypoint-label-selector", "--verify", "--headers", "--log-style",
          "--log-color"}
_DRIVER = "the job starts verl's driver itself, on its head node, with the job's CPUs (cluster.cpus_per_task)"
WHY = {
    "--address": "the job brings up its own Ray cluster on its Slurm nodes and runs verl there",
    "--no-wait": "`verl-launch submit` returns once Slurm queues the job (--wait, or `logs -f`, follows it)",
    "--working-dir": "the job runs the nodes' own files: the code must be on storage every node sees "
                     "(env PYTHONPATH, or runtime.setup)",
    "--submission-id": "the job's id is Slurm's", "--job-id": "the job's id is Slurm's",
    "--metadata-json": "Ray Jobs' own record; the run's record is the run directory",
    "--entrypoint-num-cpus": _DRIVER, "--entrypoint-num-gpus": _DRIVER, "--entrypoint-memory": _DRIVER,
    "--entrypoint-resources": _DRIVER, "--entrypoint-label-selector": _DRIVER,
}
# A runtime env's other fields, by what they would have done.
ENV_FIELDS = {
    "working_dir": WHY["--working-dir"], "py_modules": WHY["--working-dir"], "excludes": WHY["--working-dir"],
    "pip": "the nodes run runtime.python's environment as it is: install them there (or in container.image)",
}
for _f in ("uv", "conda", "container", "image_uri"):
    ENV_FIELDS[_f] = ENV_FIELDS["pip"]


def strip_ray_submit(args: List[str], where: str, cwd: str) -> Tuple[List[str], Dict[str, str], List[str]]:
    """ARGS: what follows `ray job submit`. Returns the command after `--` (or after the options),
    the runtime env's env_vars, and what is not carried, each with why."""
    said: List[str] = []
    env: Dict[str, str] = {}
    i = 0
    while i < len(args) and args[i] != "--" and args[i].startswith("-"):
        name, eq, value = args[i].partition("=")
        if name in VALUED and not eq:
            if i + 1 >= len(args):
                raise RecipeError(f"{name} needs a value (ray job submit)", where=where, key=name)
            value, i = args[i + 1], i + 1
        if name in ("--runtime-env", "--runtime-env-json"):
            env.update(_env_vars(name, value, cwd, where, said))
        else:
            shown = f"{name} {value}" if (eq or name in VALUED) else name
            said.append(f"{shown}: {WHY.get(name, 'a Ray Jobs option: ' + _DRIVER)}")
        i += 1
    if i < len(args) and args[i] == "--":
        i += 1
    if i >= len(args):
        raise RecipeError("`ray job submit` with no command: give verl's after `--` (ray job submit ... -- python3 -m "
                          "verl.trainer.main_ppo ...)", where=where, key="--")
    return args[i:], env, said


def _env_vars(name: str, value: str, cwd: str, where: str, said: List[str]) -> Dict[str, str]:
    """The runtime env's env_vars, each as a string; its other fields said as not carried."""
    if name == "--runtime-env":
        import yaml

        path = posixpath.join(cwd, os.path.expanduser(value))
        try:
            with open(path, encoding="utf-8") as f:
                runtime_env = yaml.safe_load(f)
        except OSError as e:
            raise RecipeError(f"cannot read the runtime env {path} ({e.strerror}): give the file that `ray job "
                              "submit` read, or run `import` from the directory it ran in", where=where,
                              key=name) from None
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise RecipeError(f"the runtime env {path} is not YAML Ray could read: {str(e).splitlines()[0]}",
                              where=where, key=name) from None
        shown = path
    else:
        try:
            runtime_env = json.loads(value)
        except ValueError as e:
            raise RecipeError(f"not JSON Ray could read: {e}", where=where, key=name) from None
        shown = "the JSON"
    if runtime_env is None:
        runtime_env = {}
    if not isinstance(runtime_env, dict):
        raise RecipeError(f"the runtime env ({shown}) must be a mapping (env_vars:, working_dir:, ...), got "
                          f"{type(runtime_env).__name__}", where=where, key=name)
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(isinstance(k, str) for k in env_vars):
        raise RecipeError(f"the runtime env's env_vars ({shown}) must map names to values", where=where,
                          key=f"{name}: env_vars")
    for field, v in runtime_env.items():
        if field != "env_vars":
            said.append(f"{name} {field}: "
                        + ENV_FIELDS.get(field, "a Ray runtime env field the job has no use for: it starts "
                                                "verl's driver itself"))
    return {k: ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v)) for k, v in env_vars.items()}
