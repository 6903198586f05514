"""Property tests for the two quoting layers: Hydra's override grammar (launcher.base.overrides)
and the shell (launcher.core.render.q), and for a full render with hostile strings."""

from __future__ import annotations

import math
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from conftest import RECIPES
from launcher.base.overrides import _BARE, hydra_value
from launcher.core.recipe import load
from launcher.core.render import q, render

PARSER = OverridesParser.create()


def parse_back(v):
    return PARSER.parse_override("k=" + hydra_value(v)).value()


# Characters that matter to Hydra's grammar, YAML, the shell or Jinja, mixed with any text.
TRICKY = list("'\"\\,=[]{}()$:#%`;|&<>*?~! \t\n.-_/+@^") + ["${", "}", "{{", "}}", "{%", "%}", "$(", "\\'",
                                                         "\\\\", "null", "true", "inf", "nan", "é", "日本",
                                                         "\u2028", "\x7f", "\x01"]
tricky_text = st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=4)), max_size=12).map("".join)
any_text = st.one_of(st.text(), tricky_text, st.from_regex(_BARE, fullmatch=True))


# ----------------------------------------------------------------------------- Hydra grammar
@settings(max_examples=250, deadline=None)
@given(any_text)
@example("${foo}")
@example("${oc.env:HOME}")
@example("a${b}c")
@example("\\${x}")
@example("'")
@example("\\")
@example("a\\'b\\")
@example("")
@example(" padded ")
@example("NaN")
@example("-inf")
@example("1e5")
@example("x=y,z")
@example("[1")
@example("A\n")  # a trailing newline once passed as a bare word (re `$` matches before it)
def test_hydra_value_text_round_trips(v):
    # What verl's config holds is what counts: the parsed override goes into an OmegaConf
    # config, where an unescaped `${...}` would become an interpolation. hydra_value escapes it,
    # so the value verl reads is the very string.
    parsed = parse_back(v)
    assert isinstance(parsed, str)
    if v != "???":  # OmegaConf's missing-value marker: no escape exists for it
        assert as_verl_sees_it(parsed) == v
    if "${" not in v:
        assert parsed == v


def as_verl_sees_it(parsed):
    cfg = OmegaConf.create({"k": parsed, "foo": "RESOLVED", "b": "RESOLVED", "x": "RESOLVED"})
    return OmegaConf.to_container(cfg, resolve=True)["k"]


def _has_missing_marker(v) -> bool:
    if isinstance(v, (list, tuple)):
        return any(_has_missing_marker(x) for x in v)
    if isinstance(v, dict):
        return any(_has_missing_marker(x) for x in v.values())
    return v == "???"


def test_interpolation_reaches_verl_as_a_literal():
    assert parse_back("${foo}") == "\\${foo}"
    assert as_verl_sees_it(parse_back("${foo}")) == "${foo}"
    assert as_verl_sees_it(parse_back("a\\${foo}")) == "a\\${foo}"


scalars = st.one_of(st.none(), st.booleans(), st.integers(),
                    st.floats(allow_nan=False, allow_infinity=False), any_text)


@settings(max_examples=200, deadline=None)  # a busy machine is not a failure of the round trip
@given(scalars)
def test_hydra_value_scalars_round_trip(v):
    back = parse_back(v)
    assert type(back) is type(v)
    if not _has_missing_marker(v):
        assert as_verl_sees_it(back) == v


@pytest.mark.parametrize("v", [math.inf, -math.inf])
def test_hydra_value_infinities(v):
    assert parse_back(v) == v


def test_hydra_value_nan():
    assert math.isnan(parse_back(math.nan))


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.lists(scalars, max_size=5), lambda inner: st.lists(st.one_of(scalars, inner), max_size=4),
                    max_leaves=15))
def test_hydra_value_lists_round_trip(v):
    if not _has_missing_marker(v):
        assert as_verl_sees_it(parse_back(v)) == v


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
                       .filter(lambda k: k.lower() not in {"null", "true", "false", "inf", "nan"}),
                       scalars, max_size=4))
def test_hydra_value_dicts_with_plain_keys_round_trip(v):
    # Only plain keys: Hydra's grammar has no quoted dict keys, so {'a b': 1} cannot be written
    # at all (hydra_value emits {'a b':1}, which Hydra rejects). verl.overrides flattens nested
    # dicts into dotted keys, so only a dict inside a list could reach hydra_value.
    if not _has_missing_marker(v):
        assert as_verl_sees_it(parse_back(v)) == v


# ----------------------------------------------------------------------------- shell
@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),  # no argv holds
                 # a lone surrogate: it has no encoding (hypothesis drew '\ud800' once)
                 tricky_text.filter(lambda s: "\x00" not in s)))
