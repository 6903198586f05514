"""Every file name in a run directory, in one place (the template gets them from here)."""

from __future__ import annotations

import glob as _glob
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..errors import RecipeError


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path

    SCRIPT = "job.sbatch"  # the rendered script, as submitted
    RECIPE = "recipe.yaml"  # the composed, validated recipe
    RECORD = "run.json"  # what submit recorded (job id, command, times)
    PHASES = "phases.jsonl"  # the job's timestamped phase markers
    LOGS = "logs"  # Ray head/worker logs and the node list
    NODES = "nodes.txt"  # "hostname address" per node, under LOGS
    # The resume check's memory of the first start (launcher/checkpoints.py): the newest complete
    # checkpoint then, so that a requeue stops only for one this job saved. Under LOGS.
    RESUME_STATE = "resume-check.json"

    # The job's own files, one name pattern each. {restart} is Slurm's restart count: a requeued
    # job's files never overwrite the last run's. {node} is a node's name, {job} the job id.
    # Python gets a file with file()/the accessors below, the job script its bash text with
    # in_job(), and every run's files with glob()/latest(). All under LOGS unless in RUN_DIR_FILES.
    RESTART_TAG = ".r{restart}"  # what sets one run's files apart; every per-restart name has it
    STDOUT = "slurm-{job}.out"  # the batch script's output (Slurm's default name, --output)
    HEAD_LOG = "ray-head.r{restart}.log"  # the head's Ray step (srun --output)
    WORKER_LOG = "ray-worker-{node}.r{restart}.log"  # each worker's Ray (srun --output, node %N)
    WORKERS_SRUN = "ray-workers-srun.r{restart}.log"  # srun's own messages for the workers' step
    DRIVER_LOG = "driver.r{restart}.log"  # verl's driver output (also in the job's output)
    RAY_STATE = "ray-state.r{restart}.json"  # the watchdog's what-runs-where (templates/watch_ray.py)
    STEPS = "steps.r{restart}.jsonl"  # the watchdog's {"step", "time"}: when each of verl's steps was first seen
    # What `report` and `status` read of the driver log's step lines, and up to where (jobs/step_lines.py)
    STEPS_READ = "steps-read.r{restart}.json"
    VERDICT = "verdict.r{restart}.txt"  # the watchdog's "PHASE<TAB>NODE<TAB>WHY" that ends the driver
    ENGINE_DIED = "engine-died.r{restart}.txt"  # the watchdog's "NODE<TAB>vLLM's line": an engine died
    LOST_NODES = "lost-nodes.r{restart}.txt"  # the watchdog's nodes Ray lost while the driver ran
    # Ray's workers that died unintended before the driver ended, a JSON line each, first first
    # (templates/last_words.py gather, at the teardown while Ray is still up), and a folder of
    # each node's kept logs of them (NODE/worker-...-PID.err, the tails), read to name the cause.
    DEATHS = "ray-deaths.r{restart}.jsonl"
    LAST_WORDS = "last-words.r{restart}"
    WANDB_EXIT = "wandb-exit.r{restart}.txt"  # the job's exit code, for each node's W&B service (templates/wandb_service.py)
    WANDB_LOG = "wandb-service.r{restart}.log"  # what each node's W&B service says (templates/wandb_service.py)
    # The allocation check's token, written in the run dir (and the checkpoint dir) and read on
    # every node (templates/check_node.py), removed once read.
    CHECK_TOKEN = ".verl-launch-check-{job}.r{restart}"
    # The job's Ray token (RAY_AUTH_TOKEN_PATH), 0600, new at each start, removed at the teardown.
    RAY_TOKEN = ".ray-token.r{restart}"
    # What each agent-loop worker's trace flush did (templates/trace_flush.py): a JSON line per
    # step; {node} is the worker's node and PID ("%w" in the job script, which the worker fills in).
    TRACE_FLUSH = "trace-flush-{node}.r{restart}.jsonl"
    # The Ray processes' own module (templates/trace_flush.py, Ray's worker_process_setup_hook),
    # in this folder of the run directory, put on their PYTHONPATH.
    PYTHON_DIR = ".python"
    PER_RESTART = (HEAD_LOG, WORKER_LOG, WORKERS_SRUN, DRIVER_LOG, RAY_STATE, VERDICT, ENGINE_DIED,
                   LOST_NODES, CHECK_TOKEN, WANDB_EXIT, WANDB_LOG, RAY_TOKEN, TRACE_FLUSH, STEPS, DEATHS, LAST_WORDS,
                   STEPS_READ)
    RUN_DIR_FILES = (STDOUT, CHECK_TOKEN, RAY_TOKEN)  # in the run directory itself, not under LOGS
    # What the job script calls each field (templates/job/prologue.sh.j2 sets them).
    JOB_FIELDS = (("restart", "$RESTART"), ("job", "$JOB_ID"))
    # Phases whose detail says why a run stopped early: the script's own errors, the driver's
    # last exception, the watchdog's verdict, the first of Ray's processes to die (written last,
    # at the teardown: the cause, where the others are its cascade).
    STOP_PHASES = ("error", "driver-error", "hang", "ray-lost", "first-death")

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

    def read_record(self, name: str = RECORD) -> Optional[dict]:
        """run.json as submit (and what followed) recorded it; None if missing or unreadable."""
        try:
            with open(self.run_dir / name) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None

    def update_record(self, change: Callable[[dict], None], name: str = RECORD) -> Optional[dict]:
        """Read run.json, CHANGE it, write it whole, under a lock: a merge job and a cancel may
        both record at once. None (nothing written) where there is no record to change."""
        import fcntl

        try:
            lock = os.open(self.run_dir / f".{name}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rec = self.read_record(name)
            if rec is not None:
                change(rec)
                self.write_record(rec, name)
            return rec
        finally:
            os.close(lock)

    def resolved_recipe(self) -> dict:
        """The recipe as the run resolved it (recipe.yaml), as plain data; {} if unreadable."""
        import yaml

        try:
            data = yaml.safe_load(self.recipe.read_text())
        except (OSError, yaml.YAMLError):
            return {}
        return data if isinstance(data, dict) else {}

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
        return self.file(self.STDOUT, job=job_id)

    def driver_log(self, restart: int = 0) -> Path:
        return self.file(self.DRIVER_LOG, restart)

    def ray_state(self, restart: int = 0) -> Path:
        """What the job's Ray runs where, written by the watchdog (templates/watch_ray.py)."""
        return self.file(self.RAY_STATE, restart)

    # ------------------------------------------------------------------ the job's own files by pattern
    def where(self, pattern: str) -> Path:
        """The directory a pattern's files are in: the run directory, or its logs/."""
        return self.run_dir if pattern in self.RUN_DIR_FILES else self.logs

    def file(self, pattern: str, restart: int = 0, **fields) -> Path:
        """One run's file of PATTERN (a name constant above), e.g. ``file(VERDICT, 2)`` is
        logs/verdict.r2.txt; ``file(WORKER_LOG, 1, node="n3")`` logs/ray-worker-n3.r1.log."""
        return self.where(pattern) / pattern.format(restart=restart, **fields)

    @classmethod
    def in_job(cls, pattern: str, **fields: str) -> str:
        """PATTERN as the job script's bash text: {restart} is ``$RESTART``, {job} ``$JOB_ID``;
        any other field (node) is given as bash text: ``node="%N"`` in srun's --output, where
        srun names each node's file, or a variable (``node="$1"``). E.g. ``in_job(DRIVER_LOG)``
        is ``driver.r$RESTART.log``, ``in_job(WORKER_LOG, node="%N")`` ``ray-worker-%N.r$RESTART.log``.

        The templates insert this raw (not through the ``q`` filter): it is the launcher's own
        name, never a recipe's value, and its variables must expand inside double quotes. That
        is safe because every name pattern holds only ``[A-Za-z0-9._-]`` and its placeholders
        (checked at import, _check_names) and every field here is a plain variable or srun
        pattern (checked below): no quote, space, glob or command substitution can reach bash."""
        for name, text in fields.items():
            if not _BASH_FIELD.fullmatch(str(text)):
                raise ValueError(f"{name}={text!r} is not a plain bash variable or srun pattern")
        try:
            return pattern.format(**{**dict(cls.JOB_FIELDS), **fields})
        except KeyError as e:
            raise ValueError(f"in_job({pattern!r}) needs {e.args[0]}= (its bash text)") from None

    @classmethod
    def glob(cls, pattern: str, **fields) -> str:
        """A glob for PATTERN's files: every field not given is ``*``, so ``glob(DRIVER_LOG)`` is
        ``driver.r*.log`` (every run's), ``glob(WORKER_LOG, node="n3")`` ``ray-worker-n3.r*.log``.
        Given values are glob-escaped (a node named ``a[1]`` matches only itself)."""
        return pattern.format_map(_Glob({k: _glob.escape(str(v)) for k, v in fields.items()}))

    def latest(self, pattern: str, **fields) -> Optional[Path]:
        """The newest existing file of PATTERN (by mtime) in its directory, over every restart
        (and every node unless ``node=`` is given); None if there is none yet.
        E.g. ``latest(DRIVER_LOG)`` is the driver log of the job's latest run."""
        newest = None
        for f in self.where(pattern).glob(self.glob(pattern, **fields)):
            try:
                mtime = f.stat().st_mtime
            except OSError:  # removed meanwhile
                continue
            if newest is None or mtime >= newest[0]:
                newest = (mtime, f)
        return newest[1] if newest else None

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


    def seconds_per_step(self) -> Optional[float]:
        """The latest run's seconds per training step, as the watchdog last read them."""
        latest = self.latest(self.RAY_STATE)
        try:
            got = json.loads(latest.read_text()).get("seconds_per_step") if latest else None
        except (OSError, ValueError, AttributeError):
            return None
        return float(got) if isinstance(got, (int, float)) and not isinstance(got, bool) and got > 0 else None


def shown_phase(phase: Optional[str], progress: Optional[str]) -> Optional[str]:
    """The job's phase as a person reads it: 'training' once the driver reports training steps."""
    if phase == "driver-start" and progress and re.search(r"\btraining step \d", progress):
        return "training"
    return phase


MERGED = "verl-launch-merge.json"  # in a merged model (merge_job.py): where it came from


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


# A field given to in_job: a bash variable ($RESTART, $1, ${X}) or an srun filename pattern (%N).
_BASH_FIELD = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9]|\$\{[A-Za-z_][A-Za-z0-9_]*\}|%[A-Za-z]")
_PLACEHOLDERS = ("restart", "node", "job")
# A name: safe characters and placeholders, each placeholder ending the name or followed by a
# character that cannot continue a bash variable's name ("$RESTART.log", never "$RESTART_x").
_NAME = re.compile(r"(?:[A-Za-z0-9._-]|\{(?:%s)\}(?![A-Za-z0-9_]))+" % "|".join(_PLACEHOLDERS))


class _Glob(dict):
    def __missing__(self, key: str) -> str:
        return "*"


def _check_names() -> None:
    """Every file name constant of RunPaths is safe unquoted inside bash's double quotes."""
    names = {k: v for k, v in vars(RunPaths).items() if k.isupper() and isinstance(v, str)}
    for k, v in names.items():
        if not _NAME.fullmatch(v):
            raise ValueError(f"RunPaths.{k} = {v!r}: a file name holds only [A-Za-z0-9._-] and "
                             f"the placeholders {_PLACEHOLDERS}")
    for v in RunPaths.PER_RESTART:
        if RunPaths.RESTART_TAG not in v:
            raise ValueError(f"{v!r} is per restart but lacks {RunPaths.RESTART_TAG!r}")


_check_names()


def checkpoint_root(value, run_dir: str, project, experiment) -> str:
    """verl's checkpoint directory for a run: trainer.default_local_dir VALUE, relative to the
    run directory (the driver's cwd), else verl's default checkpoints/<project>/<experiment>."""
    if isinstance(value, str) and value and "${" not in value:  # an interpolation: verl's own default
        return os.path.join(run_dir, os.path.expanduser(value))
    return os.path.join(run_dir, "checkpoints", str(project), str(experiment))


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
