"""The recipe: a typed schema, composed with Hydra, validated with errors naming file and field.

A recipe is a YAML file composed by Hydra's compose API: its ``defaults`` list may pull
shipped groups (``cluster/<profile>``, found next to the recipe first, then in the
package's ``recipes/``), and command-line overrides use Hydra's grammar.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import RecipeError
from .resources import shipped_recipes_dir

TRACE_BACKENDS = ("weave", "mlflow", "trackio", "none")  # verl silently ignores any other
GPU_VENDORS = ("nvidia", "amd", "none")


# ----------------------------------------------------------------------------- schema
@dataclass
class Job:
    name: str = MISSING


@dataclass
class Cluster:
    nodes: int = 1
    gpus_per_node: int = 8
    cpus_per_task: int = 32
    mem: Optional[str] = None  # sbatch --mem, e.g. "0" (all) or "512G"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None  # sbatch --time, e.g. "04:00:00" or "2-00:00:00"
    constraint: Optional[str] = None
    exclusive: bool = False
    sbatch_args: List[str] = field(default_factory=list)  # extra directives, "--opt=value"
    ready_timeout: int = 600  # seconds for every node and GPU to join Ray
    object_store_memory: Optional[int] = None  # bytes per node; Ray's default when null
    network_interface: Optional[str] = None  # e.g. ib0: Ray uses its address on every node
    port_range: List[int] = field(default_factory=lambda: [20000, 59999])  # Ray's ports, per job a block
    worker_ports: int = 200  # Ray worker ports per node per job
    # Preemption and time limits: --requeue, and USR1 this many seconds before the limit; the
    # job then tears down and requeues itself, at most max_restarts times, and resumes.
    requeue: bool = False
    signal_seconds: int = 300
    max_restarts: int = 3
    # A failure put down to a node (its Ray ended, it never joined, only it failed the
    # allocation check, Ray lost it): requeue without that node. null: on with requeue.
    exclude_bad_nodes: Optional[bool] = None
    # The nodes' GPU vendor: Slurm's gres/gpu may set every vendor's visibility variable in a
    # step; the job clears the others' before Ray starts (verl refuses ROCR_ beside CUDA_).
    gpu_vendor: str = "nvidia"  # nvidia | amd | none (leave them as Slurm sets them)
    # While the driver runs, Ray work (actors, placement groups) that waits this long for
    # resources the cluster never frees fails the job, naming the shortfall (0: no watchdog).
    pending_timeout: int = 600


@dataclass
class Runtime:
    setup: List[str] = field(default_factory=list)  # trusted shell, run on every node
    python: str = "python3"


@dataclass
class Wandb:
    enabled: bool = True  # trainer.logger gets 'wandb'
    project: Optional[str] = None
    experiment: Optional[str] = None  # defaults to job.name
    entity: Optional[str] = None
    base_url: Optional[str] = None
    api_key_file: Optional[str] = None  # read inside the job; must be on the nodes
    reach_timeout: int = 10  # seconds for each node's reachability check (0: no check)


@dataclass
class Trace:
    backend: str = "weave"
    token2text: bool = True
    max_samples_per_step_per_worker: Optional[int] = None  # null: every sample
    warn_traces_per_step: int = 2000  # check/submit warn above this many traces per step
    # Before training, every node checks that W&B answers with the key: if not, `fail` the job
    # at once, or `disable` tracing (W&B metrics then go offline, for `wandb sync`) and go on.
    on_unreachable: str = "fail"


@dataclass
class Verl:
    version: Optional[str] = None  # the verl the job runs, e.g. "0.9.1"; null: the newest known
    entrypoint: str = "verl.trainer.main_ppo"
    overrides: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Container:
    """pyxis/enroot (SUNK): every Ray, readiness and driver step runs in the job's container."""
    image: Optional[str] = None  # a squashfs from `verl-launch image import`, or a registry image
    mounts: List[str] = field(default_factory=list)  # "SRC:DST[:FLAGS]": shared storage, data
    workdir: Optional[str] = None  # absolute, inside the container
    env: List[str] = field(default_factory=list)  # host variables the container must see as set
    mount_home: bool = True  # false: --no-container-mount-home


