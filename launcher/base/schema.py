"""The recipe's schema: typed dataclasses that OmegaConf checks a composed recipe against.

The first step of the flow (schema -> overrides -> checks -> recipe.load -> plan): it imports
nothing else of the launcher's, so every later step may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional

from omegaconf import MISSING

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
    gpu_type: Optional[str] = None  # the cluster's gres type, e.g. h100: --gpus-per-node=h100:8
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
    # A worker whose `ray start` ends before its node registered with the head (a GCS not up
    # in time, a raylet that died starting) is started again, at most this many times.
    ray_start_retries: int = 2
    # Ray's autoscaler monitor on the head: a Slurm allocation never scales, and without it the
    # head starts about 10% sooner (bench/bringup_bench.py); true for `ray status`'s summary.
    ray_monitor: bool = False
    # Ray's token authentication (a token per job start, in the run directory, 0600) keeps
    # everyone but the job out of its Ray cluster. Turning it off takes a reason, which `check`
    # prints as a warning: anyone who reaches a node could then run code as you.
    ray_auth_off: Optional[str] = None
    object_store_memory: Optional[int] = None  # bytes per node; Ray's default when null
    network_interface: Optional[str] = None  # e.g. ib0: Ray uses its address on every node
    # Ray's ports, per job a block; below Linux's default ephemeral range (32768-60999): a port
    # there may be any outbound connection's on the node, and Ray's bind then fails (seen on CI)
    port_range: List[int] = field(default_factory=lambda: [20000, 32767])
    worker_ports: int = 200  # Ray worker ports per node per job
    # Preemption and time limits: --requeue, and USR1 this many seconds before the limit; the
    # job then tears down and requeues itself, at most max_restarts times, and resumes.
    requeue: bool = False
    signal_seconds: int = 300
    max_restarts: int = 3
    # Where verl resumes from when its tracker (latest_checkpointed_iteration.txt) would not take
    # it to the newest complete checkpoint (launcher/checkpoints.py). null: verl's tracker alone;
    # "latest-complete": at each start, the job writes the tracker for the newest complete step
    # where verl would not resume from it, and says so; a step (N, global_step_N or its absolute
    # path in trainer.default_local_dir): the job writes it at its first start. `submit --resume-from`.
    resume_from: Optional[str] = None
    # A failure put down to a node (its Ray ended, it never joined, only it failed the
    # allocation check, Ray lost it): requeue without that node. null: on with requeue.
    exclude_bad_nodes: Optional[bool] = None
    # The nodes' GPU vendor: Slurm's gres/gpu may set every vendor's visibility variable in a
    # step; the job clears the others' before Ray starts (verl refuses ROCR_ beside CUDA_).
    gpu_vendor: str = "nvidia"  # nvidia | amd | none (leave them as Slurm sets them)
    # While the driver runs, Ray work (actors, placement groups) that waits this long for
    # resources the cluster never frees fails the job, naming the shortfall (0: no watchdog).
    pending_timeout: int = 600
    # While verl trains: no new training step for this long fails the job (a trainer waiting on
    # a dead or stuck engine). Seconds; "auto": 10 x the slowest step seen, at least 1800 s;
    # "off". The clock starts at the first step; engine deaths and dead actors end it sooner.
    stall_timeout: Any = "auto"
    # After a vLLM engine or an actor the driver holds dies, the driver gets this many seconds to
    # fail of it in its own words before the watchdog ends the job (verl waits on a dead engine
    # for ever). Shorter ends a doomed run sooner; too short may cut off the driver's own error.
    death_grace: int = 20
    # What a GPU-hour costs here (any currency): `report` then gives the run's cost and the cost
    # per kept step. null: no cost shown.
    gpu_hour_price: Optional[float] = None


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
    group: Optional[str] = None  # WANDB_RUN_GROUP: runs shown together (a sweep sets its own name)
    job_type: Optional[str] = None  # WANDB_JOB_TYPE (a sweep sets "sweep")
    base_url: Optional[str] = None
    api_key_file: Optional[str] = None  # read inside the job; must be on the nodes
    reach_timeout: int = 10  # seconds for each node's reachability check (0: no check)
    finish_timeout: int = 120  # seconds each node's W&B service has, at the job's end, to send what is left


@dataclass
class Trace:
    backend: str = "weave"
    token2text: bool = True
    max_samples_per_step_per_worker: Optional[int] = None  # null: every sample
    warn_traces_per_step: int = 2000  # check/submit warn above this many traces per step
    # Before training, every node checks that W&B answers with the key: if not, `fail` the job
    # at once, or `disable` tracing (W&B metrics then go offline, for `wandb sync`) and go on.
    on_unreachable: str = "fail"
    # After each step's rollouts, every agent-loop worker waits this many seconds at most for its
    # Weave client to send the step's traces, so that none is lost when Ray kills the workers at
    # verl's end (1 s after a wait that timed out; 0: no wait, the last second's traces may be lost).
    flush_timeout: int = 60


@dataclass
class Verl:
    version: Optional[str] = None  # the verl the job runs, e.g. "0.9.1"; null: the newest known
    entrypoint: str = "verl.trainer.main_ppo"
    # Hydra's --config-name and --config-path for the entrypoint (null: its own default, verl's
    # ppo_trainer): ppo_megatron_trainer, or a recipe module's own config in its own folder.
    config_name: Optional[str] = None
    config_path: Optional[str] = None  # absolute: the folder the config name is looked up in
    overrides: Dict[str, Any] = field(default_factory=dict)
    # Keys (or sections) of your own verl build that verl's config snapshot does not know:
    # the launcher's key check leaves them to verl.
    extra_keys: List[str] = field(default_factory=list)


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
    verl_version: bool = True  # the nodes' verl (in the container, if any) is verl.version


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
