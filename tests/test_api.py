"""The Python API, the one door: every function called as a user's script would, against the
real Slurm sandbox (local mode: this machine), and held to what the CLI prints for the same."""

from __future__ import annotations

import io
import json
import os
import re
import sys

import pytest

import launcher
from conftest import RECIPES, refusal

DEMO = RECIPES / "sandbox-demo.yaml"


@pytest.fixture
def api_env(monkeypatch, clean_env, tmp_path):
    """This process's environment as the API reads it: the throwaway key, a registry of the
    test's own, no Slurm of the developer's. Returns (environ, overrides) for DEMO."""
    for name in [n for n in os.environ if n.startswith(("WANDB_", "SLURM_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_API_KEY", clean_env["WANDB_API_KEY"])
    monkeypatch.setenv("HOME", clean_env["HOME"])
    monkeypatch.setenv("VERL_LAUNCH_STATE", str(tmp_path / "state"))
    overrides = [f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}"]
    return os.environ, overrides


@pytest.fixture
def on_sandbox(sandbox, api_env, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", sandbox.slurm_conf)
    return api_env


@pytest.mark.verl  # a local run
def test_local_submit_runs_to_completed_and_is_found_again(api_env):
    environ, ov = api_env
    out = io.StringIO()
    run = launcher.submit(str(DEMO), ov, local=True, environ=environ, out=out)  # crashed before issue 29
    assert isinstance(run, launcher.Run) and not isinstance(run, launcher.SweepRun)
    assert run.state() == "COMPLETED", out.getvalue()[-3000:]
    status = run.status()
    assert status["state"] == "COMPLETED" and status["exit_code"] == "0:0", status
    assert run.record["local"] and run.record["run_dir"] == run.run_dir
    assert "demo" in run.logs() and run.logs() in out.getvalue()  # the output, as it went by
    assert run.wait(poll=0.2, timeout=10) == "COMPLETED"  # an ended run: at once
    again = launcher.run(run.job_id)
    assert again.run_dir == run.run_dir and again.status()["state"] == "COMPLETED"
    with pytest.raises(launcher.SlurmError, match="ran locally"):
        run.cancel()  # its id is not Slurm's: scancel could stop someone else's job


def test_dryrun_is_what_render_prints_and_submit_would_run(cli, api_env):
    environ, ov = api_env
    req = launcher.dryrun(str(DEMO), ov, environ=environ)
    rendered = cli("render", DEMO, *ov, env=dict(environ))
    assert rendered.returncode == 0, rendered.stderr
    assert req.script == rendered.stdout  # byte for byte
    assert req.script == launcher.script(str(DEMO), ov, environ=environ)
    shown = cli("submit", DEMO, *ov, "--dry-run", env=dict(environ))
    assert shown.returncode == 0, shown.stderr
    first, _, body = shown.stdout.partition("\n")
    assert body == req.script
    # the command and every path, but a run dir's name holds the time: compare its shape
    stamp = re.compile(r"\d{8}-\d{6}-[0-9a-f]+")
    assert stamp.sub("T", first) == stamp.sub("T", f"# would run: {req}"), (first, str(req))
    assert str(req) == f"cd {req.directory} && sbatch --parsable {req.paths.script.name}", str(req)
    assert req.paths.script.parent == req.directory and not req.directory.exists()  # nothing written


def test_check_reports_what_the_cli_prints(cli, api_env):
    environ, ov = api_env
    report = launcher.check(str(DEMO), ov + ["cluster.nodes=1"], environ=environ)
    assert report.ok and report.verdict.startswith("ok: submit would queue this job"), report.verdict
    shown = cli("check", DEMO, *ov, "cluster.nodes=1", env=dict(environ))
    assert shown.returncode == 0, shown.stderr
    printed = [f"{label:<11} {text}" for label, text in report.lines]
    assert shown.stdout.splitlines()[:len(printed)] == printed
    assert shown.stdout.splitlines()[-1] == report.verdict
    assert [a for a in report.verl_args if "=" in a] and all(f"  {a}" in shown.stdout for a in report.verl_args)
    # what only submit refuses (no key): the report's refusal, as check's exit 2
    bare = {k: v for k, v in environ.items() if k != "WANDB_API_KEY"}
    refused = launcher.check(str(DEMO), ov + ["wandb.reach_timeout=5"], environ=bare)
    assert not refused.ok and "WANDB_API_KEY" in refused.verdict
    shown = cli("check", DEMO, *ov, "wandb.reach_timeout=5", env=bare)
    assert shown.returncode == 2 and refusal(shown.stderr).endswith(refused.verdict), shown.stderr
    # bad input raises what the CLI prints, exit 2
    with pytest.raises(launcher.RecipeError, match="cluster.nodes"):
        launcher.check(str(DEMO), ov + ["cluster.nodes=0"], environ=environ)


def test_every_refusal_of_the_pipeline_is_said_at_once(cli, api_env, tmp_path):
    """prepare's steps do not hide each other: no key (the environment) and --resume with
    nothing to resume from (the experiment) are both said, by the API and by the CLI, and
    nothing is written."""
    environ, ov = api_env
    bare = {k: v for k, v in environ.items() if k != "WANDB_API_KEY"}
    ov = ov + [f"verl.overrides.trainer.default_local_dir={tmp_path / 'ckpt'}"]
    with pytest.raises(launcher.RecipeError) as raised:
        launcher.dryrun(str(DEMO), ov, environ=bare, start="resume")
    assert [e.key for e in raised.value.each] == ["wandb", "verl.overrides.trainer.default_local_dir"], raised.value
    assert "no W&B API key" in str(raised.value) and "no checkpoint to resume from" in str(raised.value)
    shown = cli("submit", DEMO, *ov, "--resume", env=bare)
    assert shown.returncode == 2 and shown.stderr.startswith("error: 2 problems"), shown.stderr
    assert f"error: {raised.value}" == shown.stderr.strip(), shown.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.sandbox_shared
def test_submit_wait_status_logs_and_the_run_by_cluster_and_id(cli, on_sandbox):
    environ, ov = on_sandbox
    req = launcher.dryrun(str(DEMO), ov + ["cluster.nodes=1"], environ=environ)
    run = launcher.submit(req, environ=environ)
    assert run.run_dir == str(req.directory) and re.fullmatch(r"\d+", run.job_id)
    seen = []
    assert run.wait(poll=0.5, timeout=300, on_change=seen.append) == "COMPLETED", run.logs()[-3000:]
    assert seen and seen[-1].startswith("COMPLETED"), seen
    assert any(s.startswith("RUNNING") for s in seen), seen
    status = run.status()
    assert status["state"] == "COMPLETED" and status["exit_code"] == "0:0", status
    assert status["job_id"] == run.job_id and status["stdout"] == str(req.paths.stdout(run.job_id))
    shown = json.loads(cli("status", run.job_id, "--json", env=dict(environ)).stdout)
    assert {k: shown[k] for k in ("state", "phase", "exit_code", "run_dir")} == \
        {k: status[k] for k in ("state", "phase", "exit_code", "run_dir")}
    out = run.logs()
    assert out == req.paths.stdout(run.job_id).read_text(errors="replace")
    assert "ray" in out.lower() and os.environ["WANDB_API_KEY"] not in out
    assert "demo" in run.logs(driver=True)
    assert "".join(run.logs(follow=True)) .endswith(out[-200:])  # an ended job: what there is, then the end
    # known by its cluster and job id (ids repeat across clusters and after a reset)
    assert run.record["cluster"] == "sandbox"
    assert launcher.run(f"sandbox:{run.job_id}").run_dir == run.run_dir
    assert launcher.run(run.job_id).run_dir == run.run_dir
    with pytest.raises(launcher.RecipeError, match="another cluster's: sandbox:"):
        launcher.run(f"elsewhere:{run.job_id}")
    listed = launcher.runs(5)
    assert listed[0]["job_id"] == run.job_id and listed[0]["state"] == "COMPLETED" and listed.note is None


@pytest.mark.sandbox_shared
def test_cancel_ends_a_queued_job_and_records_it(on_sandbox, sandbox):
    environ, ov = on_sandbox
    run = launcher.submit(str(DEMO), ov + ["cluster.nodes=1", "cluster.sbatch_args=[--hold]"], environ=environ)
    assert run.state() == "PENDING"
    assert run.cancel(timeout=60) == "CANCELLED"
    assert run.job_id not in sandbox.jobs()
    assert run.record["run_dir"] == run.run_dir
    assert json.loads(run.paths.record.read_text())["final_state"] == "CANCELLED"
    assert run.status()["state"] == "CANCELLED"


def test_image_import_dry_run_is_the_cli_s(cli, api_env, tmp_path):
    environ, _ = api_env
    done = launcher.image_import("nvcr.io/nvidia/pytorch:24.05-py3", str(tmp_path), dry_run=True)
    shown = cli("image", "import", "nvcr.io/nvidia/pytorch:24.05-py3", "-o", tmp_path, "--dry-run", env=dict(environ))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [f"# would run: {done['command']}", f"container.image={done['path']}"]
    assert done["command"].startswith("enroot import") and not done["existed"]
    assert not any(tmp_path.glob("*.sqsh"))
