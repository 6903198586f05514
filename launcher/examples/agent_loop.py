"""An example custom verl agent loop, traced: a step of its own and its reward in each trajectory.

verl's single-turn loop, then ``check_answer``, a method of its own marked with verl's
``rollout_trace_op``: the example calculator tool (launcher/examples/calculator_tool.py, itself
traced) works out the question's arithmetic, the response's "#### N" is read, and the trajectory
is scored there, with the run's own reward function (``reward.custom_reward_function``, else
verl's default), so that Weave shows the reward inside the trajectory: in verl 0.9.1's own
loops the reward is computed after the traced ``run`` has returned, and ``traces`` shows ``-``.
verl then keeps that score (it scores only trajectories without one).

Each trajectory traced shows ``CheckedAgentLoop.run`` (the root: ``run`` is overridden, so it is
marked again, the base class's mark being lost on override), verl's own
``SingleTurnAgentLoop.run`` with its ``generate`` inside, and ``CheckedAgentLoop.check_answer``
with the calculator's calls inside and what it found; all carry the trajectory's step,
sample_index, rollout_n and experiment_name.

A check that raises (a question with no arithmetic in it, say) is recorded in its trace, as the
exception of that call, and the trajectory goes on: verl scores it as for its own loops.

Registered through verl's ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
(``recipes/agents/checked.yaml``); a dataset row picks it by its ``agent_name`` column
(``checked_agent``), or every row does with
``actor_rollout_ref.rollout.agent.default_agent_loop=checked_agent``. verl imports the class in
every agent-loop worker, a Ray actor on any node: this module must import there (verl-launch
installed in the nodes' environment, or the project on their PYTHONPATH as the sandbox recipes
put it); `check` imports it with runtime.python first.
"""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any, Optional

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.utils.rollout_trace import rollout_trace_op

from launcher.examples.calculator_tool import CalculatorTool

logger = logging.getLogger(__name__)
_QUESTION = re.compile(r"What is ([-+*/().\d\s]+)\?")
_ANSWER = re.compile(r"####\s*(-?[\d.,]+)")


class CheckedAgentLoop(SingleTurnAgentLoop):
    """SingleTurnAgentLoop, then ``check_answer`` (traced), which scores the trajectory."""

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        response = self.tokenizer.decode(output.response_ids, skip_special_tokens=True)
        extra = kwargs.get("extra_info") or {}
        question = extra.get("question") or _user_text(kwargs.get("raw_prompt"))
        try:
            checked = await self.check_answer(question, response, (kwargs.get("reward_model") or {}).get("ground_truth"),
                                              kwargs.get("data_source"), extra)
        except Exception as e:  # noqa: BLE001 - its trace holds the exception; verl scores this one
            logger.warning("check_answer failed (%s: %s): verl scores the trajectory", type(e).__name__, e)
            return output
        output.reward_score = checked["reward"]
        # as verl's reward managers give it (naive: the score as "acc"), so that a batch mixing this
        # loop's trajectories with those verl scores has the same reward_extra_info keys
        output.extra_fields["reward_extra_info"] = checked["reward_extra_info"]
        return output

    @rollout_trace_op
    async def check_answer(self, question: str, response: str, ground_truth: Optional[str], data_source: Optional[str],
                           extra_info: dict) -> dict:
        """What the calculator makes of QUESTION's arithmetic, the answer RESPONSE gives, and
        the run's reward for it."""
        m = _QUESTION.search(question or "")
        if not m:
            raise ValueError(f"no arithmetic question to check in {question!r}")
        tool = CalculatorTool(config={"type": "native"}, tool_schema=None)
        instance, _ = await tool.create()
        try:
            result, _, _ = await tool.execute(instance, {"expression": m.group(1).strip()})
        finally:
            await tool.release(instance)
        answers = _ANSWER.findall(response or "")
        answer = answers[-1].replace(",", "") if answers else None
        reward, info = await _score(self.config, data_source, response, ground_truth, extra_info)
        return {"expression": m.group(1).strip(), "calculator": result.text, "answer": answer,
                "agrees": answer is not None and answer == result.text.strip(), "reward": reward,
                "reward_extra_info": info}


_REWARD_FNS: dict = {}


async def _score(config, data_source, response, ground_truth, extra_info) -> tuple:
    """The run's reward, reward.custom_reward_function (loaded once a process) else verl's default,
    and its reward_extra_info as verl's naive reward manager makes it: a dict's items, or "acc"."""
    key = id(config)
    if key not in _REWARD_FNS:
        from verl.trainer.ppo.reward import get_custom_reward_fn
        from verl.utils.reward_score import default_compute_score

        _REWARD_FNS[key] = get_custom_reward_fn(config) or default_compute_score
    score = _REWARD_FNS[key](data_source=data_source, solution_str=response, ground_truth=ground_truth,
                             extra_info=extra_info)
    if inspect.isawaitable(score):  # a reward function may be async: verl awaits those too
        score = await score
    if isinstance(score, dict):
        return float(score["score"]), dict(score)
    return float(score), {"acc": score}


def _user_text(messages) -> str:
    for m in reversed(list(messages or [])):
        if isinstance(m, dict) and m.get("role") == "user":
            return str(m.get("content") or "")
    return ""
