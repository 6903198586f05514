# verl_launch_trace_flush: Ray's worker_process_setup_hook for verl's Ray job (the job writes this
# file into the run directory and puts it on the Ray processes' PYTHONPATH; verl's ray.init gets
# `runtime_env.worker_process_setup_hook=verl_launch_trace_flush.setup` among the derived overrides).
#
# Why: Ray kills verl's agent-loop workers (SIGKILL: "its owner died") the moment verl's TaskRunner
# ends, and no exit hook runs there; what their Weave clients had traced but not yet sent (Weave
# sends from a background thread, about once a second) was lost. So each agent-loop worker sends
# what it traced before it hands a step's rollouts back: verl's AgentLoopWorker.generate_sequences
# is wrapped (in each worker, once verl itself imports it), and after verl's own returns, the
# worker's Weave client flushes, off the event loop, within VERL_LAUNCH_TRACE_FLUSH_TIMEOUT
# seconds (1 s after a flush that timed out, so a Weave that stopped answering costs each later
# step a second, not the bound). The trainer gets the rollouts only then, so a step's trajectories are
# sent before the step, the last one included, can end the run. Nothing of verl or Weave changes
# on disk.
#
# What it did, one JSON line per flush (step, validation or not, seconds, uploads left), goes to
# VERL_LAUNCH_TRACE_FLUSH_FILE with "%w" replaced by this worker's host and PID (one file per
# worker: appends from several nodes never share a file).
import asyncio
import functools
import importlib.abc
import inspect
import json
import os
import socket
import sys
import threading
import time

MODULE = "verl.experimental.agent_loop.agent_loop"
SLOW = 1.0  # s: the bound after a flush that timed out in this worker
_late = False  # this worker's last flush timed out


def setup():
    """In every Ray worker of the job: wrap AgentLoopWorker.generate_sequences once verl itself
    imports it. Importing verl here would cost every worker (Ray's idle ones too) seconds and
    torch's memory."""
    if MODULE in sys.modules:
        _wrap(sys.modules[MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when MODULE is imported, the real loader runs, then _wrap."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _wrap(module)

                spec.loader.exec_module = exec_module
            return spec
        return None


def _wrap(module):
    """AgentLoopWorker.generate_sequences flushes the worker's traces before it returns."""
    cls = getattr(module, "AgentLoopWorker", None)
    generate = getattr(cls, "generate_sequences", None)
    if generate is None or getattr(generate, "_verl_launch", False) or not inspect.iscoroutinefunction(generate):
        return

    @functools.wraps(generate)
    async def generate_sequences(self, batch, *args, **kwargs):
        try:
            return await generate(self, batch, *args, **kwargs)
        finally:
            meta = getattr(batch, "meta_info", None) or {}
            try:
                await asyncio.to_thread(flush, meta.get("global_steps"), bool(meta.get("validate", False)))
            except Exception as e:  # noqa: BLE001  (never fail verl's step)
                _say(f"the trace flush failed: {type(e).__name__}: {e}")

    generate_sequences._verl_launch = True
    cls.generate_sequences = generate_sequences


def flush(step=None, validate=False):
    """This worker's Weave client (verl's rollout trace) sends what it holds, within the bound."""
    global _late  # noqa: PLW0603
    try:
        from verl.utils.rollout_trace import RolloutTraceConfig

        client = RolloutTraceConfig.get_client()
    except Exception:  # noqa: BLE001
        client = None
    if client is None or not hasattr(client, "flush"):  # this worker traces nothing to Weave
        return
    bound = SLOW if _late else float(os.environ.get("VERL_LAUNCH_TRACE_FLUSH_TIMEOUT", "60"))
    start, done = time.monotonic(), threading.Event()

    def run():
        try:
            client.flush()
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="verl-launch-trace-flush").start()
    _late = not done.wait(bound)  # a Weave that answers again gets the whole bound again
    unsent = 0
    if _late:
        _late = True
        try:  # Weave's own count of what waits in its queues (not the batch it is sending)
            unsent = int(client._get_pending_jobs().get("total_jobs", 0))
        except Exception:  # noqa: BLE001
            unsent = -1
        _say(f"the Weave client had not sent everything after {bound:g} s (trace.flush_timeout): "
             f"{f'at least {unsent}' if unsent > 0 else 'some'} uploads left at step {step}")
    _record({"step": step, "validate": validate, "flushed": done.is_set(), "unsent": unsent,
             "seconds": round(time.monotonic() - start, 3), "time": time.time()})


def _record(entry):
    out = os.environ.get("VERL_LAUNCH_TRACE_FLUSH_FILE")
    if not out:
        return
    try:
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name for it
        with open(out.replace("%w", f"{node}-{os.getpid()}"), "a") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError as e:
        _say(f"cannot write the trace flush's record: {e}")


def _say(msg):
    print(f"[verl-launch {time.strftime('%F %T')}] {msg}", file=sys.stdout, flush=True)
