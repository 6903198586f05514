"""Ray bring-up on the sandbox, measured against the limit: for N in {1, 2, 4} nodes, seconds from
a job's first line to "every node and GPU is in Ray", for

  ideal        the fastest bring-up Ray allows: a minimal sbatch script that starts the head and
               every worker at once (the same `ray start` options as ours: no dashboard, no
               autoscaler monitor, pinned ports) and polls the node
               table (what ray.nodes() reads, through Ray's GCS client) every 50 ms;
  verl-launch  our job (recipes/sandbox-demo.yaml): its `start` phase to its `ready` phase;
  fixed-sleep  verl's examples/tutorial/slurm/ray_on_slurm.slurm (head, `sleep 10`, each worker
               then `sleep 5`), "ready" when every node is alive: its sleeps may end before
               that, and verl would then start its driver on a partial cluster.

Medians of --repeat runs (interleaved), then the ratios; the last line is
`worst ours/ideal X; ours(4)/baseline(4) Y`. Targets: ours/ideal <= 1.15 at every N,
ours(4)/baseline(4) <= 0.5. Exit 1 if a target is missed.

Run it on a sandbox whose nodes each have their own CPU budget, or N nodes share this machine's
cores and Ray's own start-up (several Python processes a node) serialises across them:

    SANDBOX_NODE_CPU=0.45 make bench-bringup    # or: SANDBOX_NODE_CPU=0.45 tests/cluster/sandbox-up.sh,
    python bench/bringup_bench.py [--repeat 3] [--nodes 1 2 4]

--ray-args='ARGS' compares the ideal with ARGS added to every `ray start` (e.g.
'--include-log-monitor=false', or '--include-dashboard=true' for Ray's dashboard), to measure
what Ray's optional per-node processes cost.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GPUS = 2

HEADER = """#!/bin/bash
#SBATCH --job-name=bench-{kind}
#SBATCH --nodes={n}
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --gpus-per-node={gpus}
#SBATCH --output=slurm-%j.out
T0=$(date +%s.%N)
export RAY_USAGE_STATS_ENABLED=0
# Ray's token authentication, as every verl-launch job has it (issue 55): the limit is Ray's with it
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \\n' > "$PWD/ray-token-$SLURM_JOB_ID")
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$PWD/ray-token-$SLURM_JOB_ID
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_ip=$(hostname --ip-address)   # the batch script runs on the head node
P=$(( 30000 + (SLURM_JOB_ID % 50) * 40 ))
# our `ray start` options: the same processes per node, pinned ports
RAY_ARGS="--num-cpus=1 --num-gpus={gpus} --node-manager-port=$((P+1)) --object-manager-port=$((P+2))
  --metrics-export-port=$((P+3)) --dashboard-agent-listen-port=$((P+4)) --dashboard-agent-grpc-port=$((P+5))
  --runtime-env-agent-port=$((P+6)) --min-worker-port=$((P+9)) --max-worker-port=$((P+39))
  --disable-usage-stats --block {extra}"
export RAY_ARGS
"""

# Polls the node table until N nodes with their GPUs are alive; prints the time it saw them.
POLL = r"""
import socket, sys, time
host, port, n, gpus, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
while True:
    try:
        socket.create_connection((host, port), timeout=1).close()
        break
    except OSError:
        time.sleep(every)
import ray._raylet
gcs = ray._raylet.GcsClient(address=f"{host}:{port}")
while True:
    try:  # a GCS that does not answer yet (a starved head, token auth's first handshake): ask again
        alive = [x for x in gcs.get_all_node_info(timeout=5).values() if x.state == x.ALIVE]
    except Exception:
        time.sleep(every)
        continue
    if len(alive) >= n and sum(x.resources_total.get("GPU", 0) for x in alive) >= n * gpus:
        break
    time.sleep(every)
print(f"{time.time():.3f}")
"""

IDEAL = HEADER + """
srun --overlap -N1 -n1 -w "${{nodes[0]}}" {py} -m ray.scripts.scripts start --head --node-ip-address="$head_ip" \\
  --port=$P --ray-client-server-port=$((P+7)) --include-dashboard=false --no-monitor --temp-dir=/tmp/vlb-$SLURM_JOB_ID $RAY_ARGS &
