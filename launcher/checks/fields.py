"""The recipe's own fields: what the launcher can take (validate), every problem at once, each
naming its field. Slurm's, W&B's, Ray's and the shell's rules for a value, before anything is
rendered; verl's keys are values.py's and verl_schema's.
"""

from __future__ import annotations

import math
import os
import re
from typing import List, Optional

from ..errors import Problems
from ..base.schema import GPU_VENDORS, TRACE_BACKENDS, Recipe

_SAFE_DIRECTIVE = re.compile(r"^[^\s'\"\\#$`;|<>]+$")  # values on #SBATCH lines
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_CONFIG_NAME = re.compile(r"^[A-Za-z0-9_][\w.-]*(/[A-Za-z0-9_][\w.-]*)*$")
_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE)$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_SBATCH_ARG = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=[^\s'\"\\`$;|<>]+)?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# a dotted key, or a config group (its /sub-group, its @package) as verl's Hydra takes them
_OVERRIDE_KEY = re.compile(r"^(\+\+|\+)?[A-Za-z_][\w-]*(/[A-Za-z_][\w-]*)*"
                           r"(@[A-Za-z_][\w-]*(\.[A-Za-z_0-9][\w-]*)*|(\.[A-Za-z_0-9][\w-]*)*)$")
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


def image_warnings(r) -> List[str]:
    """What check warns of container.image: a path pyxis would misread, or one not here."""
    image = r.container.image
    if not image:
        return []
    if image.startswith("~"):
        return [f"container.image {image}: pyxis does not expand ~, and would take it for a registry image: give "
                "the squashfs's absolute path"]
    if image.startswith(("/", ".")) and not os.path.exists(image):
        return [f"container.image {image} does not exist here; if the nodes cannot see it either, the job fails at "
                "its first step (verl-launch image import makes it)"]
    return []


def ray_auth_warning(c) -> str:
    return (f"Ray's token authentication is off (cluster.ray_auth_off: {c.ray_auth_off}): anyone who can reach a "
            "node can join the job's Ray cluster and run code as you, beside your W&B key")


def recipe_warnings(r) -> List[str]:
    """The warnings of the recipe's values alone: said beside its refusal too (one try shows
    every problem), and by check's summary where it is not refused."""
    return image_warnings(r) + ([ray_auth_warning(r.cluster)] if r.cluster.ray_auth_off is not None else [])


def env_problems(k: str, v: str) -> List[str]:
    """Why NAME=VALUE cannot be in a recipe's `env` (none: it can). `import` asks the same of
    what a command line or Ray's runtime env sets."""
    out = []
    if not _ENV_NAME.fullmatch(k):
        out.append("not a valid environment variable name")
    if k in _RESERVED_ENV or k.startswith("SLURM_") or k in _WANDB_ENV:
        why = ("a secret: export it in your shell or use wandb.api_key_file" if k == "WANDB_API_KEY" else
               f"set by the job from {_WANDB_ENV[k]}: set that instead" if _WANDB_ENV.get(k) else
               "set by the job itself")
        out.append(f"cannot be set in a recipe ({why})")
    if "\x00" in v:
        out.append("contains a NUL byte")
    if _SECRET_WORD.search(k) and str(v).strip() and not str(v).startswith(("/", "~", "$")):
        # `env` is written into the script in plain text; a path to a key file is fine
        out.append("looks like a secret (its name): `env` is written into the job script in plain "
                   f"text. List {k} in `secrets` and export it in your shell instead")
    return out


STALL_FLOOR = 1800  # seconds: "auto" never stops a job sooner than this after its last step
STALL_STEPS = 10  # "auto": this many times the slowest step seen


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
    if c.gpu_hour_price is not None and not (c.gpu_hour_price >= 0 and c.gpu_hour_price < float("inf")):
        bad("cluster.gpu_hour_price", f"must be a price of 0 or more, got {c.gpu_hour_price}")
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
    if c.ray_auth_off is not None and (not c.ray_auth_off.strip() or _CONTROL.search(c.ray_auth_off)):
        bad("cluster.ray_auth_off", "give the reason Ray's token authentication must be off (one printable line), "
                                    "or leave it unset")
    if c.max_restarts < 0:
        bad("cluster.max_restarts", f"must be 0 or more, got {c.max_restarts}")
    if c.exclude_bad_nodes and not c.requeue:
        bad("cluster.exclude_bad_nodes", "excludes a failed node when the job requeues itself: set cluster.requeue=true")
    if c.gpu_vendor not in GPU_VENDORS:
        bad("cluster.gpu_vendor", f"{c.gpu_vendor!r} is not one of {', '.join(GPU_VENDORS)}")
    if c.pending_timeout < 0:
        bad("cluster.pending_timeout", f"must be 0 (no watchdog) or more seconds, got {c.pending_timeout}")
    if c.death_grace < 0:
        bad("cluster.death_grace", f"must be 0 or more seconds, got {c.death_grace}")
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
        for why in env_problems(k, v):
            bad(f"env.{k}", why)

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
    if t.flush_timeout < 0 or t.flush_timeout > 600:
        bad("trace.flush_timeout", f"must be 0 (no flush) to 600 seconds, got {t.flush_timeout}")
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
    if r.verl.config_name is not None and not _CONFIG_NAME.fullmatch(r.verl.config_name):
        bad("verl.config_name", f"{r.verl.config_name!r} is not a config name (a YAML file's name in the "
                                "config folder, e.g. ppo_megatron_trainer)")
    if r.verl.config_path is not None and not re.fullmatch(r"/[^\s'\"\\`$]*", r.verl.config_path):
        bad("verl.config_path", f"{r.verl.config_path!r} must be an absolute folder, as the nodes see it")
    for k in r.verl.overrides:
        if not _OVERRIDE_KEY.fullmatch(str(k)):
            bad(f"verl.overrides.{k}", "not a valid Hydra key (dotted names, or a config group[@package]; "
                                       "optional + or ++ prefix)")
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
