"""Agents with tools on the real sandbox: verl's own ToolAgentLoop, driven by the smoke assets'
tool model, calls the calculator in agent-loop workers (Ray actors) on both nodes, importing it
through the recipe's PYTHONPATH, and GRPO trains on it. The tool here is the example's with a
fault (tests/tools/faulty_calculator.py): every other traced call in each worker raises out of its
execute (the first one always), as a broken tool's would, and verl answers the model with the
error and goes on. What happened is read from verl's log and from what the W&B stand-in received
(the real weave client sending verl's own trace calls).

The run is the suite's one traced run (tests/traced_run.py, recipes/sandbox-tool-agent.yaml),
whose rows pick their loop: the tool's in step 1 on one agent-loop worker and in step 2 on the
other; tests/test_verl_job.py reads the same run for the rest."""

from __future__ import annotations

import json
import re
from collections import Counter

from traced_run import STEPS, check
from wandb_standin import _READS as READS
from verl_train import NODE_IP

LOOP, EXECUTE = "ToolAgentLoop.run", "CalculatorTool.execute"
BROKEN = "RuntimeError: the calculator is broken on every other call (a test fault)"


def _by_trace(calls) -> dict:
    out = {}
    for c in calls:
        out.setdefault(c["trace_id"], []).append(c)
    return out


def _roots(job) -> list:
    return [c for c in job.calls if c["parent_id"] is None and c["short_name"] == LOOP]


def _found_calls(output) -> list:
    """The FunctionCalls a tool parser's extract_tool_calls returned, however weave serialized them."""
    found = []
    if isinstance(output, dict):
        if set(output) >= {"name", "arguments"}:
            found.append(output)
        else:
            for v in output.values():
                found += _found_calls(v)
    elif isinstance(output, (list, tuple)):
        for v in output:
            found += _found_calls(v)
    return found


def _text(output) -> str:
    """A tool's ToolResponse text from execute's traced output (response, reward, metrics)."""
    first = output[0] if isinstance(output, (list, tuple)) else output
    return str(first.get("text") if isinstance(first, dict) else first)


def test_the_last_steps_traces_arrive_without_a_final_checkpoint_under_load(traced):
    """The recipe saves no checkpoint, and two busy processes ran beside the job from its last
    step on: verl's driver ended right after the last step, yet every trajectory of it arrived
    (assert_trained: every step as estimated), because each agent-loop worker sent a step's traces
    before it handed the step's rollouts back (templates/trace_flush.py), as their records say."""
    job = traced
    assert job.busy.started is not None and job.busy.started < job.first_log[STEPS], (job.busy.started, job.first_log)
    assert job.checkpoint is None  # no global_step_N: the end came right after the last step
    files = sorted((job.run_dir / "logs").glob("trace-flush-*.r0.jsonl"))
    records = {f.name: [json.loads(x) for x in f.read_text().splitlines()] for f in files}
    assert len(records) == 2, records  # one file per agent-loop worker, one on each node
    assert {f.name.split("-")[2] for f in files} == {"node1", "node2"}, records
    for name, rs in records.items():  # each step's flush, in order, all sent within the bound
        assert [r["step"] for r in rs] == list(range(1, STEPS + 1)), (name, rs)
        assert all(r["flushed"] and r["unsent"] == 0 and r["seconds"] < 60 for r in rs), (name, rs)


def test_every_tool_trajectory_holds_the_call_the_model_wrote_and_its_result(traced):
    """Each traced ToolAgentLoop trajectory: a parser call that found the model's call, the
    tool's execute with those arguments, its result (or, where it raised, verl's error) in the
    next turn's prompt, and every call in it carrying the trajectory's step, sample_index and
    rollout_n; the response holds the call and the answer."""
    job = traced
    traces = _by_trace(job.calls)
    roots = _roots(job)
    assert roots, sorted({c["short_name"] for c in job.calls if c["parent_id"] is None})
    silent, raised = [], []  # sampled at temperature 1, the model may garble a call now and then
    for root in roots:
        calls = sorted(traces[root["trace_id"]], key=lambda c: c.get("started_at") or "")
        a = root["attributes"]
        for c in calls:
            assert {k: c["attributes"].get(k) for k in ("step", "sample_index", "rollout_n")} == \
                {k: a[k] for k in ("step", "sample_index", "rollout_n")}, (c["short_name"], c["attributes"], a)
        found = [f for c in calls if c["short_name"].endswith(".extract_tool_calls") for f in _found_calls(c["output"])]
        if not found:
            silent.append(root["output"].get("response_text"))
            continue
        assert found[0]["name"] == "calculator", found
        executes = [c for c in calls if c["short_name"] == EXECUTE]
        assert len(executes) == 1, [c["short_name"] for c in calls]
        ex = executes[0]
        assert ex["inputs"]["parameters"] == json.loads(found[0]["arguments"]), (ex["inputs"], found[0])
        if ex.get("exception"):
            raised.append(root)
            assert BROKEN.split(": ", 1)[1] in str(ex["exception"]), ex["exception"]
            result = f"Error executing tool 'calculator': {BROKEN.split(': ', 1)[1]}"
        else:
            result = _text(ex["output"])
        later = [g for g in calls if g["short_name"].endswith(".generate")
                 and (g.get("started_at") or "") > (ex.get("started_at") or "")]
        assert later and f"<tool_response>\n{result}\n</tool_response>" in later[0]["output"]["prompt_text"], \
            (result, [g["output"].get("prompt_text") for g in later])
        response = root["output"]["response_text"]
        assert "<tool_call>" in response and f"<tool_response>\n{result}\n</tool_response>" in response, response
        assert ex.get("exception") or "####" in response, response  # the answer (after an error, the
        # model, never taught one, may say anything: the error reached it, and training goes on)
    assert len(silent) <= len(roots) // 4, silent
    print(f"\n{len(roots)} tool trajectories: {len(roots) - len(silent)} called the tool, {len(raised)} of those raised")
    assert {NODE_IP.get(c["client"]) for c in roots} == {"node1", "node2"}
    # The first traced call in each worker raises: on both nodes the tool raised, and verl's error reached
    # the model's next turn (asserted above for each); so did a result where it did not raise.
    assert {NODE_IP.get(c["client"]) for c in raised} == {"node1", "node2"}, len(raised)
    assert len(raised) < len(roots) - len(silent), (len(raised), len(roots))


