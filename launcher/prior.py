"""What an experiment already has before a submit, so that neither starting fresh nor resuming
happens by accident: verl's checkpoints in the run's checkpoint directory (verl's
trainer.resume_mode=auto, its default, resumes from the newest) and earlier runs in the registry
that logged to the same W&B run (its id derives from entity/project/experiment: plan.wandb_env).
`check` says it; `submit --fresh` refuses it; `submit --resume` refuses its absence. Reads files
only: no Slurm, no W&B."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Optional

from .errors import RecipeError

STARTS = ("auto", "fresh", "resume")  # submit's choice: verl's own (auto), or said explicitly


@dataclass
class Prior:
    experiment: str
    checkpoint_dir: Optional[str]
    step: Optional[int] = None  # verl's tracker: the step resume_mode=auto loads
    steps: List[int] = field(default_factory=list)  # global_step_N directories there
    resume_mode: str = "auto"
    wandb_run_id: Optional[str] = None
    runs: List[dict] = field(default_factory=list)  # earlier runs logging to that W&B run

    @property
    def resumes(self) -> bool:
        return self.step is not None and self.resume_mode == "auto"

    def describe(self) -> str:
        """One line for `check`: what the run will start from."""
        where = self.checkpoint_dir or "a relative trainer.default_local_dir (not checked)"
        if self.resumes:
            text = (f"experiment {self.experiment!r} will RESUME from step {self.step} "
                    f"({where}/global_step_{self.step}; trainer.resume_mode=auto)")
        elif self.step is not None:
            text = (f"experiment {self.experiment!r} has checkpoints up to step {self.step} in {where}, "
                    f"not resumed (trainer.resume_mode={self.resume_mode}): new ones go beside them")
        elif self.steps:
            text = (f"experiment {self.experiment!r}: {where} holds global_step_{self.steps[-1]} but no "
                    "latest_checkpointed_iteration.txt: verl starts from scratch and writes over it")
        else:
            text = f"experiment {self.experiment!r} starts from scratch (no checkpoint in {where})"
        if self.runs:
            jobs = ", ".join(str(r.get("job_id")) for r in self.runs[-3:])
            text += f"; W&B run {self.wandb_run_id} already has earlier runs (job {jobs}): this one appends to it"
        return text

    def something(self) -> bool:
        return bool(self.step is not None or self.steps or self.runs)


def find(plan, registry_runs: Optional[List[dict]] = None) -> Prior:
    """The Prior of a plan (plan.Plan); REGISTRY_RUNS: the registry's (registry.runs()).
    A record from before runs kept wandb_enabled counts as logging to W&B (the default)."""
    from .registry import runs as all_runs

    r = plan.recipe
    p = Prior(experiment=r.experiment, checkpoint_dir=plan.checkpoint_dir,
              resume_mode=plan.resume_mode,
              wandb_run_id=dict(plan.wandb_env).get("WANDB_RUN_ID"))
    if p.checkpoint_dir:
        ckpt = os.path.expanduser(p.checkpoint_dir)
        try:
            with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) as f:
                p.step = int(f.read().strip())
        except (OSError, ValueError):
            pass
        try:
            names = os.listdir(ckpt)
        except OSError:
            names = []
        p.steps = sorted(int(m.group(1)) for m in map(re.compile(r"global_step_(\d+)").fullmatch, names) if m)
    if p.wandb_run_id and r.wandb.enabled:
        w = r.wandb
        p.runs = [x for x in (all_runs() if registry_runs is None else registry_runs)
                  if x.get("wandb_enabled", True) and x.get("experiment") == r.experiment
                  and x.get("project") == w.project and x.get("entity") == w.entity]
    return p


def enforce(prior: Prior, start: str, where: str) -> None:
    """Refuse (RecipeError, exit 2) what START rules out: --fresh with anything of the
    experiment's already there; --resume with nothing to resume from."""
    if start == "fresh" and prior.something():
        had = []
        if prior.step is not None or prior.steps:
            newest = prior.step if prior.step is not None else prior.steps[-1]
            had.append(f"checkpoints up to global_step_{newest} in {prior.checkpoint_dir}")
        if prior.runs:
            had.append(f"W&B run {prior.wandb_run_id} from job {prior.runs[-1].get('job_id')}")
        raise RecipeError(f"--fresh: experiment {prior.experiment!r} already has {' and '.join(had)}: "
                          f"give it a new name (wandb.experiment={prior.experiment}-2), or move those "
                          "checkpoints away; to continue it instead, use --resume", where=where, key="wandb.experiment")
    if start == "resume" and not prior.resumes:
        why = (f"its checkpoints are not resumed with trainer.resume_mode={prior.resume_mode}"
               if prior.step is not None else
               f"there is no checkpoint to resume from in {prior.checkpoint_dir or 'trainer.default_local_dir'}"
               " (verl's latest_checkpointed_iteration.txt)")
        raise RecipeError(f"--resume: experiment {prior.experiment!r}: {why}", where=where,
                          key="verl.overrides.trainer.default_local_dir")
