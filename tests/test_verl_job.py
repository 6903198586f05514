"""verl's own trainer (`python -m verl.trainer.main_ppo`) trains under the launcher on the real
Slurm sandbox: async-rollout GRPO with vLLM's CPU build on 2 nodes x 1 fake GPU, Weave tracing on
against the loopback W&B stand-in (the test-only node environment and CPU platform). The suite's
one traced run (tests/traced_run.py, recipes/sandbox-tool-agent.yaml: verl's tool loop, the
example loop and single turn, row by row) serves every assertion about it; what happened is read
from verl's own log, from Ray's GCS while the job runs, and from what the stand-in received, never
from what the launcher says. The V1 trainer (tracing off) trains too, through the CI smoke
recipe in local mode.

Also the two bugs verl found in the product: Slurm's ROCR_VISIBLE_DEVICES beside
CUDA_VISIBLE_DEVICES (every GPU worker dies without cluster.gpu_vendor's clearing), and CPUs
that verl's Ray actors need but the old estimate let through (verl waits forever)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from sandbox_procs import job_processes
from traced_run import EXPERIMENT, FILE_LOG, STEPS, check
from verl_train import NODE_IP, assert_trained, parse_steps, phases as _phases, plain as _plain

RECIPE = RECIPES / "sandbox-verl.yaml"


def _env(clean_env, smoke_assets, tmp_path, sandbox=None) -> dict:
    env = dict(clean_env, VERL_SMOKE_DIR=str(smoke_assets), VERL_LAUNCH_STATE=str(tmp_path / "state"))
    return sandbox.env(env) if sandbox else env


def _args(tmp_path, *overrides, python=sys.executable):
    return [RECIPE, f"runtime.python={python}", f"paths.runs={tmp_path / 'runs'}", *overrides]


# ----------------------------------------------------------------------------- no sandbox
UNTRACED = ["trace.backend=none", "wandb.enabled=false"]


@pytest.mark.parametrize("trainer, overrides, need", [
    ("V1", UNTRACED, 8),  # 3 x 1 GPU bundle + 4 of 8 storage units + the TransferQueue controller
    ("legacy", [*UNTRACED, "verl.overrides.trainer.use_v1=false"], 3),  # 3 x 1 GPU bundle
    ("legacy", ["wandb.entity=team"], 3),  # the recipe as shipped: tracing derives use_v1=false
])
def test_one_cpu_short_of_what_verl_holds_is_refused_before_the_queue(cli, clean_env, smoke_assets, tmp_path,
                                                                       trainer, overrides, need):
    env = _env(clean_env, smoke_assets, tmp_path)
    ok = cli("check", *_args(tmp_path, *overrides, f"cluster.cpus_per_task={need}"), env=env)
    assert ok.returncode == 0, ok.stderr
    short = cli("submit", *_args(tmp_path, *overrides, f"cluster.cpus_per_task={need - 1}"), env=env)
    assert short.returncode == 2, short.stdout + short.stderr
    assert "command line: cluster.cpus_per_task:" in short.stderr
    assert f"verl's {trainer} trainer holds" in short.stderr and f"= {need} per node" in short.stderr
    assert f"cluster.cpus_per_task={need} or more" in short.stderr
    assert not (tmp_path / "runs").exists()  # nothing written, nothing queued


# ----------------------------------------------------------------------------- the traced run
# conftest's `traced`: the suite's one traced run (tests/traced_run.py), shared with test_tool_agent_job


def test_verl_trains_every_step_and_the_weights_reach_vllm(traced):
    """verl's own log: steps 1..N, real gradients from a reward that varies, and vLLM's token
    probabilities matching the actor's after each weight sync; the job ends COMPLETED."""
    assert_trained(traced, STEPS)
    for n, m in traced.steps.items():
        assert m["critic/advantages/max"] > 0 > m["critic/advantages/min"], (n, m)  # GRPO: the reward varies
    assert traced.checkpoint is None  # none saved (save_freq=-1): every step's traces came all the same
    assert not traced.new_ray_sessions  # verl joined the job's Ray, started none of its own
    assert job_processes(traced.job_id) == []  # and nothing of the job is left


