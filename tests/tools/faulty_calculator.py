"""TEST-ONLY: the example calculator with a fault, for the sandbox's tool-agent job
(tests/test_tool_agent_job.py): its evaluate raises on a multiplication, an error the example's
execute does not catch, so the call raises out of `execute` as a broken tool's would. verl's
ToolAgentLoop answers the model with the error and goes on; the trace records the exception.
The calls traced are the example's: CalculatorTool.execute, with this evaluate inside."""

from verl.utils.rollout_trace import rollout_trace_op

from launcher.examples.calculator_tool import CalculatorTool, safe_eval


class FaultyCalculator(CalculatorTool):
    @rollout_trace_op
    def evaluate(self, expression: str):
        if "*" in str(expression):
            raise RuntimeError("the calculator's multiplier is broken (a test fault)")
        return safe_eval(expression)
