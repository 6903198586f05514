"""verl's keys, checked without verl: the recipe's verl overrides against a snapshot of verl's
config (launcher/checks/verl_schemas/verl-<version>.json, written from verl itself by
verl_schema_snapshot.py), so that a typo costs a second on a login node, not an allocation.

What is refused, each naming the key and where it was set:
- a key verl's config does not have ("did you mean ...?"), with or without `+`: a `+key` that
  verl never reads passes Hydra and verl's own checks, and silently does nothing;
- `+key` for a key verl has (Hydra refuses it: "An item is already at ..."), and a key verl
  reads from a section's dataclass but its YAML lacks (`rollout.enable_sleep_mode`) without `+`;
- a new key under a free-form section (override_config, engine_kwargs, ...) without `+`
  (Hydra refuses that too); with `+` it is fine: verl hands those on unread;
- a value of the wrong type (text for a number, a fraction for a count: 2.5 epochs, true/false
  for a switch; see FRACTIONAL_OK for the int-defaulted keys verl takes as any number, and
  NULL_DEFAULT_COUNTS for the null-defaulted keys verl takes as counts), or a value
  verl does not know for a key with a fixed set (advantage estimators, rollout engines...).
`verl.extra_keys` lists keys (or sections) this check leaves alone: a verl fork's own.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..errors import RecipeError
from ..base.verl_versions import NEWEST_CHECKED, parse

SNAPSHOTS = Path(__file__).with_name("verl_schemas")
OWN = "; if your own verl build has it, list the key in verl.extra_keys"


BASE = "ppo_trainer"  # the config verl's main_ppo composes unless told otherwise


def variant_id(config_name: str, choices: Dict[str, str]) -> str:
    """The name of one composition of verl's config: its config name and the group options
    chosen on the command line (`ppo_trainer model_engine=megatron`)."""
    return " ".join([config_name, *(f"{g}={o}" for g, o in sorted(choices.items()))])


@dataclass(frozen=True, eq=False)  # hashed by identity: one per snapshot, compositions cached
class Schema:
    version: str  # the verl release the snapshot was taken from
    keys: Dict[str, dict]  # dotted key -> {type, nullable, from, default[, yaml, add]}
    sections: Dict[str, dict]  # dotted section -> {open, dataclass}
    enums: Dict[str, list]  # dotted key (key[] for a list's items) -> known values
    configs: Dict[str, dict] = field(default_factory=dict)  # config name -> {groups: {group: {default, options}}}
    variants: Dict[str, dict] = field(default_factory=dict)  # variant_id -> its difference from ppo_trainer's
    names: frozenset = frozenset()  # every attribute or key name verl's own code reads
    name: str = BASE  # which composition this is (variant_id)

    def free_form(self, key: str) -> bool:
        """KEY lies inside a section whose keys verl hands on unread."""
        parts = key.split(".")
        return any(self.sections.get(".".join(parts[:i]), {}).get("open") for i in range(1, len(parts)))

    def composed(self, config_name: str, choices: Dict[str, str]) -> "Schema":
        """The config verl composes for CONFIG_NAME with the group options CHOICES (both known
        to the snapshot: see `compositions`)."""
        groups = self.configs[config_name]["groups"]
        own = {g: o for g, o in choices.items() if o != groups[g]["default"]}
        return _variant(self, variant_id(config_name, own))


@functools.lru_cache(maxsize=None)
def _variant(schema: Schema, vid: str) -> Schema:
    if vid == BASE:
        return schema
    diff = schema.variants[vid]

    def apply(base: dict, d: dict) -> dict:
        out = {k: v for k, v in base.items() if k not in set(d["drop"])}
        out.update(d["add"])
        return out

    return replace(schema, keys=apply(schema.keys, diff["keys"]), sections=apply(schema.sections, diff["sections"]),
                   name=vid)


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> Schema:
    snap = json.loads(path.read_text())
    return Schema(snap["verl_version"], snap["keys"], snap["sections"], snap["enums"],
                  snap.get("configs", {BASE: {"groups": {}}}), snap.get("variants", {}),
                  frozenset(snap.get("names", ())))


class NotChecked(Exception):
    """The snapshot cannot know the config verl will compose: verl's preflight decides."""


class UnknownOption(Exception):
    def __init__(self, key: str, why: str):
        super().__init__(why)
        self.key, self.why = key, why


