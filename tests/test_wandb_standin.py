"""W&B runs reach the loopback stand-in: the real wandb client (0.31, with its Go wandb-core).

No Slurm and no mocks: wandb.init / wandb.log / wandb.finish, and verl's own Tracking
logger, talk HTTP to tests/wandb_standin.py exactly as they would to a W&B deployment.
Each client runs in a subprocess (wandb.init is process-wide) with a bounded timeout.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wandb_standin import StandIn

ROOT = Path(__file__).resolve().parent.parent
ENTITY, PROJECT, RUN_ID, NAME = "team", "rl-test", "run-0123abcd", "exp-42"
CONFIG = {"lr": 1e-6, "model": {"path": "Qwen/Qwen2-0.5B"}, "ppo_epochs": 1}
METRICS = {1: {"actor/grad_norm": 1.5, "critic/score/mean": 0.1},
           2: {"actor/grad_norm": 1.25, "critic/score/mean": 0.2},
           3: {"actor/grad_norm": 1.0, "critic/score/mean": 0.3}}

# wandb.init(**argv[1]), wandb.log(metrics, step=step) for each of argv[2], wandb.finish().
WANDB_RUN = """
import json, sys
import wandb
run = wandb.init(**json.loads(sys.argv[1]))
steps = json.loads(sys.argv[2])
for step, metrics in steps.items():
    wandb.log(metrics, step=int(step))
print("LOGGED steps " + ",".join(steps))   # console output, streamed as output.log
wandb.finish()
print("FINISHED " + run.id)
"""
INIT = {"project": PROJECT, "entity": ENTITY, "name": NAME, "id": RUN_ID, "resume": "allow",
        "config": CONFIG}

# verl's Tracking as its trainer uses it; `del` finishes the run (Tracking.__del__).
VERL_TRACKING = """
import json, sys
from verl.utils.tracking import Tracking
t = Tracking(project_name=sys.argv[1], experiment_name=sys.argv[2],
             default_backend=["console", "wandb"], config=json.loads(sys.argv[3]))
for step, metrics in json.loads(sys.argv[4]).items():
    t.log(metrics, step=int(step))
del t
print("FINISHED")
"""


def wandb_env(clean_env: dict, url: str, tmp_path: Path) -> dict:
    """Online mode (WANDB_MODE unset) against the stand-in, wandb's files under tmp_path."""
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir(exist_ok=True)
    return {**clean_env, "WANDB_BASE_URL": url, "WANDB_ENTITY": ENTITY, "WANDB_PROJECT": PROJECT,
            "WANDB_DIR": str(wandb_dir), "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true",
            "PYTHONPATH": str(ROOT)}


def run_client(script: str, *args, env: dict, timeout: float = 60):
    """Run script in a fresh interpreter; (the completed process, seconds it took)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start


def logged(history: list[dict]) -> dict[int, dict]:
    """History rows by step, without wandb's own _runtime/_timestamp."""
    return {row["_step"]: {k: v for k, v in row.items() if not k.startswith("_")} for row in history}


def assert_key_not_recorded(w: StandIn, key: str, *dirs: Path) -> None:
    """Only the Authorization header carried the key: not a body, run, file or local file."""
    basic = base64.b64encode(f"api:{key}".encode()).decode()
    recorded = repr((w.bodies, w.runs, w.calls, w.unknown, w.requests))
    assert key not in recorded and basic not in recorded
    for d in dirs:
        for f in d.rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert key.encode() not in data and basic.encode() not in data, f