def test_vllm_servers_ranks_and_agent_loops_run_on_both_nodes(traced):
    """Ray's GCS, read while the job ran: verl's task runner on the job's Ray, one GPU worker and
    one vLLM server per node, agent loops on both; torch.distributed over gloo across the nodes."""
    head = [p for p in traced.phases if p["phase"] == "head-up"][-1]["detail"]
    log = traced.log
    assert f"Connecting to existing Ray cluster at address: {head}" in log
    assert traced.nodes_of("vLLMHttpServer") == ["node1", "node2"], traced.actors
    assert traced.nodes_of("WorkerDict") == ["node1", "node2"], traced.actors
    assert traced.nodes_of("AgentLoopWorker") == ["node1", "node2"], traced.actors
    assert len(traced.nodes_of("TaskRunner")) == 1 and "TransferQueueController" not in {
        c for c, _, _ in traced.actors.values()}  # the legacy trainer: tracing derived use_v1=false
    ranks = re.findall(r"\[cpu-platform\] init_process_group rank=(\d) world=2 host=(node\d) backend=\S+ "
                       r"master=169\.254\.77\.11:\d+ GLOO_SOCKET_IFNAME=eth0", log)
    assert sorted(set(ranks)) == [("0", "node1"), ("1", "node2")], ranks
    assert "ROCR_VISIBLE_DEVICES" not in log  # verl's Worker refuses it beside CUDA_VISIBLE_DEVICES


def test_every_trajectory_is_traced_to_weave_from_both_nodes_as_check_estimates(traced, cli):
    """The stand-in got verl's own agent-loop trajectories: every step, as many as `check`
    estimates, each with its generate call inside, verl's attributes, the run's project."""
    trajectories = traced.trajectories
    per_step = int(re.search(r"^traces +about (\d+) per training step", check(traced, cli), re.M).group(1))
    by_step = {}
    for c in trajectories:
        by_step.setdefault(c["attributes"].get("step"), []).append(c)
    assert sorted(by_step) == list(range(1, STEPS + 1)), sorted(by_step)
    assert {s: len(cs) for s, cs in by_step.items()} == {s: per_step for s in range(1, STEPS + 1)}
    for c in trajectories:
        a = c["attributes"]
        assert (c["entity"], c["project"]) == ("team", "verl-launch-sandbox") and c["auth_ok"], c
        assert a["experiment_name"] == EXPERIMENT and a["validate"] is False, a
        assert isinstance(a["sample_index"], int) and 0 <= a["rollout_n"] < 2, a
    for s, cs in by_step.items():  # every sample, all its rollouts: 0..n-1, each once (the recipe's n: 2)
        rollouts = {}
        for c in cs:
            rollouts.setdefault(c["attributes"]["sample_index"], []).append(c["attributes"]["rollout_n"])
        assert rollouts and all(sorted(r) == [0, 1] for r in rollouts.values()), (s, rollouts)
    assert {NODE_IP.get(c["client"]) for c in trajectories} == {"node1", "node2"}
    inside = {c["trace_id"] for c in traced.calls if c["short_name"].endswith(".generate")}
    assert {c["trace_id"] for c in trajectories} <= inside  # each trajectory's generate call sits inside it


def test_traces_reads_the_training_runs_trajectories_back(traced, cli):
    """`verl-launch traces` lists exactly what the stand-in recorded, per step as estimated;
    --step picks one step's; --show prints verl's decoded prompt and response (token2text);
    --compare puts two steps of one sample side by side; --expect passes."""
    env = traced.env
    listed = cli("traces", traced.job_id, env=env)
    assert listed.returncode == 0, listed.stderr
    ids = [line.split()[-1] for line in listed.stdout.splitlines()[1:-1]]
    assert sorted(ids) == sorted(c["id"] for c in traced.trajectories)
    per_step = traced.run_record["traces_per_step"]
    assert listed.stdout.strip().splitlines()[-1] == (
        f"{len(ids)} trajectories, steps 1-{STEPS}, {per_step}/step as estimated")
    two = [json.loads(x) for x in cli("traces", traced.job_id, "--step", "2", "--json", env=env).stdout.splitlines()]
    assert len(two) == per_step and {t["step"] for t in two} == {2}
    assert all([c["op"] for c in t["calls"] if c["op"].endswith(".generate")] for t in two)
    # a model turn each, and a second after the tool's answer (step 2: single turn, and the tool's loop)
    assert {t["op"] for t in two} == {"SingleTurnAgentLoop.run", "ToolAgentLoop.run"}, two
    assert all(t["turns"] == 1 + (t["tool_calls"] if t["op"] == "ToolAgentLoop.run" else 0) for t in two), two
    t = two[0]
    show = cli("traces", traced.job_id, "--show", t["call_id"], env=env)
    assert show.returncode == 0, show.stderr
    assert f"prompt     {t['output']['prompt_text'].splitlines()[0]}" in show.stdout, show.stdout
    assert f"response   {t['output']['response_text'].splitlines()[0]}" in show.stdout, show.stdout
    # the rows in order, 4 a step: no sample twice; compare the first and the last step by call id (one
    # sample across steps, picked by filters, is compared in test_trace_reads.py)
    ends = [json.loads(cli("traces", traced.job_id, "--step", str(n), "--rollout-n", "0", "--limit", "1", "--json",
                           env=env).stdout) for n in (1, STEPS)]
    cmp = cli("traces", traced.job_id, "--compare", *[t["call_id"] for t in ends], env=env)
    assert cmp.returncode == 0, cmp.stderr
    rows = {line[2:15].strip(): line for line in cmp.stdout.splitlines()}
    assert rows["step"].startswith("*") and rows["step"].split()[-2:] == ["1", str(STEPS)], cmp.stdout
    assert rows["prompt"].startswith("*") and rows["response"].startswith("*"), cmp.stdout  # two samples' texts
    assert cli("traces", traced.job_id, "--expect", env=env).returncode == 0
    assert traced.standin.unknown == []  # every read was answered


