"""The suite's one traced training run (issue 64: one verl start for every traced assertion).
recipes/sandbox-tool-agent.yaml on the real sandbox: verl's legacy trainer, async-rollout GRPO with
vLLM's CPU build on 2 nodes, Weave and W&B against the loopback stand-in, no checkpoint. Its rows
pick their agent loop, one loop per agent-loop worker and step (launcher/tool_assets.TRAIN_AGENTS):
verl's ToolAgentLoop calling a tool that raises now and then (tests/tools/faulty_calculator.py),
the example loop (launcher/examples/agent_loop.py) and verl's single turn, all with the
tool-calling model. Around it: verl's file logger beside W&B, an outsider at Ray's door while
it trains (tests/ray_intruder.py), and two busy processes from its last step on.

conftest's `traced` fixture runs it once a session; tests/test_verl_job.py (training, Ray, W&B,
traces, the example loop) and tests/test_tool_agent_job.py (the tool's calls) read it, never
change it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from conftest import RECIPES, ROOT
from ray_intruder import Intruder
from verl_train import BRIDGE, Busy, job_env, train
from wandb_standin import StandIn

RECIPE = RECIPES / "sandbox-tool-agent.yaml"
EXPERIMENT = "sandbox-tool-agent"  # the recipe's wandb.experiment
FAULTY = ROOT / "tests" / "tools" / "faulty-calculator.yaml"
STEPS = 2  # the recipe's trainer.total_training_steps
FILE_LOG = "verl-file-logger.jsonl"  # verl's file logger (VERL_FILE_LOGGER_PATH), in the run's tmp


def faulty_tool() -> list:
    """The faulty tool, importable on the nodes through the recipe's environment (PYTHONPATH: the
    project and the CPU platform, as shipped, and tests/tools)."""
    path = f"{ROOT}:{ROOT}/tests/cpu_platform:{FAULTY.parent}"
    return [f"verl.overrides.actor_rollout_ref.rollout.multi_turn.tool_config_path={FAULTY}", f"env.PYTHONPATH={path}"]


def check(job, cli) -> str:
    """`check`'s report of the run's recipe, as the run had it (its estimates)."""
    est = cli("check", RECIPE, f"runtime.python={sys.executable}", "wandb.entity=team", *faulty_tool(), env=job.env)
    assert est.returncode == 0, est.stderr
    return est.stdout


def _ray_sessions() -> set:
    return set(Path("/tmp/ray").glob("session_2*")) if Path("/tmp/ray").is_dir() else set()


def run(node_python, smoke_assets, wandb_key, tmp: Path, slurm_env):
    """Submit it (`submit --wait`) and yield what it left, its stand-in still up: `traces` reads
    the trajectories back from it."""
    env = slurm_env(job_env(os.environ, wandb_key=wandb_key, smoke=smoke_assets, tmp=tmp))
    before = _ray_sessions()
    busy = Busy(at=STEPS - 1)  # the last step and the end under load, as on CI's machine
    with StandIn(host=BRIDGE, api_key=wandb_key) as w:
        intruder = Intruder(env)
        try:
            job = train(node_python=node_python, runs=tmp / "runs", env=env, timeout=900, standin=w, watch_gcs=True,
                        during=lambda run_dir, first: (intruder(run_dir, first), busy(run_dir, first)),
                        recipe=RECIPE, overrides=[*faulty_tool(), "verl.overrides.trainer.logger=[console,file]",
                                                  f"+env.VERL_FILE_LOGGER_PATH={tmp / FILE_LOG}"])
        finally:
            busy.stop()
        job.intruder, job.busy, job.standin = intruder, busy, w
        job.env, job.tmp, job.new_ray_sessions = env, tmp, _ray_sessions() - before
        (tmp / "calls.json").write_text(json.dumps(job.calls, default=str))  # to read when a test fails
        assert job.run_dir is not None, job.out + job.err
        yield job
