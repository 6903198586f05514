"""RunPaths names every file the job writes: one pattern each, the same name for Python (file(),
the accessors), for the job script (in_job, as bash expands it) and over every run (glob, latest)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import RECIPES
from launcher.core import paths as paths_module
from launcher.core.paths import RunPaths
from launcher.core.recipe import load
from launcher.core.render import render

P = RunPaths
CONSTANTS = {k: v for k, v in vars(RunPaths).items() if k.isupper() and isinstance(v, str)}
PATTERNS = [*P.PER_RESTART, P.STDOUT]
FIELDS = dict(restart=3, job="4242", node="gpu-n7")


def _bash(text: str, node: str = FIELDS["node"]) -> str:
    """What bash makes of TEXT inside double quotes, with the job's variables set (node is $1)."""
    script = f'RESTART={FIELDS["restart"]}; JOB_ID={FIELDS["job"]}; set -u; printf %s "{text}"'
    return subprocess.run(["bash", "-c", script, "bash", node], capture_output=True, text=True,
                          check=True, timeout=10).stdout


@pytest.mark.parametrize("pattern", PATTERNS)
def test_python_and_the_job_script_name_the_same_file(pattern):
    python = P(Path("/r")).file(pattern, **FIELDS).name
    assert python == pattern.format(**FIELDS)
    assert _bash(P.in_job(pattern, node="$1")) == python
    if "{node}" in pattern:  # srun --output: srun puts each node's name for %N
        assert _bash(P.in_job(pattern, node="%N")).replace("%N", FIELDS["node"]) == python


def test_the_accessors_use_the_patterns():
    p = P(Path("/r"))
    assert p.driver_log(2) == p.logs / P.DRIVER_LOG.format(restart=2) == Path("/r/logs/driver.r2.log")
    assert p.ray_state(2) == p.logs / "ray-state.r2.json"
    assert p.file(p.HEAD_LOG, 1) == p.logs / "ray-head.r1.log"
    assert p.file(p.WORKER_LOG, 1, node="n3") == p.logs / "ray-worker-n3.r1.log"
    assert p.file(p.WORKER_LOG, node="%N") == p.logs / "ray-worker-%N.r0.log"
    assert p.stdout("%j") == Path("/r/slurm-%j.out") and p.stdout("77") == p.file(P.STDOUT, job="77")
    assert p.file(P.CHECK_TOKEN, 1, job="9") == Path("/r/.verl-launch-check-9.r1")
    assert p.file(P.VERDICT, 4) == Path("/r/logs/verdict.r4.txt")


def test_in_job_text():
    assert P.in_job(P.DRIVER_LOG) == "driver.r$RESTART.log"
    assert P.in_job(P.WORKER_LOG, node="%N") == "ray-worker-%N.r$RESTART.log"
    assert P.in_job(P.CHECK_TOKEN) == ".verl-launch-check-$JOB_ID.r$RESTART"
    assert P.in_job(P.STDOUT) == "slurm-$JOB_ID.out"
    assert P.in_job(P.RESTART_TAG) == ".r$RESTART"
    with pytest.raises(ValueError, match="node="):
        P.in_job(P.WORKER_LOG)
    for bad in ("$(id)", "a b", '"', "`id`", "*", "n1", "$1;x", ""):
        with pytest.raises(ValueError, match="plain bash variable"):
            P.in_job(P.WORKER_LOG, node=bad)


def test_the_rendered_script_uses_the_in_job_names():
    text = render(load(RECIPES / "sandbox-demo.yaml").plan)
    for pattern in (P.DRIVER_LOG, P.RAY_STATE, P.HEAD_LOG, P.WORKERS_SRUN, P.LOST_NODES):
        assert f'"$LOG_DIR/{P.in_job(pattern)}"' in text, pattern
    assert f'--output="$LOG_DIR/{P.in_job(P.WORKER_LOG, node="%N")}"' in text
    assert f"log=$LOG_DIR/{P.in_job(P.WORKER_LOG, node='$1')} " in text
    for pattern in (P.VERDICT, P.ENGINE_DIED):
        assert f"=$LOG_DIR/{P.in_job(pattern)}" in text, pattern
    assert f'"$RUN_DIR/{P.in_job(P.STDOUT)}"' in text


def _touch(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (mtime, mtime))
    return path


