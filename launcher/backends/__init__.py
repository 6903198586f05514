"""Where a Request runs: Slurm (backends/slurm.py) or this machine (backends/local.py), behind one
interface, chosen once: `choose(local)` for a new request, `of(run)` for a recorded run.

    schedule(request, environ, out) -> the run's record (local: once it has ended)
    states(runs)                    -> {run_dir: {"state", "exit_code", "reason", ...}}
    ended(run)                      -> (ended, its state in words), for `logs -f`
    cancel(run)
    wait(run, on_change, ...)       -> the last info, "state" in it (one run: a record's job_id, run_dir)
    wait_many(runs, on_change, ...) -> {run_dir: state} (a sweep's points)
"""

from __future__ import annotations


def choose(local: bool):
    if local:
        from .local import LocalBackend

        return LocalBackend()
    from .slurm import SlurmBackend

    return SlurmBackend()


def of(run: dict):
    """The backend a recorded run went to."""
    return choose(bool(run.get("local")))
