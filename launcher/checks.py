"""The launcher's own checks for known traps in the verl settings a recipe produces.

Each one catches a mistake that would otherwise cost a queue wait and a failed or useless
run; verl's own validation (issue 4's preflight) runs separately, in verl itself.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Dict, Optional

from .errors import RecipeError
from .overrides import derived, flatten
from .recipe import Recipe
from .verl_resources import DEFAULTS, STORAGE_UNITS, cpu_need

CKPT_DIR = "trainer.default_local_dir"
ROLLOUT_NAMES = ("vllm", "sglang", "trtllm")
# Counts the resource model reads: whole numbers, or verl would fail later anyway.
COUNTS = ("actor_rollout_ref.rollout.agent.num_workers", "reward.num_workers", STORAGE_UNITS)


def is_verl(r: Recipe) -> bool:
    """The entrypoint is verl's own (a stand-in such as the sandbox demo skips verl's rules)."""
    return r.verl.entrypoint.split(".")[0] == "verl"


def whole(x: Any) -> bool:
    """A whole number as YAML or Hydra gives one (a bool is not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def count(v: Dict[str, Any], key: str, blame=lambda key: "recipe") -> int:
    """A verl count from the overrides (else verl's default), which must be a whole number."""
    value = v.get(key, DEFAULTS[key])
    if value is None:
        return 0
    if not whole(value):
        raise RecipeError(f"must be a whole number, got {value!r}", where=blame(f"verl.overrides.{key}"),
                          key=f"verl.overrides.{key}")
    return value


def verl_settings(r: Recipe, blame=lambda key: "recipe") -> Dict[str, Any]:
    """The recipe's verl overrides by plain dotted key (no + prefixes)."""
    return {k.lstrip("+"): v for k, v in flatten(r.verl.overrides, blame).items()}


def effective(r: Recipe, resolved: Optional[Dict[str, Any]] = None, blame=lambda key: "recipe") -> Dict[str, Any]:
    """verl's values as the job will pass them: the recipe's overrides, then the derived ones
    (trainer.use_v1 with tracing...), then what verl itself resolved, where the preflight ran."""
    v = verl_settings(r, blame)
    v.update({k: d[0] for k, d in derived(r).items()})
    v.update({k: x for k, x in (resolved or {}).items() if x is not None})
    return v


def check_capacity(r: Recipe, resolved: Optional[Dict[str, Any]] = None, blame=lambda key: "recipe"):
    """Refuse fewer CPUs per node than verl's Ray actors hold there (verl_resources); return
    what they hold (None for an entrypoint that is not verl's)."""
    if not is_verl(r):
        return None
    v = effective(r, resolved, blame)
    for key in COUNTS:
        v[key] = count(v, key, blame)
    need = cpu_need(r.cluster.nodes, r.cluster.gpus_per_node, v, r.verl.version)
    if r.cluster.cpus_per_task < need.per_node:
        raise RecipeError(
            f"{r.cluster.cpus_per_task} CPUs per node for Ray, but {need.explain()}: with fewer, verl "
            f"waits forever for its actors (verl#7398). Set cluster.cpus_per_task={need.per_node} or more"
            + (f" (or fewer {STORAGE_UNITS})" if need.trainer == "V1" else ""),
            where=blame("cluster.cpus_per_task"), key="cluster.cpus_per_task")
    return need


def check(r: Recipe, blame=lambda key: "recipe") -> None:
    """Raise RecipeError, naming the field, for the first trap found."""
    v = verl_settings(r, blame)

    def bad(key: str, message: str) -> None:
        raise RecipeError(message, where=blame(key), key=key)

    ckpt = v.get(CKPT_DIR)
    if r.container.image:  # what the steps in the container read and write must be mounted
        same = [m.split(":")[0].rstrip("/") for m in r.container.mounts if m.split(":")[0] == m.split(":")[1]]
        where = {"paths.runs": os.path.abspath(os.path.expanduser(r.paths.runs))}
        if ckpt is not None:
            where[f"verl.overrides.{CKPT_DIR}"] = str(ckpt)
        for key, path in where.items():
            if not any(path == src or path.startswith(src + "/") for src in same):
                bad(key, f"{path} is not inside a container.mounts entry mounted at the same path "
                    f"({', '.join(r.container.mounts) or 'none'}): the container would not see it")
    if r.trace.backend == "weave" and not r.wandb.enabled:
        bad("trace.backend", "weave traces live in a W&B project: set wandb.enabled=true "
            "(or trace.backend=none)")
    if ckpt is not None and not posixpath.isabs(str(ckpt)):
        bad(f"verl.overrides.{CKPT_DIR}", f"{ckpt!r} is relative: verl would write checkpoints under "
            "the run directory of each job; give an absolute directory on shared storage")
    if r.cluster.requeue:
        if ckpt is None:
            bad(f"verl.overrides.{CKPT_DIR}", "cluster.requeue resumes from checkpoints: set it to an "
                "absolute directory on shared storage, so the restarted job finds them")
        freq = v.get("trainer.save_freq")
        if not whole(freq) or freq <= 0:
            bad("verl.overrides.trainer.save_freq", "cluster.requeue resumes from checkpoints: set it to "
                "a positive number of steps (verl's default -1 saves none)")

    if is_verl(r):
        name = v.get("actor_rollout_ref.rollout.name")
        if name is None:
            bad("verl.overrides.actor_rollout_ref.rollout.name",
                f"is required by verl (one of {', '.join(ROLLOUT_NAMES)})")
        if name not in ROLLOUT_NAMES:
            bad("verl.overrides.actor_rollout_ref.rollout.name",
                f"{name!r} is not one of {', '.join(ROLLOUT_NAMES)}")
        check_capacity(r, None, blame)
