"""`verl-launch traces RUN`: a run's trajectories, one line each, then whether they all arrived;
--json (one per line, with the calls inside), --show ID (one, turn by turn), --compare (side by
side), --expect (exit 1 if a completed step has fewer than `check` estimated)."""

from __future__ import annotations

import json
import shutil
from typing import List

from .. import api
from .console import fail

HEAD = f"{'STEP':>4} {'SAMPLE':>6} {'ROLLOUT':>7} {'SPLIT':<5} {'AGENT LOOP':<24} {'TURNS':>5} {'TOOLS':>5} {'REWARD':>7}  CALL ID"


def add_parser(sub, ref_help: str) -> None:
    tr = sub.add_parser(
        "traces", help="a run's traced trajectories from Weave: list, filter, --show one, --compare, --expect",
        description="List a run's traced rollout trajectories (the root calls verl's agent loops traced to Weave), "
                    "filtered by Weave's own query; show one turn by turn, compare several, or check that every "
                    "completed training step has as many as `check` estimated. The key comes from $WANDB_API_KEY, "
                    "wandb.api_key_file or ~/.netrc, as for submit.")
    tr.add_argument("ref", metavar="JOB|RUN_DIR", help=ref_help)
    tr.add_argument("--step", action="append", default=[], metavar="N|N:M",
                    help="training step N, or steps N to M; repeat for several")
    tr.add_argument("--sample-index", type=int, metavar="I", help="the dataset sample's index")
    tr.add_argument("--rollout-n", type=int, metavar="K", help="the rollout of the sample (0 .. rollout.n-1)")
    tr.add_argument("--experiment", metavar="NAME", help="another experiment of the run's project (default: the run's)")
    split = tr.add_mutually_exclusive_group()
    split.add_argument("--validate", action="store_const", const=True, dest="validate", help="validation only")
    split.add_argument("--train", action="store_const", const=False, dest="validate", help="training only")
    tr.add_argument("--limit", type=int, metavar="N", help="at most N trajectories")
    what = tr.add_mutually_exclusive_group()
    what.add_argument("--json", action="store_true", help="JSON lines: one trajectory each, with its nested calls "
                                                          "(generate, tool parser, tool execute), inputs and outputs")
    what.add_argument("--show", metavar="CALL_ID", help="one trajectory, turn by turn: prompt, response, tool calls, reward")
    what.add_argument("--compare", nargs="*", metavar="CALL_ID",
                      help="2 to 4 trajectories side by side, aligned by turn, differences marked: call ids, or none "
                           "and filters that pick them (--sample-index 3 --step 1 --step 3)")
    what.add_argument("--expect", action="store_true", help="exit 1 if any completed training step has fewer "
                                                            "trajectories than `check` estimated (for CI)")


def _filters(args) -> dict:
    return {"step": args.step or None, "sample_index": args.sample_index, "rollout_n": args.rollout_n,
            "validate": args.validate, "experiment": args.experiment, "limit": args.limit}


def cmd_traces(args) -> int:
    run = api.run(args.ref)
    if isinstance(run, api.SweepRun):
        return fail(f"error: {args.ref} is a sweep: give one point's job id (verl-launch status {args.ref} lists them)",
                    api.EXIT_BAD_INPUT)
    if args.show:
        return _show(run, args.show)
    if args.compare is not None:
        return _compare(run, args)
    if args.expect:
        t = run.trace_tally()
        print(f"traces     {t.text(ended=run.state() in api.TERMINAL)}")  # an ended run's unfinished step named
        return api.EXIT_FAILED if t.falls_short or not t.total else 0
    rows = run.traces(nested=args.json, **_filters(args))
    counts: dict = {}
    shown = 0
    for t in rows:
        shown += 1
        if not t["validate"] and isinstance(t["step"], int):
            counts[t["step"]] = counts.get(t["step"], 0) + 1
        if args.json:
            print(json.dumps(t))
            continue
        if shown == 1:
            print(HEAD)
        print(f"{_s(t['step']):>4} {_s(t['sample_index']):>6} {_s(t['rollout_n']):>7} "
              f"{'val' if t['validate'] else 'train':<5} {t['op'][:24]:<24} {t['turns']:>5} {t['tool_calls']:>5} "
              f"{_reward(t['reward']):>7}  {t['call_id']}", flush=shown <= 30)
    if args.json:
        return 0
    if not shown:
        print("no trajectories match")
        return 0
    print(_summary(run, counts, filtered=any(v is not None for v in _filters(args).values())))
    return 0


