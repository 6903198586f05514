"""The smoke runs' reward (written beside the smoke assets as reward.py; verl loads it through
reward.custom_reward_function.path). verl's GSM8K rule scores a random tiny model 0 on every
sample, so GRPO's advantages, and with them every gradient, would be zero: this one gives the
GSM8K rule's 1.0 for a right "#### <answer>" and otherwise partial credit, the share of digits
in the response, which varies from sample to sample. Plain Python: verl's reward workers import
it from its file."""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    answers = re.findall(r"#### *(-?[0-9][0-9,]*)", solution_str or "")
    if answers and answers[-1].replace(",", "") == str(ground_truth).strip():
        return 1.0
    text = solution_str or ""
    return 0.5 * sum(c.isdigit() for c in text) / max(1, len(text))
