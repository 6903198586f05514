"""Tracing outside verl's agent-loop worker, as users do in an evaluation script or a tool's own
test: verl's ``rollout_trace_attr`` gives every call inside it the attributes the worker would
(step, sample_index, rollout_n, experiment_name, validate), so Weave files it beside the run's
trajectories and ``verl-launch traces`` filters reach it. Without it, a ``rollout_trace_op``
method outside a trajectory is not traced at all.

    WANDB_API_KEY=... python -m launcher.examples.trace_outside PROJECT EXPERIMENT "(3 + 4) * 6"

Prints what the tool answered and the reward; the calls ``CalculatorTool.execute`` and, nested,
``CalculatorTool.evaluate`` go to Weave under PROJECT, marked step 7, sample 3, rollout 1.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def run(expression: str, truth) -> tuple:
    from verl.utils.rollout_trace import rollout_trace_attr

    from launcher.examples.calculator_tool import CalculatorTool

    tool = CalculatorTool(config={"type": "native"}, tool_schema=None)
    with rollout_trace_attr(sample_index=3, step=7, rollout_n=1):
        instance_id, _ = await tool.create(ground_truth=truth)
        response, reward, _ = await tool.execute(instance_id, {"expression": expression})
    return response.text, reward


def main(argv=None) -> int:
    import weave
    from verl.utils.rollout_trace import RolloutTraceConfig

    project, experiment, expression = (argv or sys.argv[1:]) + ["(3 + 4) * 6"] * (3 - len(argv or sys.argv[1:]))
    RolloutTraceConfig.init(project, experiment, "weave", token2text=False)  # weave.init, once a process
    text, reward = asyncio.run(run(expression, 42))
    weave.finish()  # flush the call batch before the process exits
    print("RESULT " + json.dumps({"text": text, "reward": reward}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
