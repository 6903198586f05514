"""The run registry: one JSON line per submitted run, so that `list` and `status` know a
user's runs without asking Slurm to search. It runs no Slurm command; state.find is the one
lookup of a run in it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List


def registry_file() -> Path:
    """``$VERL_LAUNCH_STATE/runs.jsonl``, else under ``$XDG_STATE_HOME`` (~/.local/state)."""
    base = os.environ.get("VERL_LAUNCH_STATE") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "verl-launch")
    return Path(base) / "runs.jsonl"


def record(run: dict) -> None:
    path = registry_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(run, sort_keys=True) + "\n")


def runs() -> List[dict]:
    """Every recorded run, oldest first (unreadable lines are skipped)."""
    try:
        lines = registry_file().read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            run = json.loads(line)
        except ValueError:
            continue
        if isinstance(run, dict) and isinstance(run.get("run_dir", ""), str):
            out.append(run)
    return out
