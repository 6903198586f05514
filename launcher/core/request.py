"""The Request: what `submit` would do, worked out and written nowhere yet (TorchX's dry-run).
A backend's `dryrun(prepared)` builds it (`for_run` here is the part both share) and its
`schedule(request)` carries it out. Its ``str`` is the
exact command, its ``script`` the exact text. One run's request, or a sweep's: a job array whose
task i runs ``points[i]``, each a one-run request of its own.
"""

from __future__ import annotations

import dataclasses
import os
import secrets as _random
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import OmegaConf

from ..base import registry
from ..checks.values import CKPT_DIR
from .paths import RunPaths, checkpoint_root
from .plan import Plan
from .render import render


@dataclass
class Request:
    script: str  # the exact text that would be submitted
    paths: Any  # RunPaths (one run) or SweepPaths (a sweep)
    command: List[str]  # run in the request's directory
    meta: dict  # what the run's record (run.json, the registry) starts from
    plan: Optional[Plan] = None  # one run's plan (a sweep's points hold theirs)
    recipe_yaml: str = ""  # the recipe as the launcher understood it
    points: List["Request"] = field(default_factory=list)  # a sweep: task i runs points[i]
    text: str = ""  # what str() says, where the backend does not run `command` itself (a run here)
    runs_here: bool = False  # schedule returns once it has ended (backends/local.py)
    warnings: List[str] = field(default_factory=list)  # said, not refused (recipe.Loaded.warnings)

    @property
    def is_sweep(self) -> bool:
        return bool(self.points)

    @property
    def directory(self) -> Path:
        return self.paths.sweep_dir if self.is_sweep else self.paths.run_dir

    def __str__(self) -> str:
        return self.text or f"cd {shlex.quote(str(self.directory))} && {shlex.join(self.command)}"

    def point_rows(self) -> List[tuple]:
        """A sweep's points as (number 1..N, experiment, overrides), as check -m shows them."""
        return [(p.meta["point"]["point"], p.meta["experiment"], p.meta["label"]) for p in self.points]

    def register(self, job_id: Optional[str], **extra) -> dict:
        """The record once JOB_ID is known, written: run.json (a sweep's: sweep.json) and the
        registry's line (state.find reads them)."""
        record = self.record(job_id, **extra)
        self.paths.write_record(record)
        registry.record({k: v for k, v in record.items() if k != "points"})  # each point has a line of its own
        return record

    def record(self, job_id: Optional[str], **extra) -> dict:
        """The run's record once JOB_ID is known (a sweep's: its points with their ids)."""
        rec = {**self.meta, "job_id": job_id, "run_dir": str(self.directory), "command": str(self), **extra}
        if self.is_sweep:
            rec["points"] = [dict(p.meta["point"], run_dir=str(p.directory),
                                  **({"job_id": f"{job_id}_{p.meta['index']}"} if job_id else {}))
                             for p in self.points]
        else:
            rec["submitted"] = time.time()
        return rec


def for_run(plan: Plan, run_dir: Optional[Path] = None, now: Optional[float] = None, **meta) -> Request:
    """One run's request: its run directory (a new one under paths.runs/<job.name>), the script
    rendered from PLAN, the sbatch command; META goes into its record."""
    r = plan.recipe
    now = time.time() if now is None else now
    if run_dir is None:
        run_dir = runs_dir(r) / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{_random.token_hex(2)}"
    record = {"recipe": r.source, "job_name": r.job.name, "experiment": r.experiment,
              "project": r.wandb.project, "entity": r.wandb.entity, "nodes": r.cluster.nodes,
              "gpus_per_node": r.cluster.gpus_per_node, "wandb_base_url": r.wandb.base_url, "created": now,
              "wandb_enabled": r.wandb.enabled, "trace_backend": r.trace.backend,
              "traces_per_step": plan.traces_per_step, "trace_bytes_per_step": _trace_bytes(plan),
              "wandb_run_id": dict(plan.wandb_env).get("WANDB_RUN_ID"),
              "checkpoint_dir": checkpoint_root(plan.verl.get(CKPT_DIR), str(run_dir), r.wandb.project, r.experiment), **meta}
    return Request(script=render(plan), paths=RunPaths(run_dir), command=["sbatch", "--parsable", RunPaths.SCRIPT],
                   meta=record, plan=plan, recipe_yaml=resolved_yaml(r))


def _trace_bytes(plan: Plan) -> Optional[int]:
    """What check estimates the run sends Weave per training step, at most (plan.trace_volume)."""
    from .plan import trace_volume

    volume = trace_volume(plan.recipe, plan.verl, plan.traces_per_step) if plan.recipe.trace.backend != "none" else None
    return volume[1] if volume else None


def runs_dir(r) -> Path:
    """Where the recipe's runs go: paths.runs/<job.name>, absolute."""
    runs = Path(os.path.expanduser(r.paths.runs))
    return (runs if runs.is_absolute() else Path.cwd() / runs) / r.job.name


def resolved_yaml(r) -> str:
    """The recipe as the launcher understood it: composed, overridden, defaults filled in."""
    data = dataclasses.asdict(r)
    return f"# composed from {r.source}\n" + OmegaConf.to_yaml(OmegaConf.create(data))
