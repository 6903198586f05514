"""An example custom verl tool whose calls show up in Weave rollout traces.

This is the "extend the traces with your own ops" example from W&B's verl/Weave docs: a
tool that overrides ``execute`` must decorate it with verl's ``rollout_trace_op`` again
(the base class's decoration is lost on override), and any helper decorated the same way
appears as a nested call under it. Here ``execute`` calls the traced ``evaluate``, so a
trace shows ``CalculatorTool.execute`` -> ``CalculatorTool.evaluate``, each carrying the
trajectory's ``step`` / ``sample_index`` / ``rollout_n`` / ``experiment_name`` attributes.

Use it with ``recipes/tools/calculator.yaml`` as
``actor_rollout_ref.rollout.multi_turn.tool_config_path``. verl imports the class by its
dotted name inside every agent-loop worker, a Ray actor on any node: this module must be
importable there, i.e. verl-launch installed in the job's environment on every node, or
the file copied into a package of your own (then change ``class_name`` to match).

The expression is parsed with ``ast`` and only numbers, + - * / ** and parentheses are
evaluated: a model's tool call is untrusted text and never reaches ``eval``.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# Bounds that keep "9**9**9" or a megabyte of digits from stalling a rollout worker.
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e100

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. (3 + 4) * 6"},
            },
            "required": ["expression"],
        },
    },
}


class UnsafeExpression(ValueError):
    """The expression uses something other than numbers and the allowed operators."""


def safe_eval(expression: str) -> float | int:
    """Evaluate arithmetic only; raise UnsafeExpression (or ZeroDivisionError) otherwise."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise UnsafeExpression(f"expression must be a string of at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"not an arithmetic expression: {e.msg}") from None
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> float | int:
    # bool is an int subclass: True + True is not arithmetic a model should rely on.
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise UnsafeExpression(f"exponent larger than {MAX_EXPONENT}")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise UnsafeExpression("result out of range")
        return result
    # Names, calls, attributes, subscripts, strings...: refused, never evaluated.
    raise UnsafeExpression(f"{type(node).__name__} is not allowed")


class CalculatorTool(BaseTool):
    """Evaluates ``expression``; reward 1.0 when the result equals the instance's ground truth."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        # BaseTool.__init__ calls this when the tool config has no tool_schema.
        return OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)

    async def create(self, instance_id: str | None = None, ground_truth: Any = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        # verl's ToolAgentLoop passes the dataset row's tools_kwargs as create_kwargs=...
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = {"ground_truth": ground_truth, "result": None}
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs) -> tuple[ToolResponse, float, dict]:
        state = self._instances.setdefault(instance_id, {"ground_truth": None, "result": None})
        expression = parameters.get("expression", "")
        try:
            state["result"] = self.evaluate(expression)
        except (UnsafeExpression, ZeroDivisionError, OverflowError) as e:
            state["result"] = None
            return ToolResponse(text=f"Error: {e}"), 0.0, {"error": type(e).__name__}
        reward = await self.calc_reward(instance_id)
        return ToolResponse(text=str(state["result"])), reward, {}

    @rollout_trace_op
    def evaluate(self, expression: str) -> float | int:
        """Traced separately so the trace shows the expression and its value as a child call."""
        return safe_eval(expression)

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instances.get(instance_id) or {}
        result, truth = state.get("result"), state.get("ground_truth")
        if result is None or truth is None:
            return 0.0
        try:
            return 1.0 if math.isclose(float(result), float(truth), rel_tol=1e-9, abs_tol=1e-9) else 0.0
        except (TypeError, ValueError):   # a ground truth that is not a number
            return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)
