"""Sweeps: one recipe, many runs, one Slurm job array.

``submit RECIPE -m a=1,2 b=x,y`` - Hydra's sweep grammar, expanded by Hydra's own parser and
basic sweeper into points. Every point is a full recipe: composed, checked (verl's preflight in
one verl process for all of them) and rendered to its own run directory under the sweep's.
Points share one allocation shape, so one job array runs them: task i runs point i's script.
Each point gets its own experiment name (hence its own W&B run id and checkpoint directory),
and all share one W&B group, the sweep's name.
"""

from __future__ import annotations

import re
import secrets as _random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Mapping, Optional

from ..errors import RecipeError, one_error
from ..base.overrides import hydra_value
from .paths import SweepPaths
from .recipe import Loaded, load

MAX_POINTS = 256
JOB_TYPE = "sweep"
_NAME_MAX = 128  # W&B's limit for a run name


@dataclass
class Point:
    index: int
    overrides: List[str]  # the point's own values: one `key=value` per swept key
    loaded: Loaded
    preflight: object = None  # preflight.Preflight, once checked
    plan: object = None  # plan.Plan, resolved once checked (with verl's values where it ran)

    @property
    def number(self) -> int:
        """The point as people count it, 1..N (its index is the array task's, from 0)."""
        return self.index + 1

    @property
    def experiment(self) -> str:
        return self.loaded.recipe.experiment

    def label(self, values: bool = True) -> str:
        """The point's overrides; a secret-named key's value (refused anyway) is not shown."""
        from ..checks.secrets import SECRET_NAME

        def one(ov: str) -> str:
            key, _, value = ov.partition("=")
            return ov if values and not SECRET_NAME.search(key.rsplit(".", 1)[-1]) else f"{key}=<value>"
        return " ".join(one(ov) for ov in self.overrides)


@dataclass
class Sweep:
    name: str  # the sweep's W&B group and directory name
    recipe: str  # the recipe file, as given
    fixed: List[str]  # overrides every point shares
    points: List[Point] = field(default_factory=list)
    base_experiment: Optional[str] = None  # what each point's experiment starts with (None: swept)


def expand(overrides: List[str], max_points: int = MAX_POINTS):
    """Hydra's expansion of OVERRIDES: (the swept keys, one override list per point)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for ov in overrides:
        try:
            parsed.append(parser.parse_override(ov))
        except HydraException as e:
            msg = " ".join(str(e).split("See https://hydra.cc")[0].split())
            raise RecipeError(f"override {ov!r} is not Hydra syntax: {msg}", where="command line") from None
    swept = [p.get_key_element() for p in parsed if p.is_sweep_override()]
    if not swept:
        raise RecipeError("-m/--multirun needs at least one sweep override (key=a,b  key=range(1,4)  "
                          "key=choice(a,b)); without one, leave -m out", where="command line")
    keys = [p.get_key_element() for p in parsed]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise RecipeError(f"{twice[0]} is given twice: one override per key in a sweep", where="command line",
                          key=twice[0].lstrip("+~"))
    total = 1
    for p in parsed:
        total *= _count(p)
    if total > max_points:  # counted before expanding: range(0,1e9) must not be built first
        raise RecipeError(f"the sweep has {total} points, more than --max-points={max_points} "
                          "(raise it if you mean it)", where="command line")
    try:
        points = BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException as e:  # interval() and other sweeps only a search sweeper takes
        raise RecipeError(f"{' '.join(str(e).split())}: a sweep here lists its values (a,b, range(), choice())",
                          where="command line") from None
    if not points:
        raise RecipeError(f"the sweep is empty: {', '.join(swept)} has no values", where="command line")
    if len(points) > max_points:
        raise RecipeError(f"the sweep has {len(points)} points, more than --max-points={max_points} "
                          "(raise it if you mean it)", where="command line")
    seen = {}
    for i, point in enumerate(points):
        prev = seen.setdefault(tuple(point), i)
        if prev != i:
            own = [ov for ov in point if ov.split("=", 1)[0] in swept]
            twice = [p.get_key_element() for p in parsed if p.is_sweep_override()
                     and len(set(p.sweep_string_iterator())) < len(list(p.sweep_string_iterator()))]
            raise RecipeError(f"points {prev + 1} and {i + 1} are the same ({' '.join(own)}): a value is listed twice",
                              where="command line", key=(twice or swept)[0].lstrip("+~"))
    return swept, points


def _count(override) -> int:
    """How many values an override gives, without listing them."""
    import math

    if not override.is_sweep_override():
        return 1
    value = override.value()
    if all(hasattr(value, a) for a in ("start", "stop", "step")):
        try:
            return max(0, math.ceil((value.stop - value.start) / value.step))
        except (TypeError, ZeroDivisionError):
            return 0
    return len(getattr(value, "list", None) or [])


def labels(keys: List[str]) -> List[str]:
    """Each swept key's shortest dotted tail that no other swept key ends with."""
    plain = [k.lstrip("+~") for k in keys]
    out = []
    for key in plain:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(o != key and (o == tail or o.endswith("." + tail)) for o in plain):
                break
        out.append(tail)
    return out


