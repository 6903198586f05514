"""What differs between verl versions, in one small table: the overrides the launcher derives
for the version a recipe targets (``verl.version``), and why.

Each rule was read off the verl source it names; add a row when a new verl changes a default
the launcher depends on, and a test in tests/test_verl_versions.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

NEWEST_CHECKED = "0.9.1"  # the newest verl these rules were checked against

Version = Tuple[int, ...]


@dataclass(frozen=True)
class Rule:
    since: Version  # first version the rule applies to
    until: Optional[Version]  # first version it no longer applies to (None: still open)
    key: str
    value: Any
    when: Callable[[Any], bool]  # on the Recipe
    field: str  # the recipe field a user changes instead
    why: str  # in plain words: what the rule chooses, why, and how to choose otherwise
    label: str = ""  # what the rule chooses, one word (check's report: `trainer     ...`)
    text: str = ""  # the whole report line after the label, in plain words (default: key=value: why)

    @property
    def line(self) -> str:
        """The rule as check reports it: '<label>  <text>' (label padded to the report's column)."""
        return f"{self.label or 'verl rule':<11} {self.text or f'{self.key}={self.value!r}: {self.why}'}"


RULES: List[Rule] = [
    # verl's source: trainer/ppo/v1/agent_loop_tq.py sets trace_this_sample = False, so the V1
    # trainer writes no rollout traces whatever the trace backend.
    Rule((0, 9), None, "trainer.use_v1", False, lambda r: r.trace.backend != "none",
         "trace.backend",
         "verl's legacy trainer records rollout traces, which verl 0.9's default V1 trainer does not "
         "(verl sets trace_this_sample = False in it); set trace.backend=none to use the V1 trainer",
         label="trainer",
         text="verl's legacy trainer (trainer.use_v1=false): it records rollout traces, which verl 0.9's "
              "default V1 trainer does not; set trace.backend=none to use the V1 trainer"),
]


def parse(text: str) -> Version:
    """'0.9.1' -> (0, 9, 1); '0.9.1.dev0+abc' -> (0, 9, 1). ValueError if it is not a version."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a version (e.g. 0.9.1)")
    return tuple(int(x) for x in m.groups() if x is not None)


def rules_for(r) -> List[Rule]:
    """The rules that apply to recipe ``r`` (its verl.version, else the newest checked)."""
    v = parse(r.verl.version or NEWEST_CHECKED)
    return [rule for rule in RULES
            if rule.since <= v and (rule.until is None or v < rule.until) and rule.when(r)]


def same_series(a: str, b: str) -> bool:
    """Same major.minor: the derived overrides are right for both."""
    return parse(a)[:2] == parse(b)[:2]
