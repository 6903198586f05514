"""`verl-launch sync` (launcher/jobs/wandb_sync.py) on real wandb runs, without Slurm: an offline run
written by the real wandb client (as a job leaves one with trace.on_unreachable=disable), sent to
the W&B stand-in by wandb's own `wandb sync`; a second sync sends nothing; what is refused and
why. The job's side (offline at start, sync --wait, status) is tests/test_trace_job.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.jobs import wandb_sync
from launcher.errors import RecipeError
from launcher.core.plan import wandb_run_id
from wandb_standin import StandIn

STEPS = 4
# As verl's Tracking logs (step=N, no commit), then the end a job's W&B service gives it.
_WRITE = """
import os, sys, wandb
run = wandb.init(project="proj", name="exp", entity="team")
for s in range(1, int(sys.argv[1]) + 1):
    wandb.log({"actor/grad_norm": 1.0 / s}, step=s)
run.finish(exit_code=0)
"""


def _record(run_dir: Path, **extra) -> dict:
    (run_dir / "recipe.yaml").write_text(f"runtime:\n  python: {sys.executable}\nwandb:\n  enabled: true\n")
    return {"job_id": "77", "run_dir": str(run_dir), "entity": "team", "project": "proj", "experiment": "exp",
            "wandb_enabled": True, "trace_backend": "none", **extra}


def _write_run(run_dir: Path, mode: str, env: dict) -> None:
    rid = wandb_run_id("team", "proj", "exp")
    proc = subprocess.run([sys.executable, "-c", _WRITE, str(STEPS)], capture_output=True, text=True, timeout=120,
                          env=dict(env, WANDB_MODE=mode, WANDB_DIR=str(run_dir), WANDB_RUN_ID=rid,
                                   WANDB_SILENT="true", WANDB_ERROR_REPORTING="false"))
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def env(tmp_path, wandb_key):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return dict(clean, HOME=str(tmp_path / "home"), WANDB_API_KEY=wandb_key)


def test_an_offline_run_is_sent_once_with_every_step(tmp_path, env, wandb_key):
    _write_run(tmp_path, "offline", env)
    with StandIn(api_key=wandb_key) as w:
        run = _record(tmp_path, wandb_base_url=w.url)
        assert wandb_sync.unsynced_note(run) == "1 offline W&B run record not yet synced: verl-launch sync 77"
        done = wandb_sync.sync(run, env)
        assert len(done["synced"]) == 1 and done["already"] == [], done
        (got,) = w.runs.values()
        assert [(h["_step"], h["actor/grad_norm"]) for h in got["history"]] == [(s, 1.0 / s) for s in range(1, STEPS + 1)]
        assert (got["entity"], got["project"], got["name"], got["ends"]) == ("team", "proj", "exp", [0])
        asked = len(w.requests)
        again = wandb_sync.sync(run, env)
        assert again["synced"] == [] and again["already"] == done["synced"]
        assert len(w.requests) == asked  # nothing sent the second time
    assert wandb_sync.unsynced_note(run) is None
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or wandb_key.encode() not in f.read_bytes(), f


def test_an_online_run_is_refused_a_sync_would_send_every_row_again(tmp_path, env, wandb_key):
    with StandIn(api_key=wandb_key) as w:
        _write_run(tmp_path, "online", dict(env, WANDB_BASE_URL=w.url))
        run = _record(tmp_path, wandb_base_url=w.url)
        with pytest.raises(RecipeError) as e:
            wandb_sync.sync(run, env)
        assert len(w.runs[wandb_run_id("team", "proj", "exp")]["history"]) == STEPS  # untouched
    assert "the run logged to W&B online (run-" in str(e.value) and "send every row again" in str(e.value)
    assert e.value.where == str(tmp_path) and wandb_sync.unsynced_note(run) is None


@pytest.mark.parametrize("case", ["never", "disabled", "no key", "no wandb"])
def test_what_sync_refuses_names_why(tmp_path, env, case):
    run = _record(tmp_path)
    if case == "never":
        why = f"the run never logged to W&B: no offline-run-*-{wandb_run_id('team', 'proj', 'exp')} in {tmp_path}/wandb"
    elif case == "disabled":
        run["wandb_enabled"] = False
        why = "wandb.enabled: the run did not log to W&B (wandb.enabled=false)"
    else:
        (tmp_path / "wandb" / f"offline-run-20261205_000000-{wandb_run_id('team', 'proj', 'exp')}").mkdir(parents=True)
        if case == "no key":
            env = {k: v for k, v in env.items() if k != "WANDB_API_KEY"}
            why = "no W&B API key to sync with: $WANDB_API_KEY, wandb.api_key_file, or ~/.netrc (api.wandb.ai)"
        else:
            (tmp_path / "recipe.yaml").write_text("runtime:\n  python: /usr/bin/python3\n")
            why = "runtime.python: /usr/bin/python3 has no wandb module"
    with pytest.raises(RecipeError) as e:
        wandb_sync.sync(run, env)
    assert why in str(e.value), str(e.value)
    assert "WANDB_API_KEY" not in env or env["WANDB_API_KEY"] not in str(e.value)