@example("'")
@example("'\"'\"'")
@example("$(touch /tmp/pwned)`id`")
@example("-n")
@example("%s%d\\n")
@example("\n")
@example("")
def test_shell_q_round_trips(s):
    out = subprocess.run(["bash", "-c", f"printf '%s' {q(s)}"], capture_output=True, timeout=10,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout == s.encode()


# ----------------------------------------------------------------------------- full render
class _Quoted(str):
    """A string the YAML dumper always double-quotes (so OmegaConf's loader, which reads
    1e5 as a float, cannot retype it)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Quoted, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", str(s), style='"'))

# In a recipe, `${` starts an OmegaConf interpolation that load() resolves (write `\${` for a
# literal one), and a whole value of "???" is OmegaConf's MISSING: neither is a plain string
# there, so the recipe-level strategies leave them out (both are tested for hydra_value above).
recipe_text = tricky_text.filter(lambda s: "${" not in s and "\x00" not in s and s != "???")
# wandb.experiment: 1-128 printable characters (validate() rejects control characters).
experiment_text = recipe_text.map(lambda s: "".join(c for c in s if c.isprintable() or c == " ")[:128]) \
    .filter(lambda s: s and s != "???")

BASE = yaml.safe_load((RECIPES / "sandbox-demo.yaml").read_text())
ENV_NAMES = ["FUZZ_A", "FUZZ_B", "FUZZ_C"]
VERL_KEYS = ["data.custom_a", "+data.custom_b", "actor_rollout_ref.custom_c"]


def _bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, timeout=20, stdin=subprocess.DEVNULL)


# No shrink phase: each example composes with Hydra (~0.2 s), and shrinking a failure here
# took minutes; a failing example is printed as found.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(env_values=st.lists(recipe_text, min_size=3, max_size=3),
       verl_values=st.lists(recipe_text, min_size=3, max_size=3),
       experiment=experiment_text)
@example(env_values=["{{ 7*7 }}", "{% if true %}x{% endif %}", "$(id) `id` '\"\n;rm -rf ~"],
         verl_values=["a'b\\", "x=y,[z]", "{{ env }}"], experiment="it's {{ x }} $(id)")
def test_full_render_with_hostile_strings(env_values, verl_values, experiment):
    data = dict(BASE)
    data["env"] = {**BASE["env"], **{n: _Quoted(v) for n, v in zip(ENV_NAMES, env_values)}}
    data["verl"] = dict(BASE["verl"], overrides={**BASE["verl"]["overrides"],
                                                 **{k: _Quoted(v) for k, v in zip(VERL_KEYS, verl_values)}})
    data["wandb"] = dict(BASE["wandb"], experiment=_Quoted(experiment))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.yaml"
        path.write_text(yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
        loaded = load(path)
        r = loaded.recipe
    # the recipe carried every string through unchanged
    for n, v in zip(ENV_NAMES, env_values):
        assert r.env[n] == v
    assert r.experiment == experiment

    script = render(loaded.plan)
    syntax = subprocess.run(["bash", "-n"], input=script.encode(), capture_output=True, timeout=20)
    assert syntax.returncode == 0, syntax.stderr.decode()
    for n, v in zip(ENV_NAMES, env_values):
        assert f"\nexport {n}={q(v)}\n" in script
    assert f"\nexport WANDB_NAME={q(experiment)}\n" in script
    assert "\n  " + q(f"trainer.experiment_name={hydra_value(experiment)}") + "\n" in script

    # Run the variable block for real: bash must see exactly our strings, and each verl
    # argument must parse back, with Hydra, to the recipe's value.
    start = script.index("\nPY=")
    end = script.index("\nexport RAY_USAGE_STATS_ENABLED")
    # NUL-separated (no value can hold a NUL): the verl arguments, then the FUZZ_* values.
    probe = script[start:end] + "\nprintf '%s\\0' \"${VERL_ARGS[@]}\"" + \
        "".join(f' "${n}"' for n in ENV_NAMES) + "\n"
    out = _bash(probe)
    assert out.returncode == 0, out.stderr.decode()
    items = out.stdout.split(b"\0")[:-1]
    assert items[-len(ENV_NAMES):] == [v.encode() for v in env_values]
    args = {}
    for a in (i.decode() for i in items[:-len(ENV_NAMES)]):
        o = PARSER.parse_override(a)
        args[o.input_line.split("=", 1)[0]] = o.value()
    for k, v in zip(VERL_KEYS, verl_values):
        assert args[k] == v
    assert args["trainer.experiment_name"] == experiment
