"""`verl-launch traces RUN` over 10,000 recorded trajectories (issue 31's targets: the first
screen in under 2 s, the whole --json stream in under 10 s, memory that does not grow with the
run: it streams).

The trajectories sit in the loopback W&B stand-in (tests/wandb_standin.py), shaped as verl's
single-turn agent loop traces them with token2text on (a root `run` with prompt/response ids
and text, one `generate` inside), 10,000 roots over 50 steps; the run is a real one (the demo
recipe, `submit --local`) pointed at that project. Timed from the command's start:

- first screen: until the listing's first 24 lines are on its stdout;
- --json: until the stream ends (every trajectory with its nested calls' inputs and outputs);
- peak memory: the command's maximum RSS (getrusage of the child).

    python bench/traces_bench.py [--trajectories 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from wandb_standin import StandIn  # noqa: E402

KEY = "local-" + "b" * 48
ENTITY, PROJECT, EXPERIMENT = "bench", "traces-bench", "bench-exp"


def fill(w: StandIn, n: int, per_step: int) -> None:
    """N trajectories as the stand-in records verl's (roots plus one generate each)."""
    calls = []
    t0 = time.time()
    for i in range(n):
        step, sample = i // per_step + 1, (i % per_step) // 2
        root, gen = str(uuid.uuid4()), str(uuid.uuid4())
        attrs = {"step": step, "sample_index": sample, "rollout_n": i % 2, "validate": False,
                 "experiment_name": EXPERIMENT}
        at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 + i)) + f".{i % 1000000:06d}Z"
        prompt, response = list(range(100 + i % 50)), list(range(64))
        base = {"trace_id": root, "attributes": attrs, "entity": ENTITY, "project": PROJECT, "auth_ok": True,
                "started_at": at, "ended_at": at, "summary": {}, "exception": None}
        calls.append({**base, "id": root, "parent_id": None, "op_name": "SingleTurnAgentLoop.run",
                      "short_name": "SingleTurnAgentLoop.run",
                      "inputs": {"sampling_params": {"temperature": 1.0}, "raw_prompt": [{"role": "user",
                                                                                        "content": f"what is {i}+1?"}]},
                      "output": {"prompt_ids": prompt, "response_ids": response, "response_mask": [1] * 64,
                                 "num_turns": 2, "reward_score": None, "prompt_text": f"what is {i}+1?" * 4,
                                 "response_text": f"the answer is {i + 1}" * 4}})
        calls.append({**base, "id": gen, "parent_id": root, "op_name": "AsyncLLMServerManager.generate",
                      "short_name": "AsyncLLMServerManager.generate", "inputs": {"prompt_ids": prompt},
                      "output": {"token_ids": response}})
    w.calls.extend(calls)


def timed(cmd, env, lines_wanted=None) -> tuple:
    """(seconds to LINES_WANTED lines or to the end, seconds to the end, lines read, max RSS in MB)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    n, first = 0, None
    for _ in proc.stdout:
        n += 1
        if lines_wanted and n == lines_wanted and first is None:
            first = time.monotonic() - t0
    _, status, usage = os.wait4(proc.pid, 0)  # this command's own rusage, not every child's
    end = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd} failed: {proc.stderr.read()[-2000:]}")
    return (first if lines_wanted else end), end, n, usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    per_step = 200
    tmp = Path(tempfile.mkdtemp(prefix="traces-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "WEAVE_", "WF_", "SLURM_"))}
    env.update(WANDB_API_KEY=KEY, VERL_LAUNCH_STATE=str(tmp / "state"), HOME=str(tmp / "home"))
    with StandIn(api_key=KEY) as w:
        fill(w, args.trajectories, per_step)
        sub = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(ROOT / "recipes/sandbox-demo.yaml"),
                              "--local", "--no-check", "--json", f"runtime.python={sys.executable}",
                              f"paths.runs={tmp / 'runs'}", f"wandb.base_url={w.url}", f"wandb.entity={ENTITY}",
                              f"wandb.project={PROJECT}", f"wandb.experiment={EXPERIMENT}", "wandb.reach_timeout=5",
                              "verl.overrides.data.train_batch_size=100", "trace.max_samples_per_step_per_worker=null",
                              "verl.overrides.actor_rollout_ref.rollout.n=2"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if sub.returncode != 0:
            raise SystemExit(sub.stderr[-3000:])
        run_dir = json.loads(sub.stdout.strip().splitlines()[-1])["run_dir"]
        base = [sys.executable, "-m", "launcher.cli", "traces", run_dir]
        first, listing, streamed, rss = [], [], [], []
        for _ in range(args.repeat):
            f, end, n, mb = timed(base, env, lines_wanted=24)
            first.append(f)
            listing.append(end)
            _, end, n_json, mb_json = timed(base + ["--json"], env)
            streamed.append(end)
            rss += [mb, mb_json]
    med = statistics.median
    print(json.dumps({"trajectories": args.trajectories, "listed_lines": n, "json_lines": n_json,
                      "first_screen_s": round(med(first), 2), "whole_listing_s": round(med(listing), 2),
                      "json_stream_s": round(med(streamed), 2), "peak_rss_mb": round(max(rss), 1),
                      "runs": args.repeat, "targets": {"first_screen_s": 2, "json_stream_s": 10}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
