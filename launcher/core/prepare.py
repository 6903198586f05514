"""One pipeline behind check, dryrun and sweeps: `prepare(recipe, overrides) -> Prepared`.

Steps, in order: the recipe as the backend runs it (backend.load: composed and checked by the
launcher, every problem of its values at once), the environment it needs (the W&B key, the
recipe's secrets), verl's own checks (preflight), the plan resolved once with what verl
resolved, and what the experiment starts from (prior). A step's refusal does not hide the next
step's: every refusal found is kept, and said together. `check` reports a Prepared, `dryrun`
raises its refusals, and a sweep prepares its points in one go (`prepare_each`: one verl
process for all of them).
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Mapping, Optional

from ..errors import RecipeError, one_error


@dataclass
class Prepared:
    loaded: object  # recipe.Loaded
    plan: object  # plan.Plan, after verl's preflight (from the recipe's values alone where verl did not run)
    preflight: object = None  # preflight.Preflight; None: not run (--no-check) or verl refused
    had: object = None  # prior.Prior: what the experiment has already (None: not looked, a sweep's fresh point)
    start: str = "auto"  # prior.STARTS: what the run was asked to start from
    missing: List[RecipeError] = field(default_factory=list)  # the environment's: only submit refuses them
    problems: List[RecipeError] = field(default_factory=list)  # the recipe's, with verl's and the prior's
    warnings: List[str] = field(default_factory=list)  # said, not refused

    @property
    def recipe(self):
        return self.loaded.recipe

    @property
    def refusal(self) -> Optional[RecipeError]:
        """Every refusal, as one error (None: submit would queue it)."""
        return one_error(self.missing + self.problems)

    def refused(self) -> Optional[RecipeError]:
        """The refusal, with what would be warned about after it (the recipe's, verl's keys', the
        prior's) and what was not checked: one try shows every problem."""
        from ..checks.fields import recipe_warnings

        e = self.refusal
        if e is None:
            return None
        unchecked = None if self.plan is not None else (
            "what follows from the config verl resolves (the CPUs its actors hold, the experiment's checkpoints) "
            "and Slurm's verdict (sbatch --test-only): they need the above fixed")
        return e.with_warnings([*self.warnings, *recipe_warnings(self.recipe)], unchecked)

    def ready(self) -> "Prepared":
        """Itself, if submit may go on; else every refusal, raised at once, its warnings with it."""
        if self.refusal is not None:
            raise self.refused()
        return self


def prepare(recipe, overrides: List[str], backend, environ: Optional[Mapping[str, str]] = None,
            verl: bool = True, start: str = "auto", notes=None) -> Prepared:
    """One run's Prepared. BACKEND (backends.choose): where it would run, which loads the
    recipe as it runs there; VERL: run verl's own checks (False: --no-check); START:
    prior.STARTS; NOTES: where to say what the backend changed of the recipe (--local's node
    count)."""
    environ = os.environ if environ is None else environ
    return prepare_each([backend.load(recipe, list(overrides), environ, notes)], environ, verl, start)[0]


def prepare_each(loadeds: list, environ: Mapping[str, str], verl: bool = True, start: str = "auto",
                 named: Callable[[int], object] = lambda i: nullcontext(), sweep: bool = False) -> List[Prepared]:
    """A Prepared for each of LOADEDS (recipe.Loaded), verl asked once for all of them. NAMED(i):
    a context that names the i-th in its errors (a sweep's point); SWEEP: the points are new
    experiments, each looked at only for a cluster.resume_from step."""
    from ..checks import preflight, prior
    from ..checks.secrets import require

    out = [Prepared(loaded=loaded, plan=None, start=start, warnings=list(loaded.warnings)) for loaded in loadeds]
    for i, p in enumerate(out):
        with _into(p.missing, named(i)):
            require(p.recipe, environ)  # a secret inside the recipe: said at once, alone
    results = preflight.run_many([p.recipe for p in out], environ) if verl else [None] * len(out)
    for i, (p, pre) in enumerate(zip(out, results)):
        with _into(p.problems, named(i)):
            if isinstance(pre, RecipeError):
                raise pre
            p.preflight = pre
        with _into(p.problems, named(i)):
            p.plan = p.loaded.resolve(p.preflight.config if p.preflight is not None else None)
        if p.plan is None:  # nothing more can be looked at (too few CPUs for what verl resolved)
            continue
        if sweep and not p.plan.resume_from:
            continue
        p.had = prior.find(p.plan, [] if sweep else None)
        with _into(p.problems, named(i)):
            prior.enforce(p.had, start, str(p.recipe.source), p.loaded.blame)
        if not sweep:
            p.warnings += p.had.warnings(p.plan.verl, p.recipe.verl.version)
    return out


@contextmanager
def _into(found: List[RecipeError], naming) -> Iterator[None]:
    """Gather a step's RecipeError(s) into FOUND, named by the context NAMING (a sweep point's);
    a secret's goes on up at once."""
    try:
        with naming:
            yield
    except RecipeError as e:
        if getattr(e, "at_once", False):
            raise
        found.extend(e.each)
