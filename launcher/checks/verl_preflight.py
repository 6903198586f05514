"""verl's own checks of a full override list, run by `verl-launch check` / `submit` in a
subprocess with the recipe's interpreter (``runtime.python``): the verl that the job will run.

Standalone on purpose (it imports nothing from verl-launch, which that interpreter may not
have). Run as ``python -c <this file's text>`` from an empty directory, so that nothing beside it
shadows a module verl imports. Reads {"points": [[override, ...], ...]} as JSON on stdin (a sweep's
points share one verl import); prints one line "@@preflight <json>" per point, in order:
  {"index": i, "ok": true, "verl_version": ..., "config": {a few resolved values}, "notes": [line, ...]}
  {"index": i, "ok": false, "verl_version": ..., "stage": "import|compose|imports|validate|dataclass", "error": ...}
Exits 0 in both cases (the launcher decides), 3 if verl is not importable.
"""

import json
import os
import sys

RESULT = "@@preflight "
# Resolved values the launcher reports on (trace volume, resources).
REPORT_KEYS = ("actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.agent.num_workers",
               "actor_rollout_ref.rollout.trace.backend",
               "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker",
               "data.train_batch_size", "trainer.nnodes", "trainer.n_gpus_per_node",
               "trainer.default_local_dir", "trainer.logger", "trainer.use_v1",
               "reward.num_workers", "reward_model.num_workers",
               "transfer_queue.backend.SimpleStorage.num_data_storage_units",
               "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep",
               "data.max_prompt_length", "data.max_response_length",  # the trace volume
               "actor_rollout_ref.rollout.multi_turn.enable", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns")


def emit(**result):
    print(RESULT + json.dumps(result, default=str), flush=True)


def message(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    cause = e.__cause__ or e.__context__
    while cause is not None and str(cause) and str(cause) not in text:  # Hydra wraps the real error
        text += f" (caused by {type(cause).__name__}: {cause})"
        cause = cause.__cause__
    return " ".join(text.split())


def main() -> int:
    points = json.load(sys.stdin)["points"]
    try:
        import verl
    except Exception as e:  # not installed, or broken: the launcher says so plainly
        for i in range(len(points)):
            emit(index=i, ok=False, stage="import", error=message(e), verl_version=None)
        return 3
    version = getattr(verl, "__version__", "unknown")
    from hydra import compose, initialize_config_dir

    verl_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    asks = {}  # (config folder, config name) -> [(index, overrides)]
    for i, point in enumerate(points):
        config_dir, name, overrides = options(point, verl_dir)
        asks.setdefault((config_dir, name), []).append((i, overrides))
    for (config_dir, name), some in asks.items():
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            def full(overrides):
                return compose(config_name=name, overrides=overrides)

            fast = shared_base(full, [o for _, o in some], config_dir)
            for i, overrides in some:
                result = check(fast, overrides) if fast else None
                if result is None or not result["ok"]:  # verl's exact words come from the full composition
                    result = check(full, overrides)
                emit(index=i, verl_version=version, **result)
    return 0


def options(point, verl_dir):
    """(config folder, config name, overrides) of one command line: Hydra's --config-path and
    --config-name (verl.config_path/_name) come first, as the launcher writes them."""
    config_dir, name = verl_dir, "ppo_trainer"
    overrides = list(point)
    while overrides and overrides[0].startswith(("--config-path=", "--config-name=")):
        option, _, value = overrides.pop(0).partition("=")
        if option == "--config-path":
            config_dir = value
        else:
            name = value[:-len(".yaml")] if value.endswith(".yaml") else value
    return config_dir, name, overrides


def shared_base(full, points, config_dir):
    """Many points (a sweep's): Hydra composes verl's config (~0.7 s) once with the overrides
    all points share, and each point's own value overrides are then applied to a copy by the
    same Hydra function a composition ends with. Used only if it gives point 0 the very config
    the full composition gives; None otherwise (each point is then composed in full)."""
    if len(points) < 2:
        return None
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    common = [o for o in points[0] if all(o in p for p in points[1:])]
    shared = set(common)
    parser = OverridesParser.create()

    def fast(overrides):
        own = parser.parse_overrides([o for o in overrides if o not in shared])
        for o in own:  # a config group, a package or a deletion changes the defaults list: compose in full
            key = o.key_or_group
            if o.is_delete() or o.package is not None or "/" in key or \
                    os.path.isdir(os.path.join(config_dir, *key.split("."))):
                return full(overrides)
        cfg = copy.deepcopy(base)
        ConfigLoaderImpl._apply_overrides_to_config(own, cfg)
        return cfg

    try:
        base = full(common)
        same = OmegaConf.to_container(fast(points[0])) == OmegaConf.to_container(full(points[0]))
    except Exception:  # noqa: BLE001 - point 0's own error: every point composes in full
        return None
    return fast if same else None


def check(compose, overrides) -> dict:
    stage = "compose"
    try:
        from omegaconf import OmegaConf

        cfg = compose(overrides)
        # Everything must resolve, as it will in main_ppo (a misspelt ${...} fails here).
        OmegaConf.resolve(cfg)

        # Before verl's own checks: what its agent-loop workers would import, minutes into the job.
        stage = "imports"
        error, notes = imports(cfg.actor_rollout_ref.rollout)
        error = error or agent_names(cfg)
        if error:
            return {"ok": False, "stage": stage, "error": error}

        stage = "validate"
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

        # A `+key` that verl does not know passes Hydra and fails only when the workers build
        # their dataclasses (validate_config built the actor's and critic's): the rollout's
        # here. (The model's would load the model: not on a login node.)
        stage = "dataclass"
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    except BaseException as e:  # noqa: B036 - Hydra and verl raise assertion errors too
        return {"ok": False, "stage": stage, "error": message(e)}
    report = {k: OmegaConf.select(cfg, k, default=None) for k in REPORT_KEYS}
    return {"ok": True, "notes": notes, "config": {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
                                                   for k, v in report.items()}}


MT = "actor_rollout_ref.rollout.multi_turn"
AGENTS = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


def imports(rollout):
    """What verl's agent-loop workers will import, minutes into the job, imported here: every
    tool's `class_name` (the tool config), the function-tool file, and every agent loop's
    `_target_` (the agent-loop config); and the turn limits a tool needs. Returns (error or
    None, notes): a note is one line on what verl will do that the recipe may not expect."""
    import importlib
    import importlib.util
    import os

    from omegaconf import OmegaConf
    from verl.utils.import_utils import resolve_config_path

    mt, agent = rollout.multi_turn, rollout.agent
    tools = mt.get("tool_config_path") or mt.get("function_tool_path")
    turns = mt.get("max_assistant_turns")
    if turns == 0 or mt.get("max_user_turns") == 0:
        key = "max_assistant_turns" if turns == 0 else "max_user_turns"
        return f"{MT}.{key}=0: verl reads 0 as no limit at all; set a positive number, or null for no limit", []
    if tools and turns is not None and turns < 2:
        return (f"{MT}.max_assistant_turns={turns} with tools: verl's ToolAgentLoop ends after that many "
                "assistant turns before it runs the calls in the last one, so no tool would ever run; set at "
                "least 2 (a call, then the answer)"), []

    def found(key, path):
        try:
            where = resolve_config_path(path)
        except FileNotFoundError:
            where = None
        return (where, None) if where and os.path.isfile(where) else (None, f"{key}: {path} does not exist")

    names = []  # (what, dotted name, file)
    if mt.get("tool_config_path"):
        path, error = found(f"{MT}.tool_config_path", mt.tool_config_path)
        if error:
            return error, []
        names += [("tool class_name", t.get("class_name"), path) for t in OmegaConf.load(path).get("tools") or []]
    if mt.get("function_tool_path"):
        path, error = found(f"{MT}.function_tool_path", mt.function_tool_path)
        if error:
            return error, []
        try:  # verl imports the file by its path in each worker
            spec = importlib.util.spec_from_file_location("_verl_launch_function_tools", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as e:  # noqa: BLE001 - whatever it raises, verl's workers would too
            return f"{MT}.function_tool_path: {path} does not import ({message(e)})", []
    if agent.get("agent_loop_config_path"):
        path, error = found(AGENTS, agent.agent_loop_config_path)
        error = error or registrations(path)
        if error:
            return error, []
        names += [("agent loop _target_", a.get("_target_"), path) for a in OmegaConf.load(path) or []]
    for what, dotted, path in names:
        module, _, attr = str(dotted).rpartition(".")
        try:
            if not module:
                raise ImportError("not a dotted module.Class name")
            if not hasattr(importlib.import_module(module), attr):
                raise ImportError(f"module {module} has no {attr}")
        except Exception as e:  # noqa: BLE001 - anything the import raises, verl's workers would too
            return f"{path}: {what} {dotted} does not import ({message(e)})", []
    notes = []
    if mt.get("enable") and not tools:
        loop = agent.get("default_agent_loop") or "single_turn_agent"
        notes.append(f"{MT}.enable=true with no tool_config_path nor function_tool_path: " + (
            "verl's ToolAgentLoop runs with no tools, and answers each call the model writes with "
            "\"Unknown function\"" if loop == "tool_agent" else
            f"rows without an agent_name run {loop}, as without it (verl 0.9 only records the flag)"))
    return None, notes


BUILT_IN_LOOPS = ("single_turn_agent", "tool_agent")  # what verl 0.9.1 registers itself


def registrations(path):
    """What is wrong with verl's agent-loop registry file PATH, or None. verl reads it as a list of
    {name, _target_} and registers each entry by its name, a second entry of one name silently
    replacing the first; anything else fails in every agent-loop worker, minutes into the job."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    try:
        data = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - YAML's and OmegaConf's own errors
        return f"{AGENTS}: {path} is not YAML verl can read ({message(e)})"
    if not isinstance(data, ListConfig):
        return (f"{AGENTS}: {path} must be a list of entries with a name and a _target_ (verl's agent-loop "
                f"registry), not a {'mapping' if isinstance(data, DictConfig) else type(data).__name__}")
    seen = {}
    for i, entry in enumerate(data, 1):
        where = f"{AGENTS}: {path}: entry {i}"
        if not isinstance(entry, DictConfig):
            shown = OmegaConf.to_container(entry) if isinstance(entry, ListConfig) else entry
            return f"{where} must be a mapping with a name and a _target_, not {shown!r}"
        name, target = entry.get("name"), entry.get("_target_")
        if not isinstance(name, str) or not name.strip():
            return f"{where}: name must be a non-empty string (a dataset row's agent_name picks the loop by it)"
        if not isinstance(target, str) or "." not in target:
            return f"{where} ({name}): _target_ must be the loop's class as module.Class, got {target!r}"
        if name in seen:
            return f"{where}: name {name!r} is registered twice (entries {seen[name]} and {i}): verl would keep only the last"
        seen[name] = i
    return None


def agent_names(cfg):
    """Every `agent_name` in the local parquet data names an agent loop verl has registered (its
    own, or the agent-loop config's), as does default_agent_loop: verl finds out at its first
    rollout (an assertion, minutes into the job). Only the `agent_name` column is read. verl's
    registry is imported (seconds) only for a name not known without it."""
    from omegaconf import OmegaConf

    agent = cfg.actor_rollout_ref.rollout.agent
    known = set(BUILT_IN_LOOPS)
    if agent.get("agent_loop_config_path"):
        known |= {str(a.get("name")) for a in OmegaConf.load(agent.agent_loop_config_path) or []}
    used = []  # (name, where, key, rows)
    if agent.get("default_agent_loop"):
        used.append((str(agent.default_agent_loop), "the config", "actor_rollout_ref.rollout.agent.default_agent_loop", 0))
    for key in ("train_files", "val_files"):
        files = cfg.data.get(key)
        for path in ([files] if isinstance(files, str) else list(files or [])):
            path = str(path)
            if not (path.endswith(".parquet") and os.path.isfile(path)):
                continue  # not ours to read (hdfs://, another format): verl's loader decides
            try:
                import pyarrow.parquet as pq

                if "agent_name" not in pq.read_schema(path).names:
                    continue
                column = pq.read_table(path, columns=["agent_name"]).column("agent_name").to_pylist()
            except Exception:  # noqa: BLE001 - a file verl's loader cannot read either: its words, later
                continue
            for name in sorted({str(n) for n in column}):
                used.append((name, path, f"data.{key}", column.count(name)))
    strange = [u for u in used if u[0] not in known]
    if strange:
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        known |= set(_agent_loop_registry)
        strange = [u for u in strange if u[0] not in known]
    if not strange:
        return None
    name, where, key, rows = strange[0]
    what = f"{key}: {where}: {rows} row(s) with agent_name {name!r}" if rows else f"{key}={name!r}"
    return (f"{what}: no agent loop of that name is registered (registered: {', '.join(sorted(known))}): verl "
            f"would fail at its first rollout; register it in {AGENTS}, or fix the name")


if __name__ == "__main__":
    sys.exit(main())
