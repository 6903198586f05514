"""Reading trajectories back: the stand-in answers Weave's reads (stream_query, query_stats),
and what the real weave client wrote, the real weave client and `verl-launch traces` read.

The trajectories are made by verl's own tracing (RolloutTraceConfig, rollout_trace_attr,
rollout_trace_op) with weave 0.54 in a subprocess, as verl's agent-loop workers make them; the
sandbox training job's are read in test_verl_job.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wandb_standin import StandIn

ROOT = Path(__file__).resolve().parent.parent
PROJECT, EXPERIMENT, ENTITY = "trace-read", "exp-read", "team"

# 3 steps x 2 samples x 2 rollouts, each an agent loop's run with a generate inside and the
# second rollout with a tool call; and 2 validation trajectories (step 0). As verl's workers do.
WRITER = """
import asyncio, sys
import weave
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op

project, experiment = sys.argv[1], sys.argv[2]
RolloutTraceConfig.init(project, experiment, "weave", token2text=False)

class Server:
    @rollout_trace_op
    async def generate(self, prompt_ids):
        return {"token_ids": [t + 1 for t in prompt_ids], "response_text": "think " + str(len(prompt_ids))}

class Calc:
    @rollout_trace_op
    async def execute(self, instance_id, parameters):
        return {"text": str(eval(parameters["expression"]))}

class Faulty(Calc):  # a tool of one's own on a traced base: it raises for sample 1
    @rollout_trace_op
    async def execute(self, instance_id, parameters):
        if parameters["expression"].startswith("1 "):
            raise RuntimeError("the tool broke")
        return await super().execute(instance_id, parameters)

class ToyAgentLoop:
    def __init__(self):
        self.server, self.tool, self.faulty = Server(), Calc(), Faulty()

    @rollout_trace_op
    async def run(self, sample_index, rollout_n, step):
        out = await self.server.generate(list(range(sample_index + 2)))
        if rollout_n == 1:
            try:  # as verl's ToolAgentLoop: the error goes back to the model, the loop goes on
                await (self.faulty if step == 2 else self.tool).execute("i", {"expression": f"{sample_index} + 40"})
            except RuntimeError:
                pass
            await self.server.generate(out["token_ids"])
        return {"num_turns": 2 + 2 * rollout_n, "reward_score": float(sample_index + rollout_n),
                "prompt_text": f"what is {sample_index} + 40?", "response_text": f"answer {sample_index + 40}"}

async def main():
    loop = ToyAgentLoop()
    for step in (1, 2, 3):
        for sample in (0, 1):
            for n in (0, 1):
                with rollout_trace_attr(sample_index=sample, step=step, rollout_n=n):
                    await loop.run(sample, n, step)
    for sample in (0, 1):
        with rollout_trace_attr(sample_index=sample, step=0, rollout_n=0, validate=True):
            await loop.run(sample, 0, 0)

asyncio.run(main())
weave.finish()
"""

# The real weave client reading back: weave.init + get_calls with Weave's own filter and $expr.
READER = """
import json, sys
import weave
client = weave.init(sys.argv[1])
expr = json.loads(sys.argv[2])
calls = client.get_calls(filter={"trace_roots_only": True}, query={"$expr": expr})
print("CALLS " + json.dumps(sorted([c.attributes["step"], c.attributes["sample_index"], c.attributes["rollout_n"]]
                                   for c in calls)))
