"""Preflight: verl's own checks of the override list, run in the recipe's interpreter, and
what the launcher reports beside them (the verl version rules, the trace volume).

verl is not imported here: it runs in a subprocess (verl_preflight.py) with
``runtime.python``, so the verl checked is the one the job will run, and verl-launch itself
stays light.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from . import preflight_cache
from .values import is_verl
from ..errors import RecipeError
from ..base.overrides import verl_args
from ..base.schema import Recipe
from ..base.verl_versions import NEWEST_CHECKED, same_series

SCRIPT = Path(__file__).with_name("verl_preflight.py")
RESULT = "@@preflight "
TIMEOUT = 300  # seconds: composing and validating takes ~5 s, more on a busy login node
PER_POINT = 10  # seconds more per sweep point


@dataclass
class Preflight:
    status: str  # ok | skipped | unavailable
    message: str
    verl_version: Optional[str] = None
    config: Dict[str, Any] = field(default_factory=dict)  # a few values as verl resolved them
    notes: List[str] = field(default_factory=list)  # what verl will do that the recipe may not expect


def run(r: Recipe, environ: Mapping[str, str]) -> Preflight:
    """Run verl's checks; raise RecipeError (exit 2) with verl's message if verl rejects the
    overrides or is a different series than ``verl.version``."""
    result = run_many([r], environ)[0]
    if isinstance(result, RecipeError):
        raise result
    return result


def run_many(recipes: List[Recipe], environ: Mapping[str, str]) -> List[Preflight]:
    """``run`` for each recipe (a sweep's points): one verl process per interpreter and
    environment, however many points, so verl's import (~6 s) is paid once. A point verl
    rejects gets its RecipeError in its place (the caller names the point)."""
    asks: Dict[tuple, List[int]] = {}
    found: Dict[int, Any] = {}
    for i, r in enumerate(recipes):
        ask = _ask(r, environ)
        if isinstance(ask, Preflight):
            found[i] = ask
            continue
        cached = preflight_cache.get(environ, ask.entry)
        if cached is not None:
            found[i] = (ask, cached, True)
        else:
            asks.setdefault((ask.python, tuple(sorted(ask.env.items()))), []).append(i)
            found[i] = ask
    for (python, env), idx in asks.items():
        results = _verl(python, dict(env), [found[i].overrides for i in idx])
        for i, res in zip(idx, results):
            if isinstance(res, Preflight):
                found[i] = res
            else:
                preflight_cache.put(environ, found[i].entry, res)
                found[i] = (found[i], res, False)
    out: List[Any] = []
    for i, v in sorted(found.items()):
        try:
            out.append(v if isinstance(v, Preflight) else _verdict(recipes[i], *v))
        except RecipeError as e:
            out.append(e)
    return out


@dataclass
class _Ask:
    python: str
    env: Dict[str, str]
    overrides: List[str]
    entry: Optional[str]


def _ask(r: Recipe, environ: Mapping[str, str]):
    """What verl would be asked for ``r`` (a Preflight when it cannot or need not be asked)."""
    if not is_verl(r):
        return Preflight("skipped", f"entrypoint {r.verl.entrypoint} is not verl's own (verl.*): verl's own "
                                    "checks run only for those")
    python = shutil.which(r.runtime.python, path=environ.get("PATH"))
    if python is None:
        return Preflight("unavailable", f"{r.runtime.python} (runtime.python) is not on this machine's PATH: "
                                        "only the launcher's own checks ran")
    # Never the secrets: verl's config needs none of them.
    env = {k: v for k, v in environ.items() if not k.startswith("WANDB_") and k not in r.secrets}
    env.update(r.env)  # as on the nodes: an override may read one with ${oc.env:...}
    overrides = verl_args(r)
    return _Ask(python, env, overrides, preflight_cache.key(python, env, overrides, SCRIPT.read_text(), r.env))


def _verl(python: str, env: Dict[str, str], points: List[List[str]]) -> list:
    """One verl process for every point: its result dict per point, or a Preflight saying why
    verl could not be asked."""
    def unavailable(message: str) -> list:
        return [Preflight("unavailable", message)] * len(points)

    with tempfile.TemporaryDirectory(prefix="verl-launch-preflight-") as cwd:
        try:
            proc = subprocess.run([python, "-c", SCRIPT.read_text()], input=json.dumps({"points": points}),
                                  capture_output=True, text=True, cwd=cwd, env=env,
                                  timeout=TIMEOUT + PER_POINT * len(points))
        except subprocess.TimeoutExpired:
            return unavailable(f"verl's checks did not finish within {TIMEOUT + PER_POINT * len(points)} s: "
                               "only the launcher's own checks ran")
        except OSError as e:
            return unavailable(f"cannot run {python} ({e.strerror}): only the launcher's own checks ran")
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            res = json.loads(line[len(RESULT):])
            results[res.pop("index", 0)] = res
    if len(results) < len(points):
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]) or \
            f"exit code {proc.returncode}, no output: is it a Python interpreter?"
        return unavailable(f"{python} could not run verl's checks ({tail}): only the launcher's own checks ran")
    return [results[i] for i in range(len(points))]


def _verdict(r: Recipe, ask: _Ask, res: dict, cached: bool) -> Preflight:
    python, version = ask.python, res.get("verl_version")
    if res.get("stage") == "import":
        return Preflight("unavailable", f"verl is not importable with {python} ({res['error']}): "
                                        "only the launcher's own checks ran")
    try:
        other = bool(version) and not same_series(r.verl.version or NEWEST_CHECKED, version)
    except ValueError:  # a version string we cannot read: say so, do not guess
        other = False
    if other and r.verl.version:
        raise RecipeError(f"the recipe targets verl {r.verl.version}, but {python} has verl {version}: "
                          "the derived overrides differ between them; set verl.version", where=r.source,
                          key="verl.version")
    if not res["ok"]:
        hint = (f"; the derived overrides followed verl {NEWEST_CHECKED}'s rules: set verl.version={version}"
                if other else "")
        raise RecipeError(f"verl {version} rejects the overrides ({res['stage']}): {res['error']}{hint}",
                          where=f"{r.source} (checked by verl with {python})", key="verl.overrides")
    note = "" if r.verl.version else f" (verl.version unset: the rules for verl {NEWEST_CHECKED} apply)"
    if other:  # verl.version unset, and this verl is not the series whose rules apply
        note += f"; this is not verl {NEWEST_CHECKED}'s series: set verl.version={version}"
    if cached:
        note += " (cached: this verl passed these overrides before)"
    return Preflight("ok", f"verl {version} with {python}: composed, validated, dataclasses built{note}",
                     verl_version=version, config=res.get("config") or {}, notes=list(res.get("notes") or []))

