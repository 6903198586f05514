"""`make demo-verl`: verl's own trainer on the sandbox (recipes/sandbox-tool-agent.yaml, on
recipes/sandbox-verl.yaml): async-rollout GRPO with vLLM's CPU build on 2 nodes, the tool model
calling a real calculator through verl's ToolAgentLoop beside the example agent loop, Weave
tracing to a loopback W&B stand-in on the sandbox's bridge (a throwaway key: your own never
leaves for it), followed with `submit --wait`, then a short report read from verl's log, Ray's
GCS and the stand-in, and a tool-calling trajectory read back as a user would open it first
(the prompt, the call, the tool's result, the answer, the reward). Exits with the job's verdict.
Each run is a new experiment (demo-<time>), so it starts fresh instead of resuming the last."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verl_train import BRIDGE, NODE_IP, ROOT, train  # noqa: E402
from wandb_standin import StandIn  # noqa: E402


def _num(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def report(job) -> str:
    steps = job.steps
    lines = [f"verl trained {len(steps)} step(s) on {', '.join(job.nodes_of('WorkerDict')) or '?'}"
             f" (job {job.job_id}, {job.seconds:.0f} s from submit to the end)",
             " step  reward mean  grad_norm  rollout/actor corr  s/step"]
    for n, m in sorted(steps.items()):
        lines.append(f"{n:5d}  {_num(m.get('critic/score/mean'), '11.3f')}  {_num(m.get('actor/grad_norm'), '9.3f')}"
                     f"  {_num(m.get('training/rollout_actor_probs_pearson_corr'), '18.4f')}"
                     f"  {_num(m.get('timing_s/step'), '6.1f')}")
    per_step = {}
    for c in job.trajectories:
        per_step[c["attributes"].get("step")] = per_step.get(c["attributes"].get("step"), 0) + 1
    nodes = sorted({NODE_IP.get(c["client"], c["client"]) for c in job.trajectories})
    lines.append(f"vLLM      servers on {', '.join(job.nodes_of('vLLMHttpServer')) or 'no node'}")
    lines.append(f"traces    {len(job.trajectories)} trajectories to Weave (the stand-in), per step "
                 f"{', '.join(f'{k}: {v}' for k, v in sorted(per_step.items(), key=lambda kv: str(kv[0])))},"
                 f" from {', '.join(nodes) or 'no node'}")
    for run in job.wandb_runs.values():
        lines.append(f"W&B       run {run['name']}: {len(run['history'])} history rows, exit code {run['exit_code']}")
        if len(run["history"]) < len(steps):  # README, "Not verified here"
            lines.append("          (verl 0.9.1 finishes its wandb run only as its trainer exits: the last"
                         " seconds of metrics never leave)")
    lines.append(f"checkpoint {job.checkpoint or 'none'}")
    lines.append(f"run dir   {job.run_dir}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--node-python", required=True, help="the node environment's interpreter (make node-env)")
    ap.add_argument("--runs", default="/tmp/verl-launch-runs", help="paths.runs (default %(default)s)")
    ap.add_argument("overrides", nargs="*", help="more recipe overrides")
    args = ap.parse_args(argv)
    env = dict(os.environ, WANDB_API_KEY="sandbox-" + secrets.token_hex(24))
    env.pop("WANDB_BASE_URL", None)
    experiment = time.strftime("demo-%Y%m%d-%H%M%S")
    with StandIn(host=BRIDGE, api_key=env["WANDB_API_KEY"]) as w:  # up after the job: `traces` reads it
        job = train(node_python=args.node_python, runs=Path(args.runs), env=env, echo=True, standin=w, watch_gcs=True,
                    recipe=RECIPE, overrides=[f"wandb.experiment={experiment}", *args.overrides])
        sys.stderr.write(job.err[-3000:] if job.returncode else "")
        if job.run_dir is None:
            print("no run directory: submit failed (see above)", file=sys.stderr)
            return job.returncode or 1
        print("--- what verl logged, Ray ran and the W&B stand-in received:")
        print(report(job))
        if job.trajectories:
            show_traces(job, env)
    return job.returncode


RECIPE = ROOT / "recipes" / "sandbox-tool-agent.yaml"  # the suite's traced run (tests/traced_run.py) runs it too
TOOL_LOOP, EXAMPLE_LOOP = "ToolAgentLoop.run", "CheckedAgentLoop.run"


def show_traces(job, env) -> None:
    """The trajectories read back as a user would: the list, then the story the demo is for: a
    trajectory in which the model called the calculator (the prompt, the call, the tool's result,
    the answer, the reward), and the first step's against the last step's."""
    def cli(*args, echo=True):
        if echo:
            print(f"--- verl-launch traces {' '.join(args)}", flush=True)
        return subprocess.run([sys.executable, "-m", "launcher.cli", "traces", job.job_id, *args], env=env, cwd=ROOT,
                              stdin=subprocess.DEVNULL, capture_output=not echo, text=True)

    cli("--limit", "6")
    rows = [json.loads(x) for x in cli("--json", echo=False).stdout.splitlines() if x.startswith("{")]
    called = sorted((t for t in rows if t.get("op") == TOOL_LOOP and t.get("tool_calls")),
                    key=lambda t: (t.get("step") or 0, t.get("sample_index") or 0, t.get("rollout_n") or 0))
    picked = called or sorted(rows, key=lambda t: t.get("step") or 0)  # no call traced: what there is
    if not picked:
        return
    cli("--show", picked[0]["call_id"])
    if picked[-1]["call_id"] != picked[0]["call_id"]:
        cli("--compare", picked[0]["call_id"], picked[-1]["call_id"])  # the first step's against the last's
    # verl scores a ToolAgentLoop trajectory after the loop: the example loop's own op carries its reward
    scored = [t for t in rows if t.get("op") == EXAMPLE_LOOP and t.get("reward") is not None]
    if scored:
        cli("--show", scored[0]["call_id"])


if __name__ == "__main__":
    sys.exit(main())