"""


def weave_env(clean_env: dict, url: str, key: str) -> dict:
    return {**clean_env, "WANDB_BASE_URL": url, "WANDB_ENTITY": ENTITY, "WANDB_API_KEY": key,
            "WANDB_ERROR_REPORTING": "false", "WEAVE_HTTP_TIMEOUT": "10", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def written(wandb_key, tmp_path_factory):
    """A stand-in holding verl-traced trajectories, up for the module."""
    import os

    env = weave_env({k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "WEAVE_", "WF_"))},
                    "", wandb_key)
    with StandIn(api_key=wandb_key) as w:
        env["WANDB_BASE_URL"] = w.url
        proc = subprocess.run([sys.executable, "-c", WRITER, PROJECT, EXPERIMENT], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert w.wait_for(lambda s: len(s.calls_named("ToyAgentLoop.run")) == 14, timeout=30), len(w.calls)
        w.env = env
        yield w


def _weave_reads(w, expr: dict) -> list:
    proc = subprocess.run([sys.executable, "-c", READER, PROJECT, json.dumps(expr)], env=w.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("CALLS ", 1)[1])


def _step(n: int) -> dict:
    return {"$eq": [{"$convert": {"input": {"$getField": "attributes.step"}, "to": "int"}}, {"$literal": n}]}


def test_the_weave_client_reads_back_what_it_wrote_filtered_by_its_own_query(written):
    assert written.unknown == []
    assert _weave_reads(written, _step(2)) == [[2, 0, 0], [2, 0, 1], [2, 1, 0], [2, 1, 1]]
    both = {"$and": [{"$gte": [{"$convert": {"input": {"$getField": "attributes.step"}, "to": "int"}},
                               {"$literal": 2}]},
                     {"$eq": [{"$getField": "attributes.rollout_n"}, {"$literal": 1}]},
                     {"$not": [{"$eq": [{"$convert": {"input": {"$getField": "attributes.validate"}, "to": "bool"}},
                                        {"$literal": True}]}]}]}
    assert _weave_reads(written, both) == [[2, 0, 1], [2, 1, 1], [3, 0, 1], [3, 1, 1]]
    assert _weave_reads(written, {"$eq": [{"$getField": "attributes.experiment_name"}, {"$literal": "other"}]}) == []
    assert written.unknown == []  # every read the client made, the stand-in answered


def test_the_standin_refuses_what_its_subset_does_not_answer(written, wandb_key):
    import base64
    import urllib.error
    import urllib.request

    def post(path, body, key=wandb_key):
        auth = "Basic " + base64.b64encode(f"api:{key}".encode()).decode()
        req = urllib.request.Request(written.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    pid = f"{ENTITY}/{PROJECT}"
    assert post("/traces/calls/stream_query", {"project_id": pid, "query": {"$expr": {"$regex": ["a"]}}})[0] == 400
    assert post("/traces/calls/stream_query", {"project_id": pid, "filter": {"thread_ids": ["x"]}})[0] == 400
    status, text = post("/traces/calls/query_stats", {"project_id": pid, "filter": {"trace_roots_only": True}})
    assert (status, json.loads(text)["count"]) == (200, 14)
    assert post("/traces/calls/query_stats", {"project_id": pid}, key="x" * 40)[0] == 401  # reads need the key too


# ----------------------------------------------------------------------------- verl-launch traces
DEMO = ROOT / "recipes" / "sandbox-demo.yaml"


def _local_run(written, tmp, *overrides) -> dict:
    env = {**written.env, "VERL_LAUNCH_STATE": str(tmp / "state"), "HOME": str(tmp / "home")}
    for k in ("WANDB_BASE_URL", "WANDB_ENTITY"):
        env.pop(k)
    sub = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(DEMO), "--local", "--no-check", "--json",
                          f"runtime.python={sys.executable}", f"paths.runs={tmp / 'runs'}",
                          f"wandb.base_url={written.url}", f"wandb.entity={ENTITY}", f"wandb.project={PROJECT}",
                          f"wandb.experiment={EXPERIMENT}", "wandb.reach_timeout=5",
                          "verl.overrides.actor_rollout_ref.rollout.agent.num_workers=1",
                          "verl.overrides.actor_rollout_ref.rollout.n=2", *overrides],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert sub.returncode == 0, sub.stdout[-2000:] + sub.stderr[-3000:]
    info = json.loads(sub.stdout.strip().splitlines()[-1])
    return {"env": env, "job_id": info["job_id"], "run_dir": info["run_dir"], "tmp": tmp}


@pytest.fixture(scope="module")
def run(written, tmp_path_factory):
    """A real run (the demo recipe, submitted --local) whose project and experiment are those
    the trajectories were traced to, and whose estimate is theirs: min(2 x 1 worker, 8) x n=2."""
    return _local_run(written, tmp_path_factory.mktemp("traces-run"))


def traces(run, *args, env=None):
    return subprocess.run([sys.executable, "-m", "launcher.cli", "traces", run["run_dir"], *args],
                          env=env or run["env"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _rows(out: str) -> list:
    """(step, sample, rollout, split, op, turns, tools, reward, call id) of each listed line."""
    return [line.split() for line in out.splitlines()[1:] if line[:4].strip().isdigit()]


def test_traces_lists_every_trajectory_with_its_turns_tools_and_reward(run, written):
    p = traces(run)
    assert p.returncode == 0, p.stderr
    rows = _rows(p.stdout)
    recorded = {c["id"]: c for c in written.calls_named("ToyAgentLoop.run")}
    assert sorted(r[-1] for r in rows) == sorted(recorded)  # exactly what the stand-in got
    for step, sample, rollout, split, op, turns, tools, reward, call_id in rows:
        a = recorded[call_id]["attributes"]
        assert (int(step), int(sample), int(rollout), split == "val") == (
            a["step"], a["sample_index"], a["rollout_n"], a["validate"]), (call_id, a)
        assert op == "ToyAgentLoop.run" and (turns, tools) == (("2", "1") if rollout == "1" else ("1", "0"))
        assert float(reward) == recorded[call_id]["output"]["reward_score"]
    assert p.stdout.strip().splitlines()[-1] == "12 trajectories, steps 1-3, 4/step as estimated"


@pytest.mark.parametrize("args, want", [
    (["--step", "2"], {(2, s, n) for s in (0, 1) for n in (0, 1)}),
    (["--step", "2:3", "--rollout-n", "1"], {(st, s, 1) for st in (2, 3) for s in (0, 1)}),
    (["--step", "1", "--step", "3", "--sample-index", "1"], {(st, 1, n) for st in (1, 3) for n in (0, 1)}),
    (["--validate"], {(0, 0, 0), (0, 1, 0)}),
    (["--train", "--limit", "3"], None),
])
def test_traces_filters_are_weaves_own_query(run, written, args, want):
    p = traces(run, *args, "--json")
    assert p.returncode == 0, p.stderr
    got = [json.loads(line) for line in p.stdout.splitlines()]
    if want is None:
        assert len(got) == 3 and not any(t["validate"] for t in got)
    else:
        assert {(t["step"], t["sample_index"], t["rollout_n"]) for t in got} == want and len(got) == len(want)
    queries = [b for path, b in written.bodies if path == "/traces/calls/stream_query" and b.get("query")]
    assert "attributes.step" in json.dumps(queries[-1]) or "--step" not in args  # the server filtered


def test_traces_json_holds_the_nested_calls_with_inputs_and_outputs(run):
    p = traces(run, "--json", "--step", "1", "--sample-index", "1", "--rollout-n", "1")
    assert p.returncode == 0, p.stderr
    (t,) = [json.loads(line) for line in p.stdout.splitlines()]
    ops = [c["op"] for c in t["calls"]]
    assert ops == ["Server.generate", "Calc.execute", "Server.generate"], ops
    assert t["calls"][1]["inputs"]["parameters"] == {"expression": "1 + 40"} and t["calls"][1]["output"] == {"text": "41"}
    assert t["output"]["response_text"] == "answer 41" and t["inputs"] == {"sample_index": 1, "rollout_n": 1, "step": 1}


def test_show_prints_the_prompt_each_turn_the_tool_call_and_its_result(run):
    t = json.loads(traces(run, "--json", "--step", "3", "--sample-index", "0", "--rollout-n", "1").stdout)
    p = traces(run, "--show", t["call_id"])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "step 3, sample 0, rollout 1, training" in out
    assert "prompt     what is 0 + 40?" in out and "response   answer 40" in out
    assert out.index("turn 1     think 2") < out.index('tool       Calc({"expression": "0 + 40"}) -> 40') \
        < out.index("turn 2     think 2") < out.index("reward     1")


def test_show_prints_a_tool_that_raised_and_a_tool_on_a_traced_base_once(run):
    for sample, line in ((1, '  tool       Faulty({"expression": "1 + 40"}) -> raised RuntimeError: the tool broke'),
                         (0, '  tool       Faulty({"expression": "0 + 40"}) -> 40')):
        t = json.loads(traces(run, "--json", "--step", "2", "--sample-index", str(sample), "--rollout-n", "1").stdout)
        assert [c["op"] for c in t["calls"]] == ["Server.generate", "Faulty.execute"] + (
            ["Calc.execute"] if sample == 0 else []) + ["Server.generate"], t["calls"]
        assert t["tool_calls"] == 1
        out = traces(run, "--show", t["call_id"]).stdout
        tools = [x for x in out.splitlines() if x.startswith("  tool ")]
        assert tools == [line], out


def test_compare_puts_two_steps_of_one_sample_side_by_side(run):
    p = traces(run, "--compare", "--sample-index", "1", "--rollout-n", "1", "--step", "1", "--step", "3")
    assert p.returncode == 0, p.stderr
    lines = {line[2:15].strip(): line for line in p.stdout.splitlines()}
    assert lines["step"].startswith("*") and lines["step"].split()[-2:] == ["1", "3"], p.stdout  # differs: marked
    assert lines["sample index"].startswith(" ") and lines["sample index"].split()[-2:] == ["1", "1"]
    assert lines["tools"].count('Calc({"expression": "1 + 40"}) -> 41') == 2
    assert lines["turn 2"].count("think 3") == 2


def _status(run) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", "status", run["job_id"]], env=run["env"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_expect_passes_when_every_step_arrived_and_fails_when_one_was_cut(run, written):
    """--expect and status count with Weave's stats query over step ranges: no stream of the run's
    calls, whatever the run's size (bench/traces_bench.py measures the cost)."""
    before = len(written.requests)
    ok = traces(run, "--expect")
    assert (ok.returncode, ok.stdout.strip()) == (0, "traces     12 received, steps 1-3, 4/step as estimated")
    st = _status(run)
    assert "traces     12 received, steps 1-3, 4/step as estimated" in st.stdout, st.stdout + st.stderr
    reads = [path for _, path, _ in written.requests[before:] if path.startswith("/traces/")]
    assert reads and set(reads) == {"/traces/calls/query_stats"}, reads
    lost = {c["id"]: c for c in written.calls if c["attributes"].get("step") == 2 and c["attributes"].get("sample_index") == 1}
    try:
        assert written.forget(lambda c: c["id"] in lost) == 6  # 2 roots and their 4 calls: the server lost them
        cut = traces(run, "--expect")
        assert cut.returncode == 1, cut.stdout + cut.stderr
        assert "10 received, steps 1-3; 4/step estimated, short: step 2 has 2 (2 short)" in cut.stdout
    finally:
        with written._lock:
            written.calls.extend(lost.values())


