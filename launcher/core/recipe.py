"""Loading a recipe: compose it with Hydra, check it against the schema, then validate it
(checks/fields.py, checks/values.py) with errors naming file and field, and resolve its plan (plan.py) once.

A recipe is a YAML file composed by Hydra's compose API: its ``defaults`` list may pull
shipped groups (``cluster/<profile>``, found next to the recipe first, then in the
package's ``recipes/``), and command-line overrides use Hydra's grammar.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..checks.fields import recipe_warnings, validate
from ..checks.values import check, verl_keys_warning
from ..errors import Problems, RecipeError
from ..base.overrides import apply_cli, flatten, hydra_value, verl_args
from .plan import Plan, resolve as resolve_plan
from ..resources import shipped_recipes_dir
from ..base.schema import Recipe

__all__ = ["Loaded", "Recipe", "load"]

# ----------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    recipe: Recipe
    config: DictConfig  # the composed, validated config
    blame: Any = None  # dotted key -> where it was set (the recipe file or the command line)
    verl_keys: str = ""  # how verl's keys were checked (against which snapshot of its config)
    # What is worth saying but not refusing (a verl-key problem for an entrypoint that is not
    # verl's own): each line is also written to stderr, once per process.
    warnings: List[str] = dataclasses.field(default_factory=list)
    verl_args: List[str] = dataclasses.field(default_factory=list)  # verl's command line, made once
    _plan: Optional[Plan] = None

    def resolve(self, verl: Optional[dict] = None) -> Plan:
        """The plan (plan.py), with VERL, what verl's preflight resolved (api.dryrun does this
        once, after the preflight)."""
        return resolve_plan(self.recipe, self.blame, self.verl_args, verl)

    @property
    def plan(self) -> Plan:
        """The plan from the recipe's values alone (no verl preflight): what `render` prints."""
        if self._plan is None:
            self._plan = self.resolve()
        return self._plan


_VERL_PREFIX = "verl.overrides."


def load(path: str | os.PathLike, overrides: List[str] = ()) -> Loaded:
    """Compose ``path`` with ``overrides``, validate it, and return the typed recipe.

    ``${recipe_dir:}`` in a value is the recipe file's folder. ``verl.overrides.<key>=v`` sets verl key ``<key>`` whether the recipe writes it nested or
    dotted, and ``env.<NAME>=v`` may add a variable: neither needs Hydra's ``+``. A refusal
    carries what was not checked because of it, and the warnings its values would still get.
    """
    try:
        return _load(path, overrides)
    except RecipeError as e:
        if getattr(e, "at_once", False):  # a secret's value: nothing more is said
            raise
        raise e.with_warnings([], UNCHECKED) from None


