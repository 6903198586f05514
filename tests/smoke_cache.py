"""The smoke run's assets, built once for all test sessions of this code (the `smoke_assets`
fixture), and the same build started ahead by `make test` (`python tests/smoke_cache.py`).

The tool model is taught on the CPU: about 170 s on 2 threads, the longest single piece of a
clean clone's verl tier, where a worker that needed the assets sat idle while the other built
them. `make test` starts this build beside the quick tier, so that they are ready (or nearly)
when the verl tier starts; a failed build here is built again by the fixture, which fails the
test in the build's own words.

Kept by the hash of the code that builds them (and torch's version), under a lock. The
versions of what else shapes their bytes (transformers, tokenizers, pyarrow, verl) are written
in the folder's `built` marker and compared at each reuse: other versions build them again.
(Not in the key itself, so that assets already built here were not all built again; a marker
from before the versions were recorded is taken as this environment's.)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def passive_omp(env=None) -> dict:
    """ENV (or this process's) with OpenMP's idle threads asleep, not spinning: the build's 2
    torch threads beside another busy process (make test's other worker) spun on the 2 cores.
    Beside one busy process a 300-step teaching took 126 s, 73 s with this; alone, the same.
    The thread count, and so every byte built, is unchanged."""
    return {**(os.environ if env is None else env), "OMP_WAIT_POLICY": "PASSIVE"}


def ensure() -> Path:
    """The assets' folder, built first if this code has none (or another build was cut short)."""
    code = b"".join((ROOT / "launcher" / f).read_bytes() for f in ("smoke_assets.py", "tool_assets.py", "smoke_reward.py"))
    key = hashlib.sha256(code + sys.version.encode() + version("torch").encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / "verl-launch-smoke-assets"
    root.mkdir(exist_ok=True)
    out = root / key
    versions = json.dumps({p: version(p) for p in ("transformers", "tokenizers", "pyarrow", "verl")}, sort_keys=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker, or make test's early build, may be building them
        marker = out / "built"
        said = marker.read_text() if marker.exists() else None
        if said is None or (said and said != versions):  # never built, cut short, or other versions
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run([sys.executable, "-m", "launcher.smoke_assets", "--out", str(out)], cwd=ROOT,
                                  env=passive_omp(), capture_output=True, text=True, timeout=1200,
                                  stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise RuntimeError(f"the smoke assets' build failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            marker.write_text(versions)
        elif not said:
            marker.write_text(versions)
    return out


if __name__ == "__main__":
    try:
        print(ensure())
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"smoke_cache: {e}", file=sys.stderr)
        raise SystemExit(1)
