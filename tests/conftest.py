"""Shared fixtures: the CLI as a subprocess, a fresh fake W&B key, and the real Slurm sandbox."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from sandbox_procs import RequeueHold

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
# For every process the tests start (clean_env copies this environment): OpenMP's idle threads
# sleep rather than spin. Two xdist workers' torch processes on 2 cores spun against each other
# (two 40-step tool-model builds side by side: 94 s, 15 s each alone); the verl tier took 645 s
# with it, 734 s without. What is computed is unchanged. The training jobs' processes run one
# OpenMP thread each (recipes/testing/cpu-nodes.yaml).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
SANDBOX_UP = ROOT / "tests" / "cluster" / "sandbox-up.sh"


def refusal(stderr: str) -> str:
    """What the CLI said of a refusal, up to the `not checked:` line that ends it where the
    refusal kept the later checks from running (launcher/core/recipe.py's UNCHECKED)."""
    lines = stderr.strip().splitlines()
    return "\n".join(lines[:-1] if lines and lines[-1].startswith("not checked: ") else lines)


def run_cli(*args, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """verl-launch as a user runs it: a fresh interpreter, output captured."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


class _Timeout(Exception):
    pass


def run_cli_here(*args, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """verl-launch's main() in this process, as run_cli would see it: ENV as the whole
    environment, CWD, no stdin, stdout and stderr captured, the exit code (argparse's too), and
    TIMEOUT as subprocess.TimeoutExpired. What it saves is the interpreter's start and the
    launcher's imports (~0.5 s a call); for the tests that need neither Slurm nor verl's
    trainer (the cli fixture), never with threads."""
    import io
    import signal

    from launcher import cli as launcher_cli
    from launcher.core import recipe as launcher_recipe

    argv = list(map(str, args))
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    # what a process says once (recipe warnings): a new process's worth for each call
    saved_said = set(launcher_recipe._SAID)
    launcher_recipe._SAID.clear()
    out, err = io.StringIO(), io.StringIO()

    def expire(*_):
        raise _Timeout()

    old_alarm = signal.signal(signal.SIGALRM, expire)
    try:
        if env is not None:  # in place: what holds os.environ (a default argument) sees it too
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        signal.alarm(max(1, int(timeout)))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _stdin(io.StringIO("")):
            try:
                code = launcher_cli.main(argv)
            except SystemExit as e:  # argparse's usage errors, --help, --version
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
    except _Timeout:
        raise subprocess.TimeoutExpired(["verl-launch", *argv], timeout, out.getvalue(), err.getvalue()) from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_alarm)
        os.chdir(saved_cwd)
        launcher_recipe._SAID.clear()
        launcher_recipe._SAID.update(saved_said)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
    return subprocess.CompletedProcess(["verl-launch", *argv], code or 0, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _stdin(stream):
    saved, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = saved


@pytest.fixture
def cli(request):
    """The CLI: in this process for tests that need neither Slurm nor verl's trainer (a third of
    the quick tier's time was interpreters starting), a fresh interpreter for the rest (Slurm's
    state and the job's processes are theirs, and a job's watcher caches Slurm's answers)."""
    node = request.node
    if node.get_closest_marker("sandbox") or node.get_closest_marker("train"):
        return run_cli
    return run_cli_here


def as_process_env(monkeypatch, env: dict) -> None:
    """ENV as this process's environment for the Python API (which reads os.environ), as the
    CLI's subprocess gets it: nothing of the developer's W&B or Slurm settings beside it."""
    for name in [n for n in os.environ if n.startswith(("WANDB_", "SLURM_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def wandb_key() -> str:
    """A key in W&B's format, new each session, so that a leak can be searched for."""
    return "local-" + secrets.token_hex(24)


@pytest.fixture(scope="session")
def preflight_cache_home(tmp_path_factory) -> Path:
    """One XDG_CACHE_HOME for the whole session: verl's verdict on an override list is worked out
    once (~13 s), not once per test's fresh HOME. Tests about the cache set their own."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture
def clean_env(wandb_key, tmp_path, preflight_cache_home):
    """The environment without any real W&B key or Slurm config of the developer's; a HOME of
    the test's own, and the session's shared cache (verl's preflight verdicts; vLLM's, as jobs')."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SLURM_"))}
    env["WANDB_API_KEY"] = wandb_key
    env["HOME"] = str(tmp_path / "home")
    env["XDG_CACHE_HOME"] = str(preflight_cache_home)
    from verl_train import VLLM_CACHE  # vLLM's model-info cache, shared as the training jobs share it

    env["VLLM_CACHE_ROOT"] = str(VLLM_CACHE)
    return env


@pytest.fixture(scope="session")
def smoke_assets() -> Path:
    """The smoke run's assets (tiny Qwen2, tokenizer, arithmetic parquet, the tool model), built
    once for all test sessions of this code (tests/smoke_cache.py; `make test` starts the build
    ahead, beside the quick tier); read-only to tests. test_smoke_assets builds them again to
    compare the bytes."""
    import smoke_cache

    return smoke_cache.ensure()


def once_per_run(tmp_path_factory, name: str, compute):
    """COMPUTE()'s result (JSON), once for the whole test run. Under xdist each worker has a
    session of its own, and a costly probe (a node-environment process: 1-4 minutes under load)
    ran once in each worker that needed it: the first computes it, the others wait and read it.
    A probe that fails writes nothing: the next worker computes it again and fails in its words."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the run's own, above each worker's
    path = shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text())
        got = compute()
        path.write_text(json.dumps(got))
        return got


# Markers from what a test uses, so that they cannot drift from the code: `sandbox` where the
# Slurm sandbox fixture is in its closure, `train` where the node environment is (verl's trainer
# or vLLM runs), `verl` where the smoke assets are. A test that starts verl's trainer some other way
# marks itself `train`; one that imports verl from the test environment (check's preflight with
# runtime.python this interpreter, verl's config) or runs a local job marks itself `verl`.
# `make test-quick` runs the rest, with verl kept out (tests/no_verl): one that needs verl fails there.
_MARK_BY_FIXTURE = {"sandbox": "sandbox", "traced": "sandbox", "node_python": "train", "smoke_assets": "verl",
                    # verl's own FSDP checkpoints, written by torch and verl (test_checkpoints,
                    # test_requeue, test_merge)
                    "written": "verl", "saved": "verl", "checkpoints": "verl"}
# Under pytest-xdist (`make test`: -n 2 --dist loadgroup) every sandbox and training test runs in
# this one group, one after another on one worker: there is one sandbox, and its jobs want every
# CPU. The other worker takes the rest meanwhile.
HEAVY_GROUP = "sandbox-and-training"


def pytest_configure(config):
    _TERMINAL[:] = [config]
    # xdist's workers get COLUMNS=80 (execnet); a test's CLI, its output piped, must see no
    # terminal size of the runner's, with or without -n.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


SLOW_LINE = 60  # s: a test (its setup included) longer than this is named as it ends


def pytest_runtest_logreport(report):
    """A line as each slow test (or a slow fixture's setup) ends, with the clock: CI's output,
    cut at its time limit, then shows where the time went even without the final durations."""
    tr = _TERMINAL[0].pluginmanager.get_plugin("terminalreporter") if _TERMINAL else None
    if tr is not None and report.duration >= SLOW_LINE and report.when in ("setup", "call"):
        tr.ensure_newline()
        tr.write_line(f"[slow {time.strftime('%H:%M:%S')}] {report.duration:.0f} s {report.when} {report.nodeid}")


_TERMINAL: list = []  # pytest's config: its terminal reporter is where the test run writes


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in _MARK_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        if item.get_closest_marker("sandbox") or item.get_closest_marker("train"):
            item.add_marker(pytest.mark.xdist_group(HEAVY_GROUP))
        if item.get_closest_marker("sandbox_shared"):
            _may_share(item)
    # The training tests that use no Slurm (the V1 local run: about 170 s) first: xdist hands out
    # tests in this order, and the V1 run, last in the alphabet, had been the verl tier's tail
    # (one worker training for its last 3 minutes, the other done).
    items.sort(key=lambda item: not (item.get_closest_marker("train") and not item.get_closest_marker("sandbox")))


# What a test may not use to run beside another in make test's shared pass (docs/testing.md):
# a training run wants every CPU, and these fixtures' jobs name nodes or change them.
_NEVER_SHARED = {"traced", "node_python", "smoke_assets"}


def _may_share(item) -> None:
    if not item.get_closest_marker("sandbox"):
        raise pytest.UsageError(f"{item.nodeid}: sandbox_shared on a test that uses no sandbox")
    used = _NEVER_SHARED & set(getattr(item, "fixturenames", ()))
    if used or item.get_closest_marker("train"):
        raise pytest.UsageError(f"{item.nodeid}: sandbox_shared on a training test ({', '.join(sorted(used)) or 'train'}):"
                                " it runs alone (docs/testing.md, the shared pass)")


_SANDBOX_SEEN = []


@pytest.fixture(scope="module")
def sandbox():
    """The local Slurm sandbox (4 nodes x 8 fake GPUs); started if needed, left up for reuse.
    Checked again for each test module (half a second when healthy): Debian's slurmd has been
    seen to die of a heap corruption in its hostlist code while launching steps (CI, once), and
    a dead node would otherwise fail every module after it. A restart is reported as a warning."""
    return _sandbox_up()


@pytest.fixture(scope="session")
def traced(node_python, smoke_assets, wandb_key, tmp_path_factory):
    """The suite's one traced training run (tests/traced_run.py), once a session: two modules
    read it. (Session-scoped, so it starts the sandbox itself: `sandbox` is checked per module.)"""
    from traced_run import run

    sandbox = _sandbox_up()
    yield from run(node_python, smoke_assets, wandb_key, tmp_path_factory.mktemp("traced"), sandbox.env)


def _sandbox_up() -> "Sandbox":
    if os.geteuid() != 0:
        pytest.skip("the Slurm sandbox needs root (network namespaces, slurmd)")
    # One at a time: make test's shared pass runs two workers, and two sandbox-up.sh started
    # together would each bring the sandbox up (or down, finding it unhealthy) under the other.
    with open("/tmp/verl-launch-sandbox-up.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["bash", str(SANDBOX_UP)], capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        pytest.fail(f"sandbox-up failed:\n{proc.stderr[-3000:]}")
    if _SANDBOX_SEEN and "reusing it" not in proc.stderr:
        warnings.warn(f"the sandbox was not healthy and was started again:\n{proc.stderr[-1500:]}")
    _SANDBOX_SEEN.append(True)
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("export SLURM_CONF="), proc.stdout
    return Sandbox(slurm_conf=line.split("=", 1)[1])


class Sandbox:
    def __init__(self, slurm_conf: str):
        self.slurm_conf = slurm_conf
        # Call in a polling loop: releases a requeued job from its begin-time hold, safely.
        self.release_requeued = RequeueHold(lambda *cmd: self.run(*cmd).stdout)

    def _wait_accounted(self, job_id: str, deadline: float) -> None:
        """slurmctld sends a job's end to slurmdbd asynchronously: sacct can say RUNNING for a
        moment after the controller says COMPLETED (seen in CI). A test that then reads accounting
        must see the end; without slurmdbd (the job-completion log) the end is written at once."""
        while time.monotonic() < deadline:
            proc = self.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State")
            if proc.returncode != 0:  # no slurmdbd: nothing to wait for
                return
            states = proc.stdout.split()
            if states and states[-1] not in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED"):
                return  # the newest job with this id (ids restart after a controller reset)
            time.sleep(0.5)

    def reset_controller(self) -> None:
        """Restart slurmctld with its state wiped: job ids start again at 1 (state loss)."""
        proc = subprocess.run(["bash", str(SANDBOX_UP)], capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, SANDBOX_RESET_CTLD="1"))
        assert proc.returncode == 0, proc.stderr[-3000:]

    def env(self, base: dict) -> dict:
        return dict(base, SLURM_CONF=self.slurm_conf)

    def run(self, *cmd, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, SLURM_CONF=self.slurm_conf), stdin=subprocess.DEVNULL)

    def jobs(self) -> set:
        out = self.run("squeue", "-h", "-o", "%A").stdout
        return set(out.split())

    def job_field(self, job_id: str, field: str) -> str:
        out = self.run("scontrol", "show", "job", job_id).stdout
        for tok in out.split():
            if tok.startswith(field + "="):
                return tok.split("=", 1)[1]
        return ""

    def nodes(self, job_id: str) -> list:
        """The nodes Slurm gave the job, the head first: a test that shares the sandbox with
        another's job cannot assume node1 and node2."""
        nodelist = self.job_field(job_id, "NodeList")
        assert nodelist and nodelist != "(null)", f"job {job_id} has no nodes"
        return self.run("scontrol", "show", "hostnames", nodelist).stdout.split()

    def wait(self, job_id: str, timeout: float = 180) -> str:
        """Wait for a terminal state; fail fast on a job that can never be scheduled."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                self._wait_accounted(job_id, deadline)
                return state
            reason = self.job_field(job_id, "Reason")
            if state == "PENDING" and reason in ("PartitionConfig", "BadConstraints", "ReqNodeNotAvail"):
                pytest.fail(f"job {job_id} can never start: {reason}")
            time.sleep(0.5)
        self.run("scancel", job_id)
        pytest.fail(f"job {job_id} did not finish in {timeout} s")


def submit_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"submit failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def node_python() -> Path:
    """The TEST-ONLY node environment's interpreter (make node-env): vLLM's CPU build, verl, Ray,
    weave and wandb, what the sandbox's nodes run for verl to train on CPUs."""
    py = ROOT / ".venv-node" / "bin" / "python"
    if not (ROOT / ".venv-node" / ".installed").exists():
        pytest.fail(f"no node environment at {py.parent.parent}: run `make node-env` (make test does)")
    return py
