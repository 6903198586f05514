"""verl's command line: the recipe's passthrough overrides plus the ones the launcher derives.

Every value is written in Hydra's override grammar here (the one place), so that a string
reaches verl's config as the same string; the shell quoting happens later, in render.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from ..errors import RecipeError

if TYPE_CHECKING:
    from .schema import Recipe

TRACE = "actor_rollout_ref.rollout.trace"
LOGGER = "trainer.logger"
# Derived keys the recipe's own value goes into, rather than contradicting them.
MERGED = frozenset({LOGGER})
# Ray's setup hook in every Ray worker of verl's job (templates/trace_flush.py, which the job puts
# on the Ray processes' PYTHONPATH as this module): each agent-loop worker sends a step's traces
# before it hands the step's rollouts back, so none is lost when Ray kills the workers at verl's
# end. Hydra's `+`: verl's runtime_env has no such key.
SETUP_HOOK = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"
TRACE_FLUSH_MODULE = "verl_launch_trace_flush"
ADDED = frozenset({SETUP_HOOK})


def loggers(r: Recipe) -> List[str]:
    """verl's trainer.logger: the recipe's own loggers (tensorboard, file, mlflow...) kept in their
    order, `console` always (the job reads its training steps from it), and `wandb` exactly when
    wandb.enabled."""
    given = next((v for k, v in flatten(r.verl.overrides).items() if _plain(k) == LOGGER), None)
    items = [given] if isinstance(given, str) else list(given or [])
    items = ["console"] + [str(x) for x in items if x not in ("console", "wandb")]
    return items + ["wandb"] if r.wandb.enabled else items


def flushes(r: Recipe) -> bool:
    """Whether the agent-loop workers flush their Weave clients after each step's rollouts."""
    return r.trace.backend == "weave" and r.trace.flush_timeout > 0


def derived(r: Recipe) -> Dict[str, Tuple]:
    """Derived verl keys -> (value, the recipe field a user should change instead[, why])."""
    d: Dict[str, Tuple[Any, str]] = {
        "actor_rollout_ref.rollout.mode": ("async", "(always async)"),
        f"{TRACE}.backend": (None if r.trace.backend == "none" else r.trace.backend, "trace.backend"),
    }
    if flushes(r):
        d[SETUP_HOOK] = (f"{TRACE_FLUSH_MODULE}.setup", "trace.flush_timeout",
                         "the agent-loop workers send each step's traces through Ray's setup hook; "
                         "trace.flush_timeout=0 leaves the hook to you (and the last second's traces may be lost)")
    if r.trace.backend != "none":
        d[f"{TRACE}.token2text"] = (r.trace.token2text, "trace.token2text")
        d[f"{TRACE}.max_samples_per_step_per_worker"] = (
            r.trace.max_samples_per_step_per_worker, "trace.max_samples_per_step_per_worker")
    if r.wandb.project:
        d["trainer.project_name"] = (r.wandb.project, "wandb.project")
    d["trainer.experiment_name"] = (r.experiment, "wandb.experiment")
    d[LOGGER] = (loggers(r), "wandb.enabled")
    if r.cluster.requeue:  # a restarted job continues from its latest checkpoint
        d["trainer.resume_mode"] = ("auto", "cluster.requeue")
    from .verl_versions import rules_for

    for rule in rules_for(r):
        d[rule.key] = (rule.value, rule.field, rule.why)
    d["trainer.nnodes"] = (r.cluster.nodes, "cluster.nodes")
    d["trainer.n_gpus_per_node"] = (r.cluster.gpus_per_node, "cluster.gpus_per_node")
    return d


