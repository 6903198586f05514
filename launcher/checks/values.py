"""The launcher's own checks of a composed recipe: its values (validate), and known traps in
the verl settings it produces (check).

Each one catches a mistake that would otherwise cost a queue wait and a failed or useless
run; verl's keys are checked against a snapshot of its config (verl_schema), and verl's own
validation runs separately, in verl itself (preflight).
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from typing import Any, Dict, Optional

from ..errors import Problems, RecipeError
from ..base.overrides import derived, flatten
from ..base.schema import GPU_VENDORS, TRACE_BACKENDS, Recipe
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
    """The line a verl-key problem gets as a warning, for an entrypoint that is not verl's own."""
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
                                 warn=warn or (lambda e: None))
        problems.done()
        return f"entrypoint {r.verl.entrypoint} is not verl's own: {line}"
    keys = ""
    with problems.gather():
        keys = verl_schema.check(flatten(r.verl.overrides, blame), r.verl.version, r.verl.extra_keys, blame)
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


# ----------------------------------------------------------------------------- values
_SAFE_DIRECTIVE = re.compile(r"^[^\s'\"\\#$`;|<>]+$")  # values on #SBATCH lines
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE)$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_SBATCH_ARG = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=[^\s'\"\\`$;|<>]+)?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OVERRIDE_KEY = re.compile(r"^(\+\+|\+)?[A-Za-z_][\w-]*(\.[A-Za-z_0-9][\w-]*)*$")
# Directives the launcher writes itself; a duplicate in sbatch_args would fight them.
# sbatch accepts any unique prefix of an option (getopt_long), so prefixes count too. --export
# would keep the key from the job; the GPU and memory forms fight cluster.*.
_OWN_DIRECTIVES = {"nodes", "ntasks-per-node", "ntasks", "gpus-per-node", "cpus-per-task",
                   "job-name", "output", "error", "chdir", "mem", "partition", "account",
                   "qos", "time", "constraint", "exclusive", "parsable", "wrap", "export",
                   "export-file", "gres", "gpus", "gpus-per-task", "mem-per-cpu", "mem-per-gpu",
                   "cpus-per-gpu", "input", "open-mode", "array", "requeue", "no-requeue",
                   "signal"}
# Names the job sets itself, or secrets that must never sit in a recipe.
_RESERVED_ENV = {"WANDB_API_KEY", "RAY_ADDRESS", "CUDA_VISIBLE_DEVICES"}
# A name made of words that say "secret" (HF_TOKEN, OPENAI_API_KEY; not TOKENIZERS_PARALLELISM).
_SECRET_WORD = re.compile(r"(^|_)(KEY|APIKEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.I)
# W&B variables the job sets itself, and the recipe field each comes from (None: the job's own).
_WANDB_ENV = {"WANDB_PROJECT": "wandb.project", "WANDB_NAME": "wandb.experiment", "WANDB_ENTITY": "wandb.entity",
              "WANDB_BASE_URL": "wandb.base_url", "WANDB_HOST": "wandb.base_url", "WANDB_RUN_ID": None,
              "WANDB_RESUME": None, "WANDB_ERROR_REPORTING": None, "WANDB_RUN_GROUP": "wandb.group",
              "WANDB_JOB_TYPE": "wandb.job_type"}


STALL_FLOOR = 1800  # seconds: "auto" never stops a job sooner than this after its last step
STALL_STEPS = 10  # "auto": this many times the slowest step seen


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


def stall_timeout(value) -> str:
    """cluster.stall_timeout as the watchdog takes it: "auto", "off" or a positive number of
    seconds; ValueError saying what is accepted."""
    if value is False or (isinstance(value, str) and value.strip().lower() in ("off", "false", "none")):
        return "off"
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"must be a positive number of seconds, 'auto' ({STALL_STEPS} x the slowest training "
                         f"step, at least {STALL_FLOOR} s) or 'off', got {value!r}")
    return f"{seconds:g}"


def _seconds(time: Optional[str]) -> Optional[int]:
    """A Slurm time limit in seconds (None: none, or unlimited: Slurm reads 0 so too). Minutes,
    M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if time is None or not _TIME.fullmatch(time) or time in ("UNLIMITED", "INFINITE"):
        return None
    if not any(ch in "123456789" for ch in time):  # 0, 00:00, 0-0: no limit
        return None
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-H[:M[:S]]
        h, m, s = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def validate(r: Recipe, blame) -> None:
    """Raise RecipeError naming every field whose value the launcher cannot take (all at once)."""
    problems = Problems(blame)
    bad = problems.bad

    if not _JOB_NAME.fullmatch(r.job.name):
        bad("job.name", "must be 1-128 characters of letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    c = r.cluster
    if c.nodes < 1:
        bad("cluster.nodes", f"must be at least 1, got {c.nodes}")
    if c.gpus_per_node < 0:
        bad("cluster.gpus_per_node", f"must be 0 or more, got {c.gpus_per_node}")
    if c.gpu_type is not None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", c.gpu_type):
            bad("cluster.gpu_type", f"{c.gpu_type!r} is not a Slurm gres type (letters, digits, '_', '.', '-'; "
                                    "e.g. h100, as in `sinfo -o %G`)")
        if c.gpus_per_node == 0:
            bad("cluster.gpu_type", "is set, but cluster.gpus_per_node is 0: no GPUs are asked for")
    if c.cpus_per_task < 1:
        bad("cluster.cpus_per_task", f"must be at least 1, got {c.cpus_per_task}")
    if c.ready_timeout < 10:
        bad("cluster.ready_timeout", f"must be at least 10 seconds, got {c.ready_timeout}")
    if not 0 <= c.ray_start_retries <= 10:
        bad("cluster.ray_start_retries", f"must be 0 to 10, got {c.ray_start_retries}")
    if c.object_store_memory is not None and c.object_store_memory < 78643200:
        bad("cluster.object_store_memory", "must be at least 75 MiB (Ray's minimum), in bytes")
    for name in ("partition", "account", "qos", "constraint"):
        v = getattr(c, name)
        if v is not None and not _SAFE_DIRECTIVE.fullmatch(v):
            bad(f"cluster.{name}", f"{v!r} is not a valid Slurm value (no spaces, quotes or shell characters)")
    if c.network_interface is not None and not re.fullmatch(r"^[A-Za-z0-9_.:-]{1,15}$", c.network_interface):
        bad("cluster.network_interface", f"{c.network_interface!r} is not a network interface name")
    if (len(c.port_range) != 2 or not 1024 <= c.port_range[0] < c.port_range[1] <= 65535):
        bad("cluster.port_range", "must be [low, high] with 1024 <= low < high <= 65535")
    if c.worker_ports < 16:
        bad("cluster.worker_ports", "must be at least 16")
    elif len(c.port_range) == 2 and c.port_range[1] - c.port_range[0] + 1 < 9 + c.worker_ports:
        bad("cluster.port_range", f"too small for one job's {9 + c.worker_ports} Ray ports")
    if c.signal_seconds < 1 or c.signal_seconds > 65535:
        bad("cluster.signal_seconds", f"must be 1-65535 seconds (sbatch --signal), got {c.signal_seconds}")
    if c.max_restarts < 0:
        bad("cluster.max_restarts", f"must be 0 or more, got {c.max_restarts}")
    if c.exclude_bad_nodes and not c.requeue:
        bad("cluster.exclude_bad_nodes", "excludes a failed node when the job requeues itself: set cluster.requeue=true")
    if c.gpu_vendor not in GPU_VENDORS:
        bad("cluster.gpu_vendor", f"{c.gpu_vendor!r} is not one of {', '.join(GPU_VENDORS)}")
    if c.pending_timeout < 0:
        bad("cluster.pending_timeout", f"must be 0 (no watchdog) or more seconds, got {c.pending_timeout}")
    try:
        stall_timeout(c.stall_timeout)
    except ValueError as e:
        bad("cluster.stall_timeout", str(e))
    if r.node_checks.min_free_gb < 0:
        bad("node_checks.min_free_gb", f"must be 0 (no check) or more, got {r.node_checks.min_free_gb}")
    if c.time is not None and not _TIME.fullmatch(c.time):
        bad("cluster.time", f"{c.time!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
    limit = _seconds(c.time)
    if c.requeue and limit is not None and c.signal_seconds >= limit:
        bad("cluster.signal_seconds", f"{c.signal_seconds} s before the limit is at or before the start: "
                                      f"cluster.time={c.time} is {limit} s; give it less than that")
    if c.mem is not None and not _MEM.fullmatch(c.mem):
        bad("cluster.mem", f"{c.mem!r} is not a Slurm memory size (e.g. 0, 512G)")
    for i, a in enumerate(c.sbatch_args):
        if not _SBATCH_ARG.fullmatch(a):
            bad(f"cluster.sbatch_args[{i}]", f"{a!r} must look like --option or --option=value, without spaces or quotes")
        opt = a[2:].split("=", 1)[0]
        if any(own.startswith(opt) for own in _OWN_DIRECTIVES):
            bad(f"cluster.sbatch_args[{i}]", f"--{opt} is (a prefix of) an option the launcher sets or "
                                             "forbids; use the cluster.* fields (GPUs: cluster.gpus_per_node "
                                             "and cluster.gpu_type)")

    if not r.runtime.python.strip() or _CONTROL.search(r.runtime.python):
        bad("runtime.python", "must be a non-empty interpreter path or name")
    for i, line in enumerate(r.runtime.setup):
        if "\n" in line or "\x00" in line:
            bad(f"runtime.setup[{i}]", "one shell line per list item (no newlines)")

    for k, v in r.env.items():
        if not _ENV_NAME.fullmatch(k):
            bad(f"env.{k}", "not a valid environment variable name")
        if k in _RESERVED_ENV or k.startswith("SLURM_") or k in _WANDB_ENV:
            why = ("a secret: export it in your shell or use wandb.api_key_file" if k == "WANDB_API_KEY" else
                   f"set by the job from {_WANDB_ENV[k]}: set that instead" if _WANDB_ENV.get(k) else
                   "set by the job itself")
            bad(f"env.{k}", f"cannot be set in a recipe ({why})")
        if "\x00" in v:
            bad(f"env.{k}", "contains a NUL byte")
        if _SECRET_WORD.search(k) and str(v).strip() and not str(v).startswith(("/", "~", "$")):
            # `env` is written into the script in plain text; a path to a key file is fine
            bad(f"env.{k}", "looks like a secret (its name): `env` is written into the job script in plain "
                            f"text. List {k} in `secrets` and export it in your shell instead")

    for i, name in enumerate(r.secrets):
        if not _ENV_NAME.fullmatch(name) or name.startswith("SLURM_"):
            bad(f"secrets[{i}]", f"{name!r} is not an environment variable name")
        if name in r.env:
            bad(f"env.{name}", "is declared in `secrets`: its value must come from your environment")

    w = r.wandb
    tracing = r.trace.backend == "weave"
    if (w.enabled or tracing) and not w.project:
        bad("wandb.project", "is required when W&B logging or Weave tracing is on")
    if w.project is not None:
        if len(w.project) > 128 or re.search(r"[/\\#?%:]", w.project) or _CONTROL.search(w.project):
            bad("wandb.project", f"{w.project!r} is not a valid W&B project name (at most 128 characters, "
                                 "none of / \\ # ? % :; put the entity in wandb.entity)")
    if w.experiment is not None and (not w.experiment or len(w.experiment) > 128 or _CONTROL.search(w.experiment)):
        bad("wandb.experiment", "must be 1-128 printable characters")
    for name, most in (("group", 128), ("job_type", 64)):
        value = getattr(w, name)
        if value is not None and (not value or len(value) > most or _CONTROL.search(value)):
            bad(f"wandb.{name}", f"must be 1-{most} printable characters")
    if w.entity is not None and not _ENTITY.fullmatch(w.entity):
        bad("wandb.entity", f"{w.entity!r} is not a valid W&B entity (letters, digits, '_' or '-')")
    if w.base_url is not None and not re.fullmatch(r"^https?://[^\s'\"\\]+$", w.base_url):
        bad("wandb.base_url", f"{w.base_url!r} must be an http(s) URL")
    if w.api_key_file is not None:
        p = os.path.expanduser(w.api_key_file)
        if not os.path.isabs(p) or _CONTROL.search(p):
            bad("wandb.api_key_file", "must be an absolute path (it is read on the nodes)")
        w.api_key_file = p

    t = r.trace
    if t.backend not in TRACE_BACKENDS:
        bad("trace.backend", f"{t.backend!r} is not one of {', '.join(TRACE_BACKENDS)}")
    if t.on_unreachable not in ("fail", "disable"):
        bad("trace.on_unreachable", f"{t.on_unreachable!r} is not one of fail, disable")
    if w.reach_timeout < 0 or w.reach_timeout > 300:
        bad("wandb.reach_timeout", f"must be 0-300 seconds, got {w.reach_timeout}")
    if w.finish_timeout < 1 or w.finish_timeout > 600:
        bad("wandb.finish_timeout", f"must be 1-600 seconds, got {w.finish_timeout}")
    if t.max_samples_per_step_per_worker is not None and t.max_samples_per_step_per_worker < 0:
        bad("trace.max_samples_per_step_per_worker", "must be null (every sample) or 0 or more")

    if r.verl.version is not None:
        from ..base.verl_versions import parse

        try:
            parse(r.verl.version)
        except ValueError as e:
            bad("verl.version", str(e))
    if not _MODULE.fullmatch(r.verl.entrypoint):
        bad("verl.entrypoint", f"{r.verl.entrypoint!r} is not a Python module name")
    for k in r.verl.overrides:
        if not _OVERRIDE_KEY.fullmatch(str(k)):
            bad(f"verl.overrides.{k}", "not a valid Hydra key (dotted names, optional + or ++ prefix)")
    for i, k in enumerate(r.verl.extra_keys):
        if not _OVERRIDE_KEY.fullmatch(str(k)) or str(k).startswith("+"):
            bad(f"verl.extra_keys[{i}]", f"{k!r} is not a dotted verl key")

    k = r.container
    if k.image is not None and not re.fullmatch(r"[^\s,'\"\\`$;|<>]+", k.image):
        bad("container.image", f"{k.image!r} is not an image name or squashfs path (no spaces, commas or quotes)")
    for i, m in enumerate(k.mounts):  # pyxis separates mounts with commas
        if not re.fullmatch(r"/[^\s,:'\"\\`$]*:/[^\s,:'\"\\`$]*(:[a-z+]+)?", m):
            bad(f"container.mounts[{i}]", f"{m!r} must be SRC:DST[:FLAGS], absolute paths, no commas or spaces")
    if k.workdir is not None and not re.fullmatch(r"/[^\s'\"\\`$]*", k.workdir):
        bad("container.workdir", f"{k.workdir!r} must be an absolute path inside the container")
    for i, name in enumerate(k.env):
        if not _ENV_NAME.fullmatch(name):
            bad(f"container.env[{i}]", f"{name!r} is not an environment variable name")
    if k.image is None:
        for name, value, default in (("mounts", k.mounts, []), ("workdir", k.workdir, None),
                                     ("env", k.env, []), ("mount_home", k.mount_home, True)):
            if value != default:
                bad(f"container.{name}", "is set, but container.image is not: there is no container")

    if not r.paths.runs or _CONTROL.search(r.paths.runs):
        bad("paths.runs", "must be a directory path")
    problems.done()
