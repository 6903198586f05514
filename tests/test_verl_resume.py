"""verl's own resume under the launcher, on the real sandbox: recipes/sandbox-verl.yaml trains 5
steps, saving every 2 (verl's checkpoint manager, keeping 1). Requeued once while it trains,
through the job's own time-limit path (USR1, as Slurm sends it cluster.signal_seconds before
the limit) once verl has saved step 2: two verl starts. The restart must resume where verl's
tracker points: verl says it loads that step, its first step logged is the next, the W&B run and
Weave project are the same, and verl's limit on kept checkpoints holds across the restart. Then
the run's checkpoint is merged and served (test_merge_serve_check below). (A third start, once
requeued by `scontrol requeue`, was cut for CI's time: Slurm's own SIGTERM teardown and restart
are test_requeue's, on the demo payload; docs/testing.md.)

The tracker is removed while the requeue waits (what verl#7952 leaves: a complete step 2 and no
latest_checkpointed_iteration.txt): the run has cluster.resume_from=latest-complete, so its job
writes the tracker for step 2 and says so before verl starts, and verl resumes from it.
After the run, check and submit read its checkpoints as verl would (test_check_and_submit_...)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_train import job_env, parse_steps, plain, train

EXPERIMENT = "sandbox-verl-resume"
OLDER = 3  # an older complete step for check and submit to name: a copy of the last, made by the test
STEPS, EVERY, KEEP = 5, 2, 1  # saves 2 (then the requeue), 4 and 5


class Requeuer:
    """Called as the job runs (train's DURING): has the job requeue itself (USR1) at verl's save
    of step 2, removes the tracker while the requeued job waits, and releases it from Slurm's
    begin-time hold. `tracker[r]`: the step verl's tracker named when restart r started (what it
    must resume from)."""

    def __init__(self, sandbox):
        self.sandbox, self.done, self.tracker, self.removed = sandbox, [], {}, None

    def __call__(self, run_dir: Path, first: dict) -> None:
        try:
            job = str(json.loads((run_dir / "run.json").read_text())["job_id"])
        except (OSError, ValueError, KeyError):
            return
        ckpt = run_dir.parent.parent / "checkpoints" / EXPERIMENT / "latest_checkpointed_iteration.txt"
        saved = ckpt.read_text().strip() if ckpt.exists() else ""
        started = [p["restart"] for p in _phases(run_dir) if p["phase"] == "driver-start"]
        for r in started:
            self.tracker.setdefault(r, int(saved) if saved.isdigit() else None)
        if not self.done and saved == "2" and started == [0]:
            self.sandbox.run("scancel", "--signal=USR1", "--batch", job)
            self.done.append(("USR1", time.time()))
            deadline = time.monotonic() + 180  # run 0 torn down (it may rewrite the tracker until then)
            while self.sandbox.job_field(job, "JobState") not in ("PENDING", "REQUEUE_HOLD") \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
            ckpt.unlink()  # verl#7952: a complete step 2 and no tracker
            self.removed = ckpt.parent / "global_step_2"
        if self.done:
            self.sandbox.release_requeued(job)


def _phases(run_dir: Path) -> list:
    try:
        return [json.loads(x) for x in (run_dir / "phases.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return []


@pytest.fixture(scope="module")
def resumed(sandbox, node_python, smoke_assets, wandb_key, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resumed")
    env = sandbox.env(job_env(os.environ, wandb_key=wandb_key, smoke=smoke_assets, tmp=tmp))
    requeuer = Requeuer(sandbox)
    job = train(node_python=node_python, runs=tmp / "runs", env=env, timeout=1200, during=requeuer, overrides=[
        "cluster.requeue=true", "cluster.resume_from=latest-complete", f"wandb.experiment={EXPERIMENT}",
        f"verl.overrides.trainer.total_training_steps={STEPS}", f"verl.overrides.trainer.save_freq={EVERY}",
        f"verl.overrides.trainer.max_actor_ckpt_to_keep={KEEP}",
        f"verl.overrides.trainer.test_freq={STEPS}",  # one validation, at the last step: its W&B row
        # one agent-loop worker, not one per node: a process fewer at each of its two starts
        # (traces from both nodes are the `traced` run's to show)
        "verl.overrides.actor_rollout_ref.rollout.agent.num_workers=1"])
    job.env, job.requeuer, job.sandbox = env, requeuer, sandbox
    assert job.run_dir is not None, job.out + job.err
    return job


def _log(job, restart: int) -> str:
    return plain((job.run_dir / "logs" / f"driver.r{restart}.log").read_text(errors="replace"))


def test_each_restart_resumes_from_verls_last_checkpoint(resumed):
    job = resumed
    assert [how for how, _ in job.requeuer.done] == ["USR1"], job.out[-3000:]
    assert job.returncode == 0, job.out[-3000:] + job.err[-3000:]
    names = [(p["phase"], p["restart"]) for p in job.phases]
    # USR1: the job tore its run down and requeued itself, in that order
    assert names.index(("preempt", 0)) < names.index(("teardown", 0)) < names.index(("requeue", 0))
    assert job.requeuer.tracker[1] == 2, job.requeuer.tracker
    log = _log(job, 1)
    assert re.search(r"^(\(TaskRunner[^)]*\) )?Resuming from \S+/global_step_2$", log, re.M), log[-3000:]
    assert min(parse_steps(log)) == 3  # verl's own first step after the restart
    assert max(parse_steps(log)) == STEPS
    assert "Training from scratch" in _log(job, 0)
    # each run its own logs; Slurm's output (--open-mode=append) keeps every run's
    for log in ("driver.r0.log", "driver.r1.log", "ray-head.r0.log", "ray-head.r1.log"):
        assert (job.run_dir / "logs" / log).stat().st_size > 0, log
    assert (job.run_dir / f"slurm-{job.job_id}.out").read_text().count("phase start") == 2
    assert names.index(("teardown", 0)) < names.index(("restart", 1)) < names.index(("driver-start", 1))
    assert ("restart", 2) not in names
    assert job.sandbox.job_field(job.job_id, "Restarts") == "1"  # Slurm's own count


def test_the_job_wrote_the_missing_tracker_for_the_newest_complete_step_and_said_so(resumed):
    """Restart 1 found step 2 complete and no tracker: with cluster.resume_from=latest-complete the
    job wrote it before verl started (verl then resumed from step 2: the test above). (A restart
    that finds verl's own tracker writes nothing: test_checkpoints.)"""
    job = resumed
    assert job.requeuer.removed is not None and job.requeuer.removed.name == "global_step_2"
    said = {p["restart"]: p["detail"] for p in job.phases if p["phase"] == "resume-check"}
    assert said == {1: "wrote latest_checkpointed_iteration.txt = 2 (there was none; cluster.resume_from="
                       "latest-complete); verl resumes from global_step_2"}, said
    names = [(p["phase"], p["restart"]) for p in job.phases]
    assert names.index(("restart", 1)) < names.index(("resume-check", 1)) < names.index(("driver-start", 1))


def test_check_and_submit_read_the_runs_checkpoints_as_verl_would(resumed, cli, tmp_path):
    """verl's own checkpoint of its last step (world size 2), and the same files as an older step
    (OLDER, a name verl did not save) before it."""
    from test_checkpoints import _cli, _warnings

    src = resumed.run_dir.parent.parent / "checkpoints" / EXPERIMENT
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt, ignore=shutil.ignore_patterns("huggingface_merged"))
    shutil.copytree(ckpt / f"global_step_{STEPS}", ckpt / f"global_step_{OLDER}")
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    env = resumed.env
    assert _warnings(_cli(cli, env, tmp_path, ckpt, "check")) == []  # as verl left it

    tracker.unlink()  # the tracker removed: named at check, refused at submit --resume
    newest = f"global_step_{STEPS}"
    warned = _warnings(_cli(cli, env, tmp_path, ckpt, "check"))
    assert len(warned) == 1 and f"the newest complete checkpoint is {newest}" in warned[0], warned
    refused = _cli(cli, env, tmp_path, ckpt, "submit", "--resume")
    assert refused.returncode == 2 and f"--resume-from {newest}" in refused.stderr, refused.stderr

    tracker.write_text("9")  # a tracker naming a step not on disk
    refused = _cli(cli, env, tmp_path, ckpt, "submit", "--resume")
    assert refused.returncode == 2 and f"names step 9, but global_step_9 is not there (steps there: global_step_{OLDER}, " \
        f"{newest})" in refused.stderr, refused.stderr
    refused = _cli(cli, env, tmp_path, ckpt, "submit", "--resume-from", "global_step_9")
    assert refused.returncode == 2 and f"(steps there: global_step_{OLDER}, {newest})" in refused.stderr, refused.stderr

    tracker.write_text(str(STEPS))  # the newest with a rank's shard missing
    (ckpt / newest / "actor" / "optim_world_size_2_rank_1.pt").unlink()
    warned = _warnings(_cli(cli, env, tmp_path, ckpt, "check"))
    assert len(warned) == 1 and f"names step {STEPS}, but {newest} is incomplete (actor/optim_world_size_2_rank_1.pt" \
        in warned[0] and f"the newest complete checkpoint is global_step_{OLDER}" in warned[0], warned
    way = _cli(cli, env, tmp_path, ckpt, "submit", "--resume-from", "latest-complete", "--dry-run")
    assert way.returncode == 0 and f"will RESUME from step {OLDER}" in way.stderr, way.stderr
    assert not (tmp_path / "runs").exists()


