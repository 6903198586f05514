"""A run's W&B metrics that stayed offline, sent to W&B with wandb's own `wandb sync`.

A run's metrics stay offline when W&B did not answer as the job started
(`trace.on_unreachable=disable`: the job sets WANDB_MODE=offline) or when the recipe set
WANDB_MODE=offline. The job sets WANDB_DIR to the run directory, so wandb writes them to
``<run dir>/wandb/offline-run-<time>-<run id>/run-<run id>.wandb``, complete: each node's W&B
service finishes the run at the job's end (templates/wandb_service.py). `wandb sync` sends such
a directory and marks it synced (``run-<id>.wandb.synced``): a second sync finds every directory
marked and sends nothing.

An online run (``wandb/run-*``) is refused: W&B has its metrics already, and `wandb sync`
replays the local transaction log on top of them, every row again
(../shared/reference/wandb-tail). The key goes only into wandb's environment.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional

from ..checks import secrets
from . import state
from ..errors import RecipeError, RemoteError
from ..core.paths import RunPaths

SYNC_TIMEOUT = 600  # seconds for one directory's upload


@dataclass
class Local:
    """wandb's own directories of one run (its run id), oldest first."""
    offline: List[Path]
    online: List[Path]

    @property
    def unsynced(self) -> List[Path]:
        return [d for d in self.offline if not synced(d)]


def run_id(run: dict) -> str:
    from ..core.plan import wandb_run_id

    return run.get("wandb_run_id") or wandb_run_id(run.get("entity"), run.get("project"), run.get("experiment"))


def roots(run: dict) -> List[Path]:
    """Where wandb put the run's directories: WANDB_DIR, the run directory unless the recipe's env sets it."""
    own = (_recipe(run).get("env") or {}).get("WANDB_DIR")
    return [Path(own or run["run_dir"]) / "wandb"]


def local(run: dict) -> Local:
    rid = run_id(run)
    found = {kind: sorted(d for root in roots(run) for d in root.glob(f"{kind}-*-{rid}"))
             for kind in ("offline-run", "run")}
    return Local(offline=found["offline-run"], online=found["run"])


def synced(d: Path) -> bool:
    return any(d.glob("*.wandb.synced"))


def unsynced_note(run: dict) -> Optional[str]:
    """What `status` says of offline metrics not yet sent (None: nothing to say)."""
    try:
        n = len(local(run).unsynced) if state.tracking(run)[0] else 0
    except OSError:
        return None
    if not n:
        return None
    return (f"{n} offline W&B run record{'s' if n > 1 else ''} not yet synced: "
            f"verl-launch sync {run['job_id']}")


def sync(run: dict, environ: Mapping[str, str], python: Optional[str] = None) -> dict:
    """Send the run's offline W&B directories (oldest first); say which were synced before.
    Bad input (not a W&B run, online, no key): RecipeError. wandb failing: RemoteError."""
    where = run["run_dir"]
    if not state.tracking(run)[0]:
        raise RecipeError("the run did not log to W&B (wandb.enabled=false): nothing to sync",
                          where=where, key="wandb.enabled")
    found = local(run)
    root = " or ".join(str(r) for r in roots(run))
    if not found.offline:
        if found.online:
            raise RecipeError(f"the run logged to W&B online ({found.online[-1].name}): W&B has its metrics, "
                              "nothing stayed offline. `wandb sync` would send every row again", where=where, key="wandb")
        raise RecipeError(f"the run never logged to W&B: no offline-run-*-{run_id(run)} in {root}",
                          where=where, key="wandb")
    todo = found.unsynced
    result = {"run_id": run_id(run), "synced": [], "already": [str(d) for d in found.offline if d not in todo]}
    if not todo:
        return result
    wandb = _recipe(run).get("wandb") or {}
    base = run.get("wandb_base_url") or wandb.get("base_url")
    key = secrets.find_key_at(base, wandb.get("api_key_file"), str(RunPaths(Path(where)).recipe), environ)
    if key is None or not key.value:
        raise RecipeError(f"no W&B API key to sync with: {secrets.WHERE_KEYS} ({secrets.host_of(base)})",
                          where=where, key="wandb")
    python = python or (_recipe(run).get("runtime") or {}).get("python") or "python3"
    env = {k: v for k, v in environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_API_KEY=key.value, WANDB_SILENT="true", WANDB_ERROR_REPORTING="false")
    if base:
        env["WANDB_BASE_URL"] = base
    for d in todo:
        cmd = [python, "-m", "wandb", "sync", "--no-include-online", "--no-include-synced", str(d)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SYNC_TIMEOUT,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise RecipeError(f"{python} is not there: the run's runtime.python must run here to sync (or --python)",
                              where=where, key="runtime.python") from None
        except subprocess.TimeoutExpired:
            raise RemoteError(f"wandb sync of {d.name} took over {SYNC_TIMEOUT} s; run it again (nothing is sent twice)") from None
        said = secrets.redact((proc.stdout + proc.stderr).strip(), dict(environ, WANDB_API_KEY=key.value))
        if proc.returncode != 0 and "No module named wandb" in said:
            raise RecipeError(f"{python} has no wandb module: use the run's node environment (--python)",
                              where=where, key="runtime.python")
        if proc.returncode != 0 or not synced(d):
            raise RemoteError(f"wandb sync of {d.name} failed (exit {proc.returncode}): "
                              f"{' / '.join(said.splitlines()[-3:]) or 'no output'}")
        result["synced"].append(str(d))
    return result


def _recipe(run: dict) -> dict:
    return RunPaths(Path(run["run_dir"])).resolved_recipe()

