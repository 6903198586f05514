"""The Python API's half for what has been submitted: a Run (status, logs, wait, cancel, merge, sync),
a sweep's SweepRun, `runs()` (the list), `run(ref)` (the one lookup), merges and images. The run
state lives below, in jobs/state.py; where a run went (Slurm or here), in backends/."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Union

from .jobs import state, wandb_sync
from .errors import RecipeError, SlurmError
from .core.paths import RunPaths
from .backends.slurm_commands import TERMINAL


@dataclass
class Run:
    """A submitted run, known by its job id and run directory."""
    job_id: str
    run_dir: str

    @property
    def record(self) -> dict:
        """The run's record (the registry's line, else its run.json)."""
        return state.find(self.run_dir) or {"job_id": self.job_id, "run_dir": self.run_dir}

    @property
    def paths(self) -> RunPaths:
        return RunPaths(Path(self.run_dir))

    def _backend(self):
        from . import backends

        return backends.of(self.record)

    def state(self) -> str:
        """Slurm's state (PENDING, RUNNING, COMPLETED, ...), or a local run's."""
        return state.states([self.record]).get(self.run_dir, {}).get("state", "UNKNOWN")

    def status(self, traces: bool = True) -> dict:
        """What `status --json` prints: state, phase, progress, step, why it stopped, exit code,
        links (URLs only; link_templates and links_note where wandb.entity is unset), merges;
        with TRACES, the trajectories Weave received against the estimate (one query, once the
        job has started; None if the run is not traced to Weave)."""
        run = self.record
        row = state.row(run, state.states([run])[self.run_dir])
        row["traces"] = self._traces_seen(row) if traces else None
        row["goodput"] = self._goodput(row)
        shown = state.wandb_links(run)
        row["links"] = shown if run.get("entity") else {}
        row["link_templates"] = {} if run.get("entity") else shown
        row["links_note"] = state.links_note(run)
        row["stdout"] = str(self.paths.stdout(run["job_id"]))
        row["merges"] = state.merges(run)
        row["wandb_offline"] = wandb_sync.unsynced_note(run) if row["state"] in TERMINAL else None
        return row

    def traces(self, step=None, sample_index: Optional[int] = None, rollout_n: Optional[int] = None,
               validate: Optional[bool] = None, experiment: Optional[str] = None, limit: Optional[int] = None,
               nested: bool = False, call_ids: Optional[List[str]] = None, environ=None) -> Iterator[dict]:
        """The run's traced trajectories (`verl-launch traces`), oldest first, filtered by Weave's
        own query: STEP is N, 'N:M', (N, M) or a list of them. Each is a dict: call_id, op, step,
        sample_index, rollout_n, validate, experiment, turns, tool_calls, reward; with NESTED, its
        inputs, output and calls (each nested call's op, inputs, output). Streams: nothing is
        held but one page. Raises RecipeError (not traced, no key, a bad step) or RemoteError."""
        from .jobs import traces

        steps = [] if step is None else step if isinstance(step, list) else [step]
        f = traces.Filters([s if isinstance(s, tuple) else traces.parse_step(s) for s in steps], sample_index,
                           rollout_n, validate, experiment, limit)
        return traces.trajectories(traces.source(self.record, os.environ if environ is None else environ), f,
                                   nested, call_ids)

    def trace_tally(self, environ=None):
        """Training trajectories per step against `check`'s estimate (trace_tally.Tally: total,
        spans, counts, estimate, short = the completed steps that have fewer, falls_short;
        text()), from a few stats requests over step ranges, never a stream of the run's calls."""
        return self._tally(environ, self.status(traces=False)["steps_done"])

    def tally_of(self, counts: Dict[int, int]):
        """A listing's own per-step counts (training trajectories) against `check`'s estimate and
        the steps the run completed (trace_tally.Tally)."""
        from .jobs.trace_tally import Tally

        return Tally.of(counts, self.record.get("traces_per_step"), self.status(traces=False)["steps_done"])

    def report(self, price: Optional[float] = None, plot: Optional[str] = None):
        """Where the run's allocation went (jobs/report.Report: its attempts, each part's seconds,
        the steps kept and lost, goodput; to_dict(), line()), from the run's own files and Slurm's
        accounting. PRICE per GPU-hour: default the recipe's cluster.gpu_hour_price. PLOT: also
        draw its timeline into that PNG file (matplotlib, the `plot` extra: without it a
        RecipeError, before any work)."""
        from .jobs import report, report_plot

        if plot:
            report_plot.need_matplotlib()
        if not Path(self.run_dir).is_dir():
            raise RecipeError("the run directory does not exist (moved or deleted?)", where=self.run_dir)
        record = {**(self.paths.read_record() or {}), **self.record}
        if price is None:
            try:
                price = ((self.paths.resolved_recipe().get("cluster") or {}).get("gpu_hour_price"))
            except (OSError, ValueError, RecipeError):
                price = None
        try:
            allocations, unasked = self._backend().allocations(self.record), None
        except SlurmError as e:  # no Slurm here (a laptop with the run dir): the job's own marks
            allocations, unasked = [], f"Slurm could not be asked ({e}): each attempt is timed by the job's own marks"
        rep = report.build(self.paths, record, allocations, price)
        if unasked:
            rep.gaps[:] = [unasked] + [g for g in rep.gaps if "no allocation in Slurm's accounting" not in g]
        if plot:
            report_plot.plot(rep, plot)
        return rep

    def _goodput(self, row: dict) -> Optional[str]:
        """status's goodput line (report's line()), or None before the job starts."""
        if row["state"] in ("PENDING", "UNKNOWN"):
            return None
        try:
            return self.report().line()
        except (RecipeError, SlurmError, OSError, ValueError) as e:
            return f"not known: {e}"

    def _tally(self, environ, done: Optional[int]):
        from .jobs import traces

        return traces.tally(traces.source(self.record, os.environ if environ is None else environ), done)

    def _traces_seen(self, row: dict) -> Optional[dict]:
        from .jobs import traces

        if state.tracking(self.record)[1] != "weave" or row["state"] in ("PENDING", "UNKNOWN"):
            return None
        if traces.wandb_of(self.record).get("reach_timeout") == 0:
            return None  # the recipe says nothing contacts W&B (the sandbox demo): `traces` still reads them
        try:
            t = self._tally(None, row["steps_done"])  # the row's step: no second status
        except (RecipeError, SlurmError) as e:
            return {"text": f"not counted: {e}", "error": str(e)}
        out = {"received": t.total, "per_step": t.counts, "estimate": t.estimate, "short": t.short,
               "short_ranges": t.unresolved, "text": t.text(ended=row["state"] in TERMINAL)}
        if not t.total:
            out["text"] += ": " + traces.why_none(self.record)
        lost = traces.flush_note(RunPaths(Path(self.run_dir)))
        if lost:
            out["text"] += "; " + lost
        size, secs = self.record.get("trace_bytes_per_step"), RunPaths(Path(self.run_dir)).seconds_per_step()
        if t.total and size and secs:  # check's estimate, at most, at this run's own pace
            out["volume"] = (f"about {size / 1e6:.2f} MB a step at most (check's estimate): "
                             f"{size * 86400 / secs / 1e9:.1f} GB a day at this run's {secs:.1f} s/step")
        return out

    def wait(self, poll: float = 5.0, timeout: Optional[float] = None,
             on_change: Optional[Callable[[str], None]] = None) -> str:
        """Until the run ends (or TIMEOUT seconds): its final state. ON_CHANGE(text) whenever its
        state or phase changes ('RUNNING: training - ...'). A job that pends for a reason that
        cannot clear by itself raises SlurmError (left queued)."""
        from .backends.slurm_commands import never_starts

        info = self._backend().wait(self.record, on_change, poll=poll, timeout=timeout, stop_if_never_starts=True)
        why = never_starts(info)
        if why:
            raise _never_starts(why, self.job_id, f"job {self.job_id}")
        return info["state"]

    def cancel(self, timeout: float = 120) -> str:
        """scancel the run (a sweep: every point) and wait for its end, recorded in run.json."""
        run, backend = self.record, self._backend()
        backend.cancel(run)
        return _cancelled(self.paths, backend.wait(run, poll=1.0, timeout=timeout)["state"])

    def logs(self, follow: bool = False, driver: bool = False, node: Optional[str] = None,
             note: Callable[[str], None] = lambda text: None) -> Union[str, Iterator[str]]:
        """The batch output (DRIVER: the driver's log; NODE: that node's Ray log) as it is now;
        FOLLOW: an iterator of its text as it grows, until the job ends."""
        from .jobs import logs

        run = self.record
        if run.get("kind") == "sweep":
            first = f"{run['job_id']}_0" if run.get("job_id") else f"{run['run_dir']}/0"
            raise RecipeError(f"{run['job_id'] or run['run_dir']} is a sweep: show the output of one of its points, "
                              f"e.g. {first} (verl-launch status {run['job_id'] or run['run_dir']} lists them)",
                              where="command line")
        if follow:
            return logs.follow(run, self._backend(), driver, node, note)
        path = logs.log_file(run, driver, node)
        if not path.exists():  # as --driver and --node say: nothing to print yet
            _, now = self._backend().ended(run)
            raise SlurmError(f"no output yet (job {now}): {path} (logs -f waits for it)")
        return path.read_text(errors="replace")

    def merge(self, step: str = "latest", target: Optional[str] = None, local: bool = False,
              serve_check: bool = False):
        """`verl-launch merge` of this run's checkpoint (see merge())."""
        return merge(self.run_dir, step, target, local, serve_check)

    def sync(self, wait: bool = False, python: Optional[str] = None, environ=None,
             on_change: Optional[Callable[[str], None]] = None) -> dict:
        """`verl-launch sync`: send the run's W&B metrics that stayed offline (wandb_sync.sync):
        {"run_id", "synced": [dirs sent now], "already": [dirs sent before]}. A run still going
        is refused (RecipeError), or with WAIT followed to its end first."""
        if self.record.get("kind") == "sweep":
            raise RecipeError(f"{self.job_id} is a sweep: sync one of its points (verl-launch status "
                              f"{self.job_id} lists them)", where="command line")
        now = self.state()
        if now not in TERMINAL:
            if not wait:
                raise RecipeError(f"job {self.job_id} is {now}: its W&B run is still being written. Sync it once "
                                  "it has ended, or --wait for that", where="command line")
            self.wait(on_change=on_change)
        return wandb_sync.sync(self.record, os.environ if environ is None else environ, python)


