"""Loading a recipe: compose it with Hydra, check it against the schema, then validate it
(checks.py) with errors naming file and field.

A recipe is a YAML file composed by Hydra's compose API: its ``defaults`` list may pull
shipped groups (``cluster/<profile>``, found next to the recipe first, then in the
package's ``recipes/``), and command-line overrides use Hydra's grammar.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .checks import check, validate
from .errors import RecipeError
from .overrides import apply_cli, flatten, hydra_value, verl_args
from .resources import shipped_recipes_dir
from .schema import Recipe

__all__ = ["Loaded", "Recipe", "load"]

# ----------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    recipe: Recipe
    config: DictConfig  # the composed, validated config
    blame: Any = None  # dotted key -> where it was set (the recipe file or the command line)
    verl_keys: str = ""  # how verl's keys were checked (against which snapshot of its config)


_VERL_PREFIX = "verl.overrides."


def load(path: str | os.PathLike, overrides: List[str] = ()) -> Loaded:
    """Compose ``path`` with ``overrides``, validate it, and return the typed recipe.

    ``${recipe_dir:}`` in a value is the recipe file's folder. ``verl.overrides.<key>=v`` sets verl key ``<key>`` whether the recipe writes it nested or
    dotted, and ``env.<NAME>=v`` may add a variable: neither needs Hydra's ``+``.
    """
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise RecipeError("recipe file not found", where=where)
    if path.suffix != ".yaml":
        raise RecipeError("a recipe must be a .yaml file (Hydra composes only .yaml)", where=where)
    overrides = list(overrides)
    # ${recipe_dir:} is the recipe's own folder, absolute: files shipped beside a recipe (a
    # tool config) are found from any working directory (on shared storage, from any node).
    OmegaConf.register_new_resolver("recipe_dir", lambda: str(path.parent.resolve()), replace=True)
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
    cfg = _compose(path, hydra_ovs, blame)
    plain = OmegaConf.to_container(cfg, resolve=False)
    _refuse_retyped(plain, blame)
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
    validate(recipe, blame)
    verl_args(recipe, blame)  # a contradicting override is an error of the recipe
    keys = check(recipe, blame)
    return Loaded(recipe=recipe, config=merged, blame=blame, verl_keys=keys)


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
    dirs = [path.parent, shipped_recipes_dir()]
    return {d.name for base in dirs if base.is_dir() for d in base.iterdir() if d.is_dir()}


def _parse_each(overrides: List[str]) -> None:
    """Refuse a malformed override by itself, before composing anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for ov in overrides:
        try:
            parser.parse_override(ov)
        except HydraException as e:
            msg = " ".join(str(e).split("See https://hydra.cc")[0].split())
            raise RecipeError(f"override {ov!r} is not Hydra syntax: {msg}", where="command line",
                              key=_key(ov)) from None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _compose(path: Path, overrides: List[str], blame) -> DictConfig:
    """Hydra composes the recipe (with its own defaults list) and the overrides; the schema
    checks the result afterwards (composing it in costs Hydra ~0.1 s of copies)."""
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
            with initialize_config_dir(config_dir=str(path.parent.resolve()), version_base="1.3",
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
        where = "command line" if _mentions_override(msg, overrides) else str(path)
        raise RecipeError(msg, where=where) from None
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as e:  # e.g. YAML syntax errors
        raise RecipeError(str(e).replace("\n", " ").strip(), where=str(path)) from None


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
        return f"unknown key ({msg})"
    return msg

