"""Weave traces from every node, end to end on the sandbox: a 2-node job whose payload runs
verl's real tracing code (RolloutTraceConfig.init with the weave backend, rollout_trace_attr,
rollout_trace_op methods, the example tool) in Ray actors on each node, against a stand-in
for W&B on the sandbox bridge. And the in-job reachability check's outcomes."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

import launcher
from conftest import RECIPES, as_process_env, submit_json
from sandbox_procs import job_processes
from wandb_standin import StandIn


BRIDGE = "169.254.77.1"  # the host's side of the sandbox's bridge: the nodes reach it
NODE_IPS = {"169.254.77.11", "169.254.77.12"}
STEPS = 5  # W&B steps the demo logs from a Ray actor, as verl's trainer does


def _submit(cli, sandbox, clean_env, tmp_path, url, *overrides) -> dict:
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    return submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "wandb.entity=team", f"wandb.base_url={url}",
                           "wandb.reach_timeout=5", "verl.overrides.demo.trace=true", *overrides, "--json",
                           env=env, timeout=300))


def _phases(run_dir: str) -> list:
    return [json.loads(x)["phase"] for x in Path(run_dir, "phases.jsonl").read_text().splitlines()]


def test_every_node_traces_to_weave_with_the_key_project_and_attributes(cli, sandbox, clean_env, tmp_path,
                                                                        wandb_key):
    with StandIn(host=BRIDGE, api_key=wandb_key) as w:
        info = _submit(cli, sandbox, clean_env, tmp_path, w.url, f"verl.overrides.demo.wandb_steps={STEPS}")
        state = sandbox.wait(info["job_id"], timeout=300)
        out = Path(info["stdout"]).read_text()
        assert state == "COMPLETED", out[-3000:]
        wandb_runs = dict(w.runs)
        assert "wandb-check" in _phases(info["run_dir"])
        assert all(ok for _, _, ok in w.requests), [r for r in w.requests if not r[2]]
        runs = w.calls_named("DemoAgentLoop.run")
        tools = w.calls_named("CalculatorTool.execute")
        nested = w.calls_named("CalculatorTool.evaluate")
        assert len(runs) == len(tools) == len(nested) == 4, [c["short_name"] for c in w.calls]  # 2 nodes x 2
        assert {c["client"] for c in runs} == NODE_IPS  # from both nodes
        for c in runs + tools + nested:
            assert (c["entity"], c["project"], c["auth_ok"]) == ("team", "verl-launch-demo", True)
            a = c["attributes"]
            assert a["step"] == 1 and a["rollout_n"] in (0, 1) and a["sample_index"] in (0, 1), a
            assert a["experiment_name"] == "sandbox-demo"
        # The tool's calls sit inside their trajectory's trace, with its attributes.
        by_id = {c["id"]: c for c in w.calls}
        for t in tools:
            parent = by_id[t["parent_id"]]
            assert parent["short_name"].endswith("DemoAgentLoop.run")
            assert {k: parent["attributes"][k] for k in ("step", "sample_index", "rollout_n")} == \
                   {k: t["attributes"][k] for k in ("step", "sample_index", "rollout_n")}
        assert all(c["output"] and c["output"]["reward"] == 1.0 for c in runs)
    report = json.loads(Path(info["run_dir"], "demo-report.r0.json").read_text())
    assert sorted(t["hostname"] for t in report["traced"]) == ["node1", "node2"]
    # W&B's end of the run: verl's Tracking in an actor on the worker node, never finished, ended
    # by Ray with the driver: the job's service there sent every step and finished the run with
    # the job's exit code (without it: no rows, no exit code; ../shared/reference/wandb-tail)
    logged = report["wandb_logged"]
    assert logged["node"] == "169.254.77.12"
    (run,) = [r for r in wandb_runs.values() if r["name"] == "sandbox-demo"]
    assert [(h["_step"], h["demo/loss"]) for h in run["history"]] == \
        [(int(k), v) for k, v in logged["steps"].items()] and len(run["history"]) == STEPS
    assert run["exit_code"] == 0 and run["ends"] == [0], run["ends"]
    said = Path(info["run_dir"], "logs", "wandb-service.r0.log").read_text()
    for node in ("node1", "node2"):  # each node's service, in a log of their own (not Ray's)
        assert re.search(rf"wandb on {node}: finished its runs with exit code 0 in [0-9.]+ s", said), said[-2000:]
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    online = cli("sync", info["job_id"], env=env)  # W&B has it all: a sync would send every row again
    assert online.returncode == 2 and "the run logged to W&B online" in online.stderr, online.stderr


@pytest.mark.sandbox_shared
def test_an_unanswering_wandb_fails_the_job_fast_and_says_why(cli, sandbox, clean_env, tmp_path, wandb_key):
    with StandIn(host=BRIDGE, api_key=wandb_key, mode="silent") as w:
        info = _submit(cli, sandbox, clean_env, tmp_path, w.url)
        assert sandbox.wait(info["job_id"], timeout=180) == "FAILED"
    out = Path(info["stdout"]).read_text()
    assert "did not answer within 5 s" in out and "trace.on_unreachable=disable" in out
    phases = _phases(info["run_dir"])
    assert "wandb-check" in phases and "head-up" not in phases  # while Ray was starting: stopped
    assert not job_processes(info["job_id"])
    assert wandb_key not in out
    never = cli("sync", info["job_id"], env=sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state"))))
    assert never.returncode == 2 and "the run never logged to W&B: no offline-run-" in never.stderr, never.stderr


@pytest.mark.sandbox_shared
def test_an_unanswering_wandb_can_disable_tracing_instead_and_sync_sends_the_metrics_later(
        cli, sandbox, clean_env, tmp_path, wandb_key, monkeypatch):
    """W&B silent at the job's start: tracing is disabled and verl's W&B metrics stay offline in the
    run directory, complete (the node's W&B service finished them). Once W&B answers (here: the
    stand-in, up on the same address), `sync` sends them, once: a second sync sends nothing. While
    the job runs, sync is refused, or waits with --wait; no key: exit 2 naming where keys are."""
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    with StandIn(host=BRIDGE, api_key=wandb_key, mode="silent") as w:
        info = _submit(cli, sandbox, clean_env, tmp_path, w.url, "trace.on_unreachable=disable",
                       f"verl.overrides.demo.wandb_steps={STEPS}", "verl.overrides.demo.hold=10")
        port, job = w.port, info["job_id"]
        deadline = time.monotonic() + 180
        phases = Path(info["run_dir"], "phases.jsonl")
        while not (phases.exists() and "trace-disabled" in _phases(info["run_dir"])):
            if time.monotonic() > deadline:  # say what was waited for, not a later assertion's puzzle
                pytest.fail(f"no trace-disabled phase within 180 s; phases: {_phases(info['run_dir']) if phases.exists() else 'none'}")
            time.sleep(0.5)
        early = cli("sync", job, env=env)
    assert early.returncode == 2 and f"job {job} is RUNNING" in early.stderr and "--wait" in early.stderr, early.stderr
    no_key = {k: v for k, v in env.items() if k != "WANDB_API_KEY"}
    waited = cli("sync", job, "--wait", env=no_key, timeout=300)  # waits for the end, then finds no key
    assert waited.returncode == 2 and "no W&B API key to sync with: $WANDB_API_KEY, wandb.api_key_file, or ~/.netrc" \
        in waited.stderr, waited.stderr
    assert sandbox.wait(job, timeout=10) == "COMPLETED"
    out = Path(info["stdout"]).read_text()
    assert "tracing disabled" in out and "trace-disabled" in _phases(info["run_dir"])
    assert f"verl-launch sync {job}" in out
    report = json.loads(Path(info["run_dir"], "demo-report.r0.json").read_text())
    assert report["overrides"]["actor_rollout_ref.rollout.trace.backend"] is None
    assert {t["backend"] for t in report["traced"]} == {None}  # nothing was traced, nothing hung
    offline = list(Path(info["run_dir"], "wandb").glob("offline-run-*"))
    assert len(offline) == 1, offline
    st = cli("status", job, env=env).stdout
    assert f"W&B sync   1 offline W&B run record not yet synced: verl-launch sync {job}" in st, st

    with StandIn(host=BRIDGE, port=port, api_key=wandb_key) as w:
        sent = cli("sync", job, "--json", env=env, timeout=300)
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["synced"] == [str(offline[0])]
        (run,) = w.runs.values()
        logged = report["wandb_logged"]["steps"]
        assert [(h["_step"], h["demo/loss"]) for h in run["history"]] == [(int(k), v) for k, v in logged.items()]
        assert run["name"] == "sandbox-demo" and run["ends"] == [0], run["ends"]
        asked = len(w.requests)
        again = cli("sync", job, env=env)
        assert again.returncode == 0 and "nothing new to send" in again.stdout, again.stdout + again.stderr
        assert len(w.requests) == asked and len(run["history"]) == STEPS  # nothing sent twice
        as_process_env(monkeypatch, env)  # the Python API itself says the same (the CLI prints it)
        assert launcher.Run(job, info["run_dir"]).sync() == \
            {"run_id": json.loads(sent.stdout)["run_id"], "synced": [], "already": [str(offline[0])]}
        assert len(w.requests) == asked
    assert "W&B sync" not in cli("status", job, env=env).stdout
    for f in Path(info["run_dir"]).rglob("*"):  # wandb's files included: the key is in none
        assert not f.is_file() or wandb_key.encode() not in f.read_bytes(), f
    assert wandb_key not in sent.stdout + sent.stderr + waited.stderr
