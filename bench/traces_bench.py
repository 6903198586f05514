"""`verl-launch traces RUN` and `status RUN` at a run's scale: 10,000 and 100,000 recorded
trajectories (and more with --sizes), the CLI's own CPU seconds and peak memory for each command.

The trajectories sit in the loopback W&B stand-in (tests/wandb_standin.py), in a process of its
own, shaped as verl's single-turn agent loop traces them with token2text on (a root `run` with
prompt/response ids and text, one `generate` inside), 200 a step; the run is a real one (the demo
recipe, `submit --local`) pointed at that project. For each command:

- cpu_s: the command's own user + system CPU seconds (wait4's rusage of that process alone);
- peak_rss_mb: its VmHWM, read from /proc while it runs (not ru_maxrss, which keeps the high-water
  mark of the process it was forked from);
- wall_s: from its start to its end; on loopback, and mostly the stand-in's own linear scan per
  query at 100k: a real Weave server indexes this, so wall time is not a target here.

Commands: the listing's first screen (`--limit 24`), one step (`--step 3`), `--expect`,
`status`, and the whole `--json` stream (every trajectory with its nested calls).

    python bench/traces_bench.py [--sizes 10000 100000] [--repeat 1]
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

KEY = "local-" + "b" * 48
ENTITY, PROJECT, EXPERIMENT = "bench", "traces-bench", "bench-exp"
PER_STEP = 200


def fill(w, n: int, per_step: int) -> None:
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


def serve(n: int) -> None:
    """The stand-in, filled with N trajectories, in this process until stdin closes."""
    from wandb_standin import StandIn

    with StandIn(api_key=KEY) as w:
        fill(w, n, PER_STEP)
        print(w.url, flush=True)
        sys.stdin.read()


def timed(cmd, env, out: Path) -> dict:
    """Run CMD, its stdout to OUT: its own CPU seconds, its peak RSS (VmHWM) and wall time."""
    t0 = time.monotonic()
    with open(out, "w") as f:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.PIPE, text=True)
    hwm = 0
    status = Path(f"/proc/{proc.pid}/status")
    while True:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]))
        except OSError:
            pass
        pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(code) not in (0, 1):  # --expect may say 1: some step is short
        raise SystemExit(f"{cmd} failed: {proc.stderr.read()[-2000:]}")
    lines = sum(1 for _ in open(out))
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": hwm / 1024, "wall_s": wall, "lines": lines,
            "last": (out.read_text().strip().splitlines() or [""])[-1][:160]}


def one_size(n: int, repeat: int, tmp: Path, env: dict) -> dict:
    stand = subprocess.Popen([sys.executable, __file__, "--serve", str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = stand.stdout.readline().strip()
        if not url.startswith("http"):
            raise SystemExit(f"the stand-in did not start for {n}")
        sub = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(ROOT / "recipes/sandbox-demo.yaml"),
                              "--local", "--no-check", "--json", f"runtime.python={sys.executable}",
                              f"paths.runs={tmp / 'runs'}", f"wandb.base_url={url}", f"wandb.entity={ENTITY}",
                              f"wandb.project={PROJECT}", f"wandb.experiment={EXPERIMENT}", "wandb.reach_timeout=5",
                              "verl.overrides.data.train_batch_size=100", "trace.max_samples_per_step_per_worker=null",
                              "verl.overrides.actor_rollout_ref.rollout.n=2"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if sub.returncode != 0:
            raise SystemExit(sub.stderr[-3000:])
        run = json.loads(sub.stdout.strip().splitlines()[-1])
        traces = [sys.executable, "-m", "launcher.cli", "traces", run["run_dir"]]
        commands = {"--limit 24": traces + ["--limit", "24"], "--step 3": traces + ["--step", "3"],
                    "--expect": traces + ["--expect"],
                    "status": [sys.executable, "-m", "launcher.cli", "status", run["run_dir"]],
                    "--json": traces + ["--json"]}
        got = {}
        for name, cmd in commands.items():
            runs = [timed(cmd, env, tmp / "out.txt") for _ in range(repeat)]
            got[name] = {k: round(statistics.median(r[k] for r in runs), 2) for k in ("cpu_s", "peak_rss_mb", "wall_s")}
            got[name].update(lines=runs[-1]["lines"], last=runs[-1]["last"])
            print(f"{n:>7} {name:<11} {got[name]}", file=sys.stderr, flush=True)
        return got
    finally:
        stand.stdin.close()
        stand.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="traces-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "WEAVE_", "WF_", "SLURM_"))}
    env.update(WANDB_API_KEY=KEY, VERL_LAUNCH_STATE=str(tmp / "state"), HOME=str(tmp / "home"))
    sizes = {n: one_size(n, args.repeat, tmp, env) for n in args.sizes}
    small, big = min(sizes), max(sizes)
    ratio = {name: round(sizes[big][name]["cpu_s"] / max(sizes[small][name]["cpu_s"], 0.01), 2)
             for name in sizes[small]} if big != small else {}
    print(json.dumps({"trajectories": sizes, f"cpu_ratio_{big}_to_{small}": ratio, "runs": args.repeat,
                      "targets": {"status and --expect at 100k": "cpu_s <= 1 or <= 1.5 x their 10k figure",
                                  "peak_rss_mb at 100k": "< 150 for every command",
                                  "--json": "linear in trajectories, flat memory"}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
