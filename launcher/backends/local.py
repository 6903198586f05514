"""The local backend (`submit --local`): the same rendered script, run on this machine without Slurm, for a one-box
smoke run (a CI runner with a GPU). One node, the GPUs it has, free Ray ports, the same run
directory, logs, phases and exit status.

Slurm's few commands that the script calls (srun, scontrol show hostnames, squeue) come from
small shims in templates/local/, first on the script's PATH; the SLURM_* variables it reads
are set here. No process may outlive the run: the script's own teardown stops its steps, and
anything left that carries this run's marker variable is killed and reported.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Mapping, Optional, TextIO, Tuple

from ..core.paths import RunPaths
from ..core.plan import RAY_FIXED_PORTS, Plan
from ..resources import templates_dir

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


def _claim_job_id(p: Plan) -> Tuple[int, int]:
    """A job id whose block of Ray ports is free on this machine, and a lock on that block (an
    fd), held for the run's life. Free ports alone are not enough: two local runs starting
    together both find a block free before either Ray binds it, and gRPC's listeners share a
    port (SO_REUSEPORT), so each run's Ray would then answer the other's clients (seen: a run's
    readiness check refused with InvalidAuthToken, the other run's token)."""
    lo = p.ray.port_min
    block = RAY_FIXED_PORTS + p.ray.worker_ports
    locks = Path(tempfile.gettempdir()) / "verl-launch-local-ports"  # every user's runs: sticky, as /tmp
    try:
        locks.mkdir()
        locks.chmod(0o1777)  # whoever makes it: not under their umask
    except FileExistsError:  # another run, maybe another user's, made it
        pass
    for _ in range(50):
        job_id = random.randrange(100000, 999999)
        first = lo + (job_id % p.port_slots) * block
        fd = os.open(locks / f"{first}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if all(_port_free(port) for port in range(first, first + block)):
                return job_id, fd
        except OSError:  # another local run holds this block
            pass
        os.close(fd)
    raise OSError("no free block of Ray ports found in cluster.port_range")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every address: Ray listens on the node's own
            return True
        except OSError:
            return False


def run(req, environ: Mapping[str, str], out: Optional[TextIO] = None) -> dict:
    """Write the run directory of REQ (a one-run Request), run the script here (its output to
    Slurm's file name in the run directory, and to OUT), and return its run record (with
    final_state, exit_code and leftovers, the number of processes that had to be killed)."""
    p, plan = req.paths, req.plan
    p.create(req.script, req.recipe_yaml)
    shims = p.run_dir / ".local-bin"
    shutil.copytree(templates_dir() / "local", shims)
    for shim in shims.iterdir():  # a wheel does not keep the executable bit
        shim.chmod(0o700)
    job_id, ports_lock = _claim_job_id(plan)
    try:
        return _run(req, dict(environ, PATH=f"{shims}{os.pathsep}{environ.get('PATH', '')}"), str(job_id), out)
    finally:
        os.close(ports_lock)  # after the leftovers were killed: nothing of this run holds its ports


def _run(req, environ: Mapping[str, str], job_id: str, out: Optional[TextIO]) -> dict:
    """The script run under JOB_ID (its Ray ports claimed), ENVIRON with the shims first on PATH."""
    p, plan = req.paths, req.plan
    host = socket.gethostname().split(".")[0]
    env = dict(environ, SLURM_JOB_ID=job_id,
               SLURM_JOB_NODELIST=host, SLURMD_NODENAME=host, SLURM_CPUS_PER_TASK=str(plan.ray.cpus),
               SLURM_RESTART_COUNT="0", **{MARKER: job_id})
    record = req.register(job_id, runner={"host": host, "pid": os.getpid()})
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
    ended = dict(finished=time.time(), elapsed=round(time.time() - t0, 1), exit_code=f"{rc}:0",
                 final_state="COMPLETED" if rc == 0 else "FAILED", leftovers=len(leftovers),
                 leftover_processes=leftovers)
    record.update(ended)
    p.update_record(lambda rec: rec.update(ended))  # what was recorded meanwhile (a merge) stays
    if leftovers and out is not None:
        out.write(f"verl-launch: killed {len(leftovers)} process(es) the job left behind: {leftovers}\n")
    return record


def _pump(stream, path: Path, out: Optional[TextIO]) -> None:
    """The script's output to Slurm's output file and to the terminal (OUT, if any)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as log:
        for line in stream:
            log.write(line)
            log.flush()
            if out is not None:
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


class LocalBackend:
    """Runs a Request here, to its end (a sweep: its points one after another); its state is
    the run's own record, which Slurm never knew."""
    name, title = "local", "local"

    def load(self, recipe, overrides: List[str], environ: Mapping[str, str], notes: Optional[TextIO] = None):
        """The recipe on one node with this machine's GPUs (local_overrides), saying on NOTES what
        that changed, rather than changing it silently."""
        from ..core.recipe import load

        asked = load(recipe, overrides).recipe.cluster
        loaded = load(recipe, overrides + local_overrides(environ))
        for name in ("nodes", "gpus_per_node"):
            if getattr(asked, name) != getattr(loaded.recipe.cluster, name) and notes is not None:
                print(f"--local: cluster.{name}={getattr(loaded.recipe.cluster, name)} here (the recipe asks for "
                      f"{getattr(asked, name)})", file=notes)
        return loaded

    def weigh(self, plan, had) -> list:
        """check's lines; Slurm is not asked."""
        from .summary import weigh

        return weigh(plan, had, None, ask_slurm=False)

    def dryrun(self, prepared):
        """`bash job.sbatch` here, in a new run directory."""
        from ..core.request import for_run

        req = _here(for_run(prepared.plan))
        req.text = f"bash {RunPaths.SCRIPT} (here, without Slurm, in {req.directory})"
        req.warnings = list(prepared.warnings)
        return req

    def serve_gpus(self, r) -> int:
        return 0  # this machine's own: none are asked for

    def merge_executor(self, folder, r, params: dict):
        """submitit's local executor: the merge runs here, in the background."""
        import submitit

        ex = submitit.AutoExecutor(folder=str(folder), cluster="local")
        ex.update_parameters(**params)
        return ex

    def wait_merge(self, job, on_change=None, poll: float = 2.0) -> None:
        pass  # submitit's result() waits for a local job

    def merge_state(self, merge: dict) -> str:
        return "not merged (a local merge that did not finish)"

    def dryrun_sweep(self, sweep, max_parallel: Optional[int] = None):
        """Each point's script here, one after another (MAX_PARALLEL: one at a time anyway)."""
        from ..core.sweeps import request

        req = _here(request(sweep, max_parallel))
        req.text = f"each point's {RunPaths.SCRIPT} here, one after another, without Slurm"
        for point in req.points:
            _here(point).text = f"bash {RunPaths.SCRIPT} (here, without Slurm, in {point.directory})"
        return req

    def schedule(self, req, environ: Optional[Mapping[str, str]] = None, out: Optional[TextIO] = None) -> dict:
        environ = os.environ if environ is None else environ
        if not req.is_sweep:
            return run(req, environ, out)
        req.paths.create(req.script)
        record = req.register(None)
        n = len(req.points)
        for i, point in enumerate(req.points, 1):  # numbered 1..N of N; the directory keeps the task id
            if out is not None:
                print(f"point {i}/{n} ({point.meta['label']}): running locally in {point.directory}", file=out, flush=True)
            rec = run(point, environ, out)
            if out is not None:
                print(f"point {i}/{n} {rec['final_state']} exit code {rec['exit_code']} in {rec['elapsed']} s", file=out)
        return record

    def states(self, runs: List[dict]) -> dict:
        out = {}
        for r in runs:
            rec = RunPaths(Path(r["run_dir"])).read_record() or {}
            state, reason = rec.get("final_state"), None
            if state is None:
                state, reason = _unfinished(r, rec)
            out[r["run_dir"]] = {"state": state, "exit_code": rec.get("exit_code"), "reason": reason,
                                 "source": "local"}
        return out

    def cancel(self, run: dict) -> None:
        from ..errors import SlurmError  # its id is not a Slurm job's: scancel could hit someone else's job

        raise SlurmError(f"run {run['job_id']} ran locally (submit --local), not under Slurm: "
                         "stop it with Ctrl-C where it runs")

    def allocations(self, run: dict) -> Optional[List[dict]]:
        """None: no scheduler allocated anything; the run's own marks are its times."""
        return None

    def ended(self, run: dict):
        state = self.states([run])[run["run_dir"]]["state"]
        return state != "RUNNING", state

    def wait(self, run: dict, on_change=None, poll: float = 2.0, timeout: Optional[float] = None, **_) -> dict:
        """A local run started elsewhere (another process): until its record has an end; its
        job info. ``on_change(state)`` as it changes."""
        return self.wait_many([run], on_change and (lambda counts: on_change(", ".join(counts))), poll,
                              timeout)[run["run_dir"]]

    def wait_many(self, runs: List[dict], on_change=None, poll: float = 2.0, timeout: Optional[float] = None,
                  **_) -> dict:
        """Until no run of RUNS is running here (or TIMEOUT): {run_dir: job info};
        ``on_change({state: count})`` when the counts change."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            infos = self.states(runs)
            counts: dict = {}
            for info in infos.values():
                counts[info["state"]] = counts.get(info["state"], 0) + 1
            if counts != last and on_change is not None:
                on_change(counts)
            last = counts
            if "RUNNING" not in counts or (deadline is not None and time.monotonic() > deadline):
                return infos
            time.sleep(poll)


def _here(req):
    """REQ as this backend runs it: `bash job.sbatch`, to its end, recorded as local."""
    req.command, req.runs_here = ["bash", RunPaths.SCRIPT], True
    req.meta["local"] = True
    return req


def _unfinished(run: dict, rec: dict) -> tuple:
    """A local run without a final state: RUNNING while its runner lives (seen from its host);
    else UNKNOWN, and why."""
    if not Path(run["run_dir"]).is_dir():
        return "UNKNOWN", "its run directory is gone"
    runner = rec.get("runner") or run.get("runner") or {}
    if runner.get("host") != socket.gethostname().split(".")[0] or not runner.get("pid"):
        return "RUNNING", None  # another machine's (or an older record's): cannot tell from here
    try:
        cmdline = Path(f"/proc/{runner['pid']}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    if b"launcher" in cmdline or b"verl-launch" in cmdline:
        return "RUNNING", None
    return "UNKNOWN", f"its runner (pid {runner['pid']}) ended without recording an end"
