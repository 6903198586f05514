"""The smoke assets' tool model (launcher/tool_assets.py) where verl will run it: vLLM's CPU build
samples it at temperature 1, verl's own hermes parser reads its first turns as calculator calls,
and verl's ToolAgentLoop runs the real calculator tool and ends with the model's answer. One
process in the node environment (tests/tool_model_probe.py), no Ray, no trainer: the loop on the
sandbox is the tool-agent job's."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, once_per_run
from verl_train import VLLM_CACHE

EPISODES = 50  # 90% of 50 still tells a taught model from one that is not (CI's time)


@pytest.fixture(scope="session")  # not "module": under xdist a worker tore the probe down between
# this module's tests and ran it again (a clean clone's make test, 54-182 s each time)
def episodes(node_python, smoke_assets, tmp_path_factory) -> list:
    return once_per_run(tmp_path_factory, "tool-model-episodes", lambda: _episodes(node_python, smoke_assets))


def _episodes(node_python, smoke_assets) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "VLLM_", "PYTHONPATH"))}
    env.update(PYTHONPATH=f"{ROOT}:{ROOT / 'tests' / 'cpu_platform'}", VERL_PLATFORM="cpu",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", WANDB_ERROR_REPORTING="false",  # weave would report to its error service
               VLLM_CACHE_ROOT=str(VLLM_CACHE),  # what the training jobs learnt of the model class
               VLLM_ENABLE_V1_MULTIPROCESSING="0")  # offline: no engine-core process importing it all again
    proc = subprocess.run([str(node_python), str(ROOT / "tests" / "tool_model_probe.py"), str(smoke_assets),
                           str(ROOT / "recipes" / "tools" / "calculator.yaml"), str(EPISODES)],
                          env=env, cwd="/tmp", capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@probe ")]  # vLLM prints too
    assert said, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(said[0][len("@@probe "):])["episodes"]


def test_vllm_samples_calculator_calls_that_verls_hermes_parser_reads(episodes):
    """At temperature 1, at least 90% of the first turns parse as a calculator call whose JSON
    arguments hold an expression."""
    assert len(episodes) == EPISODES
    read = [e for e in episodes if e["call"] == "calculator" and isinstance(e["expression"], str)]
    assert len(read) >= 0.9 * EPISODES, [e["first"] for e in episodes if e not in read][:5]


def test_verls_tool_agent_loop_runs_the_calculator_and_ends_with_an_answer(episodes):
    """Call, the tool's response (the calculator's result, not an error), then the answer: two
    assistant turns and a user turn, the tool's tokens masked out of the loss."""
    done = []
    for e in episodes:
        tool = re.search(r"<tool_response>\n(.*?)\n</tool_response>", e["response"], re.S)
        if e["call"] and e["num_turns"] == 4 and tool and re.fullmatch(r"-?\d+(\.\d+)?", tool.group(1)) \
                and re.search(r"#### *-?\d", e["response"].split("</tool_response>")[-1]):
            done.append(e)
            # the loss masks exactly the tool's turn: one run of zeros between the two assistant
            # turns, holding the tool's response and nothing the model wrote
            assert re.fullmatch(r"1+0+1+", e["mask"]), e["mask"]
            assert f"<tool_response>\n{tool.group(1)}\n</tool_response>" in e["masked"], e["masked"]
            assert "<tool_call>" in e["unmasked"] and "<tool_response>" not in e["unmasked"], e["unmasked"]
            assert re.search(r"#### *-?\d", e["unmasked"]), e["unmasked"]
    assert len(done) >= 0.9 * EPISODES, [e["response"] for e in episodes if e not in done][:5]
    # The tool's reward: it compares its own result with the row's ground truth (tools_kwargs).
    assert any(e["tool_rewards"] == [1.0] for e in done), [e["tool_rewards"] for e in done][:5]
