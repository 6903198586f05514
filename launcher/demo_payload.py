"""The sandbox demo's driver: what the job gave it, seen from every Ray node. It does not train.

Run by the rendered script in place of ``verl.trainer.main_ppo``, with the same argv (verl's
Hydra overrides) and ``RAY_ADDRESS``. It parses the argv with Hydra's own override parser,
runs one task on every Ray node and one per GPU, reports the W&B settings each node's
processes see (the key only as present/absent and a short digest), writes
``demo-report.r<restart>.json`` into the run directory, and exits non-zero if the cluster does not
match ``trainer.nnodes`` x ``trainer.n_gpus_per_node``. ``demo.exit_code=N`` makes it exit N
after reporting (to show a failing entrypoint), ``demo.hold=S`` sleeps S seconds first
(``demo.hold_first=S``: in the first run only, not after a requeue).
``demo.trace=true`` runs verl's real rollout-tracing code in a Ray actor on every node (see
``trace_on_every_node``); it needs verl and weave on the nodes. ``demo.stuck=N`` then waits on
an actor that asks for N CPUs (more than a node has: work the job's watchdog must catch).
``demo.train_steps=N`` prints N training steps as verl's trainer and console logger do, one
every ``demo.step_seconds`` (default 1), after ``demo.warmup`` seconds (a slow start).
``demo.actor_dies=true`` starts an actor on a worker node whose process is then killed, and
does not ask it anything (a trainer waiting on a dead worker); ``demo.actor_says=TEXT``: it
prints TEXT first (a line of the driver's log from that node, as a GPU error would be). ``demo.raise_with_env=NAME``
raises an exception whose message holds that variable's value. ``demo.actor_fault=KIND`` starts
an actor on a worker node, waits on its work, and the actor's process dies of KIND: ``segv`` (a
segfault in native code), ``thread`` (a background thread raises, then the process exits) or
``sigkill`` (killed from outside, as the kernel's OOM killer does): the driver fails with Ray's
ActorDiedError, and the cause is in the dead worker's own log (``demo.fault_noise_mb=N``: N MiB
of random bytes written to that log first). ``demo.lingers=true`` leaves a
process on every node that ignores SIGTERM and outlives its Ray worker (as a compile worker or
an engine's child can): the job's teardown must still leave nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

# What a GPU worker sees of every vendor's visibility variable (the job keeps its vendor's).
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
            "GPU_DEVICE_ORDINAL")
WANDB_VARS = ("WANDB_PROJECT", "WANDB_NAME", "WANDB_ENTITY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME",
              "WANDB_RUN_GROUP", "WANDB_JOB_TYPE")
# What a requeued job's trainer sees: the restart count, and the checkpoint deadline for verl.
JOB_VARS = ("SLURM_RESTART_COUNT", "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP")
# The demo recipe's runtime.setup exports SETUP_HOST=$(hostname): where setup ran for a process.
SETUP_VAR = "SETUP_HOST"
_HELD: list = []  # actors the driver keeps a handle on
ECHO_PREFIX = "DEMO_ECHO_"  # variables reported verbatim (the tests pass hostile values this way)


def what_i_see() -> dict:
    key = os.environ.get("WANDB_API_KEY", "")
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "wandb_api_key": {"present": bool(key),
                          "sha256_12": hashlib.sha256(key.encode()).hexdigest()[:12] if key else None},
        **{v: os.environ.get(v) for v in (*WANDB_VARS, *JOB_VARS, SETUP_VAR)},
        "echo": {k: v for k, v in os.environ.items() if k.startswith(ECHO_PREFIX)},
    }


def parse_argv(argv: list) -> dict:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(argv)
    return {o.key_or_group: o.value() for o in parsed}


def as_config(overrides: dict) -> dict:
    """The overrides as a config the way verl's Hydra app holds them (interpolations resolved)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create()
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return OmegaConf.to_container(cfg, resolve=True)


