"""Rollout traces reach W&B: verl's tracing + the real weave client against a loopback stand-in.

No Slurm and no mocks: verl's RolloutTraceConfig / rollout_trace_attr and weave 0.54 talk
HTTP to tests/wandb_standin.py exactly as they would to a W&B deployment.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from wandb_standin import StandIn

ROOT = Path(__file__).resolve().parent.parent
TOOL_CONFIG = ROOT / "recipes" / "tools" / "calculator.yaml"
PROJECT, EXPERIMENT, ENTITY = "trace-test", "exp-42", "team"

# One trajectory as verl's agent loop runs it: the attributes around it, the tool inside.
# A subprocess, because weave.init and RolloutTraceConfig are process-wide singletons.
TRACED_ROLLOUT = """
import asyncio, json, sys
import weave
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr
from launcher.examples.calculator_tool import CalculatorTool

project, experiment = sys.argv[1], sys.argv[2]
RolloutTraceConfig.init(project, experiment, "weave", token2text=False)

async def main():
    tool = CalculatorTool(config={"type": "native"}, tool_schema=None)
    with rollout_trace_attr(sample_index=3, step=7, rollout_n=1):
        instance_id, _ = await tool.create(ground_truth=42)
        response, reward, _ = await tool.execute(instance_id, {"expression": "(3 + 4) * 6"})
    return response.text, reward