@dataclass
class NodeChecks:
    """Checks on every allocated node before Ray starts (phase inputs-check); each can be off."""
    inputs: bool = True  # local data files and model paths in verl's settings are readable
    shared_storage: bool = True  # run and checkpoint dirs: writable, the same storage on every node
    gpus: bool = True  # every node sees cluster.gpus_per_node GPUs
    min_free_gb: float = 10  # free disk where checkpoints go (0: no check)


@dataclass
class Paths:
    runs: str = "~/verl-launch/runs"  # shared storage on a real cluster


@dataclass
class Recipe:
    job: Job = field(default_factory=Job)
    cluster: Cluster = field(default_factory=Cluster)
    runtime: Runtime = field(default_factory=Runtime)
    env: Dict[str, str] = field(default_factory=dict)
    secrets: List[str] = field(default_factory=list)  # names of env vars passed, never written
    wandb: Wandb = field(default_factory=Wandb)
    trace: Trace = field(default_factory=Trace)
    verl: Verl = field(default_factory=Verl)
    container: Container = field(default_factory=Container)
    node_checks: NodeChecks = field(default_factory=NodeChecks)
    paths: Paths = field(default_factory=Paths)

    # Not part of the YAML: where it came from, for messages and the run record.
    source: ClassVar[str] = "<recipe>"

    @property
    def experiment(self) -> str:
        return self.wandb.experiment or self.job.name


# ----------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    recipe: Recipe
    config: DictConfig  # the composed, validated config
    blame: Any = None  # dotted key -> where it was set (the recipe file or the command line)


_VERL_PREFIX = "verl.overrides."


def load(path: str | os.PathLike, overrides: List[str] = ()) -> Loaded:
    """Compose ``path`` with ``overrides``, validate it, and return the typed recipe.

    ``${recipe_dir:}`` in a value is the recipe file's folder. ``verl.overrides.<key>=v`` sets verl key ``<key>`` whether the recipe writes it nested or
    dotted, and ``env.<NAME>=v`` may add a variable: neither needs Hydra's ``+``.
    """
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise RecipeError("recipe file not found", where=where)
    if path.suffix != ".yaml":
        raise RecipeError("a recipe must be a .yaml file (Hydra composes only .yaml)", where=where)
    overrides = list(overrides)
    # ${recipe_dir:} is the recipe's own folder, absolute: files shipped beside a recipe (a
    # tool config) are found from any working directory (on shared storage, from any node).
    OmegaConf.register_new_resolver("recipe_dir", lambda: str(path.parent.resolve()), replace=True)
    groups = _groups(path)
    hydra_ovs, verl_ovs = [], []
    for ov in overrides:
        key = _key(ov)
        if key.startswith("hydra"):
            raise RecipeError(f"override '{ov}': hydra.* keys are the launcher's", where="command line")
        if key.startswith(_VERL_PREFIX):
            verl_ovs.append(ov)
        elif ov.startswith(("+", "~")) or key in groups:
            hydra_ovs.append(ov)
        else:
            # Any schema key may be set even if the recipe file omits it; a misspelt one is
            # refused by the schema right after, naming it.
            hydra_ovs.append("++" + ov)
    _parse_each(overrides)
    blame = _blamer(where, overrides, groups)
    cfg = _compose(path, hydra_ovs, blame)
    plain = OmegaConf.to_container(cfg, resolve=False)
    _refuse_retyped(plain, blame)
    try:  # Hydra lets `+key=v` through: check the plain values against the schema again
        merged = OmegaConf.merge(OmegaConf.structured(Recipe), plain)
        # Interpolations resolve here, verl.overrides included; a `${` left after that
        # (written \${ in the recipe) reaches verl as literal text (overrides.hydra_value).
        recipe: Recipe = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = e.full_key or None
        raise RecipeError(_omegaconf_message(e), where=blame(key), key=key) from None
    recipe.source = str(path.resolve())

    from .overrides import apply_cli, flatten, verl_args

    def resolve(value):  # ${...} in a command-line value resolves as it would in the file
        if not (isinstance(value, str) and "${" in value):
            return value
        try:
            return OmegaConf.merge(plain, {"_vl_value": value})._vl_value
        except OmegaConfBaseException as e:
            raise RecipeError(_omegaconf_message(e), where="command line") from None

    recipe.verl.overrides = apply_cli(flatten(recipe.verl.overrides, blame),
                                      [ov.replace(_VERL_PREFIX, "", 1) for ov in verl_ovs], resolve)
    validate(recipe, blame)
    verl_args(recipe, blame)  # a contradicting override is an error of the recipe
    from .checks import check

    check(recipe, blame)
    return Loaded(recipe=recipe, config=merged, blame=blame)


