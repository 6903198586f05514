"""templates/last_words.py's `name`, on the files a failed run keeps (issue 65): the first Ray
process that died, named with the words its own log ends with (a signal and where, an exception
and its thread, known words), where that log is, and the deaths after it as its cascade. The
job's real faults on the sandbox are tests/test_why_it_died.py's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "templates" / "last_words.py"
SEGV = """*** SIGSEGV received at time=1765000000 on cpu 1 ***
PC: @     0x7f00deadbeef  (unknown)  memcpy
Fatal Python error: Segmentation fault

Stack (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at
  File "/work/launcher/demo_payload.py", line 312 in work
"""
THREAD = """Exception in thread loader (load):
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
RuntimeError: the loader thread failed: shard 3 is corrupt
"""
NCCL = "[rank1]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 ms"


def _name(tmp_path, deaths: list, kept: dict) -> tuple:
    (tmp_path / "logs").mkdir(exist_ok=True)
    df = tmp_path / "logs" / "ray-deaths.r0.jsonl"
    df.write_text("".join(json.dumps(d) + "\n" for d in deaths))
    for rel, data in kept.items():
        f = tmp_path / "logs" / "last-words.r0" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data if isinstance(data, bytes) else data.encode())
    proc = subprocess.run([sys.executable, str(SCRIPT), "name", str(df), str(tmp_path / "logs" / "last-words.r0"),
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    return tuple(out.split("\t", 1)) if out else (None, None)


def _death(node="node2", pid=2942, what="RolloutShard", kind="SYSTEM_ERROR", end=100.0):
    return {"node": node, "pid": pid, "worker_id": "ab" * 28, "what": what, "exit_type": kind,
            "detail": "Worker unexpectedly exits with a connection error code 2. End of file.", "end": end}


@pytest.mark.parametrize("log, said", [
    (SEGV, "SIGSEGV (Fatal Python error: Segmentation fault) in work (demo_payload.py:312)"),
    (THREAD, "RuntimeError: the loader thread failed: shard 3 is corrupt (in thread loader)"),
    ("loading\n" + NCCL + "\n", NCCL.split("] ", 1)[1]),  # the known words, without the rank's prefix
])
def test_the_first_death_is_named_in_its_own_logs_words_with_where_its_log_is(tmp_path, log, said):
    kind, line = _name(tmp_path, [_death()], {f"node2/worker-{'ab' * 28}-01000000-2942.err": log})
    assert kind == "SYSTEM_ERROR"
    assert line == (f"Ray actor RolloutShard on node2 (pid 2942) died first: {said}; its log: "
                    f"logs/last-words.r0/node2/worker-{'ab' * 28}-01000000-2942.err"), line


def test_the_deaths_after_the_first_are_its_cascade_and_a_silent_kill_says_so(tmp_path):
    deaths = [_death(pid=7, what="task", end=1.0), _death(node="node1", pid=8, end=2.0),
              _death(node="node3", pid=9, what="WorkerDict", end=3.0)]
    kind, line = _name(tmp_path, deaths, {"node1/worker-x-01000000-8.err": SEGV})  # the first kept nothing
    assert line.startswith("a Ray task's worker on node2 (pid 7) died first: no last words in its log: killed "
                           "from outside, as by SIGKILL"), line
    assert "; its log: " not in line
    assert line.endswith("; then 2 more died after it (RolloutShard on node1, WorkerDict on node3)"), line


def test_an_oom_kill_by_rays_memory_monitor_says_so_and_no_death_says_nothing(tmp_path):
    detail = "Task was killed due to the node running low on memory. Memory on the node (IP: 10.0.0.2) was 30.1GB / 31GB"
    kind, line = _name(tmp_path, [dict(_death(kind="NODE_OUT_OF_MEMORY"), detail=detail)], {})
    assert kind == "NODE_OUT_OF_MEMORY"
    assert line.endswith(f"died first: killed for the node's memory (Ray's memory monitor): {detail}"), line
    assert _name(tmp_path, [], {}) == (None, None)


def test_a_log_of_binary_garbage_still_gives_its_last_words(tmp_path):
    garbage = bytes(range(256)) * 200 + b"\n" + THREAD.encode()
    _, line = _name(tmp_path, [_death()], {"node2/worker-w-01000000-2942.err": garbage})
    assert "RuntimeError: the loader thread failed: shard 3 is corrupt (in thread loader)" in line, line


def test_a_dead_engines_server_is_kept_for_its_log_but_not_named_a_death(tmp_path):
    """vLLM's engine is no Ray worker: gather adds its server actor for its log's sake only; the
    driver's phase names the engine already."""
    server = dict(_death(what="vLLMHttpServer", kind="ENGINE_DIED", end=5.0), detail="EngineCore died")
    assert _name(tmp_path, [server], {"node2/worker-w-01000000-2942.err": SEGV}) == (None, None)
    kind, line = _name(tmp_path, [_death(pid=7, what="task"), server], {})
    assert kind == "SYSTEM_ERROR" and "then" not in line, line
