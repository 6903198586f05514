"""Counting a run's trajectories per step with Weave's stats query over step ranges
(launcher/jobs/trace_tally.py): how many requests it takes at a run's scale, and what the summary
says. The counts are the stand-in's own answers to the query `traces` builds
(tests/standin_query.py), as its HTTP handler gives them, without the HTTP: the request body is
built here rather than sent, so that thousands of steps cost no server. The real path, the
launcher's own request over HTTP to the stand-in (and the real weave client reading back what
it wrote), is tests/test_trace_reads.py; this module only beside it."""

from __future__ import annotations

from typing import Dict

import pytest

import standin_query
from launcher.jobs import traces
from launcher.jobs.trace_tally import BUDGET, Tally

EXPERIMENT = "exp"
SRC = traces.Source("http://unused", "team/proj", EXPERIMENT, None, 1.0, "nowhere")


def calls(per_step: Dict[int, int], validation: int = 3) -> list:
    """Root calls as the stand-in records them: PER_STEP training ones, and VALIDATION at step 0."""
    out = []
    for step, n in per_step.items():
        for i in range(n):
            out.append({"id": f"{step}-{i}", "trace_id": f"{step}-{i}", "parent_id": None, "entity": "team",
                        "project": "proj", "op_name": "SingleTurnAgentLoop.run", "started_at": f"{step:06d}{i:06d}",
                        "attributes": {"step": step, "sample_index": i, "rollout_n": 0, "validate": False,
                                       "experiment_name": EXPERIMENT}})
    for i in range(validation):
        out.append({"id": f"v{i}", "trace_id": f"v{i}", "parent_id": None, "entity": "team", "project": "proj",
                    "op_name": "SingleTurnAgentLoop.run", "started_at": "0",
                    "attributes": {"step": 0, "sample_index": i, "validate": True, "experiment_name": EXPERIMENT}})
    return out


def counter(recorded: list):
    """traces.tally's count: the stand-in's query_stats on the query `traces` sends."""
    asked = []

    def count(src, f):
        asked.append(f)
        body = {"project_id": src.project_id, "filter": {"trace_roots_only": True}, "query": traces.query(src, f)}
        return standin_query.stats(recorded, body)["count"]
    return count, asked


def run_tally(monkeypatch, per_step, estimate, done):
    count, asked = counter(calls(per_step))
    monkeypatch.setattr(traces, "count", count)
    t = traces.tally(traces.Source(**{**SRC.__dict__, "estimate": estimate}), done)
    assert t.queries == len(asked)
    return t


def test_a_whole_run_costs_four_stats_requests_whatever_its_steps(monkeypatch):
    for steps in (3, 400):
        t = run_tally(monkeypatch, {s: 4 for s in range(1, steps + 1)}, 4, steps)
        assert t.queries == 4 and t.counts == {s: 4 for s in range(1, steps + 1)} and not t.falls_short
        assert t.text() == f"{4 * steps} received, steps 1-{steps}, 4/step as estimated"


def test_more_than_estimated_says_both_and_fewer_names_the_steps(monkeypatch):
    t = run_tally(monkeypatch, {s: 20 for s in range(1, 51)}, 8, 50)
    assert (t.text(), t.falls_short, t.queries) == ("1000 received, steps 1-50, 20/step (check estimated 8)", False, 4)
    t = run_tally(monkeypatch, {s: 6 for s in range(1, 51)}, 8, 50)
    assert t.text() == "300 received, steps 1-50; 8/step estimated, short: steps 1-50 have 6 (2 short each)" and t.queries == 4
    assert t.short == [(s, 6) for s in range(1, 51)]
    more_but_one = {**{s: 20 for s in range(1, 51)}, 17: 5}
    t = run_tally(monkeypatch, more_but_one, 8, 50)
    assert t.text() == "985 received, steps 1-50, mostly 20/step; 8/step estimated, short: step 17 has 5 (3 short)"
    assert t.counts == {s: n for s, n in more_but_one.items()}


def test_short_steps_are_found_by_halving_ranges(monkeypatch):
    per = {**{s: 4 for s in range(1, 301)}, 77: 1, 78: 0, 250: 3}
    t = run_tally(monkeypatch, per, 4, 300)
    assert t.short == [(77, 1), (78, 0), (250, 3)] and t.counts == {s: n for s, n in per.items() if n}
    assert t.queries <= 3 + 3 * 2 * 9, t.queries  # about 2 log2(steps) a short step
    assert t.text() == "1192 received, steps 1-300; 4/step estimated, short: step 77 has 1 (3 short), step 78 has 0 (4 short), step 250 has 3 (1 short)"
    lost_tail = run_tally(monkeypatch, {s: 4 for s in range(1, 41)}, 4, 50)  # the server lost steps 41-50
    assert lost_tail.short == [(s, 0) for s in range(41, 51)]
    assert lost_tail.text() == "160 received, steps 1-40; 4/step estimated, short: steps 41-50 have 0 (4 short each)"


