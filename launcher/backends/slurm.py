"""The Slurm backend: a Request becomes a run directory and one `sbatch` (a sweep: one job array);
its state comes from one rate-limited watcher (scontrol for what slurmctld remembers, sacct for
the rest, through slurm_commands.py, the only module that runs Slurm commands)."""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import List, Mapping, Optional

from . import slurm_commands as slurm
from ..core.paths import RunPaths, shown_phase


class Watcher:
    """One place that asks Slurm how jobs are doing, at most once per MIN_INTERVAL seconds for
    the same question, however many loops ask (submitit's one sacct watcher)."""

    def __init__(self, min_interval: float = 1.0):
        self.min_interval = min_interval
        self._seen: dict = {}

    def _ask(self, key, fetch):
        now = time.monotonic()
        hit = self._seen.get(key)
        if hit is not None and now - hit[0] < self.min_interval:
            return hit[1]
        value = fetch()
        self._seen[key] = (time.monotonic(), value)
        return value

    def forget(self) -> None:
        """After what changes a job (scancel): the next question asks Slurm again."""
        self._seen.clear()

    def job(self, job_id: str) -> Optional[dict]:
        return self._ask(("job", job_id), lambda: slurm.job_info(job_id))

    def states(self, runs: List[dict]) -> dict:
        return self._ask(("states", tuple(r["run_dir"] for r in runs)), lambda: slurm.states(runs, ask=self))

    def controller(self) -> dict:
        """Every job slurmctld remembers (one scontrol): states and allocations share it."""
        return self._ask(("controller",), slurm.Direct.controller)

    def accounting(self, job_ids: List[str]) -> dict:
        """Accounting's records of JOB_IDS (one sacct): states and allocations share it."""
        return self._ask(("accounting", tuple(job_ids)), lambda: slurm.Direct.accounting(list(job_ids)))


WATCHER = Watcher()