def experiment_names(base: str, swept: List[str], points: List[List[str]]) -> List[str]:
    """base-<label><value>-... per point: readable, safe in W&B names, Weave filters, paths and
    Hydra values; unique (a clash, or a cut, gets the point's index)."""
    tails = dict(zip(swept, labels(swept)))
    names = []
    for point in points:
        parts = [base]
        for ov in point:
            key, _, value = ov.partition("=")
            if key in tails:
                parts.append(tails[key].replace(".", "_") + _safe(value))
        names.append("-".join(parts))
    out = []
    for i, name in enumerate(names):
        if names.count(name) > 1 or len(name) > _NAME_MAX:
            name = f"{name[:_NAME_MAX - 8]}-p{i}"
        out.append(name)
    return out


def _safe(value: str) -> str:
    value = value.strip("'\"")
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", value).strip("_") or "x"


@contextmanager
def blame_point(point: Point) -> Iterator[None]:
    """An error of one point names it."""
    from ..checks.secrets import SecretInRecipe

    try:
        yield
    except RecipeError as e:
        secret = isinstance(e, SecretInRecipe)  # then no value of the point is shown
        raise one_error([type(x)(x.message, where=f"{x.where} (sweep point {point.number}: "
                                                   f"{point.label(not secret)})", key=x.key)
                         for x in e.each]) from None


def load_points(recipe: str, overrides: List[str], max_points: int = MAX_POINTS, now: Optional[float] = None,
                loader=load) -> Sweep:
    """Every point composed and checked by the launcher (LOADER(recipe, overrides): recipe.load,
    or a backend's, as --local runs it). Nothing is written."""
    swept, points = expand(list(overrides), max_points)
    fixed = [ov for ov in points[0] if ov.split("=", 1)[0] not in swept]
    plain = {k.lstrip("+~") for k in swept}
    now = time.time() if now is None else now
    base_load = loader(recipe, fixed)
    base = base_load.recipe
    name = f"{base.job.name}-sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{_random.token_hex(2)}"
    names = experiment_names(base.experiment, swept, points)
    sweep = Sweep(name=name, recipe=str(recipe), fixed=fixed,
                  base_experiment=None if "wandb.experiment" in plain else base.experiment)
    for i, point in enumerate(points):
        own = [ov for ov in point if ov.split("=", 1)[0] in swept]
        added = [] if "wandb.experiment" in plain else [f"wandb.experiment={hydra_value(names[i])}"]
        if base.wandb.group is None and "wandb.group" not in plain:
            added.append(f"wandb.group={hydra_value(name)}")
        if base.wandb.job_type is None and "wandb.job_type" not in plain:
            added.append(f"wandb.job_type={JOB_TYPE}")
        p = Point(index=i, overrides=own, loaded=None)  # type: ignore[arg-type]
        with blame_point(p):
            p.loaded = loader(recipe, point + added)
        sweep.points.append(p)
    _distinct(sweep, "experiment", lambda p: p.experiment, "wandb.experiment")
    return sweep


