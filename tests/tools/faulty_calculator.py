"""TEST-ONLY: the example calculator with a fault, for the sandbox's tool-agent job
(tests/test_tool_agent_job.py): its evaluate raises on every other call that Weave traces in
each process (the first, the third, ...), an error the example's execute does not catch, so the
call raises out of `execute` as a broken tool's would. Only traced calls count: the recipe traces
one sample per agent-loop worker per step, both its rollouts, so in every worker one of each
step's two traced calls raises and the other answers, whatever the untraced samples do. verl's
ToolAgentLoop answers the model with the error and goes on; the trace records the exception.
The calls traced are the example's: CalculatorTool.execute, with this evaluate inside."""

import itertools

import weave
from verl.utils.rollout_trace import rollout_trace_op

from launcher.examples.calculator_tool import CalculatorTool, safe_eval

_traced = itertools.count(1)  # this process's traced calls of evaluate


class FaultyCalculator(CalculatorTool):
    @rollout_trace_op
    def evaluate(self, expression: str):
        # verl's rollout_trace_op opened this call in Weave only if the sample is traced
        if weave.get_current_call() is not None and next(_traced) % 2:
            raise RuntimeError("the calculator is broken on every other call (a test fault)")
        return safe_eval(expression)