def test_a_step_in_progress_is_counted_but_not_short(monkeypatch):
    t = run_tally(monkeypatch, {**{s: 4 for s in range(1, 11)}, 11: 1}, 4, 10)
    assert (t.text(), t.falls_short) == ("41 received, steps 1-11, 4/step as estimated", False)
    assert t.counts[11] == 1 and t.queries <= 6


def test_without_the_completed_steps_the_last_is_found_in_log_requests(monkeypatch):
    t = run_tally(monkeypatch, {s: 2 for s in range(1, 701)}, 2, None)
    assert t.text() == "1400 received, steps 1-700, 2/step as estimated" and t.queries == 6
    odd_first = run_tally(monkeypatch, {**{s: 2 for s in range(1, 701)}, 1: 1}, 2, None)  # a wrong guess
    assert odd_first.short == [(1, 1)] and max(odd_first.counts) == 700
    assert odd_first.queries <= 5 + 2 * 11 + 2 * 10, odd_first.queries


def test_scattered_losses_stay_within_the_budget_and_still_fail(monkeypatch):
    per = {s: (1 if s % 7 == 0 else 4) for s in range(1, 1001)}
    t = run_tally(monkeypatch, per, 4, 1000)
    assert t.queries <= 5 + BUDGET and t.falls_short
    found = dict(t.short)
    assert all(per[s] == n for s, n in found.items()) and found  # what it names is right
    assert all(c < 4 * (hi - lo + 1) for lo, hi, c in t.unresolved) and t.unresolved
    assert sum(c for _, _, c, _ in t.spans) == sum(per.values())  # every range's total is exact
    assert t.text().endswith(f"({len(t.short)} steps short, and {len(t.unresolved)} ranges of steps not split one by one)")


@pytest.mark.parametrize("counts, done, text", [
    ({1: 4, 2: 4, 3: 4}, 3, "12 received, steps 1-3, 4/step as estimated"),
    ({1: 4, 2: 2, 3: 4}, 3, "10 received, steps 1-3; 4/step estimated, short: step 2 has 2 (2 short)"),
    ({1: 4, 2: 4, 3: 4, 4: 1}, 3, "13 received, steps 1-4, 4/step as estimated"),
    ({2: 4, 3: 4}, 3, "8 received, steps 2-3; 4/step estimated, short: step 1 has 0 (4 short)"),
    ({}, 3, "none received"),
])
def test_a_listings_own_counts_read_the_same(counts, done, text):
    assert Tally.of(counts, 4, done).text() == text


@pytest.mark.parametrize("counts, done, text", [
    ({1: 4, 2: 4, 3: 2}, 2, "10 received, steps 1-3, 4/step as estimated in the 2 completed steps; "
                            "step 3 did not complete: 2 of its trajectories arrived (4 estimated)"),
    ({1: 4, 2: 3, 3: 1}, 2, "8 received, steps 1-3; 4/step estimated, short: step 2 has 3 (1 short); "
                            "step 3 did not complete: 1 of its trajectories arrived (4 estimated)"),
    ({1: 4, 2: 4}, 2, "8 received, steps 1-2, 4/step as estimated"),  # ended after its last step
])
def test_a_run_that_ended_in_a_step_names_it_and_never_says_only_as_estimated(monkeypatch, counts, done, text):
    """Once the run has ended (a worker killed, a driver that failed), the step it was in is one
    it never finished: named with what arrived of it, in the listing's counts and in the stats'
    ranges alike; while the run goes on, the same counts read as a step in progress."""
    assert Tally.of(counts, 4, done).text(ended=True) == text
    assert run_tally(monkeypatch, counts, 4, done).text(ended=True) == text
    assert "did not complete" not in Tally.of(counts, 4, done).text()


def test_trajectories_without_a_training_step_are_counted_and_nothing_breaks(monkeypatch):
    t = run_tally(monkeypatch, {0: 5}, 8, None)  # step 0 (or none): in the total, in no step
    assert (t.total, t.spans, t.falls_short) == (5, [], False)
    assert t.text() == "5 received, none with a training step of 1 or more, ?/step (check estimated 8)"


@pytest.mark.parametrize("per, done, text", [
    ({1: 100, 2: 200, 3: 200, 4: 200}, 4, "700 received, steps 1-4; 200/step estimated, short: step 1 has 100 (100 short)"),
    ({2: 200, 3: 200, 4: 200}, 4, "600 received, steps 2-4; 200/step estimated, short: step 1 has 0 (200 short)"),
    ({1: 100, 2: 100, 3: 100, 4: 100}, 3, "400 received, steps 1-4; 200/step estimated, short: steps 1-3 have 100 (100 short each)"),
])
def test_a_short_first_step_or_a_step_in_progress_hides_no_shortfall(monkeypatch, per, done, text):
    t = run_tally(monkeypatch, per, 200, done)
    assert (t.text(), t.falls_short) == (text, True)


def test_before_the_first_completed_step_nothing_is_short(monkeypatch):
    t = run_tally(monkeypatch, {1: 50}, 200, 0)  # verl's step 0 (validation) said; step 1 running
    assert not t.falls_short and t.text() == "50 received, step 1, 50/step (check estimated 200)"
