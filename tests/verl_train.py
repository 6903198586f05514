"""One verl training job on the sandbox and what it left, read from the real parts: verl's own
log (its console logger's `step:N - key:value - ...` lines), Ray's GCS (every actor and its
node, read while the job runs), and the loopback W&B stand-in (the trajectories weave traced,
the metrics wandb logged). Shared by tests/test_verl_job.py, `make demo-verl`
(tests/demo_verl.py) and bench/first_step_bench.py.

    job = train(node_python=..., runs=tmp/"runs", env=env)   # recipes/sandbox-verl.yaml, --wait
    job.state, job.steps[3]["actor/grad_norm"], job.nodes_of("vLLMHttpServer"), job.trajectories
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from wandb_standin import StandIn

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "sandbox-verl.yaml"
# vLLM keeps what it learns of a model class (a ~13 s subprocess per engine, two per job) in
# VLLM_CACHE_ROOT, by default under HOME, which a user's jobs share. Each test job has a HOME of
# its own: without this, every job would learn it again. Checked by vLLM against the module's hash.
VLLM_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "verl-launch-vllm-cache"
BRIDGE = "169.254.77.1"  # the host's side of the sandbox's bridge: the nodes reach the stand-in there
NODE_IP = {f"169.254.77.1{i}": f"node{i}" for i in range(1, 10)}
# A trajectory: the root call of an agent loop's trace (verl's SingleTurnAgentLoop.run, or the
# example CheckedAgentLoop.run with verl's inside it), one per sample and rollout.
TRAJECTORY = "AgentLoop.run"


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def phases(run_dir) -> list:
    try:
        return [json.loads(x) for x in Path(run_dir, "phases.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def _number(text: str):
    text = re.sub(r"^np\.\w+\((.*)\)$", r"\1", text.strip())  # verl logs numpy scalars by repr
    try:
        return float(text)
    except ValueError:
        return text


def parse_steps(log: str) -> Dict[int, Dict[str, object]]:
    """verl's console logger lines, by step: {step: {metric: value}} (the last line of a step wins)."""
    steps = {}
    lines = plain(log).splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"(?<![\w/])step:(\d+) - (.*)$", line)
        if not m:
            continue
        body = m.group(2)
        # Ray's log streaming may cut a long line: the rest follows without Ray's "(Actor pid=N)"
        for rest in lines[i + 1:]:
            if rest.startswith("(") or " - " not in rest or not re.match(r"^[\w/.\-]*:", rest):
                break
            body += rest
        metrics = {}
        for part in body.split(" - "):
            key, sep, value = part.partition(":")
            if sep:
                metrics[key.strip()] = _number(value)
        steps[int(m.group(1))] = metrics
    return steps


# Run apart from the caller: Ray's GCS client aborts its process once the GCS has been gone a while.
_GCS_PEEK = """
import json, os, sys, time
# The job's own token (RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH in this process's environment): read by the job's user.
from ray._private.internal_api import get_state_from_address
address, out = sys.argv[1], sys.argv[2]
state, seen = get_state_from_address(address), {}
while True:
    try:
        for actor_id, a in state.actor_table(None).items():
            seen[actor_id] = [a["ActorClassName"].rsplit(".", 1)[-1], a["Address"]["IPAddress"], a["State"]]
        with open(out + ".tmp", "w") as f:
            json.dump(seen, f)
        os.replace(out + ".tmp", out)
    except Exception:
        pass
    time.sleep(1)
"""