def _extra_roots(written, per_step: int) -> list:
    """PER_STEP more training trajectories at each step (copies of sample 0's, new ids)."""
    import uuid

    roots = [c for c in written.calls if c["parent_id"] is None and c["attributes"].get("sample_index") == 0
             and c["attributes"].get("rollout_n") == 0 and not c["attributes"].get("validate")]
    out = []
    for root in roots:
        for i in range(per_step):
            new = str(uuid.uuid4())
            out.append({**root, "id": new, "trace_id": new,
                        "attributes": {**root["attributes"], "sample_index": 10 + i}})
    return out


def test_the_summary_says_what_arrived_when_more_or_fewer_than_estimated(run, written):
    """The estimate is `check`'s; what arrived is counted: more per step than estimated is said
    with both figures (and passes --expect), fewer names the steps."""
    more = _extra_roots(written, 4)
    with written._lock:
        written.calls.extend(more)
    try:
        p = traces(run, "--expect")
        assert (p.returncode, p.stdout.strip()) == (0, "traces     24 received, steps 1-3, 8/step (check estimated 4)")
        listing = traces(run, "--train")
        assert listing.stdout.splitlines()[-1] == "24 training trajectories shown, steps 1-3", listing.stdout
        assert traces(run).stdout.splitlines()[-1] == "24 trajectories, steps 1-3, 8/step (check estimated 4)"
    finally:
        ids = {c["id"] for c in more}
        written.forget(lambda c: c["id"] in ids)
    one_each = {c["id"] for c in written.calls if c["parent_id"] is None and c["attributes"].get("rollout_n") == 1
                and c["attributes"].get("sample_index") == 1 and not c["attributes"].get("validate")}
    kept = [c for c in written.calls if c["id"] in one_each]
    try:
        assert written.forget(lambda c: c["id"] in one_each) == 3
        p = traces(run, "--expect")
        assert (p.returncode, p.stdout.strip()) == (1, "traces     9 received, steps 1-3; 4/step estimated, "
                                                       "short: steps 1-3 have 3 (1 short each)"), p.stdout + p.stderr
        assert "9 received, steps 1-3; 4/step estimated, short: steps 1-3 have 3 (1 short each)" in _status(run).stdout
    finally:
        with written._lock:
            written.calls.extend(kept)