def trace_on_every_node(ray, nodes: list, config: dict, step: int = 1) -> list:
    """What verl's agent-loop workers do, on every node: ``RolloutTraceConfig.init`` with the
    job's trace settings, then trajectories wrapped in ``rollout_trace_attr``, each a
    ``rollout_trace_op`` method that calls the example tool (itself traced). Returns what each
    node traced."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    trace = config["actor_rollout_ref"]["rollout"]["trace"]
    trainer = config["trainer"]

    @ray.remote(num_cpus=0)
    class TracingWorker:
        def run(self, worker: int) -> dict:
            import asyncio

            from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op

            from launcher.examples.calculator_tool import CalculatorTool

            class DemoAgentLoop:  # an agent loop's shape: one traced run per trajectory
                def __init__(self):
                    self.tool = CalculatorTool(config={}, tool_schema=None)

                @rollout_trace_op
                async def run(self, question: str, expression: str, answer: str) -> dict:
                    instance, _ = await self.tool.create(ground_truth=answer)
                    response, reward, _ = await self.tool.execute(instance, {"expression": expression})
                    return {"question": question, "tool_response": response.text, "reward": reward}

            RolloutTraceConfig.init(project_name=trainer["project_name"], experiment_name=trainer["experiment_name"],
                                    backend=trace.get("backend"), token2text=bool(trace.get("token2text")))
            loop = DemoAgentLoop()

            async def trajectories():
                for rollout_n in range(2):  # two rollouts of this worker's sample, as GRPO does
                    with rollout_trace_attr(sample_index=worker, step=step, rollout_n=rollout_n):
                        await loop.run(f"what is 6 x {7 + worker}?", f"6 * {7 + worker}", str(6 * (7 + worker)))

            asyncio.run(trajectories())
            if RolloutTraceConfig.get_backend() == "weave":
                import weave

                weave.finish()  # send every finished call before the job moves on
            return {"hostname": socket.gethostname(), "backend": RolloutTraceConfig.get_backend(),
                    "worker": worker}

    workers = [TracingWorker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
               for n in nodes]
    return ray.get([w.run.remote(i) for i, w in enumerate(workers)])


def log_to_wandb(ray, node: dict, overrides: dict) -> dict:
    """``demo.wandb_steps=N``: N steps logged to W&B as verl's legacy trainer logs them (verl's own
    Tracking, in a Ray actor on NODE, never finished: the trainer leaves that to Tracking.__del__).
    The actor lives on until Ray ends it with the driver. Returns {step: value} as logged."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class Trainer:
        def fit(self, steps: int, experiment: str) -> dict:
            from verl.utils.tracking import Tracking

            self.tracking = Tracking(os.environ.get("WANDB_PROJECT", "demo"), experiment, ["wandb"],
                                     config={"trainer": {"experiment_name": experiment}})
            logged = {}
            for step in range(1, steps + 1):
                logged[step] = round(1.0 / step, 6)
                self.tracking.log(data={"demo/loss": logged[step]}, step=step)
            return logged

    trainer = Trainer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
    experiment = os.environ.get("WANDB_NAME", "demo")
    return {"node": node["NodeManagerAddress"],
            "steps": ray.get(trainer.fit.remote(int(overrides["demo.wandb_steps"]), experiment))}


