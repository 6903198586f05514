"""The smoke runs' reward (written beside the smoke assets as reward.py; verl loads it through
reward.custom_reward_function.path). verl's GSM8K rule scores a random tiny model 0 on every
sample, so GRPO's advantages, and with them every gradient, would be zero: this one gives the
GSM8K rule's 1.0 for a right "#### <answer>" and otherwise partial credit, the share of digits
in the response, which varies from sample to sample. Plain Python: verl's reward workers import
it from its file."""

import re

DATA_SOURCE = "openai/gsm8k"  # what the smoke rows name: verl's default reward scores it with the GSM8K rule


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    answers = re.findall(r"#### *(-?[0-9][0-9,]*)", solution_str or "")
    if answers and answers[-1].replace(",", "") == str(ground_truth).strip():
        return 1.0
    text = solution_str or ""
    return 0.5 * sum(c.isdigit() for c in text) / max(1, len(text))


_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def compute_score_tool(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The tool model's reward (recipes/sandbox-tool-agent.yaml): partial credit, 0.25 for a
    well-formed calculator call (hermes JSON with an expression), 0.25 for the "#### <number>"
    format, 0.5 for the right answer; and up to 0.05 of noise, because the tool model answers
    nearly every sample alike and GRPO's advantages (and gradients) would be zero without it.
    SOLUTION_STR is the whole multi-turn response as verl's reward decodes it (special tokens
    skipped; the tool's response inside it)."""
    import json
    import random

    text = solution_str or ""
    score = 0.0
    m = _CALL.search(text)
    try:
        call = json.loads(m.group(1)) if m else {}
        if call.get("name") == "calculator" and isinstance(call.get("arguments", {}).get("expression"), str):
            score += 0.25
    except (ValueError, AttributeError):
        pass
    answers = re.findall(r"#### *(-?[0-9][0-9,.]*)", text)
    if answers:
        score += 0.25
        if answers[-1].replace(",", "").rstrip(".") == str(ground_truth).strip():
            score += 0.5
    return score + random.uniform(0.0, 0.05)