class GcsWatch(threading.Thread):
    """Ray's own view of the job's cluster, read from its GCS with Ray's state accessor while
    the job runs (in a process of its own): every actor seen, by class, with its node."""

    def __init__(self, run_dir: Path):
        super().__init__(daemon=True)
        self.run_dir, self.stop, self.address, self.proc = run_dir, threading.Event(), None, None
        self.out = run_dir.parent / f".gcs-{run_dir.name}.json"

    def run(self):
        while not self.stop.is_set() and self.proc is None:
            head = [p for p in phases(self.run_dir) if p["phase"] == "head-up"]
            if head:
                self.address = head[-1]["detail"]
                tokens = sorted(self.run_dir.glob(".ray-token.r*"), key=lambda p: p.stat().st_mtime)
                env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tokens[-1])) if tokens else None
                self.proc = subprocess.Popen([sys.executable, "-c", _GCS_PEEK, self.address, str(self.out)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            self.stop.wait(0.5)
        self.stop.wait()
        if self.proc:
            self.proc.kill()
            self.proc.wait()

    @property
    def seen(self) -> dict:
        try:
            raw = json.loads(self.out.read_text())
        except (OSError, ValueError):
            return {}
        return {k: (c, NODE_IP.get(ip, ip), st) for k, (c, ip, st) in raw.items()}


@dataclass
class Trained:
    """What one job left. `out`/`err`: `submit --wait`'s own output."""
    returncode: int
    out: str
    err: str
    run_dir: Optional[Path]
    actors: dict  # GCS actor id -> (class, node, state)
    calls: list  # every finished weave call the stand-in got
    wandb_runs: dict  # the stand-in's W&B runs (run id -> what wandb sent)
    url: str
    seconds: float
    submitted_at: float
    first_log: Dict[int, float] = field(default_factory=dict)  # step -> when its line first appeared (epoch s)

    @property
    def log(self) -> str:
        try:
            return plain((self.run_dir / "logs" / "driver.r0.log").read_text(errors="replace"))
        except (OSError, TypeError):
            return ""

    @property
    def steps(self) -> Dict[int, Dict[str, object]]:
        return parse_steps(self.log)

    @property
    def phases(self) -> list:
        return phases(self.run_dir) if self.run_dir else []

    @property
    def job_id(self) -> Optional[str]:
        try:
            return str(json.loads((self.run_dir / "run.json").read_text())["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def run_record(self) -> dict:
        return json.loads((self.run_dir / "run.json").read_text())

    def nodes_of(self, cls: str) -> List[str]:
        return sorted(node for c, node, _ in self.actors.values() if c == cls)

    @property
    def trajectories(self) -> list:
        return [c for c in self.calls if c["short_name"].endswith(TRAJECTORY) and not c.get("parent_id")]

    @property
    def checkpoint(self) -> Optional[Path]:
        """verl's newest checkpoint: the last folder its trainer says it saved
        (`local_global_step_folder: .../global_step_N`), if verl's tracker file names that step."""
        saved = re.findall(r"local_global_step_folder: (\S+)", self.log)
        if not saved:
            return None
        folder = Path(saved[-1])
        try:
            step = (folder.parent / "latest_checkpointed_iteration.txt").read_text().strip()
        except OSError:
            return None
        return folder if folder.name == f"global_step_{step}" else None


class _StepTail:
    """When each `step:N` line first appears in the driver log (read as it grows)."""

    def __init__(self):
        self.offset, self.rest = 0, b""

    def poll(self, path: Path, first: dict) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        self.offset += len(chunk)
        lines = (self.rest + chunk).split(b"\n")
        self.rest = lines.pop()
        now = time.time()
        for step in re.findall(rb"\bstep:(\d+) - ", b"\n".join(lines)):
            first.setdefault(int(step), now)


RUN_DIR_LINE = re.compile(r"^\s+run dir\s+(\S+)\s*$")  # submit's "  run dir  PATH" line


def train(*, node_python, runs: Path, env: dict, overrides=(), entity: str = "team", timeout: float = 900,
          echo: bool = False, during=None, standin: Optional[StandIn] = None, recipe: Path = RECIPE,
          watch_gcs: bool = False) -> Trained:
    """Submit RECIPE, recipes/sandbox-verl.yaml by default (`submit --wait`), with NODE_PYTHON on the nodes and a
    W&B stand-in on the sandbox's bridge (ENV's WANDB_API_KEY is its key), and collect.
    DURING(run_dir, first_log) is called as the job runs (first_log: step -> when first logged).
    STANDIN: a stand-in of the caller's (on BRIDGE), left running after the job, to read from.
    WATCH_GCS: read Ray's actors from its GCS while the job runs (Trained.actors, nodes_of): a
    process polling beside the job, which the 2-core sandbox's jobs feel; only where it is read."""
    key = env["WANDB_API_KEY"]
    with (contextlib.nullcontext(standin) if standin else StandIn(host=BRIDGE, api_key=key)) as w:
        cmd = [sys.executable, "-m", "launcher.cli", "submit", str(recipe), f"runtime.python={node_python}",
               f"paths.runs={runs}", f"wandb.base_url={w.url}", f"wandb.entity={entity}",
               "wandb.reach_timeout=5", *overrides, "--wait"]
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT, stdin=subprocess.DEVNULL)
        err_lines: list = []
        errs = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)
        errs.start()
        out_lines, run_dir, gcs, first, tail = [], None, None, {}, _StepTail()
        reader = threading.Thread(target=lambda: [out_lines.append(x) or (echo and print(x, end="", flush=True))
                                                  for x in proc.stdout], daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if run_dir is None:
                # submit names its run dir; a glob under RUNS could find an older run (job ids repeat)
                said = [m.group(1) for m in map(RUN_DIR_LINE.match, list(out_lines)) if m]
                if said:
                    run_dir = Path(said[0])
                    if watch_gcs:
                        gcs = GcsWatch(run_dir)
                        gcs.start()
            else:
                tail.poll(run_dir / "logs" / "driver.r0.log", first)
                if during is not None:
                    during(run_dir, first)
            time.sleep(0.25)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(10)
        errs.join(10)
        if run_dir is None:  # it ended before the loop saw its run dir
            run_dir = next((Path(m.group(1)) for m in map(RUN_DIR_LINE.match, out_lines) if m), None)
        if gcs:
            gcs.stop.set()
            gcs.join(5)
        calls, wandb_runs = list(w.calls), dict(getattr(w, "runs", {}))
    return Trained(proc.returncode, "".join(out_lines), "".join(err_lines), run_dir, gcs.seen if gcs else {},
                   calls, wandb_runs, w.url, time.time() - t0, t0, first)


def assert_trained(job: "Trained", steps: int) -> None:
    """What every training job must show: COMPLETED with every trajectory arrived as estimated;
    verl's log steps 1..STEPS, each with a real gradient and vLLM's token probabilities matching
    the actor's after the weight sync."""
    assert job.returncode == 0, job.out[-3000:] + job.err[-2000:]
    last, traced = job.out.strip().splitlines()[-2:]
    assert last.startswith(f"job {job.job_id} COMPLETED"), last
    assert re.fullmatch(rf"traces +\d+ received, steps 1-{steps}, \d+/step as estimated", traced), traced
    assert sorted(job.steps) == list(range(1, steps + 1)), job.log[-3000:]
    for n, m in job.steps.items():
        assert m["actor/grad_norm"] > 0, (n, m)
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.99, (n, m)  # the synced weights reached vLLM


def descendants(pid: int) -> List[int]:
    """PIDs of PID's children, their children, and so on (from /proc)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


class EngineKill:
    """Kill (SIGKILL) the vLLM EngineCore process on NODE AFTER s once verl has logged step AT: the
    engine process under that node's vLLMHttpServer actor, whose PID the job's own Ray state
    (logs/ray-state.r0.json) names; `killed` is when, `pid` what. FREEZE_TRAINER: first SIGSTOP
    verl's fit loop (its TaskRunner actor), a trainer that waits on the engine for ever (as verl
    did when the engine died in a weight sync) rather than fail of it."""

    def __init__(self, node: str = "node2", at: int = 2, after: float = 0.0, freeze_trainer: bool = False):
        self.node, self.at, self.after, self.killed, self.pid, self.why_not = node, at, after, None, None, ""
        self.freeze_trainer, self.frozen = freeze_trainer, None

    def __call__(self, run_dir: Path, first: dict) -> None:
        if self.killed is not None or self.at not in first or time.time() < first[self.at] + self.after:
            return
        try:
            state = json.loads((run_dir / "logs" / "ray-state.r0.json").read_text())
        except (OSError, ValueError):
            return
        servers = [a["pid"] for a in state["actors"]
                   if a["class"] == "vLLMHttpServer" and a["host"] == self.node and a["state"] == "ALIVE"]
        for pid in servers:
            for kid in descendants(pid):
                try:
                    title = Path(f"/proc/{kid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"EngineCore" in title:
                    if self.freeze_trainer:  # verl's fit loop (the TaskRunner actor) stops where it is
                        self.frozen = next(a["pid"] for a in state["actors"]
                                           if a["class"] == "TaskRunner" and a["state"] == "ALIVE")
                        os.kill(self.frozen, signal.SIGSTOP)
                    os.kill(kid, signal.SIGKILL)
                    self.killed, self.pid = time.time(), kid
                    return
        self.why_not = f"no EngineCore under vLLMHttpServer {servers} on {self.node}"


class Busy:
    """N processes spinning on the CPU beside the job from its step AT on (as `during`): the load
    of CI's machine, under which the last step's traces were lost when verl's driver ended.
    stop() kills them by PID; `started` is when they began."""

    def __init__(self, at: int = 1, n: int = 2):
        self.at, self.n, self.procs, self.started = at, n, [], None

    def __call__(self, run_dir: Path, first: dict) -> None:
        if self.started is None and self.at in first:
            self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
                          for _ in range(self.n)]
            self.started = time.time()

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def kill_engine_mid_training(*, node_python, runs: Path, env: dict, freeze_trainer: bool = False,
                             standin: Optional[StandIn] = None, grace: Optional[int] = None) -> tuple:
    """recipes/sandbox-verl.yaml for 60 steps; node2's EngineCore SIGKILLed 2.2 s after verl's
    step 2 (in the actor update, before the weight sync; FREEZE_TRAINER: verl's fit loop
    SIGSTOPped first). (the job, the EngineKill, seconds from the kill to `submit --wait`'s end).
    STANDIN: the caller's W&B stand-in, to read the traces from after the job. GRACE: the
    watchdog's cluster.death_grace (None: the recipe's)."""
    kill = EngineKill(node="node2", at=2, after=2.2, freeze_trainer=freeze_trainer)
    job = train(node_python=node_python, runs=runs, env=env, timeout=600, during=kill, standin=standin,
                overrides=["verl.overrides.trainer.total_training_steps=60", "verl.overrides.trainer.save_freq=-1",
                           "wandb.experiment=dead-engine",
                           # one agent-loop worker: a process fewer to start; the engine killed is
                           # node2's, whichever node the worker is on
                           "verl.overrides.actor_rollout_ref.rollout.agent.num_workers=1",
                           *([f"cluster.death_grace={grace}"] if grace is not None else [])])
    return job, kill, (job.submitted_at + job.seconds - kill.killed) if kill.killed else None


def job_env(base: dict, *, wandb_key: str, smoke, tmp) -> dict:
    """What a training job is submitted with: BASE without the developer's W&B settings or a
    Slurm job's (SLURM_CONF, which Slurm it is, stays), the stand-in's key, the smoke assets, and
    a launcher state and HOME of its own under TMP (vLLM's cache shared: VLLM_CACHE)."""
    env = {k: v for k, v in base.items() if not k.startswith(("WANDB_", "SLURM_")) or k == "SLURM_CONF"}
    return dict(env, WANDB_API_KEY=wandb_key, HOME=f"{tmp}/home", VLLM_CACHE_ROOT=str(VLLM_CACHE),
                VERL_SMOKE_DIR=str(smoke), VERL_LAUNCH_STATE=f"{tmp}/state")


def bench_args(doc: str, argv=None):
    """A sandbox bench's command line and preconditions: (args, the smoke assets' directory)."""
    import argparse
    import os

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--node-python", default=str(ROOT / ".venv-node" / "bin" / "python"))
    args = ap.parse_args(argv)
    if "SLURM_CONF" not in os.environ:
        sys.exit("no SLURM_CONF: eval \"$(tests/cluster/sandbox-up.sh)\" first")
    smoke = Path(os.environ.get("VERL_SMOKE_DIR", "/tmp/verl-launch-smoke"))
    if not (smoke / "reward.py").exists():
        sys.exit(f"no smoke assets in {smoke}: python -m launcher.smoke_assets --out {smoke}")
    return args, smoke