def main(argv: list) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    overrides = parse_argv(argv)
    address = os.environ["RAY_ADDRESS"]
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]

    @ray.remote(num_cpus=0)
    def on_node():
        return dict(what_i_see(), ip=ray.util.get_node_ip_address())

    @ray.remote(num_gpus=1, num_cpus=0)
    def on_gpu():
        return socket.gethostname(), os.environ.get("CUDA_VISIBLE_DEVICES"), {v: os.environ.get(v) for v in GPU_VARS}

    seen = ray.get([on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                    for n in nodes])
    gpus = int(ray.cluster_resources().get("GPU", 0))
    on_gpus = sorted(ray.get([on_gpu.remote() for _ in range(gpus)]), key=lambda t: t[:2])
    gpu_tasks = [t[:2] for t in on_gpus]
    traced = trace_on_every_node(ray, nodes, as_config(overrides)) if overrides.get("demo.trace") else None
    if overrides.get("demo.wandb_steps"):  # on a worker node, if there is one
        here = ray.util.get_node_ip_address()
        logged = log_to_wandb(ray, ([n for n in nodes if n["NodeManagerAddress"] != here] or nodes)[0], overrides)
    else:
        logged = None
    if overrides.get("demo.lingers"):
        @ray.remote(num_cpus=0)
        def linger():
            import subprocess
            # an orphan at once (its parent exits): Ray's own reaping of a worker's children misses it
            code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
            spawn = f"import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
            return int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)

        lingering = ray.get([linger.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                             .remote() for n in nodes])
        print(f"left lingering processes {lingering} (demo.lingers)", flush=True)
    report = {
        "traced": traced,
        "wandb_logged": logged,
        "ray_address": address,
        "argv": argv,
        "overrides": overrides,
        "config": as_config(overrides),
        "driver": what_i_see(),
        "nodes": sorted(seen, key=lambda s: s["hostname"]),
        "cluster_gpus": gpus,
        "gpu_tasks": gpu_tasks,
        "gpu_env": [t[2] for t in on_gpus],
    }
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    with open(f"demo-report.r{restart}.json", "w") as f:
        json.dump(report, f, indent=2, default=str)
    ray.shutdown()

    print(f"verl-launch sandbox demo: Ray at {address}, {len(seen)} node(s), {gpus} GPU(s)")
    for s in report["nodes"]:
        key = "WANDB_API_KEY present" if s["wandb_api_key"]["present"] else "WANDB_API_KEY MISSING"
        print(f"  {s['hostname']:<8} {s['ip']:<16} {key}, project={s['WANDB_PROJECT']} "
              f"experiment={s['WANDB_NAME']} run_id={s['WANDB_RUN_ID']} setup ran on {s[SETUP_VAR]}")
    print(f"  GPU tasks ran on: {', '.join(f'{h}[{c}]' for h, c in gpu_tasks)}")
    print("  verl overrides received:")
    for a in argv:
        print(f"    {a}")

    want_nodes = overrides.get("trainer.nnodes")
    want_gpus = (want_nodes or 0) * (overrides.get("trainer.n_gpus_per_node") or 0)
    if len(seen) != want_nodes or gpus != want_gpus:
        print(f"ERROR: Ray has {len(seen)} nodes / {gpus} GPUs, verl was told "
              f"{want_nodes} x {overrides.get('trainer.n_gpus_per_node')}", file=sys.stderr)
        return 1
    missing = [s["hostname"] for s in seen if not s["wandb_api_key"]["present"]]
    if missing:
        print(f"ERROR: WANDB_API_KEY missing on {', '.join(missing)}", file=sys.stderr)
        return 1
    stuck = overrides.get("demo.stuck")
    if stuck:  # an actor no node can hold: verl's silent wait, in miniature
        @ray.remote(num_cpus=int(stuck))
        class TooBig:
            def ping(self):
                return 1

        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        print(f"waiting on an actor that needs {stuck} CPUs (demo.stuck)", flush=True)
        ray.get(TooBig.remote().ping.remote())
    if overrides.get("demo.actor_dies"):
        ray.init(address=address, logging_level="ERROR", log_to_driver=bool(overrides.get("demo.actor_says")))
        here = ray.util.get_node_ip_address()  # the head: the doomed actor goes to a worker node
        there = [n for n in nodes if n["NodeManagerAddress"] != here] or nodes
        _HELD.append(_doomed_actor(there[-1]["NodeID"], overrides.get("demo.actor_says")))  # held: "needed"
    fault = overrides.get("demo.actor_fault")
    if fault:  # a trainer waiting on a worker that dies: Ray's ActorDiedError, in the driver
        ray.init(address=address, logging_level="ERROR")
        here = ray.util.get_node_ip_address()
        there = [n for n in nodes if n["NodeManagerAddress"] != here] or nodes
        _faulty_actor(there[-1]["NodeID"], str(fault), float(overrides.get("demo.fault_noise_mb", 0)))
    time.sleep(float(overrides.get("demo.warmup", 0)))
    steps = int(overrides.get("demo.train_steps", 0))
    if steps:  # a training run's console, in verl's own words (its trainer's line, its logger)
        from verl.utils.logger.aggregate_logger import LocalLogger

        print(f"Total training steps: {steps}", flush=True)
        console, pace = LocalLogger(print_to_console=True), float(overrides.get("demo.step_seconds", 1))
        for step in range(1, steps + 1):
            t0 = time.monotonic()
            time.sleep(pace)
            console.log({"timing_s/step": round(time.monotonic() - t0, 3), "actor/pg_loss": 0.5 / step}, step=step)
    hold = float(overrides.get("demo.hold", 0))
    if os.environ.get("SLURM_RESTART_COUNT", "0") == "0":  # the first run only: a requeued one ends
        hold = hold or float(overrides.get("demo.hold_first", 0))
    if hold:  # keep the job in its training phase, for fault tests
        print(f"holding for {hold:g} s (demo.hold)", flush=True)
        time.sleep(hold)
    leak = overrides.get("demo.raise_with_env")
    if leak:  # a driver whose exception carries a variable's value (the job must not repeat it)
        raise RuntimeError(f"the demo driver failed as asked (demo.raise_with_env): {os.environ.get(leak)}")
    code = int(overrides.get("demo.exit_code", 0))
    if code:
        print(f"exiting {code} as asked (demo.exit_code)", file=sys.stderr)
    return code


