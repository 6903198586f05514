"""The launcher's own checks of a composed recipe's verl settings: known traps in what it
produces (check), the CPUs verl's actors hold (capacity), where it resumes (resume_from). The
recipe's own fields are fields.py's (validate).

Each one catches a mistake that would otherwise cost a queue wait and a failed or useless
run; verl's keys are checked against a snapshot of its config (verl_schema), and verl's own
validation runs separately, in verl itself (preflight).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Dict, Optional

from ..errors import Problems, RecipeError
from ..base.overrides import derived, flatten
from ..base.schema import Recipe
from . import verl_schema
from .verl_resources import DEFAULTS, STORAGE_UNITS, cpu_need

CKPT_DIR = "trainer.default_local_dir"
ROLLOUT_NAMES = ("vllm", "sglang", "trtllm")
# Counts the resource model reads: whole numbers, or verl would fail later anyway.
COUNTS = ("actor_rollout_ref.rollout.agent.num_workers", "reward.num_workers", STORAGE_UNITS)


def is_verl(r: Recipe) -> bool:
    """The entrypoint is verl's own (a stand-in such as the sandbox demo skips verl's rules)."""
    return r.verl.entrypoint.split(".")[0] == "verl"


def is_launcher_stand_in(r: Recipe) -> bool:
    """The entrypoint is one of the launcher's own stand-ins (launcher.demo_payload): no verl."""
    return r.verl.entrypoint.split(".")[0] == "launcher"


def verl_keys_warning(e: RecipeError, entrypoint: str) -> str:
    """The line a verl-key problem gets as a warning: one verl runs through (a `+key` nothing in
    verl names), or any, for an entrypoint that is not verl's own."""
    if getattr(e, "note", False) and entrypoint.split(".")[0] == "verl":
        return f"warning: {e}"
    return (f"warning: {e} (not refused: the entrypoint {entrypoint} is not verl's own and may read "
            "keys of its own; if it does, list them in verl.extra_keys)")


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


def capacity(r: Recipe, values: Dict[str, Any], blame=lambda key: "recipe"):
    """Refuse fewer CPUs per node than verl's Ray actors hold there (verl_resources), by verl's
    effective VALUES (effective()); return what they hold (None for an entrypoint not verl's)."""
    if not is_verl(r):
        return None
    v = dict(values)
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


def _config(r: Recipe) -> dict:
    return {"config_name": r.verl.config_name, "config_path": r.verl.config_path}


def check(r: Recipe, blame=lambda key: "recipe", warn=None) -> str:
    """Raise RecipeError, naming the field, for every trap found (all at once); return a line on
    how verl's keys were checked. An entrypoint that is neither verl's own nor the launcher's
    stand-in (a verl recipe module, recipe.dapo.main_dapo) builds on verl's config with keys of
    its own: its verl keys are checked, but each problem goes to WARN (a callable taking the
    RecipeError; None: not reported) instead of being refused."""
    v = verl_settings(r, blame)
    problems = Problems(blame)
    bad = problems.bad
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
        if freq is not None and not whole(freq):
            bad("verl.overrides.trainer.save_freq", f"must be a whole number of steps, got {freq!r}")
        elif freq is None or freq <= 0:
            bad("verl.overrides.trainer.save_freq", "cluster.requeue resumes from checkpoints: set it to "
                "a positive whole number of steps (verl's default -1 saves none)")
    with problems.gather():
        resume_from(r, effective(r, blame=blame), blame)

    if is_launcher_stand_in(r):
        problems.done()
        return f"not checked: entrypoint {r.verl.entrypoint} is the launcher's own stand-in, not a verl trainer"
    if not is_verl(r):
        line = verl_schema.check(flatten(r.verl.overrides, blame), r.verl.version, r.verl.extra_keys, blame,
                                 warn=warn or (lambda e: None), **_config(r))
        problems.done()
        return f"entrypoint {r.verl.entrypoint} is not verl's own: {line}"
    keys = ""
    with problems.gather():
        keys = verl_schema.check(flatten(r.verl.overrides, blame), r.verl.version, r.verl.extra_keys, blame,
                                 note=warn, **_config(r))
    if r.cluster.gpus_per_node < 1:
        bad("cluster.gpus_per_node", "verl's trainer needs at least one GPU per node (it divides by it)")
    name = v.get("actor_rollout_ref.rollout.name")
    if name is None:
        bad("verl.overrides.actor_rollout_ref.rollout.name",
            f"is required by verl (one of {', '.join(ROLLOUT_NAMES)})")
    elif name not in ROLLOUT_NAMES:
        bad("verl.overrides.actor_rollout_ref.rollout.name",
            f"{name!r} is not one of {', '.join(ROLLOUT_NAMES)}")
    problems.done()
    return keys  # the CPU need is refused by plan.resolve, with what verl itself resolved


def resume_from(r: Recipe, v: Dict[str, Any], blame=lambda key: "recipe") -> Optional[str]:
    """cluster.resume_from as the job takes it: None, "latest-complete" or a step number. A step
    may be given as N, global_step_N or its path (a relative one is taken from the current
    directory); it must be in trainer.default_local_dir, which must be absolute, and verl must be
    resuming by its tracker (trainer.resume_mode=auto). Whether the step is there and complete is
    launcher.prior's to say (it reads the directory)."""
    from ..base.checkpoints import LATEST, STEP_DIR

    given = r.cluster.resume_from
    if given is None:
        return None
    key = "cluster.resume_from"

    def bad(message: str) -> None:
        raise RecipeError(f"{given!r}: {message}", where=blame(key), key=key)

    text = str(given).strip()
    ckpt = v.get(CKPT_DIR)
    if not (isinstance(ckpt, str) and posixpath.isabs(ckpt)):
        bad(f"verl resumes from {CKPT_DIR}, and it is not set to an absolute directory: set "
            f"verl.overrides.{CKPT_DIR}")
    mode = v.get("trainer.resume_mode") or "auto"
    if mode != "auto":
        bad(f"trainer.resume_mode is {mode!r}: the job writes verl's tracker, which verl reads only with "
            "resume_mode=auto (with resume_path, verl.overrides.trainer.resume_from_path says where)")
    if text == LATEST:
        return LATEST
    if text.isdigit():
        return str(int(text))
    m = STEP_DIR.fullmatch(text)
    if m:
        return str(int(m.group(1)))
    if "/" in text:
        path = os.path.normpath(os.path.abspath(os.path.expanduser(text)))
        m = STEP_DIR.fullmatch(os.path.basename(path))
        if m and os.path.dirname(path) == os.path.normpath(ckpt):
            return str(int(m.group(1)))
        if m:
            bad(f"{path} is not in {CKPT_DIR} ({ckpt}): verl resumes by its tracker only from there; "
                "copy that step's directory there first")
    bad(f"give {LATEST}, a step number, global_step_N, or that step's directory in {CKPT_DIR}")