if (( {n} > 1 )); then
  srun --overlap -N$(({n} - 1)) -n$(({n} - 1)) -w "$(IFS=,; echo "${{nodes[*]:1}}")" bash -c \\
    '{py} -m ray.scripts.scripts start --address='"$head_ip:$P"' --node-ip-address=$(hostname --ip-address) \\
     --temp-dir=/tmp/vlb-$SLURM_JOB_ID-$(hostname) $RAY_ARGS' &
fi
T1=$({py} -c "$POLL" "$head_ip" $P {n} {gpus} 0.05)
echo "RESULT start=$T0 ready=$T1 alive_at_start={n}"
kill $(jobs -p) 2>/dev/null; wait
"""

BASELINE = HEADER + """
# verl's examples/tutorial/slurm/ray_on_slurm.slurm: Ray's default options (its dashboard too);
# only a temp dir per node added, as the sandbox's nodes share one /tmp
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "${{nodes[0]}}" hostname --ip-address)  # as verl's example finds it
srun --nodes=1 --ntasks=1 -w "${{nodes[0]}}" {py} -m ray.scripts.scripts start --head --node-ip-address="$head_node_ip" \\
  --port=$P --num-cpus=1 --num-gpus={gpus} --temp-dir=/tmp/vlb-$SLURM_JOB_ID --disable-usage-stats {extra} --block &
sleep 10
for ((i = 1; i < {n}; i++)); do
  srun --nodes=1 --ntasks=1 -w "${{nodes[$i]}}" bash -c '{py} -m ray.scripts.scripts start --address='"$head_node_ip:$P"' \\
    --num-cpus=1 --num-gpus={gpus} --temp-dir=/tmp/vlb-$SLURM_JOB_ID-$(hostname) --disable-usage-stats {extra} --block' &
  sleep 5