def _doomed_actor(node_id: str, says=None):
    """An actor on node NODE_ID whose process is SIGKILLed once it is up (Ray: WORKER_DIED); the
    actor is kept referenced, and never asked anything again."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_restarts=0)
    class Doomed:
        def where(self):
            return ray.util.get_node_ip_address(), os.getpid()

        def die(self, says):
            if says:
                print(says, flush=True)
                time.sleep(3)  # Ray streams it to the driver
            os.kill(os.getpid(), 9)

    actor = Doomed.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    ip, pid = ray.get(actor.where.remote())
    actor.die.remote(says)
    print(f"the actor on {ip} (pid {pid}) was killed (demo.actor_dies)", flush=True)
    return actor


FAULTS = ("segv", "thread", "sigkill")


def _faulty_actor(node_id: str, kind: str, noise_mb: float = 0) -> None:
    """An actor on node NODE_ID whose process dies of KIND while the driver waits on its work
    (ray.get raises Ray's ActorDiedError here)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if kind not in FAULTS:
        raise ValueError(f"demo.actor_fault: {kind!r} is none of {', '.join(FAULTS)}")

    @ray.remote(num_cpus=0, max_restarts=0)
    class RolloutShard:
        def where(self):
            return ray.util.get_node_ip_address(), os.getpid()

        def work(self, kind, noise_mb=0):
            time.sleep(2)  # the driver is waiting
            if noise_mb:  # a log of binary garbage before the end (the job keeps a bounded tail)
                junk = os.urandom(1 << 20)
                for _ in range(int(noise_mb)):
                    sys.stderr.buffer.write(junk)
                sys.stderr.flush()
            if kind == "segv":
                import ctypes
                ctypes.string_at(0)  # a read of address 0, as a broken extension does
            elif kind == "thread":
                import threading

                def load():
                    raise RuntimeError("the loader thread failed: shard 3 is corrupt (demo.actor_fault)")

                loader = threading.Thread(target=load, name="loader")
                loader.start()
                loader.join()
                sys.stderr.flush()
                os._exit(3)  # the process gives up without its loader
            elif kind == "sigkill":
                time.sleep(120)  # busy until killed from outside
            return "done"

    actor = RolloutShard.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    ip, pid = ray.get(actor.where.remote())
    print(f"waiting on RolloutShard on {ip} (pid {pid}), which dies of {kind} (demo.actor_fault)", flush=True)
    if kind == "sigkill":
        @ray.remote(num_cpus=0)
        def kill(pid):
            time.sleep(2)
            os.kill(pid, 9)  # from another process, as the OOM killer does: no last words

        kill.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pid)
    ray.get(actor.work.remote(kind, noise_mb))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