@dataclass
class SweepRun(Run):
    """A sweep: one job array (job_id) whose points are Runs of their own."""

    def points(self) -> list:
        return [Run(p["job_id"], p["run_dir"]) for p in state.points(self.record)]

    def report(self, price: Optional[float] = None, plot: Optional[str] = None):
        """A sweep's points are runs of their own: each has its report."""
        raise RecipeError("a sweep is a job array of runs: report one point (its job id ARRAY_i or run "
                          "directory, as `verl-launch status SWEEP` lists them)", where=self.run_dir)

    def status(self) -> dict:
        return state.sweep_status(self.record)

    def wait(self, poll: float = 5.0, timeout: Optional[float] = None,
             on_change: Optional[Callable[[dict], None]] = None) -> Dict[str, str]:
        """Until every point has ended: {point job id: state}. ON_CHANGE({state: count}).
        SlurmError if every point still waiting can never start (left queued)."""
        from .backends.slurm_commands import TERMINAL, never_starts

        pts = state.points(self.record)
        final = self._backend().wait_many(pts, on_change, poll=poll, timeout=timeout, stop_if_never_starts=True)
        waiting = [i for i in final.values() if i.get("state") not in TERMINAL]  # what the wait knew
        if waiting and all(never_starts(i) for i in waiting):
            raise _never_starts("; ".join(sorted({never_starts(i) for i in waiting})), self.job_id,
                                f"sweep {self.job_id}")
        return {p["job_id"]: final[p["run_dir"]]["state"] for p in pts}

    def cancel(self, timeout: float = 120) -> Dict[str, str]:
        """scancel the array (every point, running or pending); each point's end, recorded."""
        backend, pts = self._backend(), state.points(self.record)
        backend.cancel(self.record)
        final = backend.wait_many(pts, poll=1.0, timeout=timeout)
        return {p["job_id"]: _cancelled(RunPaths(Path(p["run_dir"])), final[p["run_dir"]]["state"]) for p in pts}


