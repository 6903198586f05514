"""Each node's Weave sender (templates/weave_sender.py), as the job runs it, with the real weave
client against the stand-in: a process that traces and is then killed at once, as Ray kills
verl's agent-loop workers when the driver ends, loses nothing once its records go through
Weave's write-ahead log and the job's sender; without them, it loses what it had not sent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import ROOT
from wandb_standin import StandIn

SENDER = ROOT / "templates" / "weave_sender.py"
KEY = "k" * 40
# N calls (each a root with a child, as a trajectory with its generate), then SIGKILL at once
TRACE = """
import os, signal, sys, time
import weave
weave.init("team/proj")

@weave.op
def generate(i):
    return {"text": "x" * 50}

@weave.op
def trajectory(i):
    return generate(i)

@weave.op
def unfinished():
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)

for i in range(int(sys.argv[1])):
    trajectory(i)
time.sleep(0.3)  # weave writes a finished call on its own thread, within milliseconds
if sys.argv[2:] == ["killed-inside-a-call"]:
    unfinished()
os.kill(os.getpid(), signal.SIGKILL)
"""


def _env(tmp, url, **more):
    return dict(os.environ, HOME=str(tmp), WANDB_BASE_URL=url, WANDB_API_KEY=KEY, WANDB_ENTITY="team",
                WANDB_ERROR_REPORTING="false", WEAVE_PRINT_CALL_LINK="false", SLURMD_NODENAME="node9", **more)


def _trace(env, n, *how):
    r = subprocess.run([sys.executable, "-c", TRACE, str(n), *how], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]


def _wal(**more):
    return dict(WEAVE_ENABLE_WAL="true", WEAVE_DISABLE_WAL_SENDER="true", **more)


def test_a_killed_process_loses_its_unsent_traces_without_the_sender(tmp_path):
    with StandIn(api_key=KEY) as w:
        _trace(_env(tmp_path, w.url), 10)
        time.sleep(2)
        assert len(w.calls) < 20  # the fault is real: what weave had not sent went with the process


def test_the_sender_sends_what_killed_processes_wrote_once_each_and_at_its_end(tmp_path):
    ready = tmp_path / "ready"
    with StandIn(api_key=KEY) as w:
        env = _env(tmp_path, w.url)
        sender = subprocess.Popen([sys.executable, str(SENDER), str(ready), "30"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for _ in range(300):
                if ready.exists() or sender.poll() is not None:
                    break
                time.sleep(0.1)
            assert ready.exists(), sender.communicate()[0]
            assert KEY not in ready.read_text()
            _trace(_env(tmp_path, w.url, **_wal()), 10)  # while it runs: sent within seconds
            assert w.wait_for(lambda s: len(s.calls) >= 20, timeout=30), len(w.calls)
            # killed just before the end, inside a call it never ended: sent at the end, in seconds
            _trace(_env(tmp_path, w.url, **_wal()), 5, "killed-inside-a-call")
            t0 = time.monotonic()
            sender.send_signal(signal.SIGUSR1)
            out = sender.communicate(timeout=60)[0]
            took = time.monotonic() - t0
        finally:
            sender.kill()
        assert sender.returncode == 0 and took < 15, (took, out)
        ids = [c["id"] for c in w.calls]
        assert len(ids) == 30 and len(set(ids)) == 30, out  # every call, none twice
        roots = [c for c in w.calls if c["parent_id"] is None]
        assert sorted(c["short_name"] for c in roots) == ["trajectory"] * 15
        assert {c["parent_id"] for c in w.calls if c["parent_id"]} == {c["id"] for c in roots}
        assert "weave on node9: sent " in out and KEY not in out, out
        left = [p for p in tmp_path.glob(".weave/wal/**/*.jsonl")]
        assert left == [], left  # sent logs of ended writers are removed
        assert any(p.endswith("/call/start") for _, p, _ in w.requests), w.requests  # the unfinished one
        assert w.unknown == []


def test_the_sender_without_a_key_says_so_and_is_not_ready(tmp_path):
    env = _env(tmp_path, "http://127.0.0.1:9")
    env.pop("WANDB_API_KEY")
    r = subprocess.run([sys.executable, str(SENDER), str(tmp_path / "ready"), "5"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "no WANDB_API_KEY" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "ready").exists()