def _refuse_retyped(plain: dict, blame) -> None:
    """YAML reads some unquoted values as other types, and the str fields would then hold a
    different text (`time: 4:00:00` is base-60 14400, `FLAG: false` becomes "False")."""
    t = (plain.get("cluster") or {}).get("time")
    if isinstance(t, int) and not isinstance(t, bool) and blame("cluster.time") == "command line":
        plain["cluster"]["time"] = str(t)  # Hydra's grammar has no base-60: `time=30` is minutes
    elif t is not None and not isinstance(t, str):
        raise RecipeError(f"write it as a quoted string, e.g. \"04:00:00\" (YAML read {t!r})",
                          where=blame("cluster.time"), key="cluster.time")
    for name, value in (plain.get("env") or {}).items():
        if value is not None and not isinstance(value, (str, int)) or isinstance(value, bool):
            raise RecipeError(f"write it as a quoted string (YAML read {value!r}, a {type(value).__name__})",
                              where=blame(f"env.{name}"), key=f"env.{name}")


def _groups(path: Path) -> set:
    """Config groups (folders) a `group=choice` override may name."""
    dirs = [path.parent, shipped_recipes_dir()]
    return {d.name for base in dirs if base.is_dir() for d in base.iterdir() if d.is_dir()}


def _parse_each(overrides: List[str]) -> None:
    """Refuse a malformed override by itself, before composing anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for ov in overrides:
        try:
            parser.parse_override(ov)
        except HydraException as e:
            msg = " ".join(str(e).split("See https://hydra.cc")[0].split())
            raise RecipeError(f"override {ov!r} is not Hydra syntax: {msg}", where="command line",
                              key=_key(ov)) from None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _compose(path: Path, overrides: List[str], blame) -> DictConfig:
    """Hydra composes the recipe (with its own defaults list) and the overrides; the schema
    checks the result afterwards (composing it in costs Hydra ~0.1 s of copies)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    search = f"hydra.searchpath=[{_hydra_str('file://' + str(shipped_recipes_dir()))}]"
    # Hydra's own app settings (logging, help, launcher, output dirs) are not used by
    # compose; leaving them out saves ~40 ms of YAML loading per command.
    lean = ["hydra/job_logging=none", "hydra/hydra_logging=none", "~hydra/help", "~hydra/hydra_help",
            "~hydra/launcher", "~hydra/sweeper", "~hydra/output"]
    try:
        with warnings.catch_warnings():
            # A recipe without `_self_` gets it last (its own values win): what users expect.
            warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`")
            with initialize_config_dir(config_dir=str(path.parent.resolve()), version_base="1.3",
                                       job_name="verl-launch"):
                return compose(config_name=path.stem, overrides=[search, *lean, *overrides])
    except HydraException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, OmegaConfBaseException):
            cause = cause.__cause__
        if isinstance(cause, OmegaConfBaseException) and cause.full_key:
            key = cause.full_key
            raise RecipeError(_omegaconf_message(cause), where=blame(key), key=key) from None
        msg = str(e).split("\nSee https://hydra.cc")[0].split("\nConfig search path")[0]
        msg = " ".join(msg.split())
        where = "command line" if _mentions_override(msg, overrides) else str(path)
        raise RecipeError(msg, where=where) from None
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as e:  # e.g. YAML syntax errors
        raise RecipeError(str(e).replace("\n", " ").strip(), where=str(path)) from None


def _mentions_override(msg: str, overrides: List[str]) -> bool:
    return any(re.search(rf"(?<![\w./-]){re.escape(tok)}(?![\w./-])", msg)
               for ov in overrides for tok in {ov, _key(ov)})


def _blamer(recipe_file: str, overrides: List[str], groups: set = frozenset()):
    """Map a dotted key to where it was set: the command line if an override set it (choosing
    a group, `cluster=sunk`, does not count as setting the keys under it)."""
    touched = [_key(ov) for ov in overrides if _key(ov) not in groups]

    def blame(key: Optional[str]) -> str:
        if key:
            for t in touched:
                if key == t or key.startswith((t + ".", t + "[")) or t.startswith(key + "."):
                    return "command line"
        return recipe_file

    return blame


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    msg = str(e).split("\n")[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        return f"unknown key ({msg})"
    return msg


def _hydra_str(s: str) -> str:
    from .overrides import hydra_value

    return hydra_value(s)


# ----------------------------------------------------------------------------- validation
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


def validate(r: Recipe, blame) -> None:
    def bad(key: str, message: str) -> None:
        raise RecipeError(message, where=blame(key), key=key)

    if not _JOB_NAME.fullmatch(r.job.name):
        bad("job.name", "must be 1-128 characters of letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    c = r.cluster
    if c.nodes < 1:
        bad("cluster.nodes", f"must be at least 1, got {c.nodes}")
    if c.gpus_per_node < 0:
        bad("cluster.gpus_per_node", f"must be 0 or more, got {c.gpus_per_node}")
    if c.cpus_per_task < 1:
        bad("cluster.cpus_per_task", f"must be at least 1, got {c.cpus_per_task}")
    if c.ready_timeout < 10:
        bad("cluster.ready_timeout", f"must be at least 10 seconds, got {c.ready_timeout}")
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
    elif c.port_range[1] - c.port_range[0] + 1 < 9 + c.worker_ports:
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
    if r.node_checks.min_free_gb < 0:
        bad("node_checks.min_free_gb", f"must be 0 (no check) or more, got {r.node_checks.min_free_gb}")
    if c.time is not None and not _TIME.fullmatch(c.time):
        bad("cluster.time", f"{c.time!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
    if c.mem is not None and not _MEM.fullmatch(c.mem):
        bad("cluster.mem", f"{c.mem!r} is not a Slurm memory size (e.g. 0, 512G)")
    for i, a in enumerate(c.sbatch_args):
        if not _SBATCH_ARG.fullmatch(a):
            bad(f"cluster.sbatch_args[{i}]", f"{a!r} must look like --option or --option=value, without spaces or quotes")
        opt = a[2:].split("=", 1)[0]
        if any(own.startswith(opt) for own in _OWN_DIRECTIVES):
            bad(f"cluster.sbatch_args[{i}]", f"--{opt} is (a prefix of) an option the launcher sets or "
                                             "forbids; use the cluster.* fields")

    if not r.runtime.python.strip() or _CONTROL.search(r.runtime.python):
        bad("runtime.python", "must be a non-empty interpreter path or name")
    for i, line in enumerate(r.runtime.setup):
        if "\n" in line or "\x00" in line:
            bad(f"runtime.setup[{i}]", "one shell line per list item (no newlines)")

    for k, v in r.env.items():
        if not _ENV_NAME.fullmatch(k):
            bad(f"env.{k}", "not a valid environment variable name")
        if k in _RESERVED_ENV or k.startswith("SLURM_"):
            why = ("a secret: export it in your shell or use wandb.api_key_file"
                   if k == "WANDB_API_KEY" else "set by the job itself")
            bad(f"env.{k}", f"cannot be set in a recipe ({why})")
        if "\x00" in v:
            bad(f"env.{k}", "contains a NUL byte")

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
    if t.max_samples_per_step_per_worker is not None and t.max_samples_per_step_per_worker < 0:
        bad("trace.max_samples_per_step_per_worker", "must be null (every sample) or 0 or more")

    if r.verl.version is not None:
        from .verl_versions import parse

        try:
            parse(r.verl.version)
        except ValueError as e:
            bad("verl.version", str(e))
    if not _MODULE.fullmatch(r.verl.entrypoint):
        bad("verl.entrypoint", f"{r.verl.entrypoint!r} is not a Python module name")
    for k in r.verl.overrides:
        if not _OVERRIDE_KEY.fullmatch(str(k)):
            bad(f"verl.overrides.{k}", "not a valid Hydra key (dotted names, optional + or ++ prefix)")

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