def _load(path: str | os.PathLike, overrides: List[str]) -> Loaded:
    where = str(path)
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found{_near_recipes(path)}", where=where)
    path = path.resolve()  # a link: its profiles (cluster/...) and files are beside the file itself
    if path.suffix != ".yaml":
        raise RecipeError("a recipe must be a .yaml file (Hydra composes only .yaml)", where=where)
    try:
        path.open("rb").close()
    except OSError as e:
        raise RecipeError(f"cannot read it ({e.strerror})", where=where) from None
    overrides = [_tilde(ov) for ov in overrides]
    # ${recipe_dir:} is the recipe's own folder, absolute: files shipped beside a recipe (a
    # tool config) are found from any working directory (on shared storage, from any node).
    OmegaConf.register_new_resolver("recipe_dir", lambda: str(path.parent), replace=True)
    groups = _groups(path)
    hydra_ovs, verl_ovs = [], []
    for ov in overrides:
        key = _key(ov)
        if key.startswith("hydra"):
            raise RecipeError(f"override '{ov}': hydra.* keys are the launcher's", where="command line")
        if key.startswith(_VERL_PREFIX):
            verl_ovs.append(ov)
        elif ov.startswith(("+", "~")) or key in groups:
            hydra_ovs.append(ov)
        else:
            # Any schema key may be set even if the recipe file omits it; a misspelt one is
            # refused by the schema right after, naming it.
            hydra_ovs.append("++" + ov)
    _parse_each(overrides)
    blame = _blamer(where, overrides, groups)
    cfg = _compose(path, hydra_ovs, blame, where)
    plain = OmegaConf.to_container(cfg, resolve=False)
    _shape(plain, Recipe, blame)
    _refuse_retyped(plain, blame)
    runs = (plain.get("paths") or {}).get("runs")
    if isinstance(runs, str) and runs.startswith("~"):  # before ${paths.runs} is resolved anywhere
        plain["paths"]["runs"] = os.path.expanduser(runs)
    try:  # Hydra lets `+key=v` through: check the plain values against the schema again
        merged = OmegaConf.merge(OmegaConf.structured(Recipe), plain)
        # Interpolations resolve here, verl.overrides included; a `${` left after that
        # (written \${ in the recipe) reaches verl as literal text (overrides.hydra_value).
        recipe: Recipe = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = e.full_key or None
        raise RecipeError(_omegaconf_message(e), where=blame(key), key=key) from None
    recipe.source = str(path.resolve())

    def resolve(value):  # ${...} in a command-line value resolves as it would in the file
        if not (isinstance(value, str) and "${" in value):
            return value
        try:
            return OmegaConf.merge(plain, {"_vl_value": value})._vl_value
        except OmegaConfBaseException as e:
            raise RecipeError(_omegaconf_message(e), where="command line") from None

    recipe.verl.overrides = apply_cli(flatten(recipe.verl.overrides, blame),
                                      [ov.replace(_VERL_PREFIX, "", 1) for ov in verl_ovs], resolve)
    problems = Problems(blame)  # every problem of the values, said at once
    with problems.gather():
        validate(recipe, blame)
    args: List[str] = []
    with problems.gather():
        args = verl_args(recipe, blame)  # a contradicting override is an error of the recipe
    found: List[RecipeError] = []
    keys = ""
    with problems.gather():
        keys = check(recipe, blame, warn=found.append)
    said = [verl_keys_warning(e, recipe.verl.entrypoint) for e in found]
    refused = problems.error()
    if refused is not None:  # its warnings after it: every problem in one try
        raise refused.with_warnings(said + recipe_warnings(recipe))
    _say(said)
    return Loaded(recipe=recipe, config=merged, blame=blame, verl_keys=keys, warnings=said, verl_args=args)


_SAID: set = set()
UNCHECKED = ("verl's own checks, what the experiment starts from, and Slurm's verdict (sbatch --test-only): "
             "they need the above fixed")


def _say(lines: List[str]) -> None:
    """Warnings on stderr, each once per process (--local and sweeps load a recipe more than once)."""
    for line in lines:
        if line not in _SAID:
            _SAID.add(line)
            print(line, file=sys.stderr)


