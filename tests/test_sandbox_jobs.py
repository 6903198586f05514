"""End to end on the real Slurm sandbox: submit, Ray across nodes, exit status, no key leaks."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from sandbox_procs import job_processes



def _submit(cli, sandbox, env, tmp_path, *overrides):
    proc = cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
               f"paths.runs={tmp_path / 'runs'}", *overrides, "--json", env=sandbox.env(env))
    return submit_json(proc)


@pytest.fixture(scope="module")
def demo_job(sandbox, wandb_key, tmp_path_factory):
    """One 2-node demo job, shared by the assertions below (each job costs ~20 s here). Its W&B key
    comes from a file (wandb.api_key_file), read inside the job; the training jobs take theirs from
    the submitting environment."""
    from conftest import run_cli
    import os

    tmp = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SLURM_"))}
    key_file = tmp / "wandb.key"
    key_file.write_text(wandb_key + "\n")
    key_file.chmod(0o600)
    info = _submit(run_cli, sandbox, env, tmp, "wandb.entity=sandbox-team", "wandb.experiment=e2e-run",
                   f"wandb.api_key_file={key_file}")
    state = sandbox.wait(info["job_id"])
    scontrol = sandbox.run("scontrol", "show", "job", info["job_id"]).stdout
    return info, state, scontrol


@pytest.mark.sandbox_shared
def test_two_node_job_completes_with_ray_on_both_nodes(demo_job, wandb_key, sandbox):
    info, state, scontrol = demo_job
    out = Path(info["stdout"]).read_text()
    assert state == "COMPLETED", out
    # a clean end reads clean: Ray's steps stopped, not killed (no srun errors, no CANCELLED)
    assert "srun: error" not in out and "CANCELLED" not in out and "Killed" not in out, out[-2000:]
    workers = Path(info["run_dir"], "logs", "ray-workers-srun.r0.log")
    assert not workers.exists() or "error" not in workers.read_text(), workers.read_text()
    report = json.loads((Path(info["run_dir"]) / "demo-report.r0.json").read_text())
    hosts = [n["hostname"] for n in report["nodes"]]
    given = sandbox.nodes(info["job_id"])  # the head first (another test's job may hold node1)
    assert len(given) == 2 and hosts == given, (report["nodes"], given)
    ips = {n["ip"] for n in report["nodes"]}
    assert len(ips) == 2 and not any(ip.startswith("127.") for ip in ips)
    assert report["cluster_gpus"] == 4  # 2 nodes x gpus_per_node 2
    assert sorted({h for h, _ in report["gpu_tasks"]}) == sorted(given)
    # The entrypoint got the derived overrides in its argv, parsed by Hydra's own parser.
    ov = report["overrides"]
    assert ov["trainer.nnodes"] == 2 and ov["trainer.n_gpus_per_node"] == 2
    assert ov["actor_rollout_ref.rollout.mode"] == "async"
    assert ov["actor_rollout_ref.rollout.trace.backend"] == "weave"
    assert ov["trainer.project_name"] == "verl-launch-demo"
    assert ov["trainer.experiment_name"] == "e2e-run"
    assert ov["trainer.logger"] == ["console", "wandb"]
    # The key, project, entity and experiment reached processes on both nodes (and the driver).
    digest = hashlib.sha256(wandb_key.encode()).hexdigest()[:12]
    for seen in [*report["nodes"], report["driver"]]:
        assert seen["wandb_api_key"] == {"present": True, "sha256_12": digest}, seen
        assert seen["WANDB_PROJECT"] == "verl-launch-demo"
        assert seen["WANDB_ENTITY"] == "sandbox-team"
        assert seen["WANDB_NAME"] == "e2e-run"
    for seen in report["nodes"]:  # runtime.setup ran on each node itself
        assert seen["SETUP_HOST"] == seen["hostname"], seen
    phases = [json.loads(line)["phase"] for line in Path(info["phases"]).read_text().splitlines()]
    assert phases == ["start", "nodes", "inputs-check", "head-up", "workers-up", "ready", "driver-start", "driver-end",
                      "teardown"]


@pytest.mark.sandbox_shared
def test_key_is_nowhere_on_disk_or_in_slurm(demo_job, wandb_key):
    info, _, scontrol = demo_job
    assert scontrol and wandb_key not in scontrol
    run_dir = Path(info["run_dir"])
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"job.sbatch", "recipe.yaml", "run.json", Path(info["stdout"]).name}
    for p in files:
        assert wandb_key.encode() not in p.read_bytes(), p
        assert p.stat().st_mode & 0o077 == 0, f"{p} is readable by others"
    assert run_dir.stat().st_mode & 0o077 == 0


@pytest.mark.sandbox_shared
def test_failing_entrypoint_fails_the_job_with_its_exit_code_and_keeps_each_nodes_logs(cli, sandbox, clean_env,
                                                                                       tmp_path):
    info = _submit(cli, sandbox, clean_env, tmp_path, "+verl.overrides.demo.exit_code=7")
    state = sandbox.wait(info["job_id"])
    out = Path(info["stdout"]).read_text()
    assert state == "FAILED", out
    assert sandbox.job_field(info["job_id"], "ExitCode") == "7:0", out
    assert "phase teardown (rc=7)" in out
    logs = Path(info["logs"])
    assert (logs / "ray-head.r0.log").stat().st_size > 0
    assert (logs / f"ray-worker-{sandbox.nodes(info['job_id'])[1]}.r0.log").stat().st_size > 0
    assert "exiting 7 as asked" in out and "exiting 7 as asked" in (logs / "driver.r0.log").read_text()
    assert not job_processes(info["job_id"])


@pytest.mark.sandbox_shared
def test_a_failing_driver_is_named_in_one_line_without_the_key(cli, sandbox, clean_env, tmp_path, wandb_key):
    env = dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state"))
    info = _submit(cli, sandbox, env, tmp_path, "+verl.overrides.demo.raise_with_env=WANDB_API_KEY")
    env = sandbox.env(env)
    assert sandbox.wait(info["job_id"]) == "FAILED"
    why = [json.loads(x) for x in Path(info["phases"]).read_text().splitlines() if '"driver-error"' in x]
    assert [p["detail"] for p in why] == ["RuntimeError: the demo driver failed as asked (demo.raise_with_env): "
                                          "<redacted>"]
    st = cli("status", info["job_id"], env=env)
    assert "stopped    driver-error: RuntimeError: the demo driver failed as asked" in st.stdout, st.stdout
    assert wandb_key not in st.stdout + Path(info["phases"]).read_text()


@pytest.mark.sandbox_shared
def test_key_from_a_file_read_inside_the_job(demo_job, wandb_key):
    info, state, _ = demo_job
    assert state == "COMPLETED", Path(info["stdout"]).read_text()
    report = json.loads((Path(info["run_dir"]) / "demo-report.r0.json").read_text())
    digest = hashlib.sha256(wandb_key.encode()).hexdigest()[:12]
    assert [n["wandb_api_key"]["sha256_12"] for n in report["nodes"]] == [digest, digest]
    script = Path(info["script"]).read_text()
    # the job reads the file (the fixture's); the submitting environment had no key
    assert wandb_key not in script and re.search(r"^ *KEY_FILE=\S+/wandb\.key$", script, re.M)


@pytest.mark.sandbox_shared
def test_a_ray_token_gone_before_ray_starts_fails_the_job_at_once_naming_it(cli, sandbox, clean_env, tmp_path):
    """The job's Ray token emptied after the job wrote it (here by runtime.setup, which runs before
    Ray on the head): the job stops before Ray starts, naming the file and the fix, rather than
    hang in Ray's retries."""
    info = _submit(cli, sandbox, clean_env, tmp_path, "runtime.setup=[': > \"$RAY_AUTH_TOKEN_PATH\"']")
    t0 = time.monotonic()
    assert sandbox.wait(info["job_id"], timeout=120) == "FAILED"
    assert time.monotonic() - t0 < 60
    phases = [json.loads(x) for x in Path(info["phases"]).read_text().splitlines()]
    assert "head-up" not in [p["phase"] for p in phases]
    [why] = [p["detail"] for p in phases if p["phase"] == "error"]
    token = f"{info['run_dir']}/.ray-token.r0"
    assert why.startswith(f"the job's Ray token {token} is missing or empty on {sandbox.nodes(info['job_id'])[0]}: the run directory must be"), why
    assert not Path(token).exists()  # the teardown removed it