def check(sweep: Sweep, environ: Mapping[str, str], verl: bool = True) -> None:
    """What submit checks of one run (prepare.py), for every point, verl asked once for all of
    them; then the points must share one allocation and never a checkpoint directory. Every
    refusal of every point is said at once."""
    from .prepare import prepare_each

    done = prepare_each([p.loaded for p in sweep.points], environ, verl,
                        named=lambda i: blame_point(sweep.points[i]), sweep=True)
    found = [e for d in done for e in d.missing + d.problems]
    for p, d in zip(sweep.points, done):
        p.preflight, p.plan = d.preflight, d.plan
    if all(p.plan is not None for p in sweep.points):
        for between in (lambda: _one_allocation(sweep),
                        lambda: _distinct(sweep, "checkpoint directory", lambda p: p.plan.checkpoint_dir,
                                          "verl.overrides.trainer.default_local_dir",
                                          hint=": make it depend on the experiment, e.g. .../checkpoints/${wandb.experiment}")):
            try:
                between()
            except RecipeError as e:
                found.append(e)
    refusal = one_error(_once(found))
    if refusal is not None:
        raise refusal


def _once(found: List[RecipeError]) -> List[RecipeError]:
    """Each problem once: the same one in several points (no key for any of them) is said for
    the first, with how many more have it."""
    first, more = {}, {}
    for e in (x for err in found for x in err.each):
        same = (type(e), e.message, e.key)
        if same in first:
            more[same] += 1
        else:
            first[same], more[same] = e, 0
    return [e if not more[k] else type(e)(f"{e.message} (and in {more[k]} more point(s))", where=e.where, key=e.key)
            for k, e in first.items()]


def _one_allocation(sweep: Sweep) -> None:
    """Every point's #SBATCH lines must be the same: one job array has one allocation shape."""
    import dataclasses

    first = sweep.points[0]
    for p in sweep.points[1:]:
        r = p.loaded.recipe
        if p.plan.directives == first.plan.directives:
            continue
        keys = ["job.name"] if r.job.name != first.loaded.recipe.job.name else []
        keys += [f"cluster.{f.name}" for f in dataclasses.fields(r.cluster)
                 if getattr(r.cluster, f.name) != getattr(first.loaded.recipe.cluster, f.name)]
        key = keys[0] if keys else "cluster"
        raise RecipeError(f"differs between points ({_get(first.loaded.recipe, key)!r} in point 1, {_get(r, key)!r} in "
                          f"point {p.number}): the points of one sweep share one job array, so one allocation; "
                          "sweep it in separate submissions", where="command line", key=key)


def _get(r, dotted: str):
    value = r
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


def _distinct(sweep: Sweep, what: str, value_of, key: str, hint: str = "") -> None:
    seen = {}
    for p in sweep.points:
        v = value_of(p)
        if v is None:
            continue
        if v in seen:
            q = seen[v]
            raise RecipeError(f"points {q.number} ({q.label()}) and {p.number} ({p.label()}) would share the "
                              f"{what} {v!r}{hint}", where="command line", key=key)
        seen[v] = p


# ----------------------------------------------------------------------------- the request
def request(sweep: Sweep, max_parallel: Optional[int] = None):
    """The sweep's Request (checked: check() resolved each point's plan): one job array whose
    task i runs point i's own request, in the sweep directory's <i>/."""
    from . import request as rq
    from .render import render_array

    first = sweep.points[0].plan
    sweep_dir = rq.runs_dir(first.recipe) / sweep.name
    sp = SweepPaths(sweep_dir)
    points = []
    for p in sweep.points:
        point = {"index": p.index, "point": p.number, "overrides": p.overrides, "experiment": p.experiment}
        points.append(rq.for_run(p.plan, run_dir=sp.point(p.index).run_dir, sweep=str(sweep_dir),
                                 index=p.index, overrides=p.overrides, work_dir=str(sweep_dir),
                                 label=p.label(), point=point))
    meta = {"kind": "sweep", "name": sweep.name, "sweep_dir": str(sweep_dir), "recipe": first.runtime.source,
            "job_name": first.recipe.job.name, "max_parallel": max_parallel, "experiment": sweep.name,
            "base_experiment": sweep.base_experiment,
            "nodes": first.ray.nodes, "created": time.time()}
    return rq.Request(script=render_array(first, sweep.name, len(points), max_parallel), paths=sp,
                      command=["sbatch", "--parsable", SweepPaths.SCRIPT], meta=meta, points=points)