def test_bad_steps_unknown_ids_and_keys_are_exit_2_and_an_unreachable_server_exit_1(run, written, wandb_key):
    for args, text in ((["--step", "abc"], "--step: 'abc' is not a step"), (["--step", "3:1"], "empty range"),
                       (["--show", "no-such-call"], "no trajectory 'no-such-call'")):
        p = traces(run, *args)
        assert p.returncode == 2 and text in p.stderr, (args, p.stderr)
    nokey = {k: v for k, v in run["env"].items() if k != "WANDB_API_KEY"}
    p = traces(run, env=nokey)
    assert p.returncode == 2 and "$WANDB_API_KEY, wandb.api_key_file, or ~/.netrc" in p.stderr, p.stderr
    p = traces(run, env={**run["env"], "WANDB_API_KEY": "local-" + "0" * 48})
    assert p.returncode == 2 and "rejected the key" in p.stderr and "0" * 48 not in p.stderr, p.stderr
    with StandIn(api_key=wandb_key, mode="silent") as silent:
        p = traces(run, env={**run["env"], "WF_TRACE_SERVER_URL": silent.url + "/traces"})
    assert p.returncode == 1 and f"cannot reach Weave at {silent.url}/traces" in p.stderr, p.stderr
    assert wandb_key not in p.stdout + p.stderr


