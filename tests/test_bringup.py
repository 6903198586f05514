"""Ray bring-up and teardown on the real sandbox: shared nodes, faults, no leaked processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from sandbox_procs import job_processes, raylets_of

RAY_COMMS = ("raylet", "gcs_server")


def submit(cli, sandbox, env, tmp_path, *overrides) -> dict:
    proc = cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
               f"paths.runs={tmp_path / 'runs'}", *overrides, "--json", env=sandbox.env(env))
    return submit_json(proc)


def phases(info) -> list:
    p = Path(info["phases"])
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def wait_for_phase(info, name, timeout=120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ph in phases(info):
            if ph["phase"] == name:
                return ph
        time.sleep(0.3)
    pytest.fail(f"phase {name} not reached; output:\n{Path(info['stdout']).read_text()}")


def test_two_jobs_share_a_node_without_port_clashes(cli, sandbox, clean_env, tmp_path):
    a = submit(cli, sandbox, clean_env, tmp_path, "cluster.nodes=1", "job.name=share-a",
               "cluster.sbatch_args=['--nodelist=node3']", "verl.overrides.demo.hold=15")
    b = submit(cli, sandbox, clean_env, tmp_path, "cluster.nodes=1", "job.name=share-b",
               "cluster.sbatch_args=['--nodelist=node3']", "verl.overrides.demo.hold=15")
    assert sandbox.wait(a["job_id"]) == "COMPLETED", Path(a["stdout"]).read_text()
    assert sandbox.wait(b["job_id"]) == "COMPLETED", Path(b["stdout"]).read_text()
    pa, pb = ({p["phase"]: p for p in phases(x)} for x in (a, b))
    assert pa["head-up"]["detail"] != pb["head-up"]["detail"]  # different GCS ports
    # They really ran side by side on node3: each one's training overlapped the other's.
    assert pa["driver-start"]["time"] < pb["driver-end"]["time"]
    assert pb["driver-start"]["time"] < pa["driver-end"]["time"]
    for x in (a, b):
        report = json.loads((Path(x["run_dir"]) / "demo-report.r0.json").read_text())
        assert [n["hostname"] for n in report["nodes"]] == ["node3"]


def test_worker_that_cannot_start_fails_the_job_naming_it(cli, sandbox, clean_env, tmp_path):
    timeout = 30  # generous: on 2 busy cores a healthy node can take 15 s to join
    broken = tmp_path / "broken-ray" / "ray"  # node3's `ray` cannot start (its Python is fine)
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('import sys\nprint("no ray here", file=sys.stderr)\nsys.exit(7)\n')
    info = submit(cli, sandbox, clean_env, tmp_path, "cluster.nodes=3", f"cluster.ready_timeout={timeout}",
                  f"""runtime.setup=['[ "$(hostname)" != node3 ] || export PYTHONPATH={broken.parent}']""")
    assert sandbox.wait(info["job_id"]) == "FAILED"
    out = Path(info["stdout"]).read_text()
    assert "node node3 did not join" in out, out
    assert "no ray here" in out  # the tail of node3's log
    # The failure is put down to node3 alone (node2's Ray went with the workers' step after it).
    bad = [p["detail"] for p in phases(info) if p["phase"] == "bad-node"]
    assert bad == ["node3: ready: its Ray ended before every node joined (no ray here)"], bad
    start, end = (sandbox.job_field(info["job_id"], k) for k in ("StartTime", "EndTime"))
    elapsed = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S")) - time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
    assert elapsed <= timeout + 10, f"took {elapsed} s"
    assert not job_processes(info["job_id"])


def test_head_ray_killed_mid_run_ends_the_job_fast(cli, sandbox, clean_env, tmp_path):
    info = submit(cli, sandbox, clean_env, tmp_path, "verl.overrides.demo.hold=300")
    wait_for_phase(info, "driver-start")
    time.sleep(2)  # the driver is inside its hold
    gcs = [pid for pid, comm in job_processes(info["job_id"]) if comm == "gcs_server"]
    assert len(gcs) == 1, job_processes(info["job_id"])
    t = time.monotonic()
    os.kill(gcs[0], signal.SIGKILL)
    state = sandbox.wait(info["job_id"], timeout=60)
    assert time.monotonic() - t <= 30
    assert state == "FAILED", Path(info["stdout"]).read_text()
    assert "ray-lost" in [p["phase"] for p in phases(info)]


def test_scancel_mid_run_leaves_no_ray_process(cli, sandbox, clean_env, tmp_path):
    info = submit(cli, sandbox, clean_env, tmp_path, "verl.overrides.demo.hold=300")
    wait_for_phase(info, "driver-start")
    procs = job_processes(info["job_id"])
    assert {c for _, c in procs} >= set(RAY_COMMS), procs  # there was Ray to clean up
    sandbox.run("scancel", info["job_id"])
    deadline = time.monotonic() + 15
    while job_processes(info["job_id"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes(info["job_id"]) == []
    assert sandbox.wait(info["job_id"], timeout=30) == "CANCELLED"


@pytest.mark.sandbox_shared
def test_what_outlives_ray_on_a_node_is_killed_before_the_job_ends(cli, sandbox, clean_env, tmp_path):
    """A process a Ray worker started, that ignores SIGTERM and outlives the raylet, escapes
    Slurm's process tracking here (proctrack/linuxproc): the node's Ray step kills it."""
    info = submit(cli, sandbox, clean_env, tmp_path, "cluster.nodes=2", "verl.overrides.demo.lingers=true")
    assert sandbox.wait(info["job_id"]) == "COMPLETED"
    assert job_processes(info["job_id"]) == []  # checked at once: the job's end is the promise
    logs = Path(info["logs"])
    for log in ("ray-head.r0.log", f"ray-worker-{sandbox.nodes(info['job_id'])[1]}.r0.log"):
        assert "killing what Ray left on node" in (logs / log).read_text(), log
    assert "left lingering processes" in Path(info["stdout"]).read_text()


@pytest.mark.sandbox_shared
@pytest.mark.parametrize("line, named, code", [
    ("source /nowhere/venv/bin/activate", "source /nowhere/venv/bin/activate", 1),  # the README's first run
    ("ls /nowhere hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "ls /nowhere <redacted>", 2),  # never a credential
])
def test_a_failing_setup_line_is_named_in_status(cli, sandbox, clean_env, tmp_path, line, named, code):
    """A setup line that fails ends the job at once (set -e; a `source` of a missing file gives
    no ERR trap), and `status` names it, without a literal that looks like a credential."""
    info = submit(cli, sandbox, clean_env, tmp_path, f"runtime.setup=['export A=1', '{line}', 'export B=2']")
    assert sandbox.wait(info["job_id"]) == "FAILED"
    st = json.loads(cli("status", info["job_id"], "--json", env=sandbox.env(clean_env)).stdout)
    head = sandbox.nodes(info["job_id"])[0]
    assert st["stopped"] == f"error: runtime.setup failed on {head}: `{named}` exited {code} (bash's message is in the output)", st
    assert "/nowhere" in Path(info["stdout"]).read_text()  # bash's (or ls's) own message
    assert "hf_AbCd" not in Path(info["phases"]).read_text()
    assert not job_processes(info["job_id"])


def test_a_job_pending_on_a_drained_node_is_waited_for(cli, sandbox, clean_env, tmp_path):
    """Slurm's node-count reasons (PartitionNodeLimit, PartitionConfig) also mean down or drained
    nodes, which come back: --wait gives up (exit 3) only when the partition is too small."""
    sandbox.run("scontrol", "update", "nodename=node4", "state=drain", "reason=verl-launch-test")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", str(RECIPES / "sandbox-demo.yaml"),
                                 f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
                                 "cluster.nodes=4", "--wait"], env=sandbox.env(clean_env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        time.sleep(15)
        assert proc.poll() is None, proc.communicate()  # still waiting, not given up
    finally:
        sandbox.run("scontrol", "update", "nodename=node4", "state=resume")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert "COMPLETED" in out.strip().splitlines()[-1], out


@pytest.mark.sandbox_shared
def test_missing_network_interface_fails_fast(cli, sandbox, clean_env, tmp_path):
    info = submit(cli, sandbox, clean_env, tmp_path, "cluster.network_interface=nope0")
    assert sandbox.wait(info["job_id"], timeout=60) == "FAILED"
    out = Path(info["stdout"]).read_text()
    assert "no IPv4 address on interface nope0" in out
    assert "head-up" not in [p["phase"] for p in phases(info)]


# The first `ray start` on node2 dies before its node registered, as a killed one would: no
# cleanup of its own (no fate-sharing), its raylet left running on the job's pinned ports.
REGISTER_FAULT = r'''
import os
def _fault():
    cmd = open("/proc/self/cmdline", "rb").read().split(b"\0")
    mark = os.environ.get("VL_FAULT_MARK", "")
    if not mark or b"ray.scripts.scripts" not in cmd or not any(a.startswith(b"--address") for a in cmd) \
            or os.path.exists(mark):
        return
    open(mark, "w").close()
    import ray._private.services as services, ray._private.utils as utils
    utils.set_kill_on_parent_death_linux = lambda: None
    def get_node(*args, **kwargs):
        me = str(os.getpid())
        with open(mark + ".left", "w") as f:  # what it leaves behind: its children
            for p in os.listdir("/proc"):
                try:
                    if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == me:
                        f.write(p + " " + open(f"/proc/{p}/comm").read())
                except OSError:
                    pass
        os._exit(1)
    services.get_node = get_node
_fault()
'''


# One 2-node job for two things (each sandbox job costs ~40 s of `make test`): a worker retried
# cleanly, and cluster.network_interface used on every node.
def test_worker_whose_ray_start_fails_to_register_is_retried_cleanly_and_interface_used(
        cli, sandbox, clean_env, tmp_path):
    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(REGISTER_FAULT)
    mark = tmp_path / "node2-failed-once"
    info = submit(cli, sandbox, clean_env, tmp_path, "cluster.nodes=2", "verl.overrides.demo.hold=5",
                  "cluster.network_interface=eth0",
                  f"""runtime.setup=['[ "$(hostname)" != node2 ] || export PYTHONPATH={fault} VL_FAULT_MARK={mark}']""")
    wait_for_phase(info, "driver-start", timeout=240)
    # What the failed attempt left (its raylet among it) is gone; node2 runs one raylet, the retry's.
    left = [line.split() for line in Path(f"{mark}.left").read_text().splitlines()]
    assert "raylet" in [comm for _, comm in left], left
    for pid, comm in left:
        try:
            alive = Path(f"/proc/{pid}/comm").read_text().strip() == comm
        except OSError:
            alive = False
        assert not alive, f"{comm} {pid} of the failed attempt still runs"
    assert len(raylets_of(info["job_id"], "node2")) == 1
    assert sandbox.wait(info["job_id"]) == "COMPLETED", Path(info["stdout"]).read_text()
    log = (Path(info["logs"]) / "ray-worker-node2.r0.log").read_text()
    assert "before this node registered; cleaning up and retrying (1 of 2" in log, log
    assert "retrying (2 of 2" not in log
    assert not [p for p in phases(info) if p["phase"] in ("bad-node", "error")]
    assert not job_processes(info["job_id"])
    nodes = (Path(info["logs"]) / "nodes.txt").read_text().split("\n")
    assert sorted(line.split()[1] for line in nodes if line) == ["169.254.77.11", "169.254.77.12"]