def test_trajectories_and_calls_per_step_are_checks_estimate(traced, cli):
    """Under the cap, 1 sample per agent-loop worker per step with all its rollouts: check's
    trajectories per step are what arrived, the tool's one worker's sample a step (that worker's
    other sample untraced); check's calls per trajectory (a tool loop's, the most a loop here
    makes) are what a tool trajectory holds; its bytes per step are at most what the stand-in
    received, roughly."""
    job = traced
    out = check(job, cli)
    per_step = int(re.search(r"^traces +about (\d+) per training step", out, re.M).group(1))
    assert per_step == 1 * 2 * 2  # the cap 1 x 2 agent-loop workers x rollout.n 2
    everyone = Counter(t["attributes"]["step"] for t in job.trajectories)
    assert everyone == {s: per_step for s in range(1, STEPS + 1)}, everyone
    tools = Counter(r["attributes"]["step"] for r in _roots(job))
    assert tools == {s: 2 for s in range(1, STEPS + 1)}, tools  # 1 sample, both its rollouts
    traces = _by_trace(job.calls)
    m = re.search(r"^traces +about (\d+) calls and ([\d.]+) MB per training step", out, re.M)
    assert m, out
    each = int(m.group(1)) / per_step  # a trajectory's calls at most: 3 per assistant turn
    called = [len(traces[r["trace_id"]]) for r in _roots(job)
              if any(c["short_name"] == EXECUTE for c in traces[r["trace_id"]])]
    calls = {s: sum(len(traces[t["trace_id"]]) for t in job.trajectories if t["attributes"]["step"] == s)
             for s in everyone}
    sent = sum(d for path, (_, d) in job.standin.received.items()  # what weave wrote, not what was read
               if path.startswith("/traces/") and path not in READS)
    print(f"\ncalls per tool trajectory {called}, per step {calls} (check: {m.group(1)}, {each:g} each); sent "
          f"{sent} bytes in {STEPS} steps ({sent / STEPS / 1e6:.3f} MB/step; check: {m.group(2)} MB at most)")
    assert called and all(each >= n >= each * 0.7 for n in called), (called, m.group(0))
    assert all(n <= int(m.group(1)) for n in calls.values()), (calls, m.group(0))
    assert sent / STEPS / 1e6 <= float(m.group(2)) <= 3 * sent / STEPS / 1e6, (sent, m.group(0))  # at most, roughly
    status = cli("status", job.job_id, env=job.env).stdout  # and a day of it, at this run's pace
    day = re.search(rf"^volume +about {m.group(2)} MB a step at most \(check's estimate\): ([\d.]+) GB a day at "
                    r"this run's ([\d.]+) s/step$", status, re.M)
    assert day and abs(float(day.group(1)) - float(m.group(2)) * 86400 / 1e3 / float(day.group(2))) < 0.2, status


def test_traces_show_and_compare_a_tool_trajectory(traced, cli):
    job, env = traced, traced.env
    listed = cli("traces", job.job_id, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    tools = [t for t in map(json.loads, listed.stdout.splitlines()) if t["op"] == LOOP and t["tool_calls"] == 1]
    assert len(tools) >= 2, listed.stdout[-2000:]
    by_id = {c["id"]: c for c in job.calls}
    for t in tools[:2]:
        show = cli("traces", job.job_id, "--show", t["call_id"], env=env)
        assert show.returncode == 0, show.stderr
        ex = next(c for c in job.calls if c["trace_id"] == t["trace_id"] and c["short_name"] == EXECUTE)
        result = f"raised {BROKEN}" if ex.get("exception") else _text(ex["output"])
        line = f"  tool       CalculatorTool({json.dumps(ex['inputs']['parameters'])}) -> {result}"
        lines = show.stdout.splitlines()
        assert line in lines, show.stdout
        assert lines.index(line) < next(i for i, x in enumerate(lines) if x.startswith("turn 2 ")), show.stdout
        assert by_id[t["call_id"]]["output"]["response_text"].splitlines()[0] in show.stdout
    compare = cli("traces", job.job_id, "--compare", tools[0]["call_id"], tools[1]["call_id"], env=env)
    assert compare.returncode == 0, compare.stderr
    rows = [x[2:15].strip() for x in compare.stdout.splitlines()]
    assert rows.index("turn 1") < rows.index("tools") < rows.index("turn 2"), compare.stdout
    assert compare.stdout.count("CalculatorTool(") == 2, compare.stdout
