"""The Python API: the one door. Every command is a function here, and the CLI only prints what
these return (TorchX's shape: `submit` is `schedule` of a `dryrun`).

    import launcher
    print(launcher.check("recipes/gsm8k-grpo.yaml", ["cluster.nodes=4"]).verdict)
    req = launcher.dryrun("recipes/gsm8k-grpo.yaml", ["cluster.nodes=4"])   # str(req): the command
    run = launcher.submit(req)                                               # or submit(recipe, overrides)
    run.wait(); run.status(); run.logs(); run.cancel(); run.merge()
    sweep = launcher.sweep("recipes/gsm8k-grpo.yaml", ["verl.overrides.data.seed=1,2"])
    launcher.runs(); launcher.run("12")

Bad input raises RecipeError (the CLI's exit 2: nothing written, nothing queued); a failed Slurm
command, or a job that can never start, raises SlurmError (exit 1; 3 for `--wait`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, TextIO, Tuple

from .errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NEVER_STARTS, RecipeError, SlurmError  # noqa: F401

# What has been submitted (api_runs.py), loaded on first use: render and check never pay for it.
_LATER = {"Run": "api_runs", "SweepRun": "api_runs", "image_import": "api_runs", "merge": "api_runs",
          "merge_dryrun": "api_runs", "run": "api_runs", "runs": "api_runs", "served": "api_runs",
          "wait_merge": "api_runs", "steps_done": "api_runs", "never_starts_text": "state", "TERMINAL": "slurm"}


def __getattr__(name):
    if name in _LATER:
        import importlib

        return getattr(importlib.import_module(f".{_LATER[name]}", __package__), name)
    raise AttributeError(f"module 'launcher.api' has no attribute {name!r}")


Line = Tuple[str, str]  # (label, text): one line of a report, printed as f"{label:<11} {text}"


def load(recipe, overrides: List[str] = (), local: bool = False, environ: Optional[Mapping[str, str]] = None,
         notes: Optional[TextIO] = None):
    """The recipe composed and checked by the launcher (recipe.load); LOCAL: as `--local` runs
    it (one node, this machine's GPUs), saying on NOTES what that changed."""
    from .recipe import load as load_recipe

    overrides = list(overrides)
    if not local:
        return load_recipe(recipe, overrides)
    from .backends.local import local_overrides

    asked = load_recipe(recipe, overrides).recipe.cluster
    loaded = load_recipe(recipe, overrides + local_overrides(os.environ if environ is None else environ))
    for name in ("nodes", "gpus_per_node"):  # say what --local changes, rather than change it silently
        if getattr(asked, name) != getattr(loaded.recipe.cluster, name) and notes is not None:
            print(f"--local: cluster.{name}={getattr(loaded.recipe.cluster, name)} here (the recipe asks for "
                  f"{getattr(asked, name)})", file=notes)
    return loaded


def script(recipe, overrides: List[str] = (), local: bool = False, environ: Optional[Mapping[str, str]] = None,
           notes: Optional[TextIO] = None) -> str:
    """`verl-launch render`: the sbatch script of the recipe's plan, from the recipe's values
    alone (no verl preflight: `dryrun` gives the script exactly as submit would send it)."""
    from .render import render

    return render(load(recipe, overrides, local, environ, notes).plan)


@dataclass
class Report:
    """What `check` says, as data: its lines in order, verl's arguments, and the verdict."""
    lines: List[Line]
    verl_args: List[str] = field(default_factory=list)
    refusal: Optional[RecipeError] = None  # what submit would refuse (a missing key, ...)
    preflight: object = None  # preflight.Preflight
    points: List[Tuple[int, str, str]] = field(default_factory=list)  # a sweep's: (point, experiment, overrides)

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @property
    def verdict(self) -> str:
        if self.refusal is not None:
            return f"error: {self.refusal}"
        if self.points:
            return f"ok: submit -m would queue this sweep ({len(self.points)} points)"
        status = getattr(self.preflight, "status", "skipped")
        return "ok: submit would queue this job" + ("" if status in ("ok", "skipped") else
                                                    f" (launcher checks only: verl's {status})")


def check(recipe, overrides: List[str] = (), local: bool = False, environ: Optional[Mapping[str, str]] = None,
          multirun: bool = False, max_points: int = 256, notes: Optional[TextIO] = None) -> Report:
    """`verl-launch check`: everything submit checks, in the same order, and what would run.
    Raises RecipeError for what refuses the recipe itself; what only submit would refuse (a
    missing key) is the report's refusal, after what would run."""
    from . import prior
    from .secrets import SecretInRecipe, find_key, needs_key, require
    from .summary import weigh

    environ = os.environ if environ is None else environ
    if multirun:
        return _check_sweep(recipe, overrides, local, environ, max_points)
    loaded = load(recipe, overrides, local, environ, notes)
    r = loaded.recipe
    try:
        require(r, environ)
        refusal = None
    except SecretInRecipe:  # at once: what would be shown holds the secret
        raise
    except RecipeError as e:  # shown last: what submit would say, after what it would run
        refusal = e
    try:
        pre = _preflight(loaded, environ, True)
    except RecipeError as e:
        if refusal is None:
            raise
        return Report([("preflight", str(e))], refusal=refusal)
    plan = _resolve(loaded, pre)
    lines = verl_lines(plan, pre)
    c = r.cluster
    lines += [("recipe", r.source),
              ("job", f"{r.job.name}: {c.nodes} node(s) x {c.gpus_per_node} GPU(s), {c.cpus_per_task} CPUs per node"
                      + (f", requeue (USR1 {c.signal_seconds} s before the limit)" if c.requeue else "")),
              ("entrypoint", f"{r.runtime.python} -m {r.verl.entrypoint}"), ("verl keys", loaded.verl_keys),
              ("W&B", f"project={r.wandb.project} entity={r.wandb.entity or '(key default)'} "
                      f"experiment={r.experiment} logging={'on' if r.wandb.enabled else 'off'}"),
              ("trace", f"backend={r.trace.backend} token2text={r.trace.token2text} "
                        f"max_samples_per_step_per_worker={r.trace.max_samples_per_step_per_worker}")]
    if needs_key(r):
        try:
            src = find_key(r, environ)
            lines.append(("W&B key", src.where if src else
                          "MISSING: export WANDB_API_KEY, set wandb.api_key_file or use ~/.netrc"))
        except RecipeError:  # a malformed key: the refusal says it
            lines.append(("W&B key", "refused (see below)"))
    lines += [("secret", f"{n}: {'set' if environ.get(n) else 'NOT SET in your environment'}") for n in r.secrets]
    from .render import render

    had = prior.find(plan)
    prior.enforce(had, "auto", str(r.source), loaded.blame)
    lines += weigh(plan, had, None if local else render(plan), ask_slurm=not local)
    lines += [("WARNING", w) for w in had.warnings(plan.verl, r.verl.version)]
    return Report(lines, verl_args=list(plan.verl_args), refusal=refusal, preflight=pre)


def _sweep_points(recipe, overrides, local, environ, max_points):
    from . import sweeps

    extra = []
    if local:
        from .backends.local import local_overrides

        extra = local_overrides(environ)
    return sweeps.load_points(recipe, list(overrides), extra, max_points=max_points)


def _check_sweep(recipe, overrides, local, environ, max_points) -> Report:
    from . import sweeps

    sw = _sweep_points(recipe, overrides, local, environ, max_points)
    sweeps.check(sw, environ)
    r = sw.points[0].loaded.recipe
    c = r.cluster
    return Report([("recipe", r.source),
                   ("sweep", f"{sw.name}: {len(sw.points)} points, one job array; each {c.nodes} node(s) x "
                             f"{c.gpus_per_node} GPU(s)"),
                   ("W&B", f"project={r.wandb.project} group={r.wandb.group} job_type={r.wandb.job_type}"),
                   ("preflight", _sweep_verl_line(sw))],
                  preflight=sw.points[0].preflight, points=[(p.number, p.experiment, p.label()) for p in sw.points])


def _sweep_verl_line(sw) -> str:
    pre = [p.preflight for p in sw.points if p.preflight is not None]
    if not pre:
        return "skipped (--no-check)"
    first = pre[0]
    return f"{first.status}: {first.message}" + (f" ({len(sw.points)} points, one verl process)"
                                                 if first.status == "ok" else "")


def _preflight(loaded, environ, verl: bool):
    """verl's own checks: a Preflight, or None where VERL is false (skipped, as --no-check)."""
    from . import preflight as pf

    return pf.run(loaded.recipe, environ) if verl else None


def _resolve(loaded, pre):
    """The plan, resolved once, with what verl's preflight resolved (refuses too few CPUs)."""
    return loaded.resolve(pre.config if pre is not None else None)


def verl_lines(plan, pre) -> List[Line]:
    """The preflight's report: verl's verdict, the CPU need, the version rules, the trace volume."""
    from .plan import trace_volume
    from .verl_versions import rules_for

    r = plan.recipe
    lines: List[Line] = [("preflight", f"{pre.status}: {pre.message}")] if pre is not None else []
    lines += [("note", n) for n in (pre.notes if pre is not None else [])]
    if plan.cpu_need:
        lines.append(("cpus", f"{r.cluster.cpus_per_task} per node for Ray; {plan.cpu_need.explain()}"))
    lines += [(rule.line[:11].rstrip(), rule.line[12:]) for rule in rules_for(r)]
    per_step = plan.traces_per_step
    if per_step is not None and r.trace.backend != "none":
        cap = r.trace.max_samples_per_step_per_worker
        how = "every sample" if cap is None else f"max_samples_per_step_per_worker={cap} per agent-loop worker"
        lines.append(("traces", f"about {per_step} per training step ({how}, all rollouts of each)"))
        volume = trace_volume(r, plan.verl, per_step)
        if volume:
            calls, size = volume
            lines.append(("traces", f"about {calls} calls and {size / 1e6:.2f} MB per training step at most "
                                    f"(at verl's maximum lengths): {size * 1440 / 1e9:.1f} GB a day at a step a "
                                    "minute; Weave's free tier is 1 GB a month"))
        if per_step > r.trace.warn_traces_per_step:
            lines.append(("WARNING", f"{per_step} traces per step is above trace.warn_traces_per_step="
                                     f"{r.trace.warn_traces_per_step}: set trace.max_samples_per_step_per_worker "
                                     "(verl's docs warn of tens of GB a day)"))
    return lines


def dryrun(recipe, overrides: List[str] = (), local: bool = False, check: bool = True,
           environ: Optional[Mapping[str, str]] = None, out: Optional[TextIO] = None, start: str = "auto",
           multirun: bool = False, max_parallel: Optional[int] = None, max_points: int = 256,
           resume_from: Optional[str] = None):
    """What `submit` would do, doing none of it: load and check the recipe, the W&B key and
    secrets, verl's own checks (CHECK; reported on OUT), the plan resolved once after them, and
    START (prior.STARTS: "fresh" refuses an experiment that has checkpoints or an earlier W&B
    run, "resume" one with nothing to resume from). RESUME_FROM (`--resume-from`): resume from
    that checkpoint (cluster.resume_from: a step, global_step_N, its path, or latest-complete),
    refused (exit 2) unless verl could load it. Returns the Request (request.py): its str
    is the exact command, its script the exact text, its paths every file. MULTIRUN: a sweep."""
    from . import prior
    from . import request as rq
    from .secrets import require

    if start not in prior.STARTS:
        raise ValueError(f"start must be one of {prior.STARTS}, not {start!r}")
    environ = os.environ if environ is None else environ
    if resume_from is not None:
        overrides, start = _resume_override(resume_from, start, multirun, overrides)
    if multirun:
        if start != "auto":
            raise RecipeError(f"--{start} is for one run, not a sweep (-m): each point is an experiment of its own",
                              where="command line")
        from . import sweeps

        sw = _sweep_points(recipe, overrides, local, environ, max_points)
        sweeps.check(sw, environ, verl=check)
        if out is not None:
            print(f"preflight   {_sweep_verl_line(sw)}", file=out)
        return sweeps.request(sw, max_parallel, local)
    if max_parallel:
        raise RecipeError("--max-parallel is for a sweep (-m)", where="command line")
    loaded = load(recipe, overrides, local, environ, notes=out)
    require(loaded.recipe, environ)
    pre = _preflight(loaded, environ, check)
    plan = _resolve(loaded, pre)
    if out is not None:
        for label, text in verl_lines(plan, pre):
            print(f"{label:<11} {text}", file=out)
    had = prior.find(plan)
    prior.enforce(had, start, str(loaded.recipe.source), loaded.blame)
    said = had.warnings(plan.verl, loaded.recipe.verl.version)
    if out is not None:
        if had.something() or plan.resume_from:
            print(f"start       {had.describe()}", file=out)
        for w in said:
            print(f"WARNING     {w}", file=out)
    req = rq.for_run(plan, local)
    req.warnings = list(loaded.warnings) + said
    return req


def _resume_override(value: str, start: str, multirun: bool, overrides) -> tuple:
    """`--resume-from VALUE` as (the overrides with cluster.resume_from=VALUE, start "resume")."""
    import re

    where = "command line"
    if start == "fresh":
        raise RecipeError("--resume-from and --fresh: one says resume, the other start from scratch", where=where)
    if multirun:
        raise RecipeError("--resume-from is for one run, not a sweep (-m): each point is an experiment of its own "
                          "(cluster.resume_from=latest-complete applies to each)", where=where)
    if not re.fullmatch(r"[A-Za-z0-9_./~-]+", str(value)):
        raise RecipeError(f"--resume-from {value!r}: give latest-complete, a step number, global_step_N or that "
                          "step's directory (a path of letters, digits and . _ - / ~)", where=where)
    return [*overrides, f"cluster.resume_from={value}"], "resume"


def submit(recipe, overrides: List[str] = (), local: bool = False, check: bool = True,
           environ: Optional[Mapping[str, str]] = None, out: Optional[TextIO] = None, start: str = "auto",
           resume_from: Optional[str] = None):
    """`verl-launch submit`: RECIPE is a Request (dryrun's) or a recipe file, dry-run first with
    the rest. Writes the run directory and hands it to the backend: Slurm queues it (returns at
    once); local mode runs it here, to its end, its output on OUT. Returns the Run (a sweep's
    Request: the SweepRun)."""
    from . import backends
    from .request import Request

    environ = os.environ if environ is None else environ
    req = recipe if isinstance(recipe, Request) else dryrun(recipe, overrides, local, check, environ, out, start,
                                                            resume_from=resume_from)
    rec = backends.choose(req.local).schedule(req, environ, out)
    from .api_runs import Run, SweepRun

    return (SweepRun if req.is_sweep else Run)(job_id=rec["job_id"], run_dir=rec["run_dir"])


def sweep(recipe, overrides: List[str] = (), local: bool = False, check: bool = True,
          max_parallel: Optional[int] = None, max_points: int = 256, environ: Optional[Mapping[str, str]] = None,
          out: Optional[TextIO] = None):
    """`verl-launch submit -m`: Hydra's sweep grammar in OVERRIDES (lr=1e-6,1e-5 n=range(2,9,2))
    expands to one run per point, all in one Slurm job array (LOCAL: one after another here).
    Returns the SweepRun."""
    return submit(dryrun(recipe, overrides, local, check, environ, out, multirun=True, max_parallel=max_parallel,
                         max_points=max_points), environ=environ, out=out)