def compositions(schema: Schema, config_name: Optional[str], config_path: Optional[str],
                 flat: Dict[str, Any]) -> Tuple[Schema, Dict[str, str]]:
    """The composition of verl's config the job's command line asks for: the config name and the
    groups its overrides choose (`model_engine: megatron`). Returns it and {override key that
    chose a group (not a key of the config): the section it fills, whose keys the snapshot
    cannot know ("" for the snapshot's own groups)}. A group option verl does not ship raises
    UnknownOption; a composition the snapshot cannot know at all, NotChecked."""
    name = (config_name or BASE).removesuffix(".yaml")
    if config_path:
        raise NotChecked(f"verl.config_path {config_path} is a config folder of its own")
    if name not in schema.configs:
        raise NotChecked(f"config name {name!r} is not one verl {schema.version} ships "
                         f"({', '.join(schema.configs)})")
    groups = schema.configs[name]["groups"]
    choices, chose = {}, {}
    for key, value in flat.items():
        plain = key.lstrip("+")
        if "@" in plain or "/" in plain:  # actor@actor_rollout_ref.actor=megatron_actor
            chose[key] = plain.partition("@")[2] or plain.replace("/", ".")
            continue
        if plain in groups:
            if str(value) not in groups[plain]["options"]:
                raise UnknownOption(plain, f"{value!r} is not an option verl {schema.version} ships for the config "
                                           f"group {plain} ({', '.join(groups[plain]['options'])}): verl's Hydra "
                                           "would refuse it")
            choices[plain] = str(value)
            chose[key] = ""
    return schema.composed(name, choices), chose


def snapshot_for(version: Optional[str]) -> Tuple[Optional[Schema], str]:
    """The snapshot for verl VERSION (None: the newest the launcher knows): that release's, else
    the newest of its major.minor series; (None, why) when the launcher has none."""
    want = parse(version or NEWEST_CHECKED)
    have = {}
    for p in SNAPSHOTS.glob("verl-*.json"):
        try:
            have[parse(p.stem[len("verl-"):])] = p
        except ValueError:
            continue
    if want in have:
        return _read(have[want]), ""
    series = sorted(v for v in have if v[:2] == want[:2])
    if series:
        s = _read(have[series[-1]])
        return s, f" (the nearest snapshot: verl {version} has none)"
    known = ", ".join(".".join(map(str, v)) for v in sorted(have)) or "none"
    return None, (f"no snapshot of verl {version}'s config (the launcher has: {known}); verl's keys are "
                  "checked only by verl itself (preflight). To add one: python -m launcher.verl_schema_snapshot")


