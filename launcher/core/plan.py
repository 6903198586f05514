"""The plan: everything a job needs, worked out once from a checked recipe, and never again.
api.dryrun resolves it once verl's preflight has said its word (with verl's own resolved values;
recipe.load's Loaded.plan is the same without them, for `render`); render fills the job script
from it alone; check, submit, sweeps, local mode and the Python API read the same values from it.
Pure: no I/O.

What is in it: the #SBATCH directives, verl's argument list, the job's environment and what it
exports for W&B (never the key), pyxis's container arguments, the Ray port slots, the
allocation check's spec, the checkpoint directory and the pruning limit at a restart, and the
GPU variables to clear, all from verl's effective values (the recipe's overrides, then the
derived ones) computed once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..checks import node_checks
from ..base.checkpoints import layout
from ..checks.fields import stall_timeout
from ..checks.values import capacity, effective, is_launcher_stand_in, resume_from, whole
from ..base.overrides import flushes, verl_args
from ..base.schema import Recipe
from ..checks.secrets import needs_key, wandb_host
from ..checks.verl_resources import DEFAULTS

RAY_FIXED_PORTS = 9  # GCS .. dashboard; the template lays them out, then the worker ports


@dataclass(frozen=True)
class Runtime:
    """What each node runs, and how it gets there."""
    source: str  # the recipe file (the script names it in a comment)
    setup: Tuple[str, ...]  # runtime.setup lines
    python: str
    entrypoint: str
    secrets: Tuple[str, ...]  # names of the variables the nodes need (never their values)
    api_key_file: Optional[str]


@dataclass(frozen=True)
class Ray:
    """The Ray cluster the job brings up across its nodes."""
    nodes: int
    gpus: int  # per node
    cpus: int  # per node, for Ray
    object_store_memory: Any
    ready_timeout: Any
    start_retries: int
    monitor: Any
    network_interface: str
    port_min: int
    worker_ports: int
    gpu_vendor: str


@dataclass(frozen=True)
class Restarts:
    requeue: bool
    signal_seconds: int
    max_restarts: int
    pending_timeout: Any
    death_grace: int  # the watchdog's wait for the driver's own error after a death


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    runtime: Runtime
    ray: Ray
    restarts: Restarts
    on_unreachable: str  # trace.on_unreachable
    reach_weave: bool  # the in-job reachability check asks Weave too
    directives: Tuple[str, ...]
    verl_args: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...]  # the recipe's env and what the launcher adds (NCCL_/GLOO_SOCKET_IFNAME)
    wandb_needed: bool  # W&B logging or Weave tracing: the key must reach the nodes
    reach_timeout: float  # the in-job W&B reachability check's (0: none)
    wandb_env: Tuple[Tuple[str, str], ...]  # W&B settings every node exports (never the key)
    wandb_service: bool  # verl logs to W&B: each node runs wandb's service for Ray (templates/wandb_service.py)
    wandb_host: Optional[str]
    container_args: Tuple[str, ...]
    image_file: Optional[str]  # a squashfs container.image every node must see before Ray (None: no such check)
    ray_auth: bool  # Ray's token authentication (off only with cluster.ray_auth_off's reason)
    port_slots: int  # how many jobs' port blocks fit in cluster.port_range
    node_check: Dict[str, Any]  # the allocation check's spec (node_checks.spec)
    node_check_json: str  # the same, as templates/check_node.py's argument
    node_check_needed: bool
    checkpoint_dir: Optional[str]  # verl's, absolute (None: relative or unset)
    keep_checkpoints: int  # verl's limit, enforced at a restart; 0 = keep all
    gpu_clear: Tuple[str, ...]  # other vendors' GPU variables Slurm may set
    exclude_bad_nodes: bool  # requeue without a node the failure is put down to
    stall_timeout: str  # the watchdog's: "auto", "off" or seconds (checks.stall_timeout)
    resume_mode: str  # verl's trainer.resume_mode (launcher.prior: what a submit starts from)
    resume_from: Optional[str]  # cluster.resume_from: None, "latest-complete" or a step (checks.resume_from)
    checkpoint_layout: Dict[str, Any]  # what a loadable global_step_N holds for this run (checkpoints.layout)
    verl: Dict[str, Any]  # verl's effective values (checks.effective): overrides, derived, verl's own
    verl_resolved: bool  # verl's preflight gave its resolved values (else the recipe's alone)
    cpu_need: Any  # what verl's Ray actors hold per node (verl_resources.Need; None: not verl)
    traces_per_step: Optional[int]  # rollout traces per training step (None: unknown; 0: no tracing)
    trace_flush: Optional[int]  # seconds each agent-loop worker waits for a step's traces to be sent (templates/trace_flush.py); None: no flush


def resolve(r: Recipe, blame=lambda key: "recipe", args: Optional[List[str]] = None,
            verl: Optional[Dict[str, Any]] = None) -> Plan:
    """The plan of a checked recipe (recipe.load has run its checks; ARGS: verl's argument list,
    if it has already made it; VERL: the values verl's preflight resolved, if it ran). Refuses
    (RecipeError) fewer CPUs per node than verl's actors hold there."""
    v = effective(r, verl, blame=blame)
    ckpt = node_checks.checkpoint_dir(v)
    spec = node_checks.spec(r, v, ckpt)
    c = r.cluster
    return Plan(
        recipe=r,
        runtime=Runtime(source=r.source, setup=tuple(r.runtime.setup), python=r.runtime.python,
                        entrypoint=r.verl.entrypoint, secrets=tuple(r.secrets), api_key_file=r.wandb.api_key_file),
        ray=Ray(nodes=c.nodes, gpus=c.gpus_per_node, cpus=c.cpus_per_task, object_store_memory=c.object_store_memory,
                ready_timeout=c.ready_timeout, start_retries=c.ray_start_retries, monitor=c.ray_monitor,
                network_interface=c.network_interface or "", port_min=c.port_range[0], worker_ports=c.worker_ports,
                gpu_vendor=c.gpu_vendor),
        restarts=Restarts(requeue=c.requeue, signal_seconds=c.signal_seconds, max_restarts=c.max_restarts,
                          pending_timeout=c.pending_timeout, death_grace=c.death_grace),
        on_unreachable=r.trace.on_unreachable,
        reach_weave=r.trace.backend == "weave",
        directives=tuple(directives(r)),
        verl_args=tuple(verl_args(r, blame) if args is None else args),
        env=tuple(job_env(r)),
        wandb_needed=needs_key(r),
        reach_timeout=r.wandb.reach_timeout if needs_key(r) else 0,
        wandb_env=tuple(wandb_env(r)),
        wandb_service=r.wandb.enabled,
        wandb_host=wandb_host(r),
        container_args=tuple(container_args(r)),
        ray_auth=r.cluster.ray_auth_off is None,
        image_file=r.container.image if (r.container.image or "").startswith("/") and r.node_checks.inputs else None,
        port_slots=port_slots(r),
        node_check=spec,
        node_check_json=json.dumps(spec, separators=(",", ":")),
        node_check_needed=node_checks.needed(spec),
        checkpoint_dir=ckpt,
        keep_checkpoints=node_checks.keep_checkpoints(v) if ckpt else 0,
        gpu_clear=tuple(node_checks.VENDORS[r.cluster.gpu_vendor]["clear"]),
        exclude_bad_nodes=r.cluster.requeue and r.cluster.exclude_bad_nodes is not False,
        stall_timeout=stall_timeout(r.cluster.stall_timeout),
        resume_mode=str(v.get("trainer.resume_mode") or "auto"),
        resume_from=resume_from(r, v, blame),
        # the launcher's stand-in driver saves no verl checkpoint: a step is its directory, as verl checks
        checkpoint_layout={"strategy": "any"} if is_launcher_stand_in(r) else layout(v),
        verl=v,
        verl_resolved=verl is not None,
        cpu_need=capacity(r, v, blame),
        traces_per_step=traces_per_step(r, v),
        trace_flush=r.trace.flush_timeout if flushes(r) else None,
    )


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
    # The job's Ray token's path wins over an image's own values of those names (pyxis: --container-env).
    own = ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"] if r.cluster.ray_auth_off is None else ["RAY_AUTH_MODE"]
    args.append("--container-env=" + ",".join([*own, *(e for e in k.env if e not in own)]))
    if not k.mount_home:
        args.append("--no-container-mount-home")
    return args


def wandb_env(r: Recipe) -> List[Tuple[str, str]]:
    """W&B settings every node exports before Ray starts (never the key: it stays in the env)."""
    w = r.wandb
    if not needs_key(r):
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
    env += [("WANDB_RUN_ID", wandb_run_id(w.entity, w.project, r.experiment)), ("WANDB_RESUME", "allow"),
            ("WANDB_ERROR_REPORTING", "false")]
    return env


def wandb_run_id(entity: Optional[str], project: Optional[str], experiment: Optional[str]) -> str:
    """One W&B run per experiment, across requeues and resubmits (an unset entity is "None")."""
    return hashlib.sha256(f"{entity}/{project}/{experiment}".encode()).hexdigest()[:16]


def job_env(r: Recipe) -> List[Tuple[str, str]]:
    """The recipe's env, and what the launcher adds unless the recipe sets it: with
    cluster.network_interface, NCCL's and gloo's sockets on that interface too (verl#726)."""
    env = dict(r.env)
    if r.cluster.network_interface:
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env.setdefault(name, r.cluster.network_interface)
    return sorted(env.items())


def port_slots(r: Recipe) -> int:
    """How many jobs' port blocks fit in cluster.port_range."""
    lo, hi = r.cluster.port_range
    return (hi - lo + 1) // (RAY_FIXED_PORTS + r.cluster.worker_ports)


def traces_per_step(r: Recipe, v: Dict[str, Any]) -> Optional[int]:
    """Traces per training step: every sample, or max_samples_per_step_per_worker per
    agent-loop worker, each with all its rollout.n rollouts. None when unknown. V: verl's
    effective values (checks.effective)."""
    if r.trace.backend == "none":
        return 0
    v = {**DEFAULTS, **v}
    n, workers = v["actor_rollout_ref.rollout.n"], v["actor_rollout_ref.rollout.agent.num_workers"]
    batch = v.get("data.train_batch_size")
    cap = r.trace.max_samples_per_step_per_worker
    if not (whole(n) and whole(workers)):
        return None  # not numbers verl would accept: its own checks say so
    if not whole(batch):
        return None if cap is None else cap * workers * n
    return batch * n if cap is None else min(cap * workers, batch) * n


# What traced calls cost in Weave, measured on the sandbox's tool-agent job (the stand-in's count
# of what weave wrote, tests/test_tool_agent_job.py): about 1.8 kB a call of its own (ids,
# attributes, times, the inputs verl passes); each token id about 5 bytes as JSON, in the root's
# ids and in every turn's generate (its prompt grows by the turns before); each response token's
# log-prob about 30 bytes, in the root and in the generate that wrote it; decoded text
# (trace.token2text) about 4 bytes a token more.
CALL_BYTES, ID_BYTES, LOGPROB_BYTES, TEXT_BYTES = 1800, 5, 30, 4


def trace_volume(r: Recipe, v: Dict[str, Any], per_step: Optional[int]) -> Optional[Tuple[int, int]]:
    """(calls, bytes) per training step, roughly, at verl's maximum lengths; None when unknown
    (a multi-turn loop with no max_assistant_turns). Per trajectory: single-turn, its run and its
    generate (2); multi-turn with T turns, about 3T: the run, each turn's generate, each call's
    parse and tool execution, and the calls a tool makes inside (the calculator's evaluate)."""
    if not per_step:
        return None
    v = {"data.max_prompt_length": 512, "data.max_response_length": 512, **v}  # verl's defaults
    mt = "actor_rollout_ref.rollout.multi_turn."
    turns = v.get(mt + "max_assistant_turns") if v.get(mt + "enable") else 1
    if not (whole(turns) and whole(v["data.max_prompt_length"]) and whole(v["data.max_response_length"])):
        return None
    calls = 2 if turns == 1 else 3 * turns
    ids = (1 + turns) * (v["data.max_prompt_length"] + v["data.max_response_length"])
    each = (calls * CALL_BYTES + ids * (ID_BYTES + (TEXT_BYTES if r.trace.token2text else 0))
            + 2 * v["data.max_response_length"] * LOGPROB_BYTES)
    return calls * per_step, each * per_step