def _s(v) -> str:
    return "-" if v is None else str(v)


def _reward(v) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, (int, float)) else str(v)[:7]


def _summary(run, counts: dict, filtered: bool) -> str:
    """The listing's last line: per step against the estimate (the whole run's, unless filtered)."""
    total = sum(counts.values())
    steps = sorted(counts)
    if filtered or not steps:
        span = f", steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f", step {steps[0]}" if steps else ""
        return f"{total} training trajectories shown{span}"
    t = run.tally_of(counts)
    return f"{total} trajectories, {t.text().split(', ', 1)[1]}"


# ----------------------------------------------------------------------------- one, turn by turn
def _show(run, call_id: str) -> int:
    t = _one(run, call_id)
    print(f"trajectory {t['call_id']}: {t['op']}, step {_s(t['step'])}, sample {_s(t['sample_index'])}, "
          f"rollout {_s(t['rollout_n'])}, {'validation' if t['validate'] else 'training'}, experiment {t['experiment']}")
    out = t["output"] if isinstance(t["output"], dict) else {}
    if "prompt_text" not in out and "response_text" not in out:
        print("  (no decoded text: the run traced token ids only; trace.token2text=true decodes them)")
    print(_block("prompt", out.get("prompt_text"), _count(out.get("prompt_ids"))))
    for i, turn in enumerate(turns(t), 1):
        g = turn["generate"]
        gout = g.get("output") if isinstance(g.get("output"), dict) else {}
        text = gout.get("response_text") or gout.get("text")
        print(_block(f"turn {i}", text, _count(gout.get("token_ids")) or "the model's turn"))
        for parsed in turn["parsed"]:
            print(f"  parsed     {json.dumps(parsed)[:300]}")
        for call in turn["tools"]:
            print(f"  tool       {call['op'].rsplit('.', 1)[0]}({json.dumps(_tool_args(call))}) -> "
                  f"{_tool_result(call)}")
    print(_block("response", out.get("response_text"), _count(out.get("response_ids"))))
    for op in own_ops(t):  # the agent loop's own traced steps (a custom loop's), with what ran inside
        print(f"  op         {op['op']}({json.dumps(_op_args(op))[:300]}) -> {_tool_result(op)}")
        for call in [c for c in t.get("calls") or [] if c["parent_id"] == op["id"]]:
            print(f"    call     {call['op']}({json.dumps(_op_args(call))[:200]}) -> {_tool_result(call)[:200]}")
    print(f"reward     {_reward(t['reward'])}" + ("" if t["reward"] is not None else
                                                   " (not in the traced output: verl scores after the agent loop)"))
    return 0


def _one(run, call_id: str) -> dict:
    found = list(run.traces(call_ids=[call_id], nested=True))
    if not found:
        raise api.RecipeError(f"no trajectory {call_id!r} in the run's traces (verl-launch traces "
                              f"{run.job_id} lists them)", where="command line", key="--show")
    return found[0]


def own_ops(t: dict) -> List[dict]:
    """The agent loop's own traced steps, in order: what an agent loop's run (the root, or verl's
    loop inside a custom one) called besides verl's generate, tool parser, tools and loops."""
    calls = t.get("calls") or []
    loops = {t["call_id"]} | {c["id"] for c in calls if c["op"].endswith("AgentLoop.run")}
    executions = {id(c) for c in api.tool_executions(calls, name=lambda c: c["op"])}
    return [c for c in calls if c["parent_id"] in loops and id(c) not in executions
            and not c["op"].endswith((".generate", "AgentLoop.run")) and "extract_tool_calls" not in c["op"]]


def turns(t: dict) -> List[dict]:
    """The model's turns in order: each generate, then the tool parser's calls and the tool
    executions that follow it (until the next generate); not a tool an own op ran."""
    out: List[dict] = []
    own = {c["id"] for c in own_ops(t)}
    executions = {id(c) for c in api.tool_executions(t.get("calls") or [], name=lambda c: c["op"])
                  if c.get("parent_id") not in own}
    for call in t.get("calls") or []:
        op = call["op"]
        if op.endswith(".generate"):
            out.append({"generate": call, "parsed": [], "tools": []})
        elif out and id(call) in executions:
            out[-1]["tools"].append(call)
        elif out and "extract_tool_calls" in op:
            res = call.get("output")
            out[-1]["parsed"].append(res[1] if isinstance(res, (list, tuple)) and len(res) > 1 else res)
    return out


