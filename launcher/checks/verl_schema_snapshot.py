"""Write the snapshot of verl's config that the launcher checks overrides against without verl.

Run it with an interpreter that has the verl release to snapshot (a maintainer's step, once per
verl release; the launcher itself never imports verl):

    python -m launcher.checks.verl_schema_snapshot     # -> launcher/checks/verl_schemas/verl-<version>.json

It composes verl's own `ppo_trainer` config and records every key with its default and type
(from the dataclass behind its section where there is one, else from the default), which
sections are free-form (any key goes with `+`: a dataclass field typed as a dict, such as
`fsdp_config.mixed_precision` or `distillation.teacher_models`; without a dataclass, by name:
`override_config`, `engine_kwargs`, `ray_kwargs.ray_init`, ...; the keys verl's YAML already has
in them are recorded too, so that they are set without `+` as Hydra allows), and the values verl
knows for a few keys (advantage estimators, policy-loss modes, rollout engines, loss aggregation
modes, trackers), read from verl's registries and checks.

Then every other composition a verl command line can ask for: every config name verl ships for
its PPO trainer (`--config-name ppo_megatron_trainer`), with every option of each config group
the defaults list chooses from (`model_engine=megatron`, `veomni`, ...). Each is stored as its
difference from `ppo_trainer` ("variants"), so a check reads the very config verl would compose.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import typing
from pathlib import Path

OUT_DIR = Path(__file__).with_name("verl_schemas")
# Sections whose keys verl hands on unread (to vLLM, Ray, transformers, a profiler...).
# (A section backed by a dataclass is closed whatever its name: val_kwargs is SamplingConfig.)
OPEN_NAMES = re.compile(r"((?<!^ray)_kwargs|kw_args|^override_config|^runtime_env|^ray_init|_nsight_options)$")


BASE = "ppo_trainer"
# Groups in verl's defaults list a command line chooses by name (model_engine=megatron); the
# actor/ref/critic groups follow it (`${model_engine}_actor`).
CHOSEN_GROUPS = ("model_engine",)


def config_dir() -> str:
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def config_names() -> list:
    """verl's top-level configs that compose a PPO trainer's config (actor_rollout_ref, trainer)."""
    from hydra import compose as hydra_compose

    names = []
    for path in sorted(Path(config_dir()).glob("*.yaml")):
        try:
            cfg = hydra_compose(config_name=path.stem)
        except Exception:  # noqa: BLE001 - a fragment (legacy_reward_impl) is not a config of its own
            continue
        if "actor_rollout_ref" in cfg and "trainer" in cfg:
            names.append(path.stem)
    return names


def group_options(name: str) -> dict:
    """{group: {"default": option, "options": [...]}} for the chosen groups NAME's defaults list has."""
    from hydra import compose as hydra_compose

    out = {}
    cfg = hydra_compose(config_name=name, return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    for group in CHOSEN_GROUPS:
        if group in choices:
            options = sorted(p.stem for p in Path(config_dir(), group).glob("*.yaml"))
            out[group] = {"default": choices[group], "options": options}
    return out


def _type_of(hint) -> tuple:
    """(type name, nullable) for a dataclass annotation; ("any", True) if it is not one of ours."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or str(origin) == "types.UnionType":
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _type_of(rest[0])[0], True
        return "any", True
    names = {bool: "bool", int: "int", float: "float", str: "str"}
    return names.get(hint, "any"), False


def _value_type(value) -> str:
    for t, name in ((bool, "bool"), (int, "int"), (float, "float")):
        if isinstance(value, t):
            return name
    return "any"  # strings, lists, null: verl accepts more than the default shows (a list of files...)


def _class_of(target):
    """The class a section's `_target_` names, or None if it cannot load."""
    if not target:
        return None
    module, _, name = target.rpartition(".")
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except Exception:  # noqa: BLE001  (a section whose class cannot load: types from defaults)
        return None


def _hints(cls) -> dict:
    try:
        return typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
    except Exception:  # noqa: BLE001
        return {}


def _dataclass_in(hint):
    """The dataclass a field holds (Optional[...] unwrapped), or None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    for t in [hint, *args]:
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def _field_default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        try:
            return field.default_factory()  # type: ignore[misc]
        except Exception:  # noqa: BLE001
            return None
    return None


def walk(cfg) -> tuple:
    """Every key of verl's composed config, and every field of the dataclasses behind its
    sections that the YAML does not list ("yaml": false): verl reads those too (e.g.
    rollout.enable_sleep_mode), and an override sets them with `+`."""
    from omegaconf import DictConfig, OmegaConf

    keys, sections = {}, {}

    def put(key, default, hint, yaml):
        kind, nullable = _type_of(hint) if hint is not None else (_value_type(default), True)
        # "annotation": the type is the dataclass field's; "default": guessed from the
        # default (an int default may take a float: the launcher checks it loosely).
        keys[key] = {"type": kind, "nullable": nullable or default is None,
                     "from": "annotation" if hint is not None else "default",
                     "default": default if isinstance(default, (bool, int, float, str, type(None))) else None}
        if not yaml:
            keys[key]["yaml"] = False

    def fields_only(cls, prefix):
        """A section's dataclass fields that its YAML lacks. Only single values: a whole
        sub-config missing from the YAML (model_config, engine, ...) is one verl fills itself."""
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            if not f.init or f.name.startswith("_") or key in keys or key in sections:
                continue
            if _is_dict(hints.get(f.name)):  # a free dict verl reads, added with '+'
                sections[key] = {"open": True, "dataclass": None, "yaml": False}
            elif _dataclass_in(hints.get(f.name)) is None:
                put(key, _field_default(f), hints.get(f.name), yaml=False)

    def visit(node, prefix, cls, inside_open=False):
        hints = _hints(cls)
        for k in node.keys():
            key = f"{prefix}{k}"
            child = node._get_node(k)
            if isinstance(child, DictConfig):
                target = child.get("_target_")
                open_ = ((inside_open and not target) or len(child) == 0 or _is_dict(hints.get(k))
                         or (not target and bool(OPEN_NAMES.search(k))))
                sections[key] = {"open": open_, "dataclass": target}
                # An open section's own keys are keys too: Hydra sets them without '+'. A section
                # without a _target_ takes its types from the parent's dataclass field, if it has one.
                visit(child, key + ".", _class_of(target) or _dataclass_in(hints.get(k)),
                      inside_open=open_ and not target)
                continue
            if k == "_target_":
                continue
            default = OmegaConf.to_container(child) if OmegaConf.is_config(child) else child._value()
            put(key, default, hints.get(k), yaml=True)
            if _added_ok(cfg, key):
                keys[key]["add"] = True
        if dataclasses.is_dataclass(cls):
            fields_only(cls, prefix)

    visit(cfg, "", None)
    return keys, sections


def _is_dict(hint) -> bool:
    """A dataclass field verl takes as a free dict (Optional[dict[str, Any]], dict[str, X])."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return any(t is dict or typing.get_origin(t) is dict for t in [hint, *args] if t is not None)


def _added_ok(cfg, key) -> bool:
    """Hydra takes `+KEY=v` for a key that exists when its value is null (as resolved)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False) is None
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve alone: Hydra's call
        return True


def enums() -> dict:
    """The values verl knows for a few keys, from its own registries and checks."""
    found = {}

    def put(keys, values):
        values = sorted({str(v) for v in values})
        if values:
            for k in keys:
                found[k] = values

    try:
        from verl.trainer.ppo import core_algos

        put(["algorithm.adv_estimator"], [*core_algos.ADV_ESTIMATOR_REGISTRY, *(e.value for e in core_algos.AdvantageEstimator)])
        put(["actor_rollout_ref.actor.policy_loss.loss_mode"], core_algos.POLICY_LOSS_REGISTRY)
    except Exception as e:  # noqa: BLE001
        print(f"skipped advantage estimators / policy losses: {e}", file=sys.stderr)
    try:
        from verl.workers.rollout import base

        put(["actor_rollout_ref.rollout.name"], {name for name, _ in base._ROLLOUT_REGISTRY})
        put(["actor_rollout_ref.rollout.mode"], {mode for _, mode in base._ROLLOUT_REGISTRY})
    except Exception as e:  # noqa: BLE001
        print(f"skipped rollout engines: {e}", file=sys.stderr)
    try:
        import inspect

        from verl.workers.config import actor

        m = re.search(r"valid_loss_agg_modes\s*=\s*\[([^\]]*)\]", inspect.getsource(actor))
        put(["actor_rollout_ref.actor.loss_agg_mode", "critic.loss_agg_mode"], re.findall(r"\"([^\"]+)\"", m.group(1)))
    except Exception as e:  # noqa: BLE001
        print(f"skipped loss aggregation modes: {e}", file=sys.stderr)
    try:
        from verl.utils.tracking import Tracking

        put(["trainer.logger[]"], Tracking.supported_backend)
    except Exception as e:  # noqa: BLE001
        print(f"skipped trackers: {e}", file=sys.stderr)
    put(["algorithm.kl_ctrl.type"], ["fixed", "adaptive"])  # core_algos.get_kl_controller's two branches
    put(["trainer.resume_mode"], ["auto", "disable", "resume_path"])  # the trainer's _load_checkpoint
    return found


def code_names() -> list:
    """Every key name verl's own code reads by its text (`.get("x")`, `["x"]`, getattr(c, "x")):
    a `+key` whose new part is one of them may be read by verl, though its config does not list
    it (`reward_model.reward_kwargs`, read by the DAPO reward). Attribute and argument names are
    left out: nearly every word is one (`num_cpus`), and a `+key` not read is only a warning."""
    import ast

    import verl

    names = set()
    for path in Path(os.path.dirname(verl.__file__)).rglob("*.py"):
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
    return sorted(names)


def _diff(base: dict, other: dict) -> dict:
    """What OTHER has that BASE has not (or has otherwise), and what it lacks."""
    return {"add": {k: v for k, v in other.items() if base.get(k) != v},
            "drop": sorted(k for k in base if k not in other)}


def variants(base_keys: dict, base_sections: dict) -> tuple:
    """({config name: {groups}}, {variant id: difference from ppo_trainer's})."""
    from hydra import compose as hydra_compose

    from launcher.checks.verl_schema import variant_id

    configs, found = {}, {}
    for name in config_names():
        groups = group_options(name)
        configs[name] = {"groups": groups}
        combos = [{}] + [{g: o} for g, spec in groups.items() for o in spec["options"] if o != spec["default"]]
        for choice in combos:
            vid = variant_id(name, choice)
            if vid == BASE:
                continue
            keys, sections = walk(hydra_compose(config_name=name, overrides=[f"{g}={o}" for g, o in choice.items()]))
            found[vid] = {"keys": _diff(base_keys, keys), "sections": _diff(base_sections, sections)}
    return configs, found


def main(argv=None) -> int:
    import verl
    from hydra import compose as hydra_compose, initialize_config_dir

    ap = argparse.ArgumentParser(description="Snapshot verl's config for the launcher's checks (needs verl).")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help=f"directory (default {OUT_DIR})")
    args = ap.parse_args(argv)
    version = verl.__version__
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        keys, sections = walk(hydra_compose(config_name=BASE))
        configs, found = variants(keys, sections)
    snap = {"verl_version": version, "generated_by": "python -m launcher.verl_schema_snapshot",
            "keys": keys, "sections": sections, "enums": enums(), "configs": configs, "variants": found,
            "names": code_names()}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"verl-{version}.json"
    path.write_text(json.dumps(snap, indent=0, sort_keys=True) + "\n")
    print(f"{path}: {len(keys)} keys, {len(sections)} sections "
          f"({sum(s['open'] for s in sections.values())} free-form), enums for {', '.join(sorted(snap['enums']))}; "
          f"config names {', '.join(configs)}; {len(found)} other compositions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