text, reward = asyncio.run(main())
weave.finish()  # flush the call batch before the process exits
print("RESULT " + json.dumps({"text": text, "reward": reward}))
"""


def weave_env(clean_env: dict, url: str) -> dict:
    return {**clean_env, "WANDB_BASE_URL": url, "WANDB_ENTITY": ENTITY,
            "WANDB_ERROR_REPORTING": "false", "WEAVE_HTTP_TIMEOUT": "10",
            "PYTHONPATH": str(ROOT)}


@pytest.mark.verl  # verl's tracing and tool code
def test_tool_calls_are_traced_with_rollout_attributes(clean_env, wandb_key):
    with StandIn(api_key=wandb_key) as w:
        proc = subprocess.run([sys.executable, "-c", TRACED_ROLLOUT, PROJECT, EXPERIMENT],
                              env=weave_env(clean_env, w.url), cwd=ROOT, capture_output=True,
                              text=True, timeout=90, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.split("RESULT ", 1)[1])
        assert result == {"text": "42", "reward": 1.0}
        # weave.finish() flushed before exit, so the calls are in; the wait is a safety margin.
        assert w.wait_for(lambda s: s.calls_named("evaluate") and s.calls_named("execute"), 10), w.requests

    assert w.unknown == [], f"weave used endpoints the stand-in lacks: {w.unknown}"
    assert w.requests and all(authorized for _, _, authorized in w.requests), w.requests
    [execute] = w.calls_named("CalculatorTool.execute")
    [evaluate] = w.calls_named("CalculatorTool.evaluate")
    for call in (execute, evaluate):
        assert (call["entity"], call["project"], call["auth_ok"]) == (ENTITY, PROJECT, True)
        attrs = call["attributes"]
        assert {k: attrs.get(k) for k in ("step", "sample_index", "rollout_n", "experiment_name",
                                          "validate")} == {
            "step": 7, "sample_index": 3, "rollout_n": 1, "experiment_name": EXPERIMENT,
            "validate": False}
    # The helper is a child of execute in the same trace: the nesting W&B's docs describe.
    assert evaluate["parent_id"] == execute["id"] and evaluate["trace_id"] == execute["trace_id"]
    assert execute["inputs"]["parameters"] == {"expression": "(3 + 4) * 6"}
    assert evaluate["inputs"] == {"expression": "(3 + 4) * 6"} and evaluate["output"] == 42


def _post(url: str, headers: dict, body: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_standin_rejects_requests_without_the_key(wandb_key):
    good = "Basic " + base64.b64encode(f"api:{wandb_key}".encode()).decode()
    bad = "Basic " + base64.b64encode(b"api:local-" + b"0" * 40).decode()
    batch = {"batch": [{"id": "c1", "op_name": "leak", "attributes": {}, "inputs": {}, "output": 1}]}
    with StandIn(api_key=wandb_key) as w:
        url = f"{w.url}/traces/v2/{ENTITY}/{PROJECT}/calls/complete"
        assert _post(url, {}, batch) == 401
        assert _post(url, {"Authorization": bad}, batch) == 401
        assert _post(url, {"Authorization": good}, batch) == 200
    path = f"/traces/v2/{ENTITY}/{PROJECT}/calls/complete"
    assert w.requests == [("POST", path, False), ("POST", path, False), ("POST", path, True)]
    # Rejected calls are still recorded, marked, so a test can tell they were sent keyless.
    assert [c["auth_ok"] for c in w.calls] == [False, False, True]


def test_silent_standin_accepts_but_never_answers(wandb_key):
    with StandIn(api_key=wandb_key, mode="silent") as w:
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            urllib.request.urlopen(f"{w.url}/traces/server_info", timeout=0.5)


SANDBOX_HOST = "169.254.77.1"  # the host's address on the Slurm sandbox bridge


def test_standin_binds_the_address_sandbox_nodes_reach(wandb_key):
    try:
        w = StandIn(host=SANDBOX_HOST, api_key=wandb_key)
    except OSError:
        pytest.skip(f"{SANDBOX_HOST} is not on this host (the sandbox bridge is down)")
    auth = "Basic " + base64.b64encode(f"api:{wandb_key}".encode()).decode()
    with w:
        assert w.url.startswith(f"http://{SANDBOX_HOST}:")
        req = urllib.request.Request(f"{w.url}/traces/server_info", headers={"Authorization": auth})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.load(resp)["trace_server_version"]
    assert w.requests == [("GET", "/traces/server_info", True)]


@pytest.mark.verl  # verl's tracing and tool code
def test_tool_config_loads_with_verl_and_rewards_only_the_right_answer():
    import asyncio

    from verl.tools.tool_registry import initialize_tools_from_config

    from launcher.examples.calculator_tool import CalculatorTool

    [tool] = initialize_tools_from_config(str(TOOL_CONFIG))
    assert isinstance(tool, CalculatorTool) and tool.name == "calculator"
    assert tool.get_openai_tool_schema().model_dump() == tool.tool_schema.model_dump()

    async def run(expression, truth=42):
        # As verl's ToolAgentLoop calls it: the dataset's tools_kwargs as create_kwargs.
        instance_id, _ = await tool.create(create_kwargs={"ground_truth": truth})
        try:
            response, reward, metrics = await tool.execute(instance_id, {"expression": expression})
        finally:
            await tool.release(instance_id)
        return response.text, reward, metrics

    assert asyncio.run(run("(3 + 4) * 6")) == ("42", 1.0, {})
    assert asyncio.run(run("6 * 7.0", truth="42")) == ("42.0", 1.0, {})
    assert asyncio.run(run("2 ** -1 + -3", truth=-2.5))[1] == 1.0
    assert asyncio.run(run("41"))[:2] == ("41", 0.0)
    for hostile in ("__import__('os').system('true')", "(1).__class__", "9 ** 9 ** 9",
                    "1 / 0", "[1] * 10", "x + 1", "True + True", "'4' + '2'"):
        text, reward, metrics = asyncio.run(run(hostile))
        assert text.startswith("Error:") and reward == 0.0 and "error" in metrics, hostile


@pytest.mark.verl  # verl's tracing and tool code
def test_tool_works_without_a_schema_in_the_config(tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    config = tmp_path / "tools.yaml"
    config.write_text("tools:\n  - class_name: launcher.examples.calculator_tool.CalculatorTool\n"
                      "    config: {type: native}\n")
    [tool] = initialize_tools_from_config(str(config))
    assert tool.name == "calculator"
    assert tool.tool_schema.function.parameters.required == ["expression"]