def flatten(overrides: Dict[str, Any], blame=lambda key: "recipe") -> Dict[str, Any]:
    """{'trainer': {'total_epochs': 2}, 'data.x': 1} -> {'trainer.total_epochs': 2, 'data.x': 1}."""
    flat: Dict[str, Any] = {}

    def walk(d: Dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            # A mapping of keys that name config keys is a section; one whose keys could not (a
            # module pattern `model.layers.{*}`) is a dict value verl gets whole.
            if isinstance(v, dict) and v and all(_SECTION_KEY.fullmatch(str(x)) for x in v):
                walk(v, key + ".")
            elif _plain(key) in {_plain(x) for x in flat}:
                raise RecipeError("set twice (nested and dotted)", where=blame(f"verl.overrides.{key}"),
                                  key=f"verl.overrides.{key}")
            else:
                flat[key] = v

    walk(overrides, "")
    return flat


def apply_cli(flat: Dict[str, Any], overrides: List[str], resolve=None) -> Dict[str, Any]:
    """Apply command-line ``key=value`` / ``~key`` (Hydra grammar) to flat verl overrides;
    ``resolve`` resolves a value's interpolations against the recipe, as in the file."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    out = dict(flat)
    for ov in overrides:
        try:
            parsed = OverridesParser.create().parse_override(ov)
        except HydraException as e:
            raise RecipeError(f"override 'verl.overrides.{ov}': {str(e).splitlines()[0]}",
                              where="command line", key=f"verl.overrides.{_plain(ov.split('=')[0])}") from None
        if parsed.is_sweep_override():
            raise RecipeError(f"override 'verl.overrides.{ov}' is a sweep (a,b / range()); verl takes "
                              "one value: quote it to pass the text, or add -m to sweep it", where="command line",
                              key=f"verl.overrides.{parsed.key_or_group}")
        key = parsed.key_or_group + (f"@{parsed.package}" if parsed.package else "")
        value = resolve(parsed.value()) if resolve else parsed.value()
        for existing in [k for k in out if _plain(k) == key]:
            del out[existing]
        if not parsed.is_delete():
            prefix = "+" if ov.startswith("+") and not ov.startswith("++") else ("++" if ov.startswith("++") else "")
            out[prefix + key] = value
    return out


def _plain(key: str) -> str:
    return key.lstrip("+")


CONFIG_OPTIONS = ("--config-path=", "--config-name=")  # Hydra's own options, before the overrides


def config_options(r: Recipe) -> List[str]:
    """Hydra's options for the entrypoint: which config it composes (verl.config_name/_path)."""
    return [f"{opt}{value}" for opt, value in zip(CONFIG_OPTIONS, (r.verl.config_path, r.verl.config_name))
            if value is not None]


def verl_args(r: Recipe, blame=lambda key: "recipe") -> List[str]:
    """verl's full, ordered command line: Hydra's config options, the recipe's own overrides,
    then the derived ones."""
    user = flatten(r.verl.overrides, blame)
    der = derived(r)
    args = config_options(r)
    for key, value in user.items():
        plain = _plain(key)
        try:
            text = hydra_value(value)
        except ValueError as e:
            raise RecipeError(str(e), where=blame(f"verl.overrides.{plain}"), key=f"verl.overrides.{plain}") from None
        if plain in MERGED:
            continue  # the derived value holds the recipe's own (loggers())
        if plain in der:
            want, field, *why = der[plain]
            if text != hydra_value(want):
                fixed = field.startswith("(")  # no recipe field chooses it: "(always async)"
                raise RecipeError(
                    f"contradicts the launcher's derived value {hydra_value(want)} {field}" if fixed else
                    f"contradicts the launcher's derived value {hydra_value(want)}, set from {field}: "
                    + (why[0] if why else f"set {field} instead"),
                    where=blame(f"verl.overrides.{plain}"), key=f"verl.overrides.{plain}")
            continue  # same value: the derived one is emitted below
        args.append(f"{key}={text}")
    args.extend(f"{'+' if key in ADDED else ''}{key}={hydra_value(value)}" for key, (value, *_) in der.items())
    return args


# ----------------------------------------------------------------------------- Hydra grammar
_BARE = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_KEYWORDS = {"null", "true", "false", "inf", "nan", "infinity"}
_SECTION_KEY = re.compile(r"\+{0,2}[A-Za-z_][\w-]*(\.[A-Za-z_0-9][\w-]*)*")
# Hydra's grammar for a dict key: letters, digits and /-+.$%*@?|_ as they are; ()[]{}:=, space,
# tab and backslash escaped with a backslash; nothing else (no quotes).
_DICT_KEY = re.compile(r"[\w/\-+.$%*@?|()\[\]{}:=, \t\\]+")
_DICT_KEY_ESCAPE = re.compile(r"([()\[\]{}:=, \t\\])")


def hydra_value(v: Any) -> str:
    """Write a Python value in Hydra's override grammar so that it parses back to itself."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        bad = [k for k in v if not _DICT_KEY.fullmatch(str(k))]
        if bad:  # Hydra's grammar has no quoted dict keys
            raise ValueError(f"dict key {bad[0]!r} cannot be written in Hydra's override grammar")
        return "{" + ",".join(_dict_key(k) + ":" + hydra_value(x) for k, x in v.items()) + "}"
    s = str(v)
    if _BARE.fullmatch(s) and s.lower() not in _KEYWORDS:
        return s  # reads back as the same string unquoted: keep the command line legible
    return _quote(_no_interpolation(s))


def _dict_key(k: Any) -> str:
    return _DICT_KEY_ESCAPE.sub(r"\\\1", str(k))


_INTERP = re.compile(r"(\\*)\$\{")


def _no_interpolation(s: str) -> str:
    r"""Escape ``${`` for OmegaConf, so that verl's config holds the very string, not an
    interpolation: k backslashes before ``${`` become 2k, then ``\${``."""
    return _INTERP.sub(lambda m: "\\" * (2 * len(m.group(1))) + "\\${", s)


def _quote(s: str) -> str:
    """Single-quote for Hydra: escape quotes, and double backslashes that precede a quote
    or the closing quote (Hydra's rule); other backslashes are literal."""
    out = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == "\\":
            j += 1
        run = j - i
        if run:
            at_quote_or_end = j == len(s) or s[j] == "'"
            out.append("\\" * (run * 2 if at_quote_or_end else run))
            i = j
            continue
        out.append("\\'" if s[i] == "'" else s[i])
        i += 1
    return "'" + "".join(out) + "'"
