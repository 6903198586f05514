"""Every file name in a run directory, in one place (the template gets them from here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path

    SCRIPT = "job.sbatch"  # the rendered script, as submitted
    RECIPE = "recipe.yaml"  # the composed, validated recipe
    RECORD = "run.json"  # what submit recorded (job id, command, times)
    PHASES = "phases.jsonl"  # the job's timestamped phase markers
    LOGS = "logs"  # Ray head/worker logs and the node list
    NODES = "nodes.txt"  # "hostname address" per node, under LOGS

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
