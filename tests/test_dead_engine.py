"""A vLLM engine that dies under verl's own trainer ends the job (the loop issue, measured before:
verl's driver waited on the dead engine for ever, every actor still alive in Ray's table). On
the real sandbox: recipes/sandbox-verl.yaml trains; once verl has logged step 2, node2's
EngineCore process (the one under node2's vLLMHttpServer actor, by the PID the job's own Ray
state names) is SIGKILLed. The job must end within 2 minutes with a phase naming the engine and
the node, exit non-zero, and leave no process on any node. Also `make bench-dead-engine`."""

from __future__ import annotations

import json
import os
import re
from collections import Counter


from sandbox_procs import job_processes
from verl_train import BRIDGE, job_env, kill_engine_mid_training
from wandb_standin import StandIn

GRACE = 5  # s: cluster.death_grace (20 by default); the frozen trainer says nothing in it anyway


def test_a_dead_vllm_engine_ends_the_job_naming_it_and_leaves_nothing(sandbox, node_python, smoke_assets,
                                                                       wandb_key, tmp_path, cli):
    """verl's fit loop frozen (SIGSTOP) before the kill, a trainer that would wait for ever: the
    watchdog's verdict ends the job GRACE s (cluster.death_grace) after vLLM's line, the phase naming the
    engine from that line. (verl 0.9.1 unfrozen mostly fails of the dead engine by itself, with
    the same phase: `make bench-dead-engine` runs both; the suite runs the case the launcher alone
    must end.)"""
    env = sandbox.env(job_env(os.environ, wandb_key=wandb_key, smoke=smoke_assets, tmp=tmp_path))
    with StandIn(host=BRIDGE, api_key=wandb_key) as w:  # up after the job: `traces --expect` reads it
        job, kill, seconds = kill_engine_mid_training(node_python=node_python, runs=tmp_path / "runs", env=env,
                                                      freeze_trainer=True, standin=w, grace=GRACE)
        _check(job, kill, seconds, env, cli)


def _check(job, kill, seconds, env, cli):
    assert kill.killed is not None, f"{kill.why_not}\n{job.out[-3000:]}{job.err[-3000:]}"
    print(f"\nEngineCore (pid {kill.pid}) killed on node2 after step 2, trainer frozen: "
          f"the job ended {seconds:.1f} s later")
    assert job.returncode == 1, job.out[-3000:] + job.err[-3000:]
    assert seconds < 120
    # the watchdog ended it: after its grace, before the driver said anything
    assert seconds >= GRACE and [p for p in job.phases if p["phase"] == "driver-error"] == \
        [p for p in job.phases if p["phase"] in ("driver-error", "driver-end")][:1]
    assert max(job.steps) < 60  # it did not train on
    err = [p for p in job.phases if p["phase"] == "driver-error"]
    assert len(err) == 1, job.phases
    detail = err[0]["detail"]
    assert detail.startswith("vLLM EngineCore on node2 died ("), detail
    assert "the driver's last errors: " in detail
    assert not any(p["phase"] == "bad-node" for p in job.phases)  # no hardware words: not the node's fault
    assert [p["phase"] for p in job.phases][-1] == "teardown"
    assert job_processes(job.job_id) == []  # on any node: found by the job id in their environment
    # the engine's server's own log (vLLM's words) kept from node2 past the teardown (issue 65)
    kept = list((job.run_dir / "logs" / "last-words.r0" / "node2").glob("worker-*.err"))
    print(f"kept of node2's vLLMHttpServer: {[(f.name, f.stat().st_size) for f in kept]}")
    assert kept and all(0 < f.stat().st_size <= 65536 for f in kept), kept
    st = json.loads(cli("status", job.job_id, "--json", env=env).stdout)
    assert st["state"] == "FAILED" and st["stopped"].startswith("driver-error: vLLM EngineCore on node2 died")
    assert (st["progress"] or "").startswith("training step ")  # the last step known, after the end
    # W&B: the run holds every step verl logged before the engine died, and is marked failed with
    # the job's exit code (each node's W&B service finished it once Ray had stopped)
    (run,) = [r for r in job.wandb_runs.values() if r["name"] == "dead-engine"]
    assert [row["_step"] for row in run["history"]] == sorted(job.steps), (run["history"], job.steps)
    assert run["ends"] == [1], run["ends"]
    # Weave: what the workers had traced is kept; the summary names the steps that completed, at
    # the estimate, and the step the kill cut short with what arrived of it (issue 56)
    est = json.loads((job.run_dir / "run.json").read_text())["traces_per_step"]
    per = Counter(c["attributes"]["step"] for c in job.calls
                  if c["parent_id"] is None and c["attributes"].get("validate") is False)
    done = max(job.steps)
    assert all(per[s] == est for s in range(1, done + 1)), (per, est)
    traced = [line for line in job.out.splitlines() if line.startswith("traces ")][-1]
    after = sum(n for s, n in per.items() if s > done)
    cut = (rf" in the {done} completed steps; step {done + 1} did not complete: {after} of its trajectories "
           rf"arrived \({est} estimated\)" if after else "")
    print(f"summary: {traced}")
    assert re.fullmatch(rf"traces +{sum(per.values())} received, steps 1-{done + (1 if after else 0)}, "
                        rf"{est}/step as estimated{cut}", traced), (traced, per)
    expect = cli("traces", job.job_id, "--expect", env=env)  # the same words; no completed step short
    assert (expect.returncode, expect.stdout.strip()) == (0, traced), expect.stdout + expect.stderr