def _interpolated(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


# Keys whose type the snapshot guessed from an int default ("from": "default") but that verl
# takes as any number (read off verl 0.9.1's source): seconds handed to timedelta / ray.get /
# should_save_ckpt_esi (float), `num_warmup_batches: int | float` (trainer_base.py), LoRA's
# alpha (a scale) and FSDP's wrap_policy.min_num_params (compared with a parameter count;
# 1e8 is a float on Hydra's command line). Matched by the key's last part. Every other
# int-typed key is a count, a size, a step or an index: verl slices, ranges or divides by it
# (range(total_epochs), `% save_freq`, batch sizes, DataLoader workers), so 2.5 fails late.
FRACTIONAL_OK = frozenset({"nccl_timeout", "esi_redundant_time", "ray_wait_register_center_timeout",
                           "num_warmup_batches", "alpha", "min_num_params"})


def whole_number_key(key: str, spec: dict) -> bool:
    """KEY (SPEC) holds a whole number in verl: int-typed, and not one verl takes as a fraction."""
    return spec["type"] == "int" and (spec.get("from") == "annotation"
                                      or key.rpartition(".")[2] not in FRACTIONAL_OK)


# Keys verl defaults to null but takes as counts (a whole number; null: verl decides). A null
# default gives the snapshot no type ("any"), so the int check misses them; an Optional[int]
# dataclass field is typed int by the snapshot already. Found by reading, in verl 0.9.1's
# source, where each of the snapshot's untyped null-defaulted keys is used; matched by the
# whole dotted key (lists such as global_profiler.steps are not counts, and are left out).
NULL_DEFAULT_COUNTS = frozenset({
    # trainer: total_training_steps stands in for len(dataloader) * total_epochs, is compared with
    # global_steps and becomes optim.total_training_steps, an int (ray_trainer.py); a fraction for
    # max_*_ckpt_to_keep fails checkpoint_manager.py's isinstance(.., int): every checkpoint is kept
    "trainer.total_training_steps", "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep",
    # data: DataLoader batch sizes (and `num_prompts % gen_batch_size`, range(.. // gen_batch_size)
    # in v1/trainer_base.py); the shuffle seed goes to torch.Generator.manual_seed (ppo/utils.py)
    "data.gen_batch_size", "data.val_batch_size", "data.seed",
    # ref: renamed to ActorConfig's Optional[int] ppo_micro_batch_size(_per_gpu) (engine_workers.py)
    "actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    # (rollout.disaggregation's Optional[int] fields are typed by the snapshot itself: a section
    # without a _target_ takes its types from the dataclass field behind it, DisaggregationConfig)
    # legacy_reward_impl.yaml's reward_model / sandbox_fusion: copied as they are into reward.*'s
    # int fields (reward.num_workers, reward.reward_model.nnodes, ...) by migrate_legacy_reward_impl
    "reward_model.num_workers", "reward_model.n_gpus_per_node", "reward_model.nnodes",
    *(f"reward_model.rollout.{k}" for k in (
        "data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size", "max_num_batched_tokens",
        "max_model_len", "max_num_seqs", "limit_images", "prompt_length", "response_length")),
    "sandbox_fusion.max_concurrent", "sandbox_fusion.memory_limit_mb",
})


def _type_error(spec: dict, value: Any, key: str = "") -> Optional[str]:
    """Why VALUE cannot be KEY's (SPEC's) value, or None. Lenient where verl is: null is
    always let through (verl's own checks decide; -1 sentinels are whole numbers), and a few
    int-defaulted keys verl takes as any number (FRACTIONAL_OK) take a float. A null-defaulted
    count (NULL_DEFAULT_COUNTS) is held to a whole number as an int-typed key is."""
    if value is None or _interpolated(value):
        return None
    count = key in NULL_DEFAULT_COUNTS
    kind = "int" if count else spec["type"]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool" and not isinstance(value, bool):
        return f"must be true or false, got {value!r}"
    if kind in ("int", "float") and not number:
        return f"must be a number, got {value!r}"
    if kind == "int" and isinstance(value, float) and (count or whole_number_key(key, spec)):
        return f"must be a whole number, got {value!r}"
    if kind == "str" and isinstance(value, (dict, list)):
        return f"must be a single value, got {value!r}"
    return None


def _enum_error(schema: Schema, key: str, value: Any) -> Optional[str]:
    for k, items in ((key, [value]), (key + "[]", value if isinstance(value, list) else [])):
        known = schema.enums.get(k)
        for item in items if known else ():
            if isinstance(item, str) and not _interpolated(item) and item not in known:
                return f"{item!r} is not one verl {schema.version} knows ({', '.join(known)}){OWN}"
    return None


def _suggest(schema: Schema, key: str) -> str:
    near = difflib.get_close_matches(key, schema.keys, n=3, cutoff=0.75)
    if not near:  # the last part alone, among its section's keys ("total_epoch" in trainer)
        parent, _, last = key.rpartition(".")
        siblings = {k.rpartition(".")[2]: k for k in schema.keys if k.rpartition(".")[0] == parent}
        near = [siblings[s] for s in difflib.get_close_matches(last, siblings, n=3, cutoff=0.6)]
    return f": did you mean {' or '.join(near)}?" if near else ""


def problem(schema: Schema, key: str, value: Any) -> Optional[str]:
    """Why override KEY (as written: a `+` or `++` prefix included) = VALUE is wrong, or None."""
    plain = key.lstrip("+")
    add = key.startswith("+")
    if "[" in plain:  # an item of a list (`trainer.logger[0]`): verl's own checks see it
        return None
    if plain in schema.keys:
        spec = schema.keys[plain]
        if spec.get("yaml", True) is False:  # a dataclass field verl reads that its YAML lacks
            if not add:
                return (f"is read by verl {schema.version} but not in its YAML config: add it with '+' "
                        f"(+{plain}; Hydra refuses a key the YAML lacks without it)")
        elif add and not key.startswith("++") and not spec.get("add") and not isinstance(value, (dict, list)):
            return (f"is already a key of verl {schema.version}'s config: drop the '+' "
                    "(Hydra refuses '+' for a key that exists)")
        return _type_error(spec, value, plain) or _enum_error(schema, plain, value)
    if plain in schema.sections:
        section = schema.sections[plain]
        if section.get("yaml", True) is False and not add:
            return (f"is read by verl {schema.version} but not in its YAML config: add it with '+' "
                    f"(+{plain}; Hydra refuses a key the YAML lacks without it)")
        if isinstance(value, dict) or value is None or section["open"]:
            return None
        return f"is a section of verl {schema.version}'s config, not a single value"
    if schema.free_form(plain):
        return None if add else ("is inside a free-form section of verl's config (handed on unread): "
                                 "add it with '+' (Hydra refuses a new key without it)")
    if not add:
        return f"is not a key of verl {schema.version}'s config (verl's Hydra would refuse it){_suggest(schema, plain) or OWN}"
    parent = plain.rpartition(".")[0]
    cls = schema.sections.get(parent, {}).get("dataclass")
    if cls and not schema.sections[parent]["open"]:  # verl builds the section as its dataclass
        return (f"is not a field of {cls.rpartition('.')[2]}, which verl {schema.version} builds {parent} as: verl "
                f"would fail building it (an unexpected keyword){_suggest(schema, plain)}")
    new = _first_new(schema, plain)
    if new in schema.names:  # verl's code reads a key of that name (`.get("reward_kwargs")`)
        return None
    near = _suggest(schema, plain)
    if near and _misspelt(schema, plain):  # a key verl has, mistyped: the run would quietly not have it
        return f"is not a key of verl {schema.version}'s config (a '+' adds it, but verl never reads it){near}"
    return Note(f"is not a key of verl {schema.version}'s config, and verl's code reads no key named {new!r}: a '+' "
                f"adds it, and nothing reads it, unless your verl build does (then list it in verl.extra_keys){near}")


def _misspelt(schema: Schema, plain: str) -> bool:
    """PLAIN's last part is within two edits of a key's in the same section (total_epoch,
    temprature): a typo, not a key of another verl release (rollout_token_veto_threshold)."""
    parent, _, last = plain.rpartition(".")
    return any(k.rpartition(".")[0] == parent and _edits(last, k.rpartition(".")[2]) <= 2
               for k in (*schema.keys, *schema.sections))


def _edits(a: str, b: str) -> int:
    """Levenshtein distance (small strings: key names)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


class Note(str):
    """A problem that is said, not refused: verl runs the override, and it likely does nothing."""


def _first_new(schema: Schema, plain: str) -> str:
    """The first part of dotted PLAIN that verl's config does not have."""
    parts = plain.split(".")
    for i in range(1, len(parts)):
        if ".".join(parts[:i]) not in schema.sections:
            return parts[i - 1]
    return parts[-1]


def top_sections(schema: Schema) -> set:
    """The top-level names of verl's config (actor_rollout_ref, data, trainer, algorithm, ...)."""
    return {k.split(".")[0] for k in (*schema.keys, *schema.sections)}


def check(flat: Dict[str, Any], version: Optional[str], extra_keys=(), blame=lambda key: "recipe",
          warn=None, config_name: Optional[str] = None, config_path: Optional[str] = None, note=None) -> str:
    """Refuse (RecipeError) the first bad verl override in FLAT (key as written -> value);
    return one line on what they were checked against: the composition verl makes of
    CONFIG_NAME (None: ppo_trainer) and the groups FLAT chooses. One the snapshot cannot know
    (CONFIG_PATH, a config name verl does not ship) is not checked, and the line says why.
    NOTE (a callable taking the RecipeError): where a problem that verl runs through goes (a
    `+key` that nothing in verl names; its .note is true): said, never refused.

    WARN (a callable taking the RecipeError): a trainer of its own built on verl's config (a
    verl recipe module such as recipe.dapo.main_dapo composes verl's ppo_trainer config and adds
    keys of its own): each problem is handed to WARN instead of refused, and only keys under
    verl's own top-level sections are looked at (the rest are the trainer's own)."""
    schema, nearest = snapshot_for(version)
    if schema is None:
        return nearest
    try:
        schema, chose = compositions(schema, config_name, config_path, flat)
    except NotChecked as e:
        return f"not checked: {e}; verl's own checks (preflight) decide"
    except UnknownOption as e:
        raise RecipeError(e.why, where=blame(f"verl.overrides.{e.key}"), key=f"verl.overrides.{e.key}") from None
    flat = {k: v for k, v in flat.items() if k not in chose}
    unknown = sorted({s for s in chose.values() if s})  # sections a group@package fills
    extra = tuple(k.lstrip("+") for k in extra_keys) + tuple(unknown)
    tops = top_sections(schema) if warn is not None else None
    warned = 0
    for key, value in flat.items():
        plain = key.lstrip("+")
        if any(plain == e or plain.startswith(e + ".") for e in extra):
            continue
        if tops is not None and plain.split(".")[0] not in tops:
            continue
        why = problem(schema, key, value)
        if why:
            error = RecipeError(why, where=blame(f"verl.overrides.{plain}"), key=f"verl.overrides.{plain}")
            error.note = isinstance(why, Note)
            if warn is None and not error.note:
                raise error
            if warn is not None or note is not None:
                (warn or note)(error)
            warned += 1
    if warn is not None:
        return (f"checked as warnings only, against a snapshot of verl {schema.version}'s config{nearest}: "
                f"{warned} warning(s){' (on stderr)' if warned else ''}; keys outside verl's sections are the "
                "trainer's own, not checked")
    what = "" if schema.name == BASE else f" as composed for {schema.name}"
    left = "".join(f"; not checked: the keys under {s}, a config group the overrides choose by its package "
                   "(verl's preflight decides)" for s in unknown)
    return f"checked against a snapshot of verl {schema.version}'s config{what}{nearest}{left}"