EXAMPLE = "CheckedAgentLoop"  # launcher/examples/agent_loop.py, picked by some rows' agent_name


def test_rows_picking_the_example_agent_loop_trace_its_own_step_and_reward(traced, cli):
    """The recipe registers the example agent loop (recipes/agents/checked.yaml) and some rows of
    its data pick it by agent_name (others verl's single turn and tool loops): those trajectories
    are rooted in the example's run, with verl's own loop and the example's traced check inside, in
    that order; the check ran the calculator and scored the trajectory with the run's reward
    function, so the root's output holds the reward and `traces` lists it; they carry verl's
    attributes as verl's own do, and --show prints the check's input and output. verl's own
    trajectories leave the reward to later."""
    ours = [c for c in traced.trajectories if c["short_name"] == f"{EXAMPLE}.run"]
    theirs = [c for c in traced.trajectories if c["short_name"] in ("SingleTurnAgentLoop.run", "ToolAgentLoop.run")]
    assert ours and {c["short_name"] for c in theirs} == {"SingleTurnAgentLoop.run", "ToolAgentLoop.run"}, \
        len(traced.trajectories)
    assert len(ours) + len(theirs) == len(traced.trajectories), len(traced.trajectories)
    kids = {}
    for c in sorted(traced.calls, key=lambda c: c["started_at"]):
        kids.setdefault(c["parent_id"], []).append(c)
    for t in ours:
        inside = kids[t["id"]]
        assert [c["short_name"] for c in inside] == ["SingleTurnAgentLoop.run", f"{EXAMPLE}.check_answer"], inside
        check = inside[1]
        assert check["output"]["reward"] == t["output"]["reward_score"] and check["exception"] is None, check
        assert check["output"]["calculator"] == str(eval(check["output"]["expression"]))  # noqa: S307 - our digits
        assert [c["short_name"] for c in kids[check["id"]]] == ["CalculatorTool.execute"]
        for c in (check, *kids[check["id"]]):
            assert {k: c["attributes"][k] for k in ("step", "sample_index", "rollout_n", "validate",
                                                    "experiment_name")} == \
                {k: t["attributes"][k] for k in ("step", "sample_index", "rollout_n", "validate", "experiment_name")}
    assert all(t["output"]["reward_score"] is None for t in theirs)  # verl 0.9.1 scores after its traced run
    listed = [json.loads(x) for x in cli("traces", traced.job_id, "--json", env=traced.env).stdout.splitlines()]
    rewards = {t["call_id"]: t["reward"] for t in listed}
    assert {t["id"]: t["output"]["reward_score"] for t in ours} == {k: v for k, v in rewards.items()
                                                                     if k in {t["id"] for t in ours}}
    t = ours[0]
    show = cli("traces", traced.job_id, "--show", t["id"], env=traced.env)
    assert show.returncode == 0, show.stderr
    check = kids[t["id"]][1]
    line = next(x for x in show.stdout.splitlines() if x.startswith(f"  op         {EXAMPLE}.check_answer("))
    assert f'"question": "{check["inputs"]["question"]}"' in line and line.endswith(json.dumps(check["output"])[:300]), line
    assert f"    call     CalculatorTool.execute(" in show.stdout and f"reward     {t['output']['reward_score']:.3g}" \
        in show.stdout, show.stdout
    print(f"\n{len(ours)} of {len(traced.trajectories)} trajectories by the example loop; traces --show:\n{show.stdout}")


