"""TEST-ONLY: the example calculator with a fault, for the sandbox's tool-agent job
(tests/test_tool_agent_job.py): its evaluate raises on every other call in each process (the
first, the third, ...), an error the example's execute does not catch, so the call raises out of
`execute` as a broken tool's would. Every agent-loop worker that calls the tool at all sees it
raise. verl's ToolAgentLoop answers the model with the error and goes on; the trace records the
exception. The calls traced are the example's: CalculatorTool.execute, with this evaluate inside."""

import itertools

from verl.utils.rollout_trace import rollout_trace_op

from launcher.examples.calculator_tool import CalculatorTool, safe_eval

_calls = itertools.count(1)  # this process's calls of evaluate


class FaultyCalculator(CalculatorTool):
    @rollout_trace_op
    def evaluate(self, expression: str):
        if next(_calls) % 2:
            raise RuntimeError("the calculator is broken on every other call (a test fault)")
        return safe_eval(expression)
