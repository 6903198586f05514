"""Why a run died (issue 65), on the real sandbox with the demo driver: an actor on the second node that
the driver waits on dies (demo.actor_fault) of a segfault in native code, of its loader thread's
exception (the process then exits), or of a SIGKILL from another process (as the kernel's OOM
killer sends it). The driver fails with Ray's ActorDiedError, which says none of that. The job
must name the first process that died (class, node, pid) in the words its own log ends with,
keep that log in the run dir (bounded) after the teardown removed Ray's temp dirs, and blame no
node: that node was healthy. With cluster.requeue, a crash requeues the run on every node."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import launcher
from sandbox_procs import job_processes
from test_watchdog import _phases, _submit

FAULTS = {
    "segv": r"SIGSEGV \(Fatal Python error: Segmentation fault\) in work \(demo_payload\.py:\d+\)",
    "thread": re.escape("RuntimeError: the loader thread failed: shard 3 is corrupt (demo.actor_fault) "
                        "(in thread loader)"),
    "sigkill": r"no last words in its log: killed from outside, as by SIGKILL",
}
KEPT_MAX = 65536  # bytes of each kept log (launcher/core/render.py LAST_WORDS_BYTES)


def _first_death(info, kind: str, nodes: list, restart: int = 0) -> str:
    """The run's first-death phase names RolloutShard on the job's second node (NODES: the nodes
    Slurm gave it, the head first) in KIND's words; its logs kept, bounded; no node blamed. Its
    detail."""
    head, other = nodes
    first = [p for p in _phases(info) if p["phase"] == "first-death" and p.get("restart", 0) == restart]
    assert len(first) == 1, Path(info["stdout"]).read_text()[-3000:]
    said = first[0]["detail"]
    print(f"\n{kind}: first-death: {said}")
    assert re.match(rf"Ray actor RolloutShard on {other} \(pid \d+\) died first: {FAULTS[kind]}", said), said
    assert "ActorDiedError" in Path(info["run_dir"], "logs", f"driver.r{restart}.log").read_text()  # all the driver knew
    assert not any(p["phase"] in ("bad-node", "exclude") for p in _phases(info))  # that node was healthy
    kept = sorted(Path(info["run_dir"], "logs", f"last-words.r{restart}", other).glob("*"))
    sizes = {f.name: f.stat().st_size for f in kept}
    print(f"kept on {other}: {sizes}")
    assert kept and all(n <= KEPT_MAX for n in sizes.values()), sizes  # 3 MiB of garbage in the segv's
    assert any(re.fullmatch(r"worker-[0-9a-f]+-[0-9a-f]+-\d+\.err", n) for n in sizes), sizes
    if kind != "sigkill":
        log = re.search(r"; its log: (\S+)", said).group(1)
        assert Path(info["run_dir"], log).is_file() and re.search(r"-\d+\.err$", log), said
    assert not Path(info["run_dir"], "logs", f"last-words.r{restart}", head).exists()  # nothing died there
    return said


@pytest.mark.sandbox_shared
@pytest.mark.parametrize("kind", ["segv", "sigkill"])  # a thread's exception: the requeue test's
def test_a_crash_is_named_in_the_dead_processs_words_its_log_kept_and_no_node_blamed(cli, sandbox, clean_env,
                                                                                      tmp_path, kind, monkeypatch):
    noise = ["+verl.overrides.demo.fault_noise_mb=3"] if kind == "segv" else []  # binary garbage first
    info, env = _submit(cli, sandbox, clean_env, tmp_path, f"+verl.overrides.demo.actor_fault={kind}", *noise)
    state = sandbox.wait(info["job_id"], timeout=180)
    assert state == "FAILED", Path(info["stdout"]).read_text()[-3000:]
    said = _first_death(info, kind, sandbox.nodes(info["job_id"]))
    assert "requeue" not in [p["phase"] for p in _phases(info)]  # no cluster.requeue
    st = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    assert st["stopped"] == f"first-death: {said}" and st["bad_nodes"] == [], st
    for name in ("SLURM_CONF", "VERL_LAUNCH_STATE"):  # the API, the one door, says the same
        monkeypatch.setenv(name, env[name])
    assert launcher.run(info["job_id"]).status(traces=False)["stopped"] == f"first-death: {said}"
    assert job_processes(info["job_id"]) == []


def test_with_requeue_a_crash_requeues_the_run_on_every_node(cli, sandbox, clean_env, tmp_path):
    """A loader thread's exception, then the process exits: named in each run, requeued once
    (cluster.max_restarts=1) with no node excluded."""
    info, env = _submit(cli, sandbox, clean_env, tmp_path, "+verl.overrides.demo.actor_fault=thread",
                        "cluster.requeue=true", "cluster.max_restarts=1")
    job = info["job_id"]
    try:
        deadline = time.monotonic() + 240
        while not any(p["phase"] == "first-death" and p.get("restart") == 1 for p in _phases(info)) \
                and time.monotonic() < deadline:
            sandbox.release_requeued(job)
            time.sleep(1)
        names = [(p["phase"], p.get("restart", 0)) for p in _phases(info)]
        assert ("first-death", 0) in names and ("requeue", 0) in names, names
        assert ("first-death", 1) in names and ("requeue", 1) not in names, names  # cluster.max_restarts=1
        for restart in (0, 1):
            _first_death(info, "thread", sandbox.nodes(job), restart)
        assert sandbox.job_field(job, "ExcNodeList") in ("(null)", "")
    finally:
        sandbox.run("scancel", job)
        sandbox.wait(job)
