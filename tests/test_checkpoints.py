"""launcher/base/checkpoints.py on checkpoints verl's own FSDP checkpoint manager writes (world size 2,
tests/fsdp_checkpoints.py): which step verl's resume_mode=auto loads, whether it could, and what
the job does before verl starts. The sandbox's resume run shows the same on the checkpoints its
training wrote (test_verl_resume.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, refusal
from launcher.base import checkpoints as ck

FSDP2 = {"strategy": "fsdp", "world_size": 2, "actor": ["model", "optimizer", "extra"], "critic": None}
SCRIPT = Path(ck.__file__)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("written") / "ckpt"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fsdp_checkpoints.py")), str(root),
                           "1", "2", "3", "--world-size", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / ck.TRACKER).read_text().strip() == "3"
    return root


@pytest.fixture
def ckpt(written, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(written, root)
    return root


def _tracker(root: Path, text=None) -> None:
    (root / ck.TRACKER).unlink(missing_ok=True)
    if text is not None:
        (root / ck.TRACKER).write_text(text)


def test_verls_own_save_is_complete_and_resumed(ckpt):
    s = ck.survey(str(ckpt), FSDP2)
    assert (s.steps, s.tracker, s.newest_complete, s.loads, s.problem, s.fails) == ([1, 2, 3], 3, 3, 3, None, False)


@pytest.mark.parametrize("tracker, loads, fails, words", [
    (None, None, False, ["global_step_1, global_step_2, global_step_3 but no latest_checkpointed_iteration.txt",
                         "verl would start from scratch (verl#7952)", "newest complete checkpoint is global_step_3"]),
    ("9", None, False, ["names step 9, but global_step_9 is not there (steps there: global_step_1, global_step_2, "
                        "global_step_3)", "start from scratch", "global_step_3"]),
    ("three", None, True, ["holds 'three', not a step: verl would fail at start"]),
    ("2\n", 2, False, ["names step 2, but global_step_3 is newer and complete: verl would resume from step 2"]),
])
def test_a_tracker_verl_would_not_resume_the_newest_from(ckpt, tracker, loads, fails, words):
    _tracker(ckpt, tracker)
    s = ck.survey(str(ckpt), FSDP2)
    assert (s.newest_complete, s.loads, s.fails) == (3, loads, fails)
    for w in words:
        assert w in s.problem, s.problem
    assert "--resume-from global_step_3" in s.way_out()


def test_a_rank_missing_makes_the_step_before_it_the_newest_complete(ckpt):
    (ckpt / "global_step_3" / "actor" / "model_world_size_2_rank_1.pt").unlink()
    s = ck.survey(str(ckpt), FSDP2)
    assert (s.newest_complete, s.fails, s.loads) == (2, True, None)
    assert "names step 3, but global_step_3 is incomplete (actor/model_world_size_2_rank_1.pt is missing or empty)" \
        in s.problem and "verl would fail loading it" in s.problem
    _tracker(ckpt, None)
    s = ck.survey(str(ckpt), FSDP2)
    assert s.newest_complete == 2 and not s.fails
    assert s.problem.endswith("newest complete checkpoint is global_step_2 (global_step_3 is incomplete: "
                              "actor/model_world_size_2_rank_1.pt is missing or empty)"), s.problem


def test_an_empty_shard_is_missing(ckpt):
    (ckpt / "global_step_3" / "actor" / "extra_state_world_size_2_rank_0.pt").write_bytes(b"")
    assert ck.survey(str(ckpt), FSDP2).newest_complete == 2


def test_what_a_run_loads_decides_what_must_be_there(ckpt):
    for r in (0, 1):
        (ckpt / "global_step_3" / "actor" / f"optim_world_size_2_rank_{r}.pt").unlink()
    assert ck.survey(str(ckpt), FSDP2).newest_complete == 2
    assert ck.survey(str(ckpt), dict(FSDP2, actor=["model", "extra"])).newest_complete == 3
    # another world size: verl loads only its own ranks' files
    s = ck.survey(str(ckpt), dict(FSDP2, world_size=4))
    assert s.newest_complete is None and s.fails
    assert "saved by 2 ranks and this run has 4" in s.incomplete[3]
    # unknown world size: the one it was saved with
    assert ck.survey(str(ckpt), dict(FSDP2, world_size=None)).newest_complete == 2
    # a critic (GAE): verl loads critic/ too
    s = ck.survey(str(ckpt), dict(FSDP2, critic=["model", "optimizer", "extra"]))
    assert s.newest_complete is None and s.incomplete[1] == "no critic/"


def test_megatron_is_complete_once_its_manifest_is_written(tmp_path):
    for step in (1, 2):
        (tmp_path / f"global_step_{step}" / "actor" / "dist_ckpt").mkdir(parents=True)
    (tmp_path / "global_step_1" / "actor" / "ckpt_contents.json").write_text("{}")
    s = ck.survey(str(tmp_path), {"strategy": "megatron", "world_size": 8, "actor": ["model"], "critic": None})
    assert s.newest_complete == 1 and "ckpt_contents.json" in s.incomplete[2]


def test_layout_from_verls_values():
    v = {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 4, "actor_rollout_ref.actor.strategy": "fsdp2",
         "actor_rollout_ref.actor.checkpoint.load_contents": ["model"], "algorithm.adv_estimator": "gae"}
    assert ck.layout(v) == {"strategy": "fsdp", "world_size": 8, "actor": ["model"],
                            "critic": ["model", "optimizer", "extra"]}
    assert ck.layout({"critic.enable": False, "algorithm.adv_estimator": "gae"})["critic"] is None
    assert ck.layout({})["world_size"] is None


# ----------------------------------------------------------------------------- in the job
def _job(ckpt: Path, mode: str, restart: int, state: Path) -> tuple:
    """The checker as the job runs it: `python - ROOT LAYOUT MODE RESTART STATE` with the file on stdin."""
    proc = subprocess.run([sys.executable, "-", str(ckpt), json.dumps(FSDP2), mode, str(restart), str(state)],
                          input=SCRIPT.read_text(), capture_output=True, text=True, timeout=60)
    assert proc.stderr == ""
    return proc.returncode, proc.stdout.strip()


def test_the_job_says_what_verl_resumes_from(ckpt, tmp_path):
    assert _job(ckpt, "auto", 0, tmp_path / "state") == (0, "verl resumes from global_step_3")
    assert json.loads((tmp_path / "state").read_text()) == {"newest_complete": 3}


def test_latest_complete_writes_the_tracker_and_says_so(ckpt, tmp_path):
    _tracker(ckpt, None)
    (ckpt / "global_step_3" / "actor" / "model_world_size_2_rank_0.pt").unlink()
    for restart in (0, 1):
        code, said = _job(ckpt, ck.LATEST, restart, tmp_path / "state")
        assert code == 0
        assert said == ("wrote latest_checkpointed_iteration.txt = 2 (there was none; cluster.resume_from="
                        "latest-complete); verl resumes from global_step_2") if restart == 0 else \
            said == "verl resumes from global_step_2"  # already there: nothing written
        assert (ckpt / ck.TRACKER).read_text() == "2"


def test_a_step_given_is_written_at_the_first_start_only(ckpt, tmp_path):
    code, said = _job(ckpt, "1", 0, tmp_path / "state")
    assert code == 0 and said.startswith("wrote latest_checkpointed_iteration.txt = 1 (it named step 3;")
    assert "verl would resume from step 1" in said  # global_step_3 is newer: said, though the user chose it
    _tracker(ckpt, "3")  # verl saved again after it resumed
    assert _job(ckpt, "1", 1, tmp_path / "state") == (0, "verl resumes from global_step_3")


@pytest.mark.parametrize("mode, words", [
    ("9", "cluster.resume_from=9: global_step_9 is not in"),
    ("3", "cluster.resume_from=3: global_step_3 is incomplete (actor/optim_world_size_2_rank_1.pt"),
])
def test_a_step_given_that_verl_could_not_load_stops_the_job(ckpt, tmp_path, mode, words):
    (ckpt / "global_step_3" / "actor" / "optim_world_size_2_rank_1.pt").unlink()
    before = (ckpt / ck.TRACKER).read_text()
    code, said = _job(ckpt, mode, 0, tmp_path / "state")
    assert code == ck.STOP and words in said, said
    assert (ckpt / ck.TRACKER).read_text() == before


def test_a_requeue_that_would_start_over_stops_the_job(ckpt, tmp_path):
    _tracker(ckpt, None)
    state = tmp_path / "state"
    code, said = _job(ckpt, "auto", 0, state)  # submit warned: the first start goes on, as verl will
    assert code == 0 and said.startswith("WARNING: ") and "verl would start from scratch" in said
    code, said = _job(ckpt, "auto", 1, state)  # nothing saved since: the same as the first start
    assert code == 0 and said.startswith("WARNING: ")
    shutil.copytree(ckpt / "global_step_3", ckpt / "global_step_4")  # this job saved step 4, no tracker
    code, said = _job(ckpt, "auto", 1, state)
    assert code == ck.STOP, said
    assert "requeued, and" in said and "global_step_4" in said and "Stopped rather than start over" in said
    assert "submit --resume-from global_step_4" in said
    assert not (ckpt / ck.TRACKER).exists()  # nothing repaired


def test_a_tracker_verl_would_fail_on_stops_the_first_start(ckpt, tmp_path):
    _tracker(ckpt, "three")
    code, said = _job(ckpt, "auto", 0, tmp_path / "state")
    assert code == ck.STOP and "holds 'three', not a step" in said and "--resume-from global_step_3" in said


# ----------------------------------------------------------------------------- check and submit
VERL = "recipes/sandbox-verl.yaml"


def _cli(cli, env, tmp_path, ckpt, *args, cwd=None):
    """check or submit of the sandbox's verl recipe (2 nodes x 1 GPU: verl's world size 2) on CKPT."""
    cmd, *rest = args
    return cli(cmd, ROOT / VERL, "runtime.python=python3", f"paths.runs={tmp_path / 'runs'}",
               f"verl.overrides.trainer.default_local_dir={ckpt}", *rest, env=env, cwd=cwd)


def _warnings(proc, stream: str = "stdout") -> list:
    """The WARNING lines of a check or dry-run that PROC says passed (exit 0 first: a crash
    would otherwise show no warnings)."""
    out = getattr(proc, stream)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line[12:] for line in out.splitlines() if line.startswith("WARNING     ")]


def test_check_and_submit_name_the_newest_complete_step_verl_would_not_load(cli, clean_env, tmp_path, ckpt):
    _tracker(ckpt, None)
    proc = _cli(cli, clean_env, tmp_path, ckpt, "check")
    assert proc.returncode == 0, proc.stderr
    want = (f"{ckpt}: it holds global_step_1, global_step_2, global_step_3 but no latest_checkpointed_iteration.txt: "
            "verl would start from scratch (verl#7952); the newest complete checkpoint is global_step_3; to resume "
            "from it: submit --resume-from global_step_3 (or --resume-from latest-complete; in a recipe, "
            "cluster.resume_from)")
    assert _warnings(proc) == [want], proc.stdout
    assert f"start       experiment 'sandbox-verl' starts from scratch, though {ckpt} holds global_step_3" in proc.stdout
    dry = _cli(cli, clean_env, tmp_path, ckpt, "submit", "--dry-run")  # auto: said, not refused
    assert dry.returncode == 0 and _warnings(dry, "stderr") == [want], dry.stderr
    resume = _cli(cli, clean_env, tmp_path, ckpt, "submit", "--resume")
    assert resume.returncode == 2, resume.stderr
    assert refusal(resume.stderr).splitlines()[-1] == (f"error: {ROOT / VERL}: verl.overrides.trainer.default_local_dir: "
                                                      f"--resume: experiment 'sandbox-verl': {want}")
    assert not (tmp_path / "runs").exists() and (ckpt / "global_step_3").is_dir()  # nothing written or lost
    way = _cli(cli, clean_env, tmp_path, ckpt, "submit", "--resume-from", "global_step_3", "--dry-run")
    assert way.returncode == 0, way.stderr
    assert (f"start       experiment 'sandbox-verl' will RESUME from step 3 ({ckpt}/global_step_3; "
            "cluster.resume_from=3: the job writes verl's latest_checkpointed_iteration.txt = 3 before verl starts)"
            in way.stderr) and _warnings(way, "stderr") == []
    assert not (ckpt / ck.TRACKER).exists()  # the job writes it, not submit


@pytest.mark.parametrize("tracker, shard, want", [
    ("9", None, "names step 9, but global_step_9 is not there (steps there: global_step_1, global_step_2, "
                "global_step_3): verl would start from scratch; the newest complete checkpoint is global_step_3"),
    ("3", "model_world_size_2_rank_1.pt", "names step 3, but global_step_3 is incomplete (actor/model_world_size_2_"
                                          "rank_1.pt is missing or empty): verl would fail loading it; the newest "
                                          "complete checkpoint is global_step_2"),
])
def test_resume_is_refused_where_verl_would_not_load_the_newest_complete_step(cli, clean_env, tmp_path, ckpt,
                                                                              tracker, shard, want):
    _tracker(ckpt, tracker)
    if shard:
        (ckpt / "global_step_3" / "actor" / shard).unlink()
    proc = _cli(cli, clean_env, tmp_path, ckpt, "submit", "--resume")
    assert proc.returncode == 2 and want in proc.stderr, proc.stderr
    check = _cli(cli, clean_env, tmp_path, ckpt, "check")
    assert check.returncode == 0 and any(want in w for w in _warnings(check)), check.stdout


@pytest.mark.parametrize("value, cwd, code, words", [
    ("global_step_9", None, 2, "command line: cluster.resume_from: 9: global_step_9 is not in {ckpt} (steps there: "
                               "global_step_1, global_step_2, global_step_3)"),
    ("9", None, 2, "global_step_9 is not in"),
    ("ckpt/global_step_2", "parent", 0, "will RESUME from step 2 ({ckpt}/global_step_2; cluster.resume_from=2"),
    ("../ckpt/global_step_2/", "other", 0, "will RESUME from step 2"),
    ("elsewhere/global_step_2", "parent", 2, "{parent}/elsewhere/global_step_2 is not in "
                                             "trainer.default_local_dir ({ckpt})"),
    ("latest", None, 2, "give latest-complete, a step number, global_step_N, or that step's directory"),
    ("${oc.env:WANDB_API_KEY}", None, 2, "--resume-from '${{oc.env:WANDB_API_KEY}}': give latest-complete"),
])
def test_resume_from_takes_a_step_on_disk_and_refuses_the_rest(cli, clean_env, tmp_path, ckpt, value, cwd, code,
                                                               words):
    (tmp_path / "other").mkdir()
    where = {None: None, "parent": ckpt.parent, "other": tmp_path / "other"}[cwd]
    proc = _cli(cli, clean_env, tmp_path, ckpt, "submit", "--resume-from", value, "--dry-run", cwd=where)
    assert proc.returncode == code, proc.stderr
    assert words.format(ckpt=ckpt, parent=ckpt.parent) in proc.stderr, proc.stderr
    assert clean_env["WANDB_API_KEY"] not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()  # a dry run, accepted or not, writes nothing


@pytest.mark.parametrize("extra, words", [
    (["--fresh"], "not allowed with argument"),
    (["-m", "data.train_batch_size=8,16"], "--resume-from is for one run, not a sweep (-m)"),
    (["verl.overrides.trainer.resume_mode=disable"], "trainer.resume_mode is 'disable'"),
])
def test_resume_from_with_what_contradicts_it_is_refused(cli, clean_env, tmp_path, ckpt, extra, words):
    proc = _cli(cli, clean_env, tmp_path, ckpt, "submit", "--resume-from", "2", *extra)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_async_save_is_warned_unless_the_job_writes_the_tracker(cli, clean_env, tmp_path, ckpt):
    on = "verl.overrides.actor_rollout_ref.actor.checkpoint.async_save=true"
    proc = _cli(cli, clean_env, tmp_path, ckpt, "check", on)
    assert proc.returncode == 0, proc.stderr
    assert _warnings(proc) == [
        "actor_rollout_ref.actor.checkpoint.async_save=true: verl 0.9.1 then never writes "
        "latest_checkpointed_iteration.txt (verl#7952), so a requeue or a resubmit would start over from scratch; "
        "set cluster.resume_from=latest-complete (the job writes it for the newest complete checkpoint at each start "
        "and says so), or async_save=false"], proc.stdout
    proc = _cli(cli, clean_env, tmp_path, ckpt, "check", on, "cluster.resume_from=latest-complete")
    assert proc.returncode == 0 and _warnings(proc) == [], proc.stdout


def test_a_sweep_point_without_the_step_given_is_refused(cli, clean_env, tmp_path, ckpt):
    """Each point of a sweep has a checkpoint directory of its own: a step must be in each."""
    proc = _cli(cli, clean_env, tmp_path, str(ckpt) + "-${wandb.experiment}", "check", "-m",
                "verl.overrides.data.train_batch_size=8,16", "cluster.resume_from=2")
    assert proc.returncode == 2 and "cluster.resume_from: 2: global_step_2 is not in" in proc.stderr, proc.stderr
    proc = _cli(cli, clean_env, tmp_path, str(ckpt) + "-${wandb.experiment}", "check", "-m",
                "verl.overrides.data.train_batch_size=8,16", "cluster.resume_from=latest-complete")
    assert proc.returncode == 0, proc.stderr


def test_a_tracker_the_job_cannot_write_stops_it(ckpt, tmp_path):
    _tracker(ckpt, None)
    (ckpt / ck.TRACKER).mkdir()  # in its place, what no one can replace with a file (root neither)
    code, said = _job(ckpt, "2", 0, tmp_path / "state")
    assert code == ck.STOP and f"cannot write {ckpt}/latest_checkpointed_iteration.txt: Is a directory" in said, said


def test_the_api_takes_resume_from_as_the_cli_does(clean_env, tmp_path, ckpt):
    from launcher import api

    args = (ROOT / VERL, ["runtime.python=python3", f"paths.runs={tmp_path / 'runs'}",
                          f"verl.overrides.trainer.default_local_dir={ckpt}"])
    req = api.dryrun(*args, check=False, environ=clean_env, resume_from="global_step_2")
    assert req.plan.resume_from == "2"
    assert f"{ckpt} '{{\"strategy\":\"fsdp\",\"world_size\":2" in req.script and ' 2 "$RESTART"' in req.script
    with pytest.raises(api.RecipeError, match="global_step_9 is not in"):
        api.dryrun(*args, check=False, environ=clean_env, resume_from="9")
    with pytest.raises(api.RecipeError, match="--resume-from and --fresh"):
        api.dryrun(*args, check=False, environ=clean_env, resume_from="2", start="fresh")
    assert not (tmp_path / "runs").exists()


def test_submit_records_the_checkpoint_dir_and_merge_reads_it(tmp_path):
    """merge finds a run's checkpoints where submit recorded them; a run recorded before that
    is read from its resolved recipe, verl's default under the run directory where unset."""
    from launcher.core import request as rq
    from launcher.jobs.merge_job import checkpoint_root
    from launcher.core.recipe import load

    plan = load(str(ROOT / "recipes" / "sandbox-demo.yaml"), [f"paths.runs={tmp_path}/runs"]).plan
    meta = rq.for_run(plan, run_dir=tmp_path / "run").meta
    assert meta["checkpoint_dir"] == plan.checkpoint_dir == f"{tmp_path}/runs/checkpoints/{plan.recipe.experiment}"
    assert checkpoint_root({**meta, "run_dir": str(tmp_path / "run")}) == Path(meta["checkpoint_dir"])
    old = tmp_path / "old"
    old.mkdir()
    (old / "recipe.yaml").write_text("wandb: {project: p}\nverl: {overrides: {trainer.default_local_dir: rel}}\n")
    assert checkpoint_root({"run_dir": str(old), "experiment": "e"}) == old / "rel"
    (old / "recipe.yaml").write_text("wandb: {project: p}\n")
    assert checkpoint_root({"run_dir": str(old), "experiment": "e"}) == old / "checkpoints" / "p" / "e"
