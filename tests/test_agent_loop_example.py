"""The examples of extending verl's traces (launcher/examples/), with verl's own tracing code and
the real weave client against the W&B stand-in, in a subprocess as an agent-loop worker is:
- CheckedAgentLoop's own traced step, ``check_answer``: the calculator's calls nested in it, the
  run's reward function scoring there (its output holds the reward), the trajectory's attributes
  on every call; a check that raises is recorded as that call's exception;
- trace_outside: verl's ``rollout_trace_attr`` around tool calls made outside any agent-loop
  worker gives them the run's step, sample and rollout attributes;
- check imports the registered loop (recipes/agents/checked.yaml).
The loop's ``run`` with vLLM is the sandbox's (tests/test_verl_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES
from wandb_standin import StandIn

pytestmark = pytest.mark.verl  # the example loop is verl's AgentLoopBase; check imports it with verl

ROOT = Path(__file__).resolve().parent.parent
PROJECT, EXPERIMENT = "team/examples", "examples-exp"

CHECKER = """
import asyncio, json, sys
from omegaconf import OmegaConf
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr
from launcher.examples.agent_loop import CheckedAgentLoop
import weave


RolloutTraceConfig.init(sys.argv[1], sys.argv[2], "weave", token2text=False)
loop = CheckedAgentLoop.__new__(CheckedAgentLoop)  # its check alone: no vLLM server needed here
loop.config = OmegaConf.create({"reward": {"custom_reward_function": {"path": sys.argv[3], "name": "compute_score"}}})

async def main():
    out = []
    with rollout_trace_attr(step=3, sample_index=5, rollout_n=1):
        out.append(await loop.check_answer("What is 6 * 34?", "6 * 34 = 204 #### 204", "204", "openai/gsm8k", {}))
    with rollout_trace_attr(step=3, sample_index=6, rollout_n=0):
        out.append(await loop.check_answer("What is 7 - 9?", "I think 3", "-2", "openai/gsm8k", {}))
        try:
            await loop.check_answer("Name a colour.", "red", "red", "x", {})
        except ValueError as e:
            out.append(str(e))
    return out

print("OUT " + json.dumps(asyncio.run(main())))
weave.finish()
"""


def _env(url: str, key: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "WEAVE_", "WF_"))}
    return dict(env, WANDB_BASE_URL=url, WANDB_API_KEY=key, WANDB_ERROR_REPORTING="false",
                WEAVE_HTTP_TIMEOUT="10", PYTHONPATH=str(ROOT))


def _run(args: list, env: dict) -> str:
    proc = subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_example_loops_own_step_is_traced_with_the_calculator_inside_and_scores_there(wandb_key):
    with StandIn(api_key=wandb_key) as w:
        out = _run(["-c", CHECKER, PROJECT, EXPERIMENT, str(ROOT / "launcher" / "smoke_reward.py")],
                   _env(w.url, wandb_key))
        assert w.wait_for(lambda s: len(s.calls_named("CheckedAgentLoop.check_answer")) == 3, timeout=30)
        checks = sorted(w.calls_named("CheckedAgentLoop.check_answer"), key=lambda c: c["started_at"])
        by_id = {c["id"]: c for c in w.calls}
    right, wrong, refused = json.loads(out.split("OUT ", 1)[1].splitlines()[0])
    assert right == {"expression": "6 * 34", "calculator": "204", "answer": "204", "agrees": True, "reward": 1.0,
                     "reward_extra_info": {"acc": 1.0}}  # as verl's naive reward manager gives it
    assert wrong["calculator"] == "-2" and wrong["answer"] is None and wrong["agrees"] is False
    assert 0 < wrong["reward"] < 1  # the smoke reward's partial credit: the run's own function scored it
    assert refused == "no arithmetic question to check in 'Name a colour.'"
    assert [c["output"] for c in checks[:2]] == [right, wrong]
    assert checks[2]["output"] is None and "no arithmetic question" in (checks[2]["exception"] or "")
    for c, (sample, rollout) in zip(checks, [(5, 1), (6, 0), (6, 0)]):
        a = c["attributes"]
        assert (a["step"], a["sample_index"], a["rollout_n"], a["experiment_name"]) == (3, sample, rollout, EXPERIMENT)
    for c in checks[:2]:  # the calculator's calls sit inside the check, evaluate inside execute
        execute = [x for x in by_id.values() if x["parent_id"] == c["id"]]
        assert [x["short_name"].rsplit(".", 2)[-2:] for x in execute] == [["CalculatorTool", "execute"]], execute
        inner = [x for x in by_id.values() if x["parent_id"] == execute[0]["id"]]
        assert [x["short_name"].endswith("CalculatorTool.evaluate") for x in inner] == [True]
        assert inner[0]["attributes"]["sample_index"] == c["attributes"]["sample_index"]


def test_tool_calls_outside_a_worker_carry_the_runs_attributes_through_rollout_trace_attr(wandb_key):
    with StandIn(api_key=wandb_key) as w:
        out = _run(["-m", "launcher.examples.trace_outside", PROJECT, EXPERIMENT, "(3 + 4) * 6"], _env(w.url, wandb_key))
        assert w.wait_for(lambda s: len(s.calls_named("CalculatorTool.evaluate")) == 1, timeout=30)
        calls = list(w.calls)
    assert json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) == {"text": "42", "reward": 1.0}
    (execute,) = [c for c in calls if c["short_name"].endswith("CalculatorTool.execute")]
    (evaluate,) = [c for c in calls if c["short_name"].endswith("CalculatorTool.evaluate")]
    assert execute["parent_id"] is None and evaluate["parent_id"] == execute["id"]
    for c in (execute, evaluate):
        a = c["attributes"]
        assert (a["step"], a["sample_index"], a["rollout_n"], a["experiment_name"], a["validate"]) == \
            (7, 3, 1, EXPERIMENT, False), a
        assert (c["entity"], c["project"]) == tuple(PROJECT.split("/"))


def test_check_imports_the_registered_example_loop(cli, clean_env, tmp_path):
    agents = "verl.overrides.actor_rollout_ref.rollout.agent.agent_loop_config_path"
    env = dict(clean_env, PYTHONPATH=str(ROOT))
    ok = cli("check", RECIPES / "gsm8k-grpo.yaml", f"runtime.python={sys.executable}",
             f"{agents}={RECIPES / 'agents' / 'checked.yaml'}", env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "agents.yaml"
    bad.write_text((RECIPES / "agents" / "checked.yaml").read_text().replace("CheckedAgentLoop", "CheckedAgentLop"))
    refused = cli("check", RECIPES / "gsm8k-grpo.yaml", f"runtime.python={sys.executable}", f"{agents}={bad}",
                  env=env, timeout=300)
    assert refused.returncode == 2 and "CheckedAgentLop does not import" in refused.stderr, refused.stderr
