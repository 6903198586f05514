"""Weave traces from every node, end to end on the sandbox: a 2-node job whose payload runs
verl's real tracing code (RolloutTraceConfig.init with the weave backend, rollout_trace_attr,
rollout_trace_op methods, the example tool) in Ray actors on each node, against a stand-in
for W&B on the sandbox bridge. And the in-job reachability check's outcomes."""

from __future__ import annotations

import json
import sys
from pathlib import Path


from conftest import RECIPES, submit_json
from sandbox_procs import job_processes
from wandb_standin import StandIn


BRIDGE = "169.254.77.1"  # the host's side of the sandbox's bridge: the nodes reach it
NODE_IPS = {"169.254.77.11", "169.254.77.12"}


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
        info = _submit(cli, sandbox, clean_env, tmp_path, w.url)
        state = sandbox.wait(info["job_id"], timeout=300)
        out = Path(info["stdout"]).read_text()
        assert state == "COMPLETED", out[-3000:]
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


def test_an_unanswering_wandb_can_disable_tracing_instead(cli, sandbox, clean_env, tmp_path, wandb_key):
    with StandIn(host=BRIDGE, api_key=wandb_key, mode="silent") as w:
        info = _submit(cli, sandbox, clean_env, tmp_path, w.url, "trace.on_unreachable=disable")
        state = sandbox.wait(info["job_id"], timeout=300)
        out = Path(info["stdout"]).read_text()
        assert state == "COMPLETED", out[-3000:]
    assert "tracing disabled" in out and "trace-disabled" in _phases(info["run_dir"])
    report = json.loads(Path(info["run_dir"], "demo-report.r0.json").read_text())
    assert report["overrides"]["actor_rollout_ref.rollout.trace.backend"] is None
    assert {t["backend"] for t in report["traced"]} == {None}  # nothing was traced, nothing hung