def test_globs_match_every_run_and_nothing_else(tmp_path):
    p = P(tmp_path)
    made = {pattern: {_touch(p.file(pattern, r, node=n, job="5"), 1000 + r).name
                      for r in range(3) for n in ("n1", "n2")} for pattern in PATTERNS}
    for pattern in PATTERNS:
        got = {f.name for f in p.where(pattern).glob(P.glob(pattern))}
        assert got == made[pattern], pattern
    assert P.glob(P.DRIVER_LOG) == "driver.r*.log"
    assert P.glob(P.WORKER_LOG, node="n1") == "ray-worker-n1.r*.log"
    assert {f.name for f in p.logs.glob(P.glob(P.WORKER_LOG, node="n1"))} == {
        f"ray-worker-n1.r{r}.log" for r in range(3)}
    assert P.glob(P.WORKER_LOG, node="a[1]*") == "ray-worker-a[[]1][*].r*.log"  # escaped
    assert P.glob(P.DRIVER_LOG, restart=2) == "driver.r2.log"


def test_latest_is_the_newest_by_mtime(tmp_path):
    p = P(tmp_path)
    assert p.latest(P.DRIVER_LOG) is None  # no logs/ yet
    _touch(p.driver_log(0), 3000)
    _touch(p.driver_log(1), 2000)  # older, though a later restart: mtime decides
    assert p.latest(P.DRIVER_LOG) == p.driver_log(0)
    _touch(p.driver_log(2), 4000)
    assert p.latest(P.DRIVER_LOG) == p.driver_log(2)
    _touch(p.file(p.WORKER_LOG, 0, node="n1"), 5000)
    _touch(p.file(p.WORKER_LOG, 1, node="n2"), 4000)
    assert p.latest(P.WORKER_LOG) == p.file(p.WORKER_LOG, 0, node="n1")
    assert p.latest(P.WORKER_LOG, node="n2") == p.file(p.WORKER_LOG, 1, node="n2")
    assert p.latest(P.WORKER_LOG, node="n3") is None
    assert p.latest(P.HEAD_LOG) is None
    _touch(p.stdout("12"), 1000)  # in the run directory, not logs/
    assert p.latest(P.STDOUT) == p.stdout("12")


@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_names_hold_only_safe_characters(name):
    value = CONSTANTS[name]
    assert re.fullmatch(r"(?:[A-Za-z0-9._-]|\{(?:restart|node|job)\})+", value), (name, value)
    assert "{restart}" not in value or value in P.PER_RESTART or value == P.RESTART_TAG, name


def test_every_per_restart_name_is_tagged_and_an_unsafe_name_is_refused(monkeypatch):
    assert all(P.RESTART_TAG in v for v in P.PER_RESTART)
    for bad in ("driver r{restart}.log", "d'{restart}", "d{restart}_x.log", "$HOME.log", "d{other}.log"):
        monkeypatch.setattr(RunPaths, "DRIVER_LOG", bad)
        with pytest.raises(ValueError):
            paths_module._check_names()
    monkeypatch.undo()
    paths_module._check_names()


def _add_merges(run_dir: str, who: str, n: int) -> None:
    p = RunPaths(Path(run_dir))
    for i in range(n):
        p.update_record(lambda rec: rec.setdefault("merges", []).append(f"{who}{i}"))


def test_the_record_is_changed_under_one_lock_and_nothing_a_writer_added_is_lost(tmp_path):
    """run.json is read-modify-written by a merge job, a cancel and a local run's end: through
    RunPaths.update_record only, under a lock, so two at once both land."""
    import multiprocessing

    p = RunPaths(tmp_path)
    assert p.update_record(lambda rec: rec.update(x=1)) is None and not p.record.exists()  # no record: none made
    p.write_record({"job_id": "7"})
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_add_merges, args=(str(tmp_path), who, 40)) for who in "ab"]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    rec = p.read_record()
    assert rec["job_id"] == "7" and sorted(rec["merges"]) == sorted(f"{w}{i}" for w in "ab" for i in range(40))
    assert oct(p.record.stat().st_mode & 0o777) == "0o600"
    p.record.write_text("{not json")
    assert p.read_record() is None and p.update_record(lambda rec: rec.update(x=1)) is None
    assert p.record.read_text() == "{not json"  # an unreadable record is not replaced
