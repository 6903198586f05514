"""What an experiment already has before a submit, so that neither starting fresh nor resuming
happens by accident: verl's checkpoints in the run's checkpoint directory (verl's
trainer.resume_mode=auto, its default, resumes from the newest) and earlier runs in the registry
that logged to the same W&B run (its id derives from entity/project/experiment: plan.wandb_env).
`check` says it; `submit --fresh` refuses it; `submit --resume` refuses its absence. Reads files
only: no Slurm, no W&B."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional

from ..base.checkpoints import LATEST, Survey, missing, survey
from ..errors import RecipeError
from ..base.verl_versions import NEWEST_CHECKED, parse

STARTS = ("auto", "fresh", "resume")  # submit's choice: verl's own (auto), or said explicitly
ASYNC_SAVE = "actor_rollout_ref.actor.checkpoint.async_save"


@dataclass
class Prior:
    experiment: str
    checkpoint_dir: Optional[str]
    step: Optional[int] = None  # verl's tracker: the step resume_mode=auto loads, if it can
    steps: List[int] = field(default_factory=list)  # global_step_N directories there
    resume_mode: str = "auto"
    resume_from: Optional[str] = None  # cluster.resume_from (checks.resume_from)
    survey: Optional[Survey] = None  # the checkpoint directory as verl would read it (checkpoints.survey)
    layout: dict = field(default_factory=dict)  # what a loadable step holds for the run (checkpoints.layout)
    wandb_run_id: Optional[str] = None
    runs: List[dict] = field(default_factory=list)  # earlier runs logging to that W&B run

    @property
    def start_step(self) -> Optional[int]:
        """The step the run resumes from: cluster.resume_from's, or what verl's tracker loads."""
        s = self.survey
        if self.resume_mode != "auto" or s is None:
            return None
        if self.resume_from == LATEST and s.problem:
            return s.newest_complete
        if self.resume_from and self.resume_from.isdigit():
            return int(self.resume_from)
        return s.loads

    @property
    def resumes(self) -> bool:
        return self.start_step is not None

    def describe(self) -> str:
        """One line for `check`: what the run will start from."""
        where = self.checkpoint_dir or "a relative trainer.default_local_dir (not checked)"
        n = self.start_step
        if n is not None and self.resume_from and (self.resume_from != LATEST or self.survey.problem):
            text = (f"experiment {self.experiment!r} will RESUME from step {n} ({where}/global_step_{n}; "
                    f"cluster.resume_from={self.resume_from}: the job writes verl's "
                    f"latest_checkpointed_iteration.txt = {n} before verl starts)")
        elif n is not None:
            text = (f"experiment {self.experiment!r} will RESUME from step {n} "
                    f"({where}/global_step_{n}; trainer.resume_mode=auto)")
        elif self.step is not None and self.resume_mode != "auto":
            text = (f"experiment {self.experiment!r} has checkpoints up to step {self.step} in {where}, "
                    f"not resumed (trainer.resume_mode={self.resume_mode}): new ones go beside them")
        elif self.steps:
            text = (f"experiment {self.experiment!r} starts from scratch, though {where} holds "
                    f"global_step_{self.steps[-1]} (see the warning)")
        else:
            text = f"experiment {self.experiment!r} starts from scratch (no checkpoint in {where})"
        if self.runs:
            jobs = ", ".join(str(r.get("job_id")) for r in self.runs[-3:])
            text += f"; W&B run {self.wandb_run_id} already has earlier runs (job {jobs}): this one appends to it"
        return text

    def trouble(self) -> Optional[str]:
        """Why verl would not resume from the newest complete checkpoint, with the way out; None
        when it would, when cluster.resume_from takes it there, or when verl does not resume."""
        s = self.survey
        if s is None or not s.problem or self.resume_mode != "auto" or self.resume_from:
            return None
        return f"{s.root}: {s.problem}; {s.way_out()}"

    def warnings(self, verl: dict, version: Optional[str]) -> List[str]:
        """check's and submit's warnings on resuming: the trouble above, and verl#7952 (VERL:
        verl's effective values; VERSION: verl.version)."""
        said = [t for t in [self.trouble()] if t]
        if verl.get(ASYNC_SAVE) is True and self.resume_from != LATEST and (
                version is None or parse(version) <= parse(NEWEST_CHECKED)):
            said.append(f"{ASYNC_SAVE}=true: verl {version or NEWEST_CHECKED} then never writes "
                        "latest_checkpointed_iteration.txt (verl#7952), so a requeue or a resubmit would start over "
                        "from scratch; set cluster.resume_from=latest-complete (the job writes it for the newest "
                        "complete checkpoint at each start and says so), or async_save=false")
        return said

    def something(self) -> bool:
        return bool(self.step is not None or self.steps or self.runs)


