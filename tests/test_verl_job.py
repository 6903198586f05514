"""verl's own trainer (`python -m verl.trainer.main_ppo`) under the launcher, on the real Slurm
sandbox: 2 nodes x 2 fake GPUs, the smoke assets, and the test-only CPU platform
(tests/cpu_platform). Both trainer paths run to verl's rollout engine, which needs a GPU, and
stop there. The evidence comes from verl's own log and from Ray's GCS, read by the test itself
while the job runs, not from what the launcher says.

Also the two bugs verl found in the product: Slurm's ROCR_VISIBLE_DEVICES beside
CUDA_VISIBLE_DEVICES (every GPU worker dies without cluster.gpu_vendor's clearing), and CPUs
that verl's Ray actors need but the old estimate let through (verl waits forever)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from wandb_standin import StandIn

RECIPE = RECIPES / "sandbox-verl.yaml"
ROLLOUT_STOP = "vllm version None not supported"  # verl's rollout engine, without vLLM
BRIDGE = "169.254.77.1"
NODE_IP = {"169.254.77.11": "node1", "169.254.77.12": "node2"}


def _env(clean_env, smoke_assets, tmp_path, sandbox=None) -> dict:
    env = dict(clean_env, VERL_SMOKE_DIR=str(smoke_assets), VERL_LAUNCH_STATE=str(tmp_path / "state"),
               RAY_AUTH_MODE="disabled")
    return sandbox.env(env) if sandbox else env


def _args(tmp_path, *overrides):
    return [RECIPE, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}", *overrides]


def _phases(run_dir) -> list:
    try:
        return [json.loads(x) for x in Path(run_dir, "phases.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# Run apart from pytest: Ray's GCS client aborts its process once the GCS has been gone a while.
_GCS_PEEK = """
import json, os, sys, time
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # as the job's Ray: no token
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
            head = [p for p in _phases(self.run_dir) if p["phase"] == "head-up"]
            if head:
                self.address = head[-1]["detail"]
                self.proc = subprocess.Popen([sys.executable, "-c", _GCS_PEEK, self.address, str(self.out)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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

    def nodes_of(self, cls: str) -> list:
        return sorted(node for c, node, _ in self.seen.values() if c == cls)


def _assert_verl_ran_to_the_rollout_engine(run_dir: Path, gcs: GcsWatch, trainer: str) -> str:
    """What verl's log and Ray's GCS show: verl attached to the job's Ray; its task runner and
    4 GPU workers (2 per node) ran there; torch.distributed came up across both nodes on the
    recipe's interface; FSDP built; verl stopped at the rollout engine. Returns the driver log."""
    log = _plain((run_dir / "logs" / "driver.r0.log").read_text())
    head = [p for p in _phases(run_dir) if p["phase"] == "head-up"][-1]["detail"]
    assert f"Connecting to existing Ray cluster at address: {head}" in log  # the job's Ray, no other
    assert "Started a local Ray instance" not in log
    assert gcs.address == head
    assert gcs.nodes_of(trainer) in (["node1"], ["node2"]), gcs.seen  # verl's TaskRunner (Ray picks the node)
    assert gcs.nodes_of("WorkerDict") == ["node1", "node1", "node2", "node2"], gcs.seen
    ranks = re.findall(r"\[cpu-platform\] init_process_group rank=(\d) world=4 host=(node\d) backend=\S+ "
                       r"master=169\.254\.77\.11:\d+ GLOO_SOCKET_IFNAME=eth0", log)
    assert sorted(ranks) == [("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")], ranks
    assert "After FSDP, memory allocated" in log  # FSDP synced the model across the 4 ranks
    assert ROLLOUT_STOP in log and "actor_rollout_init_model" in log
    assert "ROCR_VISIBLE_DEVICES" not in log  # verl's Worker refuses it beside CUDA_VISIBLE_DEVICES
    return log


def _ray_sessions() -> set:
    return set(Path("/tmp/ray").glob("session_2*")) if Path("/tmp/ray").is_dir() else set()


# ----------------------------------------------------------------------------- no sandbox
@pytest.mark.parametrize("trainer, overrides, need", [
    ("V1", [], 11),  # 3 x 2 GPU bundles + 4 of 8 storage units + the TransferQueue controller
    ("legacy", ["verl.overrides.trainer.use_v1=false"], 6),  # 3 x 2 GPU bundles
    ("legacy", ["trace.backend=weave", "wandb.enabled=true"], 6),  # tracing derives use_v1=false
])
def test_one_cpu_short_of_what_verl_holds_is_refused_before_the_queue(cli, clean_env, smoke_assets, tmp_path,
                                                                       trainer, overrides, need):
    env = _env(clean_env, smoke_assets, tmp_path)
    ok = cli("check", *_args(tmp_path, *overrides, f"cluster.cpus_per_task={need}"), env=env)
    assert ok.returncode == 0, ok.stderr
    short = cli("submit", *_args(tmp_path, *overrides, f"cluster.cpus_per_task={need - 1}"), env=env)
    assert short.returncode == 2, short.stdout + short.stderr
    assert "command line: cluster.cpus_per_task:" in short.stderr
    assert f"verl's {trainer} trainer holds" in short.stderr and f"= {need} per node" in short.stderr
    assert f"cluster.cpus_per_task={need} or more" in short.stderr
    assert not (tmp_path / "runs").exists()  # nothing written, nothing queued


# ----------------------------------------------------------------------------- on the sandbox
@pytest.mark.sandbox
def test_v1_trainer_runs_across_both_nodes_to_the_rollout_engine(cli, sandbox, clean_env, smoke_assets, tmp_path):
    """Tracing off: verl 0.9's default V1 trainer, at exactly the CPUs it holds (11), followed
    with `submit --wait`, whose progress and last line name where it stopped."""
    env = _env(clean_env, smoke_assets, tmp_path, sandbox)
    before = _ray_sessions()
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", *map(str, _args(tmp_path)), "--wait"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = None
    while run_dir is None and proc.poll() is None:
        runs = list((tmp_path / "runs" / "sandbox-verl").glob("2*"))
        run_dir = runs[0] if runs else time.sleep(0.2)
    gcs = GcsWatch(run_dir)
    gcs.start()
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        gcs.stop.set()
        gcs.join(5)
    assert proc.returncode == 1, out + err  # FAILED: the rollout engine needs a GPU
    _assert_verl_ran_to_the_rollout_engine(run_dir, gcs, "TaskRunnerV1")
    assert "TransferQueueController" in {c for c, _, _ in gcs.seen.values()}  # the V1 path
    assert gcs.nodes_of("SimpleStorageUnit") == ["node1"] * 4 + ["node2"] * 4
    assert _ray_sessions() == before  # verl started no Ray of its own
    # --wait showed the driver's progress, and its last line says where verl stopped.
    assert re.search(r"driver-start - ray: \d+ actors alive \(.*WorkerDict x4 on node1,node2", out), out
    last = out.strip().splitlines()[-1]
    assert last.startswith("job ") and " FAILED exit code 1:0 - driver-error: ValueError: " + ROLLOUT_STOP in last
    assert "in ray::WorkerDict.actor_rollout_init_model() on node" in last
    phases = [p["phase"] for p in _phases(run_dir)]
    assert phases[:3] == ["start", "nodes", "inputs-check"] and "hang" not in phases


@pytest.mark.sandbox
def test_legacy_trainer_with_weave_tracing_runs_to_the_rollout_engine(cli, sandbox, clean_env, smoke_assets,
                                                                      tmp_path, wandb_key):
    """Weave tracing on, to the loopback stand-in: the launcher derives trainer.use_v1=false
    (verl's legacy trainer, which traces), at exactly its 6 CPUs. `status` names the stop."""
    env = _env(clean_env, smoke_assets, tmp_path, sandbox)
    with StandIn(host=BRIDGE, api_key=wandb_key) as w:
        info = submit_json(cli("submit", *_args(tmp_path, "trace.backend=weave", "wandb.enabled=true",
                                                "wandb.entity=team", f"wandb.base_url={w.url}",
                                                "wandb.reach_timeout=5", "cluster.cpus_per_task=6"),
                               "--json", env=env, timeout=300))
        gcs = GcsWatch(Path(info["run_dir"]))
        gcs.start()
        try:
            state = sandbox.wait(info["job_id"], timeout=600)
        finally:
            gcs.stop.set()
            gcs.join(5)
        assert w.requests and all(ok for _, _, ok in w.requests)  # the key, checked from the nodes
    run_dir = Path(info["run_dir"])
    assert state == "FAILED", Path(info["stdout"]).read_text()[-3000:]
    log = _assert_verl_ran_to_the_rollout_engine(run_dir, gcs, "TaskRunner")
    assert "trainer.use_v1=false" in log and "TransferQueueController" not in {c for c, _, _ in gcs.seen.values()}
    assert "'backend': 'weave'" in log  # verl's resolved config: rollout tracing to Weave
    st = cli("status", info["job_id"], env=env)
    assert st.returncode == 0, st.stderr
    stopped = [line for line in st.stdout.splitlines() if line.startswith("stopped ")]
    assert len(stopped) == 1 and ROLLOUT_STOP in stopped[0] and "actor_rollout_init_model" in stopped[0], st.stdout
    assert wandb_key not in Path(info["stdout"]).read_text() + st.stdout


@pytest.mark.sandbox
def test_watchdog_fails_verls_silent_wait_and_names_the_shortfall(sandbox, clean_env, smoke_assets, tmp_path, cli):
    """One CPU short (the launcher refuses that, so the rendered script is edited by hand, as a
    user might): verl's second placement group waits forever for a node with 6 CPUs free. The
    watchdog fails the job after cluster.pending_timeout of nothing moving, saying why."""
    env = _env(clean_env, smoke_assets, tmp_path, sandbox)
    script = cli("render", *_args(tmp_path, "cluster.pending_timeout=30"), env=env)
    assert script.returncode == 0, script.stderr
    assert "--num-cpus=11 " in script.stdout
    run_dir = tmp_path / "by-hand"
    run_dir.mkdir()
    (run_dir / "job.sbatch").write_text(script.stdout.replace("--num-cpus=11 ", "--num-cpus=10 "))
    proc = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=run_dir, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert sandbox.wait(job, timeout=600) == "FAILED"
    out = _plain((run_dir / f"slurm-{job}.out").read_text())
    hang = [p for p in _phases(run_dir) if p["phase"] == "hang"]
    assert len(hang) == 1, out[-3000:]
    why = hang[0]["detail"]
    assert re.search(r"^(placement group \S+ \(2 bundle\(s\) \{CPU: 3, GPU: 1\}, STRICT_PACK\) needs \{CPU: 6, "
                     r"GPU: 2\}|actor SimpleStorageUnit needs \{CPU: 1\}) on one node", why), why
    assert "cluster.pending_timeout" in why and "raise cluster.cpus_per_task" in why
    assert ROLLOUT_STOP not in out  # it never got that far


@pytest.mark.sandbox
def test_slurm_sets_other_vendors_gpu_variables_and_the_job_clears_them(cli, sandbox, clean_env, tmp_path):
    """The sandbox's gres.conf has no env flags, as on clusters that list GPUs by hand: Slurm
    sets ROCR_VISIBLE_DEVICES (and more) beside CUDA_VISIBLE_DEVICES in every step."""
    def gpu_env(vendor):
        info = submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                               f"paths.runs={tmp_path / vendor}", f"cluster.gpu_vendor={vendor}", "--json",
                               env=sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))))
        assert sandbox.wait(info["job_id"]) == "COMPLETED", Path(info["stdout"]).read_text()[-2000:]
        return json.loads((Path(info["run_dir"]) / "demo-report.r0.json").read_text())["gpu_env"]

    kept = gpu_env("none")  # as Slurm set them
    assert len(kept) == 4 and all(e["ROCR_VISIBLE_DEVICES"] is not None for e in kept), kept
    cleared = gpu_env("nvidia")  # the default
    assert len(cleared) == 4
    for e in cleared:  # Ray's own per-worker CUDA_VISIBLE_DEVICES, nothing of other vendors
        assert e["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert [v for k, v in e.items() if k != "CUDA_VISIBLE_DEVICES" and v is not None] == [], e


@pytest.mark.sandbox
def test_work_no_node_can_hold_fails_at_once_with_the_field_to_change(cli, sandbox, clean_env, tmp_path):
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    info = submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "+verl.overrides.demo.stuck=64", "--json", env=env))
    t0 = time.monotonic()
    assert sandbox.wait(info["job_id"], timeout=180) == "FAILED"
    hang = [p for p in _phases(info["run_dir"]) if p["phase"] == "hang"]
    assert len(hang) == 1, Path(info["stdout"]).read_text()[-3000:]
    assert hang[0]["detail"].startswith("actor TooBig needs {CPU: 64} on one node and cannot be placed "
                                        "(no node has that much in all)")
    assert "raise cluster.cpus_per_task" in hang[0]["detail"]
    assert time.monotonic() - t0 < 120  # not cluster.pending_timeout (600 s)
    st = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    assert st["stopped"].startswith("hang: actor TooBig needs {CPU: 64}")
