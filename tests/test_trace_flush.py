"""The trace flush's own logic (templates/trace_flush.py), which the sandbox's traced jobs run
inside verl's agent-loop workers (test_tool_agent_job: every step flushed, the last step whole):
here its bound against a Weave client that stops answering, its records, the import hook that
wraps verl's class only when verl imports it, and what `status` says of a flush that timed out.
The client is a slow object with Weave's flush and pending-count methods, not Weave's own: what a
server that never answers does to the real one is the same wait, and cannot be made on purpose
here without a server that hangs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import ROOT
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
    assert "the Weave client had not sent everything after 2 s (trace.flush_timeout): 3 uploads left at step 2" in said
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
    assert flush_note(paths) == "traces not all sent within trace.flush_timeout at steps 2, 3 (5 uploads left)"
    time.sleep(0.01)  # a later restart's files are the run's now: all sent there
    (paths.logs / RunPaths.TRACE_FLUSH.format(node="node1-21", restart=1)).write_text(
        json.dumps({"step": 3, "flushed": True, "unsent": 0}) + "\n")
    assert flush_note(paths) is None
