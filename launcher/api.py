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
          "wait_merge": "api_runs", "never_starts_text": "jobs.state", "TERMINAL": "backends.slurm_commands",
          "tool_executions": "jobs.traces"}


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
    from . import backends

    return backends.choose(local).load(recipe, list(overrides), os.environ if environ is None else environ, notes)


def script(recipe, overrides: List[str] = (), local: bool = False, environ: Optional[Mapping[str, str]] = None,
           notes: Optional[TextIO] = None) -> str:
    """`verl-launch render`: the sbatch script of the recipe's plan, from the recipe's values
    alone (no verl preflight: `dryrun` gives the script exactly as submit would send it)."""
    from .core.render import render

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
    """`verl-launch check`: everything submit checks (prepare.py: the same pipeline), and what
    would run. Raises RecipeError, every refusal at once, for what refuses the recipe itself;
    what only the environment refuses (a missing key, an unset secret) is the report's refusal,
    after what would run."""
    from . import backends
    from .core.prepare import prepare
    from .checks.secrets import find_key, needs_key

    environ = os.environ if environ is None else environ
    backend = backends.choose(local)
    if multirun:
        return _check_sweep(recipe, overrides, backend, environ, max_points)
    p = prepare(recipe, overrides, backend, environ, notes=notes)
    if p.problems:
        raise p.refused()
    r, plan, loaded = p.recipe, p.plan, p.loaded
    lines = verl_lines(plan, p.preflight)
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
    lines += backend.weigh(plan, p.had)
    lines += [("WARNING", w) for w in p.warnings if w not in loaded.warnings]
    return Report(lines, verl_args=list(plan.verl_args), refusal=p.refusal, preflight=p.preflight)


def _sweep_points(recipe, overrides, backend, environ, max_points):
    """A sweep's points, each loaded as BACKEND runs it."""
    from .core import sweeps

    return sweeps.load_points(recipe, list(overrides), max_points=max_points,
                              loader=lambda path, ovs: backend.load(path, ovs, environ))


@dataclass
class Import:
    """What `import_command` wrote: the recipe's path, what was mapped and why, what was not
    carried and why, check's report."""
    path: str
    said: List[str]
    report: Report
    dropped: List[str] = field(default_factory=list)


def import_command(argv: List[str], out, force: bool = False, cwd: Optional[str] = None,
                   environ: Optional[Mapping[str, str]] = None) -> Import:
    """`verl-launch import -o OUT -- ARGV`: a verl command line (python3 -m verl.trainer.main_ppo
    ...) as a recipe at OUT, then `check`'s verdict on it. Raises RecipeError, writing nothing (an
    OUT that was there is left as it was), for a command line that is not verl's, an override
    Hydra cannot parse, an OUT that exists without FORCE, or a recipe check refuses."""
    from pathlib import Path

    from .core.importer import from_command, parse_command, to_yaml

    cwd = cwd or os.getcwd()
    path = Path(out)
    if not path.name.endswith((".yaml", ".yml")):
        raise RecipeError(f"{out}: a recipe is a .yaml file", where="-o", key="-o")
    if path.exists() and not force:
        raise RecipeError(f"{out} exists: give --force to replace it, or another -o", where="-o", key="-o")
    cmd = parse_command(list(argv), cwd=cwd)
    imported = from_command(cmd, cwd)
    before = path.read_bytes() if path.exists() else None
    path.write_text(to_yaml(imported, cmd, cwd))
    try:
        report = check(str(path), [], environ=environ)
    except BaseException:
        if before is None:
            path.unlink()
        else:
            path.write_bytes(before)
        raise
    return Import(str(path), imported.said, report, imported.dropped)


def _check_sweep(recipe, overrides, backend, environ, max_points) -> Report:
    from .core import sweeps

    sw = _sweep_points(recipe, overrides, backend, environ, max_points)
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


def verl_lines(plan, pre) -> List[Line]:
    """The preflight's report: verl's verdict, the CPU need, the version rules, the trace volume."""
    from .core.plan import trace_volume
    from .base.verl_versions import rules_for

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
    """What `submit` would do, doing none of it: what `check` checks (prepare.py: the recipe,
    the W&B key and secrets, verl's own checks (CHECK; reported on OUT), the plan resolved
    once after them, and START (prior.STARTS: "fresh" refuses an experiment that has
    checkpoints or an earlier W&B run, "resume" one with nothing to resume from)), every
    refusal raised at once, then the backend's Request. RESUME_FROM (`--resume-from`): resume
    from that checkpoint (cluster.resume_from: a step, global_step_N, its path, or
    latest-complete), refused (exit 2) unless verl could load it. The Request (request.py): its
    str is the exact command, its script the exact text, its paths every file. MULTIRUN: a sweep."""
    from . import backends
    from .checks import prior
    from .core.prepare import prepare

    if start not in prior.STARTS:
        raise ValueError(f"start must be one of {prior.STARTS}, not {start!r}")
    environ = os.environ if environ is None else environ
    backend = backends.choose(local)
    if resume_from is not None:
        overrides, start = _resume_override(resume_from, start, multirun, overrides)
    if multirun:
        if start != "auto":
            raise RecipeError(f"--{start} is for one run, not a sweep (-m): each point is an experiment of its own",
                              where="command line")
        from .core import sweeps

        sw = _sweep_points(recipe, overrides, backend, environ, max_points)
        sweeps.check(sw, environ, verl=check)
        if out is not None:
            print(f"preflight   {_sweep_verl_line(sw)}", file=out)
        return backend.dryrun_sweep(sw, max_parallel)
    if max_parallel:
        raise RecipeError("--max-parallel is for a sweep (-m)", where="command line")
    p = prepare(recipe, overrides, backend, environ, verl=check, start=start, notes=out).ready()
    if out is not None:
        for label, text in verl_lines(p.plan, p.preflight):
            print(f"{label:<11} {text}", file=out)
        if p.had.something() or p.plan.resume_from:
            print(f"start       {p.had.describe()}", file=out)
        for w in p.warnings:
            if w not in p.loaded.warnings:  # those were said as the recipe loaded
                print(f"WARNING     {w}", file=out)
    return backend.dryrun(p)


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
    from .core.request import Request

    environ = os.environ if environ is None else environ
    req = recipe if isinstance(recipe, Request) else dryrun(recipe, overrides, local, check, environ, out, start,
                                                            resume_from=resume_from)
    rec = backends.of(req.meta).schedule(req, environ, out)
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
