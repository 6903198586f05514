"""Render: a validated recipe in, the sbatch script text out. Pure: no I/O but the templates."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from functools import lru_cache
from typing import List, Tuple

import jinja2

from . import __version__, node_checks
from .overrides import verl_args
from .paths import RunPaths
from .schema import Recipe
from .resources import templates_dir
from .secrets import SECRET_NAME, wandb_host

TEMPLATE = "sbatch.sh.j2"
SWEEP_TEMPLATE = "sweep.sbatch.j2"

RAY_FIXED_PORTS = 9  # GCS .. dashboard; the template lays them out, then the worker ports


def q(value) -> str:
    """The one shell-quoting filter: every value that reaches the script passes here."""
    return shlex.quote(str(value))


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # bash's ${#array[@]} would open a Jinja comment
        comment_start_string="<%#",
        comment_end_string="#%>",
    )
    env.filters["q"] = q
    return env


def directives(r: Recipe) -> List[str]:
    c = r.cluster
    d = [f"--job-name={r.job.name}", f"--nodes={c.nodes}", "--ntasks-per-node=1",
         f"--cpus-per-task={c.cpus_per_task}"]
    if c.gpus_per_node:
        d.append(f"--gpus-per-node={c.gpu_type + ':' if c.gpu_type else ''}{c.gpus_per_node}")
    for name in ("mem", "partition", "account", "qos", "time", "constraint"):
        if getattr(c, name) is not None:
            d.append(f"--{name}={getattr(c, name)}")
    if c.exclusive:
        d.append("--exclusive")
    d.append("--output=slurm-%j.out")
    if c.requeue:  # keep the first run's output; USR1 to the batch shell ahead of the limit
        d += ["--requeue", "--open-mode=append", f"--signal=B:USR1@{c.signal_seconds}"]
    d.extend(c.sbatch_args)
    return d


def container_args(r: Recipe) -> List[str]:
    """pyxis's srun options for the recipe's container; [] without one. The job-scoped
    --container-name is added by the script (it holds the job id)."""
    k = r.container
    if not k.image:
        return []
    args = [f"--container-image={k.image}"]
    if k.mounts:
        args.append("--container-mounts=" + ",".join(k.mounts))
    if k.workdir:
        args.append(f"--container-workdir={k.workdir}")
    if k.env:
        args.append("--container-env=" + ",".join(k.env))
    if not k.mount_home:
        args.append("--no-container-mount-home")
    return args


def wandb_env(r: Recipe) -> List[Tuple[str, str]]:
    """W&B settings every node exports before Ray starts (never the key: it stays in the env)."""
    w = r.wandb
    if not (w.enabled or r.trace.backend == "weave"):
        return []
    env = [("WANDB_PROJECT", w.project), ("WANDB_NAME", r.experiment)]
    if w.entity:
        env.append(("WANDB_ENTITY", w.entity))
    if w.base_url:
        env.append(("WANDB_BASE_URL", w.base_url))
    if w.group:
        env.append(("WANDB_RUN_GROUP", w.group))
    if w.job_type:
        env.append(("WANDB_JOB_TYPE", w.job_type))
    # One W&B run per experiment, across requeues and resubmits.
    run_id = hashlib.sha256(f"{w.entity}/{w.project}/{r.experiment}".encode()).hexdigest()[:16]
    env += [("WANDB_RUN_ID", run_id), ("WANDB_RESUME", "allow"), ("WANDB_ERROR_REPORTING", "false")]
    return env


def job_env(r: Recipe) -> List[Tuple[str, str]]:
    """The recipe's env, and what the launcher adds unless the recipe sets it: with
    cluster.network_interface, NCCL's and gloo's sockets on that interface too (verl#726)."""
    env = dict(r.env)
    if r.cluster.network_interface:
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env.setdefault(name, r.cluster.network_interface)
    return sorted(env.items())


def render(r: Recipe) -> str:
    """The complete sbatch script for ``r``."""
    env = _env()
    check = node_checks.spec(r)
    ckpt = node_checks.checkpoint_dir(r)
    ctx = dict(
        version=__version__,
        recipe_file=_comment_safe(r.source),
        paths=RunPaths,
        directives=directives(r),
        setup=r.runtime.setup,
        python=r.runtime.python,
        entrypoint=r.verl.entrypoint,
        env=job_env(r),
        wandb_needed=r.wandb.enabled or r.trace.backend == "weave",
        api_key_file=r.wandb.api_key_file,
        wandb_host=wandb_host(r),
        secrets=r.secrets,
        wandb_env=wandb_env(r),
        verl_args=verl_args(r),
        nodes=r.cluster.nodes,
        gpus=r.cluster.gpus_per_node,
        cpus=r.cluster.cpus_per_task,
        object_store_memory=r.cluster.object_store_memory,
        ready_timeout=r.cluster.ready_timeout,
        ray_start_retries=r.cluster.ray_start_retries,
        ray_monitor=r.cluster.ray_monitor,
        requeue=r.cluster.requeue,
        exclude_bad_nodes=r.cluster.requeue and r.cluster.exclude_bad_nodes is not False,
        signal_seconds=r.cluster.signal_seconds,
        max_restarts=r.cluster.max_restarts,
        network_interface=r.cluster.network_interface or "",
        port_min=r.cluster.port_range[0],
        worker_ports=r.cluster.worker_ports,
        port_slots=port_slots(r),
        wait_ready_py=_embedded("wait_ready.py"),
        container_args=container_args(r),
        reach_timeout=r.wandb.reach_timeout if (r.wandb.enabled or r.trace.backend == "weave") else 0,
        on_unreachable=r.trace.on_unreachable,
        reach_weave="weave" if r.trace.backend == "weave" else "-",
        reach_wandb_py=_embedded("reach_wandb.py"),
        gpu_vendor=r.cluster.gpu_vendor,
        gpu_clear=node_checks.VENDORS[r.cluster.gpu_vendor]["clear"],
        node_check=check if node_checks.needed(check) else None,
        node_check_spec=json.dumps(check, separators=(",", ":")),
        check_node_py=_embedded("check_node.py"),
        keep_checkpoints=node_checks.keep_checkpoints(r) if ckpt else 0,
        node_check_ckpt=ckpt or "",
        secret_name_re=SECRET_NAME.pattern,
        pending_timeout=r.cluster.pending_timeout,
        watch_ray_py=_embedded("watch_ray.py"),
    )
    return env.get_template(TEMPLATE).render(ctx)


def render_array(r: Recipe, name: str, count: int, max_parallel=None) -> str:
    """A sweep's job-array script: the points' shared #SBATCH lines, one task per point."""
    from .paths import SweepPaths

    lines = [d for d in directives(r) if not d.startswith("--output=")]
    lines += [f"--output={SweepPaths.OUTPUT}",
              f"--array=0-{count - 1}" + (f"%{max_parallel}" if max_parallel else "")]
    return _env().get_template(SWEEP_TEMPLATE).render(
        version=__version__, recipe_file=_comment_safe(r.source), name=name, count=count,
        directives=lines, paths=RunPaths)


def _comment_safe(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)  # it sits in a comment line


def port_slots(r: Recipe) -> int:
    """How many jobs' port blocks fit in cluster.port_range."""
    lo, hi = r.cluster.port_range
    return (hi - lo + 1) // (RAY_FIXED_PORTS + r.cluster.worker_ports)


@lru_cache(maxsize=None)
def _embedded(name: str) -> str:
    """A helper script the job runs, inserted verbatim in a quoted heredoc."""
    return (templates_dir() / name).read_text().rstrip("\n")
