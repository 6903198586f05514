"""The trace flush's own logic (templates/trace_flush.py), which the sandbox's traced jobs run
inside verl's agent-loop workers (test_tool_agent_job: every step flushed, the last step whole):
here its bound against a Weave client that stops answering, its records, the import hook that
wraps verl's class only when verl imports it, and what `status` says of a flush that timed out.
Most use a slow object with Weave's flush and pending-count methods; one runs Weave's own client
against the W&B stand-in, which stops answering uploads mid-run (a Weave server that hangs at the
end)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import ROOT
from wandb_standin import StandIn
from launcher.core.paths import RunPaths
from launcher.jobs.traces import flush_note


@pytest.fixture
def flush(monkeypatch, tmp_path):
    """The module as the job writes it, with verl's rollout-trace config holding CLIENT[0]."""
    spec = importlib.util.spec_from_file_location("verl_launch_trace_flush", ROOT / "templates" / "trace_flush.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    client = [None]
    trace = types.ModuleType("verl.utils.rollout_trace")
    trace.RolloutTraceConfig = type("RolloutTraceConfig", (), {"get_client": staticmethod(lambda: client[0])})
    monkeypatch.setitem(sys.modules, "verl.utils.rollout_trace", trace)
    monkeypatch.setenv("VERL_LAUNCH_TRACE_FLUSH_FILE", str(tmp_path / "logs" / "trace-flush-%w.r0.jsonl"))
    monkeypatch.setenv("VERL_LAUNCH_TRACE_FLUSH_TIMEOUT", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    (tmp_path / "logs").mkdir()
    mod.client = client
    return mod


class Client:
    """Weave's client as the flush uses it: flush() blocks until sent (here: SECONDS)."""

    def __init__(self, seconds: float):
        self.seconds, self.flushes = seconds, 0

    def flush(self):
        time.sleep(self.seconds)
        self.flushes += 1

    def _get_pending_jobs(self):
        return {"total_jobs": 3}


def _worker(flush):
    """verl's AgentLoopWorker as the hook finds it in verl's module: an async generate_sequences."""
    module = types.ModuleType("agent_loop")

    class AgentLoopWorker:
        async def generate_sequences(self, batch):
            if batch.meta_info.get("fail"):
                raise RuntimeError("a rollout failed")
            return f"rollouts of step {batch.meta_info['global_steps']}"

    module.AgentLoopWorker = AgentLoopWorker
    flush._wrap(module)
    flush._wrap(module)  # once only
    return AgentLoopWorker()


def _step(worker, step, **meta):
    return asyncio.run(worker.generate_sequences(types.SimpleNamespace(meta_info={"global_steps": step, **meta})))


def _records(tmp_path):
    [f] = (tmp_path / "logs").glob("trace-flush-node7-*.r0.jsonl")
    return [json.loads(x) for x in f.read_text().splitlines()]


def test_each_step_is_sent_before_its_rollouts_go_back_and_a_silent_weave_costs_a_second_after_the_bound(flush, tmp_path, capsys):
    worker = _worker(flush)
    flush.client[0] = Client(0.05)
    assert _step(worker, 1) == "rollouts of step 1" and flush.client[0].flushes == 1
    flush.client[0] = Client(30)  # Weave stops answering
    t0 = time.monotonic()
    assert _step(worker, 2) == "rollouts of step 2"
    assert 2 <= time.monotonic() - t0 < 4  # the bound, trace.flush_timeout, not the 30 s
    t0 = time.monotonic()
    _step(worker, 3)
    assert 1 <= time.monotonic() - t0 < 2  # after a timeout: 1 s, not the bound again
    flush.client[0] = Client(0.05)  # it answers again: the whole bound again
    with pytest.raises(RuntimeError, match="a rollout failed"):
        _step(worker, 4, fail=True)  # verl's own error goes on; what was traced is still sent
    got = [(r["step"], r["flushed"], r["unsent"]) for r in _records(tmp_path)]
    assert got == [(1, True, 0), (2, False, 3), (3, False, 3), (4, True, 0)]
    assert not flush._late
    said = capsys.readouterr().out
    assert "the Weave client had not sent everything after 2 s (trace.flush_timeout): at least 3 uploads left at step 2" in said
    assert "after 1 s" in said


def test_a_worker_that_traces_nothing_waits_for_nothing_and_writes_nothing(flush, tmp_path):
    worker = _worker(flush)
    flush.client[0] = None  # tracing off, or not Weave
    assert _step(worker, 1) == "rollouts of step 1"
    assert list((tmp_path / "logs").iterdir()) == []


def test_the_hook_imports_nothing_and_wraps_verls_class_when_verl_imports_it(flush, monkeypatch, tmp_path):
    """setup() in each of Ray's workers: the module is wrapped as it is imported, by whoever."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "agent_loop.py").write_text("class AgentLoopWorker:\n    async def generate_sequences(self, batch):\n"
                                       "        return 'out'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(flush, "MODULE", "pkg.agent_loop")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    flush.setup()
    flush.setup()
    assert "pkg.agent_loop" not in sys.modules and sum(isinstance(f, flush._Finder) for f in sys.meta_path) == 1
    from pkg.agent_loop import AgentLoopWorker  # as verl's own import would

    assert AgentLoopWorker.generate_sequences._verl_launch
    sys.modules.pop("pkg.agent_loop")
    sys.modules.pop("pkg", None)


def test_status_names_the_steps_whose_flush_timed_out(tmp_path):
    paths = RunPaths(tmp_path)
    paths.logs.mkdir(parents=True)
    rows = {"node1-11": [(1, True, 0), (2, False, 3)], "node2-12": [(1, True, 0), (2, False, -1), (3, False, 2)]}
    for node, rs in rows.items():
        (paths.logs / RunPaths.TRACE_FLUSH.format(node=node, restart=0)).write_text(
            "".join(json.dumps({"step": s, "flushed": f, "unsent": u}) + "\n" for s, f, u in rs))
    assert flush_note(paths) == "traces not all sent within trace.flush_timeout at steps 2, 3 (at least 5 uploads left)"
    time.sleep(0.01)  # a later restart's files are the run's now: all sent there
    (paths.logs / RunPaths.TRACE_FLUSH.format(node="node1-21", restart=1)).write_text(
        json.dumps({"step": 3, "flushed": True, "unsent": 0}) + "\n")
    assert flush_note(paths) is None


# An agent-loop worker as the hook sees it, with Weave's real client (verl's accessor stands in for
# verl, which this tier keeps out): a step answered, then the server stops answering uploads and two
# steps' flushes are bounded; the process then ends as Ray ends a worker, with no exit hook.
WORKER = """
import importlib.util, json, os, sys, time, types
import weave
client = weave.init(sys.argv[1])
for name in ("verl", "verl.utils"):
    sys.modules[name] = types.ModuleType(name)
trace = sys.modules["verl.utils.rollout_trace"] = types.ModuleType("verl.utils.rollout_trace")
trace.RolloutTraceConfig = type("RolloutTraceConfig", (), {"get_client": staticmethod(lambda: client)})
spec = importlib.util.spec_from_file_location("verl_launch_trace_flush", sys.argv[2])
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)

@weave.op
def trajectory(step, i):
    return {"step": step, "sample": i}

trajectory(1, 0)
hook.flush(step=1)
print("SENT", flush=True)
sys.stdin.readline()  # the server stops answering uploads
for step in (2, 3):
    trajectory(step, 0)
    trajectory(step, 1)
    t0 = time.monotonic()
    hook.flush(step=step)
    print("FLUSH", step, round(time.monotonic() - t0, 2), flush=True)
os._exit(0)
"""


def test_a_weave_that_stops_answering_bounds_each_flush_and_the_run_says_what_was_not_sent(clean_env, wandb_key,
                                                                                        tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    with StandIn(api_key=wandb_key) as w:
        env = {**clean_env, "WANDB_BASE_URL": w.url, "WANDB_API_KEY": wandb_key, "WANDB_ENTITY": "team",
               "WANDB_ERROR_REPORTING": "false", "WEAVE_HTTP_TIMEOUT": "30", "SLURMD_NODENAME": "node1",
               "VERL_LAUNCH_TRACE_FLUSH_TIMEOUT": "3",
               "VERL_LAUNCH_TRACE_FLUSH_FILE": str(logs / RunPaths.TRACE_FLUSH.format(node="%w", restart=0))}
        proc = subprocess.Popen([sys.executable, "-c", WORKER, "team/flush-test", str(ROOT / "templates" / "trace_flush.py")],
                                env=env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "SENT", proc.stderr.read()[-3000:]
            assert [c["op_name"] for c in w.calls if c["inputs"].get("step") == 1], w.calls  # step 1 arrived
            w.stall_uploads.set()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            t0 = time.monotonic()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        ended = time.monotonic() - t0
        assert proc.returncode == 0, err[-3000:]
        seconds = {int(s): float(t) for _, s, t in (line.split() for line in out.splitlines() if line.startswith("FLUSH"))}
        assert 3 <= seconds[2] < 5 and 1 <= seconds[3] < 2.5, (seconds, err[-2000:])  # the bound, then 1 s
        assert ended < 12, ended  # the worker's end waits for nothing more
        assert not [c for c in w.calls if (c["inputs"] or {}).get("step") in (2, 3)]
    [f] = logs.glob("trace-flush-node1-*.r0.jsonl")
    got = [json.loads(x) for x in f.read_text().splitlines()]
    assert [(r["step"], r["flushed"]) for r in got] == [(1, True), (2, False), (3, False)], got
    # Weave's count is what waits in its queue: step 2's batch, in flight, is not in it; step 3's is
    assert got[0]["unsent"] == 0 and got[2]["unsent"] >= 2, got
    note = flush_note(RunPaths(tmp_path))
    assert note == ("traces not all sent within trace.flush_timeout at steps 2, 3 "
                    f"(at least {got[1]['unsent'] + got[2]['unsent']} uploads left)")