def test_wandb_run_is_logged_with_config_history_and_exit_code(clean_env, wandb_key, tmp_path):
    with StandIn(api_key=wandb_key) as w:
        env = wandb_env(clean_env, w.url, tmp_path)
        proc, took = run_client(WANDB_RUN, json.dumps(INIT), json.dumps(METRICS), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"FINISHED {RUN_ID}" in proc.stdout
        assert took < 45, f"wandb took {took:.0f} s against the stand-in"

    assert w.unknown == [], f"wandb used endpoints the stand-in lacks: {w.unknown}"
    assert w.requests and all(authorized for _, _, authorized in w.requests), w.requests
    run = w.runs[RUN_ID]
    assert (run["entity"], run["project"], run["name"]) == (ENTITY, PROJECT, NAME)
    assert run["config"] == CONFIG
    assert logged(run["history"]) == METRICS
    assert [row["_step"] for row in run["history"]] == [1, 2, 3]
    assert run["summary"]["actor/grad_norm"] == 1.0 and run["summary"]["_step"] == 3
    assert run["exit_code"] == 0 and run["resumed"] == 0
    # The run files went through CreateRunFiles' upload URLs, with the key.
    assert {"config.yaml", "wandb-metadata.json"} <= set(run["files"])
    assert ("PUT", f"/upload/{ENTITY}/{PROJECT}/{RUN_ID}/config.yaml", True) in w.requests
    assert_key_not_recorded(w, wandb_key, tmp_path / "wandb-dir", Path(env["HOME"]))


@pytest.mark.parametrize("resume", [True, False], ids=["with-run-id", "without-run-id"])
def test_wrong_key_fails_wandb_init_promptly(clean_env, wandb_key, tmp_path, resume):
    wrong = "local-" + "0" * 48
    # With an id and resume, RunResumeStatus comes first; without, UpsertBucket.
    init = INIT if resume else {k: v for k, v in INIT.items() if k not in ("id", "resume")}
    with StandIn(api_key=wandb_key) as w:
        env = {**wandb_env(clean_env, w.url, tmp_path), "WANDB_API_KEY": wrong}
        # wandb-core does not retry a 401: init raises within seconds, not after its timeout.
        proc, took = run_client(WANDB_RUN, json.dumps(init), json.dumps(METRICS), env=env)
    assert proc.returncode != 0 and "FINISHED" not in proc.stdout
    assert "wrong API key" in proc.stderr or "401" in proc.stderr, proc.stderr[-3000:]
    assert took < 30, f"a wrong key took {took:.0f} s to fail"
    assert w.requests and not any(authorized for _, _, authorized in w.requests), w.requests
    assert w.runs == {}   # nothing stored without the key


def launcher_env(clean_env: dict, url: str, tmp_path: Path) -> dict:
    """What the launcher exports on every node (launcher/core/render.py wandb_env)."""
    return {**wandb_env(clean_env, url, tmp_path), "WANDB_NAME": NAME, "WANDB_RUN_ID": RUN_ID,
            "WANDB_RESUME": "allow", "WANDB_RUN_GROUP": "grp", "WANDB_JOB_TYPE": "train"}


def test_requeued_job_resumes_the_same_run(clean_env, wandb_key, tmp_path):
    with StandIn(api_key=wandb_key) as w:
        env = launcher_env(clean_env, w.url, tmp_path)
        for steps in ({1: METRICS[1], 2: METRICS[2]}, {3: METRICS[3]}):   # the job, then its requeue
            proc, _ = run_client(WANDB_RUN, json.dumps({"config": CONFIG}), json.dumps(steps), env=env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert f"FINISHED {RUN_ID}" in proc.stdout

    assert w.unknown == [] and all(authorized for _, _, authorized in w.requests)
    run = w.runs[RUN_ID]
    assert (run["entity"], run["project"], run["name"]) == (ENTITY, PROJECT, NAME)
    assert (run["group"], run["job_type"], run["config"]) == ("grp", "train", CONFIG)
    # RunResumeStatus told the second process where the run stood: step 3 follows on at the
    # history's end instead of overwriting step 1, and the console log is appended to.
    assert logged(run["history"]) == METRICS
    assert [row["_step"] for row in run["history"]] == [1, 2, 3]
    assert [line.split(" ", 1)[1] for line in run["output"]] == ["LOGGED steps 1,2", "LOGGED steps 3"]
    assert run["exit_code"] == 0 and run["resumed"] == 1


@pytest.mark.verl  # verl's Tracking
def test_verl_tracking_logs_to_wandb(clean_env, wandb_key, tmp_path):
    config = {"trainer": {"project_name": PROJECT, "experiment_name": NAME}, "a": 1}
    with StandIn(api_key=wandb_key) as w:
        env = launcher_env(clean_env, w.url, tmp_path)
        # Most of the time is verl's import (torch); the run itself takes about a second.
        proc, _ = run_client(VERL_TRACKING, PROJECT, NAME, json.dumps(config),
                             json.dumps({1: METRICS[1], 2: METRICS[2]}), env=env, timeout=90)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "FINISHED" in proc.stdout

    assert w.unknown == [], f"wandb used endpoints the stand-in lacks: {w.unknown}"
    assert w.requests and all(authorized for _, _, authorized in w.requests), w.requests
    run = w.runs[RUN_ID]
    assert (run["entity"], run["project"], run["name"]) == (ENTITY, PROJECT, NAME)
    assert (run["group"], run["job_type"], run["config"]) == ("grp", "train", config)
    assert logged(run["history"]) == {1: METRICS[1], 2: METRICS[2]}
    assert run["exit_code"] == 0
    assert_key_not_recorded(w, wandb_key, tmp_path / "wandb-dir", Path(env["HOME"]))
