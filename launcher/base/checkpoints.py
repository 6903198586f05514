"""Which checkpoint verl would resume from, and whether it could: one reading of a checkpoint
directory for `check`, `submit` and the job itself (the script embeds this file and runs it on
the head before Ray starts, so it imports nothing but the standard library).

What verl 0.9.1 does, read in its code (legacy trainer and V1 alike):
- resume_mode=auto reads only <default_local_dir>/latest_checkpointed_iteration.txt (with int(),
  so anything else there is a ValueError at start) and checks only that global_step_N exists;
  with no tracker, or a missing directory, it prints "Training from scratch" and starts at 0.
- A save writes actor/, then critic/, then data.pt, then the tracker last; with
  actor.checkpoint.async_save it never writes the tracker (verl#7952).
- Loading needs, for FSDP, every rank's model_/optim_/extra_state_world_size_W_rank_r.pt for the
  run's world size W (as far as checkpoint.load_contents asks), in actor/ and, with a critic, in
  critic/; for Megatron, actor/ckpt_contents.json, which it writes last. data.pt is optional
  (without it the dataloader starts over).

In the job:  python - ROOT LAYOUT_JSON MODE RESTART STATE_FILE
MODE: "auto" (verl's own tracker), "latest-complete", or a step number (cluster.resume_from).
Prints the phase's detail; exit 0 to go on, 3 to stop the job before verl starts (the line says why).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"global_step_(\d+)")
CONTENTS = ("model", "optimizer", "extra")  # verl's default checkpoint.load_contents
FILE_OF = {"model": "model", "optimizer": "optim", "extra": "extra_state"}  # FSDP's file prefixes
LATEST = "latest-complete"
STOP = 3  # the job's exit code for "do not start verl"


# ----------------------------------------------------------------------------- what a run loads
def layout(v: dict) -> dict:
    """What a loadable global_step_N holds for a run with verl's effective values V (dotted keys):
    the strategy's files, the actor's world size, what load_contents asks, and the critic's."""
    def contents(role: str) -> List[str]:
        got = v.get(f"{role}.checkpoint.load_contents")
        if isinstance(got, str):
            got = [got]
        return [c for c in (got if isinstance(got, (list, tuple)) else CONTENTS) if c in FILE_OF]

    def whole(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0

    strategy = str(v.get("actor_rollout_ref.actor.strategy") or "fsdp")
    nodes, gpus = v.get("trainer.nnodes"), v.get("trainer.n_gpus_per_node")
    enable = v.get("critic.enable")
    critic = bool(enable) if enable is not None else v.get("algorithm.adv_estimator") == "gae"  # verl's need_critic
    return {"strategy": "fsdp" if strategy in ("fsdp", "fsdp2") else strategy,
            "world_size": nodes * gpus if whole(nodes) and whole(gpus) else None,
            "actor": contents("actor_rollout_ref.actor"),
            "critic": contents("critic") if critic else None}


def missing(step_dir: str, lay: dict) -> Optional[str]:
    """Why verl could not load STEP_DIR for a run of layout LAY; None when it could. Strategy
    "any" (the launcher's stand-in driver): the directory is the checkpoint, as verl checks."""
    if lay.get("strategy") == "any":
        return None
    roles = [("actor", lay.get("actor", list(CONTENTS)))]
    if lay.get("critic") is not None:
        roles.append(("critic", lay["critic"]))
    for role, wanted in roles:
        d = os.path.join(step_dir, role)
        if not os.path.isdir(d):
            return f"no {role}/"
        if lay.get("strategy") == "megatron":
            if not os.path.isfile(os.path.join(d, "ckpt_contents.json")):
                return f"no {role}/ckpt_contents.json (Megatron writes it last: the save did not finish)"
            continue
        if lay.get("strategy") != "fsdp":
            continue  # another engine's layout: only what verl itself checks (the directory)
        world = lay.get("world_size")
        saved = _saved_world(d)
        if world is None:
            world = saved
        if world is None:
            return f"{role}/fsdp_config.json (the world size it was saved with) is missing or unreadable"
        gaps = [f"{FILE_OF[c]}_world_size_{world}_rank_{r}.pt" for c in wanted for r in range(world)
                if not _nonempty(os.path.join(d, f"{FILE_OF[c]}_world_size_{world}_rank_{r}.pt"))]
        if gaps:
            if saved is not None and saved != world:
                return (f"{role}/ was saved by {saved} ranks and this run has {world} "
                        "(trainer.nnodes x trainer.n_gpus_per_node): verl loads only its own world size's shards")
            return f"{role}/{gaps[0]} is missing or empty" + (f" (and {len(gaps) - 1} more)" if len(gaps) > 1 else "")
    return None


def _saved_world(d: str) -> Optional[int]:
    try:
        with open(os.path.join(d, "fsdp_config.json")) as f:
            world = json.load(f)["world_size"]
        return world if isinstance(world, int) and world > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


# ----------------------------------------------------------------------------- the directory
@dataclass
class Survey:
    root: str
    steps: List[int] = field(default_factory=list)  # global_step_N directories, in order
    tracker: Optional[int] = None  # the step verl's tracker names
    tracker_text: Optional[str] = None  # what it holds when that is not a step
    incomplete: Dict[int, str] = field(default_factory=dict)  # step -> why verl could not load it
    newest_complete: Optional[int] = None
    loads: Optional[int] = None  # what resume_mode=auto loads (None: it starts from scratch)
    fails: bool = False  # verl would fail at start: an unreadable tracker, or one naming an incomplete step
    problem: Optional[str] = None  # why verl would not resume from newest_complete (None: it would)

    def listing(self) -> str:
        return ", ".join(f"global_step_{s}" + (" (incomplete)" if s in self.incomplete else "")
                         for s in self.steps) or "none"

    def way_out(self) -> str:
        """How to resume from the newest complete checkpoint, said the same everywhere."""
        if self.newest_complete is None:
            return ("no complete checkpoint there to resume from: start afresh under a new wandb.experiment, "
                    f"or move {self.root} away")
        return (f"to resume from it: submit --resume-from global_step_{self.newest_complete} "
                "(or --resume-from latest-complete; in a recipe, cluster.resume_from)")


def survey(root: str, lay: dict) -> Survey:
    """What ROOT (verl's trainer.default_local_dir) holds, what resume_mode=auto would load, and
    why it would not resume from the newest complete checkpoint, if it would not."""
    s = Survey(root=root)
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    s.steps = sorted(int(m.group(1)) for m in map(STEP_DIR.fullmatch, names)
                     if m and os.path.isdir(os.path.join(root, m.group(0))))
    for step in reversed(s.steps):
        why = missing(os.path.join(root, f"global_step_{step}"), lay)
        if why is None:
            s.newest_complete = step
            break
        s.incomplete[step] = why
    try:
        with open(os.path.join(root, TRACKER), "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        text = None
    if text is not None:
        try:
            s.tracker = int(text)  # as verl reads it: whitespace allowed, nothing else
        except ValueError:
            s.tracker_text = text.strip()[:40]
    _verdict(s, lay)
    return s


def _verdict(s: Survey, lay: dict) -> None:
    m, problem = s.newest_complete, None
    if s.tracker_text is not None:
        s.fails = True
        problem = f"its {TRACKER} holds {s.tracker_text!r}, not a step: verl would fail at start (ValueError)"
    elif s.tracker is None:
        if s.steps:
            problem = f"it holds {s.listing()} but no {TRACKER}: verl would start from scratch (verl#7952)"
    elif s.tracker not in s.steps:
        problem = (f"its {TRACKER} names step {s.tracker}, but global_step_{s.tracker} is not there "
                   f"(steps there: {s.listing()}): verl would start from scratch")
    else:
        why = s.incomplete.get(s.tracker)
        if why is None and s.tracker != m:  # older than the newest complete one: not read yet
            why = missing(os.path.join(s.root, f"global_step_{s.tracker}"), lay)
        if why is not None:
            s.fails = True
            problem = (f"its {TRACKER} names step {s.tracker}, but global_step_{s.tracker} is incomplete "
                       f"({why}): verl would fail loading it")
        else:
            s.loads = s.tracker
            if m is not None and m > s.tracker:
                problem = (f"its {TRACKER} names step {s.tracker}, but global_step_{m} is newer and complete: "
                           f"verl would resume from step {s.tracker}")
    if problem and m is not None and s.loads is None:
        problem += f"; the newest complete checkpoint is global_step_{m}"
    newer = [x for x in s.incomplete if x != s.tracker]
    if problem and newer:
        problem += f" (global_step_{max(newer)} is incomplete: {s.incomplete[max(newer)]})"
    s.problem = problem


def write_tracker(root: str, step: int) -> None:
    """verl's tracker naming STEP, as verl writes it (the number, no newline), replaced at once."""
    tmp = os.path.join(root, f".{TRACKER}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(root, TRACKER))


# ----------------------------------------------------------------------------- in the job
def job(root: str, lay: dict, mode: str, restart: int, state_file: str) -> tuple:
    """(exit code, the phase's detail) before verl starts: apply cluster.resume_from (MODE), then
    stop rather than let a requeued run start over from a checkpoint older than one it saved."""
    s = survey(root, lay)
    said = []
    target = None
    if mode.isdigit() and restart == 0:
        n = int(mode)
        if n not in s.steps:
            return STOP, f"cluster.resume_from={n}: global_step_{n} is not in {root} (steps there: {s.listing()})"
        why = s.incomplete.get(n) or missing(os.path.join(root, f"global_step_{n}"), lay)
        if why:
            return STOP, f"cluster.resume_from={n}: global_step_{n} is incomplete ({why})"
        target = n
    elif mode == LATEST and s.problem and s.newest_complete is not None:
        target = s.newest_complete
    if target is not None and (s.tracker != target or s.problem):
        held = (f"it named step {s.tracker}" if s.tracker is not None else
                f"it held {s.tracker_text!r}" if s.tracker_text is not None else "there was none")
        try:
            write_tracker(root, target)
        except OSError as e:
            return STOP, f"cluster.resume_from={mode}: cannot write {os.path.join(root, TRACKER)}: {e.strerror}"
        said.append(f"wrote {TRACKER} = {target} ({held}; cluster.resume_from={mode})")
        s = survey(root, lay)
    if restart == 0:
        with open(state_file, "w") as f:
            json.dump({"newest_complete": s.newest_complete}, f)
        base = s.newest_complete
    else:
        try:
            with open(state_file) as f:
                base = json.load(f)["newest_complete"]
        except (OSError, ValueError, KeyError, TypeError):
            base = None
    if s.problem:
        if s.fails:
            return STOP, f"{root}: {s.problem}; {s.way_out()}"
        saved_since = s.newest_complete is not None and (base is None or s.newest_complete > base)
        if restart > 0 and saved_since:
            return STOP, (f"requeued, and {root} holds a checkpoint this job saved that verl would not resume "
                          f"from: {s.problem}. Stopped rather than start over; {s.way_out()}")
        return 0, "; ".join(said + [f"WARNING: {root}: {s.problem}"])
    if s.loads is not None:
        said.append(f"verl resumes from global_step_{s.loads}")
    return 0, "; ".join(said)


def main(argv: List[str]) -> int:
    root, lay, mode, restart, state_file = argv
    code, text = job(root, json.loads(lay), mode, int(restart), state_file)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