class SlurmBackend:
    name, title = "slurm", "Slurm"

    def load(self, recipe, overrides: List[str], environ: Mapping[str, str], notes=None):
        from ..core.recipe import load

        return load(recipe, overrides)

    def weigh(self, plan, had) -> list:
        """check's lines, Slurm asked (`sbatch --test-only` of the script, the partition)."""
        from ..core.render import render
        from .summary import weigh

        return weigh(plan, had, render(plan), ask_slurm=True)

    def dryrun(self, prepared):
        """`sbatch --parsable job.sbatch` in a new run directory."""
        from ..core.request import for_run

        req = for_run(prepared.plan)
        req.warnings = list(prepared.warnings)
        return req

    def dryrun_sweep(self, sweep, max_parallel: Optional[int] = None):
        """One job array: `sbatch --parsable sweep.sbatch` in the sweep's directory."""
        from ..core.sweeps import request

        return request(sweep, max_parallel)

    def serve_gpus(self, r) -> int:
        """One where the run's nodes have GPUs."""
        return 1 if (r is not None and r.cluster.gpus_per_node > 0) else 0

    def merge_executor(self, folder, r, params: dict):
        """submitit's Slurm executor for a one-node merge job (PARAMS: merge_job.job_params),
        with recipe R's partition, account, qos and setup."""
        import submitit

        c = r.cluster if r else None
        extra = {f"slurm_{name}": getattr(c, name) for name in ("partition", "account", "qos")
                 if c is not None and getattr(c, name)}
        if r is not None and r.runtime.setup:
            extra["slurm_setup"] = list(r.runtime.setup)
        ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
        ex.update_parameters(**params, **extra)
        return ex

    def merge_state(self, merge: dict) -> str:
        info = WATCHER.job(str(merge.get("job_id")))
        return info["state"] if info else "UNKNOWN (Slurm no longer knows the job)"

    def wait_merge(self, job, on_change=None, poll: float = 2.0) -> None:
        """Until the merge job ends, from the launcher's own watcher (submitit's needs accounting:
        without slurmdbd it stays UNKNOWN); SlurmError if it left no result."""
        from ..errors import SlurmError

        info = job.verl_launch
        final = self.wait({"job_id": info["job_id"], "run_dir": info["folder"]}, on_change, poll=poll)
        if not job.paths.result_pickle.exists():
            raise SlurmError(f"merge job {info['job_id']} ended {final['state']} without a result; "
                             f"its output: {job.paths.stdout}")

    def schedule(self, req, environ: Optional[Mapping[str, str]] = None, out=None) -> dict:
        """Write the run directory (0700, files 0600; a sweep's and each point's) and sbatch it
        there; then the record (run.json, the registry). Nothing is left if sbatch fails."""
        slurm.need("sbatch", environ)
        cluster = slurm.cluster_name(environ)
        if req.is_sweep:
            req.paths.create(req.script)
            with _undone(req.directory):
                for point in req.points:
                    point.paths.create(point.script, point.recipe_yaml)
                job_id = self._sbatch(req, environ)
            for point in req.points:
                point.register(f"{job_id}_{point.meta['index']}", array_job_id=job_id, cluster=cluster)
            return req.register(job_id, cluster=cluster)
        req.paths.create(req.script, req.recipe_yaml)
        with _undone(req.directory):
            job_id = self._sbatch(req, environ)
        return req.register(job_id, cluster=cluster)

    def _sbatch(self, req, environ) -> str:
        """sbatch, then the watcher forgets: a controller list it kept from before would not
        hold the new job, and its state would read UNKNOWN."""
        try:
            return slurm.sbatch(req.command, req.directory, environ)
        finally:
            WATCHER.forget()

    def states(self, runs: List[dict]) -> dict:
        return WATCHER.states(runs) if runs else {}

    def allocations(self, run: dict) -> Optional[List[dict]]:
        """Each attempt's allocation (start, end, nodes, submit), from Slurm's records."""
        return slurm.allocations(run, ask=WATCHER)

    def cancel(self, run: dict) -> None:
        slurm.cancel(run["job_id"])
        WATCHER.forget()

    def ended(self, run: dict):
        """(ended, state in words) for `logs -f`."""
        info = WATCHER.job(run["job_id"])
        return (info is None or slurm.ended(info)), (info["state"] if info else "no longer known to Slurm")

    def wait(self, run: dict, on_change=None, poll: float = 2.0, timeout: Optional[float] = None,
             stop_if_never_starts: bool = False) -> dict:
        """Poll RUN's job until it ends; ``on_change(text)`` whenever its Slurm state or the job's
        phase changes. STOP_IF_NEVER_STARTS: also return (still PENDING) once it pends for a
        reason that cannot clear by itself. Returns the last job info (slurm._info)."""
        job_id, paths, on_change = run["job_id"], RunPaths(Path(run["run_dir"])), on_change or (lambda text: None)
        deadline = None if timeout is None else time.monotonic() + timeout
        last, misses = None, 0
        while True:
            info = WATCHER.job(job_id)
            if info is None and misses < 5:  # a busy slurmctld times out now and then
                misses += 1
                time.sleep(poll)
                continue
            misses = 0
            info = info or {"state": "UNKNOWN"}
            text = _state_text(info, paths)
            if text != last:
                on_change(text)
                last = text
            if slurm.ended(info) or info["state"] == "UNKNOWN" or (stop_if_never_starts and slurm.never_starts(info)) \
                    or (deadline is not None and time.monotonic() > deadline):
                return info
            time.sleep(poll)

    def wait_many(self, runs: List[dict], on_change=None, poll: float = 5.0, timeout: Optional[float] = None,
                  stop_if_never_starts: bool = False) -> dict:
        """Poll many runs (a sweep's points, one batched query a poll) until every one has
        ended; ``on_change({state: count})`` when the counts change. {run_dir: job info}. With
        STOP_IF_NEVER_STARTS, also return once every point still waiting can never start."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last, on_change = None, on_change or (lambda counts: None)
        while True:
            infos = self.states(runs)
            now = {d: info.get("state", "UNKNOWN") for d, info in infos.items()}
            counts: dict = {}
            for state in now.values():
                counts[state] = counts.get(state, 0) + 1
            if counts != last:
                on_change(counts)
                last = counts
            if all(s in slurm.TERMINAL for s in now.values()) or (deadline is not None and time.monotonic() > deadline):
                return infos
            waiting = [info for info in infos.values() if info.get("state") not in slurm.TERMINAL]
            if stop_if_never_starts and all(slurm.never_starts(info) for info in waiting):
                return infos
            time.sleep(poll)


def _state_text(info: dict, paths: RunPaths) -> str:
    """'RUNNING: training - step 3/10', 'PENDING (Resources)', 'RUNNING [restart 1]: ...'."""
    state = info.get("state", "UNKNOWN")
    text = state
    if info.get("restarts", "0") not in ("0", None):
        text += f" [restart {info['restarts']}]"
    if state == "PENDING" and info.get("reason"):
        text += f" ({info['reason']})"
    phase = paths.last_phase()
    if state == "RUNNING" and phase:
        progress = paths.progress(phase.get("restart", 0)) if phase["phase"] == "driver-start" else None
        text += f": {shown_phase(phase['phase'], progress)}" + (f" ({phase['detail']})" if phase.get("detail") else "")
        text += f" - {progress}" if progress else ""  # what the driver's Ray work is doing
    return text


@contextmanager
def _undone(directory: Path):
    """What was written under DIRECTORY goes if sbatch fails: nothing half-written is left."""
    try:
        yield
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