def test_a_call_traced_outside_the_workers_with_rollout_trace_attr_is_read_back_by_experiment(traced, cli):
    """An evaluation made in a process of its own (launcher/examples/trace_outside.py), traced to the
    run's project with verl's rollout_trace_attr: `traces --experiment` finds it, with its attributes."""
    project = f"team/{traced.run_record['project']}"
    env = {k: v for k, v in traced.env.items() if not k.startswith(("WEAVE_", "WF_"))}
    env.update(WANDB_BASE_URL=traced.url, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run([sys.executable, "-m", "launcher.examples.trace_outside", project, "sandbox-verl-eval",
                           "(3 + 4) * 6"], env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert traced.standin.wait_for(lambda s: any(c["attributes"].get("experiment_name") == "sandbox-verl-eval"
                                                  for c in s.calls), timeout=30)
    found = [json.loads(x) for x in cli("traces", traced.job_id, "--experiment", "sandbox-verl-eval", "--json",
                                        env=traced.env).stdout.splitlines()]
    assert [(t["op"], t["step"], t["sample_index"], t["rollout_n"], t["experiment"]) for t in found] == \
        [("CalculatorTool.execute", 7, 3, 1, "sandbox-verl-eval")], found


def test_wandb_has_every_step_verl_logged_the_run_finished_and_no_key_is_written(traced, wandb_key):
    """Tracing puts wandb in verl's logger: its run reached the stand-in under the run's entity,
    project and experiment, with verl's config and console; a history row for every step, 1..N,
    each holding every number verl's console printed for that step (the last step too, which
    verl logs without a commit); finished once, with the job's exit code, 0. verl's trainer never
    finishes it (Ray ends its actor): each node's W&B service does, after Ray (wandb_service.py).
    The key is in no file of the run."""
    runs = [r for r in traced.wandb_runs.values() if r["name"] == EXPERIMENT]
    assert len(runs) == 1, traced.wandb_runs.keys()
    run = runs[0]
    assert (run["entity"], run["project"]) == ("team", "verl-launch-sandbox"), run
    assert run["config"]["trainer"]["experiment_name"] == EXPERIMENT, run["config"].get("trainer")
    assert [row["_step"] for row in run["history"]] == list(range(1, STEPS + 1)), run["history"]
    for row in run["history"]:
        console = {k: v for k, v in traced.steps[row["_step"]].items() if isinstance(v, (int, float))}
        assert len(console) > 20 and {k: row.get(k) for k in console} == pytest.approx(console), row["_step"]
    assert run["ends"] == [0] and run["summary"]["_step"] == STEPS, (run["ends"], run["summary"].get("_step"))
    said = [line for line in (traced.run_dir / "logs" / "wandb-service.r0.log").read_text().splitlines()
            if "finished its runs with exit code" in line]
    assert len(said) == 2 and all("with exit code 0 in" in line for line in said), said  # both nodes' services
    basic = base64.b64encode(f"api:{wandb_key}".encode())  # as the W&B clients send it
    for f in Path(traced.run_dir).rglob("*"):  # wandb's own files (wandb/run-*/) included
        if f.is_file():
            data = f.read_bytes()
            assert wandb_key.encode() not in data and basic not in data, f
    assert wandb_key not in traced.out + traced.err


def test_the_recipes_own_logger_logs_every_step_beside_wandb(traced):
    """trainer.logger=[console,file] with wandb.enabled: verl got [console,file,wandb] (the job's
    command line), and its file logger wrote every step, each with the numbers its console and
    W&B's history have (the W&B test above holds the history to the console)."""
    args = (traced.run_dir / "job.sbatch").read_text()
    assert "'trainer.logger=[console,file,wandb]'" in args
    rows = [json.loads(line) for line in (traced.tmp / FILE_LOG).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), rows
    for r in rows:
        console = {k: v for k, v in traced.steps[r["step"]].items() if isinstance(v, (int, float))}
        assert len(console) > 20 and {k: r["data"].get(k) for k in console} == pytest.approx(console), r["step"]


def test_no_one_but_the_job_joins_its_ray_and_its_token_stays_its_own(traced):
    """While verl trained, from outside the job: a driver with no token (Ray's AuthenticationError), a
    bare GCS client and one with a wrong token (after Ray's retries) are refused; one with the job's token joins
    both nodes (so the refusals are the token's, not the network's). Another user can neither read
    the token nor enter the job's Ray dir. The token is in no file of the run (its own file is gone
    after the teardown), nor in Slurm's record of the job; the job trained with it (above)."""
    got = traced.intruder.wait()
    assert got["with_token"]["rc"] == 0 and "JOINED 2" in got["with_token"]["out"], got["with_token"]
    for name in ("no_token", "bare_gcs_client", "wrong_token"):
        assert got[name]["rc"] != 0 and "JOINED" not in got[name]["out"] and "GCS" not in got[name]["out"], got[name]
    assert "AuthenticationError" in got["no_token"]["err"] or "Unauthenticated" in got["no_token"]["err"], got["no_token"]
    assert all(got[n]["rc"] != "timeout" for n in ("no_token", "bare_gcs_client", "wrong_token")), got  # refused, not hung
    assert got["token_file"]["mode"] == "0o600" and got["ray_home"]["mode"] == "0o700", got
    assert got["nobody_reads_token"]["rc"] != 0 and "Permission denied" in got["nobody_reads_token"]["err"]
    assert got["nobody_lists_ray_home"]["rc"] != 0 and "Permission denied" in got["nobody_lists_ray_home"]["err"]
    token = traced.intruder.token.encode()
    assert len(token) == 64 and not list(traced.run_dir.glob(".ray-token.r*"))
    for f in traced.run_dir.rglob("*"):
        if f.is_file():
            assert token not in f.read_bytes(), f
    scontrol = traced.intruder.scontrol  # read while the job ran
    assert f"JobId={traced.job_id} " in scontrol and token.decode() not in scontrol


def test_wait_and_status_show_the_training_progress_from_verls_steps(traced, cli):
    moving = re.findall(rf"training step (\d)/{STEPS}, [0-9.]+ s/step", traced.out)
    assert moving, traced.out[-3000:]  # --wait's progress, from verl's own step lines
    st = cli("status", traced.job_id, env=traced.env)
    assert st.returncode == 0, st.stderr
    assert re.search(rf"^progress +training step {STEPS}/{STEPS}, [0-9.]+ s/step$", st.stdout, re.M), st.stdout
    js = json.loads(cli("status", traced.job_id, "--json", env=traced.env).stdout)
    assert js["progress"].startswith(f"training step {STEPS}/{STEPS}") and js["state"] == "COMPLETED"


def test_the_v1_trainer_trains_the_ci_smoke_recipe_locally(cli, clean_env, node_python, smoke_assets, tmp_path):
    """The CI smoke path without a GPU: `submit --local recipes/ci-smoke-1gpu.yaml`, verl's
    default V1 trainer (tracing off: V1 never traces), with the node environment and
    +testing=cpu-nodes. Only the GPU itself is left unverified."""
    env = {k: v for k, v in _env(clean_env, smoke_assets, tmp_path).items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = cli("submit", "--local", RECIPES / "ci-smoke-1gpu.yaml", f"runtime.python={node_python}",
               "+testing=cpu-nodes", f"paths.runs={tmp_path / 'runs'}", "--json",
               # one agent-loop worker, not the recipe's 2: a process fewer (a second is the traced run's)
               "verl.overrides.actor_rollout_ref.rollout.agent.num_workers=1", env=env, timeout=900)
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    run = Path(rec["run_dir"])
    log = _plain((run / "logs" / "driver.r0.log").read_text())
    assert proc.returncode == 0 and rec["final_state"] == "COMPLETED", log[-3000:]
    steps = parse_steps(log)
    assert sorted(steps) == [1, 2, 3], log[-3000:]
    assert "TaskRunnerV1" in log  # verl 0.9's default trainer
    for n, m in steps.items():
        assert m["actor/grad_norm"] > 0 and m["training/rollout_actor_probs_pearson_corr"] > 0.99, (n, m)
    assert rec["leftovers"] == 0, rec.get("leftover_processes")


@pytest.mark.train  # verl's trainer, from the test environment's verl (no node_python)
def test_watchdog_fails_verls_silent_wait_and_names_the_shortfall(sandbox, clean_env, smoke_assets, tmp_path, cli):
    """One CPU short (the launcher refuses that, so the rendered script is edited by hand, as a
    user might): verl's V1 trainer waits forever for a node with CPUs free for its placement
    group or a storage unit. The watchdog fails the job after cluster.pending_timeout of nothing
    moving, saying why. (It never reaches the rollout: the test venv's verl is enough.)"""
    env = _env(clean_env, smoke_assets, tmp_path, sandbox)
    # 2 storage actors, not verl's 8: each is a process to start before verl waits (3 + 1 + 1 CPUs)
    units = "verl.overrides.transfer_queue.backend.SimpleStorage.num_data_storage_units=2"
    script = cli("render", *_args(tmp_path, *UNTRACED, units, "cluster.cpus_per_task=5", "cluster.pending_timeout=15"),
                 env=env)
    assert script.returncode == 0, script.stderr
    assert "--num-cpus=5 " in script.stdout
    run_dir = tmp_path / "by-hand"
    run_dir.mkdir()
    (run_dir / "job.sbatch").write_text(script.stdout.replace("--num-cpus=5 ", "--num-cpus=4 "))
    proc = subprocess.run(["sbatch", "--parsable", "job.sbatch"], cwd=run_dir, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert sandbox.wait(job, timeout=600) == "FAILED"
    out = _plain((run_dir / f"slurm-{job}.out").read_text())
    hang = [p for p in _phases(run_dir) if p["phase"] == "hang"]
    assert len(hang) == 1, out[-3000:]
    why = hang[0]["detail"]
    assert re.search(r"^(placement group \S+ \(1 bundle\(s\) \{CPU: 3, GPU: 1\}, STRICT_PACK\) needs \{CPU: 3, "
                     r"GPU: 1\}|actor SimpleStorageUnit needs \{CPU: 1\}) on one node", why), why
    assert "cluster.pending_timeout" in why and "raise cluster.cpus_per_task" in why
    assert "vLLMHttpServer" not in out  # it never got that far


def test_slurm_sets_other_vendors_gpu_variables_and_the_job_clears_them(cli, sandbox, clean_env, tmp_path):
    """The sandbox's gres.conf has no env flags, as on clusters that list GPUs by hand: Slurm
    sets ROCR_VISIBLE_DEVICES (and more) beside CUDA_VISIBLE_DEVICES in every step."""
    def gpu_env(vendor):
        info = submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                               f"paths.runs={tmp_path / vendor}", f"cluster.gpu_vendor={vendor}", "--json",
                               env=sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))))
        assert sandbox.wait(info["job_id"]) == "COMPLETED", Path(info["stdout"]).read_text()[-2000:]
        return json.loads((Path(info["run_dir"]) / "demo-report.r0.json").read_text())["gpu_env"]

    kept = gpu_env("none")  # as Slurm set them
    assert len(kept) == 4 and all(e["ROCR_VISIBLE_DEVICES"] is not None for e in kept), kept
    cleared = gpu_env("nvidia")  # the default
    assert len(cleared) == 4
    for e in cleared:  # Ray's own per-worker CUDA_VISIBLE_DEVICES, nothing of other vendors
        assert e["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert [v for k, v in e.items() if k != "CUDA_VISIBLE_DEVICES" and v is not None] == [], e


@pytest.mark.sandbox_shared  # a demo job: its bound (60 s against the 600 s it would take) holds beside another
def test_work_no_node_can_hold_fails_at_once_with_the_field_to_change(cli, sandbox, clean_env, tmp_path):
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    info = submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "+verl.overrides.demo.stuck=64", "--json", env=env))
    assert sandbox.wait(info["job_id"], timeout=180) == "FAILED"
    phases = _phases(info["run_dir"])
    hang = [p for p in phases if p["phase"] == "hang"]
    assert len(hang) == 1, Path(info["stdout"]).read_text()[-3000:]
    assert hang[0]["detail"].startswith("actor TooBig needs {CPU: 64} on one node and cannot be placed "
                                        "(no node has that much in all)")
    assert "raise cluster.cpus_per_task" in hang[0]["detail"]
    # by the job's own clock, from its driver's start (the watchdog's), not Slurm's or Ray's start
    # on a loaded machine: at once, not after cluster.pending_timeout (600 s)
    started = next(p["time"] for p in phases if p["phase"] == "driver-start")
    assert hang[0]["time"] - started < 60, (started, hang[0])
    st = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    assert st["stopped"].startswith("hang: actor TooBig needs {CPU: 64}")
