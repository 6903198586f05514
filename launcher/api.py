"""The Python API: what the command line does, as functions (the CLI is a thin shell over these).

    import launcher
    run = launcher.submit("recipes/gsm8k-grpo.yaml", overrides=["cluster.nodes=4"])
    run.wait()                      # "COMPLETED", ...
    job = launcher.merge(run.run_dir)
    print(job.result())             # the merged model's directory

Bad input raises the RecipeError the CLI turns into exit 2 (nothing written, nothing queued);
a failed Slurm command raises SlurmError (exit 1).
"""

from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, TextIO

from .errors import RecipeError, SlurmError


def prepare(recipe, overrides: List[str] = (), local: bool = False, check: bool = True,
            environ: Optional[Mapping[str, str]] = None, out: Optional[TextIO] = None, start: str = "auto"):
    """Everything `submit` does before it writes anything: load and check the recipe, the W&B
    key and secrets, verl's own checks (reported on OUT), START (prior.STARTS: "fresh" refuses
    an experiment that has checkpoints or an earlier W&B run, "resume" one with nothing to
    resume from); returns (loaded, request), the request being the dry-run (its str is the
    exact command, its script the exact text)."""
    from . import prior
    from .secrets import require
    from .slurm import plan

    if start not in prior.STARTS:
        raise ValueError(f"start must be one of {prior.STARTS}, not {start!r}")
    environ = os.environ if environ is None else environ
    loaded = load(recipe, overrides, local, environ, notes=out)
    require(loaded.recipe, environ)
    if check:
        preflight(loaded, environ, out if out is not None else io.StringIO())  # no reader: the report is dropped
    had = prior.find(loaded.plan)
    prior.enforce(had, start, str(loaded.recipe.source))
    if out is not None and had.something():
        print(f"start       {had.describe()}", file=out)
    return loaded, plan(loaded)


def load(recipe, overrides: List[str] = (), local: bool = False, environ: Optional[Mapping[str, str]] = None,
         notes: Optional[TextIO] = None):
    """The recipe composed and checked by the launcher (recipe.load); LOCAL: as `--local` runs
    it (one node, this machine's GPUs), saying on NOTES what that changed."""
    from .recipe import load as load_recipe

    overrides = list(overrides)
    if not local:
        return load_recipe(recipe, overrides)
    from .local import local_overrides

    asked = load_recipe(recipe, overrides).recipe.cluster
    loaded = load_recipe(recipe, overrides + local_overrides(os.environ if environ is None else environ))
    here = loaded.recipe.cluster
    for name in ("nodes", "gpus_per_node"):  # say what --local changes, rather than change it silently
        if getattr(asked, name) != getattr(here, name) and notes is not None:
            print(f"--local: cluster.{name}={getattr(here, name)} here (the recipe asks for {getattr(asked, name)})",
                  file=notes)
    return loaded


def preflight(loaded, environ: Mapping[str, str], out: TextIO):
    """verl's own checks, the version rules and the trace volume, reported on OUT; the CPU need
    again, from the values verl resolved. Returns the Preflight."""
    from . import preflight as pf
    from .checks import check_capacity
    from .verl_versions import rules_for

    r = loaded.recipe
    pre = pf.run(r, environ)
    print(f"preflight   {pre.status}: {pre.message}", file=out)
    need = check_capacity(r, pre.config, loaded.blame)
    if need:
        print(f"cpus        {r.cluster.cpus_per_task} per node for Ray; {need.explain()}", file=out)
    for rule in rules_for(r):
        print(rule.line, file=out)
    per_step = pf.trace_volume(r, pre.config)
    if per_step is not None and r.trace.backend != "none":
        how = ("every sample" if r.trace.max_samples_per_step_per_worker is None else
               f"max_samples_per_step_per_worker={r.trace.max_samples_per_step_per_worker} per agent-loop worker")
        print(f"traces      about {per_step} per training step ({how}, all rollouts of each)", file=out)
        if per_step > r.trace.warn_traces_per_step:
            print(f"WARNING     {per_step} traces per step is above trace.warn_traces_per_step="
                  f"{r.trace.warn_traces_per_step}: set trace.max_samples_per_step_per_worker "
                  "(verl's docs warn of tens of GB a day)", file=out)
    return pre