def test_a_run_whose_project_received_nothing_fails_expect_and_status_says_why(written, tmp_path):
    empty = _local_run(written, tmp_path, "wandb.project=received-nothing")
    p = traces(empty, "--expect")
    assert (p.returncode, p.stdout.strip()) == (1, "traces     none received"), p.stdout + p.stderr
    assert traces(empty).stdout.strip() == "no trajectories match"
    st = subprocess.run([sys.executable, "-m", "launcher.cli", "status", empty["job_id"]], env=empty["env"], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    line = next(x for x in st.stdout.splitlines() if x.startswith("traces "))
    assert "none received: " in line and "team/received-nothing" in line, line
    assert "V1 trainer" not in line  # the launcher derived trainer.use_v1=false: not a likely cause here


def test_a_run_that_was_not_traced_is_exit_2(written, tmp_path):
    untraced = _local_run(written, tmp_path, "trace.backend=none")
    p = traces(untraced)
    assert p.returncode == 2 and "the run was not traced" in p.stderr, p.stderr


def test_the_api_reads_what_the_cli_lists(run, monkeypatch):
    """Run.traces and Run.trace_tally, called as a user's script would: the CLI's semantics."""
    import launcher

    monkeypatch.setenv("VERL_LAUNCH_STATE", run["env"]["VERL_LAUNCH_STATE"])
    r = launcher.run(run["job_id"])
    got = list(r.traces(step="2:3", rollout_n=1, environ=run["env"]))
    assert {(t["step"], t["sample_index"], t["rollout_n"]) for t in got} == {(s, i, 1) for s in (2, 3) for i in (0, 1)}
    assert all(t["tool_calls"] == 1 and t["turns"] == 2 for t in got)
    listed = [json.loads(x)["call_id"] for x in traces(run, "--json", "--step", "2:3", "--rollout-n", "1").stdout.splitlines()]
    assert [t["call_id"] for t in got] == listed
    tally = r.trace_tally(environ=run["env"])
    assert (tally.counts, tally.estimate, tally.short) == ({1: 4, 2: 4, 3: 4}, 4, [])
    assert r.tally_of(tally.counts).text() == tally.text()  # a listing's own counts read the same
    with pytest.raises(launcher.RecipeError, match="--step"):
        list(r.traces(step="3:1", environ=run["env"]))
