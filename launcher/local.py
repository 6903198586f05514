"""Local mode: the same rendered script, run on this machine without Slurm, for a one-box
smoke run (a CI runner with a GPU). One node, the GPUs it has, free Ray ports, the same run
directory, logs, phases and exit status.

Slurm's few commands that the script calls (srun, scontrol show hostnames, squeue) come from
small shims in templates/local/, first on the script's PATH; the SLURM_* variables it reads
are set here. No process may outlive the run: the script's own teardown stops its steps, and
anything left that carries this run's marker variable is killed and reported.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Mapping, TextIO

from .plan import RAY_FIXED_PORTS, Plan
from .resources import templates_dir
from .slurm import SubmitRequest, record_run

MARKER = "VERL_LAUNCH_LOCAL_RUN"  # in the environment of every process of a local run


def local_overrides(environ: Mapping[str, str]) -> List[str]:
    """One node, the GPUs this machine shows (CUDA_VISIBLE_DEVICES, else the recipe's count),
    and the interface of the address Ray itself picks here."""
    ovs = ["cluster.nodes=1", f"cluster.network_interface={_interface_of(_ray_ip())}"]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ovs.append(f"cluster.gpus_per_node={len([d for d in visible.split(',') if d.strip()])}")
    elif shutil.which("nvidia-smi", path=environ.get("PATH")) is None:
        ovs.append("node_checks.gpus=false")  # the recipe's count stands in: nothing here to count
    return ovs


def _ray_ip() -> str:
    """The address Ray registers a node with when told loopback: the one a UDP socket toward
    a public address would use (nothing is sent), else loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("8.8.8.8", 80))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _interface_of(ip: str) -> str:
    """The interface holding ``ip`` (`ip -o -4 addr`), for cluster.network_interface."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == ip:
            return fields[1]
    return "lo"


def _free_job_id(p: Plan) -> int:
    """A job id whose block of Ray ports is free on this machine now."""
    lo = p.recipe.cluster.port_range[0]
    block = RAY_FIXED_PORTS + p.recipe.cluster.worker_ports
    for _ in range(50):
        job_id = random.randrange(100000, 999999)
        first = lo + (job_id % p.port_slots) * block
        if all(_port_free(p) for p in range(first, first + block)):
            return job_id
    raise OSError("no free block of Ray ports found in cluster.port_range")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every address: Ray listens on the node's own
            return True
        except OSError:
            return False


def run(req: SubmitRequest, plan: Plan, environ: Mapping[str, str], out: TextIO = sys.stdout) -> dict:
    """Write the run directory, run the script here, and return its run record (with
    final_state, exit_code and leftovers, the number of processes that had to be killed)."""
    p = req.paths
    p.create(req.script, req.recipe_yaml)
    shims = p.run_dir / ".local-bin"
    shutil.copytree(templates_dir() / "local", shims)
    for shim in shims.iterdir():  # a wheel does not keep the executable bit
        shim.chmod(0o700)
    job_id = str(_free_job_id(plan))
    host = socket.gethostname().split(".")[0]
    env = dict(environ, PATH=f"{shims}{os.pathsep}{environ.get('PATH', '')}", SLURM_JOB_ID=job_id,
               SLURM_JOB_NODELIST=host, SLURMD_NODENAME=host, SLURM_CPUS_PER_TASK=str(plan.recipe.cluster.cpus_per_task),
               SLURM_RESTART_COUNT="0", **{MARKER: job_id})
    record = record_run(req, job_id, local=True, command=f"bash {p.SCRIPT} (here, without Slurm)",
                        runner={"host": host, "pid": os.getpid()})
    t0 = time.time()
    proc = subprocess.Popen(["bash", p.SCRIPT], cwd=p.run_dir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    # Output is pumped beside the wait: a leftover holding the pipe open must not hang us.
    pump = threading.Thread(target=_pump, args=(proc.stdout, p.stdout(job_id), out), daemon=True)
    pump.start()

    def stop(signum, frame):  # as scancel would: TERM to the script, whose teardown runs
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C: the same, and wait for the teardown
                stop(None, None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    leftovers = _kill_leftovers(job_id)
    pump.join(timeout=10)
    record.update(finished=time.time(), elapsed=round(time.time() - t0, 1), exit_code=f"{rc}:0",
                  final_state="COMPLETED" if rc == 0 else "FAILED", leftovers=len(leftovers),
                  leftover_processes=leftovers)
    p.write_record(record)
    if leftovers:
        out.write(f"verl-launch: killed {len(leftovers)} process(es) the job left behind: {leftovers}\n")
    return record


def _pump(stream, path: Path, out: TextIO) -> None:
    """The script's output to Slurm's output file and to the terminal."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as log:
        for line in stream:
            log.write(line)
            log.flush()
            out.write(line.decode(errors="replace"))
            out.flush()


def _marked(job_id: str) -> List[int]:
    """Live processes carrying this run's marker (zombies are gone already)."""
    needle = f"{MARKER}={job_id}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                continue
            if needle in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except (OSError, IndexError):
            continue
    return found


def _kill_leftovers(job_id: str, grace: float = 10.0) -> List[str]:
    """Processes still carrying this run's marker once the script has ended (a daemonised child
    that escaped teardown), as "pid:name", killed. Orphans on their way out get GRACE seconds
    first: a trainer's DataLoader workers, say, notice their parent is gone within 5 s."""
    deadline = time.monotonic() + grace
    found = _marked(job_id)
    while found and time.monotonic() < deadline:
        time.sleep(0.2)
        found = _marked(job_id)
    named = []
    for pid in found:
        try:
            named.append(f"{pid}:{Path(f'/proc/{pid}/comm').read_text().strip()}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return named