@dataclass
class Run:
    """A submitted run: its job id and run directory, and what `status`, `logs`, `cancel` do."""
    job_id: str
    run_dir: str

    def _record(self) -> dict:
        from . import registry

        return registry.find(self.run_dir) or {"job_id": self.job_id, "run_dir": self.run_dir}

    def state(self) -> str:
        """Slurm's state (PENDING, RUNNING, COMPLETED, ...), or a local run's."""
        from .jobs import _states

        return _states([self._record()])[self.run_dir].get("state", "UNKNOWN")

    def status(self) -> dict:
        """What `status --json` prints: state, phase, progress, why it stopped, exit code."""
        from .jobs import _row, _states

        run = self._record()
        return _row(run, _states([run])[self.run_dir])

    def wait(self, poll: float = 5.0, timeout: Optional[float] = None) -> str:
        """Until the run ends (or TIMEOUT seconds): its final state. A job that pends for a
        reason that cannot clear by itself (slurm.never_starts) raises SlurmError, left queued."""
        deadline = None if timeout is None else time.monotonic() + timeout
        from .jobs import _states
        from .slurm import TERMINAL, never_starts

        while True:
            info = _states([self._record()])[self.run_dir]
            state = info.get("state", "UNKNOWN")
            if state in TERMINAL or (deadline is not None and time.monotonic() > deadline):
                return state
            why = never_starts(info)
            if why:
                raise SlurmError(f"job {self.job_id} will not start: {why}; it stays queued "
                                 f"(remove it: Run.cancel() or verl-launch cancel {self.job_id})")
            time.sleep(poll)

    def cancel(self) -> None:
        from . import slurm

        if self._record().get("local"):
            raise SlurmError(f"run {self.job_id} ran locally, not under Slurm")
        slurm.cancel(self.job_id)

    def logs(self, driver: bool = False) -> str:
        """The batch output (or the driver's log) as it is now."""
        from .paths import RunPaths

        p = RunPaths(Path(self.run_dir))
        if driver:
            logs = sorted(p.logs.glob("driver.r*.log"), key=lambda f: f.stat().st_mtime)
            path = logs[-1] if logs else p.driver_log()
        else:
            path = p.stdout(self.job_id)
        return path.read_text(errors="replace") if path.exists() else ""


def submit(recipe, overrides: List[str] = (), local: bool = False, check: bool = True,
           environ: Optional[Mapping[str, str]] = None, out: Optional[TextIO] = None, start: str = "auto") -> Run:
    """`verl-launch submit`: check, write the run directory and sbatch it (LOCAL: run it here,
    to the end). START: "auto" (verl's trainer.resume_mode decides), "fresh" or "resume" (as
    --fresh/--resume: refused, RecipeError, where the experiment's past says otherwise).
    Returns the Run."""
    environ = os.environ if environ is None else environ
    loaded, req = prepare(recipe, overrides, local, check, environ, out, start)
    if local:
        from . import local as local_mode

        rec = local_mode.run(req, loaded.recipe, environ, out if out is not None else sys.stdout)
        return Run(job_id=rec["job_id"], run_dir=rec["run_dir"])
    from .slurm import schedule

    done = schedule(req)
    return Run(job_id=done.job_id, run_dir=str(done.paths.run_dir))


def plan_merge(ref: str, step: str = "latest", target: Optional[str] = None, local: bool = False,
               serve_check: bool = False) -> dict:
    """What `merge` would submit, submitting nothing (`merge --dry-run`): the checkpoint, the
    target, the job's memory and GPUs, the interpreter. Refuses (RecipeError) what cannot work:
    a bad checkpoint or target, --serve-check with an interpreter that has no vLLM."""
    from . import merge_job as m

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
            "gpus": m.serve_gpus(r, local) if serve_check else 0, "mem_gb": m.mem_gb(ckpt), "vllm": looked}


def merge(ref: str, step: str = "latest", target: Optional[str] = None, local: bool = False,
          serve_check: bool = False):
    """`verl-launch merge`: the checkpoint of REF (a run's job id or directory, or a checkpoint
    directory) merged into a Hugging Face model by verl's merger, as a one-node job submitted
    with submitit (LOCAL: here, through submitit's local executor); SERVE_CHECK: then loaded in
    vLLM, which must generate from the model's chat template. Returns the submitit job; its
    result() is the target directory (use wait_merge to wait without accounting)."""
    from . import merge_job as m

    p = plan_merge(ref, step, target, local, serve_check)
    ckpt, run, spec = p["ckpt"], p["run"], p["spec"]
    p["folder"].mkdir(parents=True, exist_ok=True, mode=0o700)
    job = m.executor(p["folder"], p["recipe"], ckpt, local, gpus=p["gpus"]).submit(m.run, spec)
    job.verl_launch = {"job_id": str(job.job_id), "target": spec.target, "step": ckpt.step, "local": local,
                       "checkpoint": str(ckpt.actor), "mem_gb": p["mem_gb"], "folder": str(p["folder"]),
                       "gpus": p["gpus"], "serve_check": serve_check}
    m.record(run, dict(job.verl_launch, submitted=time.time()))
    return job


def wait_merge(job, poll: float = 2.0, on_change=None) -> str:
    """Wait for a merge job and return its target. Slurm's state comes from the launcher's own
    queries (submitit's needs accounting: without slurmdbd it stays UNKNOWN); the result
    then from submitit. Raises SlurmError if the job ended without one."""
    from . import slurm

    info = job.verl_launch
    if not info["local"]:
        from .paths import RunPaths

        final = slurm.watch(info["job_id"], RunPaths(Path(info["folder"])), on_change or (lambda s: None), poll=poll)
        if not job.paths.result_pickle.exists():
            raise SlurmError(f"merge job {info['job_id']} ended {final.get('JobState')} without a result; "
                             f"its output: {job.paths.stdout}")
    try:
        return job.result()
    except Exception as e:  # submitit's FailedJobError: the traceback of the merge
        raise SlurmError(f"merge job {info['job_id']} failed: {str(e).strip().splitlines()[-1]}; "
                         f"its output: {job.paths.stdout}") from None