def test_verls_checkpoint_limit_holds_across_restarts(resumed):
    """verl forgets checkpoints from before a restart (verl#7395), and of one it removes it leaves
    the step's directory (it removes actor/ only): the job applies verl's limit at each teardown
    and restart, never to the step verl resumes from. Step 2, saved before the restart, is gone
    at the end with the rest."""
    ckpt = resumed.run_dir.parent.parent / "checkpoints" / EXPERIMENT
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == [f"global_step_{STEPS}"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    prune = [(p["restart"], p["detail"]) for p in resumed.phases if p["phase"] == "prune"]
    assert prune == [(1, f"removed global_step_2 global_step_4; kept the newest 1 up to "
                         f"global_step_{STEPS}")], prune


def test_restarts_write_to_the_same_wandb_run_and_weave_project(resumed):
    """One W&B run across the restarts; its history goes on with the steps verl logs after each
    resume, each step once, with verl's values (the last step's final validation too), and the
    run is finished by each run, both ended by the job itself: the self-requeue with its exit code
    (143), the last with 0. (A run ended by Slurm's own SIGTERM, wandb-core's too, may lose what
    it had not sent: docs/not-verified.md.)"""
    job = resumed
    run_id = re.search(r"^export WANDB_RUN_ID=(\w+)$", (job.run_dir / "job.sbatch").read_text(), re.M).group(1)
    runs = {k: v for k, v in job.wandb_runs.items() if v["name"] == EXPERIMENT}
    assert list(runs) == [run_id]
    run = runs[run_id]
    output = "\n".join(run["output"])
    assert "Training from scratch" in output and "Resuming from" in output  # r0's console, then r1's
    logged = {r: parse_steps(_log(job, r)) for r in (0, 1)}
    # verl's console as wandb captured it in the trainer's own process: Ray forwards an actor's
    # stdout to the driver's log with a delay, so a teardown can cut a restart's last line there
    # (CI: restart 1's step 4 in W&B, not in driver.r1.log).
    logged["wandb"] = parse_steps(output)
    steps = [row["_step"] for row in run["history"]]
    assert steps == sorted(set(steps)), steps  # each step once, in order
    # the job ended both runs itself: every step they logged is there
    assert set(logged[0]) | set(logged[1]) <= set(steps) and steps[-1] == STEPS, (steps, logged[0], logged[1])
    assert set(steps) <= set().union(*logged.values()), (steps, {r: sorted(s) for r, s in logged.items()})
    print(f"\nW&B history steps {steps}; restart 0 logged {sorted(logged[0])}")
    for row in run["history"]:  # verl's values, from the restart whose row was kept
        n = row["_step"]
        console = [{k: v for k, v in seen[n].items() if isinstance(v, (int, float))} for seen in logged.values()
                   if n in seen]
        assert any({k: row.get(k) for k in c} == pytest.approx(c) for c in console), n
    assert any(k.startswith("val-") for k in run["history"][-1]), sorted(run["history"][-1])  # the final validation
    assert run["ends"] == [143, 0], run["ends"]
    assert {(c["entity"], c["project"], c["attributes"]["experiment_name"]) for c in job.trajectories} == \
        {("team", "verl-launch-sandbox", EXPERIMENT)}
    traced = {c["attributes"].get("step") for c in job.trajectories}
    assert traced >= set(range(1, STEPS + 1)), sorted(traced)  # every step, before and after the restarts


def test_status_shows_the_restart_and_the_resumed_step(resumed, cli):
    out = cli("status", resumed.job_id, env=resumed.env).stdout
    assert "restart 1" in out, out
    assert re.search(rf"progress   training step {STEPS}/{STEPS}.*\(resumed from step 2\)", out), out


# Run by the node environment's interpreter (its torch wrote the shards): the actor's full state,
# gathered from verl's FSDP shards (DTensors, sharded on a dim or replicated), against the merged
# model as transformers loads it, in bf16.
_SAME = """
import json, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
actor, target = Path(sys.argv[1]), sys.argv[2]
world = json.loads((actor / "fsdp_config.json").read_text())["world_size"]
shards = [torch.load(actor / f"model_world_size_{world}_rank_{r}.pt", weights_only=False, map_location="cpu")
          for r in range(world)]
full = {}
for k, v in shards[0].items():
    dims = [p.dim for p in getattr(v, "placements", ()) if p.is_shard()]
    parts = [s[k].to_local() if hasattr(s[k], "to_local") else s[k] for s in shards]
    full[k] = torch.cat(parts, dim=dims[0]) if dims else parts[0]
got = AutoModelForCausalLM.from_pretrained(target, torch_dtype="auto").state_dict()
tied = {k for k in got if k not in full}
different = [k for k in full if not torch.equal(got[k], full[k].to(got[k].dtype))]
print(json.dumps({"keys": len(full), "different": different, "only_merged": sorted(tied),
                  "dtype": str(next(iter(got.values())).dtype)}))
"""


def test_merge_serve_check_loads_the_model_in_vllm_and_it_answers(resumed, cli, node_python):
    job = resumed
    ckpt = job.run_dir.parent.parent / "checkpoints" / EXPERIMENT
    dry = cli("merge", job.job_id, "--serve-check", "--dry-run", env=job.env)
    assert dry.returncode == 0, dry.stderr
    assert "1 GPU(s)" in dry.stdout and "it asks for 1 GPU" in dry.stdout and f"vllm found by {node_python}" in dry.stdout
    t0 = time.monotonic()
    proc = cli("merge", job.job_id, "--serve-check", "--wait", "--json", env=job.env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"\nmerge --serve-check --wait: {time.monotonic() - t0:.0f} s")
    result = json.loads(proc.stdout)
    target = Path(result["target"])
    assert result["step"] == STEPS and target == ckpt / f"global_step_{STEPS}" / "huggingface_merged"
    served = json.loads((target / "verl-launch-merge.json").read_text())["serve_check"]
    assert served["ok"] and served["engine"].startswith("vllm ") and served["chat_template"], served
    assert served["tokens"] > 0 and served["output"] == result["serve_check"]["output"]
    assert "served: vLLM answered" in proc.stderr
    same = subprocess.run([str(node_python), "-c", _SAME, str(ckpt / f"global_step_{STEPS}" / "actor"), str(target)],
                          capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, same.stderr[-3000:]
    cmp = json.loads(same.stdout.strip().splitlines()[-1])
    assert cmp["keys"] > 0 and cmp["different"] == [] and cmp["dtype"] == "torch.bfloat16", cmp
    status = cli("status", job.job_id, env=job.env).stdout
    assert f"merge      step {STEPS} -> {target}: merged" in status and "served it: 'What is 2 + 3?' -> " in status


def test_serve_check_is_refused_when_the_interpreter_has_no_vllm(resumed, cli):
    """The launcher's own interpreter has no vLLM: exit 2, where it looked, nothing submitted."""
    job = resumed
    before = set((job.run_dir / "merge").glob("*")) if (job.run_dir / "merge").exists() else set()
    ckpt = job.run_dir.parent.parent / "checkpoints" / EXPERIMENT
    for args in ([str(ckpt), "--serve-check"], [str(ckpt), "--serve-check", "--local"]):
        proc = cli("merge", *args, env=job.env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"{sys.executable} has no vllm module" in proc.stderr and "command line" in proc.stderr
    assert not (ckpt / ".verl-launch-merge").exists()
    assert (set((job.run_dir / "merge").glob("*")) if (job.run_dir / "merge").exists() else set()) == before


def test_report_accounts_for_each_attempts_allocation_across_the_requeues(resumed, cli, tmp_path):
    """Issue 57 on the requeued run: one run across its two attempts, each timed by Slurm's own
    accounting, its parts adding up to that allocation within 3%; the steps kept are verl's
    logged steps (and those saved at a requeue before verl logged them), each step logged twice
    is lost in the earlier attempt with its seconds; --json round trip, the picture, status's line."""
    job = resumed
    out = cli("report", job.job_id, "--json", "--plot", str(tmp_path / "timeline.png"), env=job.env)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert not [g for g in d["gaps"] if "no step times" in g or "Slurm" in g], d["gaps"]  # the watchdog's times
    slurm = subprocess.run(["sacct", "-c", "-D", "-n", "-P", "-j", job.job_id, "-o", "Start,End,NNodes"],
                           env=job.env, capture_output=True, text=True).stdout.split()
    spans = [(time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%S")), time.mktime(time.strptime(e, "%Y-%m-%dT%H:%M:%S")),
              int(n)) for s, e, n in (x.split("|") for x in slurm)]
    attempts = d["attempts"]
    assert [(a["start"], a["end"], a["nodes"]) for a in attempts] == spans, (attempts, slurm)
    logged = {r: sorted(parse_steps(_log(job, r))) for r in range(2)}
    for r, a in enumerate(attempts):
        seconds = a["end"] - a["start"]
        named = sum(v for k, v in a["parts"].items() if k != "unaccounted")
        assert abs(named - seconds) <= 0.03 * seconds, (r, a["parts"], seconds)
        assert a["parts"]["verl-start"] > 30 and a["parts"]["bring-up"] > 0, a["parts"]
        assert [s["step"] for s in a["steps"]] == logged[r]
        later = min(logged[r + 1]) if r < 1 else STEPS + 1
        assert a["lost_steps"] == [s for s in logged[r] if s >= later]
        assert a["unlogged"] == list(range(max(logged[r], default=job.requeuer.tracker[r] or 0) + 1, later))
        redone = sum(s["seconds"] for s in a["steps"] if not s["kept"])
        assert a["parts"]["lost"] >= redone - 0.01  # each redone step's own seconds, at least
    assert len(attempts) == 2 and attempts[1]["parts"]["validation"] > 0 and attempts[1]["ended"] == "driver-end rc=0"
    assert d["steps_kept"] == STEPS  # every step once, logged or saved at a requeue
    assert d["steps_logged"] == len({s for ss in logged.values() for s in ss})
    assert 0 < d["goodput"] < 1
    from launcher.jobs.report import Report

    assert json.loads(json.dumps(Report.from_dict(d).to_dict())) == d
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shutil.copy(tmp_path / "timeline.png", job.run_dir / "report-timeline.png")  # to look at after the run
    st = cli("status", job.job_id, env=job.env).stdout
    assert re.search(r"^goodput +\d+% of [\d,]+ node-s allocated kept training \(2 attempts", st, re.M), st
