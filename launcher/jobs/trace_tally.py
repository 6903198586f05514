"""Did every training step's trajectories arrive? Counted with Weave's calls/query_stats over
step ranges, never by streaming the run's calls: `status` and `traces --expect` cost a few small
requests at 100,000 trajectories as at 1,000 (bench/traces_bench.py).

How: the training total, the completed steps' total, and the first step's count give the run's
rate R (verl traces the same number every step: batch x rollout.n, or the per-worker cap). A
range of n steps holding n x R trajectories is whole; one holding fewer is split in two, one
count for the left half (the right is the difference), until each short step is found. A healthy
run costs 4 requests (6 before its driver's log says a completed step); each short step about 2 log2(steps) more, within BUDGET, past which what
is left is reported as ranges (their totals are exact, their per-step split not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

BUDGET = 48  # stats requests for the bisection, after the first few
NAMED = 6  # short steps (or runs of them) the text names

Span = Tuple[int, int, int, bool]  # (first step, last step, trajectories in all, exact: every step has total/n)


@dataclass
class Tally:
    """Training trajectories per step against `check`'s estimate. spans cover steps 1..last in
    order; done: the steps the run completed (its driver's log), if known; total: every training
    trajectory received (a step in progress too); queries: the stats requests it took."""
    spans: List[Span]
    estimate: Optional[int]
    done: Optional[int]
    total: int
    queries: int = 0
    _short: List[Span] = field(default_factory=list, repr=False)

    def __post_init__(self):
        upto = self.done if self.done is not None else (self.spans[-1][1] if self.spans else 0)  # 0: none yet
        if self.estimate:  # the completed steps' spans below the estimate (spans never cross `done`)
            self._short = [(lo, hi, c, ex) for lo, hi, c, ex in self.spans
                           if hi <= upto and c < self.estimate * (hi - lo + 1)]

    @classmethod
    def of(cls, counts: Dict[int, int], estimate: Optional[int], done: Optional[int]) -> "Tally":
        """From exact per-step counts (what a listing saw)."""
        last = max([s for s in counts if s >= 1] + [done or 0])
        spans = [(s, s, counts.get(s, 0), True) for s in range(1, last + 1)]
        cut = min(done if done is not None else last, last)
        return cls(_merge(spans[:cut]) + _merge(spans[cut:]), estimate, done, sum(counts.values()))

    @property
    def counts(self) -> Dict[int, int]:
        """Trajectories per step, for the steps known one by one that have any."""
        return {s: c // (hi - lo + 1) for lo, hi, c, ex in self.spans if ex and c for s in range(lo, hi + 1)}

    @property
    def short(self) -> List[Tuple[int, int]]:
        """(step, received) for each completed step known to be below the estimate."""
        return [(s, c // (hi - lo + 1)) for lo, hi, c, ex in self._short if ex for s in range(lo, hi + 1)]

    @property
    def unresolved(self) -> List[Tuple[int, int, int]]:
        """(first, last, received in all): completed ranges below the estimate, not split to steps."""
        return [(lo, hi, c) for lo, hi, c, ex in self._short if not ex]

    @property
    def falls_short(self) -> bool:
        return bool(self._short)

    def rate(self) -> str:
        """What arrived per step: '200/step', '190-200/step' (completed steps with any)."""
        upto = self.done if self.done else (self.spans[-1][1] if self.spans else 0)
        each = {c // (hi - lo + 1) for lo, hi, c, ex in self.spans if ex and c and lo <= upto}
        if not each:
            return "?/step"
        return f"{min(each)}/step" if len(each) == 1 else f"{min(each)}-{max(each)}/step"

    def text(self, ended: bool = False) -> str:
        """'24 received, steps 1-3, 8/step as estimated', '600 received, steps 1-3, 200/step
        (check estimated 8)', or the steps that fall short. ENDED: the run has ended, so a step
        after the completed ones is one it never finished, and is named with what arrived of it."""
        cut = self._unfinished() if ended else None
        text = self._text(cut is not None)
        return text if cut is None else f"{text}; step {cut[0]} did not complete: {cut[1]} of its trajectories arrived" + (
            f" ({self.estimate} estimated)" if self.estimate else "")

    def _unfinished(self) -> Optional[Tuple[int, int]]:
        """(step, received) of the step after the completed ones, if any of it arrived."""
        if self.done is None:
            return None
        after = [(lo, hi, c) for lo, hi, c, _ in self.spans if lo > self.done and c]
        return (after[0][0], after[0][2]) if after and after[0][0] == after[0][1] else None

    def _text(self, unfinished: bool = False) -> str:
        if not self.total:
            return "none received"
        having = [(lo, hi) for lo, hi, c, _ in self.spans if c]
        first, last = (having[0][0], having[-1][1]) if having else (None, None)
        span = ("none with a training step of 1 or more" if first is None else
                f"step {first}" if first == last else f"steps {first}-{last}")
        line = f"{self.total} received, {span}"
        if self.estimate is None:
            return line + f", {self.rate()} (no estimate: check could not work it out)"
        if not self._short:
            rate = self.rate()
            done = f" in the {self.done} completed steps" if unfinished else ""
            return line + (f", {rate} as estimated{done}" if rate == f"{self.estimate}/step"
                           else f", {rate}{done} (check estimated {self.estimate})")
        e = self.estimate
        named = [f"step {lo} has {c} ({e - c} short)" if lo == hi else
                 f"steps {lo}-{hi} have {c // (hi - lo + 1)} ({e - c // (hi - lo + 1)} short each)" if ex else
                 f"steps {lo}-{hi} have {c} in all ({e * (hi - lo + 1) - c} short)"
                 for lo, hi, c, ex in self._short]
        mostly = self._mostly()  # more arrived than estimated, but not at every step
        head = f", mostly {mostly}/step; " if mostly is not None and mostly > self.estimate else "; "
        more = ""
        if len(named) > NAMED:
            ranges = self.unresolved
            more = f", ... ({len(self.short)} steps short" + (
                f", and {len(ranges)} ranges of steps not split one by one" if ranges else "") + ")"
        return line + head + f"{self.estimate}/step estimated, short: " + ", ".join(named[:NAMED]) + more

    def _mostly(self) -> Optional[int]:
        """The per-step count most completed steps have, if one covers most."""
        steps: Dict[int, int] = {}
        for lo, hi, c, ex in self.spans:
            if ex:
                steps[c // (hi - lo + 1)] = steps.get(c // (hi - lo + 1), 0) + hi - lo + 1
        if not steps:
            return None
        n, k = max(steps.items(), key=lambda kv: kv[1])
        return n if k * 2 > sum(steps.values()) else None


def tally(count, estimate: Optional[int], done: Optional[int]) -> Tally:
    """COUNT(first, last) -> training trajectories of steps first..last (last None: first on;
    first None: every one), one stats request each. DONE: the completed steps, if known."""
    known: Dict[Tuple[Optional[int], Optional[int]], int] = {}

    def n(lo: Optional[int], hi: Optional[int]) -> int:
        if (lo, hi) not in known:
            known[lo, hi] = count(lo, hi)
        return known[lo, hi]

    total = n(None, None)
    if not total:
        return Tally([], estimate, done, 0, len(known))
    top = done or 0  # the completed steps; after them, a step in progress
    whole = n(1, top) if top else 0
    last, beyond = top, 0
    if total > whole:
        beyond = n(top + 1, None)
        if beyond:  # without DONE, the first step's count says where the last is, if none is short
            last = _last_step(n, top + 1, None if top else -(-total // max(n(1, 1), 1)))
    budget = [BUDGET]
    spans = _merge(_bisect(n, 1, top, whole, budget)) if top else []
    if last > top:  # merged apart: a span never crosses `done`, or a short completed step could hide
        spans += _merge(_bisect(n, top + 1, last, beyond, budget))
    return Tally(spans, estimate, done, total, len(known))


def _bisect(n, lo: int, hi: int, c: int, budget: List[int]) -> List[Span]:
    """Steps LO..HI, which hold C: whole ranges at the rate, halved where they fall short."""
    spans: List[Span] = []
    # the rate: the most of either end's step and the mean (either end short alone cannot lower it)
    rate = max(n(lo, lo) if hi > lo else c, n(hi, hi) if hi > lo else c, -(-c // (hi - lo + 1)))

    def split(lo: int, hi: int, c: int) -> None:
        nonlocal rate
        size = hi - lo + 1
        exact = size == 1 or c == 0 or c == size * rate
        if exact or budget[0] <= 0:
            spans.append((lo, hi, c, exact))
            if size == 1:
                rate = max(rate, c)  # a step above the rate: it was underestimated
            return
        mid = (lo + hi) // 2
        budget[0] -= 1
        left = n(lo, mid)
        split(lo, mid, left)
        split(mid + 1, hi, c - left)

    split(lo, hi, c)
    return spans


def _last_step(n, lo: int, guess: Optional[int] = None) -> int:
    """The last step with any trajectory, LO or after (known to have some at or after it): GUESS
    if it is (two requests), else galloping, then halving, with counts of `step >= s`."""
    if guess and guess >= lo and n(guess + 1, None) == 0 and n(guess, None):
        return guess
    step = 1
    while n(lo + step, None):
        lo, step = lo + step, step * 2
    hi = lo + step  # none at or after hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if n(mid, None) else (lo, mid)
    return lo


def _merge(spans: List[Span]) -> List[Span]:
    """Adjacent exact spans with the same count per step, as one."""
    out: List[Span] = []
    for lo, hi, c, ex in spans:
        if out and ex and out[-1][3] and out[-1][1] + 1 == lo and \
                out[-1][2] // (out[-1][1] - out[-1][0] + 1) == c // (hi - lo + 1):
            plo, _, pc, _ = out[-1]
            out[-1] = (plo, hi, pc + c, True)
        else:
            out.append((lo, hi, c, ex))
    return out
