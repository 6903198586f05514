"""How long a job holds its allocation after a vLLM engine dies (the loop issue's target: under 2
minutes), on the sandbox with verl's own trainer (recipes/sandbox-verl.yaml, vLLM's CPU build):
node2's EngineCore is SIGKILLed 2.2 s after verl logs step 2, and the time is taken from the kill
to the end of `submit --wait` (the job torn down, nothing left). Twice: as verl 0.9.1 behaves here
(it fails of the dead engine by itself), and with verl's fit loop frozen first (a trainer that
waits for ever: the watchdog's verdict ends it).

    make node-env; eval "$(tests/cluster/sandbox-up.sh)"
    python bench/dead_engine_bench.py                  # make bench-dead-engine
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from verl_train import bench_args, job_env, kill_engine_mid_training  # noqa: E402


def main(argv=None) -> int:
    args, smoke = bench_args(__doc__, argv)
    with tempfile.TemporaryDirectory(prefix="dead-engine-") as tmp:
        for freeze in (False, True):
            env = job_env(os.environ, wandb_key="bench-" + secrets.token_hex(24), smoke=smoke, tmp=tmp)
            job, kill, seconds = kill_engine_mid_training(node_python=args.node_python, env=env, freeze_trainer=freeze,
                                                          runs=Path(tmp) / f"runs-{int(freeze)}")
            if seconds is None:
                sys.exit(f"the engine was not killed: {kill.why_not or 'the job ended first'} (rc {job.returncode})"
                         f"\n{job.out[-3000:]}{job.err[-3000:]}")
            names = [p["phase"] for p in job.phases]
            by = "no driver-error phase" if "driver-error" not in names else \
                "the watchdog's verdict" if "driver-end" not in names or names.index("driver-error") < \
                names.index("driver-end") else "verl failed of it"
            print(f"trainer {'frozen' if freeze else 'as is'}: killed EngineCore pid {kill.pid} on node2; job "
                  f"{job.job_id} ended rc {job.returncode} {seconds:.1f} s later ({by})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
