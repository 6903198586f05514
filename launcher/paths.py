"""Every file name in a run directory, in one place (the template gets them from here)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import RecipeError


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path

    SCRIPT = "job.sbatch"  # the rendered script, as submitted
    RECIPE = "recipe.yaml"  # the composed, validated recipe
    RECORD = "run.json"  # what submit recorded (job id, command, times)
    PHASES = "phases.jsonl"  # the job's timestamped phase markers
    LOGS = "logs"  # Ray head/worker logs and the node list
    NODES = "nodes.txt"  # "hostname address" per node, under LOGS
    # Phases whose detail says why a run stopped early: the script's own errors, the driver's
    # last exception, the watchdog's verdict.
    STOP_PHASES = ("error", "driver-error", "hang", "ray-lost")

    def create(self, script: str, recipe_yaml: str) -> None:
        """The run directory (0700), with the script and the resolved recipe (0600)."""
        old = os.umask(0o077)
        try:
            self.run_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.run_dir.mkdir(mode=0o700)
            except FileExistsError:
                raise RecipeError("run directory already exists", where=str(self.run_dir)) from None
        except OSError as e:
            raise RecipeError(f"cannot create the run directory {self.run_dir}: {e.strerror}",
                              where="paths.runs") from None
        finally:
            os.umask(old)
        _write_private(self.script, script)
        _write_private(self.recipe, recipe_yaml)

    def write_record(self, record: dict, name: str = RECORD) -> None:
        """run.json: replaced whole (write then rename), so a reader never sees half of it."""
        target = self.run_dir / name
        tmp = target.with_suffix(".json.tmp")
        tmp.unlink(missing_ok=True)
        _write_private(tmp, json.dumps(record, indent=2) + "\n")
        tmp.replace(target)

    @property
    def script(self) -> Path:
        return self.run_dir / self.SCRIPT

    @property
    def recipe(self) -> Path:
        return self.run_dir / self.RECIPE

    @property
    def record(self) -> Path:
        return self.run_dir / self.RECORD

    @property
    def phases(self) -> Path:
        return self.run_dir / self.PHASES

    @property
    def logs(self) -> Path:
        return self.run_dir / self.LOGS

    def stdout(self, job_id: str) -> Path:
        """The batch script's output: Slurm's own default name, in the run directory."""
        return self.run_dir / f"slurm-{job_id}.out"

    def head_log(self, restart: int = 0) -> Path:
        return self.logs / f"ray-head.r{restart}.log"

    def worker_log(self, node: str, restart: int = 0) -> Path:
        return self.logs / f"ray-worker-{node}.r{restart}.log"

    def driver_log(self, restart: int = 0) -> Path:
        return self.logs / f"driver.r{restart}.log"

    def ray_state(self, restart: int = 0) -> Path:
        """What the job's Ray runs where, written by the watchdog (templates/watch_ray.py)."""
        return self.logs / f"ray-state.r{restart}.json"

    # ------------------------------------------------------------------ reading a run
    def read_phases(self) -> list:
        """Every marker that parses (a line cut short, or odd bytes in a detail, lose only that line)."""
        try:
            text = self.phases.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return []
        phases = []
        for line in text.splitlines():
            try:
                phases.append(json.loads(line))
            except ValueError:
                continue
        return [p for p in phases if isinstance(p, dict) and "phase" in p]

    def last_phase(self) -> Optional[dict]:
        phases = self.read_phases()
        return phases[-1] if phases else None

    def stop_reason(self) -> Optional[str]:
        """Why the latest run of the job stopped early, in one line; None if it did not say."""
        phases = self.read_phases()
        restart = phases[-1].get("restart", 0) if phases else 0
        why = [p for p in phases if p["phase"] in self.STOP_PHASES and p.get("restart", 0) == restart]
        if not why:
            return None
        p = why[-1]
        return f"{p['phase']}: {p['detail']}" if p.get("detail") else p["phase"]

    def bad_nodes(self) -> list:
        """The nodes each run's failure was put down to: [{"restart", "node", "why"}]."""
        return [{"restart": p.get("restart", 0), "node": p["detail"].split(":", 1)[0],
                 "why": p["detail"].split(":", 1)[-1].strip()}
                for p in self.read_phases() if p["phase"] == "bad-node" and p.get("detail")]

    def progress(self, restart: int = 0, running: bool = True) -> Optional[str]:
        """The watchdog's one-line summary of the driver's Ray work (actors, training step);
        once the driver is gone (RUNNING False), only how far it trained."""
        try:
            state = json.loads(self.ray_state(restart).read_text())
        except (OSError, ValueError):
            return None
        return (state.get("summary") if running else state.get("training")) or None


@dataclass(frozen=True)
class SweepPaths:
    """A sweep's directory: the job array's script and record; point i's run directory is <i>/."""
    sweep_dir: Path

    SCRIPT = "sweep.sbatch"  # the job array's script: task i runs <i>/job.sbatch there
    RECORD = "sweep.json"  # the sweep: its points, their overrides and experiments
    OUTPUT = "%a/slurm-%A_%a.out"  # each task's output in its point's run dir (RunPaths.stdout)

    def point(self, index: int) -> RunPaths:
        return RunPaths(self.sweep_dir / str(index))

    @property
    def script(self) -> Path:
        return self.sweep_dir / self.SCRIPT

    @property
    def record(self) -> Path:
        return self.sweep_dir / self.RECORD

    def create(self, script: str) -> None:
        """The sweep directory (0700) with the array's script; then each point's run dir."""
        old = os.umask(0o077)
        try:
            self.sweep_dir.parent.mkdir(parents=True, exist_ok=True)
            self.sweep_dir.mkdir(mode=0o700)
        except FileExistsError:
            raise RecipeError("sweep directory already exists", where=str(self.sweep_dir)) from None
        except OSError as e:
            raise RecipeError(f"cannot create the sweep directory {self.sweep_dir}: {e.strerror}",
                              where="paths.runs") from None
        finally:
            os.umask(old)
        _write_private(self.script, script)

    def write_record(self, record: dict) -> None:
        RunPaths(self.sweep_dir).write_record(record, self.RECORD)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