def _shape(plain: dict, cls: type, blame, prefix: str = "") -> None:
    """Every value where the schema has a section, a mapping or a list must be one (`cluster:
    sunk` in the body, `runtime.setup=x`); an empty one (`env:` alone) is taken as empty."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in plain:
            continue
        key, value, kind = f"{prefix}{f.name}", plain[f.name], hints[f.name]
        origin = typing.get_origin(kind)
        if dataclasses.is_dataclass(kind):
            if value is None:
                del plain[f.name]  # `cluster:` with nothing under it: the defaults
            elif isinstance(value, dict):
                _shape(value, kind, blame, key + ".")
            else:
                names = ", ".join(g.name for g in dataclasses.fields(kind)[:4])
                why = f"is a section ({names}, ...), not a value: write its keys under it"
                if f.name == "cluster" and not prefix:
                    why += (f"; a cluster profile is chosen in the recipe's defaults list (- cluster: {value}) "
                            f"or on the command line (cluster={value})")
                raise RecipeError(f"{why}; got {value!r}", where=blame(key), key=key)
        elif origin in (dict, list):
            if value is None:
                plain[f.name] = {} if origin is dict else []
            elif not isinstance(value, origin):
                what = "a mapping (NAME: value, one per line)" if origin is dict else "a list ([a, b], or - a per line)"
                raise RecipeError(f"must be {what}, got {value!r}", where=blame(key), key=key)


def _refuse_retyped(plain: dict, blame) -> None:
    """YAML reads some unquoted values as other types, and the str fields would then hold a
    different text (`time: 4:00:00` is base-60 14400, `FLAG: false` becomes "False")."""
    t = (plain.get("cluster") or {}).get("time")
    if isinstance(t, int) and not isinstance(t, bool) and blame("cluster.time") == "command line":
        plain["cluster"]["time"] = str(t)  # Hydra's grammar has no base-60: `time=30` is minutes
    elif t is not None and not isinstance(t, str):
        raise RecipeError(f"write it as a quoted string, e.g. \"04:00:00\" (YAML read {t!r})",
                          where=blame("cluster.time"), key="cluster.time")
    for name, value in (plain.get("env") or {}).items():
        if value is not None and not isinstance(value, (str, int)) or isinstance(value, bool):
            raise RecipeError(f"write it as a quoted string (YAML read {value!r}, a {type(value).__name__})",
                              where=blame(f"env.{name}"), key=f"env.{name}")


def _groups(path: Path) -> set:
    """Config groups (folders) a `group=choice` override may name."""
    found = set()
    for base in (path.parent, shipped_recipes_dir()):
        try:
            found |= {d.name for d in base.iterdir() if d.is_dir()}
        except OSError:  # a folder that cannot be listed offers no groups (Hydra then says what is missing)
            continue
    return found


def _parse_each(overrides: List[str]) -> None:
    """Refuse a malformed override by itself, before composing anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for ov in overrides:
        try:
            parsed = parser.parse_override(ov)
        except HydraException as e:
            msg = " ".join(str(e).split("See https://hydra.cc")[0].split())
            raise RecipeError(f"override {ov!r} is not Hydra syntax: {msg}", where="command line",
                              key=_key(ov)) from None
        if parsed.is_sweep_override() and not _key(ov).startswith(_VERL_PREFIX):
            raise RecipeError(f"override {ov!r} is a sweep (a,b / range() / choice()): one run takes one "
                              "value; to sweep, add -m (one job array). For a list write [a,b]; for text, "
                              "quote it", where="command line",
                              key=_key(ov))