@pytest.mark.sandbox_shared
def test_script_without_key_stops_at_once(sandbox, tmp_path, cli, clean_env):
    """A rendered script submitted by hand, without a key, fails before Ray starts."""
    script = cli("render", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}", env=clean_env)
    assert script.returncode == 0, script.stderr
    (tmp_path / "job.sbatch").write_text(script.stdout)
    env = {k: v for k, v in sandbox.env(clean_env).items() if k != "WANDB_API_KEY"}
    import subprocess

    proc = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert sandbox.wait(job, timeout=60) == "FAILED"
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert "WANDB_API_KEY is not set" in out
    assert "phase nodes" not in out  # stopped before touching the nodes


@pytest.mark.sandbox_shared
def test_wait_shows_training_progress_live_on_a_terminal(sandbox, wandb_key, tmp_path):
    """verl's step out of its total, the time per step and an ETA, from the driver's log (the
    payload prints them with verl's own console logger); on a terminal one line, rewritten."""
    import os
    import pty
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SLURM_"))}
    env.update(WANDB_API_KEY=wandb_key, VERL_LAUNCH_STATE=str(tmp_path / "state"))
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", str(RECIPES / "sandbox-demo.yaml"),
                             f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}", "cluster.nodes=1",
                             "verl.overrides.demo.train_steps=6", "verl.overrides.demo.step_seconds=2", "--wait"],
                            env=sandbox.env(env), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the other end closed: the CLI is done
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=300) == 0, out.decode(errors="replace")[-3000:]
    text = out.decode(errors="replace")
    assert re.search(r"training step [1-5]/6, 2\.\d s/step, ETA 0:00:\d\d", text), text[-3000:]
    # the progress rewrites its line (\r, erase) rather than adding one per update
    assert "\r\x1b[K" in text and "COMPLETED exit code 0:0" in text


@pytest.mark.sandbox_shared
def test_a_gpu_type_is_asked_for_as_slurm_knows_it(cli, sandbox, clean_env, tmp_path):
    """cluster.gpu_type: the sandbox's GPUs have a gres type (simgpu), as real clusters' do; a
    typed request runs, and a type the cluster lacks is refused by sbatch (exit 1, its words)."""
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    args = ["submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
            f"paths.runs={tmp_path / 'runs'}", "cluster.nodes=1"]
    info = submit_json(cli(*args, "cluster.gpu_type=simgpu", "--json", env=env))
    assert "#SBATCH --gpus-per-node=simgpu:2" in Path(info["script"]).read_text()
    assert sandbox.wait(info["job_id"]) == "COMPLETED"
    other = cli(*args, "cluster.gpu_type=a100", env=env)
    assert other.returncode == 1 and "sbatch" in other.stderr, other.stderr
    assert "Requested node configuration is not available" in other.stderr or "Invalid generic resource" in \
        other.stderr, other.stderr
