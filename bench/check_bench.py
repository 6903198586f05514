"""How long `check` takes (issue 11), each case side by side with its yardstick, alternating
A B A B ..., N runs each, whole processes (start-up included); medians and their ratio:

1. `check` without verl (runtime.python has none, as on a login node), a misspelt verl key on
   the command line (exit 2) <= 1.6 x importing hydra, omegaconf and jinja2;
2. `check` again, verl's "ok" cached                                  <= 1.3 x `render`;
3. `check` with an empty cache (verl's first full preflight)          <= 1.15 x importing verl
   and composing its config in a fresh interpreter.

    python bench/check_bench.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
RECIPE = str(ROOT / "recipes" / "gsm8k-grpo.yaml")
CLI = [PY, "-m", "launcher.cli"]
VERL_FLOOR = ("import os, verl\nfrom hydra import compose, initialize_config_dir\n"
              "d = os.path.join(os.path.dirname(verl.__file__), 'trainer', 'config')\n"
              "with initialize_config_dir(config_dir=d, version_base=None):\n"
              "    compose(config_name='ppo_trainer')\n")


def timed(cmd, env, expect: int) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=env["HOME"])
    took = time.monotonic() - t0
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}, wanted {expect}\n{proc.stderr[-2000:]}")
    return took


def pair(name: str, a, b, target: float, repeat: int, before_a=lambda: None) -> None:
    ta, tb = [], []
    for _ in range(repeat):
        before_a()
        ta.append(a())
        tb.append(b())
    ma, mb = statistics.median(ta), statistics.median(tb)
    verdict = "ok" if ma / mb <= target else "OVER"
    print(f"{name}: median {ma:.3f} s (min {min(ta):.3f}, max {max(ta):.3f}) vs {mb:.3f} s "
          f"(min {min(tb):.3f}, max {max(tb):.3f}): ratio {ma / mb:.2f}, target <= {target} {verdict}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    n = ap.parse_args().repeat
    with tempfile.TemporaryDirectory(prefix="vl-check-bench-") as tmp:
        env = dict(os.environ, HOME=tmp, XDG_CACHE_HOME=str(Path(tmp) / "cache"),
                   WANDB_API_KEY="bench-" + "0" * 40)
        py = f"runtime.python={PY}"
        typo = [*CLI, "check", RECIPE, "runtime.python=/usr/bin/python3", "+verl.overrides.trainer.total_epoch=2"]
        pair("1. check without verl, a typo found", lambda: timed(typo, env, 2),
             lambda: timed([PY, "-c", "import hydra, omegaconf, jinja2"], env, 0), 1.6, n)
        timed([*CLI, "check", RECIPE, py], env, 0)  # fills the cache
        pair("2. check, preflight cached", lambda: timed([*CLI, "check", RECIPE, py], env, 0),
             lambda: timed([*CLI, "render", RECIPE], env, 0), 1.3, n)
        cache = Path(tmp) / "cache" / "verl-launch" / "preflight"

        def empty():
            for f in cache.glob("*.json"):
                f.unlink()
        pair("3. check, first full preflight", lambda: timed([*CLI, "check", RECIPE, py], env, 0),
             lambda: timed([PY, "-c", VERL_FLOOR], env, 0), 1.15, n, before_a=empty)
    return 0


if __name__ == "__main__":
    sys.exit(main())