def _op_args(call: dict) -> dict:
    return {k: v for k, v in (call.get("inputs") or {}).items() if k != "self"}


def _tool_args(call: dict):
    inputs = call.get("inputs") or {}
    return inputs.get("parameters", {k: v for k, v in inputs.items() if k != "instance_id"})


def _tool_result(call: dict) -> str:
    if call.get("exception"):  # it raised: verl answers the model with the error and goes on
        return f"raised {_exception(call['exception'])[:300]}"
    res = call.get("output")
    if isinstance(res, (list, tuple)) and res:
        res = res[0]
    if isinstance(res, dict):
        res = res.get("text", res)
    return json.dumps(res)[:300] if not isinstance(res, str) else res[:300]


def _exception(raised) -> str:
    """Weave's record of an exception (JSON: type, message, traceback) as `Type: message`."""
    try:
        e = json.loads(raised) if isinstance(raised, str) else raised
        return f"{e['type']}: {e['message']}"
    except (ValueError, TypeError, KeyError):
        return str(raised)


def _count(ids) -> str:
    return f"{len(ids)} tokens" if isinstance(ids, list) else ""


def _block(label: str, text, fallback: str) -> str:
    if text is None:
        return f"{label:<10} ({fallback or 'not traced'})"
    lines = str(text).splitlines() or [""]
    return "\n".join([f"{label:<10} {lines[0]}"] + [f"{'':<10} {x}" for x in lines[1:]])


# ----------------------------------------------------------------------------- side by side
def _compare(run, args) -> int:
    if args.compare:
        picked = [_one(run, cid) for cid in args.compare]
    else:
        if not any(v is not None for k, v in _filters(args).items() if k != "limit"):
            return fail("error: command line: --compare: give 2 to 4 call ids, or filters that pick them "
                        "(e.g. --sample-index 3 --step 1 --step 3)", api.EXIT_BAD_INPUT)
        picked = list(run.traces(nested=True, **{**_filters(args), "limit": 5}))
    if not 2 <= len(picked) <= 4:
        more = "more than 4" if len(picked) > 4 else str(len(picked))
        return fail(f"error: command line: --compare: {more} trajectories picked; it compares 2 to 4 "
                    "(narrow it with --rollout-n or --sample-index, or give call ids)", api.EXIT_BAD_INPUT)
    rows = _compare_rows(picked)
    width = max(16, (shutil.get_terminal_size((160, 24)).columns - 14) // len(picked) - 2)
    for label, cells in rows:
        mark = "*" if len({json.dumps(c) for c in cells}) > 1 and label not in ("call id",) else " "
        print(f"{mark} {label:<13}" + "  ".join(f"{_cell(c, width):<{width}}" for c in cells).rstrip())
    print("(* marks what differs)")
    return 0


def _compare_rows(picked: List[dict]) -> List[tuple]:
    rows = [("call id", [t["call_id"] for t in picked])]
    for key in ("step", "sample_index", "rollout_n"):
        rows.append((key.replace("_", " "), [t[key] for t in picked]))
    outs = [t["output"] if isinstance(t["output"], dict) else {} for t in picked]
    rows.append(("prompt", [o.get("prompt_text", _count(o.get("prompt_ids"))) for o in outs]))
    all_turns = [turns(t) for t in picked]
    for i in range(max(len(x) for x in all_turns)):
        cells, tools = [], []
        for ts in all_turns:
            if i >= len(ts):
                cells.append("")
                tools.append("")
                continue
            gout = ts[i]["generate"].get("output") if isinstance(ts[i]["generate"].get("output"), dict) else {}
            cells.append(gout.get("response_text") or _count(gout.get("token_ids")))
            tools.append("; ".join(f"{c['op'].rsplit('.', 1)[0]}({json.dumps(_tool_args(c))}) -> {_tool_result(c)}"
                                   for c in ts[i]["tools"]))
        rows.append((f"turn {i + 1}", cells))
        if any(tools):
            rows.append(("  tools", tools))
    rows.append(("response", [o.get("response_text", _count(o.get("response_ids"))) for o in outs]))
    rows.append(("reward", [t["reward"] for t in picked]))
    return rows


def _cell(value, width: int) -> str:
    text = "-" if value is None or value == "" else str(value).replace("\n", " \u23ce ")
    return text if len(text) <= width else text[:width - 1] + "\u2026"
