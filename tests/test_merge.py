"""`verl-launch merge` and the Python API, on GENUINE verl checkpoints: written by verl's own FSDP
checkpoint manager on the CPU (world size 1 and 2, after a training step), merged by verl's own
merger through submitit (its local executor here; the real Slurm in the sandbox tests), loaded
with transformers and compared, parameter by parameter, with the model's gathered full state."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES

HELPER = Path(__file__).with_name("fsdp_checkpoints.py")
DEMO = RECIPES / "sandbox-demo.yaml"


def _make(root: Path, world: int, *steps: int, port: int) -> Path:
    proc = subprocess.run([sys.executable, str(HELPER), str(root), *map(str, steps), "--world-size", str(world),
                           "--train", "--full-state", str(root / "full.pt")], capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "MASTER_PORT": str(port)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{world size: checkpoint dir}: world size 1 at steps 2 and 4, world size 2 at step 3."""
    base = tmp_path_factory.mktemp("ckpt")
    return {1: _make(base / "ws1", 1, 2, 4, port=29641), 2: _make(base / "ws2", 2, 3, port=29642)}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def assert_merged_equals_full_state(target: Path, full_state: Path, step: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(target, torch_dtype="auto", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    full = torch.load(full_state)
    got = model.state_dict()
    assert set(got) == set(full)
    different = [k for k in full if not torch.equal(got[k].to(torch.bfloat16), full[k])]
    assert different == [], different  # every parameter, bf16-equal to the engine's gathered state
    mark = json.loads((target / "verl-launch-merge.json").read_text())
    assert mark["step"] == step and mark["parameters"] == sum(p.numel() for p in model.parameters())


def test_local_merge_is_the_models_full_state(cli, checkpoints, tmp_path, world=1):
    """World size 1 here (submitit's local executor); world size 2 goes through Slurm below."""
    ckpt = _copy(checkpoints[world], tmp_path / "ckpt")
    proc = cli("merge", ckpt, "--local", "--wait", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    step = 4 if world == 1 else 3  # the latest, from verl's tracker
    assert out["step"] == step and out["target"] == str(ckpt / f"global_step_{step}" / "huggingface_merged")
    assert_merged_equals_full_state(Path(out["target"]), ckpt / "full.pt", step)
    # again: the earlier merge of the same step is replaced, nothing else is
    again = cli("merge", ckpt / f"global_step_{step}", "--local", "--wait", "--json", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not list(Path(out["target"]).parent.glob(".huggingface_merged.partial-*"))


def test_bad_checkpoints_are_refused_and_nothing_is_submitted(cli, checkpoints, tmp_path):
    ws2 = _copy(checkpoints[2], tmp_path / "ws2")
    partial = _copy(checkpoints[2], tmp_path / "partial")
    (partial / "global_step_3" / "actor" / "model_world_size_2_rank_1.pt").unlink()
    lora = _copy(checkpoints[1], tmp_path / "lora")
    (lora / "global_step_4" / "actor" / "lora_train_meta.json").write_text('{"r": 8}')
    untracked = _copy(checkpoints[1], tmp_path / "untracked")
    (untracked / "latest_checkpointed_iteration.txt").unlink()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [([partial], "partial checkpoint: 1 of 2 model shards"),
             ([lora], "LoRA checkpoint: verl's merger does not fold"),
             ([untracked], "has no latest_checkpointed_iteration.txt"),
             ([ws2, "--step", "9"], "no checkpoint of step 9"),
             ([ws2, "--target", taken], "is not an earlier merge"),
             ([tmp_path / "nothing-here"], "neither a run"),
             ([ws2, "--step", "last"], "--step 'last'")]
    for args, words in cases:
        proc = cli("merge", *args, "--local", timeout=120)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert (taken / "keep.txt").read_text() == "mine" and sorted(p.name for p in taken.iterdir()) == ["keep.txt"]
    for d in (partial, lora, untracked, ws2):  # no job folder, no target
        assert not (d / ".verl-launch-merge").exists() and not list(d.rglob("huggingface_merged"))


@pytest.mark.accounting
def test_merge_on_slurm_with_submitit_and_the_python_api(checkpoints, sandbox, clean_env, tmp_path, monkeypatch):
    """A run submitted from Python, its checkpoint merged on the sandbox's Slurm by submitit;
    the state comes right with or without accounting (submitit alone says UNKNOWN without it)."""
    import launcher
    from launcher.jobs.state import merges as _merges

    for k, v in sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state"))).items():
        monkeypatch.setenv(k, v)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(launcher.RecipeError) as bad:  # the CLI's exit 2, as an exception
        launcher.submit(DEMO, overrides=["cluster.nodez=1"])
    assert bad.value.key == "cluster.nodez"
    run = launcher.submit(DEMO, overrides=[f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
                                           "cluster.nodes=1", f"verl.overrides.trainer.default_local_dir={ckpt}"])
    assert run.wait(poll=1, timeout=240) == "COMPLETED", run.logs()
    assert "phase teardown (rc=0)" in run.logs() and run.status()["phase"] == "teardown"
    shutil.copytree(checkpoints[2], ckpt, dirs_exist_ok=True)  # what the training would have saved

    job = launcher.merge(run.job_id)
    assert str(job.job_id) == job.verl_launch["job_id"] and job.verl_launch["job_id"].isdigit()
    target = launcher.wait_merge(job)
    assert target == str(ckpt / "global_step_3" / "huggingface_merged")
    assert_merged_equals_full_state(Path(target), ckpt / "full.pt", 3)
    merges = _merges(launcher.Run(run.job_id, run.run_dir).record)
    assert [(m["step"], m["target"], m["state"]) for m in merges] == [(3, target, "COMPLETED")]
    assert merges[0]["parameters"] > 0
    # the job ran on a sandbox node, not here
    out = Path(job.paths.stdout).read_text()
    assert "verl-launch merge:" in out and "huggingface_merged" in out