done
# Here verl starts its driver. How many nodes are in Ray at this moment, and when all are:
ALIVE=$({py} -c 'import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(print(0))  # not even the GCS of the head is up
import ray._raylet as r
try:
    print(sum(x.state == x.ALIVE for x in r.GcsClient(address=sys.argv[1] + ":" + sys.argv[2]).get_all_node_info(timeout=5).values()))
except Exception:
    print(0)  # its GCS does not answer yet: no node to start the driver on' "$head_node_ip" $P)
T1=$({py} -c "$POLL" "$head_node_ip" $P {n} {gpus} 0.05)
echo "RESULT start=$T0 ready=$T1 alive_at_start=$ALIVE"
kill $(jobs -p) 2>/dev/null; wait
"""


def sh(*cmd, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def wait_job(job: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sh("squeue", "-h", "-j", job).strip():
            return
        time.sleep(0.5)
    sh("scancel", job)
    raise SystemExit(f"job {job} did not finish")


def script_job(kind: str, template: str, n: int, work: Path, extra: str = "") -> float:
    script = work / f"{kind}-{n}.sbatch"
    script.write_text(template.format(kind=kind, n=n, py=PY, gpus=GPUS, extra=extra))
    env = dict(os.environ, POLL=POLL)
    job = sh("sbatch", "--parsable", "--export=ALL", script.name, cwd=work, env=env).strip()
    wait_job(job)
    out = (work / f"slurm-{job}.out").read_text()
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        raise SystemExit(f"{kind} job {job} ({n} nodes) gave no result:\n{out[-2000:]}")
    kv = dict(tok.split("=") for tok in line.split()[1:])
    if int(kv["alive_at_start"]) != n:
        print(f"  ({kind}, {n} nodes: {kv['alive_at_start']} of {n} in Ray when it would start the driver)")
    return float(kv["ready"]) - float(kv["start"])


def ours(n: int, work: Path) -> float:
    env = dict(os.environ, WANDB_API_KEY=os.environ.get("WANDB_API_KEY") or "bench-" + "0" * 40)
    out = sh(PY, "-m", "launcher.cli", "submit", str(ROOT / "recipes" / "sandbox-demo.yaml"),
             f"runtime.python={PY}", f"paths.runs={work / 'runs'}", f"cluster.nodes={n}",
             f"cluster.gpus_per_node={GPUS}", "--json", env=env, cwd=ROOT)
    info = json.loads(out)
    phases = Path(info["phases"])
    ph = {}
    deadline = time.monotonic() + 300
    while "ready" not in ph and "error" not in ph and time.monotonic() < deadline:
        time.sleep(0.5)
        if phases.exists():
            for line in phases.read_text().splitlines():
                p = json.loads(line)
                ph.setdefault(p["phase"], p["time"])
    sh("scancel", info["job_id"])  # what runs after "ready" (the payload) is not measured
    wait_job(info["job_id"])
    if "ready" not in ph:
        raise SystemExit(f"{n}-node job never got ready: {info['stdout']}")
    return ph["ready"] - ph["start"]


def budget() -> str:
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    head = conf.splitlines()[0]
    cpu = head.split("nodecpu=")[1].split()[0] if "nodecpu=" in head else ""
    return f"{cpu} core(s) per node" if cpu else f"no per-node budget: all nodes share {os.cpu_count()} cores"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--ray-args", help="compare the ideal with these extra `ray start` arguments instead")
    args = ap.parse_args()
    if "SLURM_CONF" not in os.environ:
        raise SystemExit("export SLURM_CONF first (eval \"$(SANDBOX_NODE_CPU=0.45 tests/cluster/sandbox-up.sh)\")")
    work = Path(tempfile.mkdtemp(prefix="vl-bench-"))
    if args.ray_args:
        cols = {"ideal": lambda n: script_job("ideal", IDEAL, n, work),
                "ideal+args": lambda n: script_job("ideal", IDEAL, n, work, args.ray_args)}
    else:
        cols = {"ideal": lambda n: script_job("ideal", IDEAL, n, work),
                "verl-launch": lambda n: ours(n, work),
                "fixed-sleep": lambda n: script_job("baseline", BASELINE, n, work)}
    runs = {(c, n): [] for c in cols for n in args.nodes}
    for _ in range(args.repeat):  # interleaved, so that drift hits every column alike
        for n in args.nodes:
            for c, f in cols.items():
                runs[c, n].append(f(n))
                print(f"  {c}({n}): {runs[c, n][-1]:.2f} s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    names = list(cols)
    print(f"{'nodes':>5}" + "".join(f"{c + ' s':>15}" for c in names) + f"{names[1] + '/ideal':>20}"
          + (f"{'ours/fixed-sleep':>18}" if len(names) > 2 else ""))
    for n in args.nodes:
        row = f"{n:>5}" + "".join(f"{med[c, n]:>15.2f}" for c in names) + f"{med[names[1], n] / med['ideal', n]:>20.2f}"
        if len(names) > 2:
            row += f"{med['verl-launch', n] / med['fixed-sleep', n]:>18.2f}"
        print(row)
    print(f"medians of {args.repeat} runs each; {budget()}; runs: "
          + json.dumps({f"{c}({n})": [round(x, 2) for x in v] for (c, n), v in runs.items()}))
    worst = max(med[names[1], n] / med["ideal", n] for n in args.nodes)
    if args.ray_args:
        print(f"worst ideal+args/ideal {worst:.2f} (ray start {args.ray_args})")
        return 0
    line, ok = f"worst ours/ideal {worst:.2f}", worst <= 1.15
    if 4 in args.nodes:
        # No launcher on `ray start` gets below the ideal: the bound on the second target.
        print(f"bound: ideal(4)/baseline(4) {med['ideal', 4] / med['fixed-sleep', 4]:.2f}")
        vs = med["verl-launch", 4] / med["fixed-sleep", 4]
        line += f"; ours(4)/baseline(4) {vs:.2f}"
        ok = ok and vs <= 0.5
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