def _never_starts(why: str, job_id: str, who: str) -> SlurmError:
    err = SlurmError(state.never_starts_text(why, job_id, who=who))
    err.never_starts = why
    return err


def _cancelled(paths: RunPaths, final: str) -> str:
    paths.update_record(lambda rec: rec.update(cancelled=time.time(), final_state=final))
    return final


def run(ref: str) -> Run:
    """The run (or sweep) REF names: a job id (`CLUSTER:ID` for another cluster's) or a run
    directory. RecipeError if none."""
    rec = state.require(str(ref))
    return (SweepRun if rec.get("kind") == "sweep" else Run)(job_id=rec.get("job_id"), run_dir=rec["run_dir"])


def runs(n: int = 20) -> list:
    """`verl-launch list`: the newest N runs as `list --json` gives them, newest first. Where
    Slurm cannot be asked, the local runs alone, and the list's `note` says why."""
    rows, note = state.listing(n)
    out = _Listing(rows)
    out.note = note
    return out


class _Listing(list):
    note: Optional[str] = None


def image_import(image: str, output: str = ".", dry_run: bool = False) -> dict:
    """`verl-launch image import`: IMAGE as a squashfs on shared storage (enroot import, once).
    {"command", "path", "existed"}; DRY_RUN: the command only."""
    import shlex

    from .jobs.images import import_command, import_image

    out = Path(output).expanduser().absolute()
    cmd = import_command(image, out)
    existed = Path(cmd[3]).exists()
    if not dry_run:
        import_image(image, out)
    return {"command": shlex.join(cmd), "path": cmd[3], "existed": existed, "dry_run": dry_run}


