# verl_launch_trace_flush: Ray's worker_process_setup_hook for verl's Ray job (the job writes this
# file into the run directory and puts it on the Ray processes' PYTHONPATH; verl's ray.init gets
# `runtime_env.worker_process_setup_hook=verl_launch_trace_flush.setup` among the derived overrides).
#
# Why: Ray kills verl's agent-loop workers (SIGKILL: "its owner died") the moment verl's TaskRunner
# ends, and no exit hook runs there; what their Weave clients had traced but not yet sent (Weave
# sends from a background thread, about once a second) is lost. verl's trainer ends by finishing
# its loggers (verl.utils.tracking.Tracking.finish: "flush and finalize every configured backend",
# in the TaskRunner, while the workers still live). There, before verl's own finish, every
# agent-loop worker (Ray's named actors agent_loop_worker_*) flushes its Weave client, through
# Ray's __ray_call__, within FLUSH_TIMEOUT seconds in all. Nothing of verl or Weave is changed on
# disk; verl's own finish runs as before, once, whatever the flush did.
#
# What it did goes to VERL_LAUNCH_TRACE_FLUSH_FILE (one JSON line per finish: workers reached,
# traces still unsent, seconds), which the job's summary reads; a line on stdout says the same.
import importlib.abc
import json
import os
import sys
import threading
import time

PREFIX = "agent_loop_worker_"  # verl's AgentLoopManager names each worker so
MODULE = "verl.utils.tracking"


def setup():
    """In every Ray worker of the job: wrap verl's Tracking.finish once verl itself imports it.
    Importing verl here would cost every worker (Ray's idle ones too) seconds and torch's memory."""
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
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    _wrap(module)

                spec.loader.exec_module = exec_module
                return spec
            if spec is not None:
                return spec
        return None


def _wrap(tracking):
    """Tracking.finish flushes every agent-loop worker's traces first (once per Tracking)."""
    finish = getattr(getattr(tracking, "Tracking", None), "finish", None)
    if finish is None or getattr(finish, "_verl_launch", False):
        return

    def finish_after_flush(self, *args, **kwargs):
        if not getattr(self, "_finished", False):
            try:
                flush_workers()
            except Exception as e:  # noqa: BLE001  (never fail verl's own end)
                _say(f"the trace flush failed: {type(e).__name__}: {e}")
        return finish(self, *args, **kwargs)

    finish_after_flush._verl_launch = True
    tracking.Tracking.finish = finish_after_flush


def flush_workers():
    """Every agent-loop worker flushes its Weave client; the outcome to the job's file."""
    import ray

    budget = float(os.environ.get("VERL_LAUNCH_TRACE_FLUSH_TIMEOUT", "60"))
    start = time.monotonic()
    names = sorted(n for n in ray.util.list_named_actors() if str(n).startswith(PREFIX))
    handles, refs = [], []
    for name in names:
        try:
            handles.append(ray.get_actor(name))
        except Exception:  # noqa: BLE001  (a worker already gone: counted as not reached)
            continue
    refs = [h.__ray_call__.remote(_flush_here, budget) for h in handles]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=budget + 5) if refs else ([], [])
    outcomes = []
    for ref in ready:
        try:
            outcomes.append(ray.get(ref))
        except Exception as e:  # noqa: BLE001  (a worker that died meanwhile)
            outcomes.append({"error": f"{type(e).__name__}: {e}"[:300]})
    record = {
        "workers": len(names),
        "flushed": sum(1 for o in outcomes if o.get("flushed")),
        "unsent": sum(int(o.get("unsent") or 0) for o in outcomes),
        "unreached": len(names) - len(outcomes),
        "errors": [o["error"] for o in outcomes if o.get("error")][:5],
        "seconds": round(time.monotonic() - start, 3),
        "time": time.time(),
    }
    _say(f"traces flushed from {record['flushed']} of {record['workers']} agent-loop workers in "
         f"{record['seconds']} s; {record['unsent']} not sent" + (f", {record['unreached']} workers not reached"
                                                                 if record["unreached"] else ""))
    out = os.environ.get("VERL_LAUNCH_TRACE_FLUSH_FILE")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


def _flush_here(actor, budget):
    """In an agent-loop worker: flush the Weave client verl's rollout trace made, within BUDGET s."""
    try:
        from verl.utils.rollout_trace import RolloutTraceConfig

        client = RolloutTraceConfig.get_client()
    except Exception:  # noqa: BLE001
        client = None
    if client is None or not hasattr(client, "flush"):  # this worker traces nothing (to Weave)
        return {"flushed": True, "unsent": 0}
    done = threading.Event()

    def run():
        try:
            client.flush()
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="verl-launch-trace-flush").start()
    done.wait(budget)
    unsent = 0
    if not done.is_set():
        try:  # Weave's own count of what it still holds
            unsent = int(client._get_pending_jobs().get("total_jobs", 0))
        except Exception:  # noqa: BLE001
            unsent = -1
    return {"flushed": done.is_set(), "unsent": unsent}


def _say(msg):
    print(f"[verl-launch {time.strftime('%F %T')}] {msg}", file=sys.stdout, flush=True)
