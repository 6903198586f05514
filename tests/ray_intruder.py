"""TEST-ONLY: an outsider at a running job's Ray (issue 55), as `train(during=...)` of a shared job.

Once every node of the job has joined (phase `ready`), from this machine (outside the job, as
anyone who can reach a node), each attempt in a process of its own, against the head's GCS port:
a driver with no token (a plain `ray.init(address=...)`), one with a wrong token, a bare GCS
client, and, so that the refusals are the token's doing and not the network's, a driver with the
job's own token. Then, as another user (`runuser -u nobody`): read the token file, list the
job's Ray dir on the head node. What each did goes to `results`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

JOIN = ("import ray, sys\n"
        "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
        "print('JOINED', sum(1 for n in ray.nodes() if n['Alive']))\n")
GCS = ("import sys\n"
       "from ray._raylet import GcsClient\n"
       "print('GCS', len(GcsClient(address=sys.argv[1]).get_all_node_info(timeout=5)))\n")


def _phases(run_dir: Path) -> list:
    try:
        return [json.loads(x) for x in (run_dir / "phases.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return []


class Intruder:
    def __init__(self, env: dict):
        self.env = env  # the sandbox's (SLURM_CONF), for scontrol
        self.scontrol = ""  # `scontrol show job` while the job ran
        self.results: dict = {}
        self.token = None  # the job's token, read as the job's user (root here), to look for later
        self.thread = None

    def __call__(self, run_dir: Path, first: dict) -> None:
        if self.thread is None and any(p["phase"] == "ready" for p in _phases(run_dir)):
            self.thread = threading.Thread(target=self._try, args=(run_dir,), daemon=True)
            self.thread.start()

    def wait(self, timeout: float = 180) -> dict:
        if self.thread is not None:
            self.thread.join(timeout)
        return self.results

    def _attempt(self, name: str, code: str, address: str, **env) -> None:
        plain = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, "-c", code, address], env={**plain, **env}, capture_output=True,
                               text=True, timeout=120, stdin=subprocess.DEVNULL)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = "timeout", str(e.stdout or ""), str(e.stderr or "")
        self.results[name] = {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "out": out[-500:],
                              "err": " ".join(err.split())[-1500:]}

    def _as_nobody(self, name: str, *cmd: str) -> None:
        p = subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, timeout=30)
        self.results[name] = {"rc": p.returncode, "out": p.stdout[-300:], "err": p.stderr[-300:]}

    def _try(self, run_dir: Path) -> None:
        address = [p for p in _phases(run_dir) if p["phase"] == "head-up"][-1]["detail"]
        token_file = sorted(run_dir.glob(".ray-token.r*"), key=lambda p: p.stat().st_mtime)[-1]
        self.token = token_file.read_text()
        self.results["token_file"] = {"name": token_file.name, "mode": oct(token_file.stat().st_mode & 0o777)}
        job = next(run_dir.glob("slurm-*.out")).name[len("slurm-"):-len(".out")]  # the job's output, named by Slurm
        homes = sorted(Path("/tmp").glob(f"vl-{job}-node1"))  # the head's ray_home (the sandbox's nodes share /tmp)
        self.results["ray_home"] = {"path": str(homes[-1]) if homes else None,
                                    "mode": oct(homes[-1].stat().st_mode & 0o777) if homes else None}
        self._attempt("no_token", JOIN, address)
        self._attempt("bare_gcs_client", GCS, address)
        self._attempt("wrong_token", JOIN, address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        self._attempt("with_token", JOIN, address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file))
        self.scontrol = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                                       env=self.env).stdout
        self._as_nobody("nobody_reads_token", "cat", str(token_file))
        if homes:
            self._as_nobody("nobody_lists_ray_home", "ls", str(homes[-1]))