def merge_dryrun(ref: str, step: str = "latest", target: Optional[str] = None, local: bool = False,
                 serve_check: bool = False) -> dict:
    """What `merge` would submit, submitting nothing (`merge --dry-run`): the checkpoint, the
    target, the job's memory and GPUs, the interpreter. Refuses (RecipeError) what cannot work:
    a bad checkpoint or target, SERVE_CHECK with an interpreter that has no vLLM."""
    from . import backends
    from .jobs import merge_job as m

    ckpt, run = m.find(ref, str(step))
    r = m.load_run_recipe(run)
    tgt = m.target_for(ckpt, target)
    spec = m.spec_for(ckpt, tgt, r, run)
    spec.serve_check = serve_check
    looked = None
    if serve_check:
        if spec.container:
            looked = f"not checked here: the merge runs in the run's container ({r.container.image})"
        elif m.has_vllm(spec.python) is False:
            raise RecipeError(f"--serve-check loads the merged model in vLLM with the run's interpreter, and "
                              f"{spec.python} has no vllm module (looked with that interpreter, here)"
                              + ("" if run else "; give a run (its runtime.python) rather than a checkpoint"),
                              where=m.CMDLINE)
        else:
            looked = f"vllm found by {spec.python}"
    folder = (Path(run["run_dir"]) / "merge" if run else ckpt.root / ".verl-launch-merge") / f"step_{ckpt.step}"
    return {"ckpt": ckpt, "run": run, "recipe": r, "spec": spec, "folder": folder, "local": local,
            "gpus": backends.choose(local).serve_gpus(r) if serve_check else 0, "mem_gb": m.mem_gb(ckpt), "vllm": looked}


def merge(ref: str, step: str = "latest", target: Optional[str] = None, local: bool = False,
          serve_check: bool = False):
    """`verl-launch merge`: the checkpoint of REF (a run's job id or directory, or a checkpoint
    directory) merged into a Hugging Face model by verl's merger, as a one-node job submitted
    with submitit (LOCAL: here, through submitit's local executor); SERVE_CHECK: then loaded in
    vLLM, which must generate from the model's chat template. Returns the submitit job; its
    result() is the target directory (wait_merge waits without accounting)."""
    from . import backends
    from .jobs import merge_job as m

    p = merge_dryrun(ref, step, target, local, serve_check)
    ckpt, run, spec = p["ckpt"], p["run"], p["spec"]
    p["folder"].mkdir(parents=True, exist_ok=True, mode=0o700)
    ex = backends.choose(local).merge_executor(p["folder"], p["recipe"], m.job_params(p["recipe"], ckpt, p["gpus"]))
    job = ex.submit(m.run, spec)
    job.verl_launch = {"job_id": str(job.job_id), "target": spec.target, "step": ckpt.step, "local": local,
                       "checkpoint": str(ckpt.actor), "mem_gb": p["mem_gb"], "folder": str(p["folder"]),
                       "gpus": p["gpus"], "serve_check": serve_check}
    m.record(run, dict(job.verl_launch, submitted=time.time()))
    return job


def wait_merge(job, poll: float = 2.0, on_change=None) -> str:
    """Wait for a merge job and return its target. Slurm's state comes from the launcher's own
    watcher (submitit's needs accounting: without slurmdbd it stays UNKNOWN); the result
    then from submitit. Raises SlurmError if the job ended without one."""
    from . import backends

    info = job.verl_launch
    backends.of(info).wait_merge(job, on_change, poll)
    try:
        return job.result()
    except Exception as e:  # submitit's FailedJobError: the traceback of the merge
        raise SlurmError(f"merge job {info['job_id']} failed: {str(e).strip().splitlines()[-1]}; "
                         f"its output: {job.paths.stdout}") from None


def served(target: str) -> Optional[dict]:
    """What --serve-check found (vLLM's answer), from the merged model's marker; None if none."""
    from .jobs.merge_job import MARKER

    try:
        return json.loads(Path(target, MARKER).read_text()).get("serve_check")
    except (OSError, ValueError):
        return None
