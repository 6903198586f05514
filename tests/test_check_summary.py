"""What `check` puts before a user queues (launcher/backends/summary.py) and what an experiment already
has (launcher/checks/prior.py): the GPU-hours a time limit allows, the partition's size and when Slurm
would start the job (the sandbox answers: `sbatch --test-only`), a missing image; checkpoints an
experiment would resume from, `submit --fresh` and `--resume` refusing what they rule out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, refusal, submit_json
from launcher.backends.summary import hours

DEMO = RECIPES / "sandbox-demo.yaml"


@pytest.mark.parametrize("limit, want", [
    ("30", 0.5), ("90:00", 1.5), ("04:00:00", 4), ("2-00:00:00", 48), ("1-12", 36), ("1-00:30", 24.5),
    ("UNLIMITED", None), (None, None), ("", None), ("0", None), ("00:00:00", None),  # Slurm: 0 is no limit
])
def test_slurm_time_limits_in_hours(limit, want):
    assert hours(limit) == (pytest.approx(want) if want is not None else None)


def _lines(out: str) -> dict:
    got = {}
    for line in out.splitlines():
        if line[:1].strip() and len(line) > 12:
            got.setdefault(line[:11].strip(), []).append(line[12:])
    return got


def _check(cli, env, tmp_path, *overrides):
    proc = cli("check", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}", *overrides, env=env)
    return proc, _lines(proc.stdout)


def _ckpt(tmp_path, experiment: str, step: int) -> Path:
    """The layout verl's checkpoint manager leaves: global_step_N dirs and its tracker file."""
    d = tmp_path / "runs" / "checkpoints" / experiment
    for s in range(step // 2, step + 1, step // 2):
        (d / f"global_step_{s}" / "actor").mkdir(parents=True)
    (d / "latest_checkpointed_iteration.txt").write_text(str(step))
    return d


def test_without_slurm_check_says_what_it_could_not_ask_and_still_gives_its_verdict(cli, clean_env, tmp_path):
    env = dict(clean_env, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", SLURM_CONF=str(tmp_path / "no.conf"))
    proc, got = _check(cli, env, tmp_path, "cluster.time=2:00:00", "cluster.requeue=true", "cluster.max_restarts=2")
    assert proc.returncode == 0, proc.stderr
    assert got["size"] == ["2 node(s) x 2 GPU(s) for up to 2:00:00 (cluster.time): at most 8 GPU-hours, "
                           "24 with its restarts (cluster.max_restarts=2)"], got
    assert got["slurm?"][0].startswith("not asked: "), got
    assert "queue" not in got
    assert got["start"] == [f"experiment 'sandbox-demo' starts from scratch (no checkpoint in "
                            f"{tmp_path / 'runs' / 'checkpoints' / 'sandbox-demo'})"], got
    assert proc.stdout.rstrip().endswith("ok: submit would queue this job")


def test_a_missing_image_is_a_warning_not_a_refusal(cli, clean_env, tmp_path):
    proc, got = _check(cli, clean_env, tmp_path, f"container.image={tmp_path}/verl.sqsh",
                       f"container.mounts=[{tmp_path}:{tmp_path}]")
    assert proc.returncode == 0, proc.stderr
    assert got["image"] == [f"{tmp_path}/verl.sqsh (a squashfs on shared storage)"], got
    assert any(w.startswith(f"container.image {tmp_path}/verl.sqsh does not exist here") for w in got["WARNING"]), got


def test_an_experiment_with_checkpoints_resumes_and_the_flags_say_which_is_meant(cli, clean_env, tmp_path):
    d = _ckpt(tmp_path, "sandbox-demo", 20)
    proc, got = _check(cli, clean_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert got["start"] == [f"experiment 'sandbox-demo' will RESUME from step 20 ({d}/global_step_20; "
                            "trainer.resume_mode=auto)"], got
    base = ("submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}")
    state = tmp_path / "home" / ".local" / "state"
    fresh = cli(*base, "--fresh", env=clean_env)
    assert fresh.returncode == 2, fresh.stderr
    assert refusal(fresh.stderr).splitlines()[-1] == (
        f"error: {DEMO}: wandb.experiment: --fresh: experiment 'sandbox-demo' already has checkpoints up to "
        f"global_step_20 in {d}: give it a new name (wandb.experiment=sandbox-demo-2), or move those checkpoints "
        "away; to continue it instead, use --resume"), fresh.stderr
    assert not (tmp_path / "runs" / "sandbox-demo").exists() and not state.exists()  # nothing written
    resume = cli(*base, "--resume", "--dry-run", env=clean_env)
    assert resume.returncode == 0, resume.stderr
    assert "start       experiment 'sandbox-demo' will RESUME from step 20" in resume.stderr
    other = cli(*base, "wandb.experiment=sandbox-demo-2", "--resume", "--dry-run", env=clean_env)
    assert other.returncode == 2 and "--resume: experiment 'sandbox-demo-2': there is no checkpoint to resume " \
        "from in" in other.stderr and "verl.overrides.trainer.default_local_dir" in other.stderr, other.stderr
    assert cli(*base, "wandb.experiment=sandbox-demo-2", "--fresh", "--dry-run", env=clean_env).returncode == 0
    both = cli(*base, "--fresh", "--resume", env=clean_env)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr
    sweep = cli(*base, "-m", "data.train_batch_size=8,16", "--fresh", env=clean_env)
    assert sweep.returncode == 2 and "--fresh is for one run, not a sweep" in sweep.stderr, sweep.stderr
    kept = cli(*base, "verl.overrides.trainer.resume_mode=disable", "--resume", env=clean_env)
    assert kept.returncode == 2 and "its checkpoints are not resumed with trainer.resume_mode=disable" in kept.stderr, \
        kept.stderr


def test_an_odd_registry_is_read_around_and_an_old_record_still_counts_as_a_w_and_b_run(cli, clean_env, tmp_path):
    """runs.jsonl lines that are not run records (a JSON array, null, a number, bytes that are not
    UTF-8) never make check or submit fail; a record from before runs kept wandb_enabled is a
    run that logged to W&B (the default), so --fresh refuses its experiment."""
    state = tmp_path / "state"
    state.mkdir()
    old = {"job_id": "7", "run_dir": str(tmp_path / "old"), "experiment": "sandbox-demo",
           "project": "verl-launch-demo", "entity": None}
    (state / "runs.jsonl").write_bytes(b"[]\nnull\n42\n\xff\xfe{\n" + json.dumps(old).encode() + b"\n")
    env = dict(clean_env, VERL_LAUNCH_STATE=str(state))
    proc, got = _check(cli, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "already has earlier runs (job 7): this one appends to it" in got["start"][0], got
    fresh = cli("submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}", "--fresh",
                env=env)
    assert fresh.returncode == 2 and "from job 7" in fresh.stderr and "Traceback" not in fresh.stderr, fresh.stderr
    listed = cli("list", env=env)
    assert "Traceback" not in listed.stderr, listed.stderr


@pytest.mark.sandbox_shared
def test_slurm_answers_the_partitions_size_and_when_the_job_would_start(cli, sandbox, clean_env, tmp_path):
    env = sandbox.env(clean_env)
    proc, got = _check(cli, env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert got["slurm"] == ["partition=debug account=(your default) qos=(default)"], got
    assert got["queue"][0].startswith("would start at 20") and got["queue"][0].endswith("(sbatch --test-only)"), got
    assert "WARNING" not in got and "slurm?" not in got, got
    proc, got = _check(cli, env, tmp_path, "cluster.nodes=9")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # warned, not refused: the partition may grow
    assert got["WARNING"][0] == ("cluster.nodes=9, but partition debug has 4 node(s): "
                                 "Slurm would keep the job pending for ever"), got
    assert got["WARNING"][1].startswith("sbatch --test-only refuses it: "), got
    proc, got = _check(cli, env, tmp_path, "cluster.partition=nope")
    assert got["WARNING"][0] == "cluster.partition: Slurm has no partition 'nope'", got
    proc, got = _check(cli, env, tmp_path, "cluster.partition='debug,nope'")  # Slurm takes a list
    assert got["WARNING"][0] == "cluster.partition: Slurm has no partition 'nope'", got  # debug is fine
    assert not any("debug" in w or "pending for ever" in w for w in got["WARNING"]), got
    proc, got = _check(cli, env, tmp_path, "cluster.partition=-a")  # never an option to scontrol
    assert got["WARNING"][0] == "cluster.partition: Slurm has no partition '-a'", got


@pytest.mark.sandbox_shared
def test_fresh_refuses_an_experiment_an_earlier_run_logged_to_w_and_b(cli, sandbox, clean_env, tmp_path):
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    base = ("submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}")
    info = submit_json(cli(*base, "--json", env=env))
    assert sandbox.wait(info["job_id"], timeout=180) == "COMPLETED"
    proc, got = _check(cli, env, tmp_path)
    assert "; W&B run " in got["start"][0] and f"already has earlier runs (job {info['job_id']})" in got["start"][0], got
    again = cli(*base, "--fresh", env=env)
    assert again.returncode == 2, again.stderr
    assert f"already has W&B run " in again.stderr and f"from job {info['job_id']}" in again.stderr, again.stderr
    runs = [json.loads(x) for x in (tmp_path / "state" / "runs.jsonl").read_text().splitlines()]
    assert [r["job_id"] for r in runs] == [info["job_id"]]  # nothing more queued


@pytest.mark.parametrize("command", ["check", "submit --dry-run", "import"])
def test_a_refusal_comes_with_every_warning_and_what_was_not_checked(command, cli, clean_env, tmp_path):
    """One try shows every problem: the refusal first, then what check would warn about once it
    were fixed (a missing image, a `+key` nothing reads), then what the refusal kept unchecked;
    exit 2, nothing written."""
    image = f"{tmp_path}/missing.sqsh"
    if command == "import":  # verl's own command line: a misspelt key refused, a `+key` warned about
        out = tmp_path / "r.yaml"
        proc = cli("import", "-o", out, "--", "/usr/bin/python3", "-m", "verl.trainer.main_ppo",
                   "+trainer.bogus_knob=1", "trainer.total_epoch=2", env=clean_env, cwd=tmp_path)
        warned = "verl.overrides.trainer.bogus_knob: is not a key of verl"
    else:  # the run directory outside the container's mounts: refused; the image: warned about
        out = tmp_path / "runs"
        proc = cli(*command.split(), DEMO, f"runtime.python={sys.executable}", f"paths.runs={out}",
                   f"container.image={image}", "container.mounts=[/mnt/data:/mnt/data]", env=clean_env)
        warned = f"container.image {image} does not exist here"
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stderr.strip().splitlines()
    first = next(i for i, ln in enumerate(said) if ln.startswith("error: "))
    warnings = [i for i, ln in enumerate(said) if ln.startswith("warning: ")]
    assert warnings and min(warnings) > first, said
    assert any(warned in said[i] for i in warnings), said
    assert said[-1].startswith("not checked: verl's own checks, what the experiment starts from, and Slurm's"), said
    assert not out.exists()  # nothing written
    # fixed, the refusal goes and the warning stays, as a warning
    if command == "check":
        ok = cli("check", DEMO, f"runtime.python={sys.executable}", f"paths.runs={out}", f"container.image={image}",
                 f"container.mounts=[{tmp_path}:{tmp_path}]", env=clean_env)
        assert ok.returncode == 0 and warned in ok.stdout, ok.stdout + ok.stderr


def test_a_refusal_after_verl_resolved_the_config_keeps_its_warnings_too(cli, clean_env, tmp_path):
    """Refused by what the experiment has (--fresh over checkpoints), after every other check ran:
    the missing image is still said, after the error, and nothing is left unchecked but Slurm's
    own answer, which submit does not ask."""
    d = _ckpt(tmp_path, "sandbox-demo", 20)
    image = f"{tmp_path}/missing.sqsh"
    proc = cli("submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}", "--fresh",
               f"container.image={image}", f"container.mounts=[{tmp_path}:{tmp_path}]", env=clean_env)
    assert proc.returncode == 2, proc.stderr
    said = proc.stderr.strip().splitlines()
    assert said[-2].startswith(f"error: {DEMO}: wandb.experiment: --fresh: experiment 'sandbox-demo' already has "
                               f"checkpoints up to global_step_20 in {d}"), said
    assert said[-1] == (f"warning: container.image {image} does not exist here; if the nodes cannot see it either, "
                        "the job fails at its first step (verl-launch image import makes it)"), said
    assert not (tmp_path / "runs" / "sandbox-demo").exists()