def _tilde(override: str) -> str:
    """`paths.runs=~/r`: Hydra's grammar has no bare `~` in a value; quote it, as the user meant."""
    key, eq, value = override.partition("=")
    return f"{key}={hydra_value(value)}" if eq and value.startswith("~") else override


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _compose(path: Path, overrides: List[str], blame, shown: str) -> DictConfig:
    """Hydra composes the recipe (with its own defaults list) and the overrides; the schema
    checks the result afterwards (composing it in costs Hydra ~0.1 s of copies). PATH is the
    recipe file itself (a link resolved); SHOWN, the name the user gave it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    search = f"hydra.searchpath=[{hydra_value('file://' + str(shipped_recipes_dir()))}]"
    # Hydra's own app settings (logging, help, launcher, output dirs) are not used by
    # compose; leaving them out saves ~40 ms of YAML loading per command.
    lean = ["hydra/job_logging=none", "hydra/hydra_logging=none", "~hydra/help", "~hydra/hydra_help",
            "~hydra/launcher", "~hydra/sweeper", "~hydra/output"]
    try:
        with warnings.catch_warnings():
            # A recipe without `_self_` gets it last (its own values win): what users expect.
            warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`")
            with initialize_config_dir(config_dir=str(path.parent), version_base="1.3",
                                       job_name="verl-launch"):
                return compose(config_name=path.stem, overrides=[search, *lean, *overrides])
    except HydraException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, OmegaConfBaseException):
            cause = cause.__cause__
        if isinstance(cause, OmegaConfBaseException) and cause.full_key:
            key = cause.full_key
            raise RecipeError(_omegaconf_message(cause), where=blame(key), key=key) from None
        msg = str(e).split("\nSee https://hydra.cc")[0].split("\nConfig search path")[0]
        msg = " ".join(msg.split())
        if "must be a DictConfig" in msg:
            msg = f"a recipe is a YAML mapping of sections (job:, cluster:, wandb:, ...), not a list or a value ({msg})"
        raise RecipeError(msg, where=_source(msg, overrides, shown)) from None
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as e:  # e.g. YAML syntax errors
        msg = str(e).replace("\n", " ").strip()
        raise RecipeError(msg, where=_source(msg, overrides, shown)) from None
    except OSError as e:  # an unreadable recipe or profile
        raise RecipeError(f"cannot read {e.filename or 'a file it uses'} ({e.strerror})", where=shown) from None


def _source(msg: str, overrides: List[str], recipe_file: str) -> str:
    """Where a composition error comes from: an override it names (or a group override's
    value, `cluster=4`: only an override says "Config group override"), else the recipe."""
    by_override = "Config group override" in msg or _mentions_override(msg, overrides)
    return "command line" if by_override else recipe_file


def _mentions_override(msg: str, overrides: List[str]) -> bool:
    return any(re.search(rf"(?<![\w./-]){re.escape(tok)}(?![\w./-])", msg)
               for ov in overrides for tok in {ov, _key(ov)})


def _blamer(recipe_file: str, overrides: List[str], groups: set = frozenset()):
    """Map a dotted key to where it was set: the command line if an override set it (choosing
    a group, `cluster=sunk`, does not count as setting the keys under it)."""
    touched = [_key(ov) for ov in overrides if _key(ov) not in groups]

    def blame(key: Optional[str]) -> str:
        if key:
            for t in touched:
                if key == t or key.startswith((t + ".", t + "[")) or t.startswith(key + "."):
                    return "command line"
        return recipe_file

    return blame


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    msg = str(e).split("\n")[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        return f"unknown key ({msg}){did_you_mean(e.full_key)}"
    m = re.match(r"Value '(.*)' of type '(\w+)' could not be converted to Integer", msg)
    if m:  # cluster.nodes=2.5: a count the schema holds as an int
        return f"must be a whole number, got {m.group(1) if m.group(2) in ('float', 'int') else repr(m.group(1))}"
    return msg


def did_you_mean(key: Optional[str], cls: type = Recipe) -> str:
    """': did you mean cluster.nodes?' for a misspelt launcher key (cluster.node), else ''."""
    if not key:
        return ""
    *parents, last = key.split(".")
    for p in parents:  # down the schema to the section the key is in
        kind = typing.get_type_hints(cls).get(p) if dataclasses.is_dataclass(cls) else None
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            return ""
        cls = kind
    names = [f.name for f in dataclasses.fields(cls)]
    near = difflib.get_close_matches(last, names, n=3, cutoff=0.6)
    prefix = ".".join(parents) + "." if parents else ""
    return f": did you mean {' or '.join(prefix + n for n in near)}?" if near else ""


def _near_recipes(path: Path) -> str:
    """': did you mean recipes/gsm8k-grpo.yaml?' for a recipe file name that does not exist:
    the nearest .yaml names beside it, else among the shipped recipes."""
    for folder in (path.parent, shipped_recipes_dir()):
        try:
            names = sorted(p.name for p in folder.iterdir() if p.suffix == ".yaml" and p.is_file())
        except OSError:
            continue
        near = [path.name] if path.name in names else difflib.get_close_matches(path.name, names, n=2, cutoff=0.75)
        if near:
            shown = [path.with_name(n) if folder == path.parent else _shown(folder / n) for n in near]
            return f": did you mean {' or '.join(map(str, shown))}?"
    return ""


def _shown(p: Path) -> str:
    """P relative to the working directory where it is under it (recipes/x.yaml), else absolute."""
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)