def find(plan, registry_runs: Optional[List[dict]] = None) -> Prior:
    """The Prior of a plan (plan.Plan); REGISTRY_RUNS: the registry's (registry.runs()).
    A record from before runs kept wandb_enabled counts as logging to W&B (the default)."""
    from ..base.registry import runs as all_runs

    r = plan.recipe
    p = Prior(experiment=r.experiment, checkpoint_dir=plan.checkpoint_dir,
              resume_mode=plan.resume_mode, resume_from=plan.resume_from, layout=plan.checkpoint_layout,
              wandb_run_id=dict(plan.wandb_env).get("WANDB_RUN_ID"))
    if p.checkpoint_dir:
        p.survey = survey(os.path.expanduser(p.checkpoint_dir), p.layout)
        p.step, p.steps = p.survey.tracker, p.survey.steps
    if p.wandb_run_id and r.wandb.enabled:
        w = r.wandb
        p.runs = [x for x in (all_runs() if registry_runs is None else registry_runs)
                  if x.get("wandb_enabled", True) and x.get("experiment") == r.experiment
                  and x.get("project") == w.project and x.get("entity") == w.entity]
    return p


def enforce(prior: Prior, start: str, where: str, blame=None) -> None:
    """Refuse (RecipeError, exit 2) what START rules out: --fresh with anything of the
    experiment's already there; --resume with nothing to resume from, or where verl would not
    resume from the newest complete checkpoint; and a cluster.resume_from step that verl
    could not load (whatever START). BLAME: the recipe's (recipe.Loaded.blame), to name where
    cluster.resume_from was set."""
    s = prior.survey
    if prior.resume_from and prior.resume_from.isdigit() and s is not None:
        n = int(prior.resume_from)
        if n not in s.steps:
            why = f"global_step_{n} is not in {s.root} (steps there: {s.listing()})"
        else:
            why = s.incomplete.get(n) or missing(os.path.join(s.root, f"global_step_{n}"), prior.layout)
            why = why and f"global_step_{n} is incomplete ({why}): verl could not load it"
        if why:
            raise RecipeError(f"{prior.resume_from}: {why}", where=blame("cluster.resume_from") if blame else where,
                              key="cluster.resume_from")
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
    if start == "resume" and prior.trouble():
        raise RecipeError(f"--resume: experiment {prior.experiment!r}: {prior.trouble()}", where=where,
                          key="verl.overrides.trainer.default_local_dir")
    if start == "resume" and not prior.resumes:
        why = (f"its checkpoints are not resumed with trainer.resume_mode={prior.resume_mode}"
               if prior.step is not None and prior.resume_mode != "auto" else
               f"there is no complete checkpoint to resume from in {prior.checkpoint_dir} (steps there: {s.listing()})"
               if s is not None and s.steps else
               f"there is no checkpoint to resume from in {prior.checkpoint_dir or 'trainer.default_local_dir'}"
               " (verl's latest_checkpointed_iteration.txt)")
        raise RecipeError(f"--resume: experiment {prior.experiment!r}: {why}", where=where,
                          key="verl.overrides.trainer.default_local_dir")
